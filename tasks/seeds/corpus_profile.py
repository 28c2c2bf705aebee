"""The corpus profile: a small DP statistic from which the histogram methods' defaults adapt to the corpus.

What a good setting of ``--hist-contribution``, ``--hist-top-k`` K and ``--length`` L is depends on how long the
documents are (measured: a corpus of long forum posts gains 4 points from more terms per class and longer
sequences, a corpus of short news wires loses 2; docs/dpkps.md, "Defaults that adapt to the corpus"), and that
is private. So the run releases it, once, as its own ledgered stage, and derives the settings from the release:

``class_length_counts``
    (classes, B) counts: document d of class c adds 1 to cell (c, bin(n_d)), n_d its number of distinct terms of
    the public vocabulary V (what the whole-document contributions spread their unit of norm over), binned at the
    public ``LENGTH_EDGES``.
``profile_mechanism``
    **Sensitivity.** Under add/remove of one labelled document exactly one cell moves, by exactly 1: L1 = L2 = 1
    for the whole (classes, B) matrix (``PROFILE_SENSITIVITY``). Laplace of scale 1 / eps_profile on every cell,
    empty cells included (skipping them would say which lengths occur) -> eps_profile-DP, pure (the counts are
    integers, so tasks/dp/mechanisms.py draws the discrete Laplace of that scale: the same guarantee).
``profile_budget``
    eps_profile = ``PROFILE_SHARE`` of the run's epsilon (delta 0); the term histograms get the rest of the
    epsilon and all of the delta, so the run's total (basic composition over the ledger's stages) stays the
    declared ``--epsilon``.
``adaptive_settings``
    The rule: settings = rule(noisy profile). Post-processing of the release and of public constants only, so
    the noisy profile and the settings may be published (the manifest states them).
``class_alikeness``, ``release_breadth`` and ``settings_after_release``
    The rule's second step, for a short corpus: K and L are post-processing of the term histograms (they choose
    among released terms and draw sequences from them), so they may follow that release too. Classes whose
    released histograms are alike (a star rating spread over common words, not a category named by a few
    topical ones), or whose released weight reaches far past the short K (broad classes of many documents, news
    topics such as "World" or "Business" told by thousands of names), get the long K and L, and an LLM that
    writes from alike classes a lower temperature (``temperature_after_release``). No budget of its own: a
    function of released values only.

Nothing here draws noise itself (the ledger applies ``profile_mechanism``), does I/O or logs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from privseed.tasks.dp.mechanisms import Mechanism, Sensitivity, mechanism_kind
from privseed.tasks.errors import ConfigError
from privseed.tasks.seeds.histogram_seeds import ClassRelease

#: Public bin edges of a document's length in distinct terms of V: [0, 4), [4, 8), ..., [384, 512), [512, inf).
#: Finer where the measured corpora differ (short: 11-30 terms, abstracts: 45-75, posts: 120-260).
LENGTH_EDGES: tuple[int, ...] = (0, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
#: The share of the run's epsilon spent on the profile (5 %: at --epsilon 11 the profile's Laplace scale is 1.8
#: documents per cell, and the histograms keep 10.45; measured cost in docs/dpkps.md).
PROFILE_SHARE = 0.05
#: One document moves one cell of the (classes, B) matrix by 1.
PROFILE_SENSITIVITY = Sensitivity.of_counts(1.0)
#: The options the profile may set, each a DpKpsConfig field whose value "auto" asks for it.
ADAPTIVE_OPTIONS: tuple[str, ...] = ("hist_contribution", "hist_top_k", "length")
#: The adaptive options that are post-processing of the term histograms, so may follow their release
#: (``settings_after_release``).
AFTER_RELEASE_OPTIONS: tuple[str, ...] = ("hist_top_k", "length")
#: The value of an adaptive option that asks the profile for it.
AUTO = "auto"
#: Words per distinct term of V in a document (median over the seven public validation sets, 2.4-3.0): turns the
#: released length into an answer length for the generation stage.
WORDS_PER_DISTINCT_TERM = 2.7


# ---------------------------------------------------------------------------------------------
# Counting (private; exact) and the release's mechanism
# ---------------------------------------------------------------------------------------------

def length_bin(distinct_terms: int) -> int:
    """The bin of a document with ``distinct_terms`` distinct terms of V (public edges ``LENGTH_EDGES``)."""
    if distinct_terms < 0:
        raise ConfigError(f"a document cannot hold {distinct_terms} terms")
    return int(np.searchsorted(LENGTH_EDGES, distinct_terms, side="right")) - 1


def class_length_counts(distinct_terms: Iterable[int], class_index: Sequence[int] | np.ndarray,
                        n_classes: int) -> np.ndarray:
    """Exact (n_classes, B) int64 counts: each document adds 1 to (its class, the bin of its number of distinct
    terms of V). Additive over disjoint shards; one document moves one cell by 1."""
    counts = np.zeros((n_classes, len(LENGTH_EDGES)), dtype=np.int64)
    for n, c in zip(distinct_terms, class_index, strict=True):
        counts[int(c), length_bin(int(n))] += 1
    return counts


def profile_budget(epsilon: float, delta: float) -> tuple[tuple[float, float], tuple[float, float]]:
    """((epsilon, delta) of the profile, (epsilon, delta) left for the term histograms): they add up to the
    run's (epsilon, delta) by basic composition. The profile is pure DP (delta 0)."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ConfigError(f"epsilon must be a positive finite number, got {epsilon}")
    spent = epsilon * PROFILE_SHARE
    return (spent, 0.0), (epsilon - spent, delta)


