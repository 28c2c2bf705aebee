import json
import os

import numpy as np
import pandas as pd
import pytest

from privseed.flows import evaluate as ev
from privseed.flows import experiment as ex
from privseed.tasks.evaluation import classify, evaluation, experiment_table, report
from privseed.tasks.evaluation import experiment as grid
from privseed.tasks.evaluation.baselines import only_llm_corpus
from privseed.tasks.data.corpus import read_corpus
from privseed.tasks.data.release_reader import read_release
from privseed.tasks.stages.evaluation import score_corpus
from privseed.tasks.config.commands import EvaluationOptions
from privseed.tasks.data.corpus import publish_release
from privseed.tasks.errors import ConfigError
from privseed.tasks.dp.ledger import PrivacyLedger

TOPICS = {
    0: ("Athlete", ["football", "striker", "goal", "league", "coach", "stadium", "match", "season"]),
    1: ("Album", ["album", "guitar", "band", "song", "singer", "concert", "record", "drummer"]),
    2: ("NaturalPlace", ["river", "mountain", "forest", "lake", "glacier", "valley", "island", "waterfall"]),
}


def topic_docs(n_per_class: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for label, (name, words) in TOPICS.items():
        for _ in range(n_per_class):
            w = rng.choice(words, size=4, replace=False)
            rows.append((f"The {w[0]} near the {w[1]} was known for its {w[2]} and {w[3]}.", label, name, list(w)))
    return pd.DataFrame(rows, columns=["text", "label", "label_name", "keyphrases"])


@pytest.fixture
def release_and_data(tmp_path):
    synthetic = topic_docs(10, seed=0)
    rows = synthetic[["text", "label", "keyphrases"]].assign(
        backend="local", model="tiny", seed=range(len(synthetic)), tokens_in=20, tokens_out=30)
    ledger = PrivacyLedger(str(tmp_path / "release.private"), "data-identity", "run1")
    ledger.charge_unverified("vocabulary", mechanism="laplace", params={"S": 10}, epsilon=1.0, stage="vocabulary")
    out = tmp_path / "release"
    publish_release(str(out), rows, ledger=ledger, config={"llm": "local", "vocab": "english", "vocab_top": 50000})
    test_path, client_path = tmp_path / "test.parquet", tmp_path / "client.parquet"
    topic_docs(8, seed=1).drop(columns="keyphrases").to_parquet(test_path, index=False)
    topic_docs(6, seed=2)[["text"]].to_parquet(client_path, index=False)  # unlabelled
    return str(out), str(test_path), str(client_path)


def test_evaluate_flow_scores_writes_json_and_report(prefect_harness, release_and_data, tmp_path, monkeypatch,
                                                     capsys):
    from privseed.flows.cli import main

    monkeypatch.setenv("PRIVSEED_CACHE_DIR", str(tmp_path / "cache"))
    out, test, client = release_and_data
    real_train = tmp_path / "real_train.parquet"
    topic_docs(5, seed=3).drop(columns="keyphrases").to_parquet(real_train, index=False)
    assert main(["evaluate", "--synthetic", out, "--test", test, "--client", client, "--coral",
                 "--json", str(tmp_path / "r.json"), "--epochs", "30", "--no-progress",
                 "--real-train", str(real_train)]) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    # issue 47: the lines to read the scores against, per-class scores, real vs synthetic, the guarantee in words
    references = {r["reference"]: r for r in result["references"]}
    assert list(references) == ["chance: uniform guessing", "chance: the largest class", evaluation.SEEDS_ALONE,
                                evaluation.REAL_DOCUMENTS]
    assert references["chance: uniform guessing"]["accuracy"] == pytest.approx(1 / 3)
    assert "15 documents" in references[evaluation.REAL_DOCUMENTS]["what"]  # 5 per class, none of the test's
    assert references[evaluation.SEEDS_ALONE]["accuracy"] > 0.6
    assert [r["class"] for r in result["per_class"]["TF-IDF + LR"]] == ["Athlete", "Album", "NaturalPlace"]
    assert sum(r["support"] for r in result["per_class"]["TF-IDF + LR"]) == 24
    assert 0 <= result["distinguishability"]["auc"] <= 1 and result["lengths"]["sentence"]
    assert result["guarantee"].startswith("Whether or not any single document was in the private corpus")
    scores = result["scores"]
    assert set(scores) == {"MLP on MiniLM + CORAL", "TF-IDF + LR"}
    for s in scores.values():
        assert s["accuracy"] > 0.6 and s["n_test"] == 24  # chance is 1/3
    assert result["n_client"] == 15  # half the synthetic corpus, never more than the client has
    assert result["usage"]["llm_calls"] == 30 and result["usage"]["tokens_out"] == 900
    assert set(result["prdc"]) == {"precision", "recall", "density", "coverage", "nearest_k"}
    # 30 synthetic documents: a 10 % split (3) is too small for early stopping, and the report says so
    assert [w["kind"] for w in result["warnings"]] == ["no-early-stopping"]
    # Issue 30, item 5: the report (a t-SNE of every test document) went into the release folder by default
    assert not os.path.exists(f"{out}/report.html") and result["report"] == f"{out}.evaluation/report.html"
    html_text = open(f"{out}.evaluation/report.html").read()
    for section in report.RUN_SECTIONS:
        assert f"<section id='{section}'>" in html_text
    assert "Athlete" in html_text  # label names from the test file's label_name column
    assert "<th>coverage</th>" in html_text and "trained without early stopping" in html_text
    assert "<h3 id='references'>" in html_text and "<h3 id='per-class'>" in html_text
    assert "seeds alone" in html_text and "real documents" in html_text and "e^1 (about 2.7)" in html_text
    printed = capsys.readouterr().out  # the summary on stdout: scores, fidelity, warnings, where the report is
    assert "MLP on MiniLM + CORAL: accuracy" in printed and "coverage" in printed
    assert "WARNING: MLP on MiniLM + CORAL trained without early stopping" in printed
    assert printed.rstrip().endswith(f"report: {out}.evaluation/report.html")


def test_warnings_name_a_collapsed_classifier_a_chance_score_and_a_tiny_validation_split():
    y_true = [0] * 10 + [1] * 10 + [2] * 10
    runs = {"collapsed": {"predictions": [1] * 29 + [0], "validation": {"wanted": 4, "minimum": 28, "used": 0},
                          "history": [{}] * 60},
            "at chance": {"predictions": [1, 2, 0] * 10, "validation": None},
            "fine": {"predictions": y_true, "validation": {"wanted": 30, "minimum": 28, "used": 30}}}
    found = evaluation.classifier_warnings(y_true, runs, {"1": "Album"})
    assert [(w["classifier"], w["kind"]) for w in found] == [
        ("collapsed", "one-class"), ("collapsed", "no-early-stopping"), ("at chance", "chance")]
    assert "one class (Album) for 97% of the test documents (2 of 3 classes ever predicted)" in found[0]["message"]
    assert "would hold 4 documents, fewer than the 28" in found[1]["message"] and "all 60 epochs" in found[1]["message"]
    # a test set that is itself one class is no reason to call a one-class classifier collapsed (only at chance)
    lopsided = evaluation.classifier_warnings([1] * 29 + [0], {"x": {"predictions": [1] * 30}}, {})
    assert [w["kind"] for w in lopsided] == ["chance"]


def test_evaluator_never_reads_test_labels_during_training(prefect_harness, release_and_data, tmp_path, monkeypatch):
    monkeypatch.setenv("PRIVSEED_CACHE_DIR", str(tmp_path / "cache"))
    out, test, client = release_and_data
    finished_trainings: list[str] = []
    label_reads: list[int] = []
    real_train = evaluation.train_and_predict

    def recording_train(kind, *args, **kwargs):
        result = real_train(kind, *args, **kwargs)
        finished_trainings.append(kind)
        return result

    real_read = classify.HeldOutTestSet.labels_for_scoring

    def recording_read(self):
        label_reads.append(len(finished_trainings))
        return real_read(self)

    monkeypatch.setattr(evaluation, "train_and_predict", recording_train)
    monkeypatch.setattr(classify.HeldOutTestSet, "labels_for_scoring", recording_read)
    ev.evaluate({"synthetic": out, "test": test, "client": client, "coral": True, "max_epochs": 20,
                 "progress": False, "report_path": str(tmp_path / "r.html")})
    assert finished_trainings == ["mlp", "tfidf", "tfidf"]  # the last: TF-IDF + LR on the seeds alone
    assert label_reads == [3]  # read once, after every classifier was trained, the reference lines' too

    # and the labels cannot influence training: permuting them leaves every prediction unchanged
    release = read_release(out)
    test_df = read_corpus(test)
    opts = EvaluationOptions(max_epochs=15, progress=False, coral=False)
    texts, labels = test_df["text"].tolist(), test_df["label"].to_numpy()
    a = score_corpus(release.rows, classify.HeldOutTestSet(texts, labels), client_texts=None, opts=opts)
    b = score_corpus(release.rows, classify.HeldOutTestSet(texts, np.random.default_rng(0).permutation(labels)),
                        client_texts=None, opts=opts)
    for name in a["runs"]:
        assert a["runs"][name]["predictions"] == b["runs"][name]["predictions"]


def test_client_documents_are_disjoint_from_test_and_half_the_synthetic_size():
    client = pd.DataFrame({"text": [f"doc {i}" for i in range(50)]})
    test_texts = [f"doc {i}" for i in range(10)]
    chosen = evaluation.choose_client_texts(client, test_texts, n_synthetic=40, seed=0)
    assert len(chosen) == 20 and not set(chosen) & set(test_texts)
    assert chosen == evaluation.choose_client_texts(client, test_texts, n_synthetic=40, seed=0)


def test_cli_registers_evaluate_and_experiment():
    from privseed.flows.cli import COMMANDS_BY_NAME, build_parser
    from privseed.tasks.config.commands import EvaluateConfig, ExperimentConfig, config_from_args

    parser = build_parser()
    args = parser.parse_args(["evaluate", "--synthetic", "OUT", "--test", "t.parquet", "--coral", "--client", "c",
                              "--classifier", "finetune", "--json", "r.json"])
    cfg = config_from_args(EvaluateConfig, args)
    assert COMMANDS_BY_NAME[args.command].runner == "privseed.flows.evaluate:run_from_cli"
    assert cfg.coral and cfg.classifier == "finetune" and cfg.json_path == "r.json"
    args = parser.parse_args(["experiment", "--config", "experiments/dbpedia14_nollm.toml", "--eps", "1+5,5+10",
                              "--seeds", "0,1,2", "--coral", "both", "--llm", "none", "--no-cell-reports"])
    cfg = config_from_args(ExperimentConfig, args)
    assert COMMANDS_BY_NAME[args.command].runner == "privseed.flows.experiment:run_from_cli"
    assert cfg.config_path == "experiments/dbpedia14_nollm.toml"
    assert cfg.eps == [(1.0, 5.0), (5.0, 10.0)] and cfg.seeds == [0, 1, 2] and not cfg.cell_reports
    assert ex.experiment_overrides(cfg) == {"eps": [[1.0, 5.0], [5.0, 10.0]], "seeds": [0, 1, 2], "llm": "none",
                                             "coral": [False, True]}


def test_experiment_configs_in_the_repo_load(monkeypatch, tmp_path):
    from pathlib import Path

    try:
        grid.data_root()
    except ConfigError:  # PRIVSEED_DATA_ROOT unset: loading only resolves {data}, reads nothing
        monkeypatch.setenv("PRIVSEED_DATA_ROOT", str(tmp_path))
    for path in sorted(Path(grid.REPO / "experiments").glob("*.toml")):
        spec = grid.load_experiment(str(path))
        assert spec.datasets and spec.methods and len(spec.seeds) >= 3, path
        assert "{data}" not in json.dumps(grid.spec_dict(spec)), path  # every path resolved
    with pytest.raises(ConfigError, match="unknown method"):
        grid.load_experiment(None, {"dataset": {"name": "x", "train": "t", "labels": [0, 1]}, "methods": ["magic"],
                                    "eps": [[1, 5]], "seeds": [0]})


def test_paper_lookup_cites_table_and_row():
    paper = pd.read_csv(grid.PAPER_NUMBERS)
    value, source = experiment_table.paper_lookup(paper, group="dbpedia14", method="independent", llm="none",
                                                  coral=False, eps=(1.0, 10.0))
    assert value == 80.6 and source.startswith("Table 5")
    value, source = experiment_table.paper_lookup(paper, group="dbpedia14", method="iterative-log", llm="local",
                                                  coral=True, eps=(5.0, 10.0))
    assert value == 85.1 and source.startswith("Table 2")
    value, _ = experiment_table.paper_lookup(paper, group="dbpedia14", method="real", llm="none", coral=False, eps=None)
    assert value == 85.2


def test_experiment_grid_writes_table_and_report_and_resumes(prefect_harness, tmp_path, monkeypatch):
    monkeypatch.setenv("PRIVSEED_CACHE_DIR", str(tmp_path / "cache"))
    train = topic_docs(30, seed=3).drop(columns="keyphrases")
    test = topic_docs(8, seed=4).drop(columns="keyphrases")
    train.to_parquet(tmp_path / "train.parquet", index=False)
    test.to_parquet(tmp_path / "test.parquet", index=False)
    overrides = {"name": "tiny", "out": str(tmp_path / "results"), "methods": ["real"], "eps": [[1, 5]],
                 "seeds": [0, 1], "llm": "local", "max_epochs": 15, "coral": [False, True],
                 "dataset": {"name": "tiny", "train": str(tmp_path / "train.parquet"), "labels": [0, 1, 2],
                             "test": str(tmp_path / "test.parquet"), "private_per_class": 10,
                             "synthetic_per_class": 8}}
    result = ex.experiment({"progress": False}, grid=overrides)
    table = pd.read_csv(result["table"])
    assert set(table["classifier"]) == {"MLP on MiniLM", "TF-IDF + LR"} and set(table["coral"]) == {False, True}
    assert (table["seeds"] == 2).all() and (table["accuracy_mean"] > 0.6).all()
    md = open(result["markdown"]).read()
    assert "± " in md and "| tiny | real |" in md
    html_text = open(result["report"]).read()
    for section in report.EXPERIMENT_SECTIONS:
        assert f"<section id='{section}'>" in html_text
    n_cells = len((tmp_path / "results" / "tiny" / "cells.jsonl").read_text().splitlines())
    ex.experiment({"progress": False}, grid=overrides)  # a re-run resumes: nothing is recomputed
    assert len((tmp_path / "results" / "tiny" / "cells.jsonl").read_text().splitlines()) == n_cells == 2 * 2 * 2
    # --report-only tabulates finished cells and starts none, but its side-by-side plot still knows chance (1/3)
    chances = []
    plot = report.plot_method_comparison
    monkeypatch.setattr(report, "plot_method_comparison",
                        lambda rows, **kw: chances.append(kw.get("chance")) or plot(rows, **kw))
    ex.experiment({"progress": False, "report_only": True}, grid=overrides)
    assert len((tmp_path / "results" / "tiny" / "cells.jsonl").read_text().splitlines()) == n_cells
    assert chances and all(c == pytest.approx(1 / 3) for c in chances)


def test_experiment_compares_dpkps_and_pe_at_matched_texts_calls_and_budget(prefect_harness, tmp_path, monkeypatch):
    """Table 2's protocol in the grid: every method releases the same texts per class and spends the same LLM
    calls (DP-KPS best of 1 + T K); Aug-PE spends eps_voc + eps_kde, AugPE+V~ splits it like DP-KPS, SecPE runs
    at (p, r) once per seed. A deterministic fake LLM stands in for the model."""
    from privseed.tasks.llm import register_backend
    from tests.test_evolution_flow import FakeBackend

    monkeypatch.setenv("PRIVSEED_CACHE_DIR", str(tmp_path / "cache"))
    topic_docs(30, seed=3).drop(columns="keyphrases").to_parquet(tmp_path / "train.parquet", index=False)
    topic_docs(8, seed=4).drop(columns="keyphrases").to_parquet(tmp_path / "test.parquet", index=False)
    (tmp_path / "secrets.txt").write_text("striker\nglacier\n")  # SecPE's secrets: words some documents hold
    overrides = {"name": "pe", "out": str(tmp_path / "results"),
                 "methods": ["independent", "augpe", "augpe+v", "secpe"], "eps": [[1, 5]], "seeds": [0],
                 "llm": "local:fake-topics", "max_epochs": 5, "gate": False,
                 "generation": {"max_tokens": 32, "temperature": 0.7},
                 "pe": {"iterations": 2, "variations": 1, "n_upper_bound": 10_000},
                 "secpe": {"p": 1e-4, "r_over_p": 10.0, "clusters": 4, "secrets": str(tmp_path / "secrets.txt"),
                           "noise_multiplier": 8.0},
                 "dpkps": {"vocab_size": 50, "n_features": 50},
                 "dataset": {"name": "tiny", "train": str(tmp_path / "train.parquet"), "labels": [0, 1, 2],
                             "test": str(tmp_path / "test.parquet"), "private_per_class": 12,
                             "synthetic_per_class": 2, "public_size": 20}}
    spec = grid.load_experiment(None, overrides)
    assert grid.calls_per_text(spec) == 3 and grid.dpkps_best_of(spec) == 3
    backend = FakeBackend()
    register_backend("local:fake-topics", backend)
    try:
        result = ex.experiment({"progress": False, "cell_reports": False}, grid=overrides)
    finally:
        register_backend("local:fake-topics", None)
    cells = pd.read_csv(tmp_path / "results" / "pe" / "cells.csv")
    assert set(cells["method"]) == {"independent", "augpe", "augpe+v", "secpe"}
    assert (cells["n_train"] == 6).all() and (cells["llm_calls"] == 3 * 6).all()  # same texts, same calls
    assert backend.calls > 0
    budget = dict(zip(cells["method"], cells["budget"]))
    assert budget["independent"].startswith("eps 6 (pure)")
    assert budget["augpe"].startswith("eps 6, delta") and budget["augpe+v"].startswith("eps 6, delta")
    assert budget["secpe"].startswith("(p, r) = (0.0001, 0.001)")
    assert cells.loc[cells["method"] == "secpe", "eps_voc"].isna().all()  # one SecPE cell per seed, no epsilon
    pe = cells[cells["method"].isin(["augpe", "augpe+v", "secpe"])]
    assert (pe["histogram_s_per_round"] >= 0).all() and (pe["llm_s_per_round"] >= 0).all()
    vocab_entries = json.loads((tmp_path / "results" / "pe" / "runs" / "tiny" / "augpe+v" / "local_fake-topics"
                                / "eps1+5" / "seed0" / "ledger.json").read_text())["entries"]
    assert {e["name"]: e["epsilon"] for e in vocab_entries}["vocabulary"] == 1.0  # DP-KPS's own vocabulary release
    md = open(result["markdown"]).read()
    assert "| tiny | secpe |" in md and "(p, r)" in md and "LLM calls" in md

    # A cell whose release is gone (interrupted, or removed to be written again) resumes its run: the noise
    # drawn the first time is re-read, not drawn again, and the state's ledger still counts one run.
    import shutil

    cell_out = tmp_path / "results" / "pe" / "runs" / "tiny" / "independent" / "local_fake-topics" / "eps1+5" / "seed0"
    first_rows = read_release(str(cell_out)).rows["text"].tolist()
    first_ledger = json.loads((cell_out / "ledger.json").read_text())
    assert grid.started_run(str(cell_out)) == first_ledger["run_id"]
    shutil.rmtree(cell_out)
    (tmp_path / "results" / "pe" / "cells.jsonl").unlink()
    register_backend("local:fake-topics", backend)
    try:
        ex.experiment({"progress": False, "cell_reports": False}, grid=overrides)
    finally:
        register_backend("local:fake-topics", None)
    again = json.loads((cell_out / "ledger.json").read_text())
    assert again["run_id"] == first_ledger["run_id"] and again["total"] == first_ledger["total"]
    assert read_release(str(cell_out)).rows["text"].tolist() == first_rows
    assert len(list((tmp_path / "results" / "pe" / "runs" / "tiny" / "independent" / "local_fake-topics" / "eps1+5"
                     / "seed0.private" / "runs").iterdir())) == 1


def test_experiment_refuses_a_dataset_without_declared_labels():
    base = {"eps": [[1, 5]], "seeds": [0], "methods": ["independent"]}
    with pytest.raises(ConfigError, match="declares no labels"):
        grid.load_experiment(None, {**base, "dataset": {"name": "x", "train": "t"}})
    spec = grid.load_experiment(None, {**base, "dataset": {"name": "x", "train": "t", "positive_column": "c",
                                                        "positive_value": 1}})
    assert grid.declared_labels(spec.datasets[0]) == [0, 1]  # a binary stand-in declares [0, 1] by construction


def test_experiment_refuses_bad_pe_sections():
    base = {"dataset": {"name": "x", "train": "t", "labels": [0, 1]}, "eps": [[1, 5]], "seeds": [0], "llm": "local"}
    with pytest.raises(ConfigError, match="prompt an LLM"):
        grid.load_experiment(None, {**base, "methods": ["augpe"], "llm": "none"})
    with pytest.raises(ConfigError, match=r"unknown \[pe\]"):
        grid.load_experiment(None, {**base, "methods": ["augpe"], "pe": {"iteratons": 2}})
    with pytest.raises(ConfigError, match="may not set"):
        grid.load_experiment(None, {**base, "methods": ["augpe"], "pe": {"epsilon": 3}})
    spec = grid.load_experiment(None, {**base, "methods": ["independent", "augpe"],
                                       "pe": {"iterations": 3, "variations": 2}, "dpkps": {"best_of": 2}})
    with pytest.raises(ConfigError, match="match_calls needs 7"):
        grid.dpkps_best_of(spec)


def test_only_llm_ablation_prompts_name_the_class_and_are_cached(tmp_path):
    from privseed.tasks.llm import register_backend
    from privseed.tasks.llm.base import ChatResult, LLMBackend

    class Recording(LLMBackend):
        name, model = "openai-compatible", "recorder"

        def __init__(self):
            self.prompts = []

        def complete(self, requests, on_each=None):
            out = []
            for i, r in enumerate(requests):
                self.prompts.append(r.messages[-1].content)
                out.append(ChatResult(text=f"Document {r.seed} is a short article about its class, in plain prose.",
                                      tokens_in=5, tokens_out=7))
                if on_each:
                    on_each(i, out[-1])
            return out

    spec = "openai-compatible:http://127.0.0.1:9/v1#recorder"
    backend = Recording()
    register_backend(spec, backend)
    try:
        names = {"0": "Athlete", "1": "Album"}
        df = only_llm_corpus(spec, "Wikipedia article", names, [0, 1], 3, seed=0,
                                cache_uri=str(tmp_path / "cache"))
        assert list(df["label"]) == [0, 0, 0, 1, 1, 1] and (df["tokens_out"] == 7).all()
        assert sum("Athlete" in p for p in backend.prompts) == 3 and len(set(df["seed"])) == 6
        again = only_llm_corpus(spec, "Wikipedia article", names, [0, 1], 3, seed=0,
                                   cache_uri=str(tmp_path / "cache"))
        assert len(backend.prompts) == 6 and list(again["text"]) == list(df["text"])  # served from the cache
    finally:
        register_backend(spec, None)
    with pytest.raises(ConfigError):
        only_llm_corpus("none", "x", {}, [0], 1, seed=0, cache_uri=str(tmp_path / "c2"))


def test_only_llm_answers_meet_the_release_predicate_and_are_regenerated(tmp_path):
    """The baseline is held to the same bar as the method it is compared with: a loop or an assistant's
    meta-talk is regenerated with a new call seed, a row that never becomes a document is dropped, and the counts
    are the release's quality report."""
    from privseed.tasks.generation.rounds import candidate_seed
    from privseed.tasks.llm import register_backend
    from privseed.tasks.llm.base import ChatResult, LLMBackend

    answers = {}  # call seed -> answer; anything not listed is a document

    class Scripted(LLMBackend):
        name, model = "openai-compatible", "scripted"

        def __init__(self):
            self.seeds = []

        def complete(self, requests, on_each=None):
            out = []
            for i, r in enumerate(requests):
                self.seeds.append(r.seed)
                text = answers.get(r.seed, "The club was founded in 1902 and plays its home games in the old town.")
                out.append(ChatResult(text=text, tokens_in=3, tokens_out=4))
                if on_each:
                    on_each(i, out[-1])
            return out

    from privseed.tasks.dp.ledger import public_rng

    seeds = public_rng(0, "only-llm").integers(0, 2**31 - 1, size=3).tolist()
    loop = "Australia, " * 40
    answers[seeds[0]] = "I'm an AI assistant designed to help with Wikipedia articles. I'm ready to help."
    answers[seeds[2]] = loop  # ... and every regeneration of row 2 loops too
    for j in range(1, 4):
        answers[candidate_seed(seeds[2], j)] = loop
    spec = "openai-compatible:http://127.0.0.1:9/v1#scripted"
    backend = Scripted()
    register_backend(spec, backend)
    try:
        df = only_llm_corpus(spec, "Wikipedia article", {"0": "Club"}, [0], 3, seed=0,
                             cache_uri=str(tmp_path / "cache"), max_regenerations=3)
    finally:
        register_backend(spec, None)
    assert list(df["seed"]) == seeds[:2] and "founded in 1902" in df["text"].iloc[0]
    assert list(df["regenerations"]) == [1, 0] and list(df["rejections"]) == [["meta_talk"], []]
    assert backend.seeds.count(seeds[2]) == 1 and len(backend.seeds) == 3 + 1 + 3  # round 0, row 0 once, row 2 thrice
    quality = df.attrs["quality"]
    assert (quality["rows_generated"], quality["rows_kept"]) == (3, 2)
    assert quality["dropped_by_reason"] == {"repetition_loop": 1}
    assert quality["regeneration_calls"] == 4 and df["tokens_out"].tolist() == [8, 4]

    # The grid gives only-LLM as many rounds as its DP-KPS releases ([dpkps] max_regenerations): with none,
    # the meta-talk row is dropped too.
    from privseed.tasks.stages import experiment as stages

    spec = grid.load_experiment(None, {"dataset": {"name": "x", "train": "t", "labels": [0], "synthetic_per_class": 3},
                                       "methods": ["only-llm"], "eps": [[1, 5]], "seeds": [0], "llm": spec,
                                       "dpkps": {"max_regenerations": 0}})
    register_backend(spec.llms[0], backend)
    try:
        df = stages.only_llm_documents.fn(spec, grid.grid_cells(spec)[0], {"0": "Club"}, str(tmp_path / "grid"))
    finally:
        register_backend(spec.llms[0], None)
    assert list(df["seed"]) == [seeds[1]] and df.attrs["quality"]["max_regenerations"] == 0


def test_only_llm_ablation_reaches_the_llm_through_the_generation_path(tmp_path, monkeypatch):
    """Concurrency and the API key's Secret block reach the backend like every method's, from [generation]."""
    from privseed.tasks.generation import drivers as generation
    from privseed.tasks.llm.base import ChatResult, LLMBackend

    specs = []

    class Answering(LLMBackend):
        name, model = "openai-compatible", "answering"

        def complete(self, requests, on_each=None):
            return [ChatResult(text="A memo about the new office hours for all staff.", tokens_in=1, tokens_out=2)
                    for _ in requests]

    from privseed.tasks.llm import service

    answering = Answering()
    monkeypatch.setattr(service, "get_backend", lambda spec: specs.append(spec) or answering)  # the one LLM service
    monkeypatch.setattr(generation, "get_backend", service.get_backend)
    df = only_llm_corpus("openai-compatible:http://127.0.0.1:9/v1#answering", "memo", {}, ["a"], 2, seed=0,
                         cache_uri=str(tmp_path / "cache"), llm_concurrency=7, llm_secret="my-block")
    assert dict(specs[0].options) == {"max_concurrency": 7, "secret_block": "my-block"}
    assert list(df["prompt_version"]) == ["only-llm-v1+class-name"] * 2  # the packaged template, naming "a"
    spec = grid.load_experiment(None, {"dataset": {"name": "x", "train": "t", "labels": [0]}, "methods": ["only-llm"],
                                       "eps": [[1, 5]], "seeds": [0], "llm": "local",
                                       "generation": {"llm_concurrency": 7, "llm_secret": "my-block"}})
    assert spec.generation == {"llm_concurrency": 7, "llm_secret": "my-block"}
    with pytest.raises(ConfigError, match=r"unknown \[generation\]"):
        grid.load_experiment(None, {"dataset": {"name": "x", "train": "t", "labels": [0]}, "methods": ["only-llm"],
                                    "eps": [[1, 5]], "seeds": [0], "llm": "local", "generation": {"top_k": 3}})


def test_deployable_entry_points_validate_their_config(prefect_harness):
    with pytest.raises(ConfigError, match=r"--colar: unknown option \(EvaluateConfig has no field 'colar'\)"):
        ev.evaluate({"synthetic": "OUT", "test": "t.parquet", "colar": True})
    with pytest.raises(ConfigError, match="--test: a value is required"):
        ev.evaluate({"synthetic": "OUT"})
    with pytest.raises(ConfigError, match="--coral needs --client"):
        ev.evaluate({"synthetic": "OUT", "test": "t.parquet", "coral": True})
    with pytest.raises(ConfigError, match=r"--seeds: .*greater than or equal to 0"):
        ex.experiment({"config_path": "experiments/dbpedia14_nollm.toml", "seeds": [-1]})


def test_experiment_options_replace_the_files_settings(monkeypatch, tmp_path):
    from privseed.tasks.config.commands import ExperimentConfig, validate_config

    try:
        grid.data_root()
    except ConfigError:  # PRIVSEED_DATA_ROOT unset: loading only resolves {data}, reads nothing
        monkeypatch.setenv("PRIVSEED_DATA_ROOT", str(tmp_path))
    path = str(grid.REPO / "experiments" / "dbpedia14_generation.toml")  # 3 LLMs, with and without class names
    plain = grid.load_experiment(path)
    cfg = validate_config(ExperimentConfig, {"config_path": path, "name": "other", "methods": "real,independent",
                                             "llm": "none", "class_names": "no", "classifier": "finetune",
                                             "synthetic_per_class": 7, "insecure_reproducible_noise": True,
                                             "max_regenerations": 8})
    spec = grid.load_experiment(cfg.config_path, ex.experiment_overrides(cfg))
    assert (spec.name, spec.methods, spec.llm, spec.class_names, spec.classifier) == (
        "other", ["real", "independent"], "none", [False], "finetune")
    assert {ds.synthetic_per_class for ds in spec.datasets} == {7} and spec.insecure_reproducible_noise
    # --max-regenerations joins the file's [dpkps] settings (which only-LLM's rounds follow) and keeps the others
    assert spec.dpkps == {**plain.dpkps, "max_regenerations": 8}
    assert (spec.eps, spec.seeds, spec.coral, spec.out) == (plain.eps, plain.seeds, plain.coral, plain.out)
    with pytest.raises(ConfigError, match="--classifier: Input should be 'mlp' or 'finetune'"):
        grid.load_experiment(None, {"dataset": {"name": "x", "train": "t", "labels": [0]}, "methods": ["real"],
                                    "eps": [[1, 5]], "seeds": [0], "classifier": "svm"})


def test_grid_over_llms_and_class_names_keeps_the_settings_apart(prefect_harness, tmp_path, monkeypatch):
    """The generation grid: `--llm none` seeds and a (fake) LLM, DP-KPS with and without the public class names,
    only-LLM naming the same classes; the table and cells say which setting each row is, and the LLM rows carry
    seed coverage, the degenerate rate and tokens/s."""
    from privseed.tasks.llm import register_backend
    from tests.test_evolution_flow import FakeBackend

    monkeypatch.setenv("PRIVSEED_CACHE_DIR", str(tmp_path / "cache"))
    topic_docs(30, seed=3).drop(columns="keyphrases").to_parquet(tmp_path / "train.parquet", index=False)
    topic_docs(8, seed=4).drop(columns="keyphrases").to_parquet(tmp_path / "test.parquet", index=False)
    (tmp_path / "names.toml").write_text('[class_names]\n0 = "Sport"\n1 = "Music record"\n2 = "Landscape"\n')
    (tmp_path / "grid.toml").write_text(
        'name = "gen"\nmethods = ["independent", "only-llm"]\neps = [[1, 5]]\nseeds = [0]\n'
        f'llm = ["none", "local:fake-grid"]\nclass_names = [false, true]\nmax_epochs = 5\ngate = false\n'
        f'out = "{tmp_path / "results"}"\n[generation]\nmax_tokens = 16\ntemperature = 0.7\n'
        '[dpkps]\nvocab_size = 50\nn_features = 50\n'
        f'[dataset]\nname = "tiny"\ntrain = "{tmp_path / "train.parquet"}"\ntest = "{tmp_path / "test.parquet"}"\n'
        'private_per_class = 12\nsynthetic_per_class = 2\nclass_names = "names.toml"\nlabels = [0, 1, 2]\n')
    spec = grid.load_experiment(str(tmp_path / "grid.toml"))
    assert spec.datasets[0].class_names == str(tmp_path / "names.toml")  # relative to the experiment file
    assert [c.id for c in grid.grid_cells(spec)] == [
        "tiny/independent/none/eps1+5/seed0", "tiny/independent/local_fake-grid/eps1+5/seed0",
        "tiny/independent+names/local_fake-grid/eps1+5/seed0", "tiny/only-llm/local_fake-grid/noeps/seed0"]
    backend = FakeBackend()
    register_backend("local:fake-grid", backend)
    try:
        result = ex.experiment({"config_path": str(tmp_path / "grid.toml"), "progress": False,
                                "cell_reports": True})
    finally:
        register_backend("local:fake-grid", None)
    # DP-KPS prompts with names state the topic in the only-LLM baseline's words, then the seed terms
    named = [p for p in backend.prompts if "It contains the following terms" in p]
    assert named and all(any(f"topic: {n}." in p for n in ("Sport", "Music record", "Landscape")) for p in named)
    only_llm = [p for p in backend.prompts if "topic: Landscape" in p and "following terms" not in p]
    assert len(only_llm) == 2  # only-LLM names the same classes
    cells = pd.read_csv(tmp_path / "results" / "gen" / "cells.csv")
    by_cell = cells[cells["classifier"] == "TF-IDF + LR"].set_index("cell")
    assert by_cell.loc["tiny/independent+names/local_fake-grid/eps1+5/seed0", "class_names"]
    assert not by_cell.loc["tiny/independent/local_fake-grid/eps1+5/seed0", "class_names"]
    llm_rows = by_cell[by_cell["llm"] != "none"]
    assert llm_rows["tokens_per_s"].gt(0).all() and llm_rows["degenerate_rate"].between(0, 1).all()
    assert llm_rows.loc[llm_rows["method"] == "independent", "coverage"].between(0, 1).all()
    assert by_cell.loc["tiny/independent/none/eps1+5/seed0", ["coverage", "tokens_per_s"]].isna().all()
    run = tmp_path / "results" / "gen" / "runs" / "tiny" / "independent+names" / "local_fake-grid" / "eps1+5" / "seed0"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["config"]["prompt_class_names"] == {"0": "Sport", "1": "Music record", "2": "Landscape"}
    assert "Prompts named the class" in (run / "report.html").read_text()
    plain = run.parents[3] / "independent" / "local_fake-grid" / "eps1+5" / "seed0"
    assert "Prompts named no class" in (plain / "report.html").read_text()
    md = open(result["markdown"]).read()
    assert "class names in prompt" in md and "| tiny | independent | local:fake-grid | yes |" in md
    with pytest.raises(ConfigError, match="needs a class_names file"):
        grid.load_experiment(None, {"dataset": {"name": "x", "train": "t", "labels": [0]}, "methods": ["independent"],
                                    "eps": [[1, 5]], "seeds": [0], "llm": "local", "class_names": [True]})
