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
import io
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
import tasks._runtime  # noqa: F401  (offline settings before prefect is imported)
from tasks import classify, corpus, metrics, report, storage
from tasks.histogram_seeds import pair_coherence
from tasks.errors import ConfigError, CorpusError, retry_if_transient
from prefect import flow, task  # noqa: E402  (after tasks._runtime)
from prefect.cache_policies import NO_CACHE  # noqa: E402

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
@dataclass
class Release:
    """A published release: its synthetic rows, manifest and ledger."""

    path: str
    rows: pd.DataFrame
    manifest: dict[str, Any]
    ledger: dict[str, Any] | None


def read_release(out: str, storage_options: dict[str, Any] | None = None) -> Release:
    """Read a release through its manifest (tasks.corpus.read_release verifies every part's sha256)."""
    manifest, rows = corpus.read_release(out, storage_options)
    for column in ("text", "label"):
        if column not in rows.columns:
            raise CorpusError(f"release {out} has no '{column}' column")
    if "keyphrases" not in rows.columns:
        rows = rows.assign(keyphrases=[[] for _ in range(len(rows))])
    ledger_uri = storage.join(out, "ledger.json")
    ledger = json.loads(storage.read_bytes(ledger_uri, storage_options)) if storage.exists(ledger_uri, storage_options) else None
    return Release(out, rows.reset_index(drop=True), manifest, ledger)


def read_labelled(path: str, text_column: str = "text", label_column: str = "label",
                  storage_options: dict[str, Any] | None = None) -> pd.DataFrame:
    """A labelled corpus (test or client data) as columns text, label."""
    return corpus.read_corpus(path, text_column=text_column, label_column=label_column,
                              storage_options=storage_options).reset_index(drop=True)


def label_names_from(path: str, label_column: str = "label") -> dict[str, str]:
    """label -> human name, from a `label_name` column when the file has one (public label set)."""
    try:
        raw = pd.concat([read_shard_columns(uri, [label_column, "label_name"]) for uri in corpus.list_shards(path)])
    except Exception:  # no label_name column (or not readable as such): names are the labels themselves
        return {}
    return {str(k): str(v) for k, v in raw.drop_duplicates(label_column).itertuples(index=False)}


# ================================================================ tasks
@task(name="read-release", retries=2, retry_condition_fn=retry_if_transient,
      retry_delay_seconds=2, cache_policy=NO_CACHE)
def read_release_task(out: str) -> Release:
    return read_release(out)


@task(name="read-labelled-corpus", retries=2, retry_condition_fn=retry_if_transient,
      retry_delay_seconds=2, cache_policy=NO_CACHE)
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
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npy")  # unique per process; the rename is atomic
    np.save(tmp, vectors)
    tmp.replace(path)
    return vectors


@task(name="embed", retries=1, retry_condition_fn=retry_if_transient,
      cache_policy=NO_CACHE)
def embed_task(texts: list[str], model: str, cache_dir: str) -> np.ndarray:
    return embed_cached(texts, model, Path(cache_dir))


@task(name="phrase-view", cache_policy=NO_CACHE)
def phrase_view_task(texts: list[str], vocabulary: dict[str, Any]) -> list[str]:
    return phrase_view(texts, vocabulary)


def phrase_view(texts: Sequence[str], vocabulary: dict[str, Any]) -> list[str]:
    """No-LLM ablation: each document becomes its own phrase sequence, extracted with the same greedy
    longest-match extractor and public vocabulary V as the release (recorded in its manifest), joined by
    single spaces like a `--llm none` release's text. V is public, so this costs no privacy."""
    try:
        from tasks.vocabulary import load_vocabulary, phrase_matcher
    except ImportError as exc:
        raise ConfigError("the phrase view needs tasks.vocabulary, which this installation lacks") from exc
    spec = str(vocabulary.get("vocab", vocabulary.get("source", "english")))
    top = vocabulary.get("vocab_top")
    vocab = load_vocabulary(spec, int(top)) if top else load_vocabulary(spec)
    matcher = phrase_matcher(vocab)
    return [" ".join(vocab.terms[i] for i in ids) for ids in matcher.extract(texts)]


def term_lists(texts: Sequence[str], vocabulary: dict[str, Any]) -> list[list[str]]:
    """Each document's terms of the public vocabulary V (the release's extractor), for the coherence metric."""
    from tasks.vocabulary import load_vocabulary, phrase_matcher

    spec = str(vocabulary.get("vocab", "english"))
    top = vocabulary.get("vocab_top")
    vocab = load_vocabulary(spec, int(top)) if top else load_vocabulary(spec)
    matcher = phrase_matcher(vocab)
    return [[vocab.terms[i] for i in ids] for ids in matcher.extract(texts)]


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
    vocab = config.get("vocab") if isinstance(config, dict) else None
    if not isinstance(vocab, str):
        raise ConfigError("the release's manifest records no vocabulary; pass --test-view text")
    return {"vocab": vocab, "vocab_top": config.get("vocab_top")}


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


def _as_list(value: Any) -> list[Any]:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return []
    return list(value)


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


EVALUATE_KEYS = ("synthetic", "test", "client", "coral", "classifier", "json_path", "report_path", "test_view",
                 "seed", "max_epochs", "device", "text_column", "label_column", "progress")


def evaluate_flow(config: dict[str, Any]) -> dict[str, Any]:
    """Run the `evaluate` flow from one JSON-able dict of its parameters (`release` is accepted for
    `synthetic`); unknown or missing settings are refused before anything runs."""
    values = dict(config)
    if "release" in values:
        values["synthetic"] = values.pop("release")
    unknown = sorted(set(values) - set(EVALUATE_KEYS))
    if unknown:
        raise ConfigError(f"unknown evaluate setting(s): {', '.join(unknown)}")
    missing = [k for k in ("synthetic", "test") if not values.get(k)]
    if missing:
        raise ConfigError(f"evaluate needs {' and '.join(missing)}")
    return evaluate(**values)


# The flow that deployments/prefect.yaml names (flows/evaluate.py:evaluate): typed, flat parameters.
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
        client_df = read_client_texts(client, text_column)
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



def read_shard_columns(uri: str, columns: list[str]) -> pd.DataFrame:
    import pyarrow.parquet as pq

    return pq.read_table(io.BytesIO(storage.read_bytes(uri)), columns=columns).to_pandas()


def read_client_texts(path: str, text_column: str = "text") -> pd.DataFrame:
    """Unlabelled client documents: only the text column is read (labels, if any, are never used)."""
    frames = [read_shard_columns(uri, [text_column]) for uri in corpus.list_shards(path)]
    df = pd.concat(frames, ignore_index=True).rename(columns={text_column: "text"})
    if df.empty:
        raise CorpusError(f"client corpus {path} is empty")
    return df


def _write_text(path: str, text: str) -> None:
    storage.write_bytes(path, text.encode("utf-8"))


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


