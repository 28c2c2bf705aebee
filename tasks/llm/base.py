"""The one backend interface: a batch of chat requests in, texts plus token counts out.

Every backend (local llama.cpp, Anthropic, OpenAI-compatible, the recording test backend) implements
``LLMBackend.complete``. Requests carry everything that determines the answer (messages, max_tokens,
temperature, seed), so ``ChatRequest.cache_key`` together with the backend's identity names a call
exactly; the call cache (tasks/llm/cache.py) relies on that.
"""
from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

# Called as on_each(index_in_batch, result) the moment each answer arrives (possibly from a worker thread),
# so finished calls are cached even if a later call in the batch crashes.
OnEach = Callable[[int, "ChatResult"], None]


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "system" | "user" | "assistant"
    content: str

    def to_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class SeedSteering:
    """Decoding controls for backends that sample token by token here (local llama.cpp; tasks/llm/steering.py).

    ``terms``: the released seed terms to steer towards (already in the prompt; public). ``strength``: logit
    bonus for a token that begins or continues a term not yet written (the same amount is taken off a written
    term's first tokens); 0 turns steering off. ``repeat_penalty`` is llama.cpp's; ``no_repeat_ngram`` bans a
    token that would repeat a word n-gram of the answer (0: off). ``schedule``: "budget" (the push grows as the
    token budget runs out, and the answer cannot end while more than a ``1 - end_coverage`` share of the terms is
    missing) or "flat" (the first version). ``avoid``: words that read as another class than the seed's
    (``privseed.tasks.generation.class_fit.SeedClasses.foreign_words``; public, from released seeds), taken down by
    ``strength`` wherever the answer would write them. ``prefer``: words that read as the seed's own class
    (``SeedClasses.own_words``), pushed by half the strength while the answer does not hold them (the in-process
    processor only). ``whole_opening``: the answer's given opening (``ChatRequest.answer_prefix``) is a whole word
    and the answer goes on after a space (the in-process processor bans every other first token: a subject opening,
    "Season", became "Seasoned", and "Iraq" a topic label, "Iraq, the world's largest ..."). Remote APIs cannot
    apply these and get none.
    """

    terms: tuple[str, ...]
    strength: float = 0.0
    repeat_penalty: float = 1.0
    no_repeat_ngram: int = 0
    schedule: str = "budget"
    end_coverage: float = 1.0
    avoid: tuple[str, ...] = ()
    prefer: tuple[str, ...] = ()
    whole_opening: bool = False

    def params(self) -> dict:
        params = {"terms": list(self.terms), "strength": self.strength, "repeat_penalty": self.repeat_penalty,
                  "no_repeat_ngram": self.no_repeat_ngram, "schedule": self.schedule}
        if self.end_coverage != 1.0:  # only then: requests that hold the end for every term keep their cache keys
            params["end_coverage"] = self.end_coverage
        if self.avoid:  # likewise: requests without words to avoid keep their cache keys
            params["avoid"] = list(self.avoid)
        if self.prefer:  # likewise
            params["prefer"] = list(self.prefer)
        if self.whole_opening:  # likewise
            params["whole_opening"] = True
        return params


@dataclass(frozen=True)
class ChatRequest:
    """One chat completion request. ``seed`` makes sampling reproducible where the backend supports it
    (llama.cpp, OpenAI-compatible servers); Anthropic has no seed, so there it only keys the cache."""

    messages: tuple[ChatMessage, ...]
    max_tokens: int
    temperature: float
    seed: int
    top_p: float = 1.0
    steering: SeedSteering | None = None
    #: The words the answer starts with, already written (a public opening of the document kind: the example
    #: library's ``openings``, drawn by privseed.tasks.generation.rounds.opening_for); only kinds that continue an
    #: answer get one (``BackendKind.prefill``), and their result's text starts with it. "": the model writes it all.
    answer_prefix: str = ""

    def __post_init__(self) -> None:
        if self.answer_prefix != self.answer_prefix.strip():
            # a trailing space is a token boundary the model never saw in training: it then writes odd words
            raise ValueError(f"answer_prefix may not start or end with whitespace: {self.answer_prefix!r}")

    def params(self) -> dict:
        params: dict[str, Any] = {"max_tokens": self.max_tokens, "temperature": self.temperature, "seed": self.seed,
                  "top_p": self.top_p}
        if self.steering is not None:  # only then: unsteered requests keep the cache keys they always had
            params["steering"] = self.steering.params()
        if self.answer_prefix:  # likewise
            params["answer_prefix"] = self.answer_prefix
        return params

    def messages_dicts(self) -> list[dict[str, str]]:
        return [m.to_dict() for m in self.messages]

    def system_and_turns(self) -> tuple[str | None, list[dict[str, str]]]:
        """Split a leading system message off (the Anthropic API takes it as a separate field)."""
        msgs = self.messages_dicts()
        system = None
        if msgs and msgs[0]["role"] == "system":
            system = msgs[0]["content"]
            msgs = msgs[1:]
        return system, msgs

    def cache_key(self, backend: str, model: str) -> str:
        """sha256 over (backend, model, messages, params, seed): equal keys mean the same call."""
        payload = {"backend": backend, "model": model, "messages": self.messages_dicts(), "params": self.params()}
        return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ChatResult:
    """One answer. ``finish_reason``: "stop" (the model ended it), "length" (it hit max_tokens), or None when the
    backend did not say; the document predicate uses it to tell a text cut off at the limit. ``mean_logprob``: the
    mean log-probability of the answer's tokens under the model, when the backend returns token log-probabilities
    (llama.cpp's server does), else None; a fluency statistic for the document gate."""

    text: str
    tokens_in: int
    tokens_out: int
    cached: bool = False
    meta: dict = field(default_factory=dict, compare=False)
    finish_reason: str | None = None
    mean_logprob: float | None = None

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"text": self.text, "tokens_in": self.tokens_in, "tokens_out": self.tokens_out}
        if self.finish_reason is not None:
            d["finish_reason"] = self.finish_reason
        if self.mean_logprob is not None:
            d["mean_logprob"] = self.mean_logprob
        return d

    @classmethod
    def from_dict(cls, d: dict, cached: bool = False) -> "ChatResult":
        return cls(text=d["text"], tokens_in=int(d["tokens_in"]), tokens_out=int(d["tokens_out"]), cached=cached,
                   finish_reason=d.get("finish_reason"),
                   mean_logprob=float(d["mean_logprob"]) if d.get("mean_logprob") is not None else None)


class LLMBackend(ABC):
    """A text generator. ``name`` is the backend kind ("local", "anthropic", ...), ``model`` the model id;
    both go into every cache key and every output row."""

    name: str = "abstract"
    model: str = ""
    # USD per million input / output tokens, None when unknown (local models cost nothing).
    price_in_per_mtok: float | None = None
    price_out_per_mtok: float | None = None

    @abstractmethod
    def complete(self, requests: Sequence[ChatRequest], on_each: OnEach | None = None) -> list[ChatResult]:
        """Answer every request, in order; call ``on_each(i, result)`` as each one finishes.
        Backends parallelise internally as suits them."""

    def count_tokens(self, text: str) -> int:
        """Token estimate for cost previews; backends with a tokenizer override it."""
        return max(1, len(text) // 4)

    def close(self) -> None:  # noqa: B027 - optional, not abstract: most backends hold nothing to release
        """Release connections or a loaded model; the default has nothing to release."""

    def __repr__(self) -> str:  # never includes credentials
        return f"{type(self).__name__}(name={self.name!r}, model={self.model!r})"
