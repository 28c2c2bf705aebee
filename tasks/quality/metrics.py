"""Evaluation metrics for a synthetic release: utility, fidelity, diversity and cost.

Pure functions (numpy/scipy/sklearn, no I/O). Everything here works on released data or on the
evaluator's own test/client data; nothing here touches the private corpus, so there is no privacy
cost and no ledger entry.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

_TOKEN = re.compile(r"\w+", re.UNICODE)


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens; the same rule for lengths, distinct-n and coverage."""
    return _TOKEN.findall(str(text).lower())


# ---------------------------------------------------------------- utility
def classification_scores(y_true: Iterable[Any], y_pred: Iterable[Any]) -> dict[str, float]:
    """Accuracy and macro-F1 over the classes present in y_true or y_pred."""
    y_true = np.asarray(list(y_true), dtype=object)
    y_pred = np.asarray(list(y_pred), dtype=object)
    if len(y_true) != len(y_pred):
        raise ValueError(f"{len(y_true)} true labels but {len(y_pred)} predictions")
    if len(y_true) == 0:
        raise ValueError("cannot score an empty test set")
    from sklearn import metrics as sklearn_metrics  # here: the LLM layer imports this module, and sklearn is slow

    # sklearn needs one comparable type: compare labels as strings (int 3 and "3" are the same class).
    t = y_true.astype(str)
    p = y_pred.astype(str)
    return {
        "accuracy": float(sklearn_metrics.accuracy_score(t, p)),
        "macro_f1": float(sklearn_metrics.f1_score(t, p, average="macro", zero_division=0)),
        "n_test": int(len(t)),
    }


def per_class_scores(y_true: Sequence[Any], y_pred: Sequence[Any], classes: Sequence[Any]) -> list[dict[str, Any]]:
    """Precision, recall, F1 and support (test documents of the class) per class, in the order of ``classes``
    (compared as text, like :func:`classification_scores`); 0 where a ratio has no denominator."""
    from sklearn.metrics import precision_recall_fscore_support

    labels = [str(c) for c in classes]
    precision, recall, f1, support = precision_recall_fscore_support(
        np.asarray(list(y_true)).astype(str), np.asarray(list(y_pred)).astype(str), labels=labels, zero_division=0)
    return [{"class": c, "precision": float(p), "recall": float(r), "f1": float(f), "support": int(n)}
            for c, p, r, f, n in zip(labels, precision, recall, f1, support)]


def label_confusion(y_true: Sequence[Any], y_pred: Sequence[Any], labels: Sequence[Any]) -> np.ndarray:
    """Confusion counts, rows = true label, columns = predicted label, in the order of `labels`."""
    lab = [str(x) for x in labels]
    from sklearn.metrics import confusion_matrix

    return confusion_matrix(np.asarray(list(y_true)).astype(str), np.asarray(list(y_pred)).astype(str), labels=lab)


# ---------------------------------------------------------------- fidelity
def frechet_distance(real: np.ndarray, synthetic: np.ndarray) -> float:
    """Fréchet distance between Gaussians fitted to two embedding sets (FID, Heusel et al. 2017).

    ||mu_r - mu_s||^2 + Tr(C_r + C_s - 2 (C_r C_s)^{1/2}). Computed on sentence embeddings, as in
    Aug-PE's text FID. The matrix square root comes from scipy; its tiny imaginary part (numerical)
    is dropped, and a singular product is regularised by eps * I as in the reference implementation.
    """
    real = np.asarray(real, dtype=np.float64)
    synthetic = np.asarray(synthetic, dtype=np.float64)
    if real.ndim != 2 or synthetic.ndim != 2 or real.shape[1] != synthetic.shape[1]:
        raise ValueError(f"embedding shapes {real.shape} and {synthetic.shape} are not comparable")
    if len(real) < 2 or len(synthetic) < 2:
        raise ValueError("FID needs at least two embeddings on each side")
    import scipy.linalg

    mu_r, mu_s = real.mean(axis=0), synthetic.mean(axis=0)
    cov_r = np.cov(real, rowvar=False)
    cov_s = np.cov(synthetic, rowvar=False)
    covmean = scipy.linalg.sqrtm(cov_r @ cov_s)
    if not np.isfinite(covmean).all():
        offset = np.eye(cov_r.shape[0]) * 1e-6
        covmean = scipy.linalg.sqrtm((cov_r + offset) @ (cov_s + offset))
    covmean = np.real(covmean)
    diff = mu_r - mu_s
    value = float(diff @ diff + np.trace(cov_r) + np.trace(cov_s) - 2.0 * np.trace(covmean))
    return max(value, 0.0)


