"""The data recipient's evaluation of a synthetic corpus: what to train, on which view of the texts, and what
the scores, figures and report of one evaluation are.

A classifier is trained on synthetic (or, for the experiment's `real` baseline, real private) documents only
and scored on the recipient's real test set, whose labels are read once, after every classifier is trained
(``privseed.tasks.evaluation.classify.HeldOutTestSet``). The Prefect stages around these functions are in
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
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold, cross_val_score
from sklearn.pipeline import make_pipeline

from privseed.tasks.dp.ledger import plain_guarantee
from privseed.tasks.evaluation import classify, report
from privseed.tasks.data import corpus
from privseed.tasks.quality import metrics
from privseed.tasks import storage
from privseed.tasks.config.commands import EvaluationOptions, NeuralClassifier
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


#: Texts embedded per step of the embedding progress bar.
EMBED_CHUNK = 256


def embed_cached(texts: Sequence[str], model: str, cache_dir: Path, *, progress: bool = False,
                 desc: str = "embed") -> np.ndarray:
    """Sentence embeddings (privseed.tasks.data.embedding, unit norm), cached on disk by the hash of model + texts.
    ``progress`` shows a bar of texts embedded (the slowest step of an evaluation: a minute for 2,000 texts on
    two cores)."""
    from tqdm.auto import tqdm

    from privseed.tasks.data.embedding import embed_texts

    digest = hashlib.sha256(("\x1e".join([model, *map(str, texts)])).encode("utf-8")).hexdigest()[:32]
    path = cache_dir / f"{digest}.npy"
    if path.exists():
        return np.load(path)
    if len(texts) == 0:
        return np.zeros((0, 384), dtype=np.float32)
    parts = []
    with tqdm(total=len(texts), desc=desc, unit="text", disable=not progress, leave=False) as bar:
        for start in range(0, len(texts), EMBED_CHUNK):
            chunk = list(texts[start:start + EMBED_CHUNK])
            parts.append(np.asarray(embed_texts(chunk, model=model), dtype=np.float32))
            bar.update(len(chunk))
    vectors = np.concatenate(parts, axis=0)
    buffer = io.BytesIO()
    np.save(buffer, vectors)
    storage.write_bytes(str(path), buffer.getvalue())  # atomic: concurrent grids share the cache
    return vectors


# ---------------------------------------------------------------- views of the texts
def _extractor(vocabulary: Mapping[str, Any]) -> tuple[Any, Any]:
    """The public vocabulary V a release recorded (``vocab``, ``vocab_top``) and its phrase matcher."""
    try:
        from privseed.tasks.seeds.vocabulary import load_vocabulary, phrase_matcher
    except ImportError as exc:
        raise ConfigError("the phrase view needs privseed.tasks.seeds.vocabulary, which this installation "
                          "lacks") from exc
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
    validation: dict[str, int] | None = None
    if kind == "mlp":
        assert train_x is not None and predict_x is not None  # the MLP's callers embed the texts first
        clf = classify.train_mlp(train_x, train_labels, client_features=client_x, cfg=cfg, device=device)
        predictions = classify.predict_mlp(clf, predict_x)
        history, best_epoch = clf.history, clf.best_epoch
        validation = clf.validation.to_dict() if clf.validation else None
    elif kind == "finetune":
        from privseed.tasks.data.embedding import load_embedder

        clf = classify.train_finetune(train_texts, train_labels, load_embedder(embed_model), client_texts=client_texts,
                                      cfg=cfg, device=device)
        predictions = classify.predict_finetune(clf, predict_texts)
        history, best_epoch = clf.history, clf.best_epoch
        validation = clf.validation.to_dict() if clf.validation else None
    elif kind == "tfidf":
        predictions = classify.tfidf_logreg_predict(train_texts, train_labels, predict_texts, seed=cfg.seed)
    else:
        raise ConfigError(f"unknown classifier {kind!r}; choose one of {', '.join(CLASSIFIERS)}")
    return {"predictions": list(predictions), "history": history, "best_epoch": best_epoch,
            "validation": validation, "seconds": round(time.perf_counter() - start, 2)}


def classifier_label(kind: str, coral: bool) -> str:
    return {"mlp": "MLP on MiniLM", "finetune": "fine-tuned MiniLM", "tfidf": "TF-IDF + LR"}[kind] + (
        " + CORAL" if coral and kind != "tfidf" else "")


def score_runs(y_true: Sequence[Any], runs: Mapping[str, Mapping[str, Any]], n_train: int) -> dict[str, dict]:
    """Accuracy and macro-F1 of every trained classifier's predictions (called once, after all training)."""
    scores = {}
    for label, run in runs.items():
        s = metrics.classification_scores(y_true, run["predictions"])
        s.update(n_train=n_train, best_epoch=run["best_epoch"], seconds=run["seconds"])
        if run.get("validation"):
            s["validation_size"] = run["validation"]["used"]
        scores[label] = s
    return scores


