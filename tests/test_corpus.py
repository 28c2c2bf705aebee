import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from privseed.tasks import storage
from privseed.tasks.data.corpus import list_shards, publish_release, read_corpus, read_release
from privseed.tasks.errors import ConfigError, CorpusError, GateFailedError, StorageError
from privseed.tasks.dp.ledger import PrivacyLedger


def test_reads_file_folder_and_prefix(tmp_path, tiny_corpus):
    folder = tmp_path / "shards"
    folder.mkdir()
    tiny_corpus.iloc[:10].to_parquet(folder / "part-0.parquet")
    tiny_corpus.iloc[10:].to_parquet(folder / "part-1.parquet")
    assert len(read_corpus(str(folder))) == len(tiny_corpus)
    assert len(read_corpus(str(folder / "part-"))) == len(tiny_corpus)
    assert len(list_shards("file://" + str(folder))) == 2
    assert list(read_corpus(str(folder / "part-0.parquet")).columns) == ["text", "label"]


def test_custom_columns(tmp_path, tiny_corpus):
    path = tmp_path / "c.parquet"
    tiny_corpus.rename(columns={"text": "note", "label": "dx"}).to_parquet(path)
    assert len(read_corpus(str(path), text_column="note", label_column="dx")) == len(tiny_corpus)


def test_bad_input_gets_a_clear_error(tmp_path, tiny_corpus):
    with pytest.raises(CorpusError, match="nothing-here does not exist"):
        read_corpus(str(tmp_path / "nothing-here"))
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "notes.txt").write_text("a")
    with pytest.raises(CorpusError, match="holds no Parquet .* CSV .* JSON Lines"):
        read_corpus(str(tmp_path / "folder"))
    missing = tmp_path / "m.parquet"
    tiny_corpus[["text"]].to_parquet(missing)
    with pytest.raises(CorpusError, match="no column 'label'"):
        read_corpus(str(missing))
    empty = tmp_path / "e.parquet"
    tiny_corpus.iloc[:0].to_parquet(empty)
    with pytest.raises(CorpusError, match="is empty"):
        read_corpus(str(empty))
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(CorpusError, match="unreadable Parquet shard .*broken.parquet"):
        read_corpus(str(broken))
    nulls = tmp_path / "n.parquet"
    pd.DataFrame({"text": ["a", None], "label": [1, None]}).to_parquet(nulls)
    with pytest.raises(CorpusError, match="null label"):  # not a declared label: a stop docs/privacy.md lists
        read_corpus(str(nulls))


def test_a_null_or_empty_text_is_an_empty_document_not_a_stop(tmp_path, tiny_corpus):
    # Issue 46: a null or empty text stopped the run, so whether a release existed depended on one private row.
    from privseed.tasks.dp.identity import data_identity
    from privseed.tasks.seeds.passes import DeclaredLabels, ScanPart, ScanSpec, TermCounting, UnitReader, scan_unit
    from privseed.tasks.data.units import map_reduce_units
    from tests.conftest import corpus_plan

    holes = tiny_corpus.copy()
    holes.loc[[0, 5], "text"] = [None, ""]
    path = tmp_path / "holes.parquet"
    holes.to_parquet(path)
    emptied = holes.assign(text=holes["text"].fillna(""))
    assert read_corpus(str(path))["text"].tolist() == emptied["text"].tolist()  # every row kept, in order

    key = bytes(range(32))
    spec = ScanSpec(UnitReader(), DeclaredLabels(("0", "1", "2")), key, TermCounting("english", 20_000, first_terms=7))
    scanned = map_reduce_units(scan_unit, corpus_plan(holes, tmp_path / "shards").units, ScanPart.combine, spec)
    without = tiny_corpus.drop(index=[0, 5])
    alone = map_reduce_units(scan_unit, corpus_plan(without, tmp_path / "without").units, ScanPart.combine, spec)
    # The two rows are documents of their class (the identity holds them as empty texts) that add no term.
    assert scanned.identity.finish(key).digest == data_identity(emptied, key).digest
    assert scanned.identity.finish(key).digest != data_identity(without, key).digest
    np.testing.assert_array_equal(scanned.counts, alone.counts)
    assert alone.counts.sum() > 0


