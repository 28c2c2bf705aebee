"""Stages of the recipient's evaluation (tasks/evaluation/evaluation.py holds what they compute).

Everything here handles a release, the recipient's own test set and its unlabelled documents: public stages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from privseed.tasks.evaluation import classify, evaluation
from privseed.tasks.data import corpus
from privseed.tasks import jsonable, storage
from privseed.tasks.config.commands import EvaluationOptions
from privseed.tasks.errors import CorpusError
from privseed.tasks.data.release_reader import Release, read_release
from privseed.tasks.stages import public_stage


@public_stage("read-release", retries=2)
def load_release(out: str) -> Release:
    """The release at ``out``, read through its manifest."""
    return read_release(out)


@public_stage("read-labelled-corpus", retries=2)
def load_test_set(path: str, text_column: str = "text", label_column: str = "label") -> pd.DataFrame:
    """The recipient's real labelled test set (columns text, label)."""
    return corpus.read_corpus(path, text_column=text_column, label_column=label_column)


@public_stage("read-client-texts", retries=2)
def load_client_texts(path: str, text_column: str = "text") -> pd.DataFrame:
    """Unlabelled client documents: only the text column is read (labels, if any, are never used)."""
    frame = corpus.read_columns(path, [text_column]).rename(columns={text_column: "text"})
    if frame.empty:
        raise CorpusError(f"client corpus {path} is empty")
    return frame


@public_stage("embed", retries=1)
def embed(texts: list[str], model: str, cache_dir: str, progress: bool = False, desc: str = "embed") -> np.ndarray:
    return evaluation.embed_cached(texts, model, Path(cache_dir), progress=progress, desc=desc)


@public_stage("phrase-view")
def phrase_view(texts: list[str], vocabulary: dict[str, Any]) -> list[str]:
    return evaluation.phrase_view(texts, vocabulary)


@public_stage("train-and-predict")
def train_and_predict(kind: str, train_texts: list[str], train_labels: list[Any], train_x: np.ndarray | None,
                      predict_texts: list[str], predict_x: np.ndarray | None, client_texts: list[str] | None,
                      client_x: np.ndarray | None, cfg: classify.TrainConfig, embed_model: str,
                      device: str | None) -> dict[str, Any]:
    return evaluation.train_and_predict(kind, train_texts, train_labels, train_x, predict_texts, predict_x,
                                        client_texts, client_x, cfg, embed_model, device)


def score_corpus(train: pd.DataFrame, test: classify.HeldOutTestSet, *, client_texts: Sequence[str] | None,
                 opts: EvaluationOptions, references: Mapping[str, pd.DataFrame] | None = None) -> dict[str, Any]:
    """Train every requested classifier on `train` (text, label) and score it on `test`: embed, train each
    classifier (a stage each), and TF-IDF + LR on each of ``references`` (name -> text, label:
    ``evaluation.reference_training_sets``), and only then read the test labels, once.

    Returns scores per classifier and per reference, predictions, embeddings (for the report) and training
    histories.
    """
    cache = str(evaluation.embedding_cache_dir())
    train_texts = train["text"].astype(str).tolist()
    train_labels = train["label"].tolist()
    needs_vectors = opts.classifier == "mlp"
    train_x = embed(train_texts, opts.embedding_model, cache, opts.progress, "embed synthetic")
    test_x = embed(test.texts, opts.embedding_model, cache, opts.progress, "embed real test")
    client_x = None
    coral_client = list(client_texts) if (opts.coral and client_texts) else None
    if coral_client:
        client_x = embed(coral_client, opts.embedding_model, cache, opts.progress, "embed client")
    training = evaluation.train_config(opts)
    runs: dict[str, dict[str, Any]] = {}
    for kind in evaluation.classifier_kinds(opts):
        neural = kind != "tfidf"
        runs[evaluation.classifier_label(kind, opts.coral)] = train_and_predict(
            kind, train_texts, train_labels, train_x if needs_vectors else None, test.texts,
            test_x if needs_vectors else None, coral_client if neural else None, client_x if neural else None,
            training, opts.embedding_model, opts.device)
    reference_runs = {name: train_and_predict("tfidf", frame["text"].astype(str).tolist(), frame["label"].tolist(),
                                              None, test.texts, None, None, None, training, opts.embedding_model,
                                              opts.device)
                      for name, frame in (references or {}).items()}
    # ---- all training is done: only now are the test labels read
    y_true = test.labels_for_scoring()
    reference_scores = {name: evaluation.score_runs(y_true, {name: run}, len(references[name]))[name]
                        for name, run in reference_runs.items()} if references else {}
    return {"scores": evaluation.score_runs(y_true, runs, len(train_texts)), "runs": runs, "y_true": y_true,
            "train_x": train_x, "test_x": test_x, "reference_scores": reference_scores}


@public_stage("write-evaluation", retries=2)
def write_evaluation(result: dict[str, Any], html: str, report_path: str, json_path: str | None) -> None:
    """The report (and the result as JSON when asked), each written atomically."""
    storage.write_bytes(report_path, html.encode("utf-8"))
    if json_path:
        storage.write_bytes(json_path, jsonable.dumps(result, indent=2).encode("utf-8"))