#: A classifier that gives one class to at least this share of the test documents has collapsed to that class
#: (unless the test set itself is that lopsided).
ONE_CLASS_SHARE = 0.9


def classifier_warnings(y_true: Sequence[Any], runs: Mapping[str, Mapping[str, Any]],
                        label_names: Mapping[str, str] | None = None) -> list[dict[str, str]]:
    """What a reader must know before believing a score, one entry per finding (classifier, kind, message):

    - ``one-class``: one class predicted for ``ONE_CLASS_SHARE`` or more of the test documents, while the test set
      is not that lopsided: the accuracy is that class's share of the test set, not a measure of the corpus;
    - ``chance``: accuracy not above the better of uniform guessing and always answering the test set's largest
      class;
    - ``no-early-stopping``: the synthetic validation split would have been too small to mean anything, so the
      classifier trained for every epoch without one (``classify.validation_plan``).
    Called after scoring: it reads the test labels' class shares, never before training ends."""
    name = _label_display(label_names or {})
    truth = pd.Series([str(v) for v in y_true])
    if truth.empty:
        return []
    true_top_share = float(truth.value_counts(normalize=True).iloc[0])
    chance = max(1.0 / truth.nunique(), true_top_share)
    found: list[dict[str, str]] = []
    for label, run in runs.items():
        predicted = pd.Series([str(v) for v in run["predictions"]])
        shares = predicted.value_counts(normalize=True)
        top, top_share = str(shares.index[0]), float(shares.iloc[0])
        accuracy = float((predicted.to_numpy() == truth.to_numpy()).mean())
        if top_share >= ONE_CLASS_SHARE and true_top_share < ONE_CLASS_SHARE:
            found.append({"classifier": label, "kind": "one-class", "message": (
                f"{label} predicts one class ({name(top)}) for {100 * top_share:.0f}% of the test documents "
                f"({predicted.nunique()} of {truth.nunique()} classes ever predicted): its accuracy "
                f"({100 * accuracy:.1f}%) is that class's share of the test set, not a measure of the corpus.")})
        elif accuracy <= chance + 1e-12:
            found.append({"classifier": label, "kind": "chance", "message": (
                f"{label} is at chance: accuracy {100 * accuracy:.1f}%, chance {100 * chance:.1f}% (the better of "
                "uniform guessing and always answering the largest test class).")})
        plan = run.get("validation")
        if plan and not plan["used"] and plan["wanted"]:
            found.append({"classifier": label, "kind": "no-early-stopping", "message": (
                f"{label} trained without early stopping: a validation split of the synthetic data would hold "
                f"{plan['wanted']} document{'s' if plan['wanted'] != 1 else ''}, fewer than the "
                f"{plan['minimum']} a split needs to mean anything (at "
                f"least two per class), so it trained all {len(run.get('history') or [])} epochs on every synthetic "
                "document. Scores of a release this small vary widely from seed to seed.")})
    return found


