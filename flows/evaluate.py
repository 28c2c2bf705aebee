"""Client-side evaluation flows: `evaluate` (one release) and `experiment` (a grid), plus their CLI.

`privseed evaluate --synthetic OUT --test PATH [--client PATH] [--coral] [--classifier mlp|finetune]`
trains downstream classifiers on the synthetic release only and scores them on the client's real test
set; `privseed experiment --config experiments/X.toml` runs methods x epsilon settings x seeds and
writes one table beside the paper's numbers, plus report.html files.

The flows only wire tasks; the math lives in tasks.classify, tasks.metrics and tasks.report.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from tasks import classify, metrics, report
from tasks.errors import ConfigError, CorpusError

log = logging.getLogger("privseed.evaluate")

CLASSIFIERS = ("mlp", "finetune", "tfidf")


# ================================================================ options
@dataclass
class EvalOptions:
    """What to train and how. `classifier` is the neural model; TF-IDF is always reported beside it."""

    classifier: str = "mlp"  # mlp | finetune
    tfidf: bool = True
    coral: bool = False
    test_view: str = "auto"  # auto | text | phrases (no-LLM ablation: test documents as phrase sequences)
    train: classify.TrainConfig = field(default_factory=classify.TrainConfig)
    embed_model: str = "minilm"
    device: str | None = None
    map_method: str = "tsne"  # tsne | pca (report's 2-D map)
    cache_dir: str | None = None

    def classifiers(self) -> list[str]:
        return [self.classifier] + (["tfidf"] if self.tfidf else [])


def _cache_dir(opts: EvalOptions) -> Path:
    root = opts.cache_dir or os.environ.get("PRIVSEED_CACHE_DIR") or str(Path.home() / ".cache" / "privseed")
    path = Path(root) / "embeddings"
    path.mkdir(parents=True, exist_ok=True)
    return path


# ================================================================ reading
def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def _local(path: str) -> str:
    return path[len("file://"):] if path.startswith("file://") else path


def _read_json(path: str) -> Any:
    import fsspec

    with fsspec.open(path, "r") as fh:
        return json.load(fh)


@dataclass
class Release:
    """A published release: its synthetic rows, manifest and ledger."""

    path: str
    rows: pd.DataFrame
    manifest: dict[str, Any]
    ledger: dict[str, Any] | None


def read_release(out: str) -> Release:
    """Read a release through its manifest (a release is complete iff manifest.json names it).

    Uses tasks.corpus.read_release when the foundation provides it; otherwise reads the parquet files
    the manifest lists under synthetic/ (verifying sha256 where the manifest records one).
    """
    out = out.rstrip("/")
    try:
        from tasks.corpus import read_release as corpus_read_release  # foundation's reader, once it exists
    except ImportError:
        corpus_read_release = None
    try:
        manifest = _read_json(f"{out}/manifest.json")
    except FileNotFoundError as exc:
        raise CorpusError(f"{out} is not a complete release: manifest.json is missing") from exc
    if corpus_read_release is not None:
        rows = corpus_read_release(out)
        rows = rows[0] if isinstance(rows, tuple) else rows
    else:
        rows = _read_release_files(out, manifest)
    for column in ("text", "label"):
        if column not in rows.columns:
            raise CorpusError(f"release {out} has no '{column}' column")
    if "keyphrases" not in rows.columns:
        rows = rows.assign(keyphrases=[[] for _ in range(len(rows))])
    try:
        ledger = _read_json(f"{out}/ledger.json")
    except FileNotFoundError:
        ledger = None
    return Release(out, rows.reset_index(drop=True), manifest, ledger)


def _manifest_files(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    files = manifest.get("files", [])
    if isinstance(files, dict):
        files = [{"path": k, **(v if isinstance(v, dict) else {})} for k, v in files.items()]
    return [f if isinstance(f, dict) else {"path": str(f)} for f in files]


def _read_release_files(out: str, manifest: dict[str, Any]) -> pd.DataFrame:
    import fsspec

    listed = [f for f in _manifest_files(manifest)
              if str(f.get("path", f.get("name", ""))).startswith("synthetic/")
              and str(f.get("path", f.get("name", ""))).endswith(".parquet")]
    if not listed:
        raise CorpusError(f"the manifest of {out} lists no synthetic/*.parquet file")
    frames = []
    for entry in sorted(listed, key=lambda f: str(f.get("path", f.get("name")))):
        rel = str(entry.get("path", entry.get("name")))
        with fsspec.open(f"{out}/{rel}", "rb") as fh:
            data = fh.read()
        if entry.get("sha256") and hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise CorpusError(f"{rel} in release {out} does not match the sha256 in its manifest")
        import io

        frames.append(pd.read_parquet(io.BytesIO(data)))
    return pd.concat(frames, ignore_index=True)


def read_labelled(path: str, text_column: str = "text", label_column: str = "label") -> pd.DataFrame:
    """A labelled corpus (test or client data) as columns text, label (+ label_name when present)."""
    try:
        from tasks.corpus import read_corpus
    except ImportError:
        read_corpus = None
    if read_corpus is not None:
        df = read_corpus(path, text_column=text_column, label_column=label_column)
    else:
        try:
            raw = pd.read_parquet(_local(path) if _is_local(path) else path)
        except (FileNotFoundError, OSError) as exc:
            raise CorpusError(f"cannot read corpus {path}: {type(exc).__name__}") from exc
        missing = [c for c in (text_column, label_column) if c not in raw.columns]
        if missing:
            raise CorpusError(f"corpus {path} has no column {missing[0]!r}")
        df = raw[[text_column, label_column]].rename(columns={text_column: "text", label_column: "label"})
    if df.empty:
        raise CorpusError(f"corpus {path} is empty")
    return df.reset_index(drop=True)


def label_names_from(path: str, label_column: str = "label") -> dict[str, str]:
    """label -> human name, from a `label_name` column when the file has one (public label set)."""
    try:
        raw = pd.read_parquet(_local(path) if _is_local(path) else path, columns=[label_column, "label_name"])
    except Exception:  # no label_name column: names are the labels themselves
        return {}
    return {str(k): str(v) for k, v in raw.drop_duplicates(label_column).itertuples(index=False)}


# ================================================================ tasks
@task(name="read-release", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def read_release_task(out: str) -> Release:
    return read_release(out)


@task(name="read-labelled-corpus", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def read_labelled_task(path: str, text_column: str = "text", label_column: str = "label") -> pd.DataFrame:
    return read_labelled(path, text_column, label_column)


def embed_cached(texts: Sequence[str], model: str, cache_dir: Path) -> np.ndarray:
    """Sentence embeddings (tasks.embedding, unit norm), cached on disk by the hash of model + texts."""
    from tasks.embedding import embed_texts

    digest = hashlib.sha256(("\x1e".join([model, *map(str, texts)])).encode("utf-8")).hexdigest()[:32]
    path = cache_dir / f"{digest}.npy"
    if path.exists():
        return np.load(path)
    if len(texts) == 0:
        return np.zeros((0, 384), dtype=np.float32)
    vectors = np.asarray(embed_texts(list(texts), model=model), dtype=np.float32)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, vectors)
    tmp.replace(path)
    return vectors


@task(name="embed", retries=1, cache_policy=NO_CACHE)
def embed_task(texts: list[str], model: str, cache_dir: str) -> np.ndarray:
    return embed_cached(texts, model, Path(cache_dir))


@task(name="phrase-view", cache_policy=NO_CACHE)
def phrase_view_task(texts: list[str], vocabulary: dict[str, Any]) -> list[str]:
    return phrase_view(texts, vocabulary)


def phrase_view(texts: Sequence[str], vocabulary: dict[str, Any]) -> list[str]:
    """No-LLM ablation: each document becomes its own phrase sequence (same extractor and public
    vocabulary as the release), joined by single spaces like a `--llm none` release's text."""
    try:
        from tasks.vocabulary import PhraseMatcher, load_vocabulary
    except ImportError as exc:
        raise ConfigError("the phrase view needs tasks.vocabulary (PhraseMatcher), which is not installed") from exc
    vocab = load_vocabulary(**vocabulary)
    matcher = PhraseMatcher(vocab)
    return [" ".join(seq) for seq in matcher.extract_many(list(texts))]


