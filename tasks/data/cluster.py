"""The Dask cluster the parallel stages run on.

Flows open one client for the whole run (a LocalCluster on 127.0.0.1 by default, or an existing scheduler);
tasks pick it up with :func:`current_client` and map their work over shards. Without a client, stages run
in-process, which is what unit tests of the pure functions do.

Private record batches travel to the workers, so every worker privseed computes on must keep them in memory:
the LocalCluster is started with spilling off (:data:`NO_SPILL`), and an external cluster is refused when one
of its workers would spill to its local disk, or runs other versions of the packages that matter
(:func:`check_cluster`). An external scheduler may be reached over TLS (:func:`cluster_security`).
docs/operations.md ("Dask clusters") says how to start workers that pass these checks.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from privseed.tasks.errors import ConfigError

if TYPE_CHECKING:
    from distributed import Client, Security

    from privseed.tasks.config.options import ClusterOptions

log = logging.getLogger(__name__)
T = TypeVar("T")

DASK_LOG_LEVEL_ENV = "PRIVSEED_DASK_LOG_LEVEL"

#: Worker memory settings of every cluster privseed starts: no spilling of task data to the worker's local
#: disk, where private record batches would outlive the run in a file nobody deletes. The pause (80 %) and
#: terminate (95 %) thresholds stay: a worker short of memory stops taking work or restarts, it never writes.
NO_SPILL: Mapping[str, Any] = {"distributed.worker.memory.target": False, "distributed.worker.memory.spill": False}
#: Worker settings of every LocalCluster privseed starts: no statistical profiler. It calls sys._current_frames()
#: every 10 ms, and on Python 3.11 before 3.11.9 that call can deadlock a worker whose threads come and go
#: (CPython gh-106883: the interpreters lock against the GIL under a garbage collection): a fresh-clone CI run,
#: 2026-11-30, hung in tests/test_generation_parts.py with a batching backend's collector threads on the worker, the
#: worker's main thread in trigger_profile. The dashboard loses its profile page, nothing else.
NO_PROFILER: Mapping[str, Any] = {"distributed.worker.profile.enabled": False}
#: The same settings as environment variables, for `dask worker` processes started outside privseed
#: (infra/compose.yaml, infra/k8s/daskcluster.yaml, tests/test_external_cluster.py).
NO_SPILL_ENV: Mapping[str, str] = {"DASK_DISTRIBUTED__WORKER__MEMORY__TARGET": "False",
                                   "DASK_DISTRIBUTED__WORKER__MEMORY__SPILL": "False"}
#: Packages whose versions must be the same here and on every worker: the workers unpickle this process's
#: functions and arrays (privseed, numpy, torch, pandas, pyarrow, opendp's types) and speak distributed's
#: protocol (dask, distributed, cloudpickle, msgpack, tornado).
WORKER_PACKAGES = ("privseed", "numpy", "torch", "pandas", "pyarrow", "opendp", "dask", "distributed", "cloudpickle",
                   "msgpack", "tornado")
#: The scheduler only routes messages: what distributed itself compares on it.
SCHEDULER_PACKAGES = ("dask", "distributed", "cloudpickle", "tornado")
#: How long a run waits for a first worker to join an external scheduler before it gives up.
WORKER_WAIT_S = 120.0
#: The packages of the privseed distribution, whose source the workers must share (an editable install
#: reports the same version for every edit).
PRIVSEED_PACKAGES = ("privseed",)
TLS_FLAGS = ("--dask-tls-ca-file", "--dask-tls-cert", "--dask-tls-key")


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


def cluster_security(cfg: ClusterOptions) -> Security | None:
    """The TLS settings for the external scheduler of ``cfg`` (``--dask-tls-ca-file``, ``--dask-tls-cert``,
    ``--dask-tls-key``): mutual TLS, encryption required. None when none is set, in which case a ``tls://``
    address still works with distributed's own configuration (``distributed.comm.tls.*``)."""
    paths = (cfg.dask_tls_ca_file, cfg.dask_tls_cert, cfg.dask_tls_key)
    if not any(paths):
        return None
    if not all(paths):
        missing = [flag for flag, path in zip(TLS_FLAGS, paths) if not path]
        raise ConfigError(f"TLS to the Dask scheduler needs {' and '.join(TLS_FLAGS)} together; "
                          f"missing {' and '.join(missing)}")
    if not (cfg.dask_address or "").startswith("tls://"):
        raise ConfigError(f"{' and '.join(TLS_FLAGS)} need a tls:// --dask-address (got {cfg.dask_address!r}); the "
                          "LocalCluster privseed starts on 127.0.0.1 runs without TLS")
    for flag, path in zip(TLS_FLAGS, paths):
        if not Path(str(path)).is_file():  # every path is set (checked above)
            raise ConfigError(f"{flag} {path} is not a readable file")
    from distributed import Security

    return Security(tls_ca_file=cfg.dask_tls_ca_file, tls_client_cert=cfg.dask_tls_cert,
                    tls_client_key=cfg.dask_tls_key, require_encryption=True)