def documents_vs_seeds(rows: pd.DataFrame, test: pd.DataFrame) -> tuple[float, float]:
    """Accuracy on the real test split of the same classifier (TF-IDF + LR) trained on the released documents,
    and on the released seeds alone (each row's keyphrases joined: what `--llm none` would release). Shows what
    the LLM step added or lost."""
    truth = test["label"].tolist()
    docs, alone = documents_and_seeds_predictions(rows, test)
    return (metrics.classification_scores(truth, docs)["accuracy"],
            metrics.classification_scores(truth, alone)["accuracy"])


def seed_texts(rows: pd.DataFrame) -> list[str]:
    """Each released row's seed as a text: its keyphrases joined by spaces (what `--llm none` would release); empty
    for a row without keyphrases."""
    column = rows["keyphrases"] if "keyphrases" in rows else pd.Series([None] * len(rows))
    return [" ".join(map(str, _as_list(k))) for k in column]


def documents_and_seeds_predictions(rows: pd.DataFrame, test: pd.DataFrame) -> tuple[list, list]:
    """The test split's labels as predicted by TF-IDF + LR trained on the released documents, and by the same
    classifier trained on the same rows' seeds (``documents_vs_seeds``; per class: ``recall_by_class``)."""
    seeds = seed_texts(rows)
    docs = classify.tfidf_logreg_predict(rows["text"].astype(str).tolist(), rows["label"].tolist(),
                                         test["text"].astype(str).tolist(), seed=0)
    alone = classify.tfidf_logreg_predict(seeds, rows["label"].tolist(), test["text"].astype(str).tolist(), seed=0)
    return list(docs), list(alone)


def recall_by_class(truth: Sequence, predicted: Sequence) -> dict[str, float]:
    """Per true class (as text), the share of its test documents predicted as that class: where a synthetic
    corpus loses, e.g. one class's documents written about another's topic."""
    frame = pd.DataFrame({"truth": list(map(str, truth)), "hit": [str(t) == str(p) for t, p in zip(truth, predicted)]})
    return {str(k): float(v) for k, v in frame.groupby("truth")["hit"].mean().items()}


