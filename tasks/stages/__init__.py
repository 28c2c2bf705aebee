"""The Prefect tasks of every flow: thin wrappers that do I/O, retries and logging around the pure functions of
``tasks/``. Flows (``flows/``) only wire these together.

Retry and persistence are declared here, once, by what a stage touches:

- ``private_stage``: the stage reads private documents or holds values derived from them. Its result stays in
  memory (``persist_result=False``, no cache): Prefect's result store would copy private data to a second
  place. What must survive a crash is what was released, and the privacy ledger persists that (drawn once,
  re-read on retry); a retried or resumed run recomputes the private intermediates and re-reads every release.
- ``public_stage``: the stage handles public or released values only; same persistence (nothing in it is worth
  caching across runs), fewer retries.

Both retry only what ``privseed.tasks.errors.is_transient`` calls transient (a property of the error's class).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from prefect import Task, task
from prefect.cache_policies import NO_CACHE

from privseed.tasks.errors import retry_if_transient

P = ParamSpec("P")
R = TypeVar("R")
log = logging.getLogger("privseed")

#: Results of stages never go to Prefect's result store (see the module docstring).
NOT_PERSISTED: dict[str, Any] = dict(persist_result=False, cache_policy=NO_CACHE)
#: Backoff between retries of a stage that failed with a transient error.
RETRY_DELAYS_S: list[float] = [2, 10]


def private_stage(name: str, *, retries: int = 2) -> Callable[[Callable[P, R]], Task[P, R]]:
    """A Prefect task over private data (see the module docstring)."""
    return task(name=name, retries=retries, retry_delay_seconds=RETRY_DELAYS_S[:max(retries, 1)],
                retry_condition_fn=retry_if_transient, **NOT_PERSISTED)


def public_stage(name: str, *, retries: int = 0) -> Callable[[Callable[P, R]], Task[P, R]]:
    """A Prefect task over public or released values (see the module docstring)."""
    if retries:
        return task(name=name, retries=retries, retry_delay_seconds=RETRY_DELAYS_S[:retries],
                    retry_condition_fn=retry_if_transient, **NOT_PERSISTED)
    return task(name=name, **NOT_PERSISTED)


def stage_logger() -> logging.Logger | logging.LoggerAdapter:
    """The run logger inside a flow or task; privseed's logger when a stage body is called directly (tests)."""
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return log
