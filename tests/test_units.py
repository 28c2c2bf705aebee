"""The pure pieces of the streaming data path: planning work units from footers, reading a unit, the fixed
reduction tree, the retry of a unit, and the combinable keyed data identity."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from privseed.tasks.data import units
from privseed.tasks.errors import ConfigError, CorpusError, StorageError
from privseed.tasks.dp.identity import IdentityPart, data_identity, identity_part
from privseed.tasks.data.units import map_reduce_units, plan_corpus, plan_units, read_unit, run_unit, tree_reduce
from tests.conftest import write_shards


def _frame(n: int, labels: int = 3) -> pd.DataFrame:
    return pd.DataFrame({"text": [f"document {i} about topic {i % 7}" for i in range(n)],
                         "label": np.arange(n) % labels})


# ------------------------------------------------------------------ planning
def test_units_are_runs_of_whole_row_groups_per_shard(tmp_path):
    folder = write_shards(_frame(50), tmp_path / "c", n_shards=2, row_group_rows=4)  # 25 rows: 4,4,4,4,4,4,1
    plan = plan_corpus(folder, unit_rows=10)
    assert [(u.uri.rsplit("/", 1)[-1], u.row_groups, u.rows) for u in plan.units] == [
        ("part-00000.parquet", (0, 1, 2), 12), ("part-00000.parquet", (3, 4, 5), 12), ("part-00000.parquet", (6,), 1),
        ("part-00001.parquet", (0, 1, 2), 12), ("part-00001.parquet", (3, 4, 5), 12), ("part-00001.parquet", (6,), 1)]
    assert plan.integer_labels and plan.units == tuple(plan_units(folder, unit_rows=10))
    assert len(plan_corpus(folder).units) == 2  # the default unit is larger than a shard: one unit per shard
    assert "row groups 0-2" in repr(plan.units[0]) and "6 unit(s)" in repr(plan)
    # every row is read exactly once, in order, by the units together
    read = pd.concat([batch for u in plan.units for batch in read_unit(u, batch_rows=5)], ignore_index=True)
    expected = pd.concat([pd.read_parquet(u) for u in sorted({u.uri for u in plan.units})], ignore_index=True)
    pd.testing.assert_frame_equal(read, expected)


def test_planning_reads_footers_and_names_the_bad_shard(tmp_path):
    folder = tmp_path / "c"
    write_shards(_frame(20).assign(label=lambda f: f["label"].map("c{}".format)), folder)
    assert not plan_corpus(str(folder)).integer_labels  # text labels: the declared labels stay text
    pd.DataFrame({"body": ["x"], "label": [1]}).to_parquet(folder / "part-00002.parquet")
    with pytest.raises(CorpusError, match=r"part-00002.parquet has no column 'text'"):
        plan_corpus(str(folder))
    (folder / "part-00002.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(CorpusError, match=r"unreadable Parquet shard .*part-00002.parquet"):
        plan_corpus(str(folder))
    empty = tmp_path / "empty"
    write_shards(_frame(0), empty, n_shards=1)
    with pytest.raises(CorpusError, match="is empty"):
        plan_corpus(str(empty))


def test_a_corrupt_page_is_a_corpus_error_naming_the_shard_not_a_storage_error(tmp_path):
    folder = write_shards(_frame(400), tmp_path / "c", n_shards=1, row_group_rows=100)
    [unit] = plan_corpus(folder).units
    shard = Path(unit.uri)
    data = bytearray(shard.read_bytes())
    column = pq.ParquetFile(unit.uri).metadata.row_group(2).column(0)
    start = column.dictionary_page_offset or column.data_page_offset
    data[start:start + 32] = bytes(b ^ 0xFF for b in data[start:start + 32])  # the page header of row group 2
    shard.write_bytes(bytes(data))
    with pytest.raises(CorpusError, match=f"unreadable Parquet shard {unit.uri}"):
        list(read_unit(unit, batch_rows=50))


# ------------------------------------------------------------------ the reduction tree
def test_the_tree_groups_items_by_position_and_combines_each_once():
    groups: list[list] = []

    def combine(group):
        groups.append(list(group))
        return f"({'+'.join(group)})"

    assert tree_reduce([str(i) for i in range(11)], combine, fan_in=3) == "(((0+1+2)+(3+4+5)+(6+7+8))+(9+10))"
    assert tree_reduce(["only"], combine) == "only"
    with pytest.raises(ValueError):
        tree_reduce([], combine)
    for n in range(1, 40):  # every item is combined exactly once, whatever n and fan-in
        assert tree_reduce([np.int64(1)] * n, lambda g: np.sum(g), fan_in=4) == n


def test_the_tree_sums_floats_the_same_way_every_time():
    rng = np.random.default_rng(7)
    parts = [rng.standard_normal(5) * 10.0 ** rng.integers(-8, 8) for _ in range(37)]
    first = tree_reduce(parts, lambda g: np.sum(g, axis=0))
    assert np.array_equal(first, tree_reduce(iter(parts), lambda g: np.sum(g, axis=0)))  # bit for bit
    np.testing.assert_allclose(first, np.sum(parts, axis=0), rtol=1e-12)


# ------------------------------------------------------------------ retries of a unit
def test_a_transient_failure_reads_the_unit_again_a_bounded_number_of_times(monkeypatch):
    monkeypatch.setattr(units, "UNIT_RETRY_DELAYS_S", (0.0, 0.0))
    unit = units.WorkUnit("s3://b/part-0.parquet", (0,), 10)
    calls = []

    def flaky(u, failures):
        calls.append(u)
        if len(calls) <= failures:
            raise StorageError("throttled")
        return "partial"

    assert run_unit(flaky, unit, 2) == "partial" and len(calls) == 3
    calls.clear()
    with pytest.raises(StorageError):
        run_unit(flaky, unit, 5)
    assert len(calls) == units.UNIT_ATTEMPTS

    def broken(u):
        calls.append(u)
        raise CorpusError(f"unreadable Parquet shard {u.uri}")

    calls.clear()
    for error in (broken,):
        with pytest.raises(CorpusError, match="part-0.parquet"):
            run_unit(error, unit)
    assert len(calls) == 1  # deterministic: never read again


def test_map_reduce_in_process_combines_every_unit_once(tmp_path):
    plan = plan_corpus(write_shards(_frame(30), tmp_path / "c", n_shards=3, row_group_rows=2), unit_rows=4)
    progress = []
    rows = map_reduce_units(lambda u, column: sum(len(b[column]) for b in read_unit(u)), plan.units, sum, "text",
                            on_done=lambda done, total: progress.append((done, total)))
    assert rows == 30 and progress[-1] == (len(plan.units), len(plan.units)) and len(progress) == len(plan.units)


# ------------------------------------------------------------------ the combinable identity
def test_identity_parts_combine_to_the_identity_of_the_whole_in_any_order(tiny_corpus):
    key = b"k" * 32
    whole = data_identity(tiny_corpus, key)
    shuffled = tiny_corpus.sample(frac=1.0, random_state=4)
    parts = [identity_part(shuffled["text"].iloc[rows], shuffled["label"].iloc[rows], key)
             for rows in np.array_split(np.arange(len(shuffled)), 5)]
    combined = IdentityPart.combine([IdentityPart.combine(parts[3:]), *parts[:3]]).finish(key)
    assert combined.digest == whole.digest and np.array_equal(combined.rows, whole.rows)
    # a multiset: a repeated row changes the identity (tiny_corpus repeats every row three times)
    assert data_identity(tiny_corpus.drop_duplicates(), key).digest != whole.digest
    # the 64-bit row identities are those of earlier versions (overlap checks against older runs still hold)
    old = np.unique(np.array([int.from_bytes(hmac.new(key, hashlib.sha256(f"{label!r}\x1f{t}".encode()).digest(),
                                                      hashlib.sha256).digest()[:8], "little")
                              for t, label in zip(tiny_corpus["text"], tiny_corpus["label"])], dtype=np.uint64))
    assert np.array_equal(whole.rows, old)
    assert repr(parts[0]) == "IdentityPart(<keyed>)" and "k" * 8 not in repr(parts[0])
    # numpy scalars are Python values for the identity (pandas hands out Python ints when iterating a column)
    as_numpy = identity_part(list(tiny_corpus["text"]), tiny_corpus["label"].to_numpy(), key)
    assert as_numpy.total == identity_part(tiny_corpus["text"], tiny_corpus["label"], key).total


def test_label_check_names_no_label_and_no_count():
    from privseed.tasks.data.corpus import declared_positions

    assert declared_positions(pd.Series([2, 0, 2]), [0, 1, 2]).tolist() == [2, 0, 2]
    assert declared_positions(pd.Series(["b", "a"]), ["a", "b"]).tolist() == [1, 0]
    with pytest.raises(ConfigError) as failure:
        declared_positions(pd.Series([0, 7, 7]), [0, 1], "category")
    message = str(failure.value)
    assert "'category'" in message and "not in the declared label set" in message
    assert "7" not in message and "2 rows" not in message