@task(name="train-and-predict", cache_policy=NO_CACHE)
def train_and_predict_task(kind: str, train_texts: list[str], train_labels: list[Any],
                           train_x: np.ndarray | None, predict_texts: list[str], predict_x: np.ndarray | None,
                           client_texts: list[str] | None, client_x: np.ndarray | None,
                           cfg: classify.TrainConfig, embed_model: str, device: str | None) -> dict[str, Any]:
    return train_and_predict(kind, train_texts, train_labels, train_x, predict_texts, predict_x,
                             client_texts, client_x, cfg, embed_model, device)


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
        clf = classify.train_mlp(train_x, train_labels, client_features=client_x, cfg=cfg, device=device)
        predictions = classify.predict_mlp(clf, predict_x)
        history, best_epoch = clf.history, clf.best_epoch
    elif kind == "finetune":
        from tasks.embedding import load_embedder

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


# ================================================================ the evaluation (wires tasks)
def classifier_label(kind: str, coral: bool) -> str:
    return {"mlp": "MLP on MiniLM", "finetune": "fine-tuned MiniLM", "tfidf": "TF-IDF + LR"}[kind] + (
        " + CORAL" if coral and kind != "tfidf" else "")


def score_corpus(train: pd.DataFrame, test: classify.HeldOutTestSet, *, client_texts: Sequence[str] | None,
                 opts: EvalOptions) -> dict[str, Any]:
    """Train every requested classifier on `train` (text, label) and score it on `test`.

    Runs inside a flow (it calls tasks). Test labels are read exactly once, after all training.
    Returns scores per classifier, predictions, embeddings (for the report) and training histories.
    """
    cache = str(_cache_dir(opts))
    train_texts = train["text"].astype(str).tolist()
    train_labels = train["label"].tolist()
    needs_vectors = opts.classifier == "mlp"
    train_x = embed_task(train_texts, opts.embed_model, cache)
    test_x = embed_task(test.texts, opts.embed_model, cache)
    client_x = None
    coral_client = list(client_texts) if (opts.coral and client_texts) else None
    if coral_client:
        client_x = embed_task(coral_client, opts.embed_model, cache)
    runs: dict[str, dict[str, Any]] = {}
    for kind in opts.classifiers():
        label = classifier_label(kind, opts.coral)
        runs[label] = train_and_predict_task(
            kind, train_texts, train_labels, train_x if needs_vectors else None, test.texts,
            test_x if needs_vectors else None, coral_client if kind != "tfidf" else None,
            client_x if kind != "tfidf" else None, opts.train, opts.embed_model, opts.device)
    # ---- all training is done: only now are the test labels read
    y_true = test.labels_for_scoring()
    scores = {}
    for label, run in runs.items():
        s = metrics.classification_scores(y_true, run["predictions"])
        s.update(n_train=len(train_texts), best_epoch=run["best_epoch"], seconds=run["seconds"])
        scores[label] = s
    return {"scores": scores, "runs": runs, "y_true": y_true, "train_x": train_x, "test_x": test_x}


