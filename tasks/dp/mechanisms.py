"""The one place where privseed draws noise: mechanism objects over a secure sampler.

Every privatized value of every method (the vocabulary histogram, the DP-KDE sketches, the per-class term
histograms, Aug-PE's vote histograms, SecPE's noisy centres and sizes and its secret sub-sampling) is made by
a mechanism of this module. A mechanism owns the relation between sensitivity, noise scale and privacy loss,
and reports it (``describe()``); the privacy ledger records that report, not what a caller declares.

Guarantees, stated the OpenDP way (input domain, input metric, output measure):

* :class:`LaplaceMechanism` -- vectors of floats (or of integers), L1 distance ``sensitivity`` between
  adjacent inputs, max-divergence (pure DP): ``epsilon = sensitivity / scale``. Integer vectors with an integer
  sensitivity use the discrete Laplace (two-sided geometric) distribution, which is exact on integers;
  float vectors use OpenDP's floating-point-safe Laplace.
* :class:`GaussianMechanism` -- vectors of floats, L2 distance ``sensitivity``, zero-concentrated divergence
  ``rho = sensitivity^2 / (2 sigma^2)``; the (epsilon, delta) the caller calibrated sigma for (with
  dp-accounting, e.g. over T compositions) is carried along and recorded. A calibrated one (``GaussianKind``)
  draws on OpenDP's lattice 2^k with sigma raised by the sensitivity share that lattice's rounding may add
  (``GAUSSIAN_LATTICE_SLACK``, 2^-30): rho is then OpenDP's map of the measurement, the calibrated one.

Where the noise comes from: :func:`secure_noise` is OpenDP's samplers, seeded from OS entropy on every draw
and never reproducible. ``--seed`` is public (it is written into the manifest), so noise derived from it would
make a release a deterministic function of the data (epsilon = infinity). The only seeded source,
:func:`insecure_noise`, exists for research grids that need bit-identical reruns; it is an explicit opt-in
(``--insecure-reproducible-noise``), reports ``secure: False``, and the release it makes is stamped
NOT DIFFERENTIALLY PRIVATE and refused by the release gate unless the operator insists.
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from privseed.tasks.errors import ConfigError

INSECURE_STAMP = "NOT DIFFERENTIALLY PRIVATE"


@runtime_checkable
class NoiseSource(Protocol):
    """Where a mechanism's randomness comes from."""

    # Read-only members (properties), so that frozen dataclasses satisfy the protocol.
    @property
    def name(self) -> str: ...

    @property
    def secure(self) -> bool: ...

    def laplace(self, exact: np.ndarray, scale: float) -> np.ndarray: ...

    def discrete_laplace(self, exact: np.ndarray, scale: float) -> np.ndarray: ...

    def gaussian(self, exact: np.ndarray, sigma: float, lattice: int | None = None) -> np.ndarray: ...

    def bernoulli(self, probabilities: np.ndarray) -> np.ndarray: ...


@functools.lru_cache(maxsize=1)
def _opendp():
    """OpenDP's measurement constructors (imported lazily: the import is only needed when noise is drawn)."""
    from opendp.domains import atom_domain, vector_domain
    from opendp.measurements import make_gaussian, make_laplace
    from opendp.metrics import l1_distance, l2_distance
    from opendp.mod import enable_features

    # "contrib" enables OpenDP's non-vetted-but-proven constructors; make_laplace/make_gaussian are among them.
    enable_features("contrib")
    return {
        "float_l1": (vector_domain(atom_domain(T=float, nan=False)), l1_distance(T=float)),
        "int_l1": (vector_domain(atom_domain(T=int)), l1_distance(T=int)),
        "float_l2": (vector_domain(atom_domain(T=float, nan=False)), l2_distance(T=float)),
        "make_laplace": make_laplace,
        "make_gaussian": make_gaussian,
        "vector_domain": vector_domain,
        "atom_domain": atom_domain,
    }


# OpenDP takes Python lists; chunks bound the memory of that conversion for million-entry histograms.
_CHUNK = 262_144

#: How much of a Gaussian mechanism's L2 sensitivity its calibration sets aside for OpenDP's lattice (below). OpenDP
#: samples float Gaussian noise on the lattice 2^k: at its default k (the smallest float, 2^-1074) its map is exact
#: and a draw takes ~47 us on these cores (big-integer arithmetic); on a coarser lattice it rounds the input onto the
#: lattice first, which its map charges as 2^k sqrt(n) more sensitivity over n coordinates, and a draw takes ~13 us.
#: A mechanism calibrated with this slack (``GaussianMechanism.lattice_slack``) draws on the coarsest lattice whose
#: rounding stays within it, with sigma raised by the same factor, so its guarantee is what it was calibrated for.
GAUSSIAN_LATTICE_SLACK = 2.0 ** -30