# ================================================================ the experiment grid
REPO = Path(__file__).resolve().parents[1]
# The histogram methods (tasks/histogram_seeds.py) are privseed's own comparator on the same pipeline; they spend
# one budget, the cell's eps_voc + eps_kde, and the paper has no numbers for them.
HISTOGRAM_METHODS = ("histogram", "histogram-markov")
DPKPS_METHODS = ("independent", "iterative-linear", "iterative-log") + HISTOGRAM_METHODS
BASELINE_METHODS = ("real", "only-llm")
# Private evolution (flows/evolution.py). Aug-PE spends the cell's eps_voc + eps_kde on its voting rounds;
# AugPE+V~ spends eps_voc on the vocabulary V~ and eps_kde on the rounds (the same split as DP-KPS, Table 2);
# SecPE is run at the grid's (p, r), a different guarantee, so it is one cell per seed, not one per epsilon.
PE_METHODS = ("augpe", "augpe+v", "secpe")
METHODS = DPKPS_METHODS + BASELINE_METHODS + PE_METHODS
NO_EPSILON_METHODS = BASELINE_METHODS + ("secpe",)
LLM_METHODS = ("only-llm",) + PE_METHODS
PAPER_NUMBERS = REPO / "experiments" / "paper_numbers.csv"


def data_root() -> Path:
    """Where `{data}` in experiment files points: $PRIVSEED_DATA_ROOT, else the project's shared/data."""
    env = os.environ.get("PRIVSEED_DATA_ROOT")
    if env:
        return Path(env)
    for candidate in (REPO.parent / "shared" / "data", REPO.parent.parent / "shared" / "data"):
        if candidate.exists():
            return candidate
    raise ConfigError("cannot find the shared datasets: set PRIVSEED_DATA_ROOT")


@dataclass
class DatasetSpec:
    """One dataset of the grid. Binary stand-ins map `positive_column == positive_value` to 1, else 0."""

    name: str
    train: str
    test: str | None = None
    test_fraction: float = 0.3  # used only when `test` is absent (the train file is split with data_seed)
    private_per_class: int = 200
    synthetic_per_class: int = 100
    test_per_class: int | None = None
    label_column: str = "label"  # e.g. Yelp's "label1" (business category)
    positive_column: str | None = None
    positive_value: Any = None
    label_names: list[str] | None = None
    #: the declared label set (public configuration, never read from the data); binary stand-ins
    #: (positive_column) declare [0, 1] by construction
    labels: list[Any] | None = None
    # The owner's public class names (JSON/TOML/CSV, label -> name), for the grid's "with class names" cells:
    # DP-KPS gets them as --class-names, only-LLM names its topics with them. From configuration, not the data.
    class_names: str | None = None
    doc_type: str = "document"
    paper_group: str = "dbpedia14"  # which of the paper's datasets the numbers come from (dbpedia14 | medical)
    data_seed: int = 20240601
    public_size: int = 700  # SecPE's public corpus: this many unlabelled documents of the client pool


@dataclass
class ExperimentSpec:
    name: str
    datasets: list[DatasetSpec]
    methods: list[str]
    eps: list[tuple[float, float]]
    seeds: list[int]
    llm: str | list[str] = "none"  # one backend, or a list: the grid runs every method with each
    classifier: str = "mlp"
    tfidf: bool = True
    coral: list[bool] = field(default_factory=lambda: [False])
    max_epochs: int = 60
    dpkps: dict[str, Any] = field(default_factory=dict)  # passed to DpKpsConfig (vocab, length, bandwidth, ...)
    # LLM settings shared by every method that prompts (DP-KPS with an LLM, only-llm, the PE family), so the
    # methods compare on the same model, output length and temperature.
    generation: dict[str, Any] = field(default_factory=dict)  # max_tokens, temperature
    pe: dict[str, Any] = field(default_factory=dict)  # passed to Aug-PE and SecPE (iterations, variations, ...)
    secpe: dict[str, Any] = field(default_factory=dict)  # passed to SecPE only (p, r_over_p, clusters, secrets)
    # Table 2's protocol: every method releases synthetic_per_class texts per class AND spends the same number
    # of LLM calls. PE spends 1 + T K calls per released text, so DP-KPS gets best_of = 1 + T K candidates.
    match_calls: bool = True
    gate: bool = True  # the release gate of every method (a research grid on a weak model may switch it off)
    # Research grids that need bit-identical reruns: every method's noise from the cell's seed. Such releases are
    # NOT differentially private (stamped); they are published only with allow_insecure_release as well.
    insecure_reproducible_noise: bool = False
    allow_insecure_release: bool = False
    # DP-KPS with an LLM, without and/or with the dataset's public class names in the prompt (only-LLM always
    # names the class: it has nothing else to go on). Tables keep the two settings apart.
    class_names: list[bool] = field(default_factory=lambda: [False])
    # Named variants of DP-KPS generation, each a dict {"dpkps": {DpKpsConfig fields}, "llms": [...] (optional:
    # the backends it applies to)}; every DP-KPS cell with an LLM also runs once per variant.
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    out: str = "experiments/results"

    @property
    def out_dir(self) -> Path:
        return Path(self.out) / self.name

    @property
    def llms(self) -> list[str]:
        return [self.llm] if isinstance(self.llm, str) else list(self.llm)


def load_experiment(path: str | None, overrides: dict[str, Any] | None = None) -> ExperimentSpec:
    """Read an experiment TOML (see experiments/*.toml) and apply CLI overrides; validate up front."""
    import tomllib

    raw: dict[str, Any] = {}
    if path:
        file = Path(path)
        if not file.exists():
            raise ConfigError(f"experiment file {path} does not exist")
        try:
            raw = tomllib.loads(file.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"cannot parse {path}: {exc}") from exc
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    per_class = overrides.pop("synthetic_per_class", None)  # applies to every [dataset]
    raw.update(overrides)
    raw.setdefault("name", Path(path).stem if path else "experiment")
    if "{data}" in json.dumps(raw):
        raw = _substitute_data_root(raw, str(data_root()))
    datasets_raw = raw.pop("dataset", raw.pop("datasets", None))
    if datasets_raw is None:
        raise ConfigError("the experiment names no [dataset]")
    if isinstance(datasets_raw, dict):
        datasets_raw = [datasets_raw]
    datasets = []
    for d in datasets_raw:
        try:
            datasets.append(DatasetSpec(**d))
        except TypeError as exc:
            raise ConfigError(f"bad [dataset] entry: {exc}") from exc
        declared_labels(datasets[-1])  # refuse a dataset without declared labels before any cell runs
        if per_class is not None:
            datasets[-1].synthetic_per_class = int(per_class)
        names = datasets[-1].class_names
        if names and path and not Path(names).is_absolute() and "://" not in names:
            datasets[-1].class_names = str(Path(path).parent / names)  # relative to the experiment file
    try:
        spec = ExperimentSpec(datasets=datasets, **{k: v for k, v in raw.items()})
    except TypeError as exc:
        raise ConfigError(f"bad experiment setting: {exc}") from exc
    spec.eps = [tuple(float(x) for x in pair) for pair in spec.eps]
    spec.coral = [bool(c) for c in (spec.coral if isinstance(spec.coral, list) else [spec.coral])]
    unknown = [m for m in spec.methods if m not in METHODS]
    if unknown:
        raise ConfigError(f"unknown method(s) {unknown}; choose from {', '.join(METHODS)}")
    needs_llm = [m for m in spec.methods if m in LLM_METHODS]
    if needs_llm and all(llm == "none" for llm in spec.llms):
        raise ConfigError(f"method(s) {', '.join(needs_llm)} prompt an LLM; set llm (local | anthropic:MODEL | ...)")
    if not spec.llms:
        raise ConfigError("llm is an empty list; give at least one backend (none | local | ...)")
    spec.class_names = [bool(c) for c in (spec.class_names if isinstance(spec.class_names, list)
                                          else [spec.class_names])]
    if True in spec.class_names:
        unnamed = [ds.name for ds in spec.datasets if not ds.class_names]
        if unnamed:
            raise ConfigError(f"class_names = true needs a class_names file in [dataset] {', '.join(unnamed)}")
    for name, variant in spec.variants.items():
        unknown = sorted(set(variant) - {"dpkps", "llms"})
        if unknown or not isinstance(variant.get("dpkps", {}), dict):
            raise ConfigError(f"variant {name!r}: give a [variants.{name}.dpkps] table (and optional llms), "
                              f"not {unknown}")
    unknown_generation = sorted(set(spec.generation) - {"max_tokens", "temperature"})
    if unknown_generation:
        raise ConfigError(f"unknown [generation] setting(s) {unknown_generation}; choose max_tokens, temperature")
    for section, model in (("pe", "AugPeConfig"), ("secpe", "SecPeConfig")):
        _check_section(getattr(spec, section), section, model)
    for key in ("gate", "insecure_reproducible_noise", "allow_insecure_release"):
        if key in spec.dpkps:
            raise ConfigError(f"set `{key}` at the top level, not in [dpkps] (it applies to every method)")
    if any(len(p) != 2 or min(p) <= 0 for p in spec.eps):
        raise ConfigError("eps must be a list of [eps_voc, eps_kde] pairs, each > 0")
    if not spec.seeds:
        raise ConfigError("give at least one seed")
    if spec.classifier not in ("mlp", "finetune"):
        raise ConfigError(f"classifier must be mlp or finetune, not {spec.classifier!r}")
    return spec


