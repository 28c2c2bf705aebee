"""`privseed evaluate`: the data recipient trains on a synthetic release only and scores on its real test set.

`privseed evaluate --synthetic OUT --test PATH [--client PATH] [--coral] [--classifier mlp|finetune]
                  [--real-train PATH]`

    release --read--> rows (text, label)            test set --read--> texts (labels held back)
         |                                               |  (no-LLM release: both as phrase sequences of V)
         +------> embed --> train MLP / fine-tune / TF-IDF (+ CORAL against client texts) --> predict
         +------> reference lines: TF-IDF on the seeds alone (and on --real-train's real documents) --> predict
                                                                                                |
                               test labels, read once, after all training --> scores --> report.html, JSON

The stages are in tasks/stages/evaluation.py, what they compute in tasks/evaluation/evaluation.py.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from prefect import flow

from privseed.tasks._runtime import apply_offline_defaults
from privseed.tasks.evaluation import classify
from privseed.tasks.config.commands import TYPED_FLOW, EvaluateConfig, flow_config
from privseed.tasks.evaluation.evaluation import (REAL_DOCUMENTS, build_run_report, choose_client_texts,
                                                  evaluation_result,
                                                  evaluation_summary, label_names_from, reference_training_sets,
                                                  resolve_test_view)
from privseed.tasks.data.release_reader import release_vocabulary, written_without_llm
from privseed.tasks.stages.artifacts import score_artifacts
from privseed.tasks.stages.evaluation import (load_client_texts, load_release, load_test_set, phrase_view, score_corpus,
                                              write_evaluation)


# The flow that deployments/prefect.yaml names (flows/evaluate.py:evaluate).
@flow(name="evaluate", log_prints=True, **TYPED_FLOW)
def evaluate(config: EvaluateConfig) -> dict[str, Any]:
    """Train on the release at `synthetic` only; report accuracy and macro-F1 on the real test set. ``config`` is
    typed (tasks/config/commands.py; a dict of fields is accepted; PRIVSEED_* variables fill what it leaves out, as on
    the
    command line)."""
    apply_offline_defaults()  # a run started by a deployment worker: the models and GX stay offline
    cfg = flow_config(EvaluateConfig, config)
    release = load_release(cfg.synthetic)
    test_set: pd.DataFrame = load_test_set(cfg.test, cfg.text_column, cfg.label_column)
    view = resolve_test_view(cfg.test_view, written_without_llm(release.rows, release.manifest))
    test_texts = test_set["text"].astype(str).tolist()
    client_texts = None
    if cfg.coral:
        assert cfg.client is not None  # EvaluateConfig requires --client with --coral
        client_texts = choose_client_texts(load_client_texts(cfg.client, cfg.text_column), test_texts,
                                           len(release.rows), cfg.seed)
    references = reference_training_sets(release.rows, test_texts, load_test_set(
        cfg.real_train, cfg.text_column, cfg.label_column) if cfg.real_train else None)
    if view == "phrases":
        vocabulary = release_vocabulary(release.manifest)
        test_texts = phrase_view(test_texts, vocabulary)
        client_texts = phrase_view(client_texts, vocabulary) if client_texts else client_texts
        if REAL_DOCUMENTS in references:
            real = references[REAL_DOCUMENTS]
            references[REAL_DOCUMENTS] = real.assign(text=phrase_view(real["text"].astype(str).tolist(), vocabulary))
    held_out = classify.HeldOutTestSet(test_texts, test_set["label"].tolist())
    scored = score_corpus(release.rows[["text", "label"]], held_out, client_texts=client_texts, opts=cfg,
                          references=references)
    label_names = label_names_from(cfg.test, cfg.label_column)
    result = evaluation_result(title=f"release {cfg.synthetic}", synthetic=cfg.synthetic, test=cfg.test,
                               client=cfg.client, test_view=view, rows=release.rows, test_texts=held_out.texts,
                               client_texts=client_texts, scored=scored, ledger=release.ledger, opts=cfg,
                               label_names=label_names)
    html = build_run_report(result, scored, release.rows, held_out.texts, label_names, manifest=release.manifest,
                            ledger=release.ledger, opts=cfg)
    result["report"] = cfg.report_uri
    write_evaluation(result, html, result["report"], cfg.json_path)
    score_artifacts(result)  # the scores (warnings first) and the report's link, in the Prefect UI
    return result


# ================================================================ CLI
def run_from_cli(cfg: EvaluateConfig) -> int:
    result = evaluate(cfg)
    print(evaluation_summary(result), flush=True)
    return 0
