"""Process-wide settings that make Prefect, GX and the models work offline (see docs/install.md).

Imported by every module that imports Prefect (flows/, tasks/stages/) before Prefect itself, so a plain
``privseed ...`` run needs no setup."""

from __future__ import annotations

import logging
import os

_DEFAULTS = {
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

for _key, _value in _DEFAULTS.items():
    os.environ.setdefault(_key, _value)

# Third-party loggers that would print request bodies at DEBUG; privseed never logs private text and
# these must not either.
for _name in ("httpx", "httpcore", "anthropic", "urllib3", "botocore", "s3fs", "aiobotocore"):
    logging.getLogger(_name).setLevel(logging.WARNING)