def _label_display(label_names: dict[str, str]):
    return lambda v: label_names.get(str(v), str(v))


def _release_is_llm_free(release_rows: pd.DataFrame, manifest: dict[str, Any]) -> bool:
    config = manifest.get("config", {}) if isinstance(manifest, dict) else {}
    llm = str(config.get("llm", "")).lower() if isinstance(config, dict) else ""
    if llm:
        return llm == "none"
    return "backend" not in release_rows.columns or (release_rows["backend"].astype(str).str.lower() == "none").all()


def _vocabulary_config(manifest: dict[str, Any]) -> dict[str, Any]:
    config = manifest.get("config", {}) if isinstance(manifest, dict) else {}
    vocab = config.get("vocabulary", config.get("vocab")) if isinstance(config, dict) else None
    if isinstance(vocab, dict):
        return vocab
    if isinstance(vocab, str):
        return {"source": vocab}
    raise ConfigError("the release's manifest records no vocabulary; pass --test-view text")


def build_run_report(result: dict[str, Any], scored: dict[str, Any], release_rows: pd.DataFrame,
                     test_texts: Sequence[str], label_names: dict[str, str], *, manifest: dict[str, Any] | None,
                     ledger: dict[str, Any] | None, opts: EvalOptions, n_examples: int = 2) -> str:
    """All figures + HTML for one evaluation (post-processing of released data and aggregate scores)."""
    name = _label_display(label_names)
    figures: dict[str, str] = {}
    main_label = next(iter(scored["runs"]))
    real_xy, syn_xy = report.project_2d(scored["test_x"], scored["train_x"], method=opts.map_method,
                                        seed=opts.train.seed)
    figures["2-D map of real test vs synthetic embeddings (as the paper's Figure 5)"] = report.figure_to_data_uri(
        report.plot_embedding_map(real_xy, syn_xy, method=opts.map_method))
    figures["Document lengths in words"] = report.figure_to_data_uri(report.plot_length_histograms(
        metrics.word_lengths(test_texts), metrics.word_lengths(release_rows["text"].astype(str))))
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
            examples.append({"label_name": name(row["label"]), "keyphrases": list(row.get("keyphrases", []) or []),
                             "seed": row.get("seed"), "text": row["text"]})
    return report.render_run_report(result, figures=figures, ledger=ledger, manifest=manifest, examples=examples)


def _privacy_summary(ledger: dict[str, Any] | None) -> str:
    rows, total = report.ledger_rows(ledger)
    return total or (f"{len(rows)} ledger entries" if rows else "no ledger")


