"""Faults for measuring the power of `privseed audit` (tests and benchmarks/audit_power.py only).

Two calibration faults per mechanism, both a factor 2 in the privacy loss with the claim kept:

* ``half_noise()``: the secure sampler adds noise of half the scale it is asked for (every mechanism's draw goes
  through it), while the ledger still records the scale and the epsilon of the correct mechanism;
* ``half_sensitivity(mechanism)``: the mechanism's sensitivity is counted half where the code builds it (its
  factory in ``SENSITIVITY_FACTORIES``), so its noise is calibrated to half the shift one document really makes;
  the ledger then records the halved sensitivity and scale, and the claimed epsilon is unchanged.

Sensitivity bugs of pass 1 that a document of the audit's first canary's shape (class 0, S distinct terms) does not
trigger; each is a fault only for the mechanisms in ``SHAPE_FAULTS`` (where it breaks the stated sensitivity):

* ``class_counted_twice()``: pass 1 counts every document of class 1 twice;
* ``repeated_terms_counted()``: pass 1 counts a term that a document repeats once per occurrence (a first-S count
  adds its first S occurrences, a whole-document weight goes to every occurrence): Linf S instead of 1, an L2 norm
  above 1; not a fault of the Laplace first-S histograms (L1 stays S) nor of the vocabulary (it counts occurrences);
* ``long_documents_split()``: pass 1 takes a document of more than ``LONG_DOCUMENT_WORDS`` words as several (its
  text cut every that many words), each counted whole: a long document moves up to that many times the bound.

And one fault of the thresholded histogram's delta: ``unfixed_threshold_map()`` calibrates it with OpenDP 0.16.0's
map, whose delta is e^(1 / scale) too small (opendp/opendp#2922).

These are context managers that patch module attributes for the duration of a ``with`` block in this process: no
command-line flag, configuration field or environment variable reaches them, so no run can weaken its own noise
with them. The audit must call every fault VIOLATED for every mechanism it applies to (tests/test_audit.py).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from privseed.tasks.dp import mechanisms
from privseed.tasks.seeds import passes
from privseed.tasks.seeds.histogram_seeds import common_word_weights, rank_l2_weights
from privseed.tasks.dp.mechanisms import (LAPLACE_THRESHOLD, GaussianMechanism, LaplaceMechanism,
                                          LaplaceThresholdMechanism, SecureNoise, Sensitivity, opendp_threshold_map)
from privseed.tasks.seeds.seed_methods import contribution_kind
from privseed.tasks.seeds.vocabulary import load_vocabulary, phrase_matcher

#: Where each audited mechanism's mechanism object is built: (module, factory). Every stage looks the factory up
#: on its module when it draws, so patching the attribute reaches the flow's own code path.
SENSITIVITY_FACTORIES: dict[str, tuple[str, str]] = {
    "vocabulary": ("privseed.tasks.seeds.vocabulary", "vocabulary_mechanism"),
    "kde": ("privseed.tasks.seeds.kde", "sketch_mechanism"),
    "histogram": ("privseed.tasks.seeds.histogram_seeds", "build_mechanism"),
    "markov": ("privseed.tasks.seeds.histogram_seeds", "pair_mechanism"),
    "augpe": ("privseed.tasks.pe.evolution", "vote_mechanism"),
    "secpe": ("privseed.tasks.pe.evolution", "secpe_round_mechanism"),
    # the variants of stage 1 are built by the same factory as histogram's, for their own kind and contribution
    "histogram-unit-l2": ("privseed.tasks.seeds.histogram_seeds", "build_mechanism"),
    "histogram-rank-l2": ("privseed.tasks.seeds.histogram_seeds", "build_mechanism"),
    "histogram-slow-rank-l2": ("privseed.tasks.seeds.histogram_seeds", "build_mechanism"),
    "histogram-rank-rare-l2": ("privseed.tasks.seeds.histogram_seeds", "build_mechanism"),
    "histogram-threshold": ("privseed.tasks.seeds.histogram_seeds", "build_mechanism"),
    "corpus-profile": ("privseed.tasks.seeds.corpus_profile", "profile_mechanism"),
}
#: The pass-1 faults and the mechanisms each breaks (their audits run pass 1: ``scan_private_corpus``). markov's
#: audit measures its pair stage (pass 2); its term stage is the ``histogram`` row's code.
_L2_HISTOGRAMS = ("histogram-unit-l2", "histogram-rank-l2", "histogram-slow-rank-l2", "histogram-rank-rare-l2")
SHAPE_FAULTS: dict[str, tuple[str, ...]] = {
    "class-1-twice": ("vocabulary", "histogram", *_L2_HISTOGRAMS, "histogram-threshold"),
    "repeated-terms": (*_L2_HISTOGRAMS, "histogram-threshold"),
    "long-documents": ("vocabulary", "histogram", *_L2_HISTOGRAMS, "histogram-threshold"),
    "unfixed-threshold-map": ("histogram-threshold",),
}
FAULTS = ("half-noise", "half-sensitivity", *SHAPE_FAULTS)
#: ``long_documents_split``: the words of a piece (the audit's documents have at most 7, its long canaries more)
LONG_DOCUMENT_WORDS = 8


def halved(mechanism: Any) -> Any:
    """The same mechanism with its sensitivity counted half: Laplace's scale follows (sensitivity / epsilon), a
    Gaussian's sigma is halved with it (sigma is a noise multiplier times the sensitivity), and the thresholded
    histogram is calibrated again by its kind for half the L1 (half the scale, and the threshold its exact delta then
    gives); epsilon and delta, the claim, stay."""
    if isinstance(mechanism, LaplaceThresholdMechanism):
        sensitivity = Sensitivity(l2=math.sqrt(mechanism.sensitivity / 2), l1=mechanism.sensitivity / 2,
                                  l0=mechanism.l0, linf=mechanism.linf)
        return LAPLACE_THRESHOLD.calibrated(sensitivity, mechanism.epsilon, mechanism.delta)
    if isinstance(mechanism, LaplaceMechanism):
        return dataclasses.replace(mechanism, sensitivity=mechanism.sensitivity / 2)
    if isinstance(mechanism, GaussianMechanism):
        return dataclasses.replace(mechanism, sensitivity=mechanism.sensitivity / 2, sigma=mechanism.sigma / 2)
    raise TypeError(f"no sensitivity fault for {type(mechanism).__name__}")


@contextmanager
def _patched(owner: Any, attribute: str, replacement: Any) -> Iterator[None]:
    original = getattr(owner, attribute)
    setattr(owner, attribute, replacement)
    try:
        yield
    finally:
        setattr(owner, attribute, original)


@contextmanager
def half_sensitivity(mechanism: str) -> Iterator[None]:
    """Within the block, ``mechanism``'s factory returns ``halved`` mechanisms."""
    if mechanism not in SENSITIVITY_FACTORIES:
        raise KeyError(f"no sensitivity fault for {mechanism!r}; known: {', '.join(SENSITIVITY_FACTORIES)}")
    module_name, attribute = SENSITIVITY_FACTORIES[mechanism]
    module = importlib.import_module(module_name)
    factory: Callable[..., Any] = getattr(module, attribute)

    @functools.wraps(factory)
    def counted_half(*args: Any, **kwargs: Any) -> Any:
        return halved(factory(*args, **kwargs))

    with _patched(module, attribute, counted_half):
        yield