def generation_quality(train: pd.DataFrame, llm: str, release_s: float) -> dict[str, float | None]:
    """What the LLM made of its prompts, from the released rows: mean seed-term coverage (the measure best-of-k
    ranks by), the share of rows that are not documents (privseed.tasks.quality.metrics.degenerate_rate: the one
    document
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


# ---------------------------------------------------------------- what the scores compare with
#: The reference classifiers ``privseed evaluate`` trains beside the synthetic corpus's: TF-IDF + LR on other
#: training sets, scored on the same test set (``reference_training_sets``).
SEEDS_ALONE = "seeds alone"
REAL_DOCUMENTS = "real documents"


def reference_training_sets(rows: pd.DataFrame, test_texts: Sequence[str],
                            real_train: pd.DataFrame | None = None) -> dict[str, pd.DataFrame]:
    """What TF-IDF + LR trains on for the report's reference lines (text, label): the release's seeds alone
    (``seed_texts``, as the demo's "seeds alone" line) when its rows have keyphrases, and the owner's real documents
    (``--real-train``) when given, less any text that is also a test document."""
    sets: dict[str, pd.DataFrame] = {}
    seeds = seed_texts(rows)
    if any(seeds):
        sets[SEEDS_ALONE] = pd.DataFrame({"text": seeds, "label": rows["label"].tolist()})
    if real_train is not None:
        held_out = set(map(str, test_texts))
        real = real_train[["text", "label"]]
        real = real[~real["text"].astype(str).isin(held_out)].reset_index(drop=True)
        # a classifier needs two classes to learn from: real documents that are all test documents (or of one
        # class) give no reference line rather than a failed evaluation
        if real["label"].nunique() >= 2:
            sets[REAL_DOCUMENTS] = real
    return sets


def reference_lines(y_true: Sequence[Any], reference_scores: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The lines a recipient reads the classifiers' accuracy against: chance (uniform over the test split's
    classes, and always answering its largest class) and every reference classifier's scores (``SEEDS_ALONE``,
    ``REAL_DOCUMENTS``). Called after scoring: it reads the test labels' class shares."""
    truth = pd.Series([str(v) for v in y_true])
    if truth.empty:
        return []
    shares = truth.value_counts(normalize=True)
    lines: list[dict[str, Any]] = [
        {"reference": "chance: uniform guessing", "accuracy": 1.0 / len(shares),
         "what": f"1 / {len(shares)} classes"},
        {"reference": "chance: the largest class", "accuracy": float(shares.iloc[0]),
         "what": "always answering the test split's most frequent class"}]
    what = {SEEDS_ALONE: "TF-IDF + LR trained on the release's seed keyphrases only, no LLM text",
            REAL_DOCUMENTS: "TF-IDF + LR trained on real documents (--real-train)"}
    for name, s in reference_scores.items():
        lines.append({"reference": name, "accuracy": float(s["accuracy"]), "macro_f1": float(s["macro_f1"]),
                      "what": f"{what.get(name, name)}, {s.get('n_train', '?')} documents"})
    return lines


def score_classes(y_true: Sequence[Any], train_labels: Sequence[Any]) -> list[str]:
    """The classes of an evaluation's tables and figures, as text, in label order (2 before 10): those of the test
    split and of the synthetic corpus."""
    return sorted({*map(str, y_true), *map(str, train_labels)}, key=lambda v: (len(v), v))


#: A class whose recall is under this share of the mean per-class recall is one to distrust.
DISTRUST_RECALL_SHARE = 0.5


def classes_to_distrust(per_class: Sequence[Mapping[str, Any]],
                        share: float = DISTRUST_RECALL_SHARE) -> tuple[list[str], float]:
    """The classes (of ``metrics.per_class_scores`` rows with test documents) whose recall is under ``share`` of the
    mean per-class recall, and that mean."""
    present = [r for r in per_class if r["support"] > 0]
    if not present:
        return [], float("nan")
    mean = float(np.mean([r["recall"] for r in present]))
    return [str(r["class"]) for r in present if r["recall"] < share * mean], mean


def distrust_sentence(classifier: str, per_class: Sequence[Mapping[str, Any]],
                      label_names: Mapping[str, str] | None = None) -> str:
    """Which classes a recipient should not rely on the synthetic corpus for, in one sentence."""
    name = _label_display(label_names or {})
    weak, mean = classes_to_distrust(per_class)
    if mean != mean:
        return ""
    limit = f"under half its mean per-class recall ({100 * mean:.0f}%)"
    if not weak:
        return f"No class stands out as one to distrust: trained on the synthetic corpus, {classifier} recalls no " \
               f"class {limit.replace('its', 'the')}."
    recall = {str(r["class"]): r["recall"] for r in per_class}
    listed = [f"{name(c)} ({100 * recall[c]:.0f}%)" for c in weak]
    which = listed[0] if len(listed) == 1 else f"{len(listed)} classes, {', '.join(listed[:-1])} and {listed[-1]}"
    return (f"Distrust the synthetic corpus for {which}: trained on it, {classifier} recalls "
            f"{'this share of its' if len(listed) == 1 else 'these shares of their'} real test documents, {limit}.")


#: Real and synthetic texts compared per side, at most (a seeded sample above it).
DISTINGUISH_MAX_TEXTS = 5000


def real_vs_synthetic_auc(real_texts: Sequence[str], synthetic_texts: Sequence[str], *, folds: int = 5,
                          seed: int = 0, max_texts: int = DISTINGUISH_MAX_TEXTS) -> float | None:
    """How well TF-IDF + logistic regression (the settings of ``classify.tfidf_logreg_predict``) tells synthetic
    texts from real ones: the ROC AUC, averaged over stratified cross-validation folds (0.5: indistinguishable; 1:
    always told apart). A seeded sample of ``max_texts`` a side above it; None when a side has fewer texts than
    two."""
    rng = np.random.default_rng(seed)

    def sample(texts: Sequence[str]) -> list[str]:
        keep = np.sort(rng.choice(len(texts), size=max_texts, replace=False)) if len(texts) > max_texts else \
            range(len(texts))
        return [str(texts[i]) for i in keep]

    real, synthetic = sample(list(real_texts)), sample(list(synthetic_texts))
    n_folds = min(folds, len(real), len(synthetic))
    if n_folds < 2:
        return None
    texts = real + synthetic
    is_synthetic = np.array([0] * len(real) + [1] * len(synthetic))
    model = make_pipeline(TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=1, max_features=200_000),
                          LogisticRegression(max_iter=2000, C=10.0, random_state=seed))
    splits = StratifiedKFold(n_splits=n_folds, shuffle=True, random_state=seed)
    return float(np.mean(cross_val_score(model, texts, is_synthetic, cv=splits, scoring="roc_auc")))


