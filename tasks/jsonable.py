"""The one JSON encoding of privseed's documents (manifests, ledgers, evaluation results, experiment cells).

``json.dumps`` knows neither numpy's scalars and arrays nor sets and dates; every module that writes JSON
passes :func:`to_jsonable` as ``default`` (or calls :func:`dumps`), so a value is written the same way in
every file. The ledger's parameter digests go through it too: changing what a type turns into changes those
digests, and a resumed run would then refuse its own stored draws (``LedgerMismatchError``).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import numpy as np


def to_jsonable(value: Any) -> Any:
    """``default`` hook of ``json.dumps``: numpy scalars as Python numbers, arrays as lists, sets as sorted lists,
    dates in ISO 8601, anything else as its ``str``."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    return str(value)


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` with :func:`to_jsonable` as the fallback encoder."""
    return json.dumps(obj, default=to_jsonable, **kwargs)
