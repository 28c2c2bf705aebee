"""`privseed experiment --config experiments/X.toml`: a grid of methods x epsilon settings x seeds, scored the
way the paper's tables were, written as one table beside the paper's numbers plus report.html files.

    experiments/X.toml --> grid cells (dataset x LLM x method x class names x variant x eps x seed)
    for each cell not yet in cells.jsonl:
        dataset --split once--> private corpus | client pool | real test split
        training set:  real documents | only-LLM texts | the method's release (dpkps / augpe / secpe subflow)
        score it on the test split (tasks/stages/evaluation.py, as `privseed evaluate` does) --> cells.jsonl
    cells.jsonl --> table.csv, table.md, report.html (mean +- sd over seeds, the paper's number beside)

Resumable: a finished cell's scores stay in cells.jsonl and its release in runs/<cell>/ (whose ledger re-reads
every drawn value), so a re-run only does the missing cells. This flow composes the method flows as subflows;
what it computes is in tasks/evaluation/experiment.py, tasks/evaluation/baselines.py,
tasks/evaluation/experiment_table.py and the stages in
tasks/stages/experiment.py.
"""

from __future__ import annotations

import time
from typing import Any

import pandas as pd
from prefect import flow

from privseed.flows.dpkps import dpkps_flow
from privseed.flows.evolution import augpe_flow, secpe_flow
from privseed.tasks.evaluation.baselines import only_llm_label_names
from privseed.tasks.config.commands import SWITCH_VALUES, TYPED_FLOW, ExperimentConfig, flow_config
from privseed.tasks.errors import ConfigError
from privseed.tasks.evaluation.experiment import (CellLog, ExperimentSpec, GridCell, PreparedData, grid_cells,
                                                  load_experiment, method_config, method_flow, record_release_seconds,
                                                  recorded_release_seconds)
from privseed.tasks.data.release_reader import Release
from privseed.tasks.stages.evaluation import load_release
from privseed.tasks.stages.experiment import GridData, only_llm_documents, real_documents, score_cell, tabulate

#: The flow that writes each method's release (privseed.tasks.evaluation.experiment.method_flow names it).
#: Each takes its own configuration model; a cell's config dict is validated into it by Prefect.
METHOD_FLOWS: dict[str, Any] = {"dpkps": dpkps_flow, "augpe": augpe_flow, "secpe": secpe_flow}


def experiment_overrides(cfg: ExperimentConfig) -> dict[str, Any]:
    """What the command line (an ExperimentConfig) replaces in the experiment file, as the file's settings; a
    field left unset replaces nothing."""
    llms = cfg.llm[0] if cfg.llm and len(cfg.llm) == 1 else cfg.llm
    overrides = {"name": cfg.name, "methods": cfg.methods, "seeds": cfg.seeds, "llm": llms,
                 "eps": [list(pair) for pair in cfg.eps] if cfg.eps else None, "classifier": cfg.classifier,
                 "coral": SWITCH_VALUES[cfg.coral] if cfg.coral else None,
                 "class_names": SWITCH_VALUES[cfg.class_names] if cfg.class_names else None, "out": cfg.out,
                 "synthetic_per_class": cfg.synthetic_per_class, "max_regenerations": cfg.max_regenerations,
                 "insecure_reproducible_noise": cfg.insecure_reproducible_noise,
                 "allow_insecure_release": cfg.allow_insecure_release}
    return {key: value for key, value in overrides.items() if value is not None}


# The flow that deployments/prefect.yaml names (flows/experiment.py:experiment).
@flow(name="experiment", log_prints=True, **TYPED_FLOW)
def experiment(config: ExperimentConfig, grid: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run a grid (datasets x methods x eps x seeds [x DA]) and write table.csv, table.md and report.html.

    ``config`` is an ExperimentConfig, typed (tasks/config/commands.py: the experiment file and what the command line
    replaces in it; a dict of fields is accepted); ``grid`` holds the file's settings inline (datasets, methods,
    sections), for callers without a file. Resumable: a finished cell's scores are kept in cells.jsonl and its
    release in runs/<cell>/ (whose ledger re-reads every drawn value), so a re-run only does the missing cells.
    """
    from tqdm.auto import tqdm

    cfg = flow_config(ExperimentConfig, config)
    spec = load_experiment(cfg.config_path, {**(grid or {}), **experiment_overrides(cfg)})
    log, shared = CellLog(spec.out_dir), GridData(spec)
    finished = log.finished()
    bar = tqdm(grid_cells(spec), desc=f"experiment {spec.name}", unit="run", disable=not cfg.progress)
    for cell in bar:
        bar.set_postfix_str(cell.id)
        if cell.id in finished or cfg.report_only:  # report_only: tabulate finished runs, start none
            continue
        data = shared.prepared(cell.ds)
        started = time.perf_counter()
        train, release, release_s = training_set(spec, cell, data)
        log.append(score_cell(spec, cell, shared, train, release, release_s, started, cfg.cell_reports))
    return tabulate(spec, log, shared)


def training_set(spec: ExperimentSpec, cell: GridCell, data: PreparedData
                 ) -> tuple[pd.DataFrame, Release | None, float]:
    """What a cell's classifiers train on, its release (None for the baselines) and the seconds it took to write
    (NaN when unknown): real documents, only-LLM texts, or the release its method's flow writes as a subflow
    (a finished release is reused, with the time recorded when it was written)."""
    run_dir = spec.out_dir / "runs" / cell.id
    if cell.method == "real":
        return real_documents(spec, cell, data), None, float("nan")
    started = time.perf_counter()
    if cell.method == "only-llm":
        texts = only_llm_documents(spec, cell, only_llm_label_names(cell.ds, data), str(run_dir))
        return texts, None, time.perf_counter() - started
    if not (run_dir / "manifest.json").exists():
        METHOD_FLOWS[method_flow(cell.method)](method_config(spec, cell, data, str(run_dir)))
        record_release_seconds(run_dir, time.perf_counter() - started)
    release = load_release(str(run_dir))
    return release.rows, release, recorded_release_seconds(run_dir)


# ================================================================ CLI
def run_from_cli(cfg: ExperimentConfig) -> int:
    if cfg.config_path is None:  # refused before a Prefect run starts: a command line has no inline grid
        raise ConfigError("--config: give the experiment file, e.g. --config experiments/dbpedia14_nollm.toml")
    experiment(cfg)
    return 0
