"""Nothing in a release is a deterministic function of the private data (issue 13, "Done when", at small scale).

The adversary holds every file written for the recipient and knows every private document but one. Two runs
with the same flags on the same corpus (A, B) and one on the corpus minus one document (C), all with the same
configuration: a value that is equal in A and B is not noise, so it must be configuration or a constant, i.e.
equal in C too. A value equal across A and B that changes in C would be a function of the data that tells C's
corpus from A's with certainty (the old sha256 fingerprint in manifest.json and ledger.json was one; seeded
noise made every keyphrase one)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
import pyarrow.parquet as pq
import pytest

from privseed.flows.cli import main

pytestmark = pytest.mark.slow

FLAGS = ["--vocab-top", "20000", "--vocab-size", "40", "--features", "64", "--per-class", "4", "--length", "5",
         "--llm", "none", "--no-gate", "--workers", "1", "--labels", "0,1,2", "--seed", "0"]


def _leaves(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, f"{path}.{key}")
    elif isinstance(value, list) and not all(isinstance(v, str) for v in value):
        for index, item in enumerate(value):
            yield from _leaves(item, f"{path}[{index}]")
    else:
        yield path, json.dumps(value, sort_keys=True, default=str)


def release_values(out: Path) -> dict[str, str]:
    """Every JSON value and every Parquet cell of a release folder, keyed by a name that does not depend on the
    (random) release id: file kind + JSON path, or synthetic part index + row + column."""
    values: dict[str, str] = {}
    parts = sorted((out / "synthetic").glob("*.parquet"))
    for index, part in enumerate(parts):
        frame = pq.read_table(io.BytesIO(part.read_bytes())).to_pandas()
        for row in range(len(frame)):
            for column in frame.columns:
                cell = frame[column].iloc[row]
                values[f"synthetic[{index}][{row}].{column}"] = json.dumps(
                    cell.tolist() if hasattr(cell, "tolist") else cell, default=str)
    for path in sorted(out.rglob("*.json")):
        kind = path.name  # _releases/<id>/ledger.json and the top-level copy hold the same document
        for key, value in _leaves(json.loads(path.read_text()), kind):
            values[key] = value
    release_id = json.loads((out / "manifest.json").read_text())["release_id"]
    for path in sorted(out.rglob("README.md")):  # the dataset card, line by line, its release id left out
        for number, line in enumerate(path.read_text().replace(release_id, "<id>").splitlines()):
            values[f"{path.name}:{number}"] = line
    others = [p for p in out.rglob("*") if p.is_file() and p.suffix not in (".json", ".parquet", ".md")]
    assert others == [], f"unexpected files in the release: {others}"
    return values


def test_no_release_value_is_a_deterministic_function_of_the_data(prefect_harness, tmp_path, tiny_corpus):
    corpus = tmp_path / "corpus.parquet"  # one path for every run: the config (data=...) is the same
    tiny_corpus.drop_duplicates().to_parquet(corpus, index=False)
    for name in ("A", "B"):
        assert main(["dpkps", str(corpus), "--out", str(tmp_path / name), *FLAGS]) == 0
    smaller = pd.read_parquet(corpus).iloc[1:]  # the adjacent corpus: one document removed
    smaller.to_parquet(corpus, index=False)
    assert main(["dpkps", str(corpus), "--out", str(tmp_path / "C"), *FLAGS]) == 0

    a, b, c = (release_values(tmp_path / name) for name in "ABC")
    assert set(a) == set(b) == set(c), "the three releases have different shapes"
    keyphrases = [k for k in a if k.endswith(".keyphrases")]
    assert keyphrases and any(a[k] != b[k] for k in keyphrases), "two runs released the same keyphrases"
    data_dependent = sorted(k for k in a if a[k] == b[k] and c[k] != a[k])
    assert data_dependent == [], f"equal across runs yet changed by removing one document: {data_dependent[:10]}"
    # the private state (identity key, drawn values) is beside each release, never inside it
    for name in "ABC":
        assert (tmp_path / f"{name}.private" / "identity.key").exists() and not (tmp_path / name / "_state").exists()
