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
- ``anthropic:MODEL``: Messages API, Message Batches for large runs. ``openai-compatible:URL[#MODEL]``: any
  OpenAI-compatible server (vLLM, llama.cpp's server) through the openai SDK. ``none``: no LLM.
"""
from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Literal, Sequence, overload

from privseed.tasks.errors import ConfigError
from privseed.tasks.llm.base import ChatRequest, ChatResult, LLMBackend, OnEach
from privseed.tasks.llm.cache import CallCache, cached_complete


@dataclass(frozen=True)
class LLMSpec:
    """A parsed ``--llm`` value plus backend options (public configuration only: no keys)."""

    kind: str
    model: str | None = None
    url: str | None = None
    options: tuple[tuple[str, object], ...] = field(default=())

    def with_options(self, **options) -> "LLMSpec":
        merged = dict(self.options)
        merged.update({k: v for k, v in options.items() if v is not None})
        return LLMSpec(self.kind, self.model, self.url, tuple(sorted(merged.items())))

    def __str__(self) -> str:
        if self.url:
            return f"{self.kind}:{self.url}" + (f"#{self.model}" if self.model else "")
        return self.kind + (f":{self.model}" if self.model else "")


# -- what each kind is ------------------------------------------------------------------------------------------
def _free(spec: LLMSpec, n_calls: int) -> tuple[float, float] | None:
    return 0.0, 0.0


def _declared_price(spec: LLMSpec, n_calls: int) -> tuple[float, float] | None:
    opts = dict(spec.options)
    if opts.get("price_in_per_mtok") is not None and opts.get("price_out_per_mtok") is not None:
        return float(str(opts["price_in_per_mtok"])), float(str(opts["price_out_per_mtok"]))
    return None


def _anthropic_batches(spec: LLMSpec, n_calls: int) -> bool:
    from privseed.tasks.llm.anthropic_backend import will_batch

    opts = dict(spec.options)
    use = opts.get("use_batches")
    return will_batch(None if use is None else bool(use), int(str(opts.get("batch_threshold", 200))), n_calls)


def _anthropic_price(spec: LLMSpec, n_calls: int) -> tuple[float, float] | None:
    from privseed.tasks.llm.anthropic_backend import BATCH_DISCOUNT, anthropic_price

    p = anthropic_price(spec.model or "")
    if p is None:
        return None
    f = BATCH_DISCOUNT if _anthropic_batches(spec, n_calls) else 1.0
    return p[0] * f, p[1] * f


def _never(spec: LLMSpec, n_calls: int) -> bool:
    return False


def _build_local(spec: LLMSpec) -> LLMBackend:
    from privseed.tasks.llm.local import local_backend

    return local_backend(spec.model, **dict(spec.options))


def _build_local_server(spec: LLMSpec) -> LLMBackend:
    from privseed.tasks.llm.local_server import LocalServerBackend

    return LocalServerBackend(spec.model, **dict(spec.options))  # type: ignore[arg-type]


def _build_anthropic(spec: LLMSpec) -> LLMBackend:
    from privseed.tasks.llm.anthropic_backend import AnthropicBackend

    return AnthropicBackend(spec.model, **dict(spec.options))  # type: ignore[arg-type]


def _build_openai(spec: LLMSpec) -> LLMBackend:
    from privseed.tasks.llm.openai_compat import OpenAICompatibleBackend

    return OpenAICompatibleBackend(spec.url, spec.model, **dict(spec.options))  # type: ignore[arg-type]


def _parse_model(kind: str, needs_model: bool, example: str) -> Callable[[str, str], LLMSpec]:
    def parse(value: str, rest: str) -> LLMSpec:
        if needs_model and not rest:
            raise ConfigError(f"--llm {value!r}: {kind} needs a model, {kind}:MODEL (e.g. {example})")
        return LLMSpec(kind, rest or None)
    return parse


def _parse_none(value: str, rest: str) -> LLMSpec:
    if rest:
        raise ConfigError(f"--llm {value!r}: none takes no model")
    return LLMSpec("none")


def _parse_url(value: str, rest: str) -> LLMSpec:
    url, _, model = rest.partition("#")
    if not url:
        raise ConfigError(f"--llm {value!r}: openai-compatible needs a URL, openai-compatible:http://HOST:PORT/v1"
                          "[#MODEL]")
    return LLMSpec("openai-compatible", model or None, url)


#: The decoding controls a kind applies: token by token in this process (the seed-steering logits processor),
#: per request as a static logit bias and samplers on a llama.cpp server, or none (remote APIs).
STEERING_MODES = ("logits-processor", "logit-bias", "none")


@dataclass(frozen=True)
class BackendKind:
    """One ``--llm`` kind, described as data.

    ``form``: how --llm names it. ``parse(value, rest)``: the spec of ``KIND:rest``. ``build(spec)``: its backend
    (None: it makes no calls). ``steering``: one of STEERING_MODES. ``run_options``: the run-wide settings it takes
    from the flow's configuration (``llm_spec``). ``local_weights``: its weights are resolved on this machine
    before any private data is read, and its tokenizer counts prompts for the dry run. ``shared_server``: it runs
    one server for the machine (``serving``). ``price(spec, n_calls)``: USD per million (input, output) tokens for
    a run of n calls (None: unknown). ``batches(spec, n_calls)``: whether such a run goes through a batch API."""

    name: str
    form: str
    summary: str
    parse: Callable[[str, str], LLMSpec]
    build: Callable[[LLMSpec], LLMBackend] | None
    steering: str = "none"
    run_options: tuple[str, ...] = ()
    local_weights: bool = False
    shared_server: bool = False
    price: Callable[[LLMSpec, int], tuple[float, float] | None] = _declared_price
    batches: Callable[[LLMSpec, int], bool] = _never

    @property
    def writes_text(self) -> bool:
        return self.build is not None


KINDS: dict[str, BackendKind] = {kind.name: kind for kind in (
    BackendKind("none", "none", "no LLM: the keyphrase sequence is the document", _parse_none, None, price=_free),
    BackendKind("local", "local[:MODEL_OR_PATH]", "llama-cpp-python in each process, one call at a time",
                _parse_model("local", False, "local:qwen2.5-coder-0.5b"), _build_local, steering="logits-processor",
                local_weights=True, price=_free),
    BackendKind("local-server", "local-server[:MODEL_OR_PATH]",
                "one llama.cpp server per machine (xllamacpp): continuous batching, prompt cache",
                _parse_model("local-server", False, "local-server:qwen2.5-coder-0.5b"), _build_local_server,
                steering="logit-bias", local_weights=True, shared_server=True, price=_free),
    BackendKind("anthropic", "anthropic:MODEL", "Messages API; Message Batches for large runs",
                _parse_model("anthropic", True, "anthropic:claude-haiku-4-5"), _build_anthropic,
                run_options=("batch_state", "storage_options", "max_concurrency", "secret_block"),
                price=_anthropic_price, batches=_anthropic_batches),
    BackendKind("openai-compatible", "openai-compatible:URL[#MODEL]",
                "any OpenAI-compatible server (vLLM, llama.cpp's server) through the openai SDK", _parse_url,
                _build_openai, run_options=("max_concurrency", "secret_block")),
)}

#: The --llm grammar, as errors and --help state it.
LLM_GRAMMAR = " | ".join(kind.form for kind in KINDS.values())


def kind_of(spec: LLMSpec | str) -> BackendKind:
    return KINDS[as_spec(spec).kind]


def parse_llm_spec(value: str) -> LLMSpec:
    """The one parser of ``--llm`` values (the configuration models validate ``llm`` with it)."""
    value = (value or "").strip()
    name, _, rest = value.partition(":")
    kind = KINDS.get(name)
    if kind is None:
        raise ConfigError(f"--llm {value!r}: unknown LLM backend {name!r}; expected {LLM_GRAMMAR}")
    return kind.parse(value, rest)


def as_spec(spec: LLMSpec | str) -> LLMSpec:
    return parse_llm_spec(spec) if isinstance(spec, str) else spec


def llm_spec(llm: str, *, state_uri: str | None, storage_options: dict | None = None,
             llm_concurrency: int | None = None, llm_secret: str | None = None) -> LLMSpec:
    """The backend of ``--llm`` with the run's options, each kind taking those its ``run_options`` name."""
    spec = parse_llm_spec(llm)
    offered: dict[str, Any] = {"batch_state": state_uri, "storage_options": storage_options or None,
                               "max_concurrency": llm_concurrency, "secret_block": llm_secret}
    return spec.with_options(**{k: offered[k] for k in KINDS[spec.kind].run_options})


def spec_from_config(cfg) -> LLMSpec:
    return llm_spec(cfg.llm, state_uri=cfg.state_uri, storage_options=cfg.storage_options,
                    llm_concurrency=getattr(cfg, "llm_concurrency", None), llm_secret=getattr(cfg, "llm_secret", None))


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
