"""Anthropic Messages API backend, with Message Batches for large runs.

- Interactive calls: at most ``max_concurrency`` in flight, each retried with exponential backoff on 429,
  5xx, 529 overloaded and network errors (the SDK's own retries are off so the policy is ours and tested).
- Message Batches (half price, asynchronous): requests are submitted in batches of at most
  ``max_batch_size``; the batch id is persisted under ``batch_state`` *before* polling, so a crashed run
  resumes the same batch instead of paying for it twice. Results are read from the batch's results_url;
  errored or expired entries are re-sent through the Messages API.
- Sampling parameters: the current Messages API (SDK 2.x) has no temperature/top_p, so by default none are
  sent (the request's temperature and seed still key the cache). ``send_sampling_params=True`` adds them
  to the request body for models that accept them.
- The API key comes from ANTHROPIC_API_KEY or a Prefect Secret block; it is held privately and never logged
  or shown in repr. Anthropic has no sampling seed: the request seed only keys the call cache (so best-of-k
  candidates are distinct calls).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from typing import Callable, Sequence

from tasks.errors import ConfigError, PrivseedError
from tasks.llm.base import ChatRequest, ChatResult, LLMBackend, OnEach
from tasks.llm.retry import RETRYABLE_STATUS, RetryableCallError, RetryPolicy, run_concurrently, with_retries

log = logging.getLogger("privseed.llm")

# List prices in USD per million tokens (input, output), as published by Anthropic; longest prefix wins.
# Used for the --dry-run estimate and the progress bar only; batches cost half.
ANTHROPIC_PRICES: dict[str, tuple[float, float]] = {
    "claude-opus-4-5": (5.0, 25.0),
    "claude-opus-4": (15.0, 75.0),
    "claude-sonnet-4": (3.0, 15.0),
    "claude-3-7-sonnet": (3.0, 15.0),
    "claude-3-5-sonnet": (3.0, 15.0),
    "claude-haiku-4": (1.0, 5.0),
    "claude-3-5-haiku": (0.8, 4.0),
    "claude-3-haiku": (0.25, 1.25),
}
BATCH_DISCOUNT = 0.5


def anthropic_price(model: str) -> tuple[float, float] | None:
    best = max((p for p in ANTHROPIC_PRICES if model.startswith(p)), key=len, default=None)
    return ANTHROPIC_PRICES[best] if best else None


def resolve_api_key(env_var: str, secret_block: str | None = None) -> str:
    """The key from the environment, else from a Prefect Secret block. The key itself never appears in
    any message."""
    key = os.environ.get(env_var)
    if key:
        return key
    if secret_block:
        try:
            from prefect.blocks.system import Secret

            return str(Secret.load(secret_block).get())
        except Exception as e:  # noqa: BLE001 - any failure to read the block is a configuration problem
            raise ConfigError(f"could not read the Prefect Secret block {secret_block!r}: {type(e).__name__}") from e
    raise ConfigError(f"no API key: set {env_var} or name a Prefect Secret block")


class BatchFailedError(PrivseedError):
    """A Message Batch ended without results for some requests and they could not be re-sent."""


class AnthropicBackend(LLMBackend):
    name = "anthropic"

    def __init__(self, model: str, *, api_key: str | None = None, secret_block: str | None = None,
                 base_url: str | None = None, max_concurrency: int = 4, retry: RetryPolicy = RetryPolicy(),
                 use_batches: bool | None = None, batch_threshold: int = 200, max_batch_size: int = 10_000,
                 batch_state: str | None = None, storage_options: dict | None = None,
                 poll_interval: float = 30.0, send_sampling_params: bool = False, timeout: float = 120.0, sleep: Callable[[float], None] = time.sleep):
        if not model:
            raise ConfigError("anthropic needs a model, e.g. --llm anthropic:claude-haiku-4-5")
        self.model = model
        self.__api_key = api_key or resolve_api_key("ANTHROPIC_API_KEY", secret_block)
        self.base_url = base_url or os.environ.get("ANTHROPIC_BASE_URL") or None
        self.max_concurrency = int(max_concurrency)
        self.retry = retry
        self.use_batches = use_batches
        self.batch_threshold = int(batch_threshold)
        self.max_batch_size = int(max_batch_size)
        self.batch_state = batch_state.rstrip("/") if batch_state else None
        self.storage_options = storage_options or {}
        self.poll_interval = float(poll_interval)
        self.send_sampling_params = bool(send_sampling_params)
        self.timeout = float(timeout)
        self._sleep = sleep
        price = anthropic_price(model)
        self.price_in_per_mtok, self.price_out_per_mtok = price if price else (None, None)
        self._client = None
        self._client_lock = threading.Lock()

    # -- pricing -------------------------------------------------------------------------------------------
    def will_batch(self, n_requests: int) -> bool:
        return self.use_batches if self.use_batches is not None else n_requests >= self.batch_threshold

    def price_factor(self, n_requests: int) -> float:
        return BATCH_DISCOUNT if self.will_batch(n_requests) else 1.0

    # -- client --------------------------------------------------------------------------------------------
    @property
    def client(self):
        with self._client_lock:
            if self._client is None:
                import anthropic

                self._client = anthropic.Anthropic(api_key=self.__api_key, base_url=self.base_url,
                                                   max_retries=0, timeout=self.timeout)
            return self._client

    def _params(self, req: ChatRequest) -> dict:
        """The request body (the batch API's ``params`` use the same shape)."""
        system, turns = req.system_and_turns()
        p = {"model": self.model, "max_tokens": req.max_tokens, "messages": turns}
        if system:
            p["system"] = system
        if self.send_sampling_params:
            if req.temperature > 1.0:
                raise ConfigError(f"Anthropic temperature must be in [0, 1], got {req.temperature}")
            p["temperature"] = req.temperature
            if req.top_p < 1.0:
                p["top_p"] = req.top_p
        return p

    def _create(self, params: dict):
        # Sampling parameters are not in the SDK's signature; they travel as extra body fields.
        extra = {k: params[k] for k in ("temperature", "top_p") if k in params}
        core = {k: v for k, v in params.items() if k not in extra}
        return self.client.messages.create(**core, extra_body=extra or None)

    @staticmethod
    def _result(message) -> ChatResult:
        text = "".join(getattr(b, "text", "") for b in message.content if getattr(b, "type", "") == "text")
        stop = getattr(message, "stop_reason", None)
        finish = {"max_tokens": "length", "end_turn": "stop", "stop_sequence": "stop"}.get(str(stop)) if stop else None
        return ChatResult(text=text.strip(), tokens_in=int(message.usage.input_tokens),
                          tokens_out=int(message.usage.output_tokens), finish_reason=finish)

    def _retrying(self, fn: Callable, what: str):
        import anthropic

        def attempt():
            try:
                return fn()
            except anthropic.APIStatusError as e:
                if e.status_code in RETRYABLE_STATUS or e.status_code >= 500:
                    ra = e.response.headers.get("retry-after") if e.response is not None else None
                    raise RetryableCallError(f"HTTP {e.status_code} {type(e).__name__}",
                                             float(ra) if ra and ra.replace(".", "", 1).isdigit() else None) from e
                raise PrivseedError(f"Anthropic API refused {what}: HTTP {e.status_code} {type(e).__name__}") from e
            except anthropic.APIConnectionError as e:
                raise RetryableCallError(type(e).__name__) from e

        try:
            return with_retries(attempt, self.retry, f"anthropic {what}", sleep=self._sleep)
        except RetryableCallError as e:
            raise PrivseedError(f"Anthropic API {what} still failing after {self.retry.max_retries} retries: {e}") from e

    # -- interactive ---------------------------------------------------------------------------------------
    def _one(self, req: ChatRequest) -> ChatResult:
        params = self._params(req)
        return self._result(self._retrying(lambda: self._create(params), "messages.create"))

    def complete(self, requests: Sequence[ChatRequest], on_each: OnEach | None = None) -> list[ChatResult]:
        if self.will_batch(len(requests)):
            return self._complete_batched(requests, on_each)
        return run_concurrently(self._one, requests, self.max_concurrency, on_each)

    # -- Message Batches -----------------------------------------------------------------------------------
    def _state_path(self, custom_ids: Sequence[str]) -> str | None:
        if not self.batch_state:
            return None
        digest = hashlib.sha256("\n".join([self.model, *custom_ids]).encode()).hexdigest()[:32]
        return f"{self.batch_state}/anthropic-batches/{digest}.json"

    # Batch state goes through tasks.storage: the run's storage options (Secret-block references resolved),
    # retries with backoff, and an atomic write (a crash never leaves a half-written batch id).
    def _read_state(self, path: str | None) -> dict | None:
        if path is None:
            return None
        from tasks import storage

        try:
            return json.loads(storage.read_bytes(path, self.storage_options).decode("utf-8"))
        except FileNotFoundError:
            return None

    def _write_state(self, path: str | None, state: dict) -> None:
        if path is None:
            return
        from tasks import storage

        storage.write_bytes(path, json.dumps(state).encode("utf-8"), self.storage_options)

    def _complete_batched(self, requests: Sequence[ChatRequest], on_each: OnEach | None) -> list[ChatResult]:
        results: list[ChatResult | None] = [None] * len(requests)
        for start in range(0, len(requests), self.max_batch_size):
            chunk = list(range(start, min(start + self.max_batch_size, len(requests))))
            self._run_one_batch(requests, chunk, results, on_each)
        return results  # type: ignore[return-value]

    def _run_one_batch(self, requests: Sequence[ChatRequest], idx: list[int], results: list,
                       on_each: OnEach | None) -> None:
        # custom_id: the call's cache key (hex, unique per distinct request; 64 chars is the API's limit).
        custom_ids = [requests[i].cache_key(self.name, self.model)[:64] for i in idx]
        by_custom = dict(zip(custom_ids, idx))
        if len(by_custom) != len(idx):
            raise ConfigError("duplicate requests in one batch; deduplicate before calling (cached_complete does)")
        state_path = self._state_path(custom_ids)
        state = self._read_state(state_path)
        batches = self.client.messages.batches
        if state and state.get("batch_id"):
            batch_id = state["batch_id"]
            log.info("resuming Message Batch %s (%d requests)", batch_id, len(idx))
        else:
            body = [{"custom_id": c, "params": self._params(requests[i])} for c, i in zip(custom_ids, idx)]
            batch = self._retrying(lambda: batches.create(requests=body), "batches.create")
            batch_id = batch.id
            # Persist before polling: a crash from here on resumes this batch instead of paying again.
            self._write_state(state_path, {"batch_id": batch_id, "model": self.model, "n": len(idx),
                                           "submitted_at": time.time()})
            log.info("submitted Message Batch %s (%d requests)", batch_id, len(idx))
        while True:
            batch = self._retrying(lambda: batches.retrieve(batch_id), "batches.retrieve")
            if batch.processing_status == "ended":
                break
            self._sleep(self.poll_interval)
        retry_ids: list[str] = []
        for item in self._retrying(lambda: list(batches.results(batch_id)), "batches.results"):
            i = by_custom.get(item.custom_id)
            if i is None:
                continue
            if item.result.type == "succeeded":
                results[i] = self._result(item.result.message)
                if on_each:
                    on_each(i, results[i])
            else:
                retry_ids.append(item.custom_id)
        missing = [c for c in custom_ids if results[by_custom[c]] is None]
        if missing:
            log.warning("Message Batch %s: %d of %d requests without a result (%d errored/expired/canceled); "
                        "re-sending them through the Messages API", batch_id, len(missing), len(idx), len(retry_ids))
            redo = [by_custom[c] for c in missing]

            def on_redo(j: int, res: ChatResult) -> None:
                results[redo[j]] = res
                if on_each:
                    on_each(redo[j], res)

            run_concurrently(self._one, [requests[i] for i in redo], self.max_concurrency, on_redo)
        self._write_state(state_path, {"batch_id": batch_id, "model": self.model, "n": len(idx), "collected": True})