def choose_client_texts(client: pd.DataFrame, test_texts: Sequence[str], n_synthetic: int, seed: int) -> list[str]:
    """Unlabelled client documents for CORAL: disjoint from the test set, half as many as synthetic ones."""
    test_set = set(map(str, test_texts))
    texts = [t for t in client["text"].astype(str) if t not in test_set]
    n = max(2, n_synthetic // 2)
    if len(texts) > n:
        rng = np.random.default_rng(seed)
        texts = [texts[i] for i in sorted(rng.choice(len(texts), size=n, replace=False))]
    return texts


@flow(name="evaluate", log_prints=True)
def evaluate(synthetic: str, test: str, client: str | None = None, coral: bool = False,
             classifier: str = "mlp", json_path: str | None = None, report_path: str | None = None,
             test_view: str = "auto", seed: int = 0, max_epochs: int = 60, device: str | None = None,
             text_column: str = "text", label_column: str = "label", progress: bool = True) -> dict[str, Any]:
    """Train on the release at `synthetic` only; report accuracy and macro-F1 on the real test set."""
    if classifier not in ("mlp", "finetune"):
        raise ConfigError(f"--classifier must be mlp or finetune, not {classifier!r}")
    if coral and not client:
        raise ConfigError("--coral needs --client PATH (unlabelled client documents, disjoint from the test set)")
    opts = EvalOptions(classifier=classifier, coral=coral, test_view=test_view, device=device,
                       train=classify.TrainConfig(seed=seed, max_epochs=max_epochs, progress=progress))
    release = read_release_task(synthetic)
    test_df = read_labelled_task(test, text_column, label_column)
    label_names = label_names_from(test, label_column)
    view = test_view
    if view == "auto":
        view = "phrases" if _release_is_llm_free(release.rows, release.manifest) else "text"
    test_texts = test_df["text"].astype(str).tolist()
    client_texts = None
    if client:
        client_df = read_labelled_task(client, text_column, label_column) if _has_label(client, label_column) \
            else _read_unlabelled(client, text_column)
        client_texts = choose_client_texts(client_df, test_texts, len(release.rows), seed)
    if view == "phrases":
        vocab = _vocabulary_config(release.manifest)
        test_texts = phrase_view_task(test_texts, vocab)
        if client_texts:
            client_texts = phrase_view_task(client_texts, vocab)
    held_out = classify.HeldOutTestSet(test_texts, test_df["label"].tolist())
    scored = score_corpus(release.rows[["text", "label"]], held_out, client_texts=client_texts, opts=opts)
    real_for_fid = scored["test_x"]
    result: dict[str, Any] = {
        "title": f"release {synthetic}",
        "synthetic": synthetic, "test": test, "client": client if coral else None, "test_view": view,
        "n_train": len(release.rows), "n_test": len(held_out), "n_client": len(client_texts or []) if coral else 0,
        "scores": scored["scores"],
        "fid": metrics.frechet_distance(real_for_fid, scored["train_x"]),
        "corpus": {
            "synthetic": metrics.corpus_metrics(release.rows["text"].astype(str).tolist(),
                                                release.rows["keyphrases"].tolist()),
            "real test": metrics.corpus_metrics(held_out.texts),
        },
        "usage": metrics.llm_usage(release.rows),
        "privacy": _privacy_summary(release.ledger),
        "options": {"classifier": classifier, "coral": coral, "seed": seed, "train": opts.train.to_dict()},
    }
    html_text = build_run_report(result, scored, release.rows, held_out.texts, label_names,
                                 manifest=release.manifest, ledger=release.ledger, opts=opts)
    target = report_path or f"{synthetic.rstrip('/')}/report.html"
    _write_text(target, html_text)
    result["report"] = target
    if json_path:
        _write_text(json_path, json.dumps(result, indent=2, default=_json_default))
    for label, s in result["scores"].items():
        print(f"{label}: accuracy {100 * s['accuracy']:.1f}%  macro-F1 {100 * s['macro_f1']:.1f}%  (n_test={s['n_test']})")
    print(f"report: {target}")
    return result


def _has_label(path: str, label_column: str) -> bool:
    try:
        import pyarrow.parquet as pq

        return label_column in pq.read_schema(_local(path)).names
    except Exception:
        return True


def _read_unlabelled(path: str, text_column: str) -> pd.DataFrame:
    raw = pd.read_parquet(_local(path) if _is_local(path) else path, columns=[text_column])
    return raw.rename(columns={text_column: "text"})


def _write_text(path: str, text: str) -> None:
    import fsspec

    if _is_local(path):
        Path(_local(path)).parent.mkdir(parents=True, exist_ok=True)
    with fsspec.open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)
