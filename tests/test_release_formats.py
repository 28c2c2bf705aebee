"""A release folder opens where the ecosystem looks: ``datasets.load_dataset(OUT)`` reads exactly the manifest's
synthetic parts through the dataset card (README.md, written before the manifest and listed in it), with the label
as a ClassLabel named by the declared class names; ``pandas.read_parquet(OUT / "synthetic")`` reads the parts."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from privseed.tasks.data.corpus import publish_release, read_release
from privseed.tasks.dp.ledger import PrivacyLedger

datasets = pytest.importorskip("datasets")


def _synthetic(labels: list) -> pd.DataFrame:
    n = 2 * len(labels)
    return pd.DataFrame({"text": [f"doc {i}" for i in range(n)], "label": [labels[i % len(labels)] for i in range(n)],
                         "keyphrases": [["doc", str(i)] if i else [] for i in range(n)]})


def _publish(tmp_path, frame: pd.DataFrame, labels: list[str], class_names=None, rows_per_shard=3) -> dict:
    ledger = PrivacyLedger(str(tmp_path / "out.private"), "id-of-the-corpus", "run1")
    return publish_release(str(tmp_path / "out"), frame, ledger=ledger, config={"labels": labels},
                           rows_per_shard=rows_per_shard, class_names=class_names)


def test_load_dataset_opens_the_release_with_class_names(tmp_path):
    frame = _synthetic([0, 1, 2])
    manifest = _publish(tmp_path, frame, ["0", "1", "2"], {"0": "Company", "1": "Athlete", "2": "Album"})
    out = tmp_path / "out"
    # files that load_dataset once took for data: the ledger, the quality result, a stale part, a quarantined one
    (out / "synthetic" / "part-00000-stale.parquet").write_bytes((out / manifest["files"][0]["path"]).read_bytes())
    (out / "_quarantine" / "x").mkdir(parents=True)
    frame.to_parquet(out / "_quarantine" / "x" / "part.parquet")
    loaded = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "hf"))
    train = loaded["train"]
    assert list(loaded) == ["train"] and train.num_rows == len(frame)
    assert train.features["label"].names == ["Company", "Athlete", "Album"]
    assert sorted(train["text"]) == sorted(frame["text"])
    assert sorted(train.to_pandas()["label"]) == sorted(frame["label"])
    card = next(f for f in manifest["files"] if f["kind"] == "README.md")
    assert card["copy"] == "README.md" and (out / "README.md").exists()
    assert "| 1 | Athlete | 2 |" in (out / "README.md").read_text()
    (out / "synthetic" / "part-00000-stale.parquet").unlink()
    assert sorted(pd.read_parquet(out / "synthetic")["text"]) == sorted(frame["text"])
    read_release(str(out))  # the manifest still verifies every file, the card included


def test_text_labels_are_their_own_class_names(tmp_path):
    frame = _synthetic(["sport", "music"])
    _publish(tmp_path, frame, ["sport", "music"])
    train = datasets.load_dataset(str(tmp_path / "out"), cache_dir=str(tmp_path / "hf"))["train"]
    assert train.features["label"].names == ["sport", "music"]
    assert [train.features["label"].int2str(v) for v in train["label"]] == frame["label"].tolist()


def test_integers_that_are_not_positions_stay_integers(tmp_path):
    frame = _synthetic([1, 5])
    _publish(tmp_path, frame, ["1", "5"])
    train = datasets.load_dataset(str(tmp_path / "out"), cache_dir=str(tmp_path / "hf"))["train"]
    assert train.features["label"].dtype == "int64" and sorted(set(train["label"])) == [1, 5]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert any(f["kind"] == "README.md" for f in manifest["files"])