def declared_labels(ds: DatasetSpec) -> list[Any]:
    """The dataset's declared label set: ``labels`` of its [dataset] entry, or [0, 1] for a binary stand-in
    (``positive_column``). Never read from the data: the methods refuse to run without a declared set."""
    if ds.labels is not None:
        if not ds.labels:
            raise ConfigError(f"[dataset] {ds.name}: labels is empty; list every label, e.g. labels = [0, 1, 2]")
        return list(ds.labels)
    if ds.positive_column:
        return [0, 1]
    raise ConfigError(f"[dataset] {ds.name} declares no labels: add `labels = [...]` to its entry (e.g. labels = "
                      "[0, 1, 2] for an integer label column); the label set is configuration, never read from the data")


# Fields an experiment sets itself for every cell; a [pe] or [secpe] section may not override them.
_CELL_FIELDS = {"data", "out", "seed", "per_class", "llm", "doc_type", "epsilon", "eps_voc", "vocab_words", "public",
                "gate", "max_tokens", "temperature", "insecure_reproducible_noise", "allow_insecure_release",
                "labels", "labels_file"}


def _check_section(values: dict[str, Any], section: str, model: str) -> None:
    """Refuse unknown or cell-owned keys in [pe] / [secpe] before any run starts (not at the first PE cell)."""
    from flows import evolution

    fields = set(getattr(evolution, model).model_fields)
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ConfigError(f"unknown [{section}] setting(s) {unknown}")
    owned = sorted(set(values) & _CELL_FIELDS)
    if owned:
        raise ConfigError(f"[{section}] may not set {owned}: the grid sets them per cell "
                          "(budget from eps, texts from synthetic_per_class, LLM settings from [generation])")


def calls_per_text(spec: ExperimentSpec) -> int:
    """LLM calls a PE method spends per released text: N (K+1) RANDOM + (T-1) N K VARIATION per class = N (1 + T K)."""
    from tasks.config import AugPeConfig
    from tasks.evolution import evolution_call_plan

    defaults = AugPeConfig.model_fields
    t = int(spec.pe.get("iterations", defaults["iterations"].default))
    k = int(spec.pe.get("variations", defaults["variations"].default))
    return evolution_call_plan(classes=1, population=1, variations=k, iterations=t)["total"]


def dpkps_best_of(spec: ExperimentSpec, llm: str | None = None) -> int:
    """DP-KPS's candidates per seed: matched to PE's calls per text when the grid compares them (Table 2)."""
    explicit = spec.dpkps.get("best_of")
    llm = spec.llms[0] if llm is None else llm
    if not (spec.match_calls and any(m in PE_METHODS for m in spec.methods)) or llm == "none":
        return int(explicit or 1)
    matched = calls_per_text(spec)
    if explicit is not None and int(explicit) != matched:
        raise ConfigError(f"[dpkps] best_of = {explicit} but match_calls needs {matched} (= 1 + T K of [pe]); "
                          "remove best_of or set match_calls = false")
    if matched > 16:
        raise ConfigError(f"match_calls needs best_of = {matched} > 16 (DP-KPS's limit): lower [pe] iterations or "
                          "variations, or set match_calls = false")
    return matched


def _substitute_data_root(value: Any, root: str) -> Any:
    """Replace `{data}` in every string of the experiment file (datasets, [dpkps] vocab paths, ...)."""
    if isinstance(value, str):
        return value.replace("{data}", root)
    if isinstance(value, list):
        return [_substitute_data_root(v, root) for v in value]
    if isinstance(value, dict):
        return {k: _substitute_data_root(v, root) for k, v in value.items()}
    return value


@dataclass
class PreparedData:
    """The private corpus (for the release), the client's unlabelled pool, and its held-out test set."""

    private_path: str
    private: pd.DataFrame
    client_pool: list[str]
    test: pd.DataFrame
    label_names: dict[str, str]
    public_path: str  # SecPE's public corpus: unlabelled documents of the client pool (text column only)


def _balanced_sample(df: pd.DataFrame, per_class: int | None, rng: np.random.Generator) -> pd.DataFrame:
    if per_class is None:
        return df
    parts = []
    for _, group in df.groupby("label", sort=True):
        take = min(per_class, len(group))
        parts.append(group.iloc[np.sort(rng.choice(len(group), size=take, replace=False))])
    return pd.concat(parts)


