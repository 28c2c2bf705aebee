"""The settings that make Prefect, GX and the models work offline (see docs/install.md), applied by whoever starts a
run, never by an import: importing privseed changes no process-wide setting.

- the ``privseed`` command applies them for its process (``privseed.flows.cli.main``), before Prefect is imported;
- the Python API (``privseed.dpkps(...)``) applies them for the duration of a call (:func:`offline_defaults`);
- ``deployments/serve.py`` applies them before it serves.

Each is a default: a variable the caller has set is left as it is.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

#: Environment defaults, each with why.
DEFAULTS: dict[str, str] = {
    # The ephemeral Prefect API needs ~18 s to start on a 2-core machine; the default 20 s times out.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "GX_ANALYTICS_ENABLED": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

#: Third-party loggers that would print request bodies at DEBUG; privseed never logs private text and these must
#: not either.
QUIET_LOGGERS = ("httpx", "httpcore", "anthropic", "openai", "urllib3", "botocore", "s3fs", "aiobotocore")


def apply_offline_defaults() -> None:
    """Set every unset variable of :data:`DEFAULTS` and quieten :data:`QUIET_LOGGERS`, for the rest of the process
    (the command line's entry point; a library caller uses :func:`offline_defaults`)."""
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


@contextlib.contextmanager
def offline_defaults() -> Iterator[None]:
    """:func:`apply_offline_defaults` for the duration of a block; the environment and the loggers' levels are
    restored afterwards. Prefect reads its settings when it is first imported, so a block that imports it for the
    first time leaves Prefect configured with these values (and nothing else)."""
    saved_env = {key: os.environ.get(key) for key in DEFAULTS}
    saved_levels = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    apply_offline_defaults()
    try:
        yield
    finally:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        for name, level in saved_levels.items():
            logging.getLogger(name).setLevel(level)
