"""The Dask cluster the parallel stages run on.

Flows open one client for the whole run (a LocalCluster on 127.0.0.1 by default, or an existing scheduler);
tasks pick it up with :func:`current_client` and map their work over shards. Without a client, stages run
in-process, which is what unit tests of the pure functions do.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import operator
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from tasks.errors import ConfigError

log = logging.getLogger(__name__)
T = TypeVar("T")

DASK_LOG_LEVEL_ENV = "PRIVSEED_DASK_LOG_LEVEL"


def dask_log_level() -> int | None:
    """The level for distributed's loggers while a flow's client is open, or None to leave them alone.

    distributed logs every scheduler, nanny and worker start and stop at INFO, which buries a run's own
    progress; they are kept at WARNING unless ``PRIVSEED_DASK_LOG_LEVEL`` names a level (``INFO``,
    ``DEBUG``, ...) or debug logging is on (``privseed -v``), in which case they are left as configured."""
    name = os.environ.get(DASK_LOG_LEVEL_ENV, "").strip()
    if name:
        level = logging.getLevelName(name.upper())
        if not isinstance(level, int):
            raise ConfigError(f"{DASK_LOG_LEVEL_ENV}={name!r} is not a logging level (DEBUG, INFO, WARNING, ERROR)")
        return level
    if logging.getLogger().getEffectiveLevel() <= logging.DEBUG:
        return None
    return logging.WARNING


@contextlib.contextmanager
def _distributed_logs_at(level: int | None) -> Iterator[None]:
    logger = logging.getLogger("distributed")
    previous = logger.level
    if level is not None:
        logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(previous)


@contextlib.contextmanager
def dask_client(address: str | None = None, n_workers: int = 2) -> Iterator[Any]:
    """A distributed Client: connects to ``address`` or starts a LocalCluster for the duration.
    distributed's own logs are held at :func:`dask_log_level` meanwhile (start-up and shutdown included)."""
    from distributed import Client, LocalCluster

    level = dask_log_level()
    with _distributed_logs_at(level):
        if address:
            client = Client(address)
            try:
                yield client
            finally:
                client.close()
            return
        cluster = LocalCluster(
            n_workers=n_workers, threads_per_worker=1, processes=True, host="127.0.0.1",
            dashboard_address=":0", silence_logs=logging.WARNING if level is None else level,
        )
        client = Client(cluster)
        log.info("dask: LocalCluster with %d worker(s), dashboard %s", n_workers, cluster.dashboard_link)
        try:
            yield client
        finally:
            client.close()
            cluster.close()


def current_client() -> Any | None:
    """The client opened by the running flow, or None when stages should run in-process."""
    try:
        from distributed import default_client

        return default_client()
    except (ValueError, ImportError):
        return None


def map_shards(fn: Callable[..., T], items: Sequence[Any], *args: Any,
               on_done: Callable[[int, T], None] | None = None, **kwargs: Any) -> list[T]:
    """``[fn(item, *args, **kwargs) for item in items]`` on the cluster when there is one, in item order.

    Large shared arguments are scattered once instead of being shipped with every task, under a key of their
    own (``hash=False``): with content keys, a second call scattering the same array loses it when the first
    call's reference is released. ``on_done(i, result)`` is called as each item finishes (in completion order
    on the cluster), e.g. to advance a progress bar."""
    client = current_client()
    if client is None or len(items) <= 1:
        results = []
        for i, item in enumerate(items):
            results.append(fn(item, *args, **kwargs))
            if on_done is not None:
                on_done(i, results[-1])
        return results
    from distributed import as_completed

    shared_args = [client.scatter(a, broadcast=True, hash=False) if _is_large(a) else a for a in args]
    shared_kwargs = {k: client.scatter(v, broadcast=True, hash=False) if _is_large(v) else v for k, v in kwargs.items()}
    futures = client.map(fn, list(items), *[[a] * len(items) for a in shared_args],
                         **{k: v for k, v in shared_kwargs.items()}, pure=False)
    if on_done is None:
        return client.gather(futures)
    index = {future.key: i for i, future in enumerate(futures)}
    results: list[Any] = [None] * len(futures)
    for future in as_completed(futures):
        i = index[future.key]
        results[i] = future.result()
        on_done(i, results[i])
    return results


def _is_large(value: Any) -> bool:
    nbytes = getattr(value, "nbytes", None)
    return nbytes is not None and nbytes > 1_000_000


def map_reduce(fn: Callable[..., T], items: Sequence[Any], *args: Any, combine: Callable[[T, T], T] = operator.add,
               affinity: bool = False, **kwargs: Any) -> T:
    """``combine`` over ``fn(item, *args, **kwargs)`` for every item: on the cluster, the parts are combined in a
    tree on the workers and only the total comes back to this process (with a client, even a single item runs on
    a worker); without a client, in this process, in item order.

    ``affinity`` asks for item i to run on the same worker at every call (the i-th of the sorted workers, another
    one if that worker is gone or the scheduler moves it), so that what a worker keeps in its memory for an item
    between calls is found again. Large shared arguments are scattered once, as in ``map_shards``."""
    if not items:
        raise ValueError("map_reduce needs at least one item")
    client = current_client()
    if client is None:
        return functools.reduce(combine, (fn(item, *args, **kwargs) for item in items))
    shared_args = [client.scatter(a, broadcast=True, hash=False) if _is_large(a) else a for a in args]
    shared_kwargs = {k: client.scatter(v, broadcast=True, hash=False) if _is_large(v) else v for k, v in kwargs.items()}
    if affinity:
        workers = sorted(client.scheduler_info()["workers"])
        futures = [client.submit(fn, item, *shared_args, workers=[workers[i % len(workers)]], allow_other_workers=True,
                                 pure=False, **shared_kwargs) for i, item in enumerate(items)]
    else:
        futures = client.map(fn, list(items), *[[a] * len(items) for a in shared_args], pure=False, **shared_kwargs)
    while len(futures) > 1:
        pairs = [client.submit(combine, a, b, pure=False) for a, b in zip(futures[0::2], futures[1::2])]
        futures = pairs + futures[2 * len(pairs):]
    return futures[0].result()