#: k of the k-nearest-neighbour balls of precision / recall / density / coverage (Naeem et al. 2020 use 5).
PRDC_NEAREST_K = 5


def _kth_neighbour_distance(features: np.ndarray, k: int) -> np.ndarray:
    """Each row's Euclidean distance to its k-th nearest other row (the radius of its k-NN ball)."""
    from sklearn.metrics import pairwise_distances

    distances = pairwise_distances(features, features, metric="euclidean")
    # the (k+1)-th smallest distance of a row counts the row itself (distance 0) as its first neighbour
    return np.partition(distances, k, axis=1)[:, k]


def precision_recall_density_coverage(real: np.ndarray, synthetic: np.ndarray,
                                      nearest_k: int = PRDC_NEAREST_K) -> dict[str, float]:
    """Precision, recall, density and coverage of synthetic embeddings against real ones (Naeem et al. 2020,
    "Reliable Fidelity and Diversity Metrics for Generative Models"; the definitions of the `prdc` package).

    With B_k(x) the ball around x whose radius is the distance to x's k-th nearest neighbour in its own set
    (strict inequality, as `prdc`):
    precision = share of synthetic points inside some real ball (fidelity);
    recall = share of real points inside some synthetic ball (diversity);
    density = (1 / k) * mean over synthetic points of the number of real balls holding it (fidelity that counts
    how crowded the real neighbourhood is; above 1 when synthetic points sit where real ones are dense);
    coverage = share of real points whose own ball holds at least one synthetic point (diversity).
    """
    real = np.asarray(real, dtype=np.float64)
    synthetic = np.asarray(synthetic, dtype=np.float64)
    if real.ndim != 2 or synthetic.ndim != 2 or real.shape[1] != synthetic.shape[1]:
        raise ValueError(f"embedding shapes {real.shape} and {synthetic.shape} are not comparable")
    if nearest_k < 1 or min(len(real), len(synthetic)) <= nearest_k:
        raise ValueError(f"precision/recall/density/coverage with k = {nearest_k} need more than {nearest_k} "
                         f"embeddings on each side (got {len(real)} real, {len(synthetic)} synthetic)")
    from sklearn.metrics import pairwise_distances

    real_radius = _kth_neighbour_distance(real, nearest_k)
    synthetic_radius = _kth_neighbour_distance(synthetic, nearest_k)
    real_to_synthetic = pairwise_distances(real, synthetic, metric="euclidean")  # (n_real, n_synthetic)
    in_real_ball = real_to_synthetic < real_radius[:, None]
    return {
        "precision": float(in_real_ball.any(axis=0).mean()),
        "recall": float((real_to_synthetic < synthetic_radius[None, :]).any(axis=1).mean()),
        "density": float(in_real_ball.sum(axis=0).mean() / nearest_k),
        "coverage": float((real_to_synthetic.min(axis=1) < real_radius).mean()),
        "nearest_k": float(nearest_k),
    }


def length_summary(texts: Iterable[str]) -> dict[str, float]:
    """Word-count distribution summary (mean, median, p10, p90, min, max)."""
    lengths = np.array([len(tokenize(t)) for t in texts], dtype=np.float64)
    if lengths.size == 0:
        return {"mean": 0.0, "median": 0.0, "p10": 0.0, "p90": 0.0, "min": 0.0, "max": 0.0}
    return {
        "mean": float(lengths.mean()),
        "median": float(np.median(lengths)),
        "p10": float(np.percentile(lengths, 10)),
        "p90": float(np.percentile(lengths, 90)),
        "min": float(lengths.min()),
        "max": float(lengths.max()),
    }


def word_lengths(texts: Iterable[str]) -> np.ndarray:
    return np.array([len(tokenize(t)) for t in texts], dtype=np.int64)


