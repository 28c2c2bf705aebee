"""LLM generation layer: one backend interface, local llama.cpp / Anthropic / OpenAI-compatible backends,
versioned prompt templates, a prompt builder that only takes released values, and a call cache.

``--llm`` values: ``local`` (packaged SmolLM2-135M-Instruct), ``local:PATH`` (a .gguf or model folder),
``local:qwen2.5-coder-0.5b`` / ``local:qwen2.5-coder-1.5b`` (opt-in, assembled from PyPI parts: tasks/llm/models.py),
``local-server[:MODEL]`` (one shared llama.cpp server per machine, tasks/llm/local_server.py),
``anthropic:MODEL``, ``vllm:URL[#MODEL]`` (a vLLM server, tasks/llm/vllm_backend.py), ``openai-compatible:URL[#MODEL]``,
``none`` (no LLM: the keyphrase sequence is the text).
Every kind describes itself in one registry (tasks/llm/kinds.py) and every call goes through one ``complete()``
(tasks/llm/service.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from privseed.tasks.llm.base import ChatMessage, ChatRequest, ChatResult, LLMBackend
    from privseed.tasks.llm.cache import CallCache, cached_complete
    from privseed.tasks.llm.prompting import PromptTemplate, build_messages, build_request, term_coverage
    from privseed.tasks.llm.released import (PublicClassNames, RecipientExample, ReleasedSeed, ReleasedVocabulary,
                                             UnreleasedValueError, load_class_names, load_few_shot)
    from privseed.tasks.llm.kinds import KINDS, LLM_GRAMMAR, BackendKind, LLMSpec, kind_of, parse_llm_spec
    from privseed.tasks.llm.service import (close_backend, complete, get_backend, make_backend, register_backend,
                                            serving)

__all__ = ["ChatMessage", "ChatRequest", "ChatResult", "LLMBackend", "CallCache", "cached_complete",
           "PromptTemplate", "build_messages", "build_request", "term_coverage", "RecipientExample",
           "ReleasedSeed", "ReleasedVocabulary", "UnreleasedValueError", "load_few_shot", "PublicClassNames",
           "load_class_names", "LLMSpec", "KINDS", "LLM_GRAMMAR", "BackendKind", "kind_of", "complete", "serving",
           "parse_llm_spec", "make_backend", "get_backend", "close_backend", "register_backend"]

#: Where each name of the package lives: imported when first used, so that the command line can read the registry of
#: backend kinds (tasks/llm/kinds.py) to build --help without loading pandas and the prompt machinery.
_HOMES = {"ChatMessage": "base", "ChatRequest": "base", "ChatResult": "base", "LLMBackend": "base",
          "CallCache": "cache", "cached_complete": "cache", "PromptTemplate": "prompting",
          "build_messages": "prompting", "build_request": "prompting", "term_coverage": "prompting",
          "PublicClassNames": "released", "RecipientExample": "released", "ReleasedSeed": "released",
          "ReleasedVocabulary": "released", "UnreleasedValueError": "released", "load_class_names": "released",
          "load_few_shot": "released", "KINDS": "kinds", "LLM_GRAMMAR": "kinds", "BackendKind": "kinds",
          "LLMSpec": "kinds", "kind_of": "kinds", "parse_llm_spec": "kinds", "close_backend": "service",
          "complete": "service", "get_backend": "service", "make_backend": "service", "register_backend": "service",
          "serving": "service"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    globals()[name] = value
    return value
