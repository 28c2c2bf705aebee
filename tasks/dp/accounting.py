"""Privacy accounting for the private-evolution baselines (Aug-PE, AugPE+V~, SecPE).

Pure functions, no I/O. Every number comes from dp-accounting's privacy-loss-distribution (PLD) code;
nothing here is a hand-written accountant.

Aug-PE (Xie et al., ICML 2024)
    Each round releases a histogram to which every private document adds one vote (add/remove adjacency:
    L2 sensitivity 1), plus N(0, sigma^2) on every bin. T rounds are T Gaussian mechanisms with the same
    sigma, composed with the PLD accountant (add/remove neighbouring relation). ``augpe_noise_multiplier``
    returns the smallest sigma whose T-fold composition is (epsilon, delta)-DP.

    The published multipliers (Aug-PE Table: sigma for eps 1/2/4 on Yelp, OpenReview, PubMed) were picked on a
    0.01 grid by the authors' notebook (`notebook/dp_budget.ipynb` in the public repository); they are not the
    exact calibration (Yelp eps=1: published 15.34, exact 15.40, and 15.34 is (1.0045, delta)-DP). Our tests
    therefore check that the epsilon of every published sigma rounds to its target at two decimals and that our
    calibrated sigma is within 0.5 % of the published one. See docs/baselines.md.

SecPE (Wang et al.)
    (p, r)-secret protection: for secret j with prior p_j, the adversary's reconstruction success is at most
    r_j. Adjacent corpora differ by the documents that hold secret j. Every round samples each private document
    once, with probability rho_i, and that one draw drives both released parts of the round: the noisy cluster
    sizes and the noisy cluster centres. Normalised by their own noise scales (sizes by 1, centre k by its
    per-document bound c_k), one sampled holder moves the sizes by 1 and its centre by at most 1, so the round is
    ONE Gaussian mechanism on the concatenated (sizes, centres) vector whose shift is at most sqrt(2) S_j, with
    S_j = sum_{i holds j} Bern(rho_i) (Poisson-binomial). The pair
    (sum_k P(S_j = k) N(sqrt(2) k, sigma^2), N(0, sigma^2)) dominates one round; T rounds (independent draws)
    compose T times. Calibrating sizes and centres as 2T independent mixtures instead under-counts: the two
    parts see the same draw, so their shifts add in L2 for the same k (``holder_shift`` below).
    The blow-up function of the composed pair, B(p) = sup_{E: Q(E) <= p} P(E), is bounded by
    inf_eps (e^eps p + delta(eps)) with delta(eps) from the PLD (both add and remove directions, so the bound
    holds either way). Sigma is found by bisection on B(p_j) <= r_j. With every rho_i = 1 and one holder the
    pair is mu-GDP with mu = sqrt(2 T)/sigma and B(p) = 1 - Phi(Phi^-1(1-p) - mu) (Lemma 3.2 of the SecPE
    paper), which the tests check.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from numpy.typing import ArrayLike

from privseed.tasks.errors import ConfigError

ADJACENCY = "add/remove one document"

# SecPE: one sampled holder moves the normalised sizes by 1 and the normalised centre by at most 1, and both are
# driven by the same Bernoulli draw, so the round's joint L2 shift per sampled holder is sqrt(1 + 1).
SECPE_HOLDER_SHIFT = math.sqrt(2.0)
SECPE_ADJACENCY = "add/remove the documents that hold one secret"

# dp-accounting imports are deferred to the functions (the package pulls in scipy/attrs machinery that is
# not needed by callers who only read ledgers).


def default_delta(n_upper_bound: int) -> float:
    """Aug-PE's delta = 1 / (n ln n).

    n is the private corpus size, which is itself private. Callers pass a *public upper bound* on n from the
    configuration (never len(private corpus)); a larger bound gives a smaller, i.e. safer, delta.
    """
    if n_upper_bound is None or int(n_upper_bound) < 3:
        raise ConfigError("delta default needs a public upper bound on the corpus size (n_upper_bound >= 3)")
    n = float(n_upper_bound)
    return 1.0 / (n * math.log(n))


def _pld_accountant(value_discretization_interval: float):
    from dp_accounting import privacy_accountant
    from dp_accounting.pld import pld_privacy_accountant

    return pld_privacy_accountant.PLDAccountant(
        neighboring_relation=privacy_accountant.NeighboringRelation.ADD_OR_REMOVE_ONE,
        value_discretization_interval=value_discretization_interval,
    )


def _augpe_event(noise_multiplier: float, iterations: int):
    from dp_accounting import dp_event

    return dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(noise_multiplier), int(iterations))


# Both are pure functions of public settings and cost a PLD build (0.1-1 s): a process that asks again for the
# same schedule (a resumed flow, the audit's trials) gets the same number from the cache.
@functools.lru_cache(maxsize=256)
def augpe_epsilon(noise_multiplier: float, delta: float, iterations: int,
                  value_discretization_interval: float = 1e-3) -> float:
    """Epsilon of T Gaussian rounds with sensitivity 1 and noise std ``noise_multiplier``, at ``delta``."""
    if noise_multiplier <= 0:
        raise ConfigError(f"noise multiplier must be > 0, got {noise_multiplier}")
    if iterations < 1:
        raise ConfigError(f"iterations must be >= 1, got {iterations}")
    if not 0.0 < delta < 1.0:
        raise ConfigError(f"delta must lie in (0, 1), got {delta}")
    acc = _pld_accountant(value_discretization_interval)
    acc.compose(_augpe_event(noise_multiplier, iterations))
    return float(acc.get_epsilon(delta))


@functools.lru_cache(maxsize=256)
def augpe_noise_multiplier(epsilon: float, delta: float, iterations: int,
                           value_discretization_interval: float = 1e-3, tol: float = 1e-4) -> float:
    """Smallest sigma such that T rounds of the sensitivity-1 Gaussian histogram are (epsilon, delta)-DP.

    Calibrated with dp-accounting's PLD accountant (add/remove adjacency). The PLD is pessimistic, so the
    returned sigma is never too small; value_discretization_interval 1e-3 agrees with 1e-4 to 1e-5 relative
    here and is ~10x faster.
    """
    from dp_accounting import mechanism_calibration

    if not epsilon > 0 or not math.isfinite(epsilon):
        raise ConfigError(f"epsilon must be a positive finite number, got {epsilon}")
    if not 0.0 < delta < 1.0:
        raise ConfigError(f"delta must lie in (0, 1), got {delta}")
    if iterations < 1:
        raise ConfigError(f"iterations must be >= 1, got {iterations}")
    # Bracket the search around the closed-form GDP answer (T rounds = one Gaussian with sigma/sqrt(T)), so the
    # PLD is never built for a tiny sigma (whose support would not fit in memory); the PLD decides the value.
    guess = _gdp_sigma(float(epsilon), float(delta), int(iterations))
    return float(mechanism_calibration.calibrate_dp_mechanism(
        lambda: _pld_accountant(value_discretization_interval),
        lambda s: _augpe_event(s, iterations),
        float(epsilon), float(delta),
        bracket_interval=mechanism_calibration.ExplicitBracketInterval(0.8 * guess, 1.25 * guess),
        tol=tol,
    ))


def _gaussian_delta(eps: float, mu: float) -> float:
    from scipy.stats import norm  # deferred for start-up time: the command line validates with default_delta
    return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2))


def _gdp_sigma(epsilon: float, delta: float, iterations: int) -> float:
    from scipy.optimize import brentq

    f = lambda s: _gaussian_delta(epsilon, math.sqrt(iterations) / s) - delta  # noqa: E731
    return float(brentq(f, 1e-3, 1e6))


# ----------------------------------------------------------------------------------------------------------
# SecPE: (p, r)-secret protection
# ----------------------------------------------------------------------------------------------------------

def gaussian_reconstruction_bound(p: float, mu: float) -> float:
    """Lemma 3.2 of SecPE: a mu-GDP mechanism has blow-up B(p) = 1 - Phi(Phi^-1(1-p) - mu)."""
    from scipy.stats import norm  # deferred for start-up time: the command line validates with default_delta
    return float(norm.sf(norm.isf(p) - mu))


def gdp_mu_for_secret(p: float, r: float) -> float:
    """mu = Phi^-1(1-p) - Phi^-1(1-r): the GDP parameter with the same (p, r) operating point (eta_j)."""
    from scipy.stats import norm  # deferred for start-up time: the command line validates with default_delta
    if not 0.0 < p < 1.0:
        raise ConfigError(f"prior p must lie in (0, 1), got {p}")
    if not p < r <= 1.0:
        raise ConfigError(f"reconstruction bound r must lie in (p, 1], got r={r}, p={p}")
    if r >= 1.0:
        return math.inf
    return float(norm.isf(p) - norm.isf(r))


def poisson_binomial_pmf(rho: ArrayLike, tail_mass: float = 1e-12) -> tuple[np.ndarray, np.ndarray, float]:
    """Distribution of S = sum_i Bern(rho_i).

    Returns (support, probabilities, dropped) where the support is truncated once the upper tail holds less
    than ``tail_mass``; ``dropped`` is that tail mass. For any event E, P(E) <= P_truncated(E) + dropped, so a
    blow-up computed on the truncated (renormalised) mixture plus ``dropped`` is still an upper bound.
    """
    rho = np.clip(np.asarray(rho, dtype=np.float64), 0.0, 1.0)
    rho = rho[rho > 0]
    pmf = np.array([1.0])
    for q in rho:  # exact convolution; the number of holders of one secret is small
        nxt = np.zeros(pmf.size + 1)
        nxt[:-1] += pmf * (1.0 - q)
        nxt[1:] += pmf * q
        pmf = nxt
    support = np.arange(pmf.size, dtype=np.float64)
    tail = np.cumsum(pmf[::-1])[::-1]  # tail[k] = P(S >= k)
    keep = int(np.searchsorted(-tail, -tail_mass, side="right"))  # first k with P(S >= k) < tail_mass
    keep = max(keep, 1)
    dropped = float(tail[keep]) if keep < pmf.size else 0.0
    probs = pmf[:keep] / pmf[:keep].sum()
    return support[:keep], probs, dropped


def mixture_blow_up(sigma: float, sensitivities: ArrayLike, probabilities: ArrayLike, p: float,
                    compositions: int, value_discretization_interval: float = 1e-2,
                    dropped_mass: float = 0.0) -> float:
    """Upper bound on the blow-up B(p) of the T-fold composed pair
    (sum_k probabilities[k] N(sensitivities[k], sigma^2), N(0, sigma^2)).

    B(p) <= inf_eps (e^eps p + delta(eps)), delta from dp-accounting's PLD of the mixture-of-Gaussians
    mechanism (from_mixture_gaussian_mechanism, pessimistic, both directions), self-composed T times.
    """
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    sens = np.asarray(sensitivities, dtype=np.float64)
    probs = np.asarray(probabilities, dtype=np.float64)
    if sens.size == 0 or float(np.max(sens)) == 0.0:
        return float(min(1.0, p + dropped_mass))  # the secret is never sampled: no information
    # Components of probability 0 carry no mass; dp-accounting's mixture fails on them when sigma is large.
    keep = probs > 0.0
    sens, probs = sens[keep], probs[keep]
    if sens.size == 1:
        # One component (every holder is always sampled): the pair is a plain Gaussian mechanism.
        pld = pld_lib.from_gaussian_mechanism(
            standard_deviation=float(sigma), sensitivity=float(sens[0]),
            value_discretization_interval=value_discretization_interval)
    else:
        pld = pld_lib.from_mixture_gaussian_mechanism(
            standard_deviation=float(sigma), sensitivities=sens.tolist(), sampling_probs=(probs / probs.sum()).tolist(),
            value_discretization_interval=value_discretization_interval)
    if compositions > 1:
        pld = pld.self_compose(int(compositions))
    # e^eps p + delta(eps) is minimised where P(privacy loss > eps) ~ p; scan a wide grid, then refine locally.
    eps_grid = np.linspace(-1.0, 60.0, 1221)
    vals = np.exp(eps_grid) * p + np.asarray(pld.get_delta_for_epsilon(eps_grid), dtype=np.float64)
    i = int(np.argmin(vals))
    lo, hi = eps_grid[max(i - 1, 0)], eps_grid[min(i + 1, eps_grid.size - 1)]
    fine = np.linspace(lo, hi, 201)
    fine_vals = np.exp(fine) * p + np.asarray(pld.get_delta_for_epsilon(fine), dtype=np.float64)
    return float(min(1.0, min(vals[i], fine_vals.min()) + dropped_mass))


def secret_blow_up(sigma: float, rho_holders: ArrayLike, p: float, rounds: int,
                   value_discretization_interval: float = 1e-2,
                   holder_shift: float = SECPE_HOLDER_SHIFT) -> float:
    """Blow-up bound for one secret whose holders are sampled with probabilities ``rho_holders``.

    One round is the mixture sum_k P(S = k) N(holder_shift * k, sigma^2) against N(0, sigma^2), composed
    ``rounds`` times. ``holder_shift`` is the joint L2 shift of one sampled holder in noise units: sqrt(2) for
    SecPE's (sizes, centres) pair drawn from one Bernoulli sample; 1 for a single released part."""
    if not holder_shift > 0:
        raise ConfigError(f"holder_shift must be > 0, got {holder_shift}")
    support, probs, dropped = poisson_binomial_pmf(rho_holders)
    return mixture_blow_up(sigma, holder_shift * support, probs, p, rounds, value_discretization_interval, dropped)


