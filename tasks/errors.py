"""The exceptions users see. Each message names the problem (a file, a column, a parameter) and never
contains private content: no document text, no private counts."""


class PrivseedError(Exception):
    """Base class of every error privseed raises on purpose."""


class ConfigError(PrivseedError, ValueError):
    """A parameter is invalid (epsilon <= 0, unknown method, unknown LLM backend, ...)."""


class CorpusError(PrivseedError):
    """The private corpus cannot be used: empty, a missing column, an unreadable shard."""


class StorageError(PrivseedError):
    """Object storage failed (unreachable endpoint, refused write). The last good release is untouched."""


class LedgerMismatchError(PrivseedError):
    """A stored privatized value or checkpoint was made with other parameters; reusing it would misreport
    the privacy guarantee, and silently redrawing it would spend the budget twice."""


class GateFailedError(PrivseedError):
    """The release gate rejected the candidate corpus; it was quarantined, not published."""

    def __init__(self, message: str, result: dict | None = None, quarantine: str | None = None):
        super().__init__(message)
        self.result = result or {}
        self.quarantine = quarantine


# Failures that a retry cannot fix: the same input and configuration fail the same way again. Retrying them
# only repeats work and tracebacks (a failed release gate would re-run the whole gate twice).
DETERMINISTIC_ERRORS: tuple[type[PrivseedError], ...] = (ConfigError, CorpusError, LedgerMismatchError,
                                                         GateFailedError)


def is_transient(exc: BaseException | None) -> bool:
    """Worth retrying: anything but a deterministic privseed error (storage hiccups, a crashed LLM call...)."""
    return not isinstance(exc, DETERMINISTIC_ERRORS)


def retry_if_transient(task: object, task_run: object, state: object) -> bool:
    """Prefect `retry_condition_fn`: retry a failed task run unless it raised a deterministic error."""
    exc = getattr(state, "data", None)
    if not isinstance(exc, BaseException):
        try:
            exc = state.result(raise_on_failure=False)  # type: ignore[attr-defined]
        except Exception as raised:  # noqa: BLE001  (whatever the state holds, it decides the retry)
            exc = raised
    return is_transient(exc if isinstance(exc, BaseException) else None)