def profile_mechanism(epsilon: float) -> Mechanism:
    """Laplace of scale 1 / epsilon on every cell (L1 sensitivity 1: ``PROFILE_SENSITIVITY``)."""
    return mechanism_kind("laplace").calibrated(PROFILE_SENSITIVITY, epsilon, 0.0)


# ---------------------------------------------------------------------------------------------
# Post-processing of the release: the profile and the rule
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CorpusProfile:
    """The released (classes, B) noisy counts and what the rule reads of them (all post-processing)."""

    noisy: np.ndarray

    def __post_init__(self) -> None:
        if np.ndim(self.noisy) != 2 or np.shape(self.noisy)[1] != len(LENGTH_EDGES):
            raise ConfigError(f"a corpus profile is a (classes, {len(LENGTH_EDGES)}) array, got shape "
                              f"{np.shape(self.noisy)}")

    @property
    def class_sizes(self) -> np.ndarray:
        """(classes,) noisy documents per class, clipped at 0."""
        return np.maximum(np.asarray(self.noisy, dtype=np.float64).sum(axis=1), 0.0)

    @property
    def lengths(self) -> np.ndarray:
        """(B,) noisy documents per length bin over all classes, each clipped at 0."""
        return np.maximum(np.asarray(self.noisy, dtype=np.float64).sum(axis=0), 0.0)

    def length_quantile(self, q: float) -> float:
        """The q-quantile of the documents' length in distinct terms, read off the clipped noisy histogram
        (linear within the first bin, geometric within the others; the open last bin ends at twice its
        start). 0 when the noise left no mass."""
        if not 0.0 <= q <= 1.0:
            raise ConfigError(f"a quantile lies in [0, 1], got {q}")
        mass = self.lengths
        total = float(mass.sum())
        if total <= 0:
            return 0.0
        upper = (*LENGTH_EDGES[1:], 2 * LENGTH_EDGES[-1])
        target = q * total
        below = 0.0
        for b, count in enumerate(mass):
            if count > 0 and below + count >= target:
                share = (target - below) / count
                low, high = float(LENGTH_EDGES[b]), float(upper[b])
                return low + share * (high - low) if low == 0 else low * (high / low) ** share
            below += float(count)
        return float(upper[-1])


@dataclass(frozen=True)
class AdaptiveSettings:
    """What the rule derives from the profile: stage 1's contribution kind, K, L, and an answer length (words)
    the generation stage can write to (the released median length)."""

    contribution: str
    top_k: int
    length: int
    answer_words: int
    #: Whether the second step may give this corpus the long K and L when its classes are alike: not when its
    #: documents are a few terms (``FEW_MEDIAN_TERMS``): sequences of the long L (30) drawn for them lose to the short
    #: L (a review's first sentence by its stars, median 6 terms: 2.2 points).
    alike_takes_long: bool = True

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


