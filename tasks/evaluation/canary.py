"""The whole-pipeline canary test (the Canary's Echo design, Meeus et al. 2024): pure functions, no I/O.

A data owner inserts **canary documents** into a copy of the private corpus, runs a method end to end (LLM
included) on that copy, and measures how much of the canaries the released text gives away. A canary is an
in-distribution prefix (the first words of a real document of its class) followed by a **secret**: a few rare
words of the public vocabulary drawn at random, a sequence no model would predict (high perplexity). Canaries
come in pairs of the same template: of every two, public randomness picks one to insert (``repetitions`` times)
and holds the other out. Secrets are words of the public vocabulary on purpose: a method can only ever release
vocabulary terms, and a DP vocabulary releases a word only when many documents hold it, so a secret must be
releasable in principle for its absence to mean something.

Two measures of the released text (every released text column: the LLM's documents and the seeds):

- **verbatim exposure**: for each canary, the longest run of its words that appears verbatim in the release and
  holds at least one secret word (a prefix alone is in-distribution, not a leak), and the share of its secret
  words the release holds at all;
- **membership score** (Meeus et al.'s n-gram attack): the log-likelihood of the canary's secret under a bigram
  model of the released text with Dirichlet smoothing towards a unigram model (add-one over the public
  vocabulary). An inserted canary that left a trace scores higher than the held-out ones.

**Verdict.** Which canary of a pair is inserted is decided by public randomness, and the secrets are drawn from
one distribution, so when the release carries no information about the inserted canaries their scores and the
held-out ones are exchangeable: a permutation test of "inserted score higher" then has an exact p-value. The
release is EXPOSED when that p-value is at most ``alpha`` (0.01: a release that leaks nothing is flagged in at
most 1 audit of 100), and ``no exposure found`` otherwise. The AUC (inserted vs held out; 0.5 = no signal, 1 =
every inserted canary above every held-out one) says how strong the signal is. As with ``privseed audit``,
"no exposure found" means this attack found nothing, not that the release is private.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from privseed.tasks.seeds.vocabulary import tokenize

#: A release is EXPOSED when the permutation p-value of "inserted canaries score higher" is at most this.
EXPOSURE_ALPHA = 0.01
#: Permutations of the test (the p-value's resolution is 1 / (PERMUTATIONS + 1)).
PERMUTATIONS = 19_999


@dataclass(frozen=True)
class Canary:
    """One canary: ``prefix`` (in-distribution words) then ``secret`` (rare words); ``inserted`` or held out."""

    index: int
    label: str
    prefix: tuple[str, ...]
    secret: tuple[str, ...]
    inserted: bool

    @property
    def text(self) -> str:
        return " ".join((*self.prefix, *self.secret))


def secret_candidates(vocabulary_terms: Sequence[str], exclude: Iterable[str], rare_share: float = 0.5,
                      min_length: int = 5) -> list[str]:
    """Words a secret may use: single alphabetic tokens of at least ``min_length`` letters from the rarest
    ``rare_share`` of the public vocabulary (listed most frequent first), minus ``exclude`` (the words the corpus
    already holds, so a held-out secret cannot show up for the corpus's own sake)."""
    excluded = set(exclude)
    start = int(len(vocabulary_terms) * (1.0 - rare_share))
    return [w for w in vocabulary_terms[start:]
            if w.isalpha() and len(w) >= min_length and w not in excluded and tokenize(w) == [w]]


def make_canaries(prefixes: Mapping[str, Sequence[tuple[str, ...]]], candidates: Sequence[str], pairs_per_label: int,
                  secret_length: int, rng: np.random.Generator) -> list[Canary]:
    """``pairs_per_label`` pairs of canaries per label of ``prefixes`` (label -> prefixes drawn from its documents;
    both canaries of a pair share a prefix); every secret is ``secret_length`` distinct words of ``candidates``
    used by no other canary; ``rng`` (public randomness) picks the secrets and which canary of a pair is inserted."""
    needed = 2 * pairs_per_label * secret_length * sum(1 for p in prefixes.values() if p)
    if len(candidates) < needed:
        raise ValueError(f"{len(candidates)} secret words for {needed} needed: fewer canaries or shorter secrets")
    words = iter(rng.permutation(np.asarray(candidates, dtype=object)).tolist())
    canaries: list[Canary] = []
    for label, options in prefixes.items():
        if not options:
            continue
        for pair in range(pairs_per_label):
            prefix = tuple(options[pair % len(options)])
            inserted_first = bool(rng.integers(2))
            for member in (0, 1):
                secret = tuple(next(words) for _ in range(secret_length))
                canaries.append(Canary(len(canaries), label, prefix, secret, inserted=(member == 0) == inserted_first))
    return canaries


def canary_rows(canaries: Sequence[Canary], repetitions: int) -> list[tuple[str, str]]:
    """(text, label) of the inserted canaries, each ``repetitions`` times: the rows added to the corpus."""
    return [(c.text, c.label) for c in canaries if c.inserted for _ in range(repetitions)]


@dataclass(frozen=True)
class ReleasedText:
    """Unigram and bigram counts of the released text, each released text a separate token stream."""

    unigrams: Counter
    bigrams: Counter
    tokens: int
    ngrams: frozenset[tuple[str, ...]]
    max_n: int

    @classmethod
    def from_texts(cls, texts: Iterable[str], max_n: int = 8) -> "ReleasedText":
        unigrams: Counter = Counter()
        bigrams: Counter = Counter()
        ngrams: set[tuple[str, ...]] = set()
        for text in texts:
            tokens = tokenize(text)
            unigrams.update(tokens)
            bigrams.update(zip(tokens, tokens[1:]))
            for n in range(1, max_n + 1):
                ngrams.update(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))
        return cls(unigrams, bigrams, sum(unigrams.values()), frozenset(ngrams), max_n)