# ---------------------------------------------------------------- diversity
def distinct_n(texts: Iterable[str], n: int) -> float:
    """Distinct-n (Li et al. 2016): unique n-grams / all n-grams over the whole corpus."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    total = 0
    seen: set[tuple[str, ...]] = set()
    for text in texts:
        toks = tokenize(text)
        grams = [tuple(toks[i : i + n]) for i in range(len(toks) - n + 1)]
        total += len(grams)
        seen.update(grams)
    return float(len(seen) / total) if total else 0.0


def duplicate_rate(texts: Iterable[str]) -> float:
    """Share of documents that repeat an earlier document (after lower-casing and collapsing spaces)."""
    normalized = [" ".join(tokenize(t)) for t in texts]
    if not normalized:
        return 0.0
    counts = Counter(normalized)
    repeats = sum(c - 1 for c in counts.values())
    return float(repeats / len(normalized))


def terms_present(text: str, terms: Sequence[str]) -> list[bool]:
    """For each term, whether it occurs in ``text`` as whole words (case-insensitive; a multi-word term must
    appear contiguously; a term with no word in it never occurs). The test behind ``term_coverage``, and the one
    seed steering uses to know which terms an answer has written (tasks/llm/steering.py)."""
    padded = " " + " ".join(tokenize(text)) + " "
    phrases = (" ".join(tokenize(str(t))) for t in terms)
    return [bool(p) and " " + p + " " in padded for p in phrases]


def term_coverage(text: str, terms: Sequence[str]) -> float:
    """Share of a seed's distinct terms that occur in ``text`` as whole words (``terms_present``). THE coverage
    measure: best-of-k ranks candidates by it, rows carry it, and the report and the experiment tables average
    it (``seed_term_coverage``)."""
    distinct = [p for p in dict.fromkeys(" ".join(tokenize(str(t))) for t in terms) if p]
    if not distinct:
        return 0.0
    return sum(terms_present(text, distinct)) / len(distinct)


def seed_term_coverage(texts: Sequence[str], keyphrases: Sequence[Sequence[str]]) -> float:
    """Mean ``term_coverage`` over the documents that have seed terms (NaN when none has)."""
    shares = []
    for text, phrases in zip(texts, keyphrases, strict=True):
        phrases = [str(p) for p in (list(phrases) if phrases is not None else [])]
        if not any(tokenize(p) for p in phrases):
            continue
        shares.append(term_coverage(text, phrases))
    return float(np.mean(shares)) if shares else float("nan")


def degenerate_rate(texts: Sequence[str], keyphrases: Sequence[Sequence[str]] | None = None) -> float:
    """Share of texts that the document predicate (privseed.tasks.quality.document_rejection) rejects: loops, assistant
    talk, seed echoes, another language, ... A keyphrase list (an `--llm none` release) is not a document either."""
    from privseed.tasks.quality import document_rejection

    if not len(texts):
        return float("nan")
    seeds = keyphrases if keyphrases is not None else [()] * len(texts)
    return float(np.mean([document_rejection(t, k) is not None for t, k in zip(texts, seeds, strict=True)]))


# ---------------------------------------------------------------- cost
def llm_usage(release: pd.DataFrame) -> dict[str, float | str]:
    """LLM calls and tokens spent, from the release's generation columns.

    A row written by an LLM carries `backend` (not "none") and token counts; a `--llm none` release has
    no such columns (or backend == "none") and costs nothing. Rows that record several calls carry an
    `llm_calls` column, or (DP-KPS best of K) a `candidates` column; otherwise one row is one call.
    """
    if "backend" in release.columns:
        by_llm = release["backend"].fillna("none").astype(str).str.lower() != "none"
    else:
        by_llm = pd.Series(False, index=release.index)
        if "tokens_out" in release.columns:
            by_llm = release["tokens_out"].fillna(0) > 0
    llm_rows = release[by_llm]
    per_row = next((c for c in ("llm_calls", "candidates") if c in release.columns), None)
    if per_row:
        calls = float(pd.to_numeric(llm_rows[per_row], errors="coerce").fillna(1).sum())
    else:
        calls = float(len(llm_rows))
    tokens_in, tokens_out = (
        float(pd.to_numeric(llm_rows.get(column, pd.Series(dtype=float)), errors="coerce").fillna(0).sum())
        for column in ("tokens_in", "tokens_out"))
    backends = sorted({str(b) for b in llm_rows.get("backend", pd.Series(dtype=str)).dropna().unique()})
    models = sorted({str(m) for m in llm_rows.get("model", pd.Series(dtype=str)).dropna().unique()})
    return {
        "llm_calls": calls,
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "backends": ", ".join(backends) if backends else "none",
        "models": ", ".join(models) if models else "",
    }


def corpus_metrics(texts: Sequence[str], keyphrases: Sequence[Sequence[str]] | None = None) -> dict[str, float]:
    """Diversity and length metrics of a corpus in one dict (the report's 'corpus' table)."""
    out: dict[str, float] = {
        "documents": float(len(texts)),
        "distinct_1": distinct_n(texts, 1),
        "distinct_2": distinct_n(texts, 2),
        "duplicate_rate": duplicate_rate(texts),
    }
    out.update({f"words_{k}": v for k, v in length_summary(texts).items()})
    if keyphrases is not None:
        out["seed_term_coverage"] = seed_term_coverage(texts, keyphrases)
    out["degenerate_rate"] = degenerate_rate(texts, keyphrases)
    return out


def mean_and_spread(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0 for a single value) over seeds."""
    arr = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=np.float64)
    if arr.size == 0:
        return float("nan"), float("nan")
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else 0.0