#: The rule's threshold: a corpus whose median document holds at least this many distinct terms of V is "long".
#: Between the short sets (DBPedia-14 19, Yelp 29, news wires) and the abstracts and posts (57-194); chosen on
#: the validation sets of docs/dpkps.md, "Defaults that adapt to the corpus".
LONG_MEDIAN_TERMS = 40.0
#: Under this released median a corpus's documents are "a few terms" (a title, a first sentence: 6-12 on the
#: measured sets; the short ones 19-30).
FEW_MEDIAN_TERMS = 15.0
#: (contribution, K, L) of a corpus of a few terms, of a short and of a long one. The shorter the documents, the
#: more their later terms carry the class as well as their first ones, and the slower the weights decay: a few
#: terms count alike (``unit-l2``), a short document's i-th weighs i^-0.25 (``slow-rank-l2``), a long one's i^-0.5
#: (``rank-l2``; a slower decay loses 2.0-2.2 points on long reviews). Measured on seventeen sets, nine seeds each:
#: docs/dpkps.md, "Defaults that adapt to the corpus".
FEW_SETTINGS = ("unit-l2", 300, 10)
SHORT_SETTINGS = ("slow-rank-l2", 300, 10)
LONG_SETTINGS = ("rank-l2", 1000, 30)
#: Answer lengths (words) the rule keeps to: a one-line answer is no document, and the local model's context
#: bounds the long end.
ANSWER_WORDS_RANGE = (40, 400)


def adaptive_settings(profile: CorpusProfile) -> AdaptiveSettings:
    """The rule (docs/dpkps.md, "Defaults that adapt to the corpus"): m = the released median length in distinct
    terms of V. m >= ``LONG_MEDIAN_TERMS``: ``LONG_SETTINGS`` (more terms per class, longer sequences: a long
    document's class lives in many terms, each weak); m < ``FEW_MEDIAN_TERMS``: ``FEW_SETTINGS`` (a title, a first
    sentence: every term counts alike); else ``SHORT_SETTINGS``. The answer length is m words-per-term words,
    rounded to 10, within ``ANSWER_WORDS_RANGE``. A function of the noisy profile and public constants only."""
    median = profile.length_quantile(0.5)
    few = bool(median < FEW_MEDIAN_TERMS)
    contribution, top_k, length = (LONG_SETTINGS if median >= LONG_MEDIAN_TERMS
                                   else FEW_SETTINGS if few else SHORT_SETTINGS)
    return AdaptiveSettings(contribution, top_k, length, answer_words_for(median), alike_takes_long=not few)


def answer_words_for(distinct_terms: float) -> int:
    """The words of an answer that holds ``distinct_terms`` terms: ``WORDS_PER_DISTINCT_TERM`` words a term, rounded
    to 10, within ``ANSWER_WORDS_RANGE``."""
    low, high = ANSWER_WORDS_RANGE
    return min(high, max(low, int(round(distinct_terms * WORDS_PER_DISTINCT_TERM / 10.0)) * 10))


#: The rule's second threshold: a short corpus whose classes' released term weights have at least this mean
#: pairwise cosine is "alike" and gets the long K and L. Between the short sets where the short setting wins
#: (DBPedia-14 0.10, 40 documents a class 0.21, Yelp's business categories 0.59) and Yelp's star ratings (0.84),
#: where the long one wins by 3.5 points; docs/dpkps.md, "Defaults that adapt to the corpus".
ALIKE_CLASSES = 0.7


def class_alikeness(releases: Sequence[ClassRelease]) -> float:
    """The mean cosine, over every pair of classes, between their released term weights (each class's
    ``ClassRelease.weights`` on its ``term_ids``, 0 elsewhere): near 0 when the classes are told apart by terms
    of their own, near 1 when they share the same words in about the same proportions. 0 with one class, and for
    a class that released no weight. Post-processing of released values."""
    if len(releases) < 2:
        return 0.0
    support = np.unique(np.concatenate([np.asarray(r.term_ids, dtype=np.int64) for r in releases]))
    rows = np.zeros((len(releases), len(support)))
    for c, release in enumerate(releases):
        rows[c, np.searchsorted(support, np.asarray(release.term_ids, dtype=np.int64))] = release.weights
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    unit = np.divide(rows, norms, out=np.zeros_like(rows), where=norms > 0)
    cosine = unit @ unit.T
    pairs = ~np.eye(len(releases), dtype=bool)
    return float(cosine[pairs].mean())


