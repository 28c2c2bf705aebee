"""DP kernel density estimation by random Fourier features (DP-KPS step 5; Wagner et al. 2023, "LSQ-RFF").

Kernel: k(x, y) = exp(-||x - y||^2 / h^2) on concatenations of term embeddings.
A sketch over length-B sequences works in dimension d*B. Each d-dimensional block is a unit-norm
embedding scaled by 1 / sqrt(B), so a full-length sequence has unit norm (the appendix's bandwidth
rule u = 1/B), and the bandwidth h divides everything: z = [x_1; ...; x_B] / (h sqrt(B)).

Features: w_i ~ N(0, I_{dB}), b_i ~ U[0, 2pi), phi_i(z) = sqrt(2) cos(sqrt(2) w_i . z + b_i), so
E[phi_i(x) phi_i(y)] = k(x, y). The phase of a concatenation is a sum of per-block phases
(sqrt(2) w_i . z = sum_j sqrt(2) w_i,(j) . z_j), which is what the fast scorer and the sketch builder use.

Privacy (add/remove adjacency, one document = one individual):
  every document contributes ONE vector u(doc) in [-sqrt(2), sqrt(2)]^I (the mean of phi over the points
  it contributes, so its weight is 1 however many phrases it has); the released value is the SUM
  F = sum_doc u(doc) plus noise. Adding or removing a document moves each coordinate by at most sqrt(2):
    - L1 sensitivity sqrt(2) * I  -> Laplace(sqrt(2) * I / eps) per coordinate: eps-DP;
    - L2 sensitivity sqrt(2 * I)  -> Gaussian(sigma) with sigma calibrated by dp-accounting: (eps, delta)-DP.
  (The appendix writes Laplace(2 sqrt(2) I / eps) on a MEAN without the 1/|X| factor, |X| times too noisy;
  we use sums, so the private |D| is never needed: scores are only needed up to a constant factor.)
The feature draw (w, b) is data-independent and public (``public_rng(seed, ...)``); the noise comes from
privseed.tasks.dp.mechanisms' secure sampler, never from the seed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from privseed.tasks.errors import ConfigError
from privseed.tasks.dp.mechanisms import (GaussianMechanism, LaplaceMechanism, NoiseSource, Sensitivity,
                                          gaussian_noise_multiplier, mechanism_kind)

SQRT2 = math.sqrt(2.0)
MECHANISMS = ("laplace", "gaussian")


@dataclass(frozen=True)
class RffFeatures:
    """Random Fourier features for sequences of ``blocks`` embeddings of dimension ``dim``."""

    omega: np.ndarray  # (I, blocks, dim) float64, i.i.d. N(0, 1)
    offset: np.ndarray  # (I,) float64, U[0, 2pi)
    bandwidth: float

    @property
    def n_features(self) -> int:
        return int(self.omega.shape[0])

    @property
    def blocks(self) -> int:
        return int(self.omega.shape[1])

    @property
    def dim(self) -> int:
        return int(self.omega.shape[2])

    @property
    def block_scale(self) -> float:
        """Each unit-norm block is multiplied by this: 1 / (h sqrt(B))."""
        return 1.0 / (self.bandwidth * math.sqrt(self.blocks))

    def phases(self, sequences: np.ndarray) -> np.ndarray:
        """Naive full-dimension phases sqrt(2) w . z + b for unscaled block sequences.

        ``sequences``: (n, blocks, dim); zero blocks are zero padding. Returns (n, I) float64.
        """
        z = np.asarray(sequences, dtype=np.float64).reshape(sequences.shape[0], -1) * self.block_scale
        w = self.omega.reshape(self.n_features, -1)
        return SQRT2 * (z @ w.T) + self.offset

    def features(self, sequences: np.ndarray) -> np.ndarray:
        """phi(z) = sqrt(2) cos(phase), shape (n, I)."""
        return SQRT2 * np.cos(self.phases(sequences))

    def block_phase_tables(self, embeddings: np.ndarray) -> np.ndarray:
        """Per-block phases of every term: table[j, v, i] = sqrt(2) * scale * w_i,(j) . e_v.

        ``embeddings``: (V, dim) unit-norm rows. Returns (blocks, V, I) float64. The phase of a sequence
        (t_1, ..., t_l, zero padding) is offset + sum_j table[j, t_j].
        """
        e = np.asarray(embeddings, dtype=np.float64)
        if e.shape[1] != self.dim:
            raise ConfigError(f"embedding dimension {e.shape[1]} does not match the features' {self.dim}")
        return np.stack([SQRT2 * self.block_scale * (e @ self.omega[:, j, :].T) for j in range(self.blocks)])


def draw_rff_features(
    rng: np.random.Generator, *, n_features: int, dim: int, blocks: int = 1, bandwidth: float = 1.0
) -> RffFeatures:
    """Draw public random features. ``rng`` must be the FEATURE stream, never the noise stream."""
    if n_features < 1:
        raise ConfigError(f"number of random features I must be >= 1, got {n_features}")
    if blocks < 1:
        raise ConfigError(f"sequence length (blocks) must be >= 1, got {blocks}")
    if not (bandwidth > 0 and math.isfinite(bandwidth)):
        raise ConfigError(f"kernel bandwidth h must be positive, got {bandwidth}")
    omega = rng.standard_normal((n_features, blocks, dim))
    offset = rng.uniform(0.0, 2.0 * math.pi, size=n_features)
    return RffFeatures(omega=omega, offset=offset, bandwidth=float(bandwidth))


# ---------------------------------------------------------------------------------------------
# Exact sums (what the mechanism privatizes). All are additive over disjoint shards of documents.
# ---------------------------------------------------------------------------------------------

def single_term_weights(sequences: Sequence[Sequence[int]], vocab_size: int) -> np.ndarray:
    """w_v = sum over documents of (occurrences of v in doc) / (terms in doc); documents without terms add 0.

    For a one-block sketch, sum_doc mean_{t in doc} phi(e_t) = w @ phi(E), so this vector is all the
    independent sampler's sketch needs from the documents. Each document adds total weight exactly 1.
    """
    weights = np.zeros(vocab_size, dtype=np.float64)
    for seq in sequences:
        if len(seq):
            np.add.at(weights, np.asarray(seq, dtype=np.int64), 1.0 / len(seq))
    return weights


def single_term_sketch_sum(weights: np.ndarray, tables: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """F = sum_doc u(doc) for a one-block sketch, from ``single_term_weights``. (I,) float64; ``weights`` may
    also be (classes, V), giving one sum per class."""
    phi = SQRT2 * np.cos(tables[0] + offset)  # (V, I)
    return weights @ phi


def prefix_matrix(sequences: Sequence[Sequence[int]], length: int, short_documents: str = "pad") -> np.ndarray:
    """Length-``length`` prefixes of the documents' term sequences, as an (n, length) int64 array, -1 = padding.

    ``short_documents``: "pad" zero-pads documents with fewer terms (the same padding the queries get);
    "skip" leaves them out. Documents with no terms are always left out (they contribute nothing).
    """
    if short_documents not in ("pad", "skip"):
        raise ConfigError(f"short_documents must be 'pad' or 'skip', got {short_documents!r}")
    rows = []
    for seq in sequences:
        if not len(seq) or (short_documents == "skip" and len(seq) < length):
            continue
        head = list(seq[:length])
        rows.append(head + [-1] * (length - len(head)))
    if not rows:
        return np.zeros((0, length), dtype=np.int64)
    return np.asarray(rows, dtype=np.int64)


def prefix_sketch_sum(prefixes: np.ndarray, tables: np.ndarray, offset: np.ndarray, chunk: int = 2048) -> np.ndarray:
    """F = sum over rows of phi(prefix), one point per document: (I,) float64.

    ``tables``: (blocks, V, I) per-block phases; ``prefixes``: (n, l) term ids with l <= blocks and -1 for
    zero padding (a zero block adds phase 0). u(doc) = sqrt(2) cos(offset + sum_j table[j, t_j]).
    """
    n, length = prefixes.shape
    if length > tables.shape[0]:
        raise ConfigError(f"prefix length {length} exceeds the sketch's {tables.shape[0]} blocks")
    total = np.zeros(tables.shape[2], dtype=np.float64)
    for start in range(0, n, chunk):
        block = prefixes[start : start + chunk]
        phase = np.tile(offset, (block.shape[0], 1))
        for j in range(length):
            ids = block[:, j]
            real = ids >= 0
            phase += np.where(real[:, None], tables[j, np.where(real, ids, 0)], 0.0)
        total += (SQRT2 * np.cos(phase)).sum(axis=0)
    return total


# ---------------------------------------------------------------------------------------------
# Release: noise once, on the sum
# ---------------------------------------------------------------------------------------------

def laplace_scale(n_features: int, epsilon: float) -> float:
    """Laplace scale b = L1 sensitivity / eps = sqrt(2) * I / eps (add/remove one document)."""
    _check_epsilon(epsilon)
    return SQRT2 * n_features / epsilon


def gaussian_sigma(n_features: int, epsilon: float, delta: float) -> float:
    """sigma = z(eps, delta) * sqrt(2 I): sqrt(2 I) is the L2 sensitivity of the sum under add/remove."""
    return gaussian_noise_multiplier(float(epsilon), float(delta)) * math.sqrt(2.0 * n_features)


def sketch_mechanism(mechanism: str, n_features: int, epsilon: float, delta: float = 0.0
                     ) -> LaplaceMechanism | GaussianMechanism:
    """The mechanism that releases one sketch sum F under add/remove of one document (module docstring):
    Laplace(sqrt(2) I / eps) on L1 sensitivity sqrt(2) I, or Gaussian with sigma calibrated by dp-accounting
    on L2 sensitivity sqrt(2 I)."""
    kind = mechanism_kind(mechanism)
    _check_epsilon(epsilon)
    return kind.calibrated(Sensitivity(l1=sensitivity("laplace", n_features), l2=sensitivity("gaussian", n_features)),
                           float(epsilon), float(delta))  # type: ignore[return-value]  # the two kinds of MECHANISMS


def release_sketch(exact_sum: np.ndarray, *, mechanism: LaplaceMechanism | GaussianMechanism,
                   noise: NoiseSource) -> np.ndarray:
    """Add the mechanism's noise once to the exact sum F (float64). The flows draw the same thing through
    ``PrivacyLedger.draw_once``; this is for callers without a ledger (benchmarks, tests)."""
    return mechanism.release(np.asarray(exact_sum, dtype=np.float64), noise)


@dataclass(frozen=True)
class SketchSignal:
    """How much of a released sketch is signal, from the released sum and the mechanism's public noise law only.

    With F~ = F + N and N i.i.d. of variance v per feature, E ||F~||^2 = ||F||^2 + I v, so
    ``signal = ||F~||^2 - I v`` estimates ||F||^2 without bias, and ``z`` is that estimate in units of the
    standard deviation of ||N||^2 (sqrt(I Var(N^2))): z < 3 means the release cannot be told from pure noise."""

    energy: float        # ||F~||^2, released
    noise_energy: float  # I v, public
    signal: float        # energy - noise_energy
    z: float             # signal / sd(||N||^2)

    @property
    def swamped(self) -> bool:
        return self.z < SIGNAL_Z


#: A sketch whose estimated signal energy is less than this many noise standard deviations is noise.
SIGNAL_Z = 3.0


def sketch_signal(noisy_sum: np.ndarray, mechanism: LaplaceMechanism | GaussianMechanism) -> SketchSignal:
    """``SketchSignal`` of one released sum (post-processing: the released value and public parameters)."""
    law = mechanism.noise_distribution()
    variance = float(law.var())
    fourth = float(law.moment(4)) - variance**2  # Var(N^2)
    released = np.asarray(noisy_sum, dtype=np.float64).ravel()
    energy = float(released @ released)
    noise_energy = released.size * variance
    return SketchSignal(energy, noise_energy, energy - noise_energy,
                        (energy - noise_energy) / math.sqrt(released.size * fourth))


def sensitivity(mechanism: str, n_features: int) -> float:
    """The sensitivity the mechanism is calibrated to (L1 for Laplace, L2 for Gaussian)."""
    if mechanism == "laplace":
        return SQRT2 * n_features
    if mechanism == "gaussian":
        return math.sqrt(2.0 * n_features)
    raise ConfigError(f"unknown sketch mechanism {mechanism!r}; expected one of {MECHANISMS}")


def _check_epsilon(epsilon: float) -> None:
    if not (epsilon > 0) or math.isnan(epsilon):
        raise ConfigError(f"epsilon must be positive, got {epsilon}")


@dataclass(frozen=True)
class RffSketch:
    """A released DP-KDE: public features plus the noisy sum of per-document feature vectors."""

    features: RffFeatures
    noisy_sum: np.ndarray  # (I,) float64
    epsilon: float
    mechanism: str = "laplace"
    delta: float = 0.0

    def score(self, sequences: np.ndarray) -> np.ndarray:
        """s(y) = (1/I) sum_i F~_i phi_i(y) for (n, blocks, dim) zero-padded sequences (naive, full dimension)."""
        return self.features.features(sequences) @ self.noisy_sum / self.features.n_features


def exact_kde_sum(points: np.ndarray, queries: np.ndarray, bandwidth: float) -> np.ndarray:
    """Reference: sum_x exp(-||x - y||^2 / (h^2 B)) for unscaled block sequences (n, B, d) and (m, B, d)
    (zero blocks = padding), i.e. the kernel the features of a B-block sketch estimate. For tests."""
    blocks = points.shape[1]
    x = points.reshape(points.shape[0], -1)
    y = queries.reshape(queries.shape[0], -1)
    d2 = ((y[:, None, :] - x[None, :, :]) ** 2).sum(axis=2)
    return np.exp(-d2 / (bandwidth**2 * blocks)).sum(axis=1)


# ---------------------------------------------------------------------------------------------
# Exact per-class sums of a set of documents (additive: the streaming pass sums them over units); noise once after
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FeatureSpec:
    """Everything needed to regenerate one sketch's public features on any worker, bit for bit."""

    seed: int
    name: str  # the sketch's name; with the seed it selects an independent feature stream
    n_features: int
    dim: int
    blocks: int
    bandwidth: float

    def draw(self) -> RffFeatures:
        from privseed.tasks.dp.ledger import public_rng

        return _draw_cached(self, public_rng(self.seed, "kde-features", self.name))


