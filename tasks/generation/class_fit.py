"""Which class a document reads as, judged by the released seeds of its generation (pure, no I/O).

A small model pulls every seed toward what it writes best: SmolLM2-135M, asked for a Yelp review of a Health &
Medical or a Home & Garden business from its seed, writes about a restaurant in about one row of four (rows of the
seven non-food categories with a food word: 44 %, real reviews of them 19 %; issue 48). A classifier trained on such
documents learns that restaurant words mean every class, and the documents score 8-11 points under their own seeds.

``SeedClasses`` is the multinomial naive Bayes of the seeds themselves: each class's word counts over all the seeds of
the generation (a keyphrase's words, ``privseed.tasks.quality.metrics.tokenize``), add-one smoothing over the seeds'
words, equal class priors. A document *reads as* the class with the highest likelihood of its words that are seed
words; a document with none of them reads as nothing and fits every class. The candidate rounds
(``privseed.tasks.generation.rounds``) treat a document that reads as another class like a repetitive one: it is
worth another candidate (``GenerationParams.max_rewrites`` rounds; no new worst case), and among a seed's documents
one that fits its class is kept first. It never drops a row: a seed whose documents all read as another class keeps
the best of them.

The same counts say which words to keep out of a seed's document while it is written (``foreign_words``): the
words that another class's seeds hold at least 3 times and at least 3 times as often as the seed's class does
(smoothed), at most 30 a class, strongest first (that class's count times the log of the ratio). A local model's
decoding takes them down (``privseed.tasks.llm.steering``, ``GenerationParams.avoid_other_classes``): "food",
"restaurant" and "pizza" for a Yelp Shopping seed, "great", "amazing" and "recommend" for a one-star review's. And
which words to push (``own_words``): the words the seed's own class's seeds hold at least 3 times and at least twice
as often as any other class's, at most 30 ("rude", "horrible", "waiting" for a one-star review;
``GenerationParams.prefer_own_class``), so the words a small model adds to its seed's terms say its class too.

The document's own seed is part of its class's counts, so a document that writes its seed's words fits: what the
test catches is a document whose other words belong to another class. Left out, the other seeds alone are too thin
at 20 a class to judge (the rows of six releases of issue 48 that fit: 14-89 % with the own seed left out, 78-99 %
with it in).

A histogram release whose seeds were kept from a larger pool (``--hist-seed-pool``) whose classes are not alike
hands its generation the naive Bayes of the whole pool instead (``SEED_POOL_CLASSES``, built by
``privseed.tasks.stages.histogram.pool_judge``): 500 sequences a class name a class's words better than the 20 kept,
which are the pool's most typical and carry its noise words with them. A word of either list is then also held at
least once for every 20 seeds of its class (``MIN_ROW_SHARE``), which leaves the lists of 20 a class as they were.

Privacy: built from ``ReleasedSeed`` objects only, or from the pool they were kept from (terms of released DP
vocabularies, sampled from DP releases with the public seed's generator), and applied to synthetic text;
post-processing, no budget.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from privseed.tasks.llm.released import ReleasedSeed
from privseed.tasks.quality.metrics import tokenize


#: ``SeedClasses.foreign_words``: at most this many words a class, each held at least ``FOREIGN_MIN_COUNT`` times by
#: another class's seeds and ``FOREIGN_MIN_RATIO`` times as often as by the class's own.
FOREIGN_LIMIT = 30
FOREIGN_MIN_RATIO = 3.0
FOREIGN_MIN_COUNT = 3
#: The sequences' attribute that carries the naive Bayes of the pool a release's seeds were kept from (histogram
#: methods, ``--hist-seed-pool``): the generation's judge and word lists come from it (``seed_classes``).
SEED_POOL_CLASSES = "seed_pool_classes"
#: A word of ``foreign_words`` or ``own_words`` is also held at least once for every 20 seeds of its class (5 %): at
#: the 20 a class a release keeps, three uses decide; in a pool of 500 a class (``SEED_POOL_CLASSES``) a noise word
#: of one class's released terms is held 10-20 times, alone in its class, and would fill a middle star rating's list
#: ("subordinated", "infiltrate", "primates"), where the class's own words are held 25-180 times.
MIN_ROW_SHARE = 0.05
#: ``SeedClasses.own_words``: at most this many words a class, each held at least ``OWN_MIN_COUNT`` times by the
#: class's seeds and ``OWN_MIN_RATIO`` times as often as by any other class's. Twice, not three times: neighbouring
#: star ratings share most words, and at three times the classes of three `yelp-stars` releases held 0-6 words each
#: (a middle rating none), at twice 5-17 ("rude", "horrible", "waiting" for one star; issue 48).
OWN_LIMIT = 30
OWN_MIN_RATIO = 2.0
OWN_MIN_COUNT = 3


@dataclass(frozen=True, eq=False)
class SeedClasses:
    """Per-class log word probabilities of the seeds (``from_seeds``). ``labels[c]`` is class c,
    ``log_probs[c, w]`` the smoothed log probability of word ``words[w]`` in class c's seeds."""

    labels: tuple[Any, ...]
    words: dict[str, int]
    log_probs: np.ndarray
    counts: np.ndarray  # counts[c, w]: how often class c's seeds hold word words[w]
    rows: np.ndarray  # rows[c]: how many seeds (keyphrase rows) class c has

    @classmethod
    def from_seeds(cls, seeds: Sequence[ReleasedSeed]) -> SeedClasses | None:
        """The seeds' naive Bayes, or None when they hold fewer than two classes (nothing to tell apart)."""
        return cls.from_phrases([s.label for s in seeds], [s.keyphrases for s in seeds])

    @classmethod
    def from_phrases(cls, row_labels: Sequence[Any], rows: Sequence[Sequence[str]]) -> SeedClasses | None:
        """The naive Bayes of keyphrase rows (``rows[i]`` of class ``row_labels[i]``), or None when they hold fewer
        than two classes."""
        labels = tuple(dict.fromkeys(row_labels))
        if len(labels) < 2:
            return None
        counts: list[Counter[str]] = [Counter() for _ in labels]
        index = {label: c for c, label in enumerate(labels)}
        n_rows = np.zeros(len(labels), dtype=np.int64)
        for label, phrases in zip(row_labels, rows):
            counts[index[label]].update(w for phrase in phrases for w in tokenize(str(phrase)))
            n_rows[index[label]] += 1
        words = {w: i for i, w in enumerate(sorted(set().union(*counts)))}
        table = np.zeros((len(labels), len(words)))
        for c, counter in enumerate(counts):
            for w, n in counter.items():
                table[c, words[w]] += n
        smoothed = table + 1.0  # add-one smoothing
        return cls(labels, words, np.log(smoothed / smoothed.sum(axis=1, keepdims=True)), table, n_rows)

    def scores(self, text: str) -> np.ndarray | None:
        """Log likelihood of ``text``'s seed words under each class (None: it has no seed word)."""
        found = Counter(i for w in tokenize(text) if (i := self.words.get(w)) is not None)
        if not found:
            return None
        idx = np.fromiter(found.keys(), dtype=int)
        return self.log_probs[:, idx] @ np.fromiter(found.values(), dtype=float)

    def reads_as(self, text: str) -> Any | None:
        """The class ``text`` reads as (the first of tied classes), or None when it has no seed word."""
        scores = self.scores(text)
        return None if scores is None else self.labels[int(np.argmax(scores))]

    def fits(self, text: str, label: Any) -> bool:
        """Whether ``text`` reads as ``label`` (a tie with another class fits; a text with no seed word, or a
        label no seed has, fits)."""
        scores = self.scores(text)
        if scores is None or label not in self.labels:
            return True
        return bool(scores[self.labels.index(label)] >= scores.max())

    def foreign_words(self, label: Any, limit: int = FOREIGN_LIMIT, min_ratio: float = FOREIGN_MIN_RATIO,
                      min_count: int = FOREIGN_MIN_COUNT) -> tuple[str, ...]:
        """Words that read as another class than ``label``, strongest first: words some other class's seeds hold
        at least ``min_count`` times, at least ``min_ratio`` times as often (smoothed) as ``label``'s seeds do, ranked
        by that class's count times the log of the ratio; at most ``limit``. () for a label no seed has."""
        if label not in self.labels:
            return ()
        c = self.labels.index(label)
        others = np.delete(np.arange(len(self.labels)), c)
        log_ratio = self.log_probs[others] - self.log_probs[c]
        strongest = log_ratio.argmax(axis=0)
        columns = np.arange(len(self.words))
        return self._ranked(log_ratio[strongest, columns], self.counts[others][strongest, columns],
                            self.rows[others][strongest], limit, min_ratio, min_count)

    def own_words(self, label: Any, limit: int = OWN_LIMIT, min_ratio: float = OWN_MIN_RATIO,
                  min_count: int = OWN_MIN_COUNT) -> tuple[str, ...]:
        """Words that read as ``label``, strongest first: words its seeds hold at least ``min_count`` times and at
        least ``min_ratio`` times as often (smoothed) as every other class's seeds do, ranked by the count times the
        log of the ratio over the closest other class; at most ``limit``. () for a label no seed has."""
        if label not in self.labels:
            return ()
        c = self.labels.index(label)
        others = np.delete(np.arange(len(self.labels)), c)
        log_ratio = self.log_probs[c] - self.log_probs[others].max(axis=0)
        return self._ranked(log_ratio, self.counts[c], np.full(len(self.words), self.rows[c]), limit, min_ratio,
                            min_count)

    def _ranked(self, log_ratio: np.ndarray, count: np.ndarray, rows: np.ndarray, limit: int, min_ratio: float,
                min_count: int) -> tuple[str, ...]:
        """The words whose ``log_ratio`` is at least log(``min_ratio``) and ``count`` at least ``min_count`` and
        ``MIN_ROW_SHARE`` of ``rows`` (the seeds of the class that holds them), by count times log ratio (ties by the
        word), at most ``limit``."""
        floor = np.maximum(min_count, np.ceil(MIN_ROW_SHARE * rows))
        chosen = np.flatnonzero((log_ratio >= np.log(min_ratio)) & (count >= floor))
        vocabulary = np.array(list(self.words))
        order = sorted(chosen.tolist(), key=lambda w: (-count[w] * log_ratio[w], vocabulary[w]))
        return tuple(str(vocabulary[w]) for w in order[:limit])


def seed_classes(seeds: Sequence[ReleasedSeed], enabled: bool = True,
                 pool: SeedClasses | None = None) -> SeedClasses | None:
    """The judge of class fit for a generation over ``seeds`` (all of them, not one shard's), or None when
    ``enabled`` is off (``--no-rewrite-off-class``) or the seeds hold one class. ``pool``: the naive Bayes of the
    larger pool the seeds were kept from (``sequences.attrs["seed_pool_classes"]``), which judges in their place."""
    if not enabled:
        return None
    return pool if pool is not None else SeedClasses.from_seeds(seeds)
