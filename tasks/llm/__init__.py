"""LLM generation layer: one backend interface, local llama.cpp / Anthropic / OpenAI-compatible backends,
versioned prompt templates, a prompt builder that only takes released values, and a call cache.

``--llm`` values: ``local`` (packaged SmolLM2-135M-Instruct), ``local:PATH`` (a .gguf or model folder),
``local:qwen2.5-coder-0.5b`` / ``local:qwen2.5-coder-1.5b`` (opt-in, assembled from PyPI parts: tasks/llm/models.py),
``anthropic:MODEL``, ``openai-compatible:URL[#MODEL]``, ``none`` (no LLM: the keyphrase sequence is the text).
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field

from privseed.tasks.errors import ConfigError
from privseed.tasks.llm.base import ChatMessage, ChatRequest, ChatResult, LLMBackend
from privseed.tasks.llm.cache import CallCache, cached_complete
from privseed.tasks.llm.prompting import PromptTemplate, build_messages, build_request, term_coverage
from privseed.tasks.llm.released import (PublicClassNames, RecipientExample, ReleasedSeed, ReleasedVocabulary,
                                         UnreleasedValueError, load_class_names, load_few_shot)

__all__ = ["ChatMessage", "ChatRequest", "ChatResult", "LLMBackend", "CallCache", "cached_complete",
           "PromptTemplate", "build_messages", "build_request", "term_coverage", "RecipientExample",
           "ReleasedSeed", "ReleasedVocabulary", "UnreleasedValueError", "load_few_shot", "PublicClassNames",
           "load_class_names", "LLMSpec",
           "parse_llm_spec", "make_backend", "get_backend", "close_backend", "register_backend"]

KINDS = ("local", "anthropic", "openai-compatible", "none")


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
        if self.kind == "openai-compatible":
            return f"openai-compatible:{self.url}" + (f"#{self.model}" if self.model else "")
        return self.kind + (f":{self.model}" if self.model else "")


#: The --llm grammar, as errors and --help state it.
LLM_GRAMMAR = "none | local[:MODEL_OR_PATH] | anthropic:MODEL | openai-compatible:URL[#MODEL]"


def parse_llm_spec(value: str) -> LLMSpec:
    """The one parser of ``--llm`` values (the configuration models validate ``llm`` with it)."""
    value = (value or "").strip()
    kind, _, rest = value.partition(":")
    if kind not in KINDS:
        raise ConfigError(f"--llm {value!r}: unknown LLM backend {kind!r}; expected {LLM_GRAMMAR}")
    if kind == "none":
        if rest:
            raise ConfigError(f"--llm {value!r}: none takes no model")
        return LLMSpec("none")
    if kind == "local":
        return LLMSpec("local", rest or None)
    if kind == "anthropic":
        if not rest:
            raise ConfigError(f"--llm {value!r}: anthropic needs a model, anthropic:MODEL (e.g. "
                              "anthropic:claude-haiku-4-5)")
        return LLMSpec("anthropic", rest)
    url, _, model = rest.partition("#")
    if not url:
        raise ConfigError(f"--llm {value!r}: openai-compatible needs a URL, openai-compatible:http://HOST:PORT/v1"
                          "[#MODEL]")
    return LLMSpec("openai-compatible", model or None, url)


def make_backend(spec: LLMSpec | str) -> LLMBackend:
    if isinstance(spec, str):
        spec = parse_llm_spec(spec)
    opts = dict(spec.options)
    if spec.kind == "local":
        from privseed.tasks.llm.local import local_backend

        return local_backend(spec.model, **opts)
    if spec.kind == "anthropic":
        from privseed.tasks.llm.anthropic_backend import AnthropicBackend

        return AnthropicBackend(spec.model, **opts)  # type: ignore[arg-type]
    if spec.kind == "openai-compatible":
        from privseed.tasks.llm.openai_compat import OpenAICompatibleBackend

        return OpenAICompatibleBackend(spec.url, spec.model, **opts)  # type: ignore[arg-type]
    raise ConfigError(f"--llm {spec}: no backend to build (none means no LLM calls)")


_BACKENDS: dict[str, LLMBackend] = {}
_LOCK = threading.Lock()


def _key(spec: LLMSpec) -> str:
    return json.dumps([spec.kind, spec.model, spec.url, [list(o) for o in spec.options]], default=str)


def get_backend(spec: LLMSpec | str) -> LLMBackend:
    """One backend per spec per process: a Dask worker loads the local model once for all its shards."""
    if isinstance(spec, str):
        spec = parse_llm_spec(spec)
    key = _key(spec)
    with _LOCK:
        if key not in _BACKENDS:
            _BACKENDS[key] = make_backend(spec)
        return _BACKENDS[key]


def close_backend(spec: LLMSpec | str) -> None:
    """Free what this process's backend for ``spec`` holds (a local model's weights), if one was built.
    The backend stays registered; its next call loads again."""
    if isinstance(spec, str):
        spec = parse_llm_spec(spec)
    with _LOCK:
        backend = _BACKENDS.get(_key(spec))
    if backend is not None:
        backend.close()


def register_backend(spec: LLMSpec | str, backend: LLMBackend | None) -> None:
    """Serve ``spec`` from an in-process backend object (a custom client, a recording test double);
    ``None`` removes the registration. Affects this process only (Dask workers build their own)."""
    if isinstance(spec, str):
        spec = parse_llm_spec(spec)
    with _LOCK:
        if backend is None:
            _BACKENDS.pop(_key(spec), None)
        else:
            _BACKENDS[_key(spec)] = backend