def prepare_data(ds: DatasetSpec, work: Path) -> PreparedData:
    """Split public benchmark data into the three roles of the paper's protocol, with a fixed data seed.

    private: `private_per_class` labelled documents per class (the data owner's corpus);
    client pool: the remaining training documents, unlabelled (Deep CORAL's D_B), disjoint from test;
    test: the real test split (or a seeded split of the file when the dataset ships no test split).
    """
    rng = np.random.default_rng(ds.data_seed)
    raw_train = pd.concat([pd.read_parquet(uri) if not storage.is_remote(uri)
                           else pd.read_parquet(io.BytesIO(storage.read_bytes(uri)))
                           for uri in corpus.list_shards(ds.train)], ignore_index=True)
    if ds.test:
        raw_test = pd.concat([pd.read_parquet(uri) for uri in corpus.list_shards(ds.test)], ignore_index=True)
    else:
        order = rng.permutation(len(raw_train))
        n_test = int(round(len(raw_train) * ds.test_fraction))
        raw_test, raw_train = raw_train.iloc[order[:n_test]], raw_train.iloc[order[n_test:]]

    def labelled(df: pd.DataFrame) -> pd.DataFrame:
        if ds.positive_column:
            column = df[ds.positive_column]
            positive = column.astype(str) == str(ds.positive_value)
            return pd.DataFrame({"text": df["text"].astype(str), "label": positive.astype(int)})
        return pd.DataFrame({"text": df["text"].astype(str), "label": df[ds.label_column]})

    train, test = labelled(raw_train).reset_index(drop=True), labelled(raw_test).reset_index(drop=True)
    if ds.label_names:
        names = {str(i): n for i, n in enumerate(ds.label_names)}
    elif "label_name" in raw_train.columns and not ds.positive_column:
        names = {str(k): str(v) for k, v in raw_train[["label", "label_name"]].drop_duplicates("label").itertuples(index=False)}
    else:
        names = {}
    private = _balanced_sample(train, ds.private_per_class, rng)
    test = _balanced_sample(test, ds.test_per_class, rng).reset_index(drop=True)
    test_texts = set(test["text"])
    client_pool = [t for t in train.drop(index=private.index)["text"] if t not in test_texts]
    private = private.reset_index(drop=True)
    # Drawn after the splits above, so adding it left every earlier private/test split unchanged.
    take = min(ds.public_size, len(client_pool))
    public = pd.DataFrame({"text": [client_pool[i] for i in np.sort(rng.choice(len(client_pool), size=take,
                                                                                 replace=False))]})
    folder = work / "data" / ds.name
    path = _write_parquet_atomic(private, folder / "private.parquet")
    public_path = _write_parquet_atomic(public, folder / "public.parquet")
    return PreparedData(str(path), private, client_pool, test, names, str(public_path))