def gaussian_lattice(sensitivity: float, size: int, slack: float) -> int:
    """The largest k with 2^k sqrt(size) <= slack * sensitivity / 2: a lattice on which OpenDP's rounding of a
    ``size``-vector moves its L2 distance by at most ``slack`` of ``sensitivity``, with room to spare for the upward
    rounding of OpenDP's own map (pure)."""
    if not (sensitivity > 0 and slack > 0 and size >= 1):
        raise ConfigError(f"a Gaussian lattice needs a positive sensitivity and slack and a non-empty vector, got "
                          f"sensitivity {sensitivity}, slack {slack}, size {size}")
    bound = slack * float(sensitivity) / 2.0
    k = math.floor(math.log2(bound / math.sqrt(size)))
    while 2.0 ** k * math.sqrt(size) > bound:  # log2's rounding, never the guarantee's
        k -= 1
    return k


class SecureNoise:
    """OpenDP's samplers: OS entropy on every call, floating-point safe, never reproducible."""

    name = "opendp"
    secure = True

    def laplace(self, exact: np.ndarray, scale: float) -> np.ndarray:
        return self._apply("float_l1", "make_laplace", np.asarray(exact, dtype=np.float64), scale, float)

    def discrete_laplace(self, exact: np.ndarray, scale: float) -> np.ndarray:
        return self._apply("int_l1", "make_laplace", np.asarray(exact, dtype=np.int64), scale, int)

    def gaussian(self, exact: np.ndarray, sigma: float, lattice: int | None = None) -> np.ndarray:
        return self._apply("float_l2", "make_gaussian", np.asarray(exact, dtype=np.float64), sigma, float, lattice)

    def bernoulli(self, probabilities: np.ndarray) -> np.ndarray:
        # SystemRandom reads the OS CSPRNG; 53-bit uniforms make P(u < p) exact to 2^-53.
        source = random.SystemRandom()
        p = np.asarray(probabilities, dtype=np.float64)
        if np.any((p < 0) | (p > 1)) or not np.all(np.isfinite(p)):
            raise ValueError("Bernoulli probabilities must lie in [0, 1]")
        return np.fromiter((source.random() < q for q in p.ravel()), dtype=bool, count=p.size).reshape(p.shape)

    @staticmethod
    def _apply(space: str, constructor: str, exact: np.ndarray, scale: float, kind: type,
               lattice: int | None = None) -> np.ndarray:
        """OpenDP's measurement on ``exact``'s entries; ``lattice``: its noise granularity 2^k, on domains of the
        chunks' sizes (OpenDP needs the size to bound its rounding; i.i.d. noise, so chunks are one release), or
        None for OpenDP's default."""
        if not np.all(np.isfinite(exact)):
            raise ValueError("cannot privatize a vector with NaN or infinite entries")
        flat = exact.ravel()
        out = np.empty(flat.shape, dtype=np.float64 if kind is float else np.int64)
        for start in range(0, flat.size, _CHUNK):
            chunk = [kind(v) for v in flat[start:start + _CHUNK].tolist()]
            out[start:start + _CHUNK] = _measurement(space, constructor, float(scale), lattice,
                                                     len(chunk) if lattice is not None else None)(chunk)
        return out.reshape(exact.shape)


@functools.lru_cache(maxsize=64)
def _measurement(space: str, constructor: str, scale: float, lattice: int | None, size: int | None) -> Any:
    """OpenDP's measurement of ``constructor`` at ``scale``: on its default lattice, or on 2^``lattice`` over
    vectors of ``size`` entries."""
    api = _opendp()
    if lattice is None:
        return api[constructor](*api[space], scale=scale)
    domain = api["vector_domain"](api["atom_domain"](T=float, nan=False), size=size)
    return api[constructor](domain, api[space][1], scale=scale, k=lattice)


