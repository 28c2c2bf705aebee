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