def test_csv_and_jsonl_are_read_by_their_extension(tmp_path, tiny_corpus):
    from privseed.tasks.data.units import plan_corpus, read_unit

    tiny_corpus.to_csv(tmp_path / "c.csv", index=False)
    tiny_corpus.to_json(tmp_path / "c.jsonl", orient="records", lines=True)
    for name in ("c.csv", "c.jsonl"):
        whole = read_corpus(str(tmp_path / name))
        assert whole["text"].tolist() == tiny_corpus["text"].tolist()
        assert whole["label"].astype(int).tolist() == tiny_corpus["label"].tolist()
        plan = plan_corpus(str(tmp_path / name))  # a text file is one unit, its rows counted, its types undeclared
        assert plan.integer_labels is None and [u.rows for u in plan.units] == [len(tiny_corpus)]
        streamed = pd.concat(list(read_unit(plan.units[0], batch_rows=5)), ignore_index=True)
        assert streamed["text"].tolist() == tiny_corpus["text"].tolist()
        assert streamed["label"].astype(int).tolist() == tiny_corpus["label"].tolist()
    # a folder of mixed formats: every file of a known extension
    (tmp_path / "mixed").mkdir()
    tiny_corpus.to_parquet(tmp_path / "mixed" / "a.parquet")
    tiny_corpus.to_csv(tmp_path / "mixed" / "b.csv", index=False)
    assert len(plan_corpus(str(tmp_path / "mixed")).units) == 2


def test_a_file_in_another_format_is_refused_by_name(tmp_path, tiny_corpus):
    from privseed.tasks.data.units import plan_corpus

    tiny_corpus.to_csv(tmp_path / "c.xlsx", index=False)
    with pytest.raises(CorpusError, match=r"cannot read \.xlsx files; give Parquet"):
        plan_corpus(str(tmp_path / "c.xlsx"))
    tiny_corpus.to_csv(tmp_path / "csv.parquet", index=False)  # CSV text under a Parquet name
    with pytest.raises(CorpusError, match="looks like CSV text, not Parquet; name it .csv"):
        plan_corpus(str(tmp_path / "csv.parquet"))
    with pytest.raises(CorpusError, match="looks like CSV text, not Parquet; name it .csv"):
        read_corpus(str(tmp_path / "csv.parquet"))
    (tmp_path / "header-only.csv").write_text("text,label\n")
    with pytest.raises(CorpusError, match="is empty"):
        plan_corpus(str(tmp_path / "header-only.csv"))
    tiny_corpus.rename(columns={"label": "y"}).to_json(tmp_path / "y.jsonl", orient="records", lines=True)
    with pytest.raises(CorpusError, match="no column 'label'; its columns are \\['text', 'y'\\]"):
        plan_corpus(str(tmp_path / "y.jsonl"))


def _synthetic(n=7):
    return pd.DataFrame({"text": [f"doc {i}" for i in range(n)], "label": [i % 2 for i in range(n)],
                         "keyphrases": [["doc", str(i)] for i in range(n)]})


def _ledger(tmp_path):
    return PrivacyLedger(str(tmp_path / "out.private"), "id-of-the-corpus", "run1")


def test_publish_writes_contract_layout_and_manifest_last(tmp_path):
    out = str(tmp_path / "out")
    manifest = publish_release(out, _synthetic(), ledger=_ledger(tmp_path), config={"k": 1}, rows_per_shard=3)
    parts = sorted(os.listdir(os.path.join(out, "synthetic")))
    assert len(parts) == 3 and all(p.startswith("part-") and p.endswith(".parquet") for p in parts)
    assert {"ledger.json", "manifest.json"} <= set(os.listdir(out))
    assert manifest["rows"] == 7
    assert json.load(open(os.path.join(out, "manifest.json"))) == json.loads(json.dumps(manifest))
    got_manifest, frame = read_release(out)
    assert frame["text"].tolist() == _synthetic()["text"].tolist()
    # the data identity stays in the private state: the owner's ledger is there, nothing of it in the release
    assert "id-of-the-corpus" in (tmp_path / "out.private" / "runs" / "run1" / "ledger.json").read_text()
    for path in Path(out).rglob("*"):
        assert path.is_dir() or b"id-of-the-corpus" not in path.read_bytes(), path
    assert list(frame["keyphrases"].iloc[0]) == ["doc", "0"]


def test_a_new_release_replaces_the_old_one_only_at_the_manifest(tmp_path, monkeypatch):
    out = str(tmp_path / "out")
    first = publish_release(out, _synthetic(4), ledger=_ledger(tmp_path), config={})
    real_write = storage.write_bytes

    def failing_manifest(uri, data, options=None):
        if uri.endswith("manifest.json"):
            raise StorageError("endpoint went away")
        real_write(uri, data, options)

    monkeypatch.setattr(storage, "write_bytes", failing_manifest)
    with pytest.raises(StorageError):
        publish_release(out, _synthetic(9), ledger=_ledger(tmp_path), config={})
    monkeypatch.setattr(storage, "write_bytes", real_write)
    manifest, frame = read_release(out)  # the old release, complete and verified
    assert manifest["release_id"] == first["release_id"] and len(frame) == 4
    second = publish_release(out, _synthetic(9), ledger=_ledger(tmp_path), config={})
    manifest, frame = read_release(out)
    assert manifest["release_id"] == second["release_id"] and len(frame) == 9
    assert len(os.listdir(os.path.join(out, "synthetic"))) == 1  # stale parts removed after the commit


