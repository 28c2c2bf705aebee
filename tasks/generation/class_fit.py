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

The document's own seed is part of its class's counts, so a document that writes its seed's words fits: what the
test catches is a document whose other words belong to another class. Left out, the other seeds alone are too thin
at 20 a class to judge (the rows of six releases of issue 48 that fit: 14-89 % with the own seed left out, 78-99 %
with it in).

Privacy: built from ``ReleasedSeed`` objects only (terms of released DP vocabularies, sampled from DP releases) and
applied to synthetic text; post-processing, no budget.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from privseed.tasks.llm.released import ReleasedSeed
from privseed.tasks.quality.metrics import tokenize


@dataclass(frozen=True, eq=False)
class SeedClasses:
    """Per-class log word probabilities of the seeds (``from_seeds``). ``labels[c]`` is class c,
    ``log_probs[c, w]`` the smoothed log probability of word ``words[w]`` in class c's seeds."""

    labels: tuple[Any, ...]
    words: dict[str, int]
    log_probs: np.ndarray

    @classmethod
    def from_seeds(cls, seeds: Sequence[ReleasedSeed]) -> SeedClasses | None:
        """The seeds' naive Bayes, or None when they hold fewer than two classes (nothing to tell apart)."""
        labels = tuple(dict.fromkeys(s.label for s in seeds))
        if len(labels) < 2:
            return None
        counts: list[Counter[str]] = [Counter() for _ in labels]
        index = {label: c for c, label in enumerate(labels)}
        for s in seeds:
            counts[index[s.label]].update(w for phrase in s.keyphrases for w in tokenize(str(phrase)))
        words = {w: i for i, w in enumerate(sorted(set().union(*counts)))}
        table = np.ones((len(labels), len(words)))  # add-one smoothing
        for c, counter in enumerate(counts):
            for w, n in counter.items():
                table[c, words[w]] += n
        return cls(labels, words, np.log(table / table.sum(axis=1, keepdims=True)))

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


def seed_classes(seeds: Sequence[ReleasedSeed], enabled: bool = True) -> SeedClasses | None:
    """The judge of class fit for a generation over ``seeds`` (all of them, not one shard's), or None when
    ``enabled`` is off (``--no-rewrite-off-class``) or the seeds hold one class."""
    return SeedClasses.from_seeds(seeds) if enabled else None
