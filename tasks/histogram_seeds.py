"""Per-class DP term histograms as keyphrase seeds: privseed's own comparator to DP-KPS (docs/dpkps.md).

Two methods, both on the public vocabulary V of ``tasks/vocabulary.py`` (multi-word terms included, the same
greedy longest-match extraction as DP-KPS):

``histogram``
    Per declared class c, H_c[v] = number of documents of class c whose first S *distinct* terms include v.
    Noise is added to EVERY term of V for every class (zero counts included: skipping them would reveal which
    terms occur), the K largest noisy counts per class are kept, and each sequence draws L terms i.i.d. with
    probability given by the selection rule on the clipped noisy counts (``SelectionRule``, e.g. power-G).

``histogram-markov``
    Stage 1 is ``histogram`` with a part eps_1 of the budget. Stage 2 (eps_2 = eps - eps_1) releases, per class,
    counts of ordered adjacent term pairs among the class's K released terms: each document of class c is
    reduced to its first S distinct terms *that are in the class's released set* (public after stage 1), and
    contributes one start count (its first such term) and one count per adjacent pair. Sequences are walks of
    a Markov chain over those released counts (start ~ starts, next ~ pairs of the current term; terms are not
    repeated within a sequence; a row with no positive weight falls back to the stage-1 counts).

Privacy (add/remove one document; a document belongs to exactly one class):
  * stage 1: a document adds 1 to at most S distinct coordinates of its own class's histogram, so the
    L1 sensitivity is S and the L2 sensitivity is sqrt(S). Laplace(S / eps) per coordinate -> eps-DP (the
    counts are integers, so tasks/mechanisms.py draws the discrete Laplace of that scale: the same guarantee);
    Gaussian with sigma = z(eps, delta) sqrt(S) -> (eps, delta)-DP.
  * stage 2: a document's reduced sequence has at most S distinct terms, so it adds 1 to at most one start
    coordinate and at most S - 1 distinct pair coordinates (distinct terms -> distinct pairs): the joint
    vector (starts, pairs) has L1 sensitivity S and L2 sensitivity sqrt(S). The released top-K set it
    conditions on is a DP output of stage 1 (adaptive sequential composition).
  * classes: the class histograms are functions of disjoint parts of the corpus -> parallel composition
    (max over classes). Stages add: total = eps_1 + eps_2 (and delta_1 + delta_2 for Gaussian).
  * top-K selection, sampling and everything after them are post-processing of released values; they use
    the public ``--seed`` generator only.

All noise is drawn by the mechanisms of ``tasks/mechanisms.py``; this module never creates noise itself.
Nothing here does I/O or logs; the thin Prefect tasks are in ``tasks/stages/histogram.py``, the per-unit
counting of the streaming passes in ``tasks/passes.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tasks.errors import ConfigError
from tasks.sampling import SelectionRule

HISTOGRAM_METHODS = ("histogram", "histogram-markov")


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


def class_pair_counts(sequences: Iterable[Sequence[int]], class_index: Sequence[int] | np.ndarray,
                      released_ids: Sequence[np.ndarray], max_terms: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact start counts (C, K) and adjacent-pair counts (C, K, K) over each class's released terms.

    ``released_ids[c]`` are the K term ids released for class c (public). A document of class c is reduced to
    its first S distinct terms among them; it adds 1 to the start count of its first such term and 1 to each of
    its at most S - 1 adjacent (ordered) pairs, positions indexing ``released_ids[c]``.
    """
    n_classes = len(released_ids)
    k = max((len(ids) for ids in released_ids), default=0)
    position = [{int(t): i for i, t in enumerate(ids)} for ids in released_ids]
    starts = np.zeros((n_classes, k), dtype=np.int64)
    pairs = np.zeros((n_classes, k, k), dtype=np.int64)
    for terms, c in zip(sequences, class_index, strict=True):
        c = int(c)
        where = position[c]
        kept = first_distinct_terms(terms, max_terms, allowed=set(where))
        if not kept:
            continue
        idx = [where[t] for t in kept]
        starts[c, idx[0]] += 1
        if len(idx) > 1:
            pairs[c, idx[:-1], idx[1:]] += 1  # distinct terms -> distinct pairs, each counted once
    return starts, pairs