@dataclass(frozen=True)
class InsecureReproducibleNoise:
    """Noise from a seeded PCG64 stream: reproducible, hence NOT differentially private once the seed is known.

    For research grids only (``--insecure-reproducible-noise``)."""

    seed: int
    stream: tuple[str, ...] = ()
    secure: bool = field(default=False, init=False)

    @property
    def name(self) -> str:
        return f"insecure-reproducible(seed={self.seed}, stream={'/'.join(self.stream)})"

    def _rng(self) -> np.random.Generator:
        words = [int.from_bytes(hashlib.sha256(s.encode()).digest()[:4], "little") for s in self.stream]
        return np.random.default_rng(np.random.SeedSequence([int(self.seed) & 0xFFFFFFFF, *words]))

    def laplace(self, exact: np.ndarray, scale: float) -> np.ndarray:
        exact = np.asarray(exact, dtype=np.float64)
        return exact + self._rng().laplace(0.0, scale, size=exact.shape)

    def discrete_laplace(self, exact: np.ndarray, scale: float) -> np.ndarray:
        # Difference of two geometric variables is the two-sided geometric (discrete Laplace) distribution.
        exact = np.asarray(exact, dtype=np.int64)
        rng = self._rng()
        p = 1.0 - math.exp(-1.0 / scale)
        return exact + (rng.geometric(p, size=exact.shape) - rng.geometric(p, size=exact.shape))

    def gaussian(self, exact: np.ndarray, sigma: float, lattice: int | None = None) -> np.ndarray:
        # (continuous draws: ``lattice`` is OpenDP's granularity, and this source claims no guarantee)
        exact = np.asarray(exact, dtype=np.float64)
        return exact + self._rng().normal(0.0, sigma, size=exact.shape)

    def bernoulli(self, probabilities: np.ndarray) -> np.ndarray:
        p = np.asarray(probabilities, dtype=np.float64)
        return self._rng().random(p.shape) < p


_SECURE = SecureNoise()


def secure_noise() -> NoiseSource:
    """The default and only private source of noise."""
    return _SECURE


def insecure_noise(seed: int, *stream: str) -> NoiseSource:
    """A seeded, reproducible source: the release it makes is not differentially private."""
    return InsecureReproducibleNoise(int(seed), tuple(str(s) for s in stream))


def noise_source(insecure_seed: int | None, *stream: str) -> NoiseSource:
    """The source a flow uses: secure unless the operator opted in to reproducible (insecure) noise."""
    return secure_noise() if insecure_seed is None else insecure_noise(insecure_seed, *stream)


def as_noise_source(noise: NoiseSource | None) -> NoiseSource:
    """``noise`` checked to be a noise source (None: the secure one).

    A ``numpy.random.Generator`` is refused: in privseed generators are public randomness
    (``privseed.tasks.dp.ledger.public_rng``, derived from the published ``--seed``), and noise drawn from one is a
    deterministic function of public configuration."""
    if noise is None:
        return secure_noise()
    if isinstance(noise, (np.random.Generator, np.random.RandomState)) or not isinstance(noise, NoiseSource):
        raise TypeError(
            f"a mechanism's noise must come from privseed.tasks.dp.mechanisms (secure_noise() or, opted in, "
            f"insecure_noise()), "
            f"not {type(noise).__name__}: generators are public randomness"
        )
    return noise


def _check_positive(name: str, value: float) -> float:
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")
    return value


class Mechanism(Protocol):
    # Read-only members (properties), so that the frozen mechanism dataclasses satisfy the protocol.
    @property
    def epsilon(self) -> float: ...

    @property
    def delta(self) -> float: ...

    @property
    def sensitivity(self) -> float: ...

    @property
    def scale(self) -> float: ...

    @property
    def kind(self) -> MechanismKind: ...

    def release(self, exact: np.ndarray, noise: NoiseSource | None = None) -> np.ndarray: ...

    def noise_tail(self, values: np.ndarray, discrete: bool = False) -> np.ndarray: ...

    def describe(self, noise: NoiseSource | None = None) -> dict[str, Any]: ...