@contextlib.contextmanager
def dask_client(address: str | None = None, n_workers: int = 2, security: Security | None = None) -> Iterator[Client]:
    """A distributed Client: connects to ``address`` (over TLS with ``security``) or starts a LocalCluster with
    spilling and the workers' profiler off for the duration. An external cluster is checked first
    (:func:`check_cluster`).
    distributed's own logs are held at :func:`dask_log_level` meanwhile (start-up and shutdown included)."""
    import dask
    from distributed import Client, LocalCluster, Security

    level = dask_log_level()
    with _distributed_logs_at(level):
        if address:
            # Security sets its tls_* attributes from the Dask configuration at run time
            if address.startswith("tls://") and security is None and \
                    Security().tls_ca_file is None:  # type: ignore[attr-defined]
                raise ConfigError(f"the tls:// --dask-address {address} needs {', '.join(TLS_FLAGS)} (or "
                                  "distributed.comm.tls.* in the Dask configuration)")
            try:
                client = Client(address, security=security)
            except OSError as exc:
                raise ConfigError(f"cannot reach the Dask scheduler at {address}: {exc}") from exc
            try:
                check_cluster(client, address)
                with client.as_current():  # this run's stages find this client (current_client), not another's
                    yield client
            finally:
                client.close()
            return
        # The nannies hand this configuration to the worker processes they start.
        with dask.config.set({**NO_SPILL, **NO_PROFILER}):
            cluster = LocalCluster(
                n_workers=n_workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                dashboard_address=":0", silence_logs=logging.WARNING if level is None else level,
            )
        client = Client(cluster)
        log.info("dask: LocalCluster with %d worker(s), dashboard %s", n_workers, cluster.dashboard_link)
        try:
            # this run's stages find this client (current_client), not the client of another flow run started
            # later in the same process (a served deployment, concurrent runs in threads)
            with client.as_current():
                yield client
        finally:
            client.close()
            cluster.close()


def check_cluster(client: Client, address: str, wait_s: float = WORKER_WAIT_S) -> None:
    """Refuse an external cluster the run must not use: no worker within ``wait_s``, a worker that would spill
    task data to its local disk, or a scheduler or worker with other versions of :data:`WORKER_PACKAGES`
    (privseed's own source included) than this process. Workers that join later are not checked: start every
    worker the same way (one image, infra/)."""
    try:
        client.wait_for_workers(1, timeout=wait_s)
    except TimeoutError as exc:
        raise ConfigError(f"no Dask worker joined the scheduler at {address} within {wait_s:g} s") from exc
    reported: dict[str, Any] = client.get_versions(  # type: ignore[assignment]  # a sync Client: no coroutine
        packages=[p for p in WORKER_PACKAGES if p not in ("dask", "distributed")])
    try:
        digests = client.run(privseed_source_digest)
    except Exception:  # a worker without privseed, or with one older than this function: named below
        digests = {}
    workers = {}
    for worker, info in reported["workers"].items():
        packages = _as_reported(info)
        packages["privseed"] = _with_digest(packages.get("privseed"), digests.get(worker, "unknown"))
        workers[worker] = packages
    problems = version_mismatches(package_versions(), _as_reported(reported["scheduler"]), workers)
    if problems:
        raise ConfigError(f"the Dask cluster at {address} does not run the packages of this process: "
                          + "; ".join(problems) + ". Run the scheduler, the workers and the flow from one "
                          "environment (the privseed image, infra/Dockerfile)")
    spilling = sorted(worker for worker, spills in client.run(spills_to_disk).items() if spills)
    if spilling:
        raise ConfigError(
            f"Dask worker(s) {', '.join(spilling)} at {address} would spill task data to local disk; private "
            "record batches must stay in memory. Start the workers with "
            + " ".join(f"{k}={v}" for k, v in NO_SPILL_ENV.items()) + " (docs/operations.md, Dask clusters)")
    log.info("dask: scheduler %s with %d worker(s); versions match, spilling off", address, len(workers))


