"""Stages of the experiment grid (tasks/evaluation/experiment.py says what a grid is,
tasks/evaluation/experiment_table.py how it is
tabulated): splitting a benchmark, the two baselines' training sets, scoring one cell and writing the table."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from privseed.tasks.evaluation import classify
from privseed.tasks.quality import metrics
from privseed.tasks import storage
from privseed.tasks.evaluation.baselines import only_llm_corpus, real_baseline
from privseed.tasks.errors import ConfigError
from privseed.tasks.config.commands import EvaluationOptions
from privseed.tasks.evaluation.evaluation import (build_run_report, choose_client_texts, evaluation_result,
                                                  generation_quality, term_lists)
from privseed.tasks.evaluation.experiment import (BASELINE_METHODS, PAPER_NUMBERS, CellLog, DatasetSpec, ExperimentSpec,
                                                  GridCell, PreparedData, declared_labels, grid_cells, grid_vocabulary,
                                                  prepare_data, round_timings)
from privseed.tasks.evaluation.experiment_table import aggregate_cells, build_experiment_report, table_markdown
from privseed.tasks.seeds.histogram_seeds import pair_coherence
from privseed.tasks.data.release_reader import Release, release_budget, release_llm_calls, release_vocabulary
from privseed.tasks.stages import private_stage, public_stage
from privseed.tasks.stages.evaluation import phrase_view, score_corpus


@private_stage("prepare-data")
def prepare_dataset(ds: DatasetSpec, work: str) -> PreparedData:
    """The dataset split into the private corpus, the client pool and the test split (files under ``work``)."""
    return prepare_data(ds, Path(work))


class GridData:
    """What every cell of a dataset shares, made when a cell first needs it: the prepared splits, the test set and
    client pool in each view (text, or phrase sequences of V), and the test documents' terms of V."""

    def __init__(self, spec: ExperimentSpec) -> None:
        self.spec = spec
        self._prepared: dict[str, PreparedData] = {}
        self._views: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
        self._terms: dict[str, list[list[str]]] = {}

    def prepared(self, ds: DatasetSpec) -> PreparedData:
        if ds.name not in self._prepared:
            self._prepared[ds.name] = prepare_dataset(ds, str(self.spec.out_dir))
        return self._prepared[ds.name]

    def views(self, ds: DatasetSpec, view: str, vocabulary: Callable[[], dict[str, Any]]
              ) -> tuple[list[str], list[str]]:
        """The test texts and the client pool, as text or as phrase sequences of ``vocabulary()`` (``view``)."""
        if (ds.name, view) not in self._views:
            data = self.prepared(ds)
            test_texts = data.test["text"].tolist()
            if view == "phrases":
                vocab = vocabulary()
                self._views[ds.name, view] = (phrase_view(test_texts, vocab), phrase_view(data.client_pool, vocab))
            else:
                self._views[ds.name, view] = (test_texts, list(data.client_pool))
        return self._views[ds.name, view]

    def test_terms(self, ds: DatasetSpec, vocabulary: Callable[[], dict[str, Any]]) -> list[list[str]]:
        """Each test document's terms of ``vocabulary()`` (the coherence metric's reference)."""
        if ds.name not in self._terms:
            self._terms[ds.name] = term_lists(self.prepared(ds).test["text"].tolist(), vocabulary())
        return self._terms[ds.name]

    def n_classes(self, datasets: set[str]) -> dict[str, int]:
        """Classes of each dataset's test split (the report's chance level); prepares the ones not yet prepared."""
        for ds in self.spec.datasets:
            if ds.name in datasets:
                self.prepared(ds)
        return {name: int(data.test["label"].nunique()) for name, data in self._prepared.items()}


def real_documents(spec: ExperimentSpec, cell: GridCell, data: PreparedData) -> pd.DataFrame:
    """The `real` baseline's training set; in a no-LLM grid as phrase sequences (the paper's Table 5 reference)."""
    train = real_baseline(data, cell.ds.synthetic_per_class, cell.seed)
    if cell.llm == "none":
        train = train.assign(text=phrase_view(train["text"].tolist(), grid_vocabulary(spec)))
    return train