def class_positions(class_labels: Sequence, labels: Sequence) -> list[int]:
    """Position of each document's label in the declared label list (labels compared as strings)."""
    where = {str(label): i for i, label in enumerate(class_labels)}
    try:
        return [where[str(label)] for label in labels]
    except KeyError:
        # Names no label: the flow checks the corpus's labels against the declared set before counting.
        raise ConfigError("a document's label is not in the declared label set") from None


# ---------------------------------------------------------------------------------------------
# Release (through tasks/mechanisms.py) and the budget split
# ---------------------------------------------------------------------------------------------

def l1_sensitivity(max_terms: int) -> float:
    """L1 sensitivity of one class histogram (stage 1) or of (starts, pairs) (stage 2): S."""
    return float(max_terms)


def l2_sensitivity(max_terms: int) -> float:
    """L2 sensitivity of the same vectors: at most S coordinates move, each by at most 1 -> sqrt(S)."""
    return math.sqrt(max_terms)


def stage_budgets(method: str, epsilon: float, delta: float, term_share: float) -> list[tuple[float, float]]:
    """(epsilon, delta) of each stage; they add up to (epsilon, delta) by basic composition."""
    if not (np.isfinite(epsilon) and epsilon > 0):
        raise ConfigError(f"epsilon must be a positive finite number, got {epsilon}")
    if method == "histogram":
        return [(epsilon, delta)]
    if method == "histogram-markov":
        if not 0.0 < term_share < 1.0:
            raise ConfigError(f"--markov-term-share must be in (0, 1), got {term_share}")
        return [(epsilon * term_share, delta * term_share), (epsilon * (1 - term_share), delta * (1 - term_share))]
    raise ConfigError(f"unknown histogram method {method!r}; expected one of {HISTOGRAM_METHODS}")


def build_mechanism(kind: str, max_terms: int, epsilon: float, delta: float) -> Any:
    """The mechanism of one stage: Laplace on L1 sensitivity S, or Gaussian on L2 sensitivity sqrt(S) with
    sigma calibrated for (epsilon, delta) by dp-accounting's PLD accountant (tasks/kde.py)."""
    from tasks.mechanisms import GaussianMechanism, LaplaceMechanism

    if kind == "laplace":
        return LaplaceMechanism(sensitivity=l1_sensitivity(max_terms), epsilon=epsilon)
    if kind == "gaussian":
        from tasks.kde import gaussian_noise_multiplier

        if not 0.0 < delta < 1.0:
            raise ConfigError(f"the Gaussian mechanism needs 0 < delta < 1, got {delta}")
        sensitivity = l2_sensitivity(max_terms)
        sigma = gaussian_noise_multiplier(float(epsilon), float(delta)) * sensitivity
        return GaussianMechanism(sensitivity=sensitivity, sigma=sigma, epsilon=epsilon, delta=delta)
    raise ConfigError(f"unknown mechanism {kind!r}; choose laplace or gaussian")