#: The rule's third threshold: a short corpus whose classes keep at least this share of their released weight past
#: the short K's terms (``release_breadth``) takes the long K and L. Between the short sets where K 300 wins or ties
#: (`dbpedia14-small` 0.18-0.19, DBPedia-14 0.25, Yelp's business categories 0.24-0.27, `dbpedia14-groups` 0.28)
#: and those where K 1000 wins (AG News 0.39, by 2.2 points; Yelp's star ratings 0.31, `yelp-polarity` 0.33, alike
#: as well); docs/dpkps.md, "Defaults that adapt to the corpus".
BROAD_RELEASE = 0.3


def release_breadth(releases: Sequence[ClassRelease], short_k: int = SHORT_SETTINGS[1]) -> float:
    """The mean, over classes, of the share of a class's released weight (``ClassRelease.weights``, after the
    denoising that gives noise-level counts little or none) on terms past its ``short_k`` heaviest: near 0 when a
    class is told by a few hundred terms or its release resolves no more than those (a small class: the rest is
    noise the denoising took out), higher when many more terms carry its signal. 0 for a class that released no
    weight. Post-processing of released values."""
    shares = []
    for release in releases:
        weights = np.sort(np.asarray(release.weights, dtype=float))[::-1]
        total = float(weights.sum())
        shares.append(float(weights[short_k:].sum()) / total if total > 0 else 0.0)
    return float(np.mean(shares)) if shares else 0.0


def settings_after_release(derived: AdaptiveSettings, alikeness: float, breadth: float = 0.0) -> AdaptiveSettings:
    """The rule's second step: a short corpus (``SHORT_SETTINGS``; not one of a few terms, ``alike_takes_long``)
    whose classes are alike (``alikeness`` >= ``ALIKE_CLASSES``) or broad (``breadth``, ``release_breadth``, >=
    ``BROAD_RELEASE``) keeps its contribution kind and takes the long K and L, and an answer long enough to hold
    the long L's terms (``answer_words_for``; it was the documents' median length); anything else stays as derived.
    Needs the long K's terms of the release (``RELEASE_TOP_K``)."""
    if ((alikeness < ALIKE_CLASSES and breadth < BROAD_RELEASE) or not derived.alike_takes_long
            or (derived.top_k, derived.length) != SHORT_SETTINGS[1:]):
        return derived
    # An answer of the median document's length holds about its distinct terms: 19 on AG News, where sequences of
    # 30 left 41 % of their terms out of 50-word answers (documents 73.1 % against 78.3 for their seeds), and answers
    # of 160 tokens put 76 % in (75.9 %; experiments/results/generation.md, "A news article kind").
    return AdaptiveSettings(derived.contribution, LONG_SETTINGS[1], LONG_SETTINGS[2],
                            max(derived.answer_words, answer_words_for(LONG_SETTINGS[2])), derived.alike_takes_long)


#: The LLM's temperature for a corpus whose classes are alike (``ALIKE_CLASSES``), when an LLM writes and
#: --temperature is not given (else the option's 0.7). Where the classes share most of their words (star ratings,
#: medical abstracts of five broad conditions), a document's class is in its seed's few telling words, and at 0.4 a
#: small model stays nearer them: on the same released seeds +3.7, +0.2 and +1.7 points on Yelp's star ratings (alike
#: at 0.84) and +1.4 and +0.9 on medical abstracts (0.74); where each class has topical words of its own, at 0.4 it
#: falls back to the corpus's commonest kind of document: -3.8 and -3.3 on Yelp's business categories (0.64);
#: experiments/results/generation.md, "The temperature follows how alike the classes are".
ALIKE_TEMPERATURE = 0.4


def temperature_after_release(alikeness: float, default: float) -> float:
    """The rule's temperature: ``ALIKE_TEMPERATURE`` where the classes are alike (``alikeness`` >=
    ``ALIKE_CLASSES``), else ``default``. Post-processing of released values."""
    return ALIKE_TEMPERATURE if alikeness >= ALIKE_CLASSES else default


#: The K the term histograms are released with while K is still to follow them: the largest the rule may choose.
RELEASE_TOP_K = max(FEW_SETTINGS[1], SHORT_SETTINGS[1], LONG_SETTINGS[1])


def answer_tokens(answer_words: int) -> int:
    """The output tokens of an answer of ``answer_words`` words (English runs ~1.35 tokens a word in the local
    models' tokenizers), with room to end the last sentence: the ``max_tokens`` a generation stage may use."""
    return int(math.ceil(answer_words * 1.35 / 16.0) * 16) + 32