def test_failing_gate_quarantines_and_publishes_nothing(tmp_path):
    out = str(tmp_path / "out")
    def gate(df):
        return {"success": False, "expectations": [{"name": "no_template_residue", "success": False}]}

    with pytest.raises(GateFailedError, match="no_template_residue") as info:
        publish_release(out, _synthetic(), ledger=_ledger(tmp_path), config={}, gate=gate)
    assert not os.path.exists(os.path.join(out, "manifest.json"))
    assert os.path.exists(os.path.join(info.value.quarantine, "quality.json"))
    assert info.value.quarantine.startswith(str(tmp_path / "out.private"))  # the private state, not the release
    assert not os.path.exists(out) or os.listdir(out) == []
    with pytest.raises(CorpusError, match="manifest.json is missing"):
        read_release(out)


def test_tampered_part_is_detected(tmp_path):
    out = str(tmp_path / "out")
    publish_release(out, _synthetic(), ledger=_ledger(tmp_path), config={})
    part = os.path.join(out, "synthetic", os.listdir(os.path.join(out, "synthetic"))[0])
    _synthetic(2).to_parquet(part)
    with pytest.raises(CorpusError, match="checksum"):
        read_release(out)


def test_public_files_are_read_by_column_and_written_atomically(tmp_path, tiny_corpus):
    from privseed.tasks.data.corpus import column_names, read_columns, write_parquet

    folder = tmp_path / "public"
    write_parquet(str(folder / "part-0.parquet"), tiny_corpus.iloc[:10].assign(label_name="x"))
    write_parquet(str(folder / "part-1.parquet"), tiny_corpus.iloc[10:].assign(label_name="y"))
    assert sorted(p.name for p in folder.iterdir()) == ["part-0.parquet", "part-1.parquet"]  # no temporary left
    frame = read_columns(str(folder), ["label_name"])
    assert list(frame.columns) == ["label_name"] and len(frame) == len(tiny_corpus)
    assert list(read_columns(str(folder)).columns) == ["text", "label", "label_name"]
    assert column_names(str(folder)) == ["text", "label", "label_name"]
    with pytest.raises(CorpusError, match="no column 'topic'"):
        read_columns(str(folder), ["text", "topic"])


def _insecure_ledger(tmp_path, run_id="insecure"):
    from privseed.tasks.dp.mechanisms import LaplaceMechanism, insecure_noise

    ledger = PrivacyLedger(str(tmp_path / "out.private"), "id-of-the-corpus", run_id)
    ledger.draw_once("vocabulary", mechanism=LaplaceMechanism(sensitivity=1.0, epsilon=1.0),
                     noise=insecure_noise(0, "vocabulary"), params={}, exact=lambda: np.zeros(3))
    return ledger


def test_a_refused_non_dp_candidate_leaves_nothing_under_out(tmp_path):
    # Issue 30, item 1: the refused candidate (a deterministic function of the data) went to OUT/_quarantine.
    out = tmp_path / "out"
    with pytest.raises(GateFailedError, match="NOT DIFFERENTIALLY PRIVATE") as info:
        publish_release(str(out), _synthetic(), ledger=_insecure_ledger(tmp_path), config={})
    assert not out.exists() or [p for p in out.rglob("*")] == []
    quarantine = Path(info.value.quarantine)
    assert quarantine.parent.parent == tmp_path / "out.private"
    assert (quarantine / "ledger.json").exists() and list((quarantine / "synthetic").glob("*.parquet"))


def _staged_in_private_state(tmp_path, frame: pd.DataFrame):
    """A candidate drawn from reproducible noise as the generation shards leave it: parts in the private state."""
    from privseed.tasks.data.corpus import StagedRelease, candidate_folder, new_release_id, write_part

    release_id = new_release_id()
    folder = candidate_folder(str(tmp_path / "out"), str(tmp_path / "out.private"), release_id, True)
    assert folder.startswith(str(tmp_path / "out.private"))
    parts = tuple(write_part(folder, release_id, i, frame.iloc[i * 4:(i + 1) * 4]) for i in range(2))
    return StagedRelease(folder, release_id, parts, None)