@dataclass(frozen=True)
class CanaryExposure:
    canary: Canary
    secret_words_released: int
    longest_verbatim: int  # the longest run of the canary's words in the release that holds a secret word
    score: float  # log-likelihood of the secret under the release's bigram model (the membership score)


#: Weight of the bigram estimate in the interpolated (Jelinek-Mercer) model; small, so that a released first word
#: never makes the secret less likely than no released word at all.
BIGRAM_WEIGHT = 0.2


def secret_log_likelihood(secret: Sequence[str], release: ReleasedText, vocabulary_size: int) -> float:
    """log P(secret) under a bigram model of the release: the first word from an add-one unigram model over a
    vocabulary of ``vocabulary_size`` words, each next one from the bigram estimate interpolated with it
    (weight BIGRAM_WEIGHT; the unigram alone after a word the release does not hold). The prefix is left out on
    purpose: its words are common, and their counts would make canaries with different prefixes incomparable."""
    total = 0.0
    previous: str | None = None
    for word in secret:
        unigram = (release.unigrams[word] + 1.0) / (release.tokens + vocabulary_size)
        seen = release.unigrams[previous] if previous is not None else 0
        if seen:
            bigram = release.bigrams[(previous, word)] / seen
            total += math.log(BIGRAM_WEIGHT * bigram + (1.0 - BIGRAM_WEIGHT) * unigram)
        else:
            total += math.log(unigram)
        previous = word
    return total


def canary_exposure(canary: Canary, release: ReleasedText, vocabulary_size: int) -> CanaryExposure:
    tokens = tokenize(canary.text)
    secret_start = len(tokenize(" ".join(canary.prefix)))
    longest = 0
    for start in range(len(tokens)):
        for end in range(max(start, secret_start) + 1, min(len(tokens), start + release.max_n) + 1):
            if end - start > longest and tuple(tokens[start:end]) in release.ngrams:
                longest = end - start
    secret = [t for word in canary.secret for t in tokenize(word)]
    released = sum(1 for t in secret if release.unigrams[t] > 0)
    score = secret_log_likelihood(secret, release, vocabulary_size)
    return CanaryExposure(canary, released, longest, score)


