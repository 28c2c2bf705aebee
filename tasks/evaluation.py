"""The data recipient's evaluation of a synthetic corpus: what to train, on which view of the texts, and what
the scores, figures and report of one evaluation are.

A classifier is trained on synthetic (or, for the experiment's `real` baseline, real private) documents only
and scored on the recipient's real test set, whose labels are read once, after every classifier is trained
(``privseed.tasks.classify.HeldOutTestSet``). The Prefect stages around these functions are in
tasks/stages/evaluation.py; the `evaluate` flow (flows/evaluate.py) wires them.
"""

from __future__ import annotations

import hashlib
import io
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, get_args

import numpy as np
import pandas as pd

from privseed.tasks import classify, corpus, metrics, report, storage
from privseed.tasks.config import EvaluationOptions, NeuralClassifier
from privseed.tasks.errors import ConfigError

#: Every classifier an evaluation may train: the neural ones of --classifier, and TF-IDF + LR beside them.
CLASSIFIERS = (*get_args(NeuralClassifier), "tfidf")


def classifier_kinds(opts: EvaluationOptions) -> list[str]:
    """The classifiers an evaluation trains: ``--classifier``, and TF-IDF + LR beside it unless ``--no-tfidf``."""
    return [opts.classifier] + (["tfidf"] if opts.tfidf else [])


def train_config(opts: EvaluationOptions) -> classify.TrainConfig:
    """The neural classifiers' training settings: the classifier's own, with the evaluation's seed, epochs and
    progress bars."""
    return classify.TrainConfig(seed=opts.seed, max_epochs=opts.max_epochs, progress=opts.progress)


def embedding_cache_dir() -> Path:
    """Where sentence embeddings are cached: $PRIVSEED_CACHE_DIR, else ~/.cache/privseed."""
    root = os.environ.get("PRIVSEED_CACHE_DIR") or str(Path.home() / ".cache" / "privseed")
    path = Path(root) / "embeddings"
    path.mkdir(parents=True, exist_ok=True)
    return path


def embed_cached(texts: Sequence[str], model: str, cache_dir: Path) -> np.ndarray:
    """Sentence embeddings (privseed.tasks.embedding, unit norm), cached on disk by the hash of model + texts."""
    from privseed.tasks.embedding import embed_texts

    digest = hashlib.sha256(("\x1e".join([model, *map(str, texts)])).encode("utf-8")).hexdigest()[:32]
    path = cache_dir / f"{digest}.npy"
    if path.exists():
        return np.load(path)
    if len(texts) == 0:
        return np.zeros((0, 384), dtype=np.float32)
    vectors = np.asarray(embed_texts(list(texts), model=model), dtype=np.float32)
    buffer = io.BytesIO()
    np.save(buffer, vectors)
    storage.write_bytes(str(path), buffer.getvalue())  # atomic: concurrent grids share the cache
    return vectors


# ---------------------------------------------------------------- views of the texts
def _extractor(vocabulary: Mapping[str, Any]) -> tuple[Any, Any]:
    """The public vocabulary V a release recorded (``vocab``, ``vocab_top``) and its phrase matcher."""
    try:
        from privseed.tasks.vocabulary import load_vocabulary, phrase_matcher
    except ImportError as exc:
        raise ConfigError("the phrase view needs privseed.tasks.vocabulary, which this installation lacks") from exc
    spec = str(vocabulary.get("vocab", "english"))
    top = vocabulary.get("vocab_top")
    vocab = load_vocabulary(spec, int(top)) if top else load_vocabulary(spec)
    return vocab, phrase_matcher(vocab)


def phrase_view(texts: Sequence[str], vocabulary: Mapping[str, Any]) -> list[str]:
    """No-LLM ablation: each document becomes its own phrase sequence, extracted with the same greedy
    longest-match extractor and public vocabulary V as the release (recorded in its manifest), joined by
    single spaces like a `--llm none` release's text. V is public, so this costs no privacy."""
    vocab, matcher = _extractor(vocabulary)
    return [" ".join(vocab.terms[i] for i in ids) for ids in matcher.extract(texts)]


def term_lists(texts: Sequence[str], vocabulary: Mapping[str, Any]) -> list[list[str]]:
    """Each document's terms of the public vocabulary V (the release's extractor), for the coherence metric."""
    vocab, matcher = _extractor(vocabulary)
    return [[vocab.terms[i] for i in ids] for ids in matcher.extract(texts)]


def resolve_test_view(test_view: str, llm_free_release: bool) -> str:
    """``auto``: test documents as phrase sequences for a release written without an LLM, else as text."""
    if test_view == "auto":
        return "phrases" if llm_free_release else "text"
    return test_view


