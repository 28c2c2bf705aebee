"""Per-class DP term histograms as keyphrase seeds: privseed's own comparator to DP-KPS (docs/dpkps.md).

Two methods, both on the public vocabulary V of ``tasks/seeds/vocabulary.py`` (multi-word terms included, the same
greedy longest-match extraction as DP-KPS):

``histogram``
    Per declared class c, H_c[v] = number of documents of class c whose first S *distinct* terms include v.
    Noise is added to EVERY term of V for every class (zero counts included: skipping them would reveal which
    terms occur). What is kept and how much each term weighs is post-processing of those noisy rows
    (``class_term_releases``): by default (``fdr``) the terms are split into two groups, the M terms with the
    largest noisy counts summed over the classes (a corpus-wide ranking that costs no budget) and the rest;
    within each group a class's K largest noisy counts get Benjamini-Hochberg q-values against pure noise of the
    group's size, and a term weighs its noisy count times (1 - q). The mass the q-values attribute to noise is
    the class's ``background_share`` (at most ``--hist-background-cap``): that share of the class's draws comes
    from the weights pooled over all classes, so that every class's sequences carry the corpus's common words at
    a similar rate (measured in experiments/results/dpkps.md: without it the classes whose lists are mostly noise
    lose their test documents to the classes with clean lists). ``clip`` keeps the K largest clipped counts as
    they are. Each sequence draws L terms i.i.d. with the selection rule (``SelectionRule``, e.g. power-G) on
    those weights.

``histogram-markov``
    Stage 1 is ``histogram`` with a part eps_1 of the budget. Stage 2 (eps_2 = eps - eps_1) releases, per class,
    co-occurrence counts of unordered term pairs among the class's P top-weighted terms of stage 1 (public after
    stage 1): each document of class c is reduced to its first S_2 distinct terms among them and adds 1 to each
    of its S_2 (S_2 - 1) / 2 pairs. Sequences are walks of a chain: the next term is drawn from the released
    pair counts of the current term (those above the noise floor) with probability ``pair_weight`` and from the
    stage-1 class distribution otherwise, so the sequences keep the class's terms and gain pairs that occur
    together in the class's documents.

Privacy (add/remove one document; a document belongs to exactly one class):
  * stage 1: a document adds 1 to at most S distinct coordinates of its own class's histogram, so the
    L1 sensitivity is S and the L2 sensitivity is sqrt(S). Laplace(S / eps) per coordinate -> eps-DP (the
    counts are integers, so tasks/dp/mechanisms.py draws the discrete Laplace of that scale: the same guarantee);
    Gaussian with sigma = z(eps, delta) sqrt(S) -> (eps, delta)-DP.
  * stage 1 with ``--hist-contribution unit-l2``: a document with n distinct terms of V adds 1 / sqrt(n) to
    each of them (all of them, however long the document) in its own class's row: a vector of L2 norm exactly 1,
    so the L2 sensitivity of the whole (classes, |V|) matrix is 1. Gaussian with sigma = z(eps, delta) ->
    (eps, delta)-DP (Laplace is refused: the L1 norm sqrt(n) has no bound independent of the document).
  * stage 2: a document's reduced sequence has at most S_2 distinct terms, so it adds 1 to at most
    S_2 (S_2 - 1) / 2 distinct pair coordinates: L1 sensitivity S_2 (S_2 - 1) / 2, L2 its square root. The
    candidate terms it conditions on are post-processing of stage 1's output (adaptive sequential composition).
  * classes: the class histograms are functions of disjoint parts of the corpus -> parallel composition
    (max over classes). Stages add: total = eps_1 + eps_2 (and delta_1 + delta_2 for Gaussian).
  * the summed ranking, q-values, top-K selection, background shares, sampling and everything after them are
    post-processing of released values (and public parameters: |V|, M, the mechanism's scale); sampling
    uses the public ``--seed`` generator only.

All noise is drawn by the mechanisms of ``tasks/dp/mechanisms.py``; this module never creates noise itself.
Nothing here does I/O or logs; the thin Prefect tasks are in ``tasks/stages/histogram.py``, the per-unit
counting of the streaming passes in ``tasks/seeds/passes.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from privseed.tasks.errors import ConfigError
from privseed.tasks.seeds.sampling import SelectionRule
from privseed.tasks.dp.mechanisms import Sensitivity, mechanism_kind
from privseed.tasks.seeds.seed_methods import HISTOGRAM_METHODS, SEED_METHODS, Contribution, contribution_kind


# ---------------------------------------------------------------------------------------------
# Counting (private; exact)
# ---------------------------------------------------------------------------------------------

def first_distinct_terms(term_ids: Iterable[int], max_terms: int, allowed: set[int] | None = None) -> list[int]:
    """The first ``max_terms`` distinct term ids in reading order (restricted to ``allowed`` when given).

    Distinctness is what bounds the L2 sensitivity by sqrt(S): a document adds at most 1 to any coordinate.
    """
    if max_terms < 1:
        raise ConfigError(f"terms per document S must be >= 1, got {max_terms}")
    seen: set[int] = set()
    out: list[int] = []
    for term in term_ids:
        term = int(term)
        if term in seen or (allowed is not None and term not in allowed):
            continue
        seen.add(term)
        out.append(term)
        if len(out) == max_terms:
            break
    return out


def class_term_counts(sequences: Iterable[Sequence[int]], class_index: Sequence[int] | np.ndarray, n_classes: int,
                      vocab_size: int, max_terms: int) -> np.ndarray:
    """Exact per-class histograms (n_classes, |V|) int64 of each document's first S distinct terms.

    Additive over disjoint shards (the map step sums them). One document changes only its own class's row,
    by at most S in L1 norm.
    """
    counts = np.zeros((n_classes, vocab_size), dtype=np.int64)
    for terms, c in zip(sequences, class_index, strict=True):
        kept = first_distinct_terms(terms, max_terms)
        if kept:
            counts[int(c), kept] += 1  # kept is duplicate-free, so fancy-index += counts each once
    return counts


def rank_l2_weights(n_terms: int, decay: float, term_weights: np.ndarray | None = None) -> np.ndarray:
    """The ``rank-l2`` contribution of a document with ``n_terms`` distinct terms, in reading order: the i-th
    weighs i^-decay, scaled to L2 norm exactly 1 (decay 0 is ``unit-l2``; a larger decay leans on the first
    terms, a title's, as ``first-terms`` does, and still counts every later term). ``term_weights`` (n_terms,)
    positive public factors, one per term in the same order (``rank-rare-l2``: ``common_word_weights``), multiply
    the i-th before the scaling, so the norm is still exactly 1."""
    raw = np.arange(1, n_terms + 1, dtype=np.float64) ** -float(decay)
    if term_weights is not None:
        raw = raw * np.asarray(term_weights, dtype=np.float64)
    return raw / np.sqrt(np.sum(raw * raw))


def common_word_weights(vocab_size: int, common_rank: int, power: float) -> np.ndarray:
    """(|V|,) public factors of ``rank-rare-l2``: the term at position r of V (0-based; the English list is in
    wordfreq's frequency order, so r is its rank among V's words) weighs min(1, (r + 1) / R)^a, R =
    ``common_rank`` and a = ``power``: the R most common words of public English count less the more common they
    are ("patients", "study", "long"), so a document's unit of L2 norm goes to the rarer, more specific words. A
    function of public data alone: the sensitivity stays 1."""
    if common_rank < 1 or not np.isfinite(power) or power < 0:
        raise ConfigError(f"common-word weights need a rank >= 1 and a power >= 0, got {common_rank}, {power}")
    return np.minimum(1.0, (np.arange(vocab_size, dtype=np.float64) + 1.0) / float(common_rank)) ** float(power)


def class_rank_l2_weights(sequences: Iterable[Sequence[int]], class_index: Sequence[int] | np.ndarray,
                          n_classes: int, vocab_size: int, decay: float,
                          term_weights: np.ndarray | None = None) -> np.ndarray:
    """Exact per-class sums (n_classes, |V|) float64 of each document's ``rank-l2`` contribution: its n distinct
    terms of V in the order they first occur, the i-th adding ``rank_l2_weights(n, decay)[i]`` to its class's
    row. Every document's vector has L2 norm exactly 1, whatever its length and its label, so removing or adding
    one document moves the whole (n_classes, |V|) matrix by exactly 1 in L2 norm (it lives in its own class's row
    only): the Gaussian mechanism on L2 sensitivity 1 covers it. Decay 0 is ``unit-l2``: 1 / sqrt(n) on each of
    the n terms. ``term_weights`` (|V|,) public positive factors per term of V (``rank-rare-l2``) multiply each
    term's rank weight before the scaling to norm 1. A document with no term of V contributes nothing. Additive
    over disjoint shards."""
    weights = np.zeros((n_classes, vocab_size), dtype=np.float64)
    for terms, c in zip(sequences, class_index, strict=True):
        distinct = np.fromiter(dict.fromkeys(int(t) for t in terms), dtype=np.int64)
        if distinct.size:
            factors = None if term_weights is None else term_weights[distinct]
            weights[int(c), distinct] += rank_l2_weights(distinct.size, decay, factors)
    return weights


def class_pair_counts(sequences: Iterable[Sequence[int]], class_index: Sequence[int] | np.ndarray,
                      candidate_ids: Sequence[np.ndarray], pair_terms: int) -> np.ndarray:
    """Exact co-occurrence counts (C, P (P - 1) / 2) of unordered pairs among each class's P candidate terms.

    ``candidate_ids[c]`` are the P term ids of class c (public: chosen from stage 1's release). A document of class
    c is reduced to its first S_2 = ``pair_terms`` distinct terms among them and adds 1 to each of its
    S_2 (S_2 - 1) / 2 pairs; pair (i, j), i < j (positions in ``candidate_ids[c]``), sits at column
    ``pair_columns(P_c)[i, j]`` (the upper triangle, row by row) of the class's own P_c = len(candidate_ids[c]):
    a class with fewer candidates fills the first P_c (P_c - 1) / 2 columns, zeros after them."""
    n_classes = len(candidate_ids)
    p = max((len(ids) for ids in candidate_ids), default=0)
    columns = [pair_columns(len(ids)) for ids in candidate_ids]
    position = [{int(t): i for i, t in enumerate(ids)} for ids in candidate_ids]
    counts = np.zeros((n_classes, p * (p - 1) // 2), dtype=np.int64)
    for terms, c in zip(sequences, class_index, strict=True):
        c = int(c)
        where = position[c]
        kept = sorted(where[t] for t in first_distinct_terms(terms, pair_terms, allowed=set(where)))
        for n, i in enumerate(kept):
            for j in kept[n + 1:]:
                counts[c, columns[c][i, j]] += 1  # distinct terms -> distinct pairs, each counted once
    return counts


def pair_columns(p: int) -> np.ndarray:
    """(P, P) column of pair (i, j) in a flattened upper triangle (i < j), symmetric, -1 on the diagonal."""
    columns = np.full((p, p), -1, dtype=np.int64)
    rows, cols = np.triu_indices(p, 1)
    columns[rows, cols] = columns[cols, rows] = np.arange(len(rows))
    return columns


def class_positions(class_labels: Sequence, labels: Sequence) -> list[int]:
    """Position of each document's label in the declared label list (labels compared as strings)."""
    where = {str(label): i for i, label in enumerate(class_labels)}
    try:
        return [where[str(label)] for label in labels]
    except KeyError:
        # Names no label: the flow checks the corpus's labels against the declared set before counting.
        raise ConfigError("a document's label is not in the declared label set") from None


# ---------------------------------------------------------------------------------------------
# Release (through tasks/dp/mechanisms.py) and the budget split
# ---------------------------------------------------------------------------------------------

def l1_sensitivity(max_terms: int) -> float:
    """L1 sensitivity of one class histogram (stage 1): S."""
    return float(max_terms)


def l2_sensitivity(max_terms: int) -> float:
    """L2 sensitivity of the same vector: at most S coordinates move, each by at most 1 -> sqrt(S)."""
    return math.sqrt(max_terms)


def pair_l1_sensitivity(pair_terms: int) -> float:
    """L1 sensitivity of one class's pair counts (stage 2): S_2 (S_2 - 1) / 2 distinct pairs, 1 each."""
    if pair_terms < 2:
        raise ConfigError(f"a pair needs two terms: --markov-pair-terms must be >= 2, got {pair_terms}")
    return float(pair_terms * (pair_terms - 1) // 2)


def stage_budgets(method: str, epsilon: float, delta: float, term_share: float) -> list[tuple[float, float]]:
    """(epsilon, delta) of each stage; they add up to (epsilon, delta) by basic composition."""
    if not (np.isfinite(epsilon) and epsilon > 0):
        raise ConfigError(f"epsilon must be a positive finite number, got {epsilon}")
    if method not in HISTOGRAM_METHODS:
        raise ConfigError(f"unknown histogram method {method!r}; expected one of {HISTOGRAM_METHODS}")
    if not SEED_METHODS[method].ordered_pairs:
        return [(epsilon, delta)]
    # the terms, then the co-occurrence pairs that order them
    if not 0.0 < term_share < 1.0:
        raise ConfigError(f"--markov-term-share must be in (0, 1), got {term_share}")
    return [(epsilon * term_share, delta * term_share), (epsilon * (1 - term_share), delta * (1 - term_share))]


#: The L2 norm of one document's ``unit-l2`` or ``rank-l2`` contribution: its whole sensitivity (how a document
#: enters stage 1 is ``privseed.tasks.seeds.seed_methods.Contribution``).
UNIT_L2_SENSITIVITY = 1.0


def contribution_sensitivity(contribution: Contribution, max_terms: int) -> Sensitivity:
    """The ``Sensitivity`` of the whole (classes, |V|) matrix under add/remove of one document that enters stage 1
    as ``contribution``: L1 S (counts) for ``first-terms``, L2 1 for the whole-document kinds."""
    if contribution.decay is None:
        return Sensitivity.of_counts(l1_sensitivity(max_terms))
    return Sensitivity(l2=UNIT_L2_SENSITIVITY)


def contribution_weights(contribution: Contribution, documents: Iterable[Sequence[int]],
                         class_index: Sequence[int] | np.ndarray, n_classes: int, vocab_size: int,
                         max_terms: int) -> np.ndarray:
    """The exact (classes, |V|) matrix of these documents as ``contribution`` adds them up (term ids in reading
    order; additive over shards): first-S counts, or rank-weighted rows of L2 norm 1 with the public common-word
    factors of ``rank-rare-l2``."""
    if contribution.decay is None:
        return class_term_counts(documents, class_index, n_classes, vocab_size, max_terms)
    factors = (None if contribution.common_rank is None
               else common_word_weights(vocab_size, contribution.common_rank, contribution.common_power))
    return class_rank_l2_weights(documents, class_index, n_classes, vocab_size, contribution.decay, factors)


def build_mechanism(kind: str, max_terms: int, epsilon: float, delta: float,
                    contribution: str = "first-terms") -> Any:
    """The mechanism of stage 1 (``contribution_sensitivity``): for ``first-terms`` Laplace on L1 sensitivity S,
    or Gaussian on L2 sensitivity sqrt(S); for ``unit-l2`` and ``rank-l2`` Gaussian on L2 sensitivity 1. Sigma is
    calibrated for (epsilon, delta) by dp-accounting's PLD accountant."""
    return mechanism_kind(kind).calibrated(contribution_sensitivity(contribution_kind(contribution), max_terms),
                                           epsilon, delta)


def pair_mechanism(kind: str, pair_terms: int, epsilon: float, delta: float) -> Any:
    """The mechanism of stage 2 (pair counts): L1 sensitivity S_2 (S_2 - 1) / 2, L2 its square root."""
    return _mechanism(kind, pair_l1_sensitivity(pair_terms), epsilon, delta)


def _mechanism(kind: str, l1: float, epsilon: float, delta: float) -> Any:
    """The kind's mechanism for a vector of 0/1-per-coordinate counts of L1 sensitivity ``l1``: Laplace on it, or
    Gaussian on L2 sensitivity sqrt(l1) (each coordinate moves by at most 1, so the L2 norm of a change is the
    square root of its L1 norm), sigma calibrated by dp-accounting's PLD accountant."""
    return mechanism_kind(kind).calibrated(Sensitivity.of_counts(l1), epsilon, delta)


def release_all(exact: np.ndarray, mechanism: Any, noise: Any) -> np.ndarray:
    """Noise on every entry of ``exact`` (any shape) in ONE call of the mechanism (the noise source's per-call
    overhead dominates at |V| x classes ~ 10^6 draws). Integer counts with an integer sensitivity get the
    discrete Laplace distribution of the same scale (tasks/dp/mechanisms.py: same guarantee, exact on integers,
    faster to sample). Returns float64 of the same shape."""
    flat = np.ascontiguousarray(exact).reshape(-1)
    noisy = np.asarray(mechanism.release(flat, noise), dtype=np.float64)
    if noisy.shape != flat.shape:
        raise ConfigError(f"the mechanism returned shape {noisy.shape} for input {flat.shape}")
    return noisy.reshape(np.shape(exact))


def top_k(noisy: np.ndarray, k: int) -> dict[str, np.ndarray]:
    """The K largest noisy counts of one class (post-processing), by decreasing count."""
    if k < 1:
        raise ConfigError(f"K (terms kept per class) must be >= 1, got {k}")
    k = min(k, noisy.shape[0])
    ids = np.argpartition(-noisy, k - 1)[:k]
    ids = ids[np.argsort(-noisy[ids], kind="stable")]
    return {"term_ids": ids.astype(np.int64), "noisy_counts": noisy[ids].astype(np.float64)}


# ---------------------------------------------------------------------------------------------
# Post-processing of the released rows (public: released values and public parameters only)
# ---------------------------------------------------------------------------------------------

def noise_floor(mechanism: Any, entries: int, expected_false: float) -> float:
    """The count that pure noise exceeds in ``expected_false`` of ``entries`` noisy entries on average: one draw
    exceeds it with probability expected_false / entries. Public (mechanism parameters and the entry count only).
    Laplace(b): b ln(entries / (2 expected_false)); Gaussian(sigma): sigma * Phi^-1(1 - expected_false / entries)."""
    if expected_false <= 0:
        return 0.0
    tail = min(0.5, expected_false / max(1, entries))
    return float(mechanism.noise_distribution().isf(tail))


def above_floor(values: np.ndarray, floor: float) -> np.ndarray:
    """Released counts with every entry below ``floor`` set to 0 (and negatives clipped): a count that noise
    alone reaches carries little signal. Post-processing of released values."""
    return np.where(values >= floor, np.maximum(values, 0.0), 0.0)


def noise_tail(mechanism: Any, values: np.ndarray, discrete: bool) -> np.ndarray:
    """P(noise >= value) for the mechanism's noise (discrete Laplace on integer counts, else continuous)."""
    return mechanism.noise_tail(values, discrete)


def bh_q_values(descending: np.ndarray, entries: int, tail: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg q-values of the r largest of ``entries`` noisy counts against "the count is pure noise":
    q_r = min over j >= r of min(1, entries * P(noise >= y_j) / j). ``descending`` holds the top values in
    decreasing order (ranks 1..r among all ``entries``), ``tail`` their P(noise >= y). entries * tail / j is
    how many pure-noise entries are expected at or above y_j, over how many were seen there."""
    if len(descending) == 0:
        return np.zeros(0)
    if np.any(np.diff(descending) > 0):
        raise ConfigError("q-values need the noisy counts in decreasing order")
    ratio = np.minimum(1.0, entries * np.asarray(tail, dtype=np.float64) / np.arange(1, len(descending) + 1))
    return np.minimum.accumulate(ratio[::-1])[::-1]


@dataclass(frozen=True)
class ClassRelease:
    """What one class's sequences are drawn from (all post-processing of released values).

    ``term_ids`` (into V) and their ``weights`` (>= 0); ``background_share``: the share of draws taken from the
    weights pooled over every class instead (``background_distribution``). For the Markov method, ``pair_ids``
    (P term ids, into V) and ``pair_weights`` (P, P), symmetric, the released co-occurrence counts above the
    noise floor (0 elsewhere)."""

    term_ids: np.ndarray
    weights: np.ndarray
    background_share: float = 0.0
    pair_ids: np.ndarray | None = None
    pair_weights: np.ndarray | None = None


DENOISE_RULES = ("clip", "fdr")


def class_term_releases(noisy: np.ndarray, mechanism: Any, k: int, candidates: int,
                        denoise: str = "fdr", background_cap: float = 1.0) -> list[ClassRelease]:
    """Per class, the terms and weights sequences are drawn from, from the noisy rows (C, |V|) of stage 1.

    ``clip``: the K largest noisy counts, clipped at 0. ``fdr``: V is split into the ``candidates`` terms with
    the largest noisy counts summed over the classes (a corpus-wide ranking: the sum's noise grows as sqrt(C),
    its signal as the corpus) and the rest; in each group the class's K largest counts get Benjamini-Hochberg
    q-values against pure noise over the group's size, and weigh max(count, 0) * (1 - q): a term among the
    candidates competes with M noise draws, not |V|. The K heaviest of both groups are kept; the share of
    their clipped mass the q-values attribute to noise becomes the class's ``background_share``, at most
    ``background_cap``: a class whose list is mostly noise draws mostly from the pooled classes, so its sequences
    read like the corpus average and pull generic test documents of other classes; below 1 the cap keeps part of
    its own (noisy) terms instead (experiments/results/dpkps.md, "The background share capped").
    Integer rows are discrete-Laplace releases (their tail is the discrete one)."""
    if denoise not in DENOISE_RULES:
        raise ConfigError(f"unknown denoising rule {denoise!r}; choose one of {DENOISE_RULES}")
    if not 0.0 <= background_cap <= 1.0:
        raise ConfigError(f"the background share cap must lie in [0, 1], got {background_cap}")
    discrete = np.issubdtype(np.asarray(noisy).dtype, np.integer)
    noisy = np.asarray(noisy, dtype=np.float64)
    if noisy.ndim != 2:
        raise ConfigError(f"expected the noisy class histograms as a (classes, |V|) array, got shape {noisy.shape}")
    if denoise == "clip":
        out = []
        for row in noisy:
            kept = top_k(row, k)
            out.append(ClassRelease(kept["term_ids"], np.maximum(kept["noisy_counts"], 0.0)))
        return out
    if candidates < 1:
        raise ConfigError(f"the candidate group needs M >= 1 terms, got {candidates}")
    vocab = noisy.shape[1]
    in_group = np.zeros(vocab, dtype=bool)
    in_group[top_k(noisy.sum(axis=0), candidates)["term_ids"]] = True
    groups = [np.flatnonzero(in_group), np.flatnonzero(~in_group)]
    out = []
    for row in noisy:
        ids, clipped, weights = [], [], []
        for group in (g for g in groups if len(g)):
            kept = top_k(row[group], k)
            values = kept["noisy_counts"]
            q = bh_q_values(values, len(group), noise_tail(mechanism, values, discrete))
            ids.append(group[kept["term_ids"]])
            clipped.append(np.maximum(values, 0.0))
            weights.append(np.maximum(values, 0.0) * (1.0 - q))
        ids_, clipped_, weights_ = (np.concatenate(x) for x in (ids, clipped, weights))
        order = np.argsort(-weights_, kind="stable")[:k]
        mass, own = clipped_[order].sum(), weights_[order].sum()
        share = min(background_cap, max(0.0, 1.0 - own / mass)) if mass > 0 and own > 0 else 1.0
        out.append(ClassRelease(ids_[order].astype(np.int64), weights_[order], float(share)))
    return out


def pair_candidates(release: ClassRelease, p: int) -> np.ndarray:
    """The P heaviest term ids of a class (stage 2 counts pairs among them): post-processing of stage 1."""
    if p < 2:
        raise ConfigError(f"pairs need at least 2 candidate terms per class, got {p}")
    order = np.argsort(-np.asarray(release.weights, dtype=np.float64), kind="stable")[:p]
    return np.asarray(release.term_ids)[order].astype(np.int64)


def pair_matrix(noisy_pairs: np.ndarray, p: int, floor: float) -> np.ndarray:
    """(P, P) symmetric weights from one class's released upper-triangle pair counts; below ``floor``: 0."""
    values = above_floor(np.asarray(noisy_pairs, dtype=np.float64), floor)
    if values.shape != (p * (p - 1) // 2,):
        raise ConfigError(f"expected {p * (p - 1) // 2} pair counts for {p} terms, got shape {values.shape}")
    matrix = np.zeros((p, p))
    rows, cols = np.triu_indices(p, 1)
    matrix[rows, cols] = matrix[cols, rows] = values
    return matrix


def background_distribution(releases: Sequence[ClassRelease]) -> tuple[np.ndarray, np.ndarray]:
    """(term ids, probabilities) of the weights pooled over every class: the corpus-wide term distribution a
    class's ``background_share`` of draws comes from."""
    ids = np.concatenate([np.asarray(r.term_ids, dtype=np.int64) for r in releases])
    weights = np.concatenate([np.maximum(np.asarray(r.weights, dtype=np.float64), 0.0) for r in releases])
    unique, inverse = np.unique(ids, return_inverse=True)
    pooled = np.bincount(inverse, weights=weights, minlength=len(unique))
    if pooled.sum() <= 0:
        pooled = np.ones_like(pooled)
    return unique, pooled / pooled.sum()


# ---------------------------------------------------------------------------------------------
# Sampling (post-processing; public rng)
# ---------------------------------------------------------------------------------------------

def released_support(release: ClassRelease) -> int:
    """How many distinct terms the class's release weighs above 0 (public: computed from released values)."""
    return int(np.count_nonzero(np.asarray(release.weights, dtype=np.float64) > 0))


def short_release_fallback(release: ClassRelease, length: int) -> ClassRelease:
    """A class whose release weighs fewer than ``length`` distinct terms (a small class under the thresholded
    histogram, whose noisy counts rarely pass the threshold; or a class the noise left empty) cannot fill a
    sequence of distinct-looking seeds: its sequences would repeat and the release gate's duplicate test would
    refuse the whole release after the budget was spent. Such a class takes the missing share of its draws from
    the terms released for every class (``background_distribution``): at least 1 - support / L, all of them when
    it released nothing. Post-processing of released values only: no privacy cost, no private count read."""
    support = released_support(release)
    if support >= length:
        return release
    share = max(float(release.background_share), 1.0 - support / float(length))
    return ClassRelease(release.term_ids, release.weights, share, release.pair_ids, release.pair_weights)


def _class_draws(release: ClassRelease, shape: tuple[int, ...], rule: SelectionRule, rng: np.random.Generator,
                 background: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """Term ids of the given shape from the class's distribution: the rule's weights on ``release.weights``,
    each draw replaced by a background draw with probability ``release.background_share`` (every draw when the
    class weighs no term: ``short_release_fallback``)."""
    weights = rule.weights(np.asarray(release.weights, dtype=np.float64)[None, :])[0] if len(release.weights) else \
        np.zeros(0)
    if not weights.size or not weights.sum() > 0:
        if background is None or release.background_share < 1.0:
            raise ConfigError("a class that released no term draws from the pooled background only "
                              "(short_release_fallback)")
        ids, probabilities = background
        return ids[rng.choice(len(ids), size=shape, p=probabilities)].astype(np.int64)
    draws = np.asarray(release.term_ids)[rng.choice(len(weights), size=shape, p=weights / weights.sum())]
    if release.background_share > 0:
        if background is None:
            raise ConfigError("a class with a background share needs the pooled background distribution")
        ids, probabilities = background
        pooled = ids[rng.choice(len(ids), size=shape, p=probabilities)]
        draws = np.where(rng.random(shape) < release.background_share, pooled, draws)
    return draws.astype(np.int64)


def sample_independent(release: ClassRelease, n_sequences: int, length: int, rule: SelectionRule,
                       rng: np.random.Generator, background: tuple[np.ndarray, np.ndarray] | None = None
                       ) -> np.ndarray:
    """(n_sequences, length) term ids, i.i.d. draws from the class's distribution (``_class_draws``)."""
    return _class_draws(release, (n_sequences, length), rule, rng, background)


def sample_markov(release: ClassRelease, n_sequences: int, length: int, rule: SelectionRule,
                  rng: np.random.Generator, background: tuple[np.ndarray, np.ndarray] | None = None,
                  pair_weight: float = 0.5) -> np.ndarray:
    """(n_sequences, length) term ids of a chain: the first term from the class's distribution; then, when the
    current term is a pair candidate with released pairs (``pair_weights`` above the floor), with probability
    ``pair_weight`` the next term is drawn in proportion to its pair counts (the rule's power applied), and
    otherwise from the class's distribution. Every step of the second kind is exactly a ``histogram`` draw,
    which is what keeps the class signal; the first kind adds pairs that occur together in the class."""
    if release.pair_ids is None or release.pair_weights is None:
        raise ConfigError("the Markov sampler needs released pair counts")
    if not 0.0 <= pair_weight <= 1.0:
        raise ConfigError(f"--markov-pair-weight must lie in [0, 1], got {pair_weight}")
    transition = np.asarray(release.pair_weights, dtype=np.float64)
    if rule.kind == "power":
        transition = transition**rule.power
    elif rule.kind != "proportional":
        raise ConfigError(f"the Markov sampler supports proportional and power-G selection, not {rule}")
    pair_ids = np.asarray(release.pair_ids, dtype=np.int64)
    order = np.argsort(pair_ids)
    has_pairs = transition.sum(axis=1) > 0
    cumulative = np.cumsum(transition, axis=1)
    out = _class_draws(release, (n_sequences, length), rule, rng, background)  # the class draws of every step
    follow = rng.random((n_sequences, length)) < pair_weight
    uniforms = rng.random((n_sequences, length))
    for step in range(1, length):
        current = out[:, step - 1]
        at = np.searchsorted(pair_ids, current, sorter=order).clip(0, len(pair_ids) - 1)
        position = order[at]
        walk = follow[:, step] & (pair_ids[position] == current) & has_pairs[position]
        if walk.any():
            rows = cumulative[position[walk]]
            pick = (rows <= (uniforms[walk, step] * rows[:, -1])[:, None]).sum(axis=1)
            out[walk, step] = pair_ids[np.minimum(pick, len(pair_ids) - 1)]
    return out


def sample_class_sequences(method: str, releases: Sequence[ClassRelease], per_class: int, length: int,
                           rule: SelectionRule, rng: np.random.Generator,
                           pair_weight: float = 0.5) -> list[list[list[int]]]:
    """Per class, ``per_class`` sequences of term ids (into V), in declared-label order."""
    if method not in HISTOGRAM_METHODS:
        raise ConfigError(f"unknown histogram method {method!r}; expected one of {HISTOGRAM_METHODS}")
    releases = [short_release_fallback(r, length) for r in releases]
    if not any(released_support(r) for r in releases):
        raise ConfigError("no class released any term: the noise hides every count at this budget; raise --epsilon "
                          "(or, with --mechanism laplace-threshold, use the default Gaussian mechanism)")
    background = background_distribution(releases) if any(r.background_share > 0 for r in releases) else None
    out = []
    for r in releases:
        if SEED_METHODS[method].ordered_pairs:
            ids = sample_markov(r, per_class, length, rule, rng, background, pair_weight)
        else:
            ids = sample_independent(r, per_class, length, rule, rng, background)
        out.append([[int(t) for t in row] for row in ids])
    return out


#: ``seed_pool``: an ``auto`` pool samples this many sequences a class (more when ``per_class`` is more). 500, not a
#: multiple of ``per_class``: 20 kept of 100 gained a third to a half of what 20 kept of 500 gained, and 500 kept of
#: 2,500 moved the README's four seeds-only sets by -0.4 to +0.8 (experiments/results/dpkps.md, "Seeds kept from a
#: larger pool"), so a seeds-only release of 500 a class keeps its sequences as drawn.
SEED_POOL_MIN = 500


def seed_pool(per_class: int, option: int | str) -> int:
    """How many sequences a class samples before ``most_typical`` keeps ``per_class``: the option's number, or
    ``SEED_POOL_MIN`` for ``auto``; never fewer than ``per_class`` (then every sequence is kept as drawn)."""
    return max(per_class, SEED_POOL_MIN if option == "auto" else int(option))


def typicality_margins(ids: Sequence[Sequence[Sequence[int]]]) -> list[np.ndarray]:
    """Per class, each sequence's margin under the multinomial naive Bayes of all the sequences: the log likelihood
    of its term ids in its own class minus the largest in another (term counts over every class's sequences,
    add-one smoothing over the terms they hold, equal priors). A sequence whose terms its class holds often and the
    others rarely has a large margin; one of common or other classes' terms a small or negative one."""
    terms = np.unique(np.concatenate([np.asarray(s, dtype=np.int64).ravel() for c in ids for s in c]
                                     or [np.zeros(0, dtype=np.int64)]))
    counts = np.ones((len(ids), len(terms)))  # add-one smoothing
    columns = [np.searchsorted(terms, np.asarray(c, dtype=np.int64).reshape(len(c), -1)) for c in ids]
    for c, cols in enumerate(columns):
        np.add.at(counts[c], cols.ravel(), 1.0)
    log_probs = np.log(counts / counts.sum(axis=1, keepdims=True))
    margins = []
    for c, cols in enumerate(columns):
        scores = log_probs[:, cols].sum(axis=2) if cols.size else np.zeros((len(ids), len(cols)))  # (classes, n)
        others = np.delete(scores, c, axis=0)
        margins.append(scores[c] - (others.max(axis=0) if len(others) else 0.0))
    return margins


def most_typical(ids: Sequence[Sequence[Sequence[int]]], keep: int) -> list[list[list[int]]]:
    """Per class, the ``keep`` sequences with the largest ``typicality_margins`` (ties: the earlier drawn), in the
    order they were drawn; a repeat of a kept sequence is passed over while others are left (the clearest terms are
    drawn most often, and the release gate refuses repeated rows); a class with at most ``keep`` keeps all of them.

    Sampling a pool larger than the seeds a run needs and keeping the ones that read most as their class gives a
    small release its class's clearest seeds: 20 of 500 a class, the outside evaluator scores the seeds 1.6-9.4
    points higher than 20 drawn alone on four kinds of corpus, and the documents written from them gain with them
    (docs/dpkps.md, "Seeds kept from a larger pool"). Post-processing of sampled sequences: no budget, no private
    value read."""
    margins = typicality_margins(ids)
    kept = []
    for sequences, margin in zip(ids, margins):
        if len(sequences) <= keep:
            kept.append([list(s) for s in sequences])
            continue
        distinct: list[int] = []
        repeats: list[int] = []
        seen: set[tuple[int, ...]] = set()
        for i in np.argsort(-margin, kind="stable").tolist():
            key = tuple(sequences[i])
            (repeats if key in seen else distinct).append(i)
            seen.add(key)
        kept.append([list(sequences[i]) for i in sorted((distinct + repeats)[:keep])])
    return kept


# ---------------------------------------------------------------------------------------------
# Coherence (measured on PUBLIC documents only)
# ---------------------------------------------------------------------------------------------

def pair_coherence(sequences: Sequence[Sequence[str]], labels: Sequence, reference_docs: Sequence[Sequence[str]],
                   reference_labels: Sequence) -> float:
    """Share of adjacent term pairs (a, b) of the sequences that occur together (anywhere) in at least one
    reference document of the sequence's own class. Pairs of a term with itself are skipped. The reference
    documents must be public (e.g. a test split), given as their extracted terms. NaN when no pair exists."""
    by_class: dict[str, dict[str, set[int]]] = {}
    for doc_id, (terms, label) in enumerate(zip(reference_docs, reference_labels, strict=True)):
        postings = by_class.setdefault(str(label), {})
        for term in set(terms):
            postings.setdefault(term, set()).add(doc_id)
    hits = total = 0
    for seq, label in zip(sequences, labels, strict=True):
        postings = by_class.get(str(label), {})
        for a, b in zip(seq[:-1], seq[1:]):
            if a == b:
                continue
            total += 1
            docs_a, docs_b = postings.get(a), postings.get(b)
            if docs_a and docs_b and not docs_a.isdisjoint(docs_b):
                hits += 1
    return hits / total if total else float("nan")
