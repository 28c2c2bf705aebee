"""The one JSON encoding (tasks/jsonable.py) and the modules that write JSON with it."""

import datetime as dt
import json

import numpy as np

from privseed.tasks import jsonable


def test_numpy_sets_and_dates_become_plain_json():
    value = {"i": np.int64(3), "f": np.float32(0.5), "b": np.bool_(True), "a": np.arange(3), "s": {"b", "a"},
             "d": dt.date(2026, 1, 2), "t": dt.datetime(2026, 1, 2, 3, 4, 5), "o": object.__name__}
    assert json.loads(jsonable.dumps(value, sort_keys=True)) == {
        "i": 3, "f": 0.5, "b": True, "a": [0, 1, 2], "s": ["a", "b"], "d": "2026-01-02", "t": "2026-01-02T03:04:05",
        "o": "object"}


def test_ledger_digests_keep_their_encoding():
    """A stored draw is found again by the digest of its parameters: the encoding of numpy values and sets in
    them must stay what resumed ledgers were written with."""
    from privseed.tasks.dp.ledger import canonical_params

    assert canonical_params({"S": np.int64(10), "eps": np.float64(1.5), "ids": np.array([1, 2]), "set": {2, 1}}) == \
        '{"S":10,"eps":1.5,"ids":[1,2],"set":[1,2]}'