def choose_client_texts(client: pd.DataFrame, test_texts: Sequence[str], n_synthetic: int, seed: int) -> list[str]:
    """Unlabelled client documents for CORAL: disjoint from the test set, half as many as synthetic ones."""
    test_set = set(map(str, test_texts))
    texts = [t for t in client["text"].astype(str) if t not in test_set]
    n = max(2, n_synthetic // 2)
    if len(texts) > n:
        rng = np.random.default_rng(seed)
        texts = [texts[i] for i in sorted(rng.choice(len(texts), size=n, replace=False))]
    return texts


def label_names_from(path: str, label_column: str = "label") -> dict[str, str]:
    """label -> human name, from a `label_name` column when the (public) file has one; else no names."""
    if not {"label_name", label_column} <= set(corpus.column_names(path)):
        return {}
    raw = corpus.read_columns(path, [label_column, "label_name"])
    return {str(k): str(v) for k, v in raw.drop_duplicates(label_column).itertuples(index=False)}


# ---------------------------------------------------------------- training and scoring
def train_and_predict(kind: str, train_texts: Sequence[str], train_labels: Sequence[Any],
                      train_x: np.ndarray | None, predict_texts: Sequence[str], predict_x: np.ndarray | None,
                      client_texts: Sequence[str] | None, client_x: np.ndarray | None,
                      cfg: classify.TrainConfig, embed_model: str = "minilm",
                      device: str | None = None) -> dict[str, Any]:
    """Train one classifier on synthetic data (optionally CORAL against client data), predict texts.

    Takes the documents to predict without labels: it cannot look at test labels.
    """
    start = time.perf_counter()
    history: list[dict[str, float]] = []
    best_epoch = 0
    if kind == "mlp":
        assert train_x is not None and predict_x is not None  # the MLP's callers embed the texts first
        clf = classify.train_mlp(train_x, train_labels, client_features=client_x, cfg=cfg, device=device)
        predictions = classify.predict_mlp(clf, predict_x)
        history, best_epoch = clf.history, clf.best_epoch
    elif kind == "finetune":
        from privseed.tasks.embedding import load_embedder

        clf = classify.train_finetune(train_texts, train_labels, load_embedder(embed_model), client_texts=client_texts,
                                      cfg=cfg, device=device)
        predictions = classify.predict_finetune(clf, predict_texts)
        history, best_epoch = clf.history, clf.best_epoch
    elif kind == "tfidf":
        predictions = classify.tfidf_logreg_predict(train_texts, train_labels, predict_texts, seed=cfg.seed)
    else:
        raise ConfigError(f"unknown classifier {kind!r}; choose one of {', '.join(CLASSIFIERS)}")
    return {"predictions": list(predictions), "history": history, "best_epoch": best_epoch,
            "seconds": round(time.perf_counter() - start, 2)}


def classifier_label(kind: str, coral: bool) -> str:
    return {"mlp": "MLP on MiniLM", "finetune": "fine-tuned MiniLM", "tfidf": "TF-IDF + LR"}[kind] + (
        " + CORAL" if coral and kind != "tfidf" else "")


def score_runs(y_true: Sequence[Any], runs: Mapping[str, Mapping[str, Any]], n_train: int) -> dict[str, dict]:
    """Accuracy and macro-F1 of every trained classifier's predictions (called once, after all training)."""
    scores = {}
    for label, run in runs.items():
        s = metrics.classification_scores(y_true, run["predictions"])
        s.update(n_train=n_train, best_epoch=run["best_epoch"], seconds=run["seconds"])
        scores[label] = s
    return scores


def documents_vs_seeds(rows: pd.DataFrame, test: pd.DataFrame) -> tuple[float, float]:
    """Accuracy on the real test split of the same classifier (TF-IDF + LR) trained on the released documents,
    and on the released seeds alone (each row's keyphrases joined: what `--llm none` would release). Shows what
    the LLM step added or lost."""
    seeds = [" ".join(map(str, k)) for k in rows["keyphrases"]]
    scores = []
    for train_texts in (rows["text"].astype(str).tolist(), seeds):
        predicted = classify.tfidf_logreg_predict(train_texts, rows["label"].tolist(),
                                                  test["text"].astype(str).tolist(), seed=0)
        scores.append(metrics.classification_scores(test["label"].tolist(), predicted)["accuracy"])
    return scores[0], scores[1]


def generation_quality(train: pd.DataFrame, llm: str, release_s: float) -> dict[str, float | None]:
    """What the LLM made of its prompts, from the released rows: mean seed-term coverage (the measure best-of-k
    ranks by), the share of rows that are not documents (privseed.tasks.metrics.degenerate_rate: the one document
    predicate of the release gate, privseed.tasks.quality.document_rejection), and output tokens per second of release
    wall time (an end-to-end lower bound: for DP-KPS it includes the DP stage). None where it does not apply."""
    if llm == "none" or train.empty:
        return {"coverage": None, "degenerate_rate": None, "tokens_per_s": None, "release_s": None}
    keyphrases = [list(k) if k is not None and len(k) else [] for k in train["keyphrases"]]
    texts = train["text"].astype(str).tolist()
    seeded = [(t, k) for t, k in zip(texts, keyphrases) if k]
    coverage = float(np.mean([metrics.term_coverage(t, k) for t, k in seeded])) if seeded else None
    degenerate = metrics.degenerate_rate(texts, keyphrases)
    tokens = float(pd.to_numeric(train.get("tokens_out", pd.Series(dtype=float)), errors="coerce").sum())
    ok_time = release_s == release_s and release_s > 0
    return {"coverage": coverage, "degenerate_rate": degenerate,
            "tokens_per_s": tokens / release_s if ok_time and tokens else None,
            "release_s": round(release_s, 1) if ok_time else None}


# ---------------------------------------------------------------- the result and its report
def privacy_summary(ledger: Mapping[str, Any] | None) -> str:
    rows, total = report.ledger_rows(ledger)
    return total or (f"{len(rows)} ledger entries" if rows else "no ledger")


def evaluation_result(*, title: str, synthetic: str, test: str, client: str | None, test_view: str,
                      rows: pd.DataFrame, test_texts: Sequence[str], client_texts: Sequence[str] | None,
                      scored: Mapping[str, Any], ledger: Mapping[str, Any] | None,
                      opts: EvaluationOptions) -> dict[str, Any]:
    """The JSON-able result of one evaluation: scores, FID, corpus statistics, LLM usage and the guarantee."""
    return {
        "title": title, "synthetic": synthetic, "test": test, "client": client if opts.coral else None,
        "test_view": test_view, "n_train": len(rows), "n_test": len(test_texts),
        "n_client": len(client_texts or []) if opts.coral else 0,
        "scores": scored["scores"],
        "fid": metrics.frechet_distance(scored["test_x"], scored["train_x"]),
        "corpus": {
            "synthetic": metrics.corpus_metrics(rows["text"].astype(str).tolist(), rows["keyphrases"].tolist()),
            "real test": metrics.corpus_metrics(list(test_texts)),
        },
        "usage": metrics.llm_usage(rows),
        "privacy": privacy_summary(ledger),
        "options": {"classifier": opts.classifier, "coral": opts.coral, "seed": opts.seed,
                    "train": train_config(opts).to_dict()},
    }


def _label_display(label_names: Mapping[str, str]) -> Callable[[Any], str]:
    return lambda v: label_names.get(str(v), str(v))


def _as_list(value: Any) -> list[Any]:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return []
    return list(value)


def build_run_report(result: Mapping[str, Any], scored: Mapping[str, Any], release_rows: pd.DataFrame,
                     test_texts: Sequence[str], label_names: Mapping[str, str], *,
                     manifest: Mapping[str, Any] | None, ledger: Mapping[str, Any] | None, opts: EvaluationOptions,
                     n_examples: int = 2) -> str:
    """All figures + HTML for one evaluation (post-processing of released data and aggregate scores)."""
    name = _label_display(label_names)
    figures: dict[str, str] = {}
    main_label = next(iter(scored["runs"]))
    real_xy, syn_xy = report.project_2d(scored["test_x"], scored["train_x"], method=opts.map_method,
                                        seed=opts.seed)
    figures["2-D map of real test vs synthetic embeddings (as the paper's Figure 5)"] = report.figure_to_data_uri(
        report.plot_embedding_map(real_xy, syn_xy, method=opts.map_method))
    figures["Document lengths in words"] = report.figure_to_data_uri(report.plot_length_histograms(
        metrics.word_lengths(test_texts), metrics.word_lengths(release_rows["text"].astype(str)),
        real_label="real test" + (" as phrase sequences" if result.get("test_view") == "phrases" else "")))
    classes = sorted({*map(str, scored["y_true"]), *map(str, release_rows["label"])},
                     key=lambda v: (len(v), v))
    for label, run in scored["runs"].items():
        cm = metrics.label_confusion(scored["y_true"], run["predictions"], classes)
        acc = result["scores"][label]["accuracy"]
        figures[f"Confusion matrix, {label} (accuracy {100 * acc:.1f}%)"] = report.figure_to_data_uri(
            report.plot_confusion(cm, [name(c) for c in classes], title=f"{label} on the real test set"))
    if scored["runs"][main_label]["history"]:
        figures[f"Training of {main_label} (early stopping on a synthetic split)"] = report.figure_to_data_uri(
            report.plot_training_curve(scored["runs"][main_label]["history"], title=main_label))
    examples = []
    for _, group in release_rows.groupby("label", sort=True):
        for _, row in group.head(n_examples).iterrows():
            examples.append({"label_name": name(row["label"]), "keyphrases": _as_list(row.get("keyphrases")),
                             "seed": row.get("seed"), "text": row["text"]})
    return report.render_run_report(result, figures=figures, ledger=ledger, manifest=manifest, examples=examples)
