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
what it computes is in tasks/experiment.py, tasks/baselines.py, tasks/experiment_table.py and the stages in
tasks/stages/experiment.py.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import pandas as pd
import tasks._runtime  # noqa: F401  (offline settings before prefect is imported)
from prefect import flow  # noqa: E402  (after tasks._runtime)

from flows.dpkps import dpkps_flow
from flows.evolution import augpe_flow, secpe_flow
from tasks.baselines import only_llm_label_names
from tasks.errors import ConfigError
from tasks.experiment import (METHODS, CellLog, ExperimentSpec, GridCell, PreparedData, grid_cells,
                              load_experiment, method_config, method_flow, record_release_seconds,
                              recorded_release_seconds)
from tasks.release_reader import Release
from tasks.stages.evaluation import load_release
from tasks.stages.experiment import GridData, only_llm_documents, real_documents, score_cell, tabulate

#: The flow that writes each method's release (tasks.experiment.method_flow names it).
METHOD_FLOWS = {"dpkps": dpkps_flow, "augpe": augpe_flow, "secpe": secpe_flow}


# The flow that deployments/prefect.yaml names (flows/experiment.py:experiment).
@flow(name="experiment", log_prints=True)
def experiment(config_path: str | None = None, overrides: dict[str, Any] | None = None,
               cell_reports: bool = True, progress: bool = True, report_only: bool = False) -> dict[str, Any]:
    """Run a grid (datasets x methods x eps x seeds [x DA]) and write table.csv, table.md and report.html.

    Resumable: a finished cell's scores are kept in cells.jsonl and its release in runs/<cell>/ (whose
    ledger re-reads every drawn value), so a re-run only does the missing cells.
    """
    from tqdm.auto import tqdm

    spec = load_experiment(config_path, overrides)
    log, grid = CellLog(spec.out_dir), GridData(spec)
    finished = log.finished()
    bar = tqdm(grid_cells(spec), desc=f"experiment {spec.name}", unit="run", disable=not progress)
    for cell in bar:
        bar.set_postfix_str(cell.id)
        if cell.id in finished or report_only:  # report_only: tabulate finished runs, start none
            continue
        data = grid.prepared(cell.ds)
        started = time.perf_counter()
        train, release, release_s = training_set(spec, cell, data)
        log.append(score_cell(spec, cell, grid, train, release, release_s, started, cell_reports))
    return tabulate(spec, log, grid)


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
def register_cli(subparsers: argparse._SubParsersAction) -> None:
    ex = subparsers.add_parser("experiment", help="a grid of methods x epsilon x seeds, one table beside the paper")
    ex.add_argument("--config", dest="experiment_config", metavar="FILE", help="experiments/*.toml")
    ex.add_argument("--name")
    ex.add_argument("--methods", type=_csv, help="comma separated, of: " + ",".join(METHODS))
    ex.add_argument("--eps", type=_eps_pairs, help="eps_voc+eps_kde pairs, e.g. 1+5,5+5,1+10,5+10")
    ex.add_argument("--seeds", type=lambda s: [int(x) for x in _csv(s)], help="e.g. 0,1,2")
    ex.add_argument("--llm", type=_csv,
                    help="none | local | local:qwen2.5-coder-0.5b | anthropic:MODEL, or several, comma separated")
    ex.add_argument("--class-names", dest="class_names", choices=["no", "yes", "both"],
                    help="DP-KPS prompts without, with, or both without and with the dataset's public class names")
    ex.add_argument("--classifier", choices=["mlp", "finetune"])
    ex.add_argument("--coral", choices=["no", "yes", "both"], help="Deep CORAL: without, with, or both (Table 4)")
    ex.add_argument("--synthetic-per-class", type=int, metavar="N",
                    help="texts per class of every release (overrides [dataset]; give the grid another --name)")
    ex.add_argument("--out", help="results folder (default experiments/results)")
    ex.add_argument("--no-cell-reports", dest="cell_reports", action="store_false",
                    help="skip the per-run report.html files")
    ex.add_argument("--insecure-reproducible-noise", action="store_const", const=True,
                    help="research grids only: every method's noise from the cell's seed (bit-identical reruns); "
                         "releases are NOT differentially private and refused unless --allow-insecure-release")
    ex.add_argument("--allow-insecure-release", action="store_const", const=True,
                    help="publish the cells' releases made with --insecure-reproducible-noise anyway (stamped)")
    ex.add_argument("--report-only", action="store_true",
                    help="only tabulate the runs already finished (start none); missing runs show fewer seeds")
    ex.set_defaults(func=_experiment_from_cli)


def _csv(value: str) -> list[str]:
    return [x.strip() for x in value.split(",") if x.strip()]


def _eps_pairs(value: str) -> list[list[float]]:
    try:
        return [[float(a), float(b)] for a, b in (p.split("+") for p in _csv(value))]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--eps wants pairs like 1+5,5+10, got {value!r}") from exc


def _experiment_from_cli(args: argparse.Namespace) -> int:
    coral = {"no": [False], "yes": [True], "both": [False, True]}.get(args.coral) if args.coral else None
    names = {"no": [False], "yes": [True], "both": [False, True]}.get(args.class_names) if args.class_names else None
    llm = args.llm[0] if args.llm and len(args.llm) == 1 else args.llm
    overrides = {"name": args.name, "methods": args.methods, "eps": args.eps, "seeds": args.seeds, "llm": llm,
                 "classifier": args.classifier, "coral": coral, "class_names": names, "out": args.out,
                 "synthetic_per_class": args.synthetic_per_class,
                 "insecure_reproducible_noise": args.insecure_reproducible_noise,
                 "allow_insecure_release": args.allow_insecure_release}
    if not args.experiment_config and not args.methods:
        raise ConfigError("give --config experiments/X.toml (or at least --methods and a dataset in a config)")
    experiment(config_path=args.experiment_config, overrides=overrides, cell_reports=args.cell_reports,
               report_only=args.report_only)
    return 0
