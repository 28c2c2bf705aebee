"""Any server that speaks the OpenAI chat-completions API (vLLM, llama.cpp server, TGI, ...), via httpx.

``openai-compatible:URL`` where URL is the server's base (``http://host:8000`` or ``http://host:8000/v1``);
append ``#MODEL`` to choose a model, otherwise the first id from ``GET /v1/models`` is used. A key, when the
server wants one, comes from OPENAI_API_KEY (or a Prefect Secret block) and is sent as a Bearer token only.
"""
from __future__ import annotations

import os
import threading
from typing import Sequence

import httpx

from privseed.tasks.errors import ConfigError, PrivseedError
from privseed.tasks.llm.base import ChatRequest, ChatResult, LLMBackend, OnEach
from privseed.tasks.llm.retry import RETRYABLE_STATUS, RetryableCallError, RetryPolicy, run_concurrently, with_retries


def _base_v1(url: str) -> str:
    url = url.rstrip("/")
    if url.endswith("/chat/completions"):
        url = url[: -len("/chat/completions")]
    return url if url.endswith("/v1") else url + "/v1"


class OpenAICompatibleBackend(LLMBackend):
    name = "openai-compatible"

    def __init__(self, url: str, model: str | None = None, *, api_key_env: str = "OPENAI_API_KEY",
                 secret_block: str | None = None, max_concurrency: int = 4, retry: RetryPolicy = RetryPolicy(),
                 timeout: float = 300.0, price_in_per_mtok: float | None = None,
                 price_out_per_mtok: float | None = None):
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"openai-compatible needs an http(s) URL, got {url!r}")
        self.base = _base_v1(url)
        self.max_concurrency = int(max_concurrency)
        self.retry = retry
        self.timeout = float(timeout)
        key = os.environ.get(api_key_env)
        if not key and secret_block:
            from privseed.tasks.llm.anthropic_backend import resolve_api_key

            key = resolve_api_key(api_key_env, secret_block)
        self.__headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._local = threading.local()
        self.model = model or self._first_model()
        self.price_in_per_mtok = price_in_per_mtok
        self.price_out_per_mtok = price_out_per_mtok

    @property
    def _http(self) -> httpx.Client:
        c = getattr(self._local, "client", None)
        if c is None:
            c = self._local.client = httpx.Client(timeout=self.timeout, headers=self.__headers)
        return c

    def _send(self, method: str, path: str, what: str, **kw) -> dict:
        def attempt():
            try:
                r = self._http.request(method, self.base + path, **kw)
            except httpx.TransportError as e:
                raise RetryableCallError(type(e).__name__) from e
            if r.status_code in RETRYABLE_STATUS or r.status_code >= 500:
                ra = r.headers.get("retry-after")
                raise RetryableCallError(f"HTTP {r.status_code}",
                                         float(ra) if ra and ra.replace(".", "", 1).isdigit() else None)
            if r.status_code >= 400:
                raise PrivseedError(f"{self.base}{path} refused {what}: HTTP {r.status_code}")
            try:
                return r.json()
            except ValueError as e:
                raise PrivseedError(f"{self.base}{path} answered {what} with non-JSON") from e

        try:
            return with_retries(attempt, self.retry, f"openai-compatible {what}")
        except RetryableCallError as e:
            raise PrivseedError(f"{self.base}: {what} still failing after {self.retry.max_retries} retries: {e}") from e

    def _first_model(self) -> str:
        data = self._send("GET", "/models", "list models").get("data") or []
        if not data:
            raise ConfigError(f"{self.base}/models lists no model; name one with openai-compatible:URL#MODEL")
        return str(data[0]["id"])

    def _one(self, req: ChatRequest) -> ChatResult:
        body = {"model": self.model, "messages": req.messages_dicts(), "max_tokens": req.max_tokens,
                "temperature": req.temperature, "top_p": req.top_p, "seed": req.seed}
        d = self._send("POST", "/chat/completions", "chat completion", json=body)
        try:
            text = d["choices"][0]["message"]["content"] or ""
            usage = d.get("usage") or {}
        except (KeyError, IndexError, TypeError) as e:
            raise PrivseedError(f"{self.base}/chat/completions answered without choices[0].message") from e
        finish = (d.get("choices") or [{}])[0].get("finish_reason")
        return ChatResult(text=text.strip(), tokens_in=int(usage.get("prompt_tokens", 0)),
                          tokens_out=int(usage.get("completion_tokens", 0)),
                          finish_reason=str(finish) if finish else None)

    def complete(self, requests: Sequence[ChatRequest], on_each: OnEach | None = None) -> list[ChatResult]:
        return run_concurrently(self._one, requests, self.max_concurrency, on_each)
