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
import re
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
import pyarrow.parquet as pq
import pytest

from privseed.flows.cli import main

pytestmark = pytest.mark.slow

LLM = "local:recording-release-privacy"


def _leaves(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, f"{path}.{key}")
    elif isinstance(value, list) and not all(isinstance(v, str) for v in value):
        for index, item in enumerate(value):
            yield from _leaves(item, f"{path}[{index}]")
    else:
        yield path, json.dumps(value, sort_keys=True, default=str)


def release_values(out: Path, rows_as_sets: bool = False) -> dict[str, str]:
    """Every JSON value and every Parquet cell of a release folder, keyed by a name that does not depend on the
    (random) release id: file kind + JSON path, or synthetic part index + row + column.

    ``rows_as_sets``: PE releases select whole candidates (text, call seed, origin) by noisy votes from a pool
    the public seed makes; a cell-by-cell comparison would flag two runs that picked the same candidate for one
    position by chance. There the rows of each class are compared as one multiset (one value per class)."""
    values: dict[str, str] = {}
    parts = sorted((out / "synthetic").glob("*.parquet"))
    frames = [pq.read_table(io.BytesIO(part.read_bytes())).to_pandas() for part in parts]
    for index, frame in enumerate(frames):
        for row in range(len(frame)):
            for column in frame.columns:
                cell = frame[column].iloc[row]
                values[f"synthetic[{index}][{row}].{column}"] = json.dumps(
                    cell.tolist() if hasattr(cell, "tolist") else cell, default=str)
    if rows_as_sets:
        rows = [json.dumps([values[f"synthetic[{i}][{r}].{c}"] for c in frame.columns])
                for i, frame in enumerate(frames) for r in range(len(frame))]
        labels = [str(frame["label"].iloc[r]) for frame in frames for r in range(len(frame))]
        values = {f"synthetic.class[{label}]": json.dumps(sorted(row for row, of in zip(rows, labels) if of == label))
                  for label in sorted(set(labels))}
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


DPKPS_FLAGS = ["--vocab-top", "20000", "--per-class", "4", "--length", "5", "--no-gate", "--workers", "1",
               "--labels", "0,1,2", "--seed", "0"]
# The paper's independent sampler (named: the histogram methods are the default) and its DP vocabulary's size and
# sketches' features, which the histogram methods refuse.
SAMPLER_FLAGS = ["--method", "independent", "--vocab-size", "40", "--features", "64"]
# PE: a large pool per class (N (K + 1) = 16 candidates, N = 4 kept) and strong noise, so that two runs agree on a
# class's whole population only by a rare chance; the recording backend writes a distinct text for every call.
PE_FLAGS = ["--llm", LLM, "--per-class", "4", "--variations", "3", "--iterations", "1", "--no-gate",
            "--no-progress", "--workers", "1", "--labels", "0,1,2", "--seed", "0", "--doc-type", "short text",
            "--max-tokens", "32", "--min-words", "0"]

#: method -> (argv after the corpus and --out, compare PE rows as multisets)
METHODS: dict[str, tuple[list[str], bool]] = {
    "dpkps": (["dpkps", *DPKPS_FLAGS, *SAMPLER_FLAGS, "--llm", "none"], False),
    # Without class fit's rounds: they follow the released seeds of every class (post-processing,
    # tests/test_class_fit.py), and on this tiny corpus, whose classes share most terms, their few outcomes (a row's
    # 1-3 candidates, a count of rows still off-class) came out equal in runs A and B and different in C by chance
    # (1 fresh-clone run in 4).
    "dpkps-llm": (["dpkps", *DPKPS_FLAGS, *SAMPLER_FLAGS, "--llm", LLM, "--no-rewrite-off-class"], False),
    "histogram": (["dpkps", *DPKPS_FLAGS, "--llm", "none", "--method", "histogram", "--epsilon", "2",
                   "--hist-top-k", "30"], False),
    "histogram-markov": (["dpkps", *DPKPS_FLAGS, "--llm", "none", "--method", "histogram-markov", "--epsilon", "2",
                          "--hist-top-k", "30"], False),
    "augpe": (["augpe", *PE_FLAGS, "--epsilon", "0.1", "--delta", "1e-5"], True),
    "secpe": (["secpe", *PE_FLAGS, "--noise-multiplier", "50", "--r-over-p", "10000", "--clusters", "4"], True),
}