_FEATURE_CACHE: dict[FeatureSpec, RffFeatures] = {}


def _draw_cached(spec: FeatureSpec, rng: np.random.Generator) -> RffFeatures:
    if spec not in _FEATURE_CACHE:
        if len(_FEATURE_CACHE) > 32:
            _FEATURE_CACHE.clear()
        _FEATURE_CACHE[spec] = draw_rff_features(rng, n_features=spec.n_features, dim=spec.dim,
                                                 blocks=spec.blocks, bandwidth=spec.bandwidth)
    return _FEATURE_CACHE[spec]


def shard_sketch_sums(
    texts: Sequence[str],
    labels: Sequence,
    class_labels: Sequence,
    released_terms: tuple[str, ...],
    embeddings: np.ndarray,
    specs: Sequence[FeatureSpec],
    single_terms: bool,
    short_documents: str = "pad",
) -> np.ndarray:
    """Exact per-class sums of per-document feature vectors for one shard: (classes, sketches, I) float64.

    Documents are represented by their sequences of V~ terms (looked up, never re-embedded), then summed by
    ``class_sketch_sums``. The in-memory reference of the streaming pass (tasks/seeds/passes.py), which computes the
    same sums unit by unit.
    """
    from privseed.tasks.seeds.vocabulary import phrase_matcher, released_vocabulary

    matcher = phrase_matcher(released_vocabulary(tuple(released_terms)))
    index = {label: i for i, label in enumerate(class_labels)}
    positions = []
    for label in labels:
        if label not in index:
            raise ConfigError("a document's label is not in the declared label set")
        positions.append(index[label])
    sequences = [matcher.match(text) for text in texts]
    return class_sketch_sums(sequences, positions, len(class_labels), len(released_terms),
                             sketch_tables(specs, embeddings), single_terms, short_documents)


