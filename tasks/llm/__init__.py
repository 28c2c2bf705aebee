"""LLM generation layer: one backend interface, local llama.cpp / Anthropic / OpenAI-compatible backends,
versioned prompt templates, a prompt builder that only takes released values, and a call cache.

``--llm`` values: ``local`` (packaged SmolLM2-135M-Instruct), ``local:PATH`` (a .gguf or model folder),
``local:qwen2.5-coder-0.5b`` / ``local:qwen2.5-coder-1.5b`` (opt-in, assembled from PyPI parts: tasks/llm/models.py),
``local-server[:MODEL]`` (one shared llama.cpp server per machine, tasks/llm/local_server.py),
``anthropic:MODEL``, ``openai-compatible:URL[#MODEL]``, ``none`` (no LLM: the keyphrase sequence is the text).
Every kind describes itself in one registry and every call goes through one ``complete()``
(tasks/llm/service.py).
"""
from __future__ import annotations

from privseed.tasks.llm.base import ChatMessage, ChatRequest, ChatResult, LLMBackend
from privseed.tasks.llm.cache import CallCache, cached_complete
from privseed.tasks.llm.prompting import PromptTemplate, build_messages, build_request, term_coverage
from privseed.tasks.llm.released import (PublicClassNames, RecipientExample, ReleasedSeed, ReleasedVocabulary,
                                         UnreleasedValueError, load_class_names, load_few_shot)
from privseed.tasks.llm.service import (KINDS, LLM_GRAMMAR, BackendKind, LLMSpec, close_backend, complete, get_backend,
                                        kind_of, make_backend, parse_llm_spec, register_backend, serving)

__all__ = ["ChatMessage", "ChatRequest", "ChatResult", "LLMBackend", "CallCache", "cached_complete",
           "PromptTemplate", "build_messages", "build_request", "term_coverage", "RecipientExample",
           "ReleasedSeed", "ReleasedVocabulary", "UnreleasedValueError", "load_few_shot", "PublicClassNames",
           "load_class_names", "LLMSpec", "KINDS", "LLM_GRAMMAR", "BackendKind", "kind_of", "complete", "serving",
           "parse_llm_spec", "make_backend", "get_backend", "close_backend", "register_backend"]