def length_comparison(real_texts: Sequence[str], synthetic_texts: Sequence[str]) -> dict[str, Any]:
    """Median words per document, real vs synthetic, and the sentence that says how they differ."""
    real = float(np.median(metrics.word_lengths(real_texts))) if len(real_texts) else float("nan")
    synthetic = float(np.median(metrics.word_lengths(synthetic_texts))) if len(synthetic_texts) else float("nan")
    medians = f"median {synthetic:.0f} vs {real:.0f} words"
    if not (real > 0 and synthetic > 0):
        sentence = ""
    elif synthetic / real >= 1.1:
        sentence = f"Synthetic documents are {synthetic / real:.1f}x longer than real ones ({medians})."
    elif real / synthetic >= 1.1:
        sentence = f"Synthetic documents are {real / synthetic:.1f}x shorter than real ones ({medians})."
    else:
        sentence = f"Synthetic and real documents are about as long ({medians})."
    return {"median_words_real": real, "median_words_synthetic": synthetic, "sentence": sentence}


def distinguishability_sentence(auc: float | None) -> str:
    """What a real-vs-synthetic AUC (``real_vs_synthetic_auc``) says, in one sentence."""
    if auc is None:
        return ""
    verdict = ("tells the synthetic documents from real test documents almost every time" if auc >= 0.9 else
               "tells the synthetic documents from real test documents more often than not" if auc >= 0.7 else
               "barely tells the synthetic documents from real test documents" if auc >= 0.6 else
               "cannot tell the synthetic documents from real test documents")
    return (f"A TF-IDF + logistic regression classifier {verdict}: AUC {auc:.3f}, cross-validated (0.5: "
            "indistinguishable; 1: always told apart).")


def release_guarantee(ledger: Mapping[str, Any] | None) -> str:
    """The release's guarantee in one plain sentence (``privseed.tasks.dp.ledger.plain_guarantee``), from its
    ledger.json's total; empty without one."""
    total = (ledger or {}).get("total")
    if not isinstance(total, Mapping):
        return ""
    return plain_guarantee({**total, "stamp": (ledger or {}).get("stamp")})


# ---------------------------------------------------------------- the result and its report
def privacy_summary(ledger: Mapping[str, Any] | None) -> str:
    rows, total = report.ledger_rows(ledger)
    return total or (f"{len(rows)} ledger entries" if rows else "no ledger")


