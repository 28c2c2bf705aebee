"""Anthropic Messages API backend, with Message Batches for large runs.

- Interactive calls: at most ``max_concurrency`` in flight, each retried with exponential backoff on 429,
  5xx, 529 overloaded and network errors (the SDK's own retries are off so the policy is ours and tested).
- Message Batches (half price, asynchronous): requests are cut into batches of at most ``max_batch_size``,
  all submitted at once (``max_concurrency`` submissions in flight); each batch id is persisted under
  ``batch_state`` with the custom_ids it holds as soon as the API returns it, *before* anything polls, so a
  crashed run (some batches submitted, some not, some collected) resumes the open batches and submits only the
  rest, never paying twice. Open batches are polled together and each is collected the moment it ends, its
  answers handed on (to the call cache) as they are read; errored or expired entries are re-sent through the
  Messages API.
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
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

from privseed.tasks.errors import ConfigError, PrivseedError
from privseed.tasks.llm.base import ChatRequest, ChatResult, LLMBackend, OnEach
from privseed.tasks.llm.retry import RETRYABLE_STATUS, RetryableCallError, RetryPolicy, run_concurrently, with_retries

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


def will_batch(use_batches: bool | None, batch_threshold: int, n_requests: int) -> bool:
    """THE batching rule: Message Batches when asked to, else for runs of at least ``batch_threshold`` calls."""
    return use_batches if use_batches is not None else n_requests >= batch_threshold


def resolve_api_key(env_var: str, secret_block: str | None = None) -> str:
    """The key from the environment, else from a Prefect Secret block. The key itself never appears in
    any message."""
    key = os.environ.get(env_var)
    if key:
        return key
    if secret_block:
        try:
            from prefect.blocks.system import Secret

            # called from synchronous code, where Prefect's dual sync/async load returns the block itself
            return str(Secret.load(secret_block).get())  # type: ignore[union-attr]
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
                 poll_interval: float = 30.0, send_sampling_params: bool = False, timeout: float = 120.0,
                 sleep: Callable[[float], None] = time.sleep):
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
        return will_batch(self.use_batches, self.batch_threshold, n_requests)

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
            raise PrivseedError(
                f"Anthropic API {what} still failing after {self.retry.max_retries} retries: {e}") from e

    # -- interactive ---------------------------------------------------------------------------------------
    def _one(self, req: ChatRequest) -> ChatResult:
        params = self._params(req)
        return self._result(self._retrying(lambda: self._create(params), "messages.create"))

    def complete(self, requests: Sequence[ChatRequest], on_each: OnEach | None = None) -> list[ChatResult]:
        if self.will_batch(len(requests)):
            return self._complete_batched(requests, on_each)
        return run_concurrently(self._one, requests, self.max_concurrency, on_each)

    # -- Message Batches -----------------------------------------------------------------------------------
    # One state object per submitted batch, under batch_state/anthropic-batches/ through privseed.tasks.storage (the
    # run's storage options with Secret-block references resolved, retries with backoff, atomic writes): while the
    # batch is open, ``<digest>.open.json`` names its id and every custom_id in it; once collected, ``<digest>.json``
    # records the id and the open file goes. A crashed run thus knows, for each of its requests, whether a batch
    # already holds it.
    def _states_dir(self) -> str | None:
        return f"{self.batch_state}/anthropic-batches" if self.batch_state else None

    def _state_path(self, custom_ids: Sequence[str], status: str) -> str | None:
        folder = self._states_dir()
        if folder is None:
            return None
        digest = hashlib.sha256("\n".join([self.model, *custom_ids]).encode()).hexdigest()[:32]
        return f"{folder}/{digest}{'.open' if status == 'open' else ''}.json"

    def _write_state(self, path: str | None, state: dict) -> None:
        if path is None:
            return
        from privseed.tasks import storage

        storage.write_bytes(path, json.dumps(state).encode("utf-8"), self.storage_options)

    def _open_batches(self, wanted: set[str]) -> list[tuple[str, list[str], str]]:
        """(batch id, the custom_ids of ``wanted`` it holds, its state's URI) of every batch an earlier run
        submitted and did not collect that holds some of ``wanted`` and that the API still knows (one listing of
        the state folder, then the open states only). A batch the API no longer has (results are kept 29 days)
        is forgotten: its requests are submitted again."""
        folder = self._states_dir()
        if folder is None:
            return []
        from privseed.tasks import storage

        open_paths = [u for u in storage.listdir(folder, self.storage_options) if u.endswith(".open.json")]

        def read(uri: str) -> dict | None:
            try:
                return json.loads(storage.read_bytes(uri, self.storage_options).decode("utf-8"))
            except FileNotFoundError:
                return None  # collected by another process since the listing

        found = []
        for uri, state in zip(open_paths, _map_bounded(read, open_paths, self.max_concurrency)):
            if not state or state.get("model") != self.model or not state.get("batch_id"):
                continue
            ids = [c for c in state.get("custom_ids", []) if c in wanted]
            if ids:
                found.append((state["batch_id"], ids, uri))
        known = _map_bounded(lambda b: self._still_known(b[0]), found, self.max_concurrency)
        for (batch_id, _, uri), ok in zip(found, known):
            if not ok:
                log.warning("Message Batch %s is no longer known to the API; its requests are submitted again",
                            batch_id)
                storage.remove(uri, self.storage_options)
        return [b for b, ok in zip(found, known) if ok]

    def _still_known(self, batch_id: str) -> bool:
        import anthropic

        try:
            self._retrying(lambda: self.client.messages.batches.retrieve(batch_id), "batches.retrieve")
        except PrivseedError as e:
            if isinstance(e.__cause__, anthropic.NotFoundError):
                return False
            raise
        return True

    def _complete_batched(self, requests: Sequence[ChatRequest], on_each: OnEach | None) -> list[ChatResult]:
        """Every chunk of ``requests`` is submitted at once (``max_concurrency`` submissions in flight), each
        batch id persisted as soon as the API returns it; then all open batches are polled together and each is
        collected the moment it ends, its answers handed to ``on_each`` (the call cache) as they are read.
        Requests that an uncollected batch of an earlier run already holds are not submitted again: that
        batch is polled and collected instead."""
        results: list[ChatResult | None] = [None] * len(requests)
        # custom_id: the call's cache key (hex, unique per distinct request; 64 chars is the API's limit).
        custom_ids = [r.cache_key(self.name, self.model)[:64] for r in requests]
        by_custom = {c: i for i, c in enumerate(custom_ids)}
        if len(by_custom) != len(custom_ids):
            raise ConfigError("duplicate requests in one batch; deduplicate before calling (cached_complete does)")
        resumed = self._open_batches(set(custom_ids))
        held = {c for _, ids, _ in resumed for c in ids}
        for batch_id, ids, _ in resumed:
            log.info("resuming Message Batch %s (%d requests)", batch_id, len(ids))
        rest = [i for i, c in enumerate(custom_ids) if c not in held]
        chunks = [rest[s:s + self.max_batch_size] for s in range(0, len(rest), self.max_batch_size)]
        submitted = self._submit_all(requests, custom_ids, chunks)
        batches: list[tuple[str, list[int], str | None]] = [(bid, [by_custom[c] for c in ids], uri)
                                                            for bid, ids, uri in resumed]
        batches += submitted
        self._poll_and_collect(requests, custom_ids, batches, results, on_each)
        return results  # type: ignore[return-value]

    def _submit_all(self, requests: Sequence[ChatRequest], custom_ids: list[str],
                    chunks: list[list[int]]) -> list[tuple[str, list[int], str | None]]:
        batches_api = self.client.messages.batches

        def submit(idx: list[int]) -> tuple[str, list[int], str | None]:
            ids = [custom_ids[i] for i in idx]
            body = [{"custom_id": c, "params": self._params(requests[i])} for c, i in zip(ids, idx)]
            batch = self._retrying(lambda: batches_api.create(requests=body), "batches.create")
            state_path = self._state_path(ids, "open")
            # Persisted before anything waits on it: a crash from here on resumes this batch instead of paying
            # again.
            self._write_state(state_path, {"batch_id": batch.id, "model": self.model, "n": len(idx),
                                           "submitted_at": time.time(), "custom_ids": ids})
            log.info("submitted Message Batch %s (%d requests)", batch.id, len(idx))
            return batch.id, idx, state_path

        return _map_bounded(submit, chunks, self.max_concurrency)

    def _poll_and_collect(self, requests: Sequence[ChatRequest], custom_ids: list[str],
                          batches: list[tuple[str, list[int], str | None]], results: list,
                          on_each: OnEach | None) -> None:
        batches_api = self.client.messages.batches
        waiting = list(batches)
        while waiting:
            ended = _map_bounded(
                lambda b: self._retrying(lambda: batches_api.retrieve(b[0]), "batches.retrieve").processing_status
                == "ended", waiting, self.max_concurrency)
            done = [b for b, e in zip(waiting, ended) if e]
            _map_bounded(lambda b: self._collect(requests, custom_ids, b, results, on_each), done,
                         self.max_concurrency)
            waiting = [b for b, e in zip(waiting, ended) if not e]
            if waiting:
                self._sleep(self.poll_interval)

    def _collect(self, requests: Sequence[ChatRequest], custom_ids: list[str],
                 batch: tuple[str, list[int], str | None], results: list, on_each: OnEach | None) -> None:
        batch_id, idx, state_path = batch
        by_custom = {custom_ids[i]: i for i in idx}
        batches_api = self.client.messages.batches
        failed = 0
        for item in self._retrying(lambda: list(batches_api.results(batch_id)), "batches.results"):
            i = by_custom.get(item.custom_id)
            if i is None:
                continue  # a request of the batch that this call does not need (answered and cached since)
            if item.result.type == "succeeded":
                results[i] = self._result(item.result.message)
                if on_each:
                    on_each(i, results[i])
            else:
                failed += 1
        redo = [i for i in idx if results[i] is None]
        if redo:
            log.warning("Message Batch %s: %d of %d requests without a result (%d errored/expired/canceled); "
                        "re-sending them through the Messages API", batch_id, len(redo), len(idx), failed)

            def on_redo(j: int, res: ChatResult) -> None:
                results[redo[j]] = res
                if on_each:
                    on_each(redo[j], res)

            run_concurrently(self._one, [requests[i] for i in redo], self.max_concurrency, on_redo)
        if state_path is not None:
            from privseed.tasks import storage

            self._write_state(state_path.removesuffix(".open.json") + ".json",
                              {"batch_id": batch_id, "model": self.model, "n": len(idx), "collected": True})
            storage.remove(state_path, self.storage_options)


def _map_bounded(fn: Callable, items: Sequence, max_workers: int) -> list:
    """``[fn(x) for x in items]`` with at most ``max_workers`` running at once, in item order; the first failure
    cancels what has not started and is re-raised (what already finished stays done: a submitted batch stays
    persisted)."""
    if max_workers <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(max_workers, len(items)), thread_name_prefix="batch") as pool:
        futures = [pool.submit(fn, x) for x in items]
        try:
            return [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            raise
