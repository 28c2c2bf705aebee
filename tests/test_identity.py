"""The data identity is keyed, order-independent and never a plain digest; run ids are random."""

import hashlib

import numpy as np
import pandas as pd
import pytest

from privseed.tasks.dp.identity import data_identity, load_or_create_key, new_run_id


def test_identity_ignores_order_sees_content_and_depends_on_the_key(tiny_corpus, tmp_path):
    key = load_or_create_key(str(tmp_path / "state"))
    assert load_or_create_key(str(tmp_path / "state")) == key and len(key) == 32  # created once
    a = data_identity(tiny_corpus, key)
    assert a.digest == data_identity(tiny_corpus.sample(frac=1, random_state=3), key).digest
    changed = tiny_corpus.copy()
    changed.loc[0, "label"] = 2
    assert data_identity(changed, key).digest != a.digest
    other_key = load_or_create_key(str(tmp_path / "other-state"))
    assert other_key != key and data_identity(tiny_corpus, other_key).digest != a.digest
    # what an adversary could compute without the key (the old fingerprint) is not what is stored
    rows = sorted(hashlib.sha256(f"{label!r}\x1f{t}".encode()).digest()
                  for t, label in zip(tiny_corpus["text"], tiny_corpus["label"]))
    assert a.digest != hashlib.sha256(b"".join(rows)).hexdigest()
    assert str(a) == repr(a) == "DataIdentity(<keyed>)"


def test_row_identities_tell_disjoint_corpora_apart(tiny_corpus, tmp_path):
    key = load_or_create_key(str(tmp_path))
    distinct = tiny_corpus.drop_duplicates()
    first, rest = distinct.iloc[:5], distinct.iloc[5:]
    a, b = data_identity(first, key), data_identity(rest, key)
    assert np.intersect1d(a.rows, b.rows).size == 0
    grown = data_identity(pd.concat([first, rest.iloc[:1]]), key)
    assert np.intersect1d(a.rows, grown.rows).size == len(a.rows)


def test_run_ids_are_random():
    ids = {new_run_id() for _ in range(50)}
    assert len(ids) == 50


def test_run_and_release_ids_hold_no_time():
    # Issue 30, item 3: ids were UTC times; the run id is minted after pass 1 and the release id after pass 2, so
    # their difference timed the private stages.
    import datetime as dt
    import re

    from privseed.tasks.data.corpus import new_release_id

    today = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d")
    for made in (new_run_id(), new_release_id()):
        assert re.fullmatch(r"(run-)?[0-9a-f]{16}", made), made
        assert today not in made


def test_a_damaged_key_is_refused(tmp_path):
    from privseed.tasks.errors import LedgerMismatchError

    (tmp_path / "identity.key").write_bytes(b"short")
    with pytest.raises(LedgerMismatchError, match="identity key"):
        load_or_create_key(str(tmp_path))
