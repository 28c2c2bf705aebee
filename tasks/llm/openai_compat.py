"""Any server that speaks the OpenAI chat-completions API (vLLM, llama.cpp's server, TGI, ...), through the
``openai`` SDK (its own retries with backoff on 408/409/429/5xx and connection errors, honouring retry-after).

``openai-compatible:URL`` where URL is the server's base (``http://host:8000`` or ``http://host:8000/v1``);
append ``#MODEL`` to choose a model, otherwise the first id from ``GET /v1/models`` is used. A key, when the
server wants one, comes from OPENAI_API_KEY (or a Prefect Secret block) and is sent as a Bearer token only.

``llama_cpp=True`` (the shared local server, tasks/llm/local_server.py) adds what llama.cpp's server takes per
request beyond the OpenAI schema: ``cache_prompt`` (a slot keeps the KV cache of the shared prompt prefix), seed
steering as a static ``logit_bias`` on the seed terms (``steering_body``), ``repeat_penalty``, the DRY sampler
against loops, and a GBNF ``grammar``; and it continues an answer's given opening (``ChatRequest.answer_prefix``): the
request ends with an assistant turn holding the opening, which llama.cpp's server continues (``prefill_assistant``,
on by default) as the in-process backend does. ``logprobs=True`` asks for token log-probabilities and returns their mean
as ``ChatResult.mean_logprob``. A subclass for another server (tasks/llm/vllm_backend.py) says what it continues
(``continues_openings``), how its ``/tokenize`` is asked (``tokenize_body``) and what it adds (``request_body``);
``token_logit_bias`` turns a request's steering into the token-id bias both servers take.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Callable, Sequence

import httpx

from privseed.tasks.errors import ConfigError, PrivseedError
from privseed.tasks.llm.base import ChatRequest, ChatResult, LLMBackend, OnEach, SeedSteering
from privseed.tasks.llm.retry import RetryPolicy, run_concurrently
from privseed.tasks.llm.steering import avoided_forms, surface_forms

#: Static logit bias per unit of --steer: the token-by-token processor pushes only the terms still missing and
#: only between terms; a bias that is on for the whole answer at full strength makes the model list the seeds.
STATIC_BIAS_PER_STEER = 0.75


def _base_v1(url: str) -> str:
    url = url.rstrip("/")
    if url.endswith("/chat/completions"):
        url = url[: -len("/chat/completions")]
    return url if url.endswith("/v1") else url + "/v1"


def steering_body(steering: SeedSteering | None) -> dict[str, Any]:
    """llama.cpp server fields for a request's SeedSteering (pure): every surface form of every seed term gets a
    static logit bias of ``strength * STATIC_BIAS_PER_STEER`` (the server tokenizes the strings and biases their
    tokens), ``repeat_penalty`` as given (it keeps a written term from being pushed into a loop), and
    ``no_repeat_ngram`` n > 0 becomes llama.cpp's DRY sampler (which penalises extending a repeated sequence of more
    than n - 1 tokens) instead of a hard n-gram ban."""
    if steering is None:
        return {}
    body: dict[str, Any] = {}
    bias = steering.strength * STATIC_BIAS_PER_STEER
    if bias > 0:
        # No presence penalty: llama.cpp charges it on every token already written (the full stop too), not on the
        # seed terms alone, and at the bias's size it ran sentences on (a median 45 words a sentence on DBPedia-14,
        # the first candidates of two in three OHSUMED-23 seeds rejected as repetitive; issue 48, 2026-11-29)
        body["logit_bias"] = [[form, bias] for term in steering.terms for form in surface_forms(term)]
    if steering.repeat_penalty != 1.0:
        body["repeat_penalty"] = steering.repeat_penalty
    if steering.no_repeat_ngram > 0:
        body.update({"dry_multiplier": 0.8, "dry_allowed_length": max(1, steering.no_repeat_ngram - 1)})
    return body


def token_logit_bias(steering: SeedSteering | None, tokens: Callable[[str], Sequence[int]]) -> dict[str, float]:
    """A server's per-request ``logit_bias`` (token id -> bias) for a request's SeedSteering (pure, given the served
    model's tokenizer ``tokens``): the FIRST token of each seed term's surface forms gets ``strength *
    STATIC_BIAS_PER_STEER``, as the token-by-token processor pushes where a term begins, not every token of it (a
    bias on word pieces such as "ing" pushed them into every word); the words to avoid (``SeedSteering.avoid``) get
    -strength where " word" or " Word" is one token, as the processor gives them; a longer one is left to the
    class-fit rounds, since a static bias on its first token would take down the other words that begin with it
    (" del" of " deli"). A seed term's first token wins over a word to avoid."""
    if steering is None or steering.strength <= 0:
        return {}
    bias: dict[str, float] = {}
    push = steering.strength * STATIC_BIAS_PER_STEER
    for term in steering.terms:
        for form in surface_forms(term):
            first = tuple(tokens(form))[:1]
            if first:
                bias[str(first[0])] = max(bias.get(str(first[0]), float("-inf")), push)
    for form in avoided_forms(steering.avoid, steering.terms):
        token = tuple(tokens(form))
        if len(token) == 1:
            bias.setdefault(str(token[0]), -float(steering.strength))
    return bias


def mean_logprob(choice: Any) -> float | None:
    """The mean token log-probability of an answer from the choice's ``logprobs.content`` (None without)."""
    logprobs = getattr(choice, "logprobs", None)
    content = getattr(logprobs, "content", None) if logprobs is not None else None
    values = [float(t.logprob) for t in content or [] if getattr(t, "logprob", None) is not None]
    return sum(values) / len(values) if values else None


def server_says(body: object) -> str:
    """A refusal's own words, as ``: ...`` for the error line (at most 200 characters; "" when the body holds none).
    A request carries released seeds and public settings only, so what the server says about it is public too."""
    message = body
    if isinstance(body, dict):
        error = body.get("error")
        message = body.get("message") or (error.get("message") if isinstance(error, dict) else error)
    text = " ".join(str(message or "").split())
    return f": {text[:200]}" if text else ""


def continued_answer(opening: str, content: str) -> str:
    """The answer's text when it continued ``opening``: llama.cpp's server (the build xllamacpp ships) answers with
    the whole turn, opening included; a build that answers with the continuation alone gets the opening put back."""
    text = content if content.startswith(opening) else opening + content
    return text.strip()


class OpenAICompatibleBackend(LLMBackend):
    name = "openai-compatible"
    #: whether the server continues a last assistant turn (``ChatRequest.answer_prefix``); llama.cpp's does
    #: (``llama_cpp``), and a subclass for another server says so (``BackendKind.prefill`` is the kind's word on it)
    continues_openings = False

    def __init__(self, url: str, model: str | None = None, *, api_key_env: str = "OPENAI_API_KEY",
                 secret_block: str | None = None, max_concurrency: int = 4, retry: RetryPolicy = RetryPolicy(),
                 timeout: float = 300.0, price_in_per_mtok: float | None = None,
                 price_out_per_mtok: float | None = None, llama_cpp: bool = False, logprobs: bool = False,
                 grammar: str | None = None):
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"{self.name} needs an http(s) URL, got {url!r}")
        self.base = _base_v1(url)
        self.max_concurrency = int(max_concurrency)
        self.retry = retry
        self.timeout = float(timeout)
        self.llama_cpp = bool(llama_cpp)
        self.logprobs = bool(logprobs)
        self.grammar = grammar
        key = os.environ.get(api_key_env)
        if not key and secret_block:
            from privseed.tasks.llm.anthropic_backend import resolve_api_key

            key = resolve_api_key(api_key_env, secret_block)
        self.__api_key = key or "none"  # the SDK wants a key; a server without auth ignores the header
        self._client: Any = None
        self._client_lock = threading.Lock()
        self._tokens: dict[str, tuple[int, ...]] = {}
        self._tokens_lock = threading.Lock()
        self.continues_openings = self.continues_openings or self.llama_cpp
        self.model = model or self._first_model()
        self.price_in_per_mtok = price_in_per_mtok
        self.price_out_per_mtok = price_out_per_mtok

    @property
    def client(self) -> Any:
        with self._client_lock:
            if self._client is None:
                import openai

                self._client = openai.OpenAI(api_key=self.__api_key, base_url=self.base, timeout=self.timeout,
                                             max_retries=self.retry.max_retries)
            return self._client

    def _call(self, what: str, fn: Any) -> Any:
        import openai

        try:
            return fn()
        except openai.APIStatusError as e:
            raise PrivseedError(f"{self.base} refused {what}: HTTP {e.status_code}{server_says(e.body)}") from e
        except openai.APIConnectionError as e:
            raise PrivseedError(f"{self.base}: {what} still failing after {self.retry.max_retries} retries: "
                                f"{type(e).__name__}") from e

    def _first_model(self) -> str:
        models = self._call("list models", lambda: list(self.client.models.list()))
        if not models:
            raise ConfigError(f"{self.base}/models lists no model; name one with openai-compatible:URL#MODEL")
        return str(models[0].id)

    def tokenize_body(self, text: str) -> dict[str, Any] | None:
        """The JSON the server's ``/tokenize`` takes for ``text`` without special tokens (None: this client knows
        no tokenizer endpoint of the server)."""
        return None

    def tokens(self, text: str) -> tuple[int, ...]:
        """The token ids of ``text`` in the served model's vocabulary (the server's ``/tokenize``, next to ``/v1``;
        cached per text)."""
        with self._tokens_lock:
            if text not in self._tokens:
                body = self.tokenize_body(text)
                if body is None:
                    raise ConfigError(f"{self.base}: no tokenizer endpoint known for this server")
                self.client  # noqa: B018 - a server started on first use runs before it is asked
                headers = {"authorization": f"Bearer {self.__api_key}"} if self.__api_key != "none" else {}
                url = self.base.removesuffix("/v1") + "/tokenize"
                try:
                    r = httpx.post(url, json=body, headers=headers, timeout=30)
                    r.raise_for_status()
                except httpx.HTTPStatusError as e:
                    raise PrivseedError(f"{url} refused tokenize: HTTP {e.response.status_code}") from e
                except httpx.HTTPError as e:
                    raise PrivseedError(f"{url}: tokenize failed: {type(e).__name__}") from e
                self._tokens[text] = tuple(int(t) for t in r.json().get("tokens") or ())
            return self._tokens[text]

    def request_body(self, req: ChatRequest) -> dict[str, Any]:
        """Fields beyond the OpenAI schema for ``req`` (sent as the SDK's ``extra_body``)."""
        extra: dict[str, Any] = {}
        if self.llama_cpp:
            extra["cache_prompt"] = True
            extra.update(steering_body(req.steering))
            if self.grammar:
                extra["grammar"] = self.grammar
        return extra

    def _messages(self, req: ChatRequest) -> list[dict[str, str]]:
        """The chat sent for ``req``: with an opening, a last assistant turn that the server continues."""
        messages = req.messages_dicts()
        if req.answer_prefix:
            if not self.continues_openings:
                raise ConfigError(f"{self.base} is not known to continue a given opening (llama.cpp's server and "
                                  "vLLM do, as --llm local-server and vllm:URL); a kind whose backend cannot leaves "
                                  "BackendKind.prefill false")
            messages.append({"role": "assistant", "content": req.answer_prefix})
        return messages

    def _one(self, req: ChatRequest) -> ChatResult:
        kwargs: dict[str, Any] = {"model": self.model, "messages": self._messages(req), "max_tokens": req.max_tokens,
                                  "temperature": req.temperature, "top_p": req.top_p, "seed": req.seed}
        if self.logprobs:
            kwargs["logprobs"] = True
        extra = self.request_body(req)
        if extra:
            kwargs["extra_body"] = extra
        d = self._call("chat completion", lambda: self.client.chat.completions.create(**kwargs))
        if not getattr(d, "choices", None):
            raise PrivseedError(f"{self.base}/chat/completions answered without choices[0].message")
        choice = d.choices[0]
        usage = d.usage
        return ChatResult(text=continued_answer(req.answer_prefix, choice.message.content or ""),
                          tokens_in=int(getattr(usage, "prompt_tokens", 0) or 0),
                          tokens_out=int(getattr(usage, "completion_tokens", 0) or 0),
                          finish_reason=str(choice.finish_reason) if choice.finish_reason else None,
                          mean_logprob=mean_logprob(choice))

    def complete(self, requests: Sequence[ChatRequest], on_each: OnEach | None = None) -> list[ChatResult]:
        return run_concurrently(self._one, requests, self.max_concurrency, on_each)

    def close(self) -> None:
        with self._client_lock:
            if self._client is not None:
                self._client.close()
                self._client = None