def auc(positive: Sequence[float], negative: Sequence[float]) -> float:
    """P(a positive scores above a negative), ties counted one half (the Mann-Whitney U statistic / (m n))."""
    pos = np.asarray(positive, dtype=np.float64)[:, None]
    neg = np.asarray(negative, dtype=np.float64)[None, :]
    return float(((pos > neg).sum() + 0.5 * (pos == neg).sum()) / (pos.size * neg.size))


def permutation_p_value(positive: Sequence[float], negative: Sequence[float], rng: np.random.Generator,
                        permutations: int = PERMUTATIONS) -> float:
    """One-sided p-value of the AUC under exchangeability of the two groups: (1 + #{permuted AUC >= observed}) /
    (1 + permutations), exact in distribution whatever the ties."""
    scores = np.concatenate([np.asarray(positive, dtype=np.float64), np.asarray(negative, dtype=np.float64)])
    m = len(positive)
    ranks = _midranks(scores)
    observed = ranks[:m].sum()
    permuted = np.array([ranks[rng.permutation(scores.size)[:m]].sum() for _ in range(permutations)])
    # The rank sum of the first group is a monotone function of its AUC, so comparing rank sums compares AUCs.
    return float((1 + np.count_nonzero(permuted >= observed - 1e-9)) / (1 + permutations))


def _midranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(values.size, dtype=np.float64)
    ranks[order] = np.arange(1, values.size + 1)
    for value in np.unique(values):
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


@dataclass(frozen=True)
class CanaryVerdict:
    exposures: tuple[CanaryExposure, ...]
    auc: float
    p_value: float
    alpha: float

    @property
    def exposed(self) -> bool:
        return self.p_value <= self.alpha

    def group(self, inserted: bool) -> list[CanaryExposure]:
        return [e for e in self.exposures if e.canary.inserted == inserted]

    def summary(self) -> dict:
        """The numbers of the verdict per group (inserted, held out), JSON-able."""
        out: dict = {"verdict": "EXPOSED" if self.exposed else "no exposure found", "auc": round(self.auc, 4),
                     "p_value": self.p_value, "alpha": self.alpha}
        for name, inserted in (("inserted", True), ("held_out", False)):
            group = self.group(inserted)
            secret_words = sum(len(e.canary.secret) for e in group)
            out[name] = {
                "canaries": len(group),
                "with_a_secret_word_released": sum(1 for e in group if e.secret_words_released),
                "secret_words_released": sum(e.secret_words_released for e in group),
                "secret_words": secret_words,
                "whole_secret_verbatim": sum(1 for e in group
                                             if e.longest_verbatim >= len(e.canary.secret)),
                "longest_verbatim_max": max((e.longest_verbatim for e in group), default=0),
                "mean_score": round(float(np.mean([e.score for e in group])), 4) if group else None,
            }
        return out

    def sentence(self) -> str:
        s = self.summary()
        ins, out = s["inserted"], s["held_out"]
        return (f"{s['verdict']}: AUC {s['auc']:.3f} inserted vs held-out canaries, permutation p = {s['p_value']:.2g} "
                f"(EXPOSED at p <= {self.alpha:g}); a secret word of {ins['with_a_secret_word_released']} of "
                f"{ins['canaries']} inserted and {out['with_a_secret_word_released']} of {out['canaries']} held-out "
                f"canaries appears in the release; whole secrets verbatim: {ins['whole_secret_verbatim']} inserted, "
                f"{out['whole_secret_verbatim']} held out")


def judge_release(canaries: Sequence[Canary], released_texts: Iterable[str], vocabulary_size: int,
                  rng: np.random.Generator, alpha: float = EXPOSURE_ALPHA,
                  permutations: int = PERMUTATIONS) -> CanaryVerdict:
    """Score every canary against the released texts and test inserted against held out."""
    release = ReleasedText.from_texts(released_texts)
    exposures = tuple(canary_exposure(c, release, vocabulary_size) for c in canaries)
    inserted = [e.score for e in exposures if e.canary.inserted]
    held_out = [e.score for e in exposures if not e.canary.inserted]
    if not inserted or not held_out:
        raise ValueError("the canary test needs inserted and held-out canaries")
    return CanaryVerdict(exposures, auc(inserted, held_out),
                         permutation_p_value(inserted, held_out, rng, permutations), alpha)