def release_all(exact: np.ndarray, mechanism: Any, noise: Any) -> np.ndarray:
    """Noise on every entry of ``exact`` (any shape) in ONE call of the mechanism (the noise source's per-call
    overhead dominates at |V| x classes ~ 10^6 draws). Integer counts with an integer sensitivity get the
    discrete Laplace distribution of the same scale (tasks/mechanisms.py: same guarantee, exact on integers,
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
# Sampling (post-processing; public rng)
# ---------------------------------------------------------------------------------------------

def noise_floor(mechanism: Any, entries: int, expected_false: float) -> float:
    """The count that pure noise exceeds in ``expected_false`` of ``entries`` noisy entries on average: one draw
    exceeds it with probability expected_false / entries. Public (mechanism parameters and |V| or K^2 only).
    Laplace(b): b ln(entries / (2 expected_false)); Gaussian(sigma): sigma * Phi^-1(1 - expected_false / entries)."""
    if expected_false <= 0:
        return 0.0
    tail = min(0.5, expected_false / max(1, entries))
    if mechanism.describe()["mechanism"] == "laplace":
        return mechanism.scale * math.log(1.0 / (2.0 * tail))
    from scipy.stats import norm

    return float(mechanism.scale * norm.isf(tail))


def above_floor(values: np.ndarray, floor: float) -> np.ndarray:
    """Released counts with every entry below ``floor`` set to 0 (and negatives clipped): a count that noise
    alone reaches carries little signal. Post-processing of released values."""
    return np.where(values >= floor, np.maximum(values, 0.0), 0.0)


@dataclass(frozen=True)
class ClassRelease:
    """What was released for one class: term ids (into V), their noisy counts, and for the Markov method the
    noisy start counts (K,) and pair counts (K, K) over those same positions. ``pair_floor`` is the noise floor
    (``noise_floor``) below which a start or pair count is treated as 0."""

    term_ids: np.ndarray
    noisy_counts: np.ndarray
    noisy_starts: np.ndarray | None = None
    noisy_pairs: np.ndarray | None = None
    pair_floor: float = 0.0


def sample_independent(release: ClassRelease, n_sequences: int, length: int, rule: SelectionRule,
                       rng: np.random.Generator) -> np.ndarray:
    """(n_sequences, length) term ids, i.i.d. draws from the rule's weights on the released counts."""
    weights = rule.weights(release.noisy_counts[None, :])[0]
    draws = rng.choice(len(weights), size=(n_sequences, length), p=weights / weights.sum())
    return release.term_ids[draws]


def sample_markov(release: ClassRelease, n_sequences: int, length: int, rule: SelectionRule,
                  rng: np.random.Generator) -> np.ndarray:
    """(n_sequences, length) term ids: start ~ rule(starts), next ~ rule(pairs[current]) over unused terms;
    a row with no positive weight left falls back to rule(stage-1 counts) over unused terms. Sequences are
    cut short (padded with -1) only when a class has fewer released terms than ``length``. Start and pair
    counts below ``release.pair_floor`` count as 0: the noise on K^2 pairs would otherwise make most steps a
    uniform draw (measured in docs/dpkps.md)."""
    if release.noisy_starts is None or release.noisy_pairs is None:
        raise ConfigError("the Markov sampler needs released start and pair counts")
    k = len(release.term_ids)
    steps = min(length, k)
    unigram = np.maximum(release.noisy_counts, 0.0)
    transition = above_floor(release.noisy_pairs, release.pair_floor)
    start = above_floor(release.noisy_starts, release.pair_floor)
    if rule.kind == "power":
        unigram, transition, start = unigram**rule.power, transition**rule.power, start**rule.power
    elif rule.kind != "proportional":
        raise ConfigError(f"the Markov sampler supports proportional and power-G selection, not {rule}")
    out = np.full((n_sequences, length), -1, dtype=np.int64)
    used = np.zeros((n_sequences, k), dtype=bool)
    current = np.zeros(n_sequences, dtype=np.int64)
    for step in range(steps):
        base = np.broadcast_to(start, (n_sequences, k)) if step == 0 else transition[current]
        w = np.where(used, 0.0, base)
        empty = w.sum(axis=1) <= 0
        if empty.any():
            w[empty] = np.where(used[empty], 0.0, unigram[None, :])
            still = w.sum(axis=1) <= 0
            w[still] = (~used[still]).astype(np.float64)
        cumulative = np.cumsum(w, axis=1)
        u = rng.random(n_sequences) * cumulative[:, -1]
        pick = np.minimum((cumulative <= u[:, None]).sum(axis=1), k - 1)
        out[:, step] = pick
        used[np.arange(n_sequences), pick] = True
        current = pick
    ids = np.full_like(out, -1)
    ids[:, :steps] = release.term_ids[out[:, :steps]]
    return ids


def sample_class_sequences(method: str, releases: Sequence[ClassRelease], per_class: int, length: int,
                           rule: SelectionRule, rng: np.random.Generator) -> list[list[list[int]]]:
    """Per class, ``per_class`` sequences of term ids (into V), in declared-label order."""
    sampler = {"histogram": sample_independent, "histogram-markov": sample_markov}.get(method)
    if sampler is None:
        raise ConfigError(f"unknown histogram method {method!r}; expected one of {HISTOGRAM_METHODS}")
    return [[[int(t) for t in row if t >= 0] for row in sampler(r, per_class, length, rule, rng)] for r in releases]


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
