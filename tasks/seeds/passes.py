"""The passes of the streaming data path: what a Dask worker computes from one work unit of the private corpus.

    pass 1  scan_unit    each batch: the label check, the keyed identity of the rows, and (when asked) the term
                         counts: each document's first S terms of V (DP-KPS's vocabulary histogram) or, per class,
                         its first S distinct terms (the histogram methods)
    pass 2  sketch_unit  each batch: per-class DP-KDE sketch sums over the released vocabulary V~ (DP-KPS)
            pair_unit    each batch: per-class co-occurrence counts of pairs among each class's candidate terms
                         (histogram-markov)

A unit is read from storage by every pass that needs it (``privseed.tasks.data.units.read_unit``), streamed in record
batches, and folded into a partial result the size of V or of the sketches: nothing here returns rows, texts or labels.
The partials of a pass add up over units (``privseed.tasks.data.units.map_reduce_units`` combines them on the cluster);
noise
is added once to the final sum, on the driver, through the ledger (tasks/stages/). The math is that of the
pure functions of tasks/seeds/vocabulary.py, tasks/seeds/histogram_seeds.py and tasks/seeds/kde.py; only the batching is
here.

The specs below are what enters the Dask graph (scattered once per pass): column names, storage options, the
declared labels, public vocabularies and features, and for pass 1 the identity key of the owner's private state
(the workers read the private rows anyway; the key reaches no log, no release and no Prefect record).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from privseed.tasks.data.corpus import declared_positions
from privseed.tasks.dp.identity import IdentityPart, identity_part
from privseed.tasks.seeds.corpus_profile import class_length_counts, counted_contributions
from privseed.tasks.seeds.histogram_seeds import class_pair_counts, contribution_weights
from privseed.tasks.seeds.kde import FeatureSpec, class_sketch_sums, sketch_tables
from privseed.tasks.data.units import WorkUnit, read_unit


@dataclass(frozen=True)
class UnitReader:
    """How a unit's rows are read: the corpus's column names and the storage options (not shown by repr: they
    may hold credentials)."""

    text_column: str = "text"
    label_column: str = "label"
    storage_options: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def batches(self, unit: WorkUnit) -> Iterator[pd.DataFrame]:
        return read_unit(unit, self.text_column, self.label_column, self.storage_options)


@dataclass(frozen=True)
class DeclaredLabels:
    """The declared label set (configuration, in the type of the label column) and the column it checks."""

    labels: tuple[Any, ...]
    column: str = "label"

    def positions(self, labels: pd.Series) -> np.ndarray:
        """Each row's class (its label's position among the declared labels); an undeclared label stops the run
        with the operator error that names neither the label nor how many rows carry it."""
        return declared_positions(labels, self.labels, self.column)


@dataclass(frozen=True)
class TermCounting:
    """What pass 1 counts over the public vocabulary V (``vocab``, cut at ``english_top_n`` for the English list).

    ``per_class`` False: the vocabulary histogram of DP-KPS and AugPE+V~, (|V|,) counts of each document's first
    S matched terms (``privseed.tasks.seeds.vocabulary.first_terms_histogram``). True: the histogram methods, (classes,
    |V|)
    counts of each document's first S distinct terms in its class's row (``privseed.tasks.seeds.histogram_seeds``)."""

    vocab: str
    english_top_n: int
    first_terms: int
    per_class: bool = False
    #: per class only: how a document enters its class's row, a name of
    #: ``privseed.tasks.seeds.seed_methods.CONTRIBUTIONS`` (``first-terms``, ``unit-l2``, ``rank-l2``), or
    #: ``auto``: every kind the corpus profile's rule may choose (``corpus_profile.RULE_CONTRIBUTIONS``), side by side
    contribution: str = "first-terms"
    #: per class only: also the corpus profile's exact counts (``corpus_profile.class_length_counts``), as the last
    #: B columns (``corpus_profile.split_profiled_counts`` takes the result apart)
    profile: bool = False

    def count(self, texts: Sequence[str], positions: Sequence[int] | np.ndarray | None = None,
              n_classes: int = 1) -> np.ndarray:
        """The counts of these documents (additive over disjoint sets of documents); ``positions`` (each
        document's class among ``n_classes``) only for ``per_class``."""
        from privseed.tasks.seeds.seed_methods import contribution_kind
        from privseed.tasks.seeds.vocabulary import first_terms_histogram, load_vocabulary, phrase_matcher

        vocabulary = load_vocabulary(self.vocab, self.english_top_n)  # loaded and indexed once per process
        matcher = phrase_matcher(vocabulary)
        s = self.first_terms
        if self.per_class:
            assert positions is not None  # per-class counts need each document's class
            kinds = [contribution_kind(name) for name in counted_contributions(self.contribution)]
            # a whole-document contribution (and the profile: every document's length) reads every distinct term
            # (at most |V| of them), in reading order
            whole = self.profile or any(kind.whole_document for kind in kinds)
            read = max(1, len(vocabulary)) if whole else s
            documents = [matcher.first_matches(t, read, distinct=True) for t in texts]
            parts = [contribution_weights(kind, documents, positions, n_classes, len(vocabulary), s) for kind in kinds]
            if self.profile:
                parts.append(class_length_counts([len(d) for d in documents], positions, n_classes))
            if len(parts) == 1:
                return parts[0]
            float_parts = any(part.dtype.kind == "f" for part in parts)
            return np.concatenate([part.astype(np.float64) if float_parts else part for part in parts], axis=1)
        return first_terms_histogram((matcher.first_matches(t, s) for t in texts), len(vocabulary), s)


# -- pass 1 --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ScanSpec:
    reader: UnitReader
    labels: DeclaredLabels
    key: bytes = field(repr=False)
    counting: TermCounting | None = None


@dataclass(frozen=True)
class ScanPart:
    """Pass 1's partial result: the keyed identity of the rows seen and their term counts (None when not
    counted). Private: it stays in memory, on the workers and then the driver."""

    identity: IdentityPart
    counts: np.ndarray | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        return "ScanPart(<private>)"

    @staticmethod
    def combine(parts: Sequence[ScanPart]) -> ScanPart:
        counts = [p.counts for p in parts if p.counts is not None]  # all or none: one spec counts every unit
        return ScanPart(IdentityPart.combine([p.identity for p in parts]),
                        np.sum(counts, axis=0) if counts else None)


def scan_unit(unit: WorkUnit, spec: ScanSpec) -> ScanPart:
    """Pass 1 over one unit: label check, keyed identity and term counts, batch by batch."""
    n_classes = len(spec.labels.labels)
    identity: list[IdentityPart] = []
    counts = None
    for batch in spec.reader.batches(unit):
        positions = spec.labels.positions(batch["label"])
        identity.append(identity_part(batch["text"], batch["label"], spec.key))
        if spec.counting is not None:
            part = spec.counting.count(batch["text"].tolist(), positions, n_classes)
            counts = part if counts is None else counts + part
    if spec.counting is not None and counts is None:  # a unit whose row groups hold no row
        counts = spec.counting.count([], [], n_classes)
    return ScanPart(IdentityPart.combine(identity) if identity else identity_part([], [], spec.key), counts)


# -- pass 2 --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SketchSpec:
    """Pass 2 of DP-KPS: the released vocabulary V~, its embeddings (public after the release) and the public
    feature specs of the method's sketches (``single_terms``: the independent sampler's one-block sketch)."""

    reader: UnitReader
    labels: DeclaredLabels
    released_terms: tuple[str, ...]
    embeddings: np.ndarray = field(repr=False)
    specs: tuple[FeatureSpec, ...]
    single_terms: bool


def sketch_unit(unit: WorkUnit, spec: SketchSpec) -> np.ndarray:
    """Exact per-class sketch sums (classes, sketches, I) of one unit
    (``privseed.tasks.seeds.kde.class_sketch_sums``)."""
    from privseed.tasks.seeds.vocabulary import phrase_matcher, released_vocabulary

    matcher = phrase_matcher(released_vocabulary(spec.released_terms))
    tables = sketch_tables(spec.specs, spec.embeddings)  # once per unit: they depend on public values only
    prefix = max(s.blocks for s in spec.specs)
    total = np.zeros((len(spec.labels.labels), len(spec.specs), spec.specs[0].n_features), dtype=np.float64)
    for batch in spec.reader.batches(unit):
        positions = spec.labels.positions(batch["label"])
        texts = batch["text"].tolist()
        # The independent sketch averages over all of a document's phrases; a prefix sketch reads the first ones.
        sequences = ([matcher.match(t) for t in texts] if spec.single_terms
                     else [matcher.first_matches(t, prefix) for t in texts])
        total += class_sketch_sums(sequences, positions, total.shape[0], len(spec.released_terms), tables,
                                   spec.single_terms)
    return total


@dataclass(frozen=True)
class PairSpec:
    """Pass 2 of histogram-markov: the public vocabulary V, each class's P candidate term ids (post-processing of
    stage 1's release) and S_2, the distinct candidate terms per document whose pairs count."""

    reader: UnitReader
    labels: DeclaredLabels
    counting: TermCounting
    candidate_ids: tuple[np.ndarray, ...] = field(repr=False)
    pair_terms: int = 2


def pair_unit(unit: WorkUnit, spec: PairSpec) -> np.ndarray:
    """Exact co-occurrence counts (C, P (P - 1) / 2) of one unit
    (``privseed.tasks.seeds.histogram_seeds.class_pair_counts``)."""
    from privseed.tasks.seeds.vocabulary import load_vocabulary, phrase_matcher

    matcher = phrase_matcher(load_vocabulary(spec.counting.vocab, spec.counting.english_top_n))
    allowed = [frozenset(int(t) for t in ids) for ids in spec.candidate_ids]
    s = spec.pair_terms
    counts = class_pair_counts([], [], spec.candidate_ids, s)
    for batch in spec.reader.batches(unit):
        positions = spec.labels.positions(batch["label"])
        sequences = [matcher.first_matches(t, s, distinct=True, allowed=allowed[c])
                     for t, c in zip(batch["text"].tolist(), positions)]
        counts = counts + class_pair_counts(sequences, positions, spec.candidate_ids, s)
    return counts


def combine_sums(parts: Sequence[np.ndarray]) -> np.ndarray:
    return np.sum(parts, axis=0)