@contextmanager
def half_noise() -> Iterator[None]:
    """Within the block, the secure sampler draws Laplace, discrete Laplace and Gaussian noise at half the scale
    it is given (the Bernoulli sampling of SecPE is left alone)."""
    originals = {name: getattr(SecureNoise, name) for name in ("laplace", "discrete_laplace", "gaussian")}

    def at_half(draw: Callable[..., Any]) -> Callable[..., Any]:
        def drawn(self: SecureNoise, exact: Any, scale: float, *rest: Any) -> Any:
            return draw(self, exact, scale / 2, *rest)

        return drawn

    try:
        for name, draw in originals.items():
            setattr(SecureNoise, name, at_half(draw))
        yield
    finally:
        for name, draw in originals.items():
            setattr(SecureNoise, name, draw)


Counting = Callable[..., np.ndarray]


@contextmanager
def _counting(replacement: Callable[[Counting], Counting]) -> Iterator[None]:
    """Within the block, pass 1 counts with ``replacement(the correct TermCounting.count)``."""
    with _patched(passes.TermCounting, "count", replacement(passes.TermCounting.count)):
        yield


@contextmanager
def class_counted_twice(position: int = 1) -> Iterator[None]:
    """Within the block, pass 1 counts every document of the declared class at ``position`` twice."""

    def twice(count: Counting) -> Counting:
        def counted(self: passes.TermCounting, texts: Any, positions: Any = None, n_classes: int = 1) -> np.ndarray:
            counts = count(self, texts, positions, n_classes)
            if positions is None:
                return counts
            again = [i for i, p in enumerate(positions) if int(p) == position]
            return counts + count(self, [texts[i] for i in again], [positions[i] for i in again], n_classes)

        return counted

    with _counting(twice):
        yield