def test_a_candidate_staged_in_the_private_state_reaches_out_only_when_published(tmp_path):
    # Issue 46: an insecure run's generation shards wrote its candidate into OUT/synthetic before the gate refused
    # it. Staged in the private state, a refused candidate goes to quarantine, an allowed one into OUT at publish.
    out = tmp_path / "out"
    staged = _staged_in_private_state(tmp_path, _synthetic(8))
    with pytest.raises(GateFailedError, match="NOT DIFFERENTIALLY PRIVATE") as info:
        publish_release(str(out), staged, ledger=_insecure_ledger(tmp_path), config={})
    assert not out.exists() or [p for p in out.rglob("*")] == []
    assert len(list((Path(info.value.quarantine) / "synthetic").glob("*.parquet"))) == 2
    assert list(Path(staged.out).rglob("*.parquet")) == []  # moved, not copied

    allowed = _staged_in_private_state(tmp_path, _synthetic(8))
    manifest = publish_release(str(out), allowed, ledger=_insecure_ledger(tmp_path, "allowed"), config={},
                               allow_insecure=True)
    _, frame = read_release(str(out))
    assert manifest["stamp"] == "NOT DIFFERENTIALLY PRIVATE"
    assert frame["text"].tolist() == _synthetic(8)["text"].tolist()
    assert list(Path(allowed.out).rglob("*.parquet")) == []
    elsewhere = _staged_in_private_state(tmp_path / "other", _synthetic(8))  # another state's staging: refused
    with pytest.raises(ConfigError, match="staged parts were written under"):
        publish_release(str(out), elsewhere, ledger=_insecure_ledger(tmp_path, "third"), config={},
                        allow_insecure=True)


def test_a_secure_release_is_not_committed_beside_a_stamped_one(tmp_path):
    # Issue 30, item 1: a secure release into an OUT that holds a NOT DIFFERENTIALLY PRIVATE release (published
    # with --allow-insecure-release, or a refused candidate an older version left in OUT/_quarantine) went ahead.
    out = str(tmp_path / "out")
    publish_release(out, _synthetic(), ledger=_insecure_ledger(tmp_path), config={}, allow_insecure=True)
    stamped = json.load(open(os.path.join(out, "manifest.json")))
    with pytest.raises(GateFailedError, match="holds a release drawn from reproducible noise"):
        publish_release(out, _synthetic(4), ledger=_ledger(tmp_path), config={})
    assert json.load(open(os.path.join(out, "manifest.json"))) == stamped  # nothing committed
    legacy = tmp_path / "legacy"
    (legacy / "_quarantine" / "old").mkdir(parents=True)
    (legacy / "_quarantine" / "old" / "ledger.json").write_text(_insecure_ledger(tmp_path, "old").to_json())
    with pytest.raises(GateFailedError, match="reproducible noise"):
        publish_release(str(legacy), _synthetic(4), ledger=_ledger(tmp_path), config={})
    assert not (legacy / "manifest.json").exists()
    clean = str(tmp_path / "clean")  # a fresh folder takes the secure release
    assert publish_release(clean, _synthetic(4), ledger=_ledger(tmp_path), config={})["privacy"]["secure"] is True


def test_the_manifest_holds_no_clock_reading(tmp_path):
    # Issue 30, item 3: manifest.created_at was read after every private pass (it timed them against the run).
    import re

    out = tmp_path / "out"
    publish_release(str(out), _synthetic(), ledger=_ledger(tmp_path), config={})
    for path in out.rglob("*.json"):
        text = path.read_text()
        assert "created_at" not in text, path
        assert not re.search(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}|\d{8}T\d{6}Z", text), path


def test_parts_share_one_schema_so_the_folder_reads_as_one_table(tmp_path):
    """A part whose rejection lists are all empty and whose model column is all null was list<null> and null to
    Arrow while another part had list<string> and string: pd.read_parquet(OUT/synthetic) failed on the demo's
    release. Every part now writes text types for such columns."""
    from privseed.tasks.data.corpus import write_part

    quiet = pd.DataFrame({"text": ["x"], "label": [0], "keyphrases": [["a"]], "rejections": [[]], "model": [None]})
    busy = pd.DataFrame({"text": ["y"], "label": [1], "keyphrases": [["b"]], "rejections": [["meta_talk"]],
                         "model": ["m"]})
    first, second = write_part(str(tmp_path), "r", 0, quiet), write_part(str(tmp_path), "r", 1, busy)
    assert first.schema.equals(second.schema)
    frame = pd.read_parquet(tmp_path / "synthetic").sort_values("label")
    assert frame["rejections"].map(list).tolist() == [[], ["meta_talk"]]