def _write_parquet_atomic(frame: pd.DataFrame, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.parquet")  # concurrent grids share this file
    frame.to_parquet(tmp, index=False)
    tmp.replace(path)
    return path


@task(name="prepare-data", cache_policy=NO_CACHE)
def prepare_data_task(ds: DatasetSpec, work: str) -> PreparedData:
    return prepare_data(ds, Path(work))


def cell_id(dataset: str, method: str, eps: tuple[float, float] | None, seed: int, llm: str,
            class_names: bool = False, variant: str = "") -> str:
    """The run's id (and folder under runs/). Class names and variants are marked on the method, so cells
    of grids that had neither keep their ids."""
    eps_part = "noeps" if eps is None else f"eps{eps[0]:g}+{eps[1]:g}"
    marks = (f"+{variant}" if variant else "") + ("+names" if class_names and method != "only-llm" else "")
    return f"{dataset}/{method}{marks}/{llm.replace(':', '_').replace('/', '_')}/{eps_part}/seed{seed}"


@dataclass(frozen=True)
class GridCell:
    """One run of the grid: a method on a dataset at a budget and seed, with one LLM, with or without the
    public class names in its prompts, in one generation variant ("" = the defaults)."""

    ds: DatasetSpec
    method: str
    eps: tuple[float, float] | None
    seed: int
    llm: str
    class_names: bool = False
    variant: str = ""

    @property
    def id(self) -> str:
        return cell_id(self.ds.name, self.method, self.eps, self.seed, self.llm, self.class_names, self.variant)


def grid_cells(spec: ExperimentSpec) -> list[GridCell]:
    """Every run of the grid, in order: datasets x LLMs x methods x (class names) x (variants) x eps x seeds.
    Methods that prompt an LLM are skipped for ``none``; only-LLM always names the class; class names and
    variants apply to DP-KPS with an LLM only."""
    plan = []
    for ds in spec.datasets:
        for llm in spec.llms:
            for method in spec.methods:
                if method in LLM_METHODS and llm == "none":
                    continue
                dpkps_llm = method in DPKPS_METHODS and llm != "none"
                names = [True] if method == "only-llm" else spec.class_names if dpkps_llm else [False]
                variants = [""] + [v for v, d in spec.variants.items() if llm in d.get("llms", [llm])] \
                    if dpkps_llm else [""]
                for with_names in dict.fromkeys(names):
                    for variant in variants:
                        for eps in ([None] if method in NO_EPSILON_METHODS else spec.eps):
                            for seed in spec.seeds:
                                plan.append(GridCell(ds, method, eps, seed, llm, with_names, variant))
    return plan


def generate_release(spec: ExperimentSpec, ds: DatasetSpec, data: PreparedData, method: str,
                     eps: tuple[float, float] | None, seed: int, out: Path, llm: str | None = None,
                     class_names: bool = False, variant: str = "") -> Release:
    """Run the method's flow (as a subflow) on the private split; reuse a finished release (and its ledger).

    Every method gets the same texts per class, LLM, [generation] settings and release gate; the budget split
    is the one written next to PE_METHODS."""
    llm = spec.llms[0] if llm is None else llm
    if not (out / "manifest.json").exists():
        common = {"data": data.private_path, "out": str(out), "seed": seed, "per_class": ds.synthetic_per_class,
                  "llm": llm, "doc_type": ds.doc_type, "gate": spec.gate, **spec.generation,
                  "insecure_reproducible_noise": spec.insecure_reproducible_noise,
                  "allow_insecure_release": spec.allow_insecure_release,
                  "labels": [str(label) for label in declared_labels(ds)]}
        if method in DPKPS_METHODS:
            from flows.dpkps import dpkps_flow

            assert eps is not None
            budget = {"epsilon": eps[0] + eps[1]} if method in HISTOGRAM_METHODS else {}
            extra = dict(spec.variants[variant].get("dpkps", {})) if variant else {}
            if class_names:
                extra["class_names"] = ds.class_names
            dpkps_flow({**spec.dpkps, **common, **extra, "method": method, "eps_voc": eps[0], "eps_kde": eps[1],
                        "best_of": dpkps_best_of(spec, llm), **budget})
        elif method in ("augpe", "augpe+v"):
            from flows.evolution import run_augpe

            assert eps is not None
            budget = ({"epsilon": eps[0] + eps[1]} if method == "augpe" else
                      {"epsilon": eps[1], "vocab_words": True, "eps_voc": eps[0],
                       **{k: spec.dpkps[k] for k in ("vocab", "vocab_top", "first_terms", "vocab_size")
                          if k in spec.dpkps}})
            run_augpe({**spec.pe, **common, **budget})
        elif method == "secpe":
            from flows.evolution import run_secpe

            run_secpe({**spec.pe, **spec.secpe, **common, "public": data.public_path})
        else:
            raise ConfigError(f"method {method!r} writes no release")
    return read_release(str(out))


def release_llm_calls(release: Release) -> float:
    """LLM calls behind a release: PE records its RANDOM + VARIATION calls in evolution.json (the released rows
    are only the survivors); DP-KPS rows carry their best-of candidates."""
    info_uri = storage.join(release.path, "evolution.json")
    if storage.exists(info_uri):
        calls = json.loads(storage.read_bytes(info_uri))["llm_calls"]
        return float(calls["random"] + calls["variation"])
    return metrics.llm_usage(release.rows)["llm_calls"]


def release_budget(release: Release | None) -> str:
    """The guarantee of a release in words, from its ledger (SecPE: the (p, r) statement, not an epsilon)."""
    if release is None or not release.ledger:
        return "none (not private)" if release is None else "no ledger"
    entries = release.ledger.get("entries", [])
    secpe = next((e for e in entries if e.get("name") == "secpe.schedule"), None)
    if secpe:
        protection = secpe["params"]["secret_protection"]
        return (f"(p, r) = ({protection['p']:g}, {protection['r']:g}), sigma {secpe['params']['sigma']:.3g}; "
                f"DP eps {secpe['epsilon']:.3g} only if rho, sigma are fixed")
    total = release.ledger.get("total", {})
    eps, delta = float(total.get("epsilon", float("nan"))), float(total.get("delta", 0.0))
    if total.get("secure") is False:
        from tasks.mechanisms import INSECURE_STAMP

        return f"{INSECURE_STAMP} (reproducible noise; eps {eps:.3g} is not a guarantee)"
    return f"eps {eps:.3g}" + (f", delta {delta:.2g}" if delta > 0 else " (pure)")


def round_timings(release: Release | None, state: str | None = None) -> dict[str, float]:
    """Mean seconds per voting round of a PE run: its histogram step, embedding and LLM calls. The flows keep these
    out of the release (the histogram step grows with the private corpus size) and write them to the operator's
    private state, ``state`` (default: the run's ``--state``, else ``OUT.private`` beside the release)."""
    if release is None:
        return {}
    from flows.evolution import OPERATOR_TIMINGS
    from tasks.identity import default_state_uri

    state = state or release.manifest.get("config", {}).get("state") or default_state_uri(release.path)
    info_uri = storage.join(state, OPERATOR_TIMINGS)
    if not storage.exists(info_uri):
        return {}
    rounds = json.loads(storage.read_bytes(info_uri)).get("rounds", [])
    if not rounds:
        return {}
    return {key: float(np.mean([r[key] for r in rounds])) for key in ("histogram_s", "embed_s", "llm_s")}


def real_baseline(data: PreparedData, per_class: int, seed: int) -> pd.DataFrame:
    """The same classifier trained on as many real documents (drawn from the private split)."""
    sample = _balanced_sample(data.private, per_class, np.random.default_rng(seed))
    return sample.assign(keyphrases=[[] for _ in range(len(sample))]).reset_index(drop=True)


def only_llm_prompt(doc_type: str, class_name: str) -> str:
    """Appendix C.2.3's only-LLM ablation: no seed at all, so (unlike DP-KPS) the prompt names the class."""
    return f"Write a {doc_type} about the following topic: {class_name}."


def only_llm_label_names(ds: DatasetSpec, data: PreparedData) -> dict[str, str]:
    """The topics of only-LLM's prompts: the dataset's public class-names file when it has one (the same names
    DP-KPS gets with class names, so the two compare fairly), else the benchmark's label names."""
    if ds.class_names:
        from tasks.llm.released import load_class_names

        names = load_class_names(ds.class_names)
        names.check_labels(sorted(data.private["label"].unique().tolist()))
        return names.to_dict()
    return data.label_names


def only_llm_corpus(llm: str, doc_type: str, label_names: dict[str, str], labels: Sequence[Any], per_class: int,
                    seed: int, cache_uri: str, max_tokens: int = 160, temperature: float = 1.0) -> pd.DataFrame:
    """Unseeded prompts to the LLM: per_class documents per class, no private data involved at all.

    The label names are the public label set; every call is cached (tasks.llm.cache), so a re-run sends
    only the calls that never finished."""
    from tasks.ledger import public_rng
    from tasks.llm import get_backend
    from tasks.llm.base import ChatMessage, ChatRequest
    from tasks.llm.cache import CallCache, cached_complete

    if llm == "none":
        raise ConfigError("the only-llm method needs an LLM (--llm local or anthropic:MODEL)")
    rng = public_rng(seed, "only-llm")
    requests, row_labels = [], []
    for label in labels:
        prompt = only_llm_prompt(doc_type, label_names.get(str(label), str(label)))
        for _ in range(per_class):
            requests.append(ChatRequest(messages=(ChatMessage("user", prompt),), max_tokens=max_tokens,
                                        temperature=temperature, seed=int(rng.integers(0, 2**31 - 1))))
            row_labels.append(label)
    backend = get_backend(llm)
    results = cached_complete(backend, requests, CallCache(cache_uri))
    return pd.DataFrame({
        "text": [r.text for r in results], "label": row_labels, "keyphrases": [[] for _ in results],
        "backend": backend.name, "model": backend.model, "seed": [q.seed for q in requests],
        "tokens_in": [r.tokens_in for r in results], "tokens_out": [r.tokens_out for r in results],
    })


def generation_quality(train: pd.DataFrame, llm: str, release_s: float) -> dict[str, float | None]:
    """What the LLM made of its prompts, from the released rows: mean seed-term coverage (the measure best-of-k
    ranks by), the share of rows that are not documents (tasks.metrics.degenerate_rate: the one document
    predicate of the release gate, tasks.quality.document_rejection), and output tokens per second of release wall time
    (an end-to-end lower bound: for DP-KPS it includes the DP stage). None where it does not apply."""
    from tasks.metrics import degenerate_rate, term_coverage

    if llm == "none" or train.empty:
        return {"coverage": None, "degenerate_rate": None, "tokens_per_s": None, "release_s": None}
    keyphrases = [list(k) if k is not None and len(k) else [] for k in train["keyphrases"]]
    texts = train["text"].astype(str).tolist()
    seeded = [(t, k) for t, k in zip(texts, keyphrases) if k]
    coverage = float(np.mean([term_coverage(t, k) for t, k in seeded])) if seeded else None
    degenerate = degenerate_rate(texts, keyphrases)
    tokens = float(pd.to_numeric(train.get("tokens_out", pd.Series(dtype=float)), errors="coerce").sum())
    ok_time = release_s == release_s and release_s > 0
    return {"coverage": coverage, "degenerate_rate": degenerate,
            "tokens_per_s": tokens / release_s if ok_time and tokens else None,
            "release_s": round(release_s, 1) if ok_time else None}


def evaluate_cell(train: pd.DataFrame, data: PreparedData, test_view_texts: list[str], client_view: list[str],
                  opts: EvalOptions) -> dict[str, Any]:
    held_out = classify.HeldOutTestSet(test_view_texts, data.test["label"].tolist())
    scored = score_corpus(train[["text", "label"]], held_out, client_texts=client_view if opts.coral else None,
                          opts=opts)
    return scored


def _paper_lookup(paper: pd.DataFrame, *, group: str, method: str, llm: str, coral: bool,
                  eps: tuple[float, float] | None) -> tuple[float, str]:
    """The paper's number for the same setting, and its table/row; NaN when the paper has none."""
    llm_key = "none" if llm == "none" else "yes"
    sampler = {"iterative-log": "iterative", "iterative-linear": "iterative"}.get(method, method)
    rows = paper[(paper["dataset"] == group) & (paper["llm"] == llm_key)
                 & (paper["da"].isin(["any", "yes" if coral else "no"]))]
    if method in HISTOGRAM_METHODS:  # privseed's own comparator: not in the paper
        return float("nan"), ""
    if method in BASELINE_METHODS:
        rows = rows[rows["sampler"] == method]
    else:
        if eps is None:
            return float("nan"), ""
        rows = rows[(rows["eps_voc"] == eps[0]) & (rows["eps_kde"] == eps[1])]
        exact = rows[rows["sampler"] == sampler]
        # "any" rows are DP-KPS numbers whose sampler the paper leaves open; a PE method has only its own rows.
        rows = exact if len(exact) or method in PE_METHODS else rows[rows["sampler"] == "any"]
    if rows.empty:
        return float("nan"), ""
    first = rows.iloc[0]
    return float(first["accuracy"]), f"{first['table']}, {first['row']}, {first['column']}"


def aggregate_cells(cells: pd.DataFrame, paper: pd.DataFrame, groups: dict[str, str]) -> pd.DataFrame:
    """Mean and sample sd over seeds per (dataset, method, llm, coral, classifier, eps), paper beside."""
    keys = ["dataset", "method", "variant", "llm", "class_names", "coral", "classifier", "eps_voc", "eps_kde"]
    cells = cells.assign(eps_voc=cells["eps_voc"].fillna(-1), eps_kde=cells["eps_kde"].fillna(-1),
                         class_names=cells["class_names"].fillna(False).astype(bool) if "class_names" in cells
                         else (cells["method"] == "only-llm"),
                         variant=cells["variant"].fillna("") if "variant" in cells else "")
    rows = []
    for key, g in cells.groupby(keys, sort=False):
        rec = dict(zip(keys, key))
        eps = None if rec["eps_voc"] < 0 else (rec["eps_voc"], rec["eps_kde"])
        rec["eps_voc"], rec["eps_kde"] = (eps if eps else (float("nan"), float("nan")))
        rec["eps_total"] = float("nan") if eps is None else eps[0] + eps[1]
        for metric in ("accuracy", "macro_f1", "fid", "distinct_2", "coherence"):
            m, s = metrics.mean_and_spread(g[metric].tolist() if metric in g else [])
            rec[f"{metric}_mean"], rec[f"{metric}_std"] = m, s
        rec["values"] = [float(v) for v in g.sort_values("seed")["accuracy"]]  # per seed, for the figures
        rec["seeds"] = int(len(g))
        rec["llm_calls"] = float(g["llm_calls"].mean())
        rec["texts"] = float(g["n_train"].mean())
        rec["budget"] = str(g["budget"].iloc[0]) if "budget" in g and g["budget"].notna().any() else ""
        for gen in ("coverage", "degenerate_rate", "tokens_per_s", "release_s"):
            values = pd.to_numeric(g[gen], errors="coerce") if gen in g else pd.Series(dtype=float)
            rec[gen] = float(values.mean()) if values.notna().any() else float("nan")
        for timing in ("histogram_s_per_round", "llm_s_per_round"):
            values = pd.to_numeric(g[timing], errors="coerce") if timing in g else pd.Series(dtype=float)
            rec[timing] = float(values.mean()) if values.notna().any() else float("nan")
        value, cite = _paper_lookup(paper, group=groups[rec["dataset"]], method=rec["method"], llm=rec["llm"],
                                    coral=bool(rec["coral"]), eps=eps)
        rec["paper_accuracy"], rec["paper_source"] = value, cite
        rows.append(rec)
    table = pd.DataFrame(rows)
    order = {m: i for i, m in enumerate(("real", *DPKPS_METHODS, *PE_METHODS, "only-llm"))}
    table["_rank"] = table["method"].map(lambda m: order.get(m, len(order)))
    table["_with_llm"] = table["llm"] != "none"  # the seeds alone first
    return (table.sort_values(["dataset", "classifier", "coral", "_rank", "eps_total", "_with_llm", "llm",
                               "class_names", "variant"], na_position="first", kind="stable")
            .drop(columns=["_rank", "_with_llm"]).reset_index(drop=True))


def _pct(value: float) -> str:
    return "–" if value is None or np.isnan(value) else f"{100 * value:.0f}"


def _num(value: float, fmt: str = "{:.0f}") -> str:
    return "–" if value is None or np.isnan(value) else fmt.format(value)


def table_markdown(table: pd.DataFrame) -> str:
    """The experiment table in markdown: ours as mean ± sd (percent) over seeds, the paper's beside."""
    lines = ["| dataset | method | LLM | class names in prompt | DA | classifier | eps_voc + eps_kde | guarantee (ledger) "
             "| texts | LLM calls | accuracy % (mean ± sd) | macro-F1 % | coherence % | seed coverage % | degenerate % "
             "| tokens/s | release s | seeds | paper % | paper source |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table.itertuples(index=False):
        eps = "–" if np.isnan(r.eps_total) else f"{r.eps_voc:g} + {r.eps_kde:g} = {r.eps_total:g}"
        paper = "–" if np.isnan(r.paper_accuracy) else f"{r.paper_accuracy:.1f}"
        budget = getattr(r, "budget", "") or "–"
        texts = getattr(r, "texts", float("nan"))
        coh = getattr(r, "coherence_mean", float("nan"))
        coherence = "–" if not np.isfinite(coh) else f"{100 * coh:.1f}"
        variant = getattr(r, "variant", "") or ""
        lines.append(f"| {r.dataset} | {r.method}{f' ({variant})' if variant else ''} | {r.llm} "
                     f"| {'yes' if getattr(r, 'class_names', False) else 'no'} "
                     f"| {'yes' if r.coral else 'no'} | {r.classifier} | {eps} "
                     f"| {budget} | {'–' if np.isnan(texts) else f'{texts:g}'} | {r.llm_calls:g} "
                     f"| {100 * r.accuracy_mean:.1f} ± {100 * r.accuracy_std:.1f} "
                     f"| {100 * r.macro_f1_mean:.1f} ± {100 * r.macro_f1_std:.1f} | {coherence} "
                     f"| {_pct(getattr(r, 'coverage', float('nan')))} "
                     f"| {_pct(getattr(r, 'degenerate_rate', float('nan')))} "
                     f"| {_num(getattr(r, 'tokens_per_s', float('nan')), '{:.1f}')} "
                     f"| {_num(getattr(r, 'release_s', float('nan')))} | {r.seeds} | {paper} "
                     f"| {r.paper_source or '–'} |")
    return "\n".join(lines) + "\n"


def _cells_table_rows(cells: pd.DataFrame) -> list[dict[str, Any]]:
    out = []
    for r in cells.to_dict("records"):
        rec = {k: r[k] for k in ("cell", "classifier", "accuracy", "macro_f1", "fid", "distinct_2",
                                 "duplicate_rate", "coherence", "coverage", "degenerate_rate", "tokens_per_s",
                                 "release_s", "llm_calls", "budget", "histogram_s_per_round", "llm_s_per_round",
                                 "seconds")
               if k in r}
        rec["report"] = r.get("report", "")
        out.append(rec)
    return out


def build_experiment_report(spec: ExperimentSpec, table: pd.DataFrame, cells: pd.DataFrame,
                            paper: pd.DataFrame, groups: dict[str, str],
                            n_classes: dict[str, int] | None = None) -> str:
    figures: dict[str, str] = {}
    n_classes = n_classes or {}
    for (dataset, classifier, llm, coral), rows in table.groupby(["dataset", "classifier", "llm", "coral"], sort=False):
        if "class_names" in rows and rows["class_names"].any():  # the plot's bars name the setting
            rows = rows.assign(method=[m + (f" ({v})" if v else "") + (" + names" if n and m != "only-llm" else "")
                                       for m, v, n in zip(rows["method"], rows["variant"], rows["class_names"])])
        group = groups[dataset]
        llm_key = "none" if llm == "none" else "yes"
        p = paper[(paper["dataset"] == group) & (paper["llm"] == llm_key)
                  & (paper["da"].isin(["any", "yes" if coral else "no"]))]
        p = p.assign(label=p["table"] + " " + p["column"],
                     eps_total=p["eps_voc"].astype(float) + p["eps_kde"].astype(float))
        title = f"{dataset}: {classifier}, LLM {llm}{', Deep CORAL' if coral else ''}"
        figures[f"Methods side by side, {title}: accuracy (mean ± sd, dots are seeds) and the LLM calls each spent"] = \
            report.figure_to_data_uri(report.plot_method_comparison(
                rows, chance=1.0 / n_classes[dataset] if n_classes.get(dataset) else None, title=title))
        if rows["eps_total"].nunique() > 1:  # a curve needs at least two budgets
            figures[f"Accuracy vs epsilon, {title} (ours: mean ± sd over seeds; paper: hollow squares)"] = \
                report.figure_to_data_uri(report.plot_accuracy_vs_epsilon(rows, p[["label", "eps_total", "accuracy"]],
                                                                          title=title))
    display = []
    for r in table.to_dict("records"):
        display.append({
            "dataset": r["dataset"], "method": r["method"] + (f" ({r['variant']})" if r.get("variant") else ""),
            "LLM": r["llm"], "class names in prompt": "yes" if r.get("class_names") else "no",
            "DA": "yes" if r["coral"] else "no",
            "classifier": r["classifier"],
            "eps": "–" if np.isnan(r["eps_total"]) else f"{r['eps_voc']:g}+{r['eps_kde']:g}",
            "accuracy %": f"{100 * r['accuracy_mean']:.1f} ± {100 * r['accuracy_std']:.1f}",
            "macro-F1 %": f"{100 * r['macro_f1_mean']:.1f} ± {100 * r['macro_f1_std']:.1f}",
            "guarantee": r.get("budget") or "–", "texts": r.get("texts"), "LLM calls": r["llm_calls"],
            "FID": round(r["fid_mean"], 4), "seed coverage %": _pct(r.get("coverage", float("nan"))),
            "degenerate %": _pct(r.get("degenerate_rate", float("nan"))),
            "tokens/s": _num(r.get("tokens_per_s", float("nan")), "{:.1f}"),
            "release s": _num(r.get("release_s", float("nan"))), "seeds": r["seeds"],
            "paper %": "–" if np.isnan(r["paper_accuracy"]) else f"{r['paper_accuracy']:.1f}",
            "paper source": r["paper_source"] or "–",
        })
    used = paper[paper["dataset"].isin(set(groups.values()))]
    summary = (f"{len(cells['cell'].unique())} runs: {len(spec.datasets)} dataset(s) x {len(spec.methods)} method(s) "
               f"x {len(spec.eps)} epsilon setting(s) x {len(spec.seeds)} seed(s), LLM {', '.join(spec.llms)}"
               f"{', with and without public class names' if len(spec.class_names) > 1 else ''}. "
               "Every classifier is trained on synthetic data only and scored on the real test set.")
    if spec.insecure_reproducible_noise:
        from tasks.mechanisms import INSECURE_STAMP

        summary = (f"{INSECURE_STAMP}: every release of this grid drew its noise from the cell's public seed "
                   "(insecure_reproducible_noise); the epsilons below are not guarantees. " + summary)
    return report.render_experiment_report(
        title=f"privseed experiment: {spec.name}", table_markdown=table_markdown(table), table_rows=display,
        figures=figures, paper_rows=used.astype(object).where(used.notna(), "").to_dict("records"), cells=_cells_table_rows(cells),
        config=_spec_dict(spec), summary=summary)


def _spec_dict(spec: ExperimentSpec) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(spec)


@flow(name="experiment", log_prints=True)
def experiment(config_path: str | None = None, overrides: dict[str, Any] | None = None,
               cell_reports: bool = True, progress: bool = True, report_only: bool = False) -> dict[str, Any]:
    """Run a grid (datasets x methods x eps x seeds [x DA]) and write table.csv, table.md and report.html.

    Resumable: a finished cell's scores are kept in cells.jsonl and its release in runs/<cell>/ (whose
    ledger re-reads every drawn value), so a re-run only does the missing cells.
    """
    from tqdm.auto import tqdm

    spec = load_experiment(config_path, overrides)
    out = spec.out_dir
    out.mkdir(parents=True, exist_ok=True)
    done_path = out / "cells.jsonl"
    done: dict[str, list[dict[str, Any]]] = {}
    if done_path.exists():
        for line in done_path.read_text().splitlines():
            rec = json.loads(line)
            done.setdefault(rec["cell"], []).append(rec)
    paper = pd.read_csv(PAPER_NUMBERS)
    groups = {ds.name: ds.paper_group for ds in spec.datasets}
    plan = grid_cells(spec)
    records: list[dict[str, Any]] = [r for recs in done.values() for r in recs]
    prepared: dict[str, PreparedData] = {}
    views: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
    test_terms: dict[str, list[list[str]]] = {}
    bar = tqdm(plan, desc=f"experiment {spec.name}", unit="run", disable=not progress)
    for cell in bar:
        ds, method, eps, seed, llm = cell.ds, cell.method, cell.eps, cell.seed, cell.llm
        cid = cell.id
        bar.set_postfix_str(cid)
        if cid in done or report_only:  # report_only: tabulate finished runs, start none
            continue
        if ds.name not in prepared:
            prepared[ds.name] = prepare_data_task(ds, str(out))
        data = prepared[ds.name]
        start = time.perf_counter()
        release: Release | None = None
        release_s = float("nan")  # wall time of writing the texts (a reused release: unknown)
        view = "phrases" if llm == "none" else "text"
        if method == "real":
            train = real_baseline(data, ds.synthetic_per_class, seed)
            manifest: dict[str, Any] = {"config": {"vocab": spec.dpkps.get("vocab", "english"),
                                                   "vocab_top": spec.dpkps.get("vocab_top", 50_000)}}
            if view == "phrases":  # Table 5's reference: real documents as their own phrase sequences
                train = train.assign(text=phrase_view_task(train["text"].tolist(), _vocabulary_config(manifest)))
        elif method == "only-llm":
            labels = declared_labels(ds)
            t0 = time.perf_counter()
            train = only_llm_corpus(llm, ds.doc_type, only_llm_label_names(ds, data), labels, ds.synthetic_per_class,
                                    seed, str(out / "runs" / cid / "_llm_cache"), **spec.generation)
            release_s = time.perf_counter() - t0
            manifest = {"config": {"vocab": spec.dpkps.get("vocab", "english"),
                                   "vocab_top": spec.dpkps.get("vocab_top", 50_000)}}
        else:
            timing = out / "runs" / cid / "_release_seconds.json"  # kept beside the release, so a resumed
            fresh = not (out / "runs" / cid / "manifest.json").exists()  # cell still knows its wall time
            t0 = time.perf_counter()
            release = generate_release(spec, ds, data, method, eps, seed, out / "runs" / cid, llm,
                                       cell.class_names, cell.variant)
            if fresh:
                release_s = time.perf_counter() - t0
                timing.write_text(json.dumps({"release_s": release_s}))
            elif timing.exists():
                release_s = float(json.loads(timing.read_text())["release_s"])
            train, manifest = release.rows, release.manifest
        llm_calls = release_llm_calls(release) if release is not None else metrics.llm_usage(train)["llm_calls"]
        budget = release_budget(release) if method not in BASELINE_METHODS else "none (no private data)" if \
            method == "only-llm" else "none (real private documents)"
        timings = round_timings(release)
        n_client = len(train) // 2
        client = choose_client_texts(pd.DataFrame({"text": data.client_pool}), data.test["text"], len(train), seed)
        key = (ds.name, view)
        if key not in views:
            test_texts = data.test["text"].tolist()
            if view == "phrases":
                vocab = _vocabulary_config(manifest)
                views[key] = (phrase_view_task(test_texts, vocab), phrase_view_task(data.client_pool, vocab))
            else:
                views[key] = (test_texts, list(data.client_pool))
        test_view_texts, client_pool_view = views[key]
        if view == "phrases":
            index = {t: i for i, t in enumerate(data.client_pool)}
            client = [client_pool_view[index[t]] for t in client]
        new_records = []
        for coral in spec.coral:
            opts = EvalOptions(classifier=spec.classifier, tfidf=spec.tfidf, coral=coral, test_view=view,
                               train=classify.TrainConfig(seed=seed, max_epochs=spec.max_epochs, progress=False),
                               map_method="pca")
            scored = evaluate_cell(train, data, test_view_texts, client[:n_client], opts)
            fid = metrics.frechet_distance(scored["test_x"], scored["train_x"])
            corpus_stats = metrics.corpus_metrics(train["text"].astype(str).tolist())
            coherence = float("nan")
            if "keyphrases" in train.columns:  # seed sequences against the PUBLIC test split of their class
                if ds.name not in test_terms:
                    test_terms[ds.name] = term_lists(data.test["text"].tolist(), _vocabulary_config(manifest))
                coherence = pair_coherence([list(k) for k in train["keyphrases"]], train["label"].tolist(),
                                           test_terms[ds.name], data.test["label"].tolist())
            usage = metrics.llm_usage(train)
            quality = generation_quality(train, llm, release_s)
            report_path = ""
            if cell_reports and release is not None:
                report_path = str(out / "runs" / cid / ("report-coral.html" if coral else "report.html"))
                result = {"title": cid, "synthetic": release.path, "test": ds.test or ds.train, "test_view": view,
                          "n_train": len(train), "n_test": len(data.test), "scores": scored["scores"], "fid": fid,
                          "client": "client pool (unlabelled training documents)" if coral else None,
                          "n_client": n_client if coral else 0,
                          "corpus": {"synthetic": corpus_stats, "real test": metrics.corpus_metrics(test_view_texts)},
                          "usage": usage, "privacy": _privacy_summary(release.ledger)}
                _write_text(report_path, build_run_report(result, scored, train, test_view_texts, data.label_names,
                                                          manifest=release.manifest, ledger=release.ledger, opts=opts))
            for label, s in scored["scores"].items():
                new_records.append({
                    "cell": cid, "dataset": ds.name, "method": method, "llm": llm, "coral": coral,
                    "class_names": cell.class_names, "variant": cell.variant, **quality,
                    "classifier": label.replace(" + CORAL", ""), "seed": seed,
                    "eps_voc": None if eps is None else eps[0], "eps_kde": None if eps is None else eps[1],
                    "accuracy": s["accuracy"], "macro_f1": s["macro_f1"], "n_train": len(train),
                    "n_test": s["n_test"], "fid": fid, "distinct_2": corpus_stats["distinct_2"],
                    "duplicate_rate": corpus_stats["duplicate_rate"], "coherence": coherence, "llm_calls": llm_calls,
                    "tokens_out": usage["tokens_out"], "seconds": round(time.perf_counter() - start, 1),
                    "budget": budget, "histogram_s_per_round": timings.get("histogram_s"),
                    "llm_s_per_round": timings.get("llm_s"), "report": report_path,
                })
        with done_path.open("a") as fh:
            for rec in new_records:
                fh.write(json.dumps(rec, default=_json_default) + "\n")
        records.extend(new_records)
    # Aggregate what cells.jsonl holds now: other processes may have filled cells of the same grid.
    records = [json.loads(line) for line in done_path.read_text().splitlines() if line.strip()]
    wanted = {cell.id for cell in plan}
    cells = pd.DataFrame(records).drop_duplicates(["cell", "classifier", "coral"], keep="last")
    cells = cells[cells["cell"].isin(wanted)].reset_index(drop=True)
    if cells.empty:
        raise ConfigError(f"no finished runs of experiment {spec.name} to tabulate")
    table = aggregate_cells(cells, paper, groups)
    table.drop(columns="values").to_csv(out / "table.csv", index=False)
    cells.to_csv(out / "cells.csv", index=False)
    md = table_markdown(table)
    (out / "table.md").write_text(md)
    for ds in spec.datasets:  # a report-only pass has prepared nothing yet; the chance line needs the test split
        if ds.name not in prepared and ds.name in set(cells["dataset"]):
            prepared[ds.name] = prepare_data_task(ds, str(out))
    n_classes = {name: int(data.test["label"].nunique()) for name, data in prepared.items()}
    (out / "report.html").write_text(build_experiment_report(spec, table, cells, paper, groups, n_classes),
                                     encoding="utf-8")
    print(md)
    print(f"table: {out / 'table.csv'} and {out / 'table.md'}; report: {out / 'report.html'}")
    return {"table": str(out / "table.csv"), "markdown": str(out / "table.md"), "report": str(out / "report.html"),
            "rows": table.to_dict("records")}


# ================================================================ CLI
def register_cli(subparsers: argparse._SubParsersAction) -> None:
    ev = subparsers.add_parser("evaluate", help="train on a synthetic release only; score on a real test set",
                               description=evaluate.__doc__)
    ev.add_argument("--synthetic", required=True, metavar="OUT", help="a release folder (read through manifest.json)")
    ev.add_argument("--test", required=True, metavar="PATH", help="the real labelled test set (Parquet)")
    ev.add_argument("--client", metavar="PATH", help="unlabelled client documents for Deep CORAL (disjoint from --test)")
    ev.add_argument("--coral", action="store_true", help="Deep CORAL domain adaptation against --client")
    ev.add_argument("--classifier", choices=["mlp", "finetune"], default="mlp",
                    help="mlp: 3-layer MLP over frozen MiniLM embeddings (CPU); finetune: MiniLM end to end (GPU)")
    ev.add_argument("--test-view", choices=["auto", "text", "phrases"], default="auto",
                    help="phrases: test documents become phrase sequences (no-LLM ablation; auto when --llm none)")
    ev.add_argument("--json", dest="json_path", metavar="FILE", help="write the scores and metrics as JSON")
    ev.add_argument("--report", dest="report_path", metavar="FILE", help="where report.html goes (default OUT/report.html)")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--epochs", dest="max_epochs", type=int, default=60, help="maximum epochs (early stopping)")
    ev.add_argument("--device", help="torch device (default: cuda when available, else cpu)")
    ev.add_argument("--text-column", default="text")
    ev.add_argument("--label-column", default="label")
    ev.set_defaults(func=_evaluate_from_cli)

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


def _evaluate_from_cli(args: argparse.Namespace) -> int:
    evaluate(synthetic=args.synthetic, test=args.test, client=args.client, coral=args.coral,
             classifier=args.classifier, json_path=args.json_path, report_path=args.report_path,
             test_view=args.test_view, seed=args.seed, max_epochs=args.max_epochs, device=args.device,
             text_column=args.text_column, label_column=args.label_column)
    return 0


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