def evaluation_result(*, title: str, synthetic: str, test: str, client: str | None, test_view: str,
                      rows: pd.DataFrame, test_texts: Sequence[str], client_texts: Sequence[str] | None,
                      scored: Mapping[str, Any], ledger: Mapping[str, Any] | None,
                      opts: EvaluationOptions, label_names: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The JSON-able result of one evaluation: scores, what to read before them (``classifier_warnings``), the
    lines to read them against (``reference_lines``), per-class scores and the classes to distrust, FID and
    precision / recall / density / coverage, how well real and synthetic texts are told apart and how their lengths
    differ, corpus statistics, LLM usage and the guarantee (in the ledger's words and in one plain sentence)."""
    name = _label_display(label_names or {})
    synthetic_texts = rows["text"].astype(str).tolist()
    classes = score_classes(scored["y_true"], rows["label"])
    per_class = {label: metrics.per_class_scores(scored["y_true"], run["predictions"], classes)
                 for label, run in scored["runs"].items()}
    main = next(iter(per_class), None)
    auc = real_vs_synthetic_auc(test_texts, synthetic_texts, seed=opts.seed)
    return {
        "title": title, "synthetic": synthetic, "test": test, "client": client if opts.coral else None,
        "test_view": test_view, "n_train": len(rows), "n_test": len(test_texts),
        "n_client": len(client_texts or []) if opts.coral else 0,
        "scores": scored["scores"],
        "warnings": classifier_warnings(scored["y_true"], scored["runs"], label_names),
        "references": reference_lines(scored["y_true"], scored.get("reference_scores") or {}),
        "per_class": {label: [{**r, "class": name(r["class"])} for r in table] for label, table in per_class.items()},
        "distrust": distrust_sentence(main, per_class[main], label_names) if main else "",
        "distinguishability": {"auc": auc, "sentence": distinguishability_sentence(auc)},
        "lengths": length_comparison(test_texts, synthetic_texts),
        "guarantee": release_guarantee(ledger),
        "fid": metrics.frechet_distance(scored["test_x"], scored["train_x"]),
        "prdc": embedding_prdc(scored["test_x"], scored["train_x"], seed=opts.seed),
        "corpus": {
            "synthetic": metrics.corpus_metrics(rows["text"].astype(str).tolist(), rows["keyphrases"].tolist()),
            "real test": metrics.corpus_metrics(list(test_texts)),
        },
        "usage": metrics.llm_usage(rows),
        "privacy": privacy_summary(ledger),
        "options": {"classifier": opts.classifier, "coral": opts.coral, "seed": opts.seed,
                    "train": train_config(opts).to_dict()},
    }


#: Precision / recall / density / coverage compare every pair of embeddings: above this many on a side, a seeded
#: sample of this many (two 5,000 x 5,000 distance matrices, 400 MB in float64).
PRDC_MAX_POINTS = 5000


def embedding_prdc(real: np.ndarray, synthetic: np.ndarray, *, seed: int = 0,
                   max_points: int = PRDC_MAX_POINTS) -> dict[str, float] | None:
    """``metrics.precision_recall_density_coverage`` of the synthetic embeddings against the real test set's (a
    seeded sample of each side above ``max_points``); None when a side has too few documents for k neighbours."""
    rng = np.random.default_rng(seed)
    real, synthetic = (x[np.sort(rng.choice(len(x), size=max_points, replace=False))] if len(x) > max_points else x
                       for x in (np.asarray(real), np.asarray(synthetic)))
    if min(len(real), len(synthetic)) <= metrics.PRDC_NEAREST_K:
        return None
    return metrics.precision_recall_density_coverage(real, synthetic)


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
    from tqdm.auto import tqdm

    name = _label_display(label_names)
    figures: dict[str, str] = {}
    main_label = next(iter(scored["runs"]))
    has_curve = bool(scored["runs"][main_label]["history"])
    # no rate or ETA: the t-SNE map takes nearly all the time, so a per-figure rate would mislead
    bar = tqdm(total=2 + len(scored["runs"]) + has_curve, desc="report figures", unit="figure",
               disable=not opts.progress, leave=False, bar_format="{desc}: {n_fmt}/{total_fmt} [{elapsed}{postfix}]")
    n_map = min(len(scored["test_x"]), 600) + min(len(scored["train_x"]), 600)  # report.project_2d's sample
    bar.set_postfix_str(f"{'t-SNE' if opts.map_method == 'tsne' else 'PCA'} map of {n_map} documents")
    real_xy, syn_xy = report.project_2d(scored["test_x"], scored["train_x"], method=opts.map_method,
                                        seed=opts.seed)
    figures["2-D map of real test vs synthetic embeddings (as the paper's Figure 5)"] = report.figure_to_data_uri(
        report.plot_embedding_map(real_xy, syn_xy, method=opts.map_method))
    bar.update()
    bar.set_postfix_str("lengths, confusion matrices, training curve")
    figures["Document lengths in words"] = report.figure_to_data_uri(report.plot_length_histograms(
        metrics.word_lengths(test_texts), metrics.word_lengths(release_rows["text"].astype(str)),
        real_label="real test" + (" as phrase sequences" if result.get("test_view") == "phrases" else "")))
    bar.update()
    classes = score_classes(scored["y_true"], release_rows["label"])
    for label, run in scored["runs"].items():
        cm = metrics.label_confusion(scored["y_true"], run["predictions"], classes)
        acc = result["scores"][label]["accuracy"]
        figures[f"Confusion matrix, {label} (accuracy {100 * acc:.1f}%)"] = report.figure_to_data_uri(
            report.plot_confusion(cm, [name(c) for c in classes], title=f"{label} on the real test set"))
        bar.update()
    if has_curve:
        main_run = scored["runs"][main_label]
        stopping = ("early stopping on a synthetic split" if (main_run.get("validation") or {}).get("used")
                    else "no early stopping: too few synthetic documents for a validation split")
        figures[f"Training of {main_label} ({stopping})"] = report.figure_to_data_uri(
            report.plot_training_curve(main_run["history"], title=main_label))
        bar.update()
    bar.close()
    examples = []
    for _, group in release_rows.groupby("label", sort=True):
        for _, row in group.head(n_examples).iterrows():
            examples.append({"label_name": name(row["label"]), "keyphrases": _as_list(row.get("keyphrases")),
                             "seed": row.get("seed"), "text": row["text"]})
    return report.render_run_report(result, figures=figures, ledger=ledger, manifest=manifest, examples=examples)


def evaluation_summary(result: Mapping[str, Any]) -> str:
    """What ``privseed evaluate`` prints when it is done: each classifier's scores, the fidelity metrics, what to
    read before them, and where the report is."""
    lines = [f"Trained on {result.get('n_train', '?')} synthetic documents, scored on {result.get('n_test', '?')} "
             f"real test documents ({result.get('test_view', 'text')})."]
    for label, s in result.get("scores", {}).items():
        lines.append(f"  {label}: accuracy {100 * s['accuracy']:.1f}%, macro-F1 {100 * s['macro_f1']:.1f}%")
    if result.get("references"):
        lines.append("  against: " + ", ".join(f"{r['reference']} {100 * r['accuracy']:.1f}%"
                                                for r in result["references"]))
    fidelity = result.get("prdc")
    if fidelity:
        lines.append("  embeddings: " + ", ".join(f"{k} {fidelity[k]:.2f}" for k in report.PRDC_METRICS)
                     + (f", FID {result['fid']:.3f}" if result.get("fid") is not None else ""))
    lines.extend(f"  {sentence}" for sentence in (result.get("distrust"), (result.get("distinguishability") or {})
                                                  .get("sentence"), (result.get("lengths") or {}).get("sentence"))
                 if sentence)
    lines.append(f"  privacy: {result.get('privacy', 'see the ledger')}")
    if result.get("guarantee"):
        lines.append(f"  {result['guarantee']}")
    lines.extend(f"WARNING: {w['message']}" for w in result.get("warnings") or [])
    if result.get("report"):
        lines.append(f"report: {result['report']}")
    return "\n".join(lines)
