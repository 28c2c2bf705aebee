"""The DP-KPS flow end to end through the CLI, under a real (ephemeral) Prefect API and a LocalCluster."""

import json
import os

import pandas as pd
import pytest

from flows.cli import main
from tasks.corpus import read_release

pytestmark = pytest.mark.slow

SMALL = ["--vocab-top", "20000", "--vocab-size", "40", "--features", "64", "--per-class", "4", "--length", "5",
         "--llm", "none", "--no-gate", "--workers", "1"]


def run(*argv):
    return main(["dpkps", *map(str, argv), *SMALL])


def ledger_values(out):
    state = os.path.join(out, "_state", "runs")
    files = {}
    for root, _, names in os.walk(state):
        for name in names:
            if name.endswith(".npz"):
                files[name] = open(os.path.join(root, name), "rb").read()
    return files


@pytest.fixture(scope="module")
def first_release(prefect_harness, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("flow")
    corpus = tmp / "corpus.parquet"
    rows = [(t, label) for label, texts in {
        0: ["football club player scored goals league season", "striker signed contract club league"],
        1: ["river valley mountain lake forest village", "mountain peak glacier valley river"],
        2: ["album band song released records guitar", "singer recorded album single records"],
    }.items() for t in texts for _ in range(4)]
    pd.DataFrame(rows, columns=["text", "label"]).to_parquet(corpus)
    out = tmp / "out"
    assert run(corpus, "--out", out) == 0
    return corpus, out


def test_release_has_the_contract_layout(first_release):
    _, out = first_release
    manifest, synthetic = read_release(str(out))
    assert {"text", "label", "keyphrases"} <= set(synthetic.columns)
    assert synthetic.groupby("label").size().tolist() == [4, 4, 4]  # per class from the config
    assert all(row.text == " ".join(row.keyphrases) for row in synthetic.itertuples())  # --llm none
    assert all(1 <= len(k) <= 5 for k in synthetic["keyphrases"])
    ledger = json.loads((out / "ledger.json").read_text())
    assert ledger["total"]["epsilon"] == pytest.approx(11.0)  # eps_voc 1 + eps_kde 10
    assert {e["mechanism"] for e in ledger["entries"]} and all(e["dataset_fingerprint"] for e in ledger["entries"])
    assert manifest["privacy"]["epsilon"] == pytest.approx(11.0)
    assert any(name.startswith("part-") for name in os.listdir(out / "synthetic"))


def test_rerun_rereads_noise_and_charges_nothing(first_release):
    corpus, out = first_release
    before_values = ledger_values(str(out))
    before_ledger = json.loads((out / "ledger.json").read_text())
    _, before = read_release(str(out))
    assert run(corpus, "--out", out) == 0
    assert ledger_values(str(out)) == before_values
    after_ledger = json.loads((out / "ledger.json").read_text())
    assert after_ledger["entries"] == before_ledger["entries"] and after_ledger["total"] == before_ledger["total"]
    _, after = read_release(str(out))
    assert after["text"].tolist() == before["text"].tolist()


def test_same_run_id_with_other_parameters_is_refused(first_release, capsys):
    corpus, out = first_release
    run_id = json.loads((out / "ledger.json").read_text())["run_id"]
    assert main(["dpkps", str(corpus), "--out", str(out), *SMALL, "--run-id", run_id, "--eps-kde", "5"]) == 2
    assert "another" in capsys.readouterr().err


@pytest.mark.parametrize("problem", ["empty", "no-label", "unreadable", "bad-epsilon", "matches-nothing"])
def test_bad_input_fails_clearly_and_keeps_the_last_release(first_release, tmp_path, capsys, problem):
    corpus, out = first_release
    manifest_before = (out / "manifest.json").read_bytes()
    bad = tmp_path / "bad.parquet"
    extra = []
    if problem == "empty":
        pd.DataFrame({"text": pd.Series([], dtype=str), "label": pd.Series([], dtype=int)}).to_parquet(bad)
        expected = "empty"
    elif problem == "no-label":
        pd.DataFrame({"text": ["a b c"]}).to_parquet(bad)
        expected = "no column 'label'"
    elif problem == "unreadable":
        bad.write_bytes(b"not a parquet file")
        expected = "unreadable"
    elif problem == "bad-epsilon":
        bad = corpus
        extra = ["--eps-kde", "-1"]
        expected = "epsilon must be > 0"
    else:
        pd.DataFrame({"text": ["zzqx wvvk", "qqzx kkwv"], "label": [0, 1]}).to_parquet(bad)
        expected = "vocabulary"
    assert main(["dpkps", str(bad), "--out", str(out), *SMALL, *extra]) == 2
    assert expected in capsys.readouterr().err
    assert (out / "manifest.json").read_bytes() == manifest_before
    read_release(str(out))  # still complete and verified
