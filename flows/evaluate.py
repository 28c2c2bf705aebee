"""`privseed evaluate`: the data recipient trains on a synthetic release only and scores on its real test set.

`privseed evaluate --synthetic OUT --test PATH [--client PATH] [--coral] [--classifier mlp|finetune]`

    release --read--> rows (text, label)            test set --read--> texts (labels held back)
         |                                               |  (no-LLM release: both as phrase sequences of V)
         +------> embed --> train MLP / fine-tune / TF-IDF (+ CORAL against client texts) --> predict
                                                                                                |
                               test labels, read once, after all training --> scores --> report.html, JSON

The stages are in tasks/stages/evaluation.py, what they compute in tasks/evaluation.py.
"""

from __future__ import annotations

import argparse
from typing import Any

import pandas as pd

import privseed.tasks._runtime  # noqa: F401  (offline settings before prefect is imported)
from prefect import flow  # noqa: E402  (after privseed.tasks._runtime)

from privseed.tasks import classify
from privseed.tasks.config import EvaluateConfig, add_config_arguments, build_config, config_from_args
from privseed.tasks.evaluation import (build_run_report, choose_client_texts, evaluation_result,
                                       evaluation_summary, label_names_from, resolve_test_view)
from privseed.tasks.release_reader import release_vocabulary, written_without_llm
from privseed.tasks.stages.evaluation import (load_client_texts, load_release, load_test_set, phrase_view, score_corpus,
                                              write_evaluation)


# The flow that deployments/prefect.yaml names (flows/evaluate.py:evaluate).
@flow(name="evaluate", log_prints=True)
def evaluate(config: dict[str, Any]) -> dict[str, Any]:
    """Train on the release at `synthetic` only; report accuracy and macro-F1 on the real test set. ``config`` is
    an EvaluateConfig as a dict (tasks/config.py; PRIVSEED_* variables fill what it leaves out, as on the
    command line)."""
    cfg = build_config(EvaluateConfig, config)
    release = load_release(cfg.synthetic)
    test_set: pd.DataFrame = load_test_set(cfg.test, cfg.text_column, cfg.label_column)
    view = resolve_test_view(cfg.test_view, written_without_llm(release.rows, release.manifest))
    test_texts = test_set["text"].astype(str).tolist()
    client_texts = None
    if cfg.coral:
        assert cfg.client is not None  # EvaluateConfig requires --client with --coral
        client_texts = choose_client_texts(load_client_texts(cfg.client, cfg.text_column), test_texts,
                                           len(release.rows), cfg.seed)
    if view == "phrases":
        vocabulary = release_vocabulary(release.manifest)
        test_texts = phrase_view(test_texts, vocabulary)
        client_texts = phrase_view(client_texts, vocabulary) if client_texts else client_texts
    held_out = classify.HeldOutTestSet(test_texts, test_set["label"].tolist())
    scored = score_corpus(release.rows[["text", "label"]], held_out, client_texts=client_texts, opts=cfg)
    label_names = label_names_from(cfg.test, cfg.label_column)
    result = evaluation_result(title=f"release {cfg.synthetic}", synthetic=cfg.synthetic, test=cfg.test,
                               client=cfg.client, test_view=view, rows=release.rows, test_texts=held_out.texts,
                               client_texts=client_texts, scored=scored, ledger=release.ledger, opts=cfg,
                               label_names=label_names)
    html = build_run_report(result, scored, release.rows, held_out.texts, label_names, manifest=release.manifest,
                            ledger=release.ledger, opts=cfg)
    result["report"] = cfg.report_uri
    write_evaluation(result, html, result["report"], cfg.json_path)
    return result


# ================================================================ CLI
def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """``privseed evaluate``: every flag comes from EvaluateConfig (tasks/config.py), help and defaults included."""
    parser = subparsers.add_parser("evaluate", help="train on a synthetic release only; score on a real test set",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser, EvaluateConfig)
    parser.set_defaults(func=run_from_cli)


def run_from_cli(args: argparse.Namespace) -> int:
    result = evaluate(config_from_args(EvaluateConfig, args).model_dump())
    print(evaluation_summary(result), flush=True)
    return 0