def version_mismatches(here: Mapping[str, str | None], scheduler: Mapping[str, str | None],
                       workers: Mapping[str, Mapping[str, str | None]]) -> list[str]:
    """One line per package whose version differs from ``here`` on the scheduler (:data:`SCHEDULER_PACKAGES`
    and Python) or on a worker (:data:`WORKER_PACKAGES` and Python), naming the package, both versions and where.
    Python is compared by major.minor (pickles and wheels are compatible across patch releases)."""
    def shown(value: str | None) -> str:
        return "missing" if value is None else value

    problems = []
    for package in ("python", *WORKER_PACKAGES):
        expected = here.get(package)
        places = {worker: info.get(package) for worker, info in workers.items()}
        if package == "python" or package in SCHEDULER_PACKAGES:
            places = {"the scheduler": scheduler.get(package), **places}
        wrong = {where: found for where, found in places.items() if found != expected}
        if wrong:
            found = "; ".join(f"{shown(v)} on {where}" for where, v in sorted(wrong.items()))
            problems.append(f"{package} {shown(expected)} here, {found}")
    return problems


def package_versions() -> dict[str, str | None]:
    """This process's versions of :data:`WORKER_PACKAGES` and Python, privseed with its source digest."""
    found: dict[str, str | None] = {"python": "%d.%d" % sys.version_info[:2]}
    for package in WORKER_PACKAGES:
        found[package] = _installed(package)
    found["privseed"] = _with_digest(found["privseed"], privseed_source_digest())
    return found


def privseed_source_digest() -> str:
    """sha256 (12 hex digits) of the source files of privseed's packages as this process imports them."""
    digest = hashlib.sha256()
    for package in PRIVSEED_PACKAGES:
        spec = importlib.util.find_spec(package)
        for root in (spec.submodule_search_locations or []) if spec else []:
            for path in sorted(Path(root).rglob("*.py")):
                digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def spills_to_disk(dask_worker: Any) -> bool:
    """Run on a worker (``client.run``): whether its task data may be written to its local disk."""
    from distributed.spill import SpillBuffer

    return isinstance(dask_worker.data, SpillBuffer)


def _installed(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _as_reported(info: Mapping[str, Any] | None) -> dict[str, str | None]:
    """distributed's version report of one process, with Python as major.minor like :func:`package_versions`."""
    packages = dict((info or {}).get("packages") or {})
    if packages.get("python"):
        packages["python"] = ".".join(str(packages["python"]).split(".")[:2])
    return packages


def _with_digest(package_version: str | None, digest: str | None) -> str | None:
    return None if package_version is None else f"{package_version} (source {digest})"


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
        in_process = []
        for i, item in enumerate(items):
            in_process.append(fn(item, *args, **kwargs))
            if on_done is not None:
                on_done(i, in_process[-1])
        return in_process
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


#: Listeners of :func:`shard_events` topics in this process (work that runs here reaches them directly).
_LOCAL_TOPICS: dict[str, Callable[[dict], None]] = {}


@contextlib.contextmanager
def shard_events(handler: Callable[[dict], None]) -> Iterator[str]:
    """A fresh topic whose messages (:func:`publish_event`) reach ``handler`` in this process while the block
    runs: from the cluster's worker processes through Dask's event stream (worker -> scheduler -> this client),
    directly from work that runs in this process. Delivery is best-effort and asynchronous, so a handler must
    not be the only record of anything (the generation bar reconciles with each shard's final counts)."""
    import uuid

    topic = f"privseed-events-{uuid.uuid4().hex}"
    client = current_client()
    _LOCAL_TOPICS[topic] = handler
    if client is not None:
        client.subscribe_topic(topic, lambda event: handler(event[1]))  # event: (timestamp, message)
    try:
        yield topic
    finally:
        _LOCAL_TOPICS.pop(topic, None)
        if client is not None:
            with contextlib.suppress(Exception):  # the client may already be closing; nothing is lost
                client.unsubscribe_topic(topic)


def publish_event(topic: str | None, message: dict) -> None:
    """Send ``message`` to the process that opened ``topic`` with :func:`shard_events`: a direct call when that
    process is this one, else through this Dask worker's event log; nothing without a topic or a listener."""
    if topic is None:
        return
    local = _LOCAL_TOPICS.get(topic)
    if local is not None:
        local(message)
        return
    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):  # not on a Dask worker: nobody is listening
        return
    worker.log_event(topic, message)


def _is_large(value: Any) -> bool:
    nbytes = getattr(value, "nbytes", None)
    return nbytes is not None and nbytes > 1_000_000


