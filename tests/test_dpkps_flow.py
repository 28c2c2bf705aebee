"""The DP-KPS flow end to end through the CLI, under a real (ephemeral) Prefect API and a LocalCluster."""

import json
import os

import pandas as pd
import pytest

from privseed.flows.cli import main
from privseed.tasks.data.corpus import read_release

pytestmark = pytest.mark.slow

# The paper's independent sampler (the histogram methods, the default, read neither V~'s size nor features).
SMALL = ["--method", "independent", "--vocab-top", "20000", "--vocab-size", "40", "--features", "64",
         "--per-class", "4", "--length", "5", "--llm", "none", "--no-gate", "--workers", "1", "--labels", "0,1,2"]


def run(*argv):
    return main(["dpkps", *map(str, argv), *SMALL])


def ledger_values(out):
    state = os.path.join(f"{out}.private", "runs")
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
    assert {e["mechanism"] for e in ledger["entries"]}
    assert not any("data_identity" in e or "dataset_fingerprint" in e for e in ledger["entries"])
    assert set(manifest["privacy"]) == {"epsilon", "delta", "run_id", "secure", "noise", "guarantee"}
    assert manifest["privacy"]["epsilon"] == pytest.approx(11.0)
    # the private state lives beside the release, not in it; the manifest names release files only
    assert not (out / "_state").exists() and (out.parent / "out.private" / "identity.key").exists()
    assert all(not f["path"].startswith(("_state", "..")) for f in manifest["files"])
    assert any(name.startswith("part-") for name in os.listdir(out / "synthetic"))


def test_resume_with_run_id_rereads_noise_and_a_rerun_draws_anew(first_release, tmp_path):
    corpus, out = first_release
    before_values = ledger_values(str(out))
    before_ledger = json.loads((out / "ledger.json").read_text())
    _, before = read_release(str(out))
    assert run(corpus, "--out", out, "--run-id", before_ledger["run_id"]) == 0  # resume: re-read, charge nothing
    assert ledger_values(str(out)) == before_values
    after_ledger = json.loads((out / "ledger.json").read_text())
    assert after_ledger["entries"] == before_ledger["entries"] and after_ledger["total"] == before_ledger["total"]
    _, after = read_release(str(out))
    assert after["text"].tolist() == before["text"].tolist()

    other = tmp_path / "again"  # the same command without --run-id: a new run, new noise, new budget
    assert run(corpus, "--out", other) == 0
    again = json.loads((other / "ledger.json").read_text())
    assert again["run_id"] != before_ledger["run_id"]
    _, fresh = read_release(str(other))
    assert fresh["text"].tolist() != before["text"].tolist()
    owner = json.loads((tmp_path / "again.private" / "runs" / again["run_id"] / "ledger.json").read_text())
    assert owner["cumulative"]["epsilon"] == pytest.approx(11.0)  # its own state folder: one run


def test_runs_sharing_a_state_folder_report_the_cumulative_budget(first_release, tmp_path):
    corpus, out = first_release
    state = tmp_path / "state"
    for folder in ("a", "b"):
        assert run(corpus, "--out", tmp_path / folder, "--state", state) == 0
    run_id = json.loads((tmp_path / "b" / "ledger.json").read_text())["run_id"]
    owner = json.loads((state / "runs" / run_id / "ledger.json").read_text())
    assert owner["cumulative"]["epsilon"] == pytest.approx(22.0) and len(owner["cumulative"]["runs"]) == 2
    assert "cumulative" not in (tmp_path / "b" / "ledger.json").read_text()  # owner-only


def test_a_run_id_started_on_another_corpus_is_refused(first_release, tmp_path, capsys):
    corpus, out = first_release
    run_id = json.loads((out / "ledger.json").read_text())["run_id"]
    frame = pd.read_parquet(corpus)
    smaller = tmp_path / "smaller.parquet"
    frame.iloc[1:].to_parquet(smaller)  # one document less
    manifest_before = (out / "manifest.json").read_bytes()
    assert main(["dpkps", str(smaller), "--out", str(out), *SMALL, "--run-id", run_id]) == 2
    err = capsys.readouterr().err
    assert "another corpus" in err and "--run-id" in err
    assert (out / "manifest.json").read_bytes() == manifest_before


@pytest.mark.parametrize("problem", ["none", "undeclared"])
def test_labels_must_be_declared_and_cover_the_corpus(first_release, tmp_path, capsys, problem):
    corpus, out = first_release
    small = SMALL[:SMALL.index("--labels")]
    labels = [] if problem == "none" else ["--labels", "0,1"]
    assert main(["dpkps", str(corpus), "--out", str(tmp_path / "o"), *small, *labels]) == 2
    err = capsys.readouterr().err
    if problem == "none":
        assert "--labels a,b,c" in err and "--labels-file" in err
    else:
        assert "not in the declared label set" in err and "'2'" not in err and " 2 " not in err
    # nothing drawn, nothing left behind: not even the identity key (stored only once pass 1 has passed)
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.private").exists()
    assert err.count("privseed dpkps: error:") == 1 and "Traceback" not in err


def test_a_declared_class_without_documents_gets_noise_not_an_error(first_release, tmp_path):
    corpus, _ = first_release
    out = tmp_path / "o"
    assert main(["dpkps", str(corpus), "--out", str(out), *SMALL[:SMALL.index("--labels")],
                 "--labels", "0,1,2,3"]) == 0
    _, synthetic = read_release(str(out))
    assert synthetic.groupby("label").size().to_dict() == {0: 4, 1: 4, 2: 4, 3: 4}


def test_dry_run_reads_draws_charges_and_sends_nothing(first_release, tmp_path, capsys):
    corpus, _ = first_release
    out = tmp_path / "dry"
    assert main(["dpkps", str(corpus), "--out", str(out), *SMALL, "--dry-run"]) == 0
    assert "nothing drawn, charged or sent" in capsys.readouterr().out
    assert not out.exists() and not (tmp_path / "dry.private").exists()


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
