"""The Dask cluster the parallel stages run on.

Flows open one client for the whole run (a LocalCluster on 127.0.0.1 by default, or an existing scheduler);
tasks pick it up with :func:`current_client` and map their work over shards. Without a client, stages run
in-process, which is what unit tests of the pure functions do.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


@contextlib.contextmanager
def dask_client(address: str | None = None, n_workers: int = 2) -> Iterator[Any]:
    """A distributed Client: connects to ``address`` or starts a LocalCluster for the duration."""
    from distributed import Client, LocalCluster

    if address:
        client = Client(address)
        try:
            yield client
        finally:
            client.close()
        return
    cluster = LocalCluster(
        n_workers=n_workers, threads_per_worker=1, processes=True, host="127.0.0.1",
        dashboard_address=":0", silence_logs=logging.WARNING,
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


def map_shards(fn: Callable[..., T], items: Sequence[Any], *args: Any, **kwargs: Any) -> list[T]:
    """``[fn(item, *args, **kwargs) for item in items]`` on the cluster when there is one.

    Large shared arguments are scattered once instead of being shipped with every task."""
    client = current_client()
    if client is None or len(items) <= 1:
        return [fn(item, *args, **kwargs) for item in items]
    shared_args = [client.scatter(a, broadcast=True) if _is_large(a) else a for a in args]
    shared_kwargs = {k: client.scatter(v, broadcast=True) if _is_large(v) else v for k, v in kwargs.items()}
    futures = client.map(fn, list(items), *[[a] * len(items) for a in shared_args],
                         **{k: v for k, v in shared_kwargs.items()}, pure=False)
    return client.gather(futures)


def _is_large(value: Any) -> bool:
    nbytes = getattr(value, "nbytes", None)
    return nbytes is not None and nbytes > 1_000_000