@public_stage("only-llm", retries=2)
def only_llm_documents(spec: ExperimentSpec, cell: GridCell, label_names: dict[str, str],
                       run_dir: str) -> pd.DataFrame:
    """The only-LLM baseline's texts, from public values only (the declared labels and their public names,
    ``privseed.tasks.evaluation.baselines.only_llm_label_names``), judged and regenerated like the grid's DP-KPS
    releases; every
    call is cached under the cell's folder, so a retry or a re-run sends only the calls that never finished."""
    ds = cell.ds
    # As many regeneration (and rewrite) rounds as the grid's DP-KPS releases get ([dpkps] max_regenerations,
    # max_rewrites), so both arms drop the same kind of row after the same number of tries.
    rounds = spec.dpkps.get("max_regenerations")
    return only_llm_corpus(cell.llm, ds.doc_type, label_names, declared_labels(ds), ds.synthetic_per_class,
                           cell.seed, storage.join(run_dir, "_llm_cache"), max_regenerations=rounds,
                           max_rewrites=spec.dpkps.get("max_rewrites"), **spec.generation)


def score_cell(spec: ExperimentSpec, cell: GridCell, grid: GridData, train: pd.DataFrame, release: Release | None,
               release_s: float, started: float, cell_reports: bool) -> list[dict[str, Any]]:
    """Score one cell's training set on its dataset's real test split, without and/or with Deep CORAL: one
    record per classifier, plus the cell's report.html when asked (cells with a release only)."""
    ds, data = cell.ds, grid.prepared(cell.ds)
    view = "phrases" if cell.llm == "none" else "text"

    def vocabulary() -> dict[str, Any]:
        """The public V of the phrase view and of coherence: the release's (a PE release records none, and needs
        neither), the grid's for the baselines."""
        return release_vocabulary(release.manifest) if release is not None else grid_vocabulary(spec)

    test_texts, client_pool_view = grid.views(ds, view, vocabulary)
    client = choose_client_texts(pd.DataFrame({"text": data.client_pool}), data.test["text"], len(train), cell.seed)
    if view == "phrases":
        index = {t: i for i, t in enumerate(data.client_pool)}
        client = [client_pool_view[index[t]] for t in client]
    client = client[:len(train) // 2]
    facts = cell_facts(cell, train, release, release_s)
    corpus_stats = metrics.corpus_metrics(train["text"].astype(str).tolist())
    coherence = float("nan")  # seed sequences against the PUBLIC test split of their class (no pair: NaN)
    if "keyphrases" in train.columns and any(len(k) > 1 for k in train["keyphrases"]):
        coherence = pair_coherence([list(k) for k in train["keyphrases"]], train["label"].tolist(),
                                   grid.test_terms(ds, vocabulary), data.test["label"].tolist())
    records = []
    for coral in spec.coral:
        # classifier and test_view are plain strings in the spec, checked against EvaluationOptions when it loads
        opts = EvaluationOptions(classifier=spec.classifier, test_view=view,  # type: ignore[arg-type]
                                 tfidf=spec.tfidf, coral=coral, seed=cell.seed, max_epochs=spec.max_epochs,
                                 progress=False, map_method="pca")
        held_out = classify.HeldOutTestSet(test_texts, data.test["label"].tolist())
        scored = score_corpus(train[["text", "label"]], held_out, client_texts=client if coral else None, opts=opts)
        fid = metrics.frechet_distance(scored["test_x"], scored["train_x"])
        report_path = ""
        if cell_reports and release is not None:
            report_path = str(spec.out_dir / "runs" / cell.id / ("report-coral.html" if coral else "report.html"))
            result = evaluation_result(
                title=cell.id, synthetic=release.path, test=ds.test or ds.train,
                client="client pool (unlabelled training documents)", test_view=view, rows=train,
                test_texts=test_texts, client_texts=client, scored=scored, ledger=release.ledger, opts=opts,
                label_names=data.label_names)
            html = build_run_report(result, scored, train, test_texts, data.label_names, manifest=release.manifest,
                                    ledger=release.ledger, opts=opts)
            storage.write_bytes(report_path, html.encode("utf-8"))
        for label, s in scored["scores"].items():
            records.append({
                "cell": cell.id, "dataset": ds.name, "method": cell.method, "llm": cell.llm, "coral": coral,
                "class_names": cell.class_names, "variant": cell.variant, **facts["quality"],
                "classifier": label.replace(" + CORAL", ""), "seed": cell.seed,
                "eps_voc": None if cell.eps is None else cell.eps[0],
                "eps_kde": None if cell.eps is None else cell.eps[1],
                "accuracy": s["accuracy"], "macro_f1": s["macro_f1"], "n_train": len(train),
                "n_test": s["n_test"], "fid": fid, "distinct_2": corpus_stats["distinct_2"],
                "duplicate_rate": corpus_stats["duplicate_rate"], "coherence": coherence,
                "llm_calls": facts["llm_calls"], "tokens_out": facts["tokens_out"],
                "seconds": round(time.perf_counter() - started, 1), "budget": facts["budget"],
                "histogram_s_per_round": facts["timings"].get("histogram_s"),
                "llm_s_per_round": facts["timings"].get("llm_s"), "report": report_path,
            })
    return records


def cell_facts(cell: GridCell, train: pd.DataFrame, release: Release | None, release_s: float) -> dict[str, Any]:
    """What a cell cost and guarantees: LLM calls and output tokens, the guarantee in words, PE's seconds per
    round, and what the LLM made of its prompts."""
    if cell.method in BASELINE_METHODS:
        budget = "none (no private data)" if cell.method == "only-llm" else "none (real private documents)"
    else:
        budget = release_budget(release)
    usage = metrics.llm_usage(train)
    return {"llm_calls": release_llm_calls(release) if release is not None else usage["llm_calls"],
            "tokens_out": usage["tokens_out"], "budget": budget, "timings": round_timings(release),
            "quality": generation_quality(train, cell.llm, release_s)}


def tabulate(spec: ExperimentSpec, log: CellLog, grid: GridData) -> dict[str, Any]:
    """table.csv, cells.csv, table.md and report.html of the grid's finished cells. Reads what cells.jsonl holds
    now: other processes may have filled cells of the same grid."""
    wanted = {cell.id for cell in grid_cells(spec)}
    records = log.records()
    cells = pd.DataFrame(records).drop_duplicates(["cell", "classifier", "coral"], keep="last") if records else None
    if cells is not None:
        cells = cells[cells["cell"].isin(wanted)].reset_index(drop=True)
    if cells is None or cells.empty:
        raise ConfigError(f"no finished runs of experiment {spec.name} to tabulate")
    out = spec.out_dir
    paper = pd.read_csv(PAPER_NUMBERS)
    groups = {ds.name: ds.paper_group for ds in spec.datasets}
    table = aggregate_cells(cells, paper, groups)
    markdown = table_markdown(table)
    html = build_experiment_report(spec, table, cells, paper, groups, grid.n_classes(set(cells["dataset"])))
    storage.write_bytes(str(out / "table.csv"), table.drop(columns="values").to_csv(index=False).encode("utf-8"))
    storage.write_bytes(str(out / "cells.csv"), cells.to_csv(index=False).encode("utf-8"))
    storage.write_bytes(str(out / "table.md"), markdown.encode("utf-8"))
    storage.write_bytes(str(out / "report.html"), html.encode("utf-8"))
    print(markdown)
    print(f"table: {out / 'table.csv'} and {out / 'table.md'}; report: {out / 'report.html'}")
    return {"table": str(out / "table.csv"), "markdown": str(out / "table.md"), "report": str(out / "report.html"),
            "rows": table.to_dict("records")}