@dataclass(frozen=True)
class LaplaceMechanism:
    """epsilon-DP for inputs at L1 distance <= ``sensitivity``: adds Laplace(sensitivity / epsilon) per entry.

    Integer inputs with an integer sensitivity get discrete Laplace noise of the same scale (same guarantee,
    exact on integers, and about 4x faster to sample)."""

    sensitivity: float
    epsilon: float

    def __post_init__(self) -> None:
        _check_positive("sensitivity", self.sensitivity)
        _check_positive("epsilon", self.epsilon)

    @property
    def delta(self) -> float:
        return 0.0

    @property
    def scale(self) -> float:
        return float(self.sensitivity) / float(self.epsilon)

    def is_discrete_for(self, exact: np.ndarray) -> bool:
        return np.issubdtype(np.asarray(exact).dtype, np.integer) and float(self.sensitivity).is_integer()

    def release(self, exact: np.ndarray, noise: NoiseSource | None = None) -> np.ndarray:
        noise = as_noise_source(noise)
        if self.is_discrete_for(exact):
            return noise.discrete_laplace(exact, self.scale)
        return noise.laplace(exact, self.scale)

    def noise_distribution(self, discrete: bool = False):
        """The distribution of (released - exact), as a frozen scipy distribution (for tests and audits)."""
        from scipy import stats

        return stats.dlaplace(1.0 / self.scale) if discrete else stats.laplace(scale=self.scale)

    @property
    def kind(self) -> MechanismKind:
        return LAPLACE

    def noise_tail(self, values: np.ndarray, discrete: bool = False) -> np.ndarray:
        """P(noise >= value), the discrete law's on integer releases (``is_discrete_for``)."""
        values = np.asarray(values, dtype=np.float64)
        law = self.noise_distribution(discrete=discrete)
        return law.sf(np.ceil(values) - 1) if discrete else law.sf(values)

    def describe(self, noise: NoiseSource | None = None) -> dict[str, Any]:
        noise = as_noise_source(noise)
        return {
            "mechanism": LAPLACE.name,
            "input_metric": "l1_distance",
            "output_measure": "max_divergence (pure epsilon-DP)",
            "sensitivity": float(self.sensitivity),
            "scale": self.scale,
            "epsilon": float(self.epsilon),
            "delta": 0.0,
            "noise_source": noise.name,
            "secure": bool(noise.secure),
        }


@dataclass(frozen=True)
class GaussianMechanism:
    """Adds N(0, sigma^2) per entry for inputs at L2 distance <= ``sensitivity``.

    One release is rho-zCDP with rho = (sensitivity (1 + lattice_slack))^2 / (2 sigma^2): OpenDP's map of the
    measurement it draws with. ``lattice_slack`` 0: OpenDP's default (exact) lattice; above 0 (a calibration that
    raised sigma by 1 + slack, ``GaussianKind.calibrated``): the coarsest lattice whose rounding adds at most that
    share to the sensitivity (``gaussian_lattice``: 2^k sqrt(n) <= slack * sensitivity), 3.5x faster to sample.
    ``epsilon`` and ``delta`` are what the caller calibrated sigma for with a maintained accountant (e.g. T
    compositions under dp-accounting's PLD); they are recorded as given, next to rho, which this object computes
    itself."""

    sensitivity: float
    sigma: float
    epsilon: float
    delta: float
    lattice_slack: float = 0.0

    def __post_init__(self) -> None:
        _check_positive("sensitivity", self.sensitivity)
        _check_positive("sigma", self.sigma)
        if not (self.epsilon >= 0 and math.isfinite(self.epsilon)) or not (0 <= self.delta < 1):
            raise ConfigError("a Gaussian mechanism needs epsilon >= 0 and delta in [0, 1)")
        if not 0.0 <= self.lattice_slack <= GAUSSIAN_LATTICE_SLACK:
            raise ConfigError(f"a Gaussian mechanism's lattice slack lies in [0, {GAUSSIAN_LATTICE_SLACK}], got "
                              f"{self.lattice_slack}")

    @property
    def scale(self) -> float:
        return float(self.sigma)

    @property
    def rho(self) -> float:
        return (float(self.sensitivity) * (1.0 + self.lattice_slack)) ** 2 / (2.0 * float(self.sigma) ** 2)

    def lattice(self, size: int) -> int | None:
        """OpenDP's noise granularity 2^k for a vector of ``size`` entries (None: its default, exact lattice)."""
        if self.lattice_slack == 0.0 or size == 0:
            return None
        return gaussian_lattice(self.sensitivity, size, self.lattice_slack)

    def release(self, exact: np.ndarray, noise: NoiseSource | None = None) -> np.ndarray:
        return as_noise_source(noise).gaussian(exact, self.sigma, self.lattice(int(np.size(exact))))

    def noise_distribution(self):
        from scipy import stats

        return stats.norm(scale=self.sigma)

    @property
    def kind(self) -> MechanismKind:
        return GAUSSIAN

    def noise_tail(self, values: np.ndarray, discrete: bool = False) -> np.ndarray:
        """P(noise >= value) (Gaussian releases are floats: ``discrete`` does not apply)."""
        return self.noise_distribution().sf(np.asarray(values, dtype=np.float64))

    def describe(self, noise: NoiseSource | None = None) -> dict[str, Any]:
        noise = as_noise_source(noise)
        return {
            "mechanism": GAUSSIAN.name,
            "input_metric": "l2_distance",
            "output_measure": "zero_concentrated_divergence (rho-zCDP); (epsilon, delta) from the accountant",
            "sensitivity": float(self.sensitivity),
            "scale": self.scale,
            "rho": self.rho,
            "lattice_slack": self.lattice_slack,
            "epsilon": float(self.epsilon),
            "delta": float(self.delta),
            "noise_source": noise.name,
            "secure": bool(noise.secure),
        }


