"""The exceptions users see. Each message names the problem (a file, a column, a parameter) and never
contains private content: no document text, no private counts.

Whether a failure is worth retrying is a property of its class (``transient``), read by every Prefect task's
retry condition (``retry_if_transient``) and by the work-unit retries of the data path: a deterministic error
(bad configuration, an unreadable shard, a refused release) fails the same way again, so it is never retried.
"""

from __future__ import annotations

from typing import ClassVar


class PrivseedError(Exception):
    """Base class of every error privseed raises on purpose."""

    #: True when the same call may succeed if repeated (a storage hiccup, a throttled read, a busy server).
    transient: ClassVar[bool] = False


class ConfigError(PrivseedError, ValueError):
    """A parameter is invalid (epsilon <= 0, unknown method, unknown LLM backend, ...)."""


class UnfinishedRunError(ConfigError):
    """The private state holds a run that drew values and did not publish, and the command named neither that run
    (``--run-id``: resume it, nothing charged again) nor a new one (``--new-run``: charges the budget again)."""


class CorpusError(PrivseedError):
    """The private corpus cannot be used: empty, a missing column, an unreadable shard."""


class StorageError(PrivseedError):
    """Object storage failed (unreachable endpoint, throttled or refused request). The last good release is
    untouched; the same request may succeed later."""

    transient = True


class StorageAccessError(PrivseedError):
    """Object storage refused a request for a reason a repeat cannot fix: no credentials, wrong credentials, a
    bucket that does not exist. Never retried."""


class LedgerMismatchError(PrivseedError):
    """A stored privatized value or checkpoint was made with other parameters; reusing it would misreport
    the privacy guarantee, and silently redrawing it would spend the budget twice."""


class GateFailedError(PrivseedError):
    """The release gate rejected the candidate corpus; it was quarantined, not published."""

    def __init__(self, message: str, result: dict | None = None, quarantine: str | None = None):
        super().__init__(message)
        self.result = result or {}
        self.quarantine = quarantine


#: Errors of other libraries that a repeat can fix: the network and the OS saying "not now". Anything else from
#: outside privseed (KeyError, TypeError, an HTTP 401, a worker killed for memory) is a bug or a configuration
#: problem and fails at once.
_TRANSIENT_FOREIGN: tuple[type[BaseException], ...] = (OSError,)
#: ...except the OSErrors that name a path that is not there or not allowed: the same call fails again.
_DETERMINISTIC_OS: tuple[type[BaseException], ...] = (FileNotFoundError, FileExistsError, PermissionError,
                                                      IsADirectoryError, NotADirectoryError)
_TRANSIENT_FOREIGN_NAMES = frozenset({
    # by name, so this module imports none of these libraries
    "ReadTimeout", "ConnectTimeout", "ConnectError", "RemoteProtocolError", "PoolTimeout",  # httpx
    "EndpointConnectionError", "ConnectionClosedError", "ReadTimeoutError", "ConnectTimeoutError",  # botocore
    "ServerDisconnectedError", "ClientConnectorError",  # aiohttp (s3fs)
    "CommClosedError",  # distributed: a connection dropped, not a worker killed
    "RetryableCallError",  # privseed.tasks.llm.retry: 429 / 5xx after the backend's own backoff
})


def is_transient(exc: BaseException | None) -> bool:
    """Worth retrying: a privseed error whose class says so, or a network/OS error of another library."""
    if exc is None:
        return False
    if isinstance(exc, PrivseedError):
        return type(exc).transient
    if isinstance(exc, _TRANSIENT_FOREIGN):  # ConnectionError, TimeoutError, "connection reset", ...
        return not isinstance(exc, _DETERMINISTIC_OS)
    return any(cls.__name__ in _TRANSIENT_FOREIGN_NAMES for cls in type(exc).__mro__)


def retry_if_transient(task: object, task_run: object, state: object) -> bool:
    """Prefect `retry_condition_fn`: retry a failed task run only when it raised a transient error."""
    exc = getattr(state, "data", None)
    if not isinstance(exc, BaseException):
        try:
            exc = state.result(raise_on_failure=False)  # type: ignore[attr-defined]
        except Exception as raised:  # noqa: BLE001  (whatever the state holds, it decides the retry)
            exc = raised
    return is_transient(exc if isinstance(exc, BaseException) else None)
