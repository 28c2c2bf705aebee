"""The LLM service: one registry of backend kinds, each describing itself as data, and one ``complete()``.

DP-KPS generation (tasks/generation/drivers.py), the only-LLM baseline and the PE rounds (tasks/stages/pe.py) all send
their calls through ``complete(spec, requests, cache=...)`` and ask the spec's ``BackendKind`` what they need to
know (price, Message Batches, which decoding controls it applies, which run options it takes, whether it runs a
shared server on this machine) instead of testing ``spec.kind`` against names.

Kinds (``--llm``; ``KINDS`` below is the list):

- ``local[:MODEL]``: llama-cpp-python in each process (each Dask worker loads its own copy and decodes one call
  at a time); seed steering token by token (tasks/llm/steering.py).
- ``local-server[:MODEL]``: one llama.cpp server per machine (xllamacpp, tasks/llm/local_server.py): continuous
  batching over parallel slots, the shared prompt prefix cached; steering as a static logit bias per request.
- ``anthropic:MODEL``: Messages API, Message Batches for large runs. ``vllm:URL[#MODEL]``: a vLLM server through
  the openai SDK, openings continued and steering as a static logit bias (tasks/llm/vllm_backend.py).
  ``openai-compatible:URL[#MODEL]``: any other OpenAI-compatible server through the openai SDK. ``none``: no LLM.
"""
from __future__ import annotations

import contextlib
import json
import threading
from typing import Any, Callable, Iterator, Literal, Sequence, overload

from privseed.tasks.errors import ConfigError
from privseed.tasks.llm.base import ChatRequest, ChatResult, LLMBackend, OnEach
from privseed.tasks.llm.cache import CallCache, cached_complete
from privseed.tasks.llm.kinds import (KINDS, LLM_GRAMMAR, STEERING_MODES, BackendKind, LLMSpec, as_spec, kind_of,
                                      parse_llm_spec)

__all__ = ["KINDS", "LLM_GRAMMAR", "STEERING_MODES", "BackendKind", "LLMSpec", "as_spec", "kind_of",
           "parse_llm_spec", "llm_spec", "call_prices", "make_backend", "get_backend", "close_backend",
           "register_backend", "has_backend", "complete", "serving"]


def llm_spec(llm: str, *, state_uri: str | None, storage_options: dict | None = None,
             llm_concurrency: int | None = None, llm_secret: str | None = None) -> LLMSpec:
    """The backend of ``--llm`` with the run's options, each kind taking those its ``run_options`` name."""
    spec = parse_llm_spec(llm)
    offered: dict[str, Any] = {"batch_state": state_uri, "storage_options": storage_options or None,
                               "max_concurrency": llm_concurrency, "secret_block": llm_secret}
    return spec.with_options(**{k: offered[k] for k in KINDS[spec.kind].run_options})


def call_prices(spec: LLMSpec, n_calls: int) -> tuple[float, float] | None:
    """USD per million (input, output) tokens for ``n_calls`` calls of ``spec``; None when unknown."""
    return KINDS[spec.kind].price(spec, n_calls)


# -- backends, one per spec per process ---------------------------------------------------------------------------
_BACKENDS: dict[str, LLMBackend] = {}
_LOCK = threading.Lock()


def _key(spec: LLMSpec) -> str:
    return json.dumps([spec.kind, spec.model, spec.url, [list(o) for o in spec.options]], default=str)


def make_backend(spec: LLMSpec | str) -> LLMBackend:
    spec = as_spec(spec)
    build = KINDS[spec.kind].build
    if build is None:
        raise ConfigError(f"--llm {spec}: no backend to build (none means no LLM calls)")
    return build(spec)


def get_backend(spec: LLMSpec | str) -> LLMBackend:
    """One backend per spec per process: a Dask worker loads a local model once for all its shards."""
    spec = as_spec(spec)
    key = _key(spec)
    with _LOCK:
        if key not in _BACKENDS:
            _BACKENDS[key] = make_backend(spec)
        return _BACKENDS[key]


def close_backend(spec: LLMSpec | str) -> None:
    """Free what this process's backend for ``spec`` holds (a local model's weights), if one was built.
    The backend stays registered; its next call loads again."""
    spec = as_spec(spec)
    with _LOCK:
        backend = _BACKENDS.get(_key(spec))
    if backend is not None:
        backend.close()


def register_backend(spec: LLMSpec | str, backend: LLMBackend | None) -> None:
    """Serve ``spec`` from an in-process backend object (a custom client, a recording test double);
    ``None`` removes the registration. Affects this process only (Dask workers build their own)."""
    spec = as_spec(spec)
    with _LOCK:
        if backend is None:
            _BACKENDS.pop(_key(spec), None)
        else:
            _BACKENDS[_key(spec)] = backend


def has_backend(spec: LLMSpec | str) -> bool:
    """Whether this process already serves ``spec`` (a registered or an already built backend)."""
    with _LOCK:
        return _key(as_spec(spec)) in _BACKENDS


@overload
def complete(spec: LLMSpec | str, requests: Sequence[ChatRequest], cache: CallCache | None = None, *,
             on_result: Callable[[ChatResult], None] | None = None, on_each: OnEach | None = None,
             keep: Literal[True] = True) -> list[ChatResult]: ...


@overload
def complete(spec: LLMSpec | str, requests: Sequence[ChatRequest], cache: CallCache | None = None, *,
             on_result: Callable[[ChatResult], None] | None = None, on_each: OnEach | None = None,
             keep: Literal[False]) -> None: ...


def complete(spec: LLMSpec | str, requests: Sequence[ChatRequest], cache: CallCache | None = None, *,
             on_result: Callable[[ChatResult], None] | None = None, on_each: OnEach | None = None,
             keep: bool = True) -> list[ChatResult] | None:
    """THE way to an LLM: answer ``requests`` with this process's backend for ``spec``, through the call cache
    (a hit is never sent again; every answer is stored the moment it arrives). ``on_result`` sees every answer
    (progress), ``on_each(i, result)`` the i-th as it arrives; ``keep=False`` only fills the cache."""
    backend = get_backend(spec)
    if keep:
        return cached_complete(backend, requests, cache, on_result=on_result, on_each=on_each)
    cached_complete(backend, requests, cache, on_result=on_result, on_each=on_each, keep=False)
    return None


@contextlib.contextmanager
def serving(spec: LLMSpec | str) -> Iterator[LLMSpec]:
    """The spec the calls of one generation use. For a kind with a shared server, the server is started here (in
    the flow process, once for the machine) and stopped when the block ends; the spec handed out carries its URL,
    so every Dask worker's client talks to this one server. Other kinds pass through unchanged."""
    spec = as_spec(spec)
    if not KINDS[spec.kind].shared_server:
        yield spec
        return
    from privseed.tasks.llm.local_server import LocalServerBackend

    owner = LocalServerBackend(spec.model, **dict(spec.options))  # type: ignore[arg-type]
    owner.client  # noqa: B018 - starts the server
    served = spec.with_options(url=owner.base)
    try:
        yield served
    finally:
        close_backend(served)
        owner.close()