def is_secure(description: Mapping[str, Any]) -> bool:
    """Whether a recorded mechanism description came from the secure sampler."""
    return bool(description.get("secure", False))


# ---------------------------------------------------------------------------------------------------------
# Mechanism kinds: each kind owns how it is calibrated and how its releases compose
# ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sensitivity:
    """How far one document (under the release's adjacency) moves the released vector, in the norms a kind may
    need. ``l1`` None: no finite L1 bound (e.g. a unit-L2 contribution spread over every term of a long
    document), so no kind calibrated on L1 can release it."""

    l2: float
    l1: float | None = None
    #: how many coordinates one document may move (None: unbounded) and by how much at most, each
    l0: int | None = None
    linf: float | None = None

    @staticmethod
    def of_counts(l1: float) -> Sensitivity:
        """A vector of counts where a document adds at most 1 to each of ``l1`` coordinates: L2 = sqrt(L1)."""
        return Sensitivity(l2=math.sqrt(float(l1)), l1=float(l1), l0=int(math.ceil(float(l1))), linf=1.0)


class MechanismKind(Protocol):
    """A family of mechanisms: it calibrates one for a sensitivity and a budget, says how a schedule of its
    releases composes, and describes itself. The ledger asks the kind (``compose``) what a charge costs; a
    method asks it (``calibrated``) for its mechanism; adding a kind touches this module and the method only."""

    @property
    def name(self) -> str: ...

    @property
    def spends_delta(self) -> bool:
        """Whether its releases cost a delta > 0 (a run with it must declare --delta); else pure epsilon-DP."""

    def calibrated(self, sensitivity: Sensitivity, epsilon: float, delta: float = 0.0) -> Mechanism: ...

    def compose(self, epsilon: float, delta: float, releases: int) -> tuple[float, float]: ...

    def describe(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class LaplaceKind:
    """Pure epsilon-DP on L1 sensitivity; ``releases`` draws compose by basic composition (epsilon adds up)."""

    name: str = "laplace"
    spends_delta: bool = False

    def calibrated(self, sensitivity: Sensitivity, epsilon: float, delta: float = 0.0) -> LaplaceMechanism:
        if sensitivity.l1 is None:
            raise ConfigError("this release has no bounded L1 sensitivity, so Laplace noise cannot protect it: "
                              "use --mechanism gaussian with --delta")
        return LaplaceMechanism(sensitivity=sensitivity.l1, epsilon=_check_positive("epsilon", epsilon))

    def compose(self, epsilon: float, delta: float, releases: int) -> tuple[float, float]:
        return float(epsilon) * int(releases), 0.0

    def describe(self) -> dict[str, Any]:
        return {"mechanism": self.name, "input_metric": "l1_distance",
                "output_measure": "max_divergence (pure epsilon-DP)",
                "composition": "basic: a schedule of R releases costs R epsilon"}


@functools.lru_cache(maxsize=256)
def gaussian_noise_multiplier(epsilon: float, delta: float) -> float:
    """The smallest z such that one Gaussian release with noise z * (L2 sensitivity) is (eps, delta)-DP.

    One release's privacy profile is exact in closed form (the analytic Gaussian mechanism, Balle & Wang 2018):
    delta(eps) = Phi(1/(2z) - eps z) - e^eps Phi(-1/(2z) - eps z), which dp-accounting's ``GaussianPrivacyLoss``
    evaluates; it falls as z grows, so its root is found by bracketing, and z is then nudged up until the exact
    delta is at most the target (never below the root). The PLD accountant's calibration gives the same z to 1e-4
    (its discretization is pessimistic by up to 0.01 %) but takes 3-9 s a call; this takes about 10 ms."""
    if not (epsilon > 0) or math.isnan(epsilon) or math.isinf(epsilon):
        raise ConfigError(f"epsilon must be positive and finite, got {epsilon}")
    if not (0.0 < delta < 1.0):
        raise ConfigError(f"the Gaussian mechanism needs 0 < delta < 1, got {delta}")
    from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss  # deferred for start-up time
    from scipy.optimize import brentq

    def excess_delta(z: float) -> float:
        return GaussianPrivacyLoss(standard_deviation=z, sensitivity=1.0).get_delta_for_epsilon(epsilon) - delta

    low, high = 1e-4, 1.0
    while excess_delta(high) > 0:  # widen the bracket until z is large enough (delta(z) -> 0 as z grows)
        low, high = high, high * 4
    z = float(brentq(excess_delta, low, high, xtol=1e-12, rtol=1e-12)) if excess_delta(low) > 0 else low
    while excess_delta(z) > 0:  # the root's upper side: the release is never calibrated below the target
        z = math.nextafter(z, math.inf) * (1 + 1e-12)
    return z


@dataclass(frozen=True)
class GaussianKind:
    """(epsilon, delta)-DP on L2 sensitivity; sigma is calibrated by dp-accounting's PLD accountant. A schedule
    is charged the (epsilon, delta) its sigma was calibrated for over all of its releases (the accountant's
    composition, tighter than adding them up), so ``compose`` returns them unchanged."""

    name: str = "gaussian"
    spends_delta: bool = True

    def calibrated(self, sensitivity: Sensitivity, epsilon: float, delta: float = 0.0) -> GaussianMechanism:
        if not 0.0 < delta < 1.0:
            raise ConfigError(f"the Gaussian mechanism needs 0 < delta < 1, got {delta}")
        l2 = _check_positive("sensitivity", sensitivity.l2)
        # calibrated for the sensitivity plus what OpenDP's lattice may add to it (GAUSSIAN_LATTICE_SLACK)
        sigma = gaussian_noise_multiplier(float(epsilon), float(delta)) * l2 * (1.0 + GAUSSIAN_LATTICE_SLACK)
        return GaussianMechanism(sensitivity=l2, sigma=sigma, epsilon=float(epsilon), delta=float(delta),
                                 lattice_slack=GAUSSIAN_LATTICE_SLACK)

    def compose(self, epsilon: float, delta: float, releases: int) -> tuple[float, float]:
        return float(epsilon), float(delta)

    def describe(self) -> dict[str, Any]:
        return {"mechanism": self.name, "input_metric": "l2_distance",
                "output_measure": "zero_concentrated_divergence; (epsilon, delta) from dp-accounting's PLD",
                "composition": "by the accountant: a schedule is charged what its sigma was calibrated for"}


@dataclass(frozen=True)
class LaplaceThresholdMechanism:
    """The stability-based (sparse) histogram of integer counts (Korolova et al. 2009; OpenDP's
    ``make_laplace_threshold``, Rogers 2023): discrete Laplace noise of ``scale`` on the coordinates whose exact
    count is not 0 (the terms that occur), and only noisy counts >= ``threshold`` are released; every other
    coordinate is released as 0. A coordinate that no document holds is never noised and never released, so
    pure-noise terms cannot reach a top K.

    Guarantee (input: integer vectors; one document moves at most ``l0`` coordinates, each by at most ``linf``,
    ``sensitivity`` = L1 in all): (epsilon, delta)-DP with epsilon = min(L1, L0 Linf) / scale (OpenDP's privacy map
    of the same measurement) and delta = ``laplace_threshold_delta``, computed exactly from the discrete Laplace
    tails: the probability that one of the coordinates a document creates passes the threshold.
    ``LaplaceThresholdKind.calibrated`` chooses the smallest integer threshold whose exact delta meets the declared
    one. (OpenDP 0.16's map gives a delta too small by a factor e^(1 / scale), opendp/opendp#2922, so its delta is
    not used.)"""

    sensitivity: float
    l0: int
    linf: float
    scale: float
    threshold: int
    epsilon: float
    delta: float

    @property
    def kind(self) -> MechanismKind:
        return LAPLACE_THRESHOLD

    def release(self, exact: np.ndarray, noise: NoiseSource | None = None) -> np.ndarray:
        noise = as_noise_source(noise)
        exact = np.asarray(exact)
        if not np.issubdtype(exact.dtype, np.integer):
            raise ConfigError("the thresholded Laplace histogram releases integer counts only")
        out = np.zeros(exact.shape, dtype=np.float64)
        occurring = np.flatnonzero(exact.ravel())
        if occurring.size:
            noisy = noise.discrete_laplace(exact.ravel()[occurring], self.scale).astype(np.float64)
            kept = noisy >= self.threshold
            out.ravel()[occurring[kept]] = noisy[kept]
        return out

    def noise_distribution(self, discrete: bool = True):
        from scipy import stats

        return stats.dlaplace(1.0 / self.scale) if discrete else stats.laplace(scale=self.scale)

    def noise_tail(self, values: np.ndarray, discrete: bool = True) -> np.ndarray:
        """P(noise >= value) of the discrete Laplace noise on an occurring term (only those are ever noised)."""
        values = np.asarray(values, dtype=np.float64)
        return self.noise_distribution(True).sf(np.ceil(values) - 1)

    def describe(self, noise: NoiseSource | None = None) -> dict[str, Any]:
        noise = as_noise_source(noise)
        return {
            "mechanism": LAPLACE_THRESHOLD.name,
            "input_metric": "l01inf_distance (L0, L1, Linf of one document's change)",
            "output_measure": "approximate max_divergence ((epsilon, delta)-DP: epsilon by OpenDP's privacy map, "
                              "delta exact from the discrete Laplace tails)",
            "sensitivity": float(self.sensitivity), "l0": int(self.l0), "linf": float(self.linf),
            "scale": float(self.scale), "threshold": int(self.threshold),
            "epsilon": float(self.epsilon), "delta": float(self.delta),
            "noise_source": noise.name,
            "secure": bool(noise.secure),
        }


@functools.lru_cache(maxsize=256)
def opendp_threshold_map(scale: float, threshold: int, l0: int, l1: int, linf: int) -> tuple[float, float]:
    """OpenDP's privacy map of make_laplace_threshold over integer counts: (epsilon, delta) at (l0, l1, linf).

    Its epsilon, min(l1, l0 linf) / scale, is right and is the one privseed records. Its delta is not: OpenDP
    0.16.0 bounds the tail P(Z > threshold - linf) where a count is kept at noisy >= threshold, i.e. when
    Z >= threshold - linf, one step further out, so the delta is e^(1 / scale) too small (opendp/opendp#2922;
    tests/test_mechanisms.py notices when an upgrade fixes it). ``laplace_threshold_delta`` is used instead."""
    import opendp.prelude as dp

    dp.enable_features("contrib")
    domain = dp.map_domain(dp.atom_domain(T=int), dp.atom_domain(T=int))
    measurement = dp.m.make_laplace_threshold(domain, dp.l01inf_distance(dp.absolute_distance(T=int)),
                                              scale=float(scale), threshold=int(threshold))
    epsilon, delta = measurement.map((int(l0), int(l1), int(linf)))
    return float(epsilon), float(delta)


def laplace_threshold_delta(scale: float, threshold: int, l0: int, l1: int, linf: int) -> float:
    """The exact delta of ``LaplaceThresholdMechanism``: discrete Laplace noise Z of ``scale`` (P(k) proportional
    to e^(-|k| t), t = 1 / scale) on the counts that are not 0, a noisy count kept when it is >= ``threshold``.

    Guarantee, for adjacent corpora where one document moves at most ``l0`` coordinates, each by at most
    ``linf``, ``l1`` in all (so it creates at most L0 = min(l0, l1) coordinates, each at a count of at most
    Linf = min(linf, l1)): the mechanism is (epsilon, delta)-DP with epsilon = min(l1, l0 linf) / scale and

        delta = 1 - (1 - p)^L0,   p = P(Z >= threshold - Linf) = e^(-t k) / (1 + e^(-t)) for k = threshold - Linf >= 1.

    Proof. Split the document's coordinates into A, those it shifts (nonzero on both corpora: both are noised, and
    the thresholding is post-processing of a discrete Laplace shift, pure DP at the shifts' L1 / scale), and B, the
    coordinates only the larger corpus holds (count c_i in 1..Linf there, never noised nor released on the other).
    B's coordinates are all withheld with probability q = prod_i P(c_i + Z < threshold) >= (1 - p)^|B|; then the two
    releases agree on B, and the event "some coordinate of B is released" has probability 1 - q on one side and 0
    on the other. For any set of outputs S this gives P'(S) <= (1 - q) + e^eps P(S), and the other direction
    within 1 - q as well (A's loss is at most eps - |B| / scale, since each created coordinate uses at least 1 of
    the L1), so delta <= 1 - (1 - p)^|B| <= 1 - (1 - p)^L0. It is attained: a document that creates L0
    coordinates at count Linf (privseed's first-S histogram: S new terms, 1 each) releases one of them with
    exactly that probability while the other corpus never does. The tail is scipy's ``dlaplace.sf`` (the same law
    as OpenDP's sampler), the power computed as -expm1(L0 log1p(-p)); both in double precision, relative error
    below 1e-14."""
    from scipy import stats

    scale = _check_positive("scale", scale)
    created = min(int(l0), int(math.floor(l1)))
    largest = min(float(linf), float(l1))
    if created < 1 or largest <= 0:
        return 0.0
    # P(largest + Z >= threshold) = P(Z >= threshold - largest) = P(Z > threshold - largest - 1); counts are integers
    p = float(stats.dlaplace.sf(math.ceil(threshold - largest) - 1, 1.0 / scale))
    if p >= 1.0:
        return 1.0
    return float(-math.expm1(created * math.log1p(-p)))


@dataclass(frozen=True)
class LaplaceThresholdKind:
    """The thresholded Laplace histogram (``LaplaceThresholdMechanism``): calibrated on L0, L1 and Linf with a
    declared delta (the smallest integer threshold whose exact delta, ``laplace_threshold_delta``, meets it);
    R releases compose by basic composition (R epsilon, R delta)."""

    name: str = "laplace-threshold"
    spends_delta: bool = True  # the threshold's release of a term only one document holds

    def calibrated(self, sensitivity: Sensitivity, epsilon: float, delta: float = 0.0) -> LaplaceThresholdMechanism:
        epsilon = _check_positive("epsilon", epsilon)
        if not 0.0 < delta < 1.0:
            raise ConfigError(f"the thresholded histogram needs a declared delta in (0, 1) (--delta), got {delta}")
        if sensitivity.l1 is None or sensitivity.l0 is None or sensitivity.linf is None:
            raise ConfigError("the thresholded histogram needs bounded L0, L1 and Linf sensitivities: use "
                              "--hist-contribution first-terms")
        l0, l1, linf = int(sensitivity.l0), int(math.ceil(sensitivity.l1)), int(math.ceil(sensitivity.linf))
        scale = l1 / epsilon

        def exact_delta(threshold: int) -> float:
            # looked up on the module at every call (tasks/audit/faults.py swaps in OpenDP's map to measure the audit)
            return laplace_threshold_delta(scale, threshold, l0, l1, linf)

        # the delta falls as the threshold grows; OpenDP's map needs threshold >= linf
        lo, hi = linf, 2 * linf
        while exact_delta(hi) > delta:
            lo, hi = hi, hi * 2
            if hi > 2**40:
                raise ConfigError(f"no threshold meets delta {delta} at scale {scale}")
        while lo < hi:  # the smallest integer threshold whose exact delta is within the declared one
            mid = (lo + hi) // 2
            if exact_delta(mid) <= delta:
                hi = mid
            else:
                lo = mid + 1
        mapped_epsilon, _ = opendp_threshold_map(scale, hi, l0, l1, linf)
        return LaplaceThresholdMechanism(sensitivity=float(l1), l0=l0, linf=float(linf), scale=scale, threshold=hi,
                                         epsilon=mapped_epsilon, delta=exact_delta(hi))

    def compose(self, epsilon: float, delta: float, releases: int) -> tuple[float, float]:
        return float(epsilon) * int(releases), float(delta) * int(releases)

    def describe(self) -> dict[str, Any]:
        return {"mechanism": self.name, "input_metric": "l01inf_distance",
                "output_measure": "approximate max_divergence ((epsilon, delta)-DP)",
                "composition": "basic: a schedule of R releases costs R epsilon and R delta"}


LAPLACE = LaplaceKind()
GAUSSIAN = GaussianKind()
LAPLACE_THRESHOLD = LaplaceThresholdKind()

#: Every kind by its recorded name (the ``mechanism`` field of ledger entries and of ``--mechanism``).
MECHANISM_KINDS: dict[str, MechanismKind] = {LAPLACE.name: LAPLACE, GAUSSIAN.name: GAUSSIAN,
                                             LAPLACE_THRESHOLD.name: LAPLACE_THRESHOLD}
#: The kinds whose releases spend a delta (their ``spends_delta``); the others are pure epsilon-DP.
DELTA_MECHANISMS: tuple[str, ...] = tuple(name for name, kind in MECHANISM_KINDS.items() if kind.spends_delta)


def mechanism_kind(name: str) -> MechanismKind:
    """The kind called ``name``; one line naming the choices otherwise."""
    try:
        return MECHANISM_KINDS[str(name)]
    except KeyError:
        raise ConfigError(f"unknown mechanism {name!r}; choose one of {', '.join(MECHANISM_KINDS)}") from None