def sketch_tables(specs: Sequence[FeatureSpec], embeddings: np.ndarray) -> list[tuple[RffFeatures, np.ndarray]]:
    """Each sketch's public features and its per-block phase tables over V~ (``block_phase_tables``): what the
    sums need from the features, computed once per unit of documents rather than once per batch."""
    out = []
    for spec in specs:
        features = spec.draw()
        out.append((features, features.block_phase_tables(embeddings)))
    return out


def class_sketch_sums(sequences: Sequence[Sequence[int]], class_index: Sequence[int] | np.ndarray, n_classes: int,
                      vocab_size: int, tables: Sequence[tuple[RffFeatures, np.ndarray]], single_terms: bool,
                      short_documents: str = "pad") -> np.ndarray:
    """Exact per-class sums of per-document feature vectors: (classes, sketches, I) float64.

    ``sequences[d]`` are document d's V~ term ids in reading order (all of them for ``single_terms``; the first
    max(blocks) suffice otherwise), ``class_index[d]`` its class. ``single_terms``: the independent sampler's
    sketch (each document's mean of phi over all its phrases); otherwise sketch k sums phi of each document's
    length-``blocks`` prefix (one point per document). Additive over disjoint sets of documents. A class with
    no documents gets zeros: no error path depends on it."""
    per_class: list[list[Sequence[int]]] = [[] for _ in range(n_classes)]
    for seq, c in zip(sequences, class_index, strict=True):
        per_class[int(c)].append(seq)
    n_features = tables[0][0].n_features
    out = np.zeros((n_classes, len(tables), n_features), dtype=np.float64)
    for k, (features, table) in enumerate(tables):
        if single_terms:  # phi of V~ once for all classes
            weights = np.stack([single_term_weights(class_sequences, vocab_size) for class_sequences in per_class])
            out[:, k] = single_term_sketch_sum(weights, table, features.offset)
            continue
        for c, class_sequences in enumerate(per_class):
            out[c, k] = prefix_sketch_sum(prefix_matrix(class_sequences, features.blocks, short_documents),
                                          table, features.offset)
    return out


def sketch_sums_of_shard(shard: tuple[Sequence[str], Sequence], class_labels: Sequence, released_terms: tuple[str, ...],
                         embeddings: np.ndarray, specs: Sequence[FeatureSpec], single_terms: bool) -> np.ndarray:
    """``shard_sketch_sums`` for a (texts, labels) pair held in memory (the flow streams units:
    tasks/seeds/passes.py)."""
    texts, labels = shard
    return shard_sketch_sums(texts, labels, class_labels, released_terms, embeddings, specs, single_terms)