def secpe_dp_epsilon(sigma: float, delta: float, rounds: int, value_discretization_interval: float = 1e-3) -> float:
    """Per-document DP epsilon of T SecPE rounds if rho and sigma are taken as fixed: one document moves the
    normalised (sizes, centres) vector of its round by at most sqrt(2), so each round is a Gaussian mechanism with
    noise multiplier sigma / sqrt(2) (sampling amplification is not claimed: rho may be 1)."""
    return augpe_epsilon(float(sigma) / SECPE_HOLDER_SHIFT, delta, rounds, value_discretization_interval)


@dataclass(frozen=True)
class SecretNoiseCalibration:
    sigma: float
    binding_secret: int          # index of the secret that needed the largest sigma (-1 when none binds)
    blow_ups: np.ndarray         # B(p_j) at the chosen sigma, per secret
    rounds: int                  # T: the joint (sizes, centres) mechanism is composed T times
    holder_shift: float          # joint L2 shift of one sampled holder, in noise units


def calibrate_secret_sigma(rho_by_secret: Sequence[ArrayLike], p: Sequence[float] | float,
                           r: Sequence[float] | float, rounds: int,
                           value_discretization_interval: float = 1e-2, sigma_max: float = 1e4,
                           rel_tol: float = 1e-3,
                           holder_shift: float = SECPE_HOLDER_SHIFT) -> SecretNoiseCalibration:
    """Algorithm 1 of SecPE, line 6: sigma_j = min{sigma : B_j(p_j) <= r_j}, sigma = max_j sigma_j, where B_j is
    the blow-up of the round's joint (sizes, centres) mechanism composed ``rounds`` times (``secret_blow_up``).

    Secrets with identical holder-probability multisets share one calibration. The secret with the largest
    expected sensitivity is calibrated first; every other secret is then only checked at the current sigma and
    re-calibrated (raising sigma) if it violates its bound, so most secrets cost one PLD build.
    """
    m = len(rho_by_secret)
    p_arr = np.broadcast_to(np.asarray(p, dtype=np.float64), (m,))
    r_arr = np.broadcast_to(np.asarray(r, dtype=np.float64), (m,))
    if m == 0:
        return SecretNoiseCalibration(0.0, -1, np.zeros(0), int(rounds), float(holder_shift))
    for pj, rj in zip(p_arr, r_arr):
        gdp_mu_for_secret(float(pj), float(rj))  # validates
    keys = [tuple(np.round(np.sort(np.asarray(rh, dtype=np.float64))[::-1], 12)) for rh in rho_by_secret]
    groups: dict[tuple, list[int]] = {}
    for j, k in enumerate(keys):
        groups.setdefault((k, float(p_arr[j]), float(r_arr[j])), []).append(j)
    order = sorted(groups, key=lambda g: -sum(g[0]))

    def blow(sig: float, g) -> float:
        return secret_blow_up(sig, g[0], g[1], rounds, value_discretization_interval, holder_shift)

    def satisfied(sig: float, g) -> bool:
        return g[2] >= 1.0 or blow(sig, g) <= g[2]

    sigma = 0.0
    binding = -1
    for g in order:
        if g[2] >= 1.0 or sum(g[0]) == 0.0:
            continue
        if sigma > 0 and satisfied(sigma, g):
            continue
        lo = sigma if sigma > 0 else 1e-3
        hi = max(2.0 * lo, 1.0)
        while not satisfied(hi, g):
            lo, hi = hi, hi * 2.0
            if hi > sigma_max:
                raise ConfigError(f"no noise level up to {sigma_max} meets the secret budget (r={g[2]}, p={g[1]})")
        while hi - lo > rel_tol * hi:
            mid = 0.5 * (lo + hi)
            if satisfied(mid, g):
                hi = mid
            else:
                lo = mid
        sigma = hi
        binding = groups[g][0]
    blow_ups = np.zeros(m)
    if sigma > 0:
        for g in order:
            b = blow(sigma, g)
            for j in groups[g]:
                blow_ups[j] = b
    else:
        for g in order:
            for j in groups[g]:
                blow_ups[j] = g[1]
    return SecretNoiseCalibration(float(sigma), int(binding), blow_ups, int(rounds), float(holder_shift))