@contextmanager
def repeated_terms_counted() -> Iterator[None]:
    """Within the block, pass 1's per-class counts take a document's terms as they occur, not its distinct terms:
    a first-S count adds 1 for each of its first S occurrences, a whole-document contribution weighs every
    occurrence (rank by occurrence, scaled to norm 1 over the occurrences) and adds the weights of a repeated term
    up. The vocabulary histogram (not per class) counts occurrences anyway and is left alone."""

    def per_occurrence(count: Counting) -> Counting:
        def counted(self: passes.TermCounting, texts: Any, positions: Any = None, n_classes: int = 1) -> np.ndarray:
            if not self.per_class:
                return count(self, texts, positions, n_classes)
            vocabulary = load_vocabulary(self.vocab, self.english_top_n)
            matcher = phrase_matcher(vocabulary)
            kind = contribution_kind(self.contribution)
            factors = (None if kind.common_rank is None
                       else common_word_weights(len(vocabulary), kind.common_rank, kind.common_power))
            out = np.zeros((n_classes, len(vocabulary)), dtype=np.float64 if kind.whole_document else np.int64)
            for text, c in zip(texts, positions, strict=True):
                if kind.decay is not None:  # a whole-document contribution
                    terms = np.asarray(matcher.match(text), dtype=np.int64)
                    if terms.size:
                        weights = rank_l2_weights(terms.size, kind.decay, None if factors is None else factors[terms])
                        np.add.at(out[int(c)], terms, weights)
                else:
                    np.add.at(out[int(c)], np.asarray(matcher.first_matches(text, self.first_terms), np.int64), 1)
            return out

        return counted

    with _counting(per_occurrence):
        yield


@contextmanager
def long_documents_split(words: int = LONG_DOCUMENT_WORDS) -> Iterator[None]:
    """Within the block, pass 1 counts a document as several: its text cut every ``words`` words, each piece a
    document of the same class (counted to its first S terms, or scaled to norm 1, on its own)."""

    def split(count: Counting) -> Counting:
        def counted(self: passes.TermCounting, texts: Any, positions: Any = None, n_classes: int = 1) -> np.ndarray:
            pieces, where = [], []
            for i, text in enumerate(texts):
                tokens = str(text).split()
                for start in range(0, max(1, len(tokens)), words):
                    pieces.append(" ".join(tokens[start:start + words]))
                    where.append(None if positions is None else positions[i])
            return count(self, pieces, None if positions is None else where, n_classes)

        return counted

    with _counting(split):
        yield


@contextmanager
def unfixed_threshold_map() -> Iterator[None]:
    """Within the block, the thresholded histogram is calibrated (its threshold chosen, its delta recorded) with
    OpenDP 0.16.0's map: a delta e^(1 / scale) too small at every threshold, so a threshold one lower than the
    declared delta needs and a recorded delta below the true one."""

    def mapped(scale: float, threshold: int, l0: int, l1: int, linf: int) -> float:
        return opendp_threshold_map(scale, threshold, l0, l1, linf)[1]

    with _patched(mechanisms, "laplace_threshold_delta", mapped):
        yield


@contextmanager
def fault(name: str | None, mechanism: str) -> Iterator[None]:
    """The fault called ``name`` (``FAULTS``; ``mechanism`` for "half-sensitivity"), nothing for None (the correct
    mechanism)."""
    faults: dict[str, Callable[[], Any]] = {
        "half-noise": half_noise, "half-sensitivity": lambda: half_sensitivity(mechanism),
        "class-1-twice": class_counted_twice, "repeated-terms": repeated_terms_counted,
        "long-documents": long_documents_split, "unfixed-threshold-map": unfixed_threshold_map}
    if name is None:
        yield
    elif name in faults:
        with faults[name]():
            yield
    else:
        raise KeyError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")
