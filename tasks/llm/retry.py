"""Retries with exponential backoff (tenacity), and a bounded thread pool for remote APIs.

The OpenAI-compatible client retries inside the ``openai`` SDK; the Anthropic backend keeps its tested policy
(full jitter, the server's ``retry-after`` honoured, one warning per wait) and tenacity runs it."""
from __future__ import annotations

import logging
import random
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

from privseed.tasks.llm.base import ChatRequest, ChatResult, OnEach

T = TypeVar("T")
log = logging.getLogger("privseed.llm")

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})


class RetryableCallError(Exception):
    """Raised by a backend's single-call function for a transient failure (429, 5xx, overloaded, network).
    ``retry_after`` is the server's hint in seconds, when it gave one."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 6
    base_delay: float = 1.0
    max_delay: float = 60.0

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        """Full-jitter exponential backoff, never shorter than the server's retry-after hint."""
        backoff = min(self.max_delay, self.base_delay * (2 ** attempt))
        d = rng.uniform(0.5 * backoff, backoff)
        return max(d, retry_after or 0.0)


def with_retries(fn: Callable[[], T], policy: RetryPolicy, what: str,
                 sleep: Callable[[float], None] = time.sleep) -> T:
    """``fn()``, retried on RetryableCallError by ``policy`` (tenacity); the last error is re-raised."""
    import tenacity

    rng = random.Random()

    def wait(state: tenacity.RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome is not None else None
        return policy.delay(state.attempt_number - 1, getattr(error, "retry_after", None), rng)

    def warn(state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        wait_s = state.next_action.sleep if state.next_action is not None else 0.0
        # The message is the backend's status summary (status code / error type), never prompt text.
        log.warning("%s: transient failure (%s); retry %d/%d in %.1fs", what, error, state.attempt_number,
                    policy.max_retries, wait_s)

    retrying = tenacity.Retrying(retry=tenacity.retry_if_exception_type(RetryableCallError),
                                 stop=tenacity.stop_after_attempt(policy.max_retries + 1), wait=wait,
                                 before_sleep=warn, sleep=sleep, reraise=True)
    return retrying(fn)


def run_concurrently(call: Callable[[ChatRequest], ChatResult], requests: Sequence[ChatRequest],
                     max_concurrency: int, on_each: OnEach | None) -> list[ChatResult]:
    """Run ``call`` over ``requests`` with at most ``max_concurrency`` in flight; results in request order.
    The first permanent failure cancels what has not started and is re-raised (finished calls were already
    handed to ``on_each`` and so are cached)."""
    results: list[ChatResult | None] = [None] * len(requests)
    if max_concurrency <= 1 or len(requests) <= 1:
        for i, r in enumerate(requests):
            results[i] = result = call(r)
            if on_each:
                on_each(i, result)
        return results  # type: ignore[return-value]
    with ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="llm") as pool:
        futures = {pool.submit(call, r): i for i, r in enumerate(requests)}
        try:
            for fut in as_completed(futures):
                i = futures[fut]
                results[i] = result = fut.result()
                if on_each:
                    on_each(i, result)
        except BaseException:
            for f in futures:
                f.cancel()
            raise
    return results  # type: ignore[return-value]