#: The contribution kinds the rule may choose, in a fixed order: pass 1 counts each of them when the contribution
#: is "auto" (``counted_contributions``), side by side, so the release needs no second pass.
RULE_CONTRIBUTIONS: tuple[str, ...] = tuple(dict.fromkeys(kind for kind, _, _ in (FEW_SETTINGS, SHORT_SETTINGS,
                                                                                LONG_SETTINGS)))


def counted_contributions(contribution: str) -> tuple[str, ...]:
    """The kinds pass 1 counts for ``--hist-contribution`` ``contribution``: itself, or for "auto" every kind the
    rule may choose."""
    return RULE_CONTRIBUTIONS if contribution == AUTO else (contribution,)


def asks_for_profile(values: Mapping[str, Any]) -> bool:
    """Whether a configuration (DpKpsConfig fields) leaves an adaptive option to the profile."""
    return any(values[name] == AUTO for name in ADAPTIVE_OPTIONS)


def split_profiled_counts(counts: np.ndarray, vocab_size: int, contribution: str,
                          profile: bool) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """Pass 1's per-class result taken apart (``TermCounting`` with ``contribution`` and ``profile``): the
    (classes, |V|) matrix of each counted kind, and the profile's exact (classes, B) int64 counts (None when not
    counted)."""
    kinds = counted_contributions(contribution)
    expected = len(kinds) * vocab_size + (len(LENGTH_EDGES) if profile else 0)
    if np.ndim(counts) != 2 or np.shape(counts)[1] != expected:
        raise ConfigError(f"pass 1 counted {np.shape(counts)}, expected (classes, {expected}) for {kinds}"
                          f"{' and the corpus profile' if profile else ''}")
    matrices = {kind: counts[:, i * vocab_size:(i + 1) * vocab_size] for i, kind in enumerate(kinds)}
    if len(kinds) == 1 and not profile:
        matrices = {kinds[0]: counts}
    exact_profile = np.rint(counts[:, len(kinds) * vocab_size:]).astype(np.int64) if profile else None
    return matrices, exact_profile


def settled(value: int | str, flag: str) -> int:
    """An adaptive option's value once settled (a stage after the profile, or a paper's sampler): "auto" here is a
    stage called before ``settle_histogram_settings``, named as such."""
    if value == AUTO or isinstance(value, str):
        raise ConfigError(f"{flag} is still auto: the histogram stages run after the corpus profile settles it "
                          "(flows/dpkps.py privatize_histogram_sequences), or give it explicitly")
    return int(value)


def resolve_settings(given: Mapping[str, Any], derived: AdaptiveSettings) -> dict[str, Any]:
    """The values of the adaptive options: each one given (not "auto") as it is, each "auto" from ``derived``."""
    from_rule = {"hist_contribution": derived.contribution, "hist_top_k": derived.top_k, "length": derived.length}
    return {name: from_rule[name] if given[name] == AUTO else given[name] for name in ADAPTIVE_OPTIONS}


def planned_settings(given: Mapping[str, Any]) -> dict[str, Any]:
    """The adaptive options before any data is read (a dry run's plan): each "auto" as the rule's larger
    settings (``LONG_SETTINGS``: more keyphrases a prompt, the cost's upper bound), each given one as it is."""
    contribution, top_k, length = LONG_SETTINGS
    return resolve_settings(given, AdaptiveSettings(contribution, top_k, length, ANSWER_WORDS_RANGE[1]))


def settings_arrays(derived: AdaptiveSettings) -> dict[str, np.ndarray]:
    """The derived settings as arrays, stored beside the noisy profile in the ledger's value (re-read on resume)."""
    return {"contribution": np.asarray(derived.contribution), "top_k": np.asarray(derived.top_k),
            "length": np.asarray(derived.length), "answer_words": np.asarray(derived.answer_words),
            "alike_takes_long": np.asarray(derived.alike_takes_long)}


def settings_from_arrays(arrays: Mapping[str, np.ndarray]) -> AdaptiveSettings:
    """``settings_arrays`` read back. A run stored before the second step's length bound (no
    ``alike_takes_long``) resumes as it was drawn: without the bound."""
    return AdaptiveSettings(str(arrays["contribution"]), int(arrays["top_k"]), int(arrays["length"]),
                            int(arrays["answer_words"]), bool(arrays.get("alike_takes_long", True)))