@pytest.fixture
def recording_llm():
    from privseed.tasks.llm import register_backend
    from tests.fakes.recording import RecordingBackend

    openers = ("The page opens with", "It then turns to", "Later the writer mentions", "Near the end it adds",
               "Finally it closes with", "A note also recalls", "One more line names")

    # Varied clauses: the release gate's repetition statistics reject one clause repeated after every term.
    tails = ("because readers asked about it", "as the local archive records", "which surprised several visitors",
             "during a long and quiet winter", "after the council voted on it", "with help from two teachers",
             "when the harbour reopened", "before anyone had written it down", "for reasons nobody fully explained",
             "under a new and younger editor")

    def answer(request) -> str:  # prose around the prompt's terms (their list given back is no document)
        found = re.search(r"terms: (.*?)\.", request.messages[-1].content)
        terms = found.group(1).split(", ") if found else ["this page"]
        return f"Call {request.seed}. " + " ".join(f"{openers[i % len(openers)]} {term}, "
                                                   f"{tails[(request.seed + i) % len(tails)]}."
                                                   for i, term in enumerate(terms))

    backend = RecordingBackend(answer=answer)
    register_backend(LLM, backend)
    yield backend
    register_backend(LLM, None)


@pytest.mark.parametrize("method", list(METHODS))
def test_no_release_value_is_a_deterministic_function_of_the_data(prefect_harness, tmp_path, tiny_corpus,
                                                                 recording_llm, method):
    # Issue 30: DP-KPS alone was tested; SecPE's released sigma and epsilon (a function of the secret incidence)
    # went unnoticed. Every method now: its ledger, manifest, evolution.json and rows.
    argv, rows_as_sets = METHODS[method]
    corpus = tmp_path / "corpus.parquet"  # one path for every run: the config (data=...) is the same
    tiny_corpus.drop_duplicates().to_parquet(corpus, index=False)
    if method == "secpe":
        public = tmp_path / "public.parquet"
        pd.DataFrame({"text": [f"{t} public {i}" for i, t in enumerate(tiny_corpus["text"].unique())]}).to_parquet(
            public)
        secrets = tmp_path / "secrets.txt"
        secrets.write_text("football\nglacier\n")  # the document removed for C holds the only "football"
        argv = [*argv, "--public", str(public), "--secrets", str(secrets)]

    def run(name: str) -> None:
        assert main([argv[0], str(corpus), "--out", str(tmp_path / name), *argv[1:]]) == 0

    for name in ("A", "B"):
        run(name)
    smaller = pd.read_parquet(corpus).iloc[1:]  # the adjacent corpus: one document removed
    smaller.to_parquet(corpus, index=False)
    run("C")

    a, b, c = (release_values(tmp_path / name, rows_as_sets) for name in "ABC")
    assert set(a) == set(b) == set(c), "the three releases have different shapes"
    rows = [k for k in a if k.startswith("synthetic") and (rows_as_sets or k.endswith((".keyphrases", ".text")))]
    assert rows and any(a[k] != b[k] for k in rows), "two runs released the same rows"
    data_dependent = sorted(k for k in a if a[k] == b[k] and c[k] != a[k])
    if method == "secpe":
        # SecPE's selection has few outcomes: each of the --clusters noisy centres votes for its nearest candidate
        # and rank fills the rest by index, so two runs keep a class's same rows by chance (1 run in 3 here). The
        # noise behind the votes is tested where it is drawn (test_secpe_flow_releases_the_stated_gaussian); every
        # other value (ledger, manifest, evolution.json: sigma, epsilon, counts) is checked here.
        data_dependent = [k for k in data_dependent if not k.startswith("synthetic.class[")]
    if method in ("histogram", "histogram-markov"):
        # The contribution kind the corpus profile's rule picks has three outcomes, read off the noisy median of a
        # profile charged 5 % of epsilon 2 (a Laplace scale of 10 documents a cell on these 12): two runs agree on it
        # and the third differs by chance (both parameters, 1 fresh-clone run in 2). It is post-processing of that
        # noisy release (tests/test_corpus_profile.py::test_flow_profile_noise_is_laplace_of_its_share_and_differs_
        # across_runs recomputes it from the stored noisy profile); every other value is checked here.
        data_dependent = [k for k in data_dependent
                          if not k.endswith(("params.contribution", "config.hist_contribution"))]
    assert data_dependent == [], f"equal across runs yet changed by removing one document: {data_dependent[:10]}"
    # the private state (identity key, drawn values) is beside each release, never inside it
    for name in "ABC":
        assert (tmp_path / f"{name}.private" / "identity.key").exists() and not (tmp_path / name / "_state").exists()
        manifest = json.loads((tmp_path / name / "manifest.json").read_text())
        assert str(tmp_path) not in json.dumps(manifest)  # no path of the owner's
