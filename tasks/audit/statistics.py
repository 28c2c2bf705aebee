"""Empirical privacy audit: statistics and the trial runner (Jagielski et al. 2020; Nasr et al. 2021, 2023).

A mechanism claims (epsilon, delta)-DP under add/remove of one document. For adjacent corpora D and
D' = D + canary, every test T that looks at the release satisfies

    P[T says "canary" | D'] <= e^eps P[T says "canary" | D] + delta          (TPR <= e^eps FPR + delta)
    P[T says "no canary" | D] <= e^eps P[T says "no canary" | D'] + delta    (1 - FPR <= e^eps (1 - TPR) + delta)

so any measured (TPR, FPR) gives a lower bound on the epsilon the mechanism really has:
eps >= max(ln((TPR - delta) / FPR), ln((1 - FPR - delta) / (1 - TPR))). Rates measured on finitely many trials are
replaced by Clopper-Pearson limits: TPR by its lower limit, FPR by its upper limit (both bounds use the same two),
each one-sided at level alpha / 2, so both hold jointly with probability >= 1 - alpha (union bound) and the
reported lower bound is a 1 - alpha = 95 % confidence bound. (Also using TPR's upper and FPR's lower limit, for
the mirror-image test, would need four limits and a wider interval; the calibration picks the test's direction
instead: "statistic > t" or "statistic < t" means "canary".)

The test is a threshold on a statistic of the release ("statistic > threshold" means "canary present"). Which
statistic and which threshold are chosen on calibration trials that are never reused for the evaluation: picking
them on the evaluation trials would be a search over many tests and would void the confidence level.

A threshold test sees one number per trial, and the tails where a 2x calibration error shows are rare: at a few
hundred trials it cannot tell a Laplace mechanism of epsilon 1 from one of epsilon 2. The second check, the
**calibration check**, uses what the adversary of DP knows (every document of D, the code, the noise family the
mechanism states) to look at the whole release. In every trial, for every released block (one ledger draw), the
auditor knows the block's exact value on the trial's corpus, so ``released - exact`` is the noise that was added, on
every coordinate; and ``move = exact(D') - exact(D)``, computed by the same passes, is how far the canary moved the
block. For the mechanism families privseed uses the canary's privacy loss is then analytic:

    Laplace (continuous or discrete) of scale b on each coordinate:  eps_canary = sum ||move||_1 / b
    Gaussian of standard deviation sigma:  mu = sqrt(sum ||move||_2^2 / sigma^2), eps_canary(delta) of N(0,1), N(mu,1)

(the Gaussian's privacy profile: delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2), Balle and Wang 2018).
The scales are not taken from the ledger: they are bounded from above by exact confidence limits from the pooled
noise of every trial (Laplace: 2 sum|x| / b ~ chi2(2n); discrete Laplace: the exact distribution of sum|x|; Gaussian:
sum x^2 / sigma^2 ~ chi2(n)), so eps_canary evaluated at those limits is a confidence lower bound on the epsilon the
mechanism really spends, and the move comes from the passes, not from the stated sensitivity. A noise scale half as
large as the claim needs, or a sensitivity counted half (a pass or a mechanism that moves twice what it states), both
double eps_canary, and thousands of noise values per audit see it at any confidence. What this check assumes is the
noise family (Laplace, Gaussian), which is part of the claim; the threshold test assumes nothing and is the one that
catches noise that repeats (reproducible seeds). Each check gets half of alpha; the larger bound is reported.

One canary sees a sensitivity bug only in its own shape (a class-0 document of distinct terms cannot see a pass that
counts class 1 twice, or repeated terms once per occurrence, or a long document as several). The calibration check
therefore takes the moves of several canaries, each its own neighbour of D (``NoiseDraw.other_moves``: each class,
repeated terms, the longest document a contribution allows, a document at the sensitivity bound), and bounds epsilon
by the largest of their losses. Every one holds at the same confidence: the one event "every measured scale is below
its limit" makes all of them lower bounds at once, so the maximum needs no further share of alpha.

A thresholded release has a delta that its noise does not show: a term that one document creates is released
with a probability the claim bounds by delta, and never without that document. The **delta check** counts such
events (``TrialOutcome.delta_events``: how many of the trial's single-document items were released, of how many) and
compares a Clopper-Pearson lower limit of their frequency with the claimed delta; where a mechanism reports them,
the three checks get a third of alpha each.

Nothing here knows about privseed's stages: a trial is any callable ``trial(with_canary)`` returning
``{statistic: value}`` or a ``TrialOutcome`` (tasks/audit/trials.py runs the flows' own passes and stage functions in
it). The module is pure apart from the progress callback.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from privseed.tasks.errors import ConfigError

#: 1 - confidence of the reported lower bounds (95 %).
DEFAULT_ALPHA = 0.05
#: The calibration ranks tests by their bound at 99 %: among the many thresholds it tries, a tail threshold where a
#: few lucky calibration trials (say 0 false positives) make a test look best does not hold up on new trials; the
#: stricter level prefers thresholds with enough trials on both sides (simulated on Laplace noise at 250 + 500
#: trials: no run bounded at 0, against 0.7 % at 95 %).
CALIBRATION_ALPHA = 0.01

#: Noise values of one block kept for the calibration check (the first ones, in trial order: a fixed subset, so the
#: limits stay exact; 20,000 bound a scale to within about 3 % at confidence 1 - 1e-5).
MAX_NOISE_VALUES = 20_000
NOISE_FAMILIES = ("laplace", "gaussian")


@dataclass(frozen=True)
class NoiseDraw:
    """One released block of one trial, as the adversary who knows D sees it.

    ``family``: the mechanism family the ledger recorded ("laplace" or "gaussian"); ``residual``: released minus the
    exact value of this trial's corpus (the noise added, every coordinate); ``move``: exact(D') - exact(D), the
    canary's move of the block through the same passes; ``claimed_scale``: the scale the ledger recorded (reported
    next to the measured one, never used in the bound); ``other_moves``: exact(D + c) - exact(D) for the audit's
    other canaries c."""

    family: str
    residual: np.ndarray = field(repr=False)
    move: np.ndarray = field(repr=False)
    claimed_scale: float
    #: the block's move by each of the audit's other canaries (each its own neighbour of D), by the canary's name
    other_moves: Mapping[str, np.ndarray] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class TrialOutcome:
    """What a trial reports: the threshold tests' statistics, for the calibration check its released blocks, and
    for the delta check its delta events: per group, (items released, items), where an item is an event that has
    probability 0 without one document (e.g. "one of the terms only this document holds is released"), so that its
    probability with the document is at most the claimed delta."""

    statistics: Mapping[str, float]
    draws: Mapping[str, NoiseDraw] = field(default_factory=dict)
    delta_events: Mapping[str, tuple[int, int]] = field(default_factory=dict)


Trial = Callable[[bool], "Mapping[str, float] | TrialOutcome"]


def clopper_pearson(successes: int, trials: int, alpha: float = DEFAULT_ALPHA) -> tuple[float, float]:
    """The two-sided 1 - alpha Clopper-Pearson interval of a binomial proportion (each side alpha / 2).

    Exact (conservative) for every n: lower = Beta(alpha/2; k, n - k + 1), upper = Beta(1 - alpha/2; k + 1, n - k),
    with 0 and 1 at the ends (k = 0, k = n)."""
    from scipy.stats import beta

    if trials < 1 or not 0 <= successes <= trials:
        raise ConfigError(f"Clopper-Pearson needs 0 <= successes <= trials and trials >= 1 (got {successes}/{trials})")
    if not 0 < alpha < 1:
        raise ConfigError(f"alpha must lie in (0, 1), got {alpha}")
    lower = 0.0 if successes == 0 else float(beta.ppf(alpha / 2, successes, trials - successes + 1))
    upper = 1.0 if successes == trials else float(beta.ppf(1 - alpha / 2, successes + 1, trials - successes))
    return lower, upper


def epsilon_lower_bound(true_positives: int, positives: int, false_positives: int, negatives: int,
                        delta: float = 0.0, alpha: float = DEFAULT_ALPHA) -> float:
    """The 1 - alpha confidence lower bound on epsilon implied by a test's counts (0 when it implies nothing).

    ``positives`` trials ran on D' (with the canary), ``negatives`` on D; a positive is a trial where the test said
    "canary". Both inequalities of (eps, delta)-DP are used (the test and its complement) and the larger bound wins.
    """
    if not 0 <= delta < 1:
        raise ConfigError(f"delta must lie in [0, 1), got {delta}")
    tpr_lo, _ = clopper_pearson(true_positives, positives, alpha)
    _, fpr_hi = clopper_pearson(false_positives, negatives, alpha)
    # The test's region and its complement, with the same two limits: TPR >= tpr_lo and FPR <= fpr_hi.
    pairs = [(tpr_lo, fpr_hi), (1 - fpr_hi, 1 - tpr_lo)]
    return max([0.0] + [math.log((hit - delta) / miss) for hit, miss in pairs if hit - delta > 0 and miss > 0])


# ---------------------------------------------------------------------------------------------------------
# The calibration check: the canary's analytic privacy loss at confidence limits of the measured noise scales
# ---------------------------------------------------------------------------------------------------------
def _discrete_laplace_sum_cdf(total: int, n: int, a: float) -> float:
    """P(sum of n |X_i| <= total) for X_i discrete Laplace with P(k) proportional to a^|k|: |X| is 0 with
    probability (1 - a) / (1 + a), else 1 + Geometric(1 - a); K nonzero values sum to K + NegBinomial(K, 1 - a)."""
    from scipy.stats import binom, nbinom

    k = np.arange(0, min(n, total) + 1)
    weights = binom.pmf(k, n, 2 * a / (1 + a))
    tails = np.where(k == 0, 1.0, nbinom.cdf(total - k, np.maximum(k, 1), 1 - a))
    return float(np.sum(weights * tails))


def scale_upper_limit(family: str, residuals: ArrayLike, alpha: float) -> float:
    """A 1 - alpha upper confidence limit of the noise scale from i.i.d. noise values (mean 0 known).

    "laplace": Laplace scale b (2 sum|x| / b is chi2(2n)); integer values are taken as discrete Laplace, P(k)
    proportional to exp(-|k| / b) (OpenDP's), and get the exact limit of sum|x|. "gaussian": sigma
    (sum x^2 / sigma^2 is chi2(n))."""
    from scipy.optimize import brentq
    from scipy.stats import chi2

    x = np.asarray(residuals, dtype=np.float64).ravel()
    if x.size == 0 or not np.all(np.isfinite(x)):
        raise ConfigError("the calibration check needs finite noise values")
    if not 0 < alpha < 1:
        raise ConfigError(f"alpha must lie in (0, 1), got {alpha}")
    n = x.size
    if family == "gaussian":
        return math.sqrt(float(np.sum(x * x)) / float(chi2.ppf(alpha, n)))
    if family != "laplace":
        raise ConfigError(f"unknown noise family {family!r}; expected one of {NOISE_FAMILIES}")
    total = float(np.sum(np.abs(x)))
    if not np.all(x == np.round(x)):
        return 2.0 * total / float(chi2.ppf(alpha, 2 * n))
    # Discrete: P_a(sum <= observed) falls from 1 to 0 as a = exp(-1/b) grows; the limit is where it is alpha.
    t = int(round(total))
    if _discrete_laplace_sum_cdf(t, n, 1 - 1e-12) >= alpha:
        return math.inf
    a = brentq(lambda a: _discrete_laplace_sum_cdf(t, n, a) - alpha, 1e-12, 1 - 1e-12, xtol=1e-12)
    return -1.0 / math.log(a)


#: For a thresholded release (counts under a threshold are released as 0), the probability per value that a count
#: the calibration check takes as released whole was in fact cut: at most 20,000 values per group, so at most 2e-8
#: per audit, next to its level of 1e-5 or more.
TRUNCATION_PROBABILITY = 1e-12


def untruncated_floor(threshold: float, scale: float, probability: float = TRUNCATION_PROBABILITY) -> int:
    """The exact count from which a release "noisy count if noisy >= threshold, else 0" (Laplace or discrete
    Laplace noise of ``scale``) cuts a count with probability at most ``probability``: there ``released - exact``
    is the noise, as the calibration check needs.

    An exact count c >= threshold + m is cut only when its noise is < -m (discrete: <= -(m + 1), probability
    a^(m + 1) / (1 + a) with a = exp(-1 / scale); continuous: exp(-m / scale) / 2), both at most exp(-m / scale),
    which is at most ``probability`` for m = ceil(scale ln(1 / probability))."""
    if not (scale > 0 and 0 < probability < 1):
        raise ConfigError(f"the floor needs a scale > 0 and a probability in (0, 1), got {scale}, {probability}")
    return int(math.ceil(threshold)) + int(math.ceil(scale * math.log(1 / probability)))


def gaussian_delta(epsilon: float, mu: float) -> float:
    """The privacy profile of N(0, 1) against N(mu, 1): the smallest delta with which they are (epsilon, delta)
    indistinguishable (Balle and Wang 2018, Theorem 8)."""
    from scipy.stats import norm

    if mu <= 0:
        return 0.0
    return float(norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon + norm.logcdf(-epsilon / mu - mu / 2)))


def gaussian_epsilon(mu: float, delta: float) -> float:
    """The epsilon of N(0, 1) against N(mu, 1) at ``delta`` (``gaussian_delta`` inverted; inf when delta = 0)."""
    from scipy.optimize import brentq

    if mu <= 0 or gaussian_delta(0.0, mu) <= delta:
        return 0.0
    if delta <= 0:
        return math.inf
    high = 1.0
    while gaussian_delta(high, mu) > delta:
        high *= 2
    return float(brentq(lambda e: gaussian_delta(e, mu) - delta, 0.0, high, xtol=1e-10))


#: The name of the audit's own canary (D' = D + canary) among the canaries of the calibration check.
CANARY = "canary"


@dataclass
class PooledNoise:
    """The noise of one group of blocks drawn with one scale (the same ledger name up to class, sketch and round
    numbers), pooled over every trial: the values (up to ``MAX_NOISE_VALUES``) and, per canary, its smallest move of
    the group in one trial (L1 for Laplace, L2 for Gaussian: deterministic, the minimum only guards against a
    trial whose passes moved less). ``move`` is the audit's own canary's."""

    family: str
    claimed_scale: float
    values: list[np.ndarray] = field(default_factory=list)
    kept: int = 0
    seen: int = 0
    moves: dict[str, float] = field(default_factory=dict)

    @property
    def move(self) -> float:
        return self.moves.get(CANARY, math.inf)

    def _norm(self, moves: Sequence[np.ndarray]) -> float:
        moves = [np.asarray(m, dtype=np.float64) for m in moves]
        return (sum(float(np.abs(m).sum()) for m in moves) if self.family == "laplace"
                else math.sqrt(sum(float((m * m).sum()) for m in moves)))

    def add(self, draws: Sequence[NoiseDraw]) -> None:
        names = [CANARY] + sorted({name for d in draws for name in d.other_moves})
        for name in names:
            # a canary that does not touch a block of this group moves it by 0 there
            move = self._norm([d.move if name == CANARY else d.other_moves.get(name, np.zeros(0)) for d in draws])
            self.moves[name] = min(self.moves.get(name, math.inf), move)
        for d in draws:
            self.seen += int(np.asarray(d.residual).size)
            room = MAX_NOISE_VALUES - self.kept
            if room > 0:
                values = np.asarray(d.residual, dtype=np.float64).ravel()[:room]
                self.values.append(values)
                self.kept += values.size


def noise_group(name: str) -> str:
    """The group a released block's noise is pooled in: its ledger name with every number replaced (the per-class,
    per-sketch and per-round draws of one stage share one scale)."""
    return re.sub(r"\d+", "#", name)


def pool_draws(outcomes: Sequence[Mapping[str, NoiseDraw]]) -> dict[str, PooledNoise]:
    """Every trial's blocks, pooled per noise group."""
    pooled: dict[str, PooledNoise] = {}
    for draws in outcomes:
        groups: dict[str, list[NoiseDraw]] = {}
        for name, draw in draws.items():
            groups.setdefault(noise_group(name), []).append(draw)
        for group, members in groups.items():
            if group not in pooled:
                pooled[group] = PooledNoise(members[0].family, members[0].claimed_scale)
            if any(d.family != pooled[group].family for d in members):
                raise ConfigError(f"the blocks of {group!r} were drawn from different noise families")
            pooled[group].add(members)
    return pooled


@dataclass(frozen=True)
class CalibrationCheck:
    """The calibration check's result: the 1 - alpha lower bound on epsilon, the canary's epsilon at the scales
    the ledger recorded (what a correct mechanism spends on this canary; of the canaries, the largest), which
    canary that is, and per group the recorded scale, the upper limit of the measured one and the canaries' moves
    (``canary_move``: that canary's; ``canary_move[name]``: each one's)."""

    epsilon_lower_bound: float
    canary_epsilon: float
    groups: dict[str, dict[str, float]]
    canary: str = CANARY


def calibration_check(pooled: Mapping[str, PooledNoise], delta: float, alpha: float) -> CalibrationCheck:
    """Each canary's privacy loss, analytic for its mechanism family, with every scale at its upper confidence
    limit (alpha split evenly over the groups, so all limits hold together with probability >= 1 - alpha), and
    the largest over the canaries: every canary is a neighbour of D, and on that one event each loss is a lower
    bound on epsilon. Laplace groups compose by adding their losses, Gaussian groups by adding mu^2; a release
    holding both is bounded by the larger of the two (dropping blocks is post-processing)."""
    if not pooled:
        return CalibrationCheck(0.0, 0.0, {})
    each = alpha / len(pooled)
    canaries = list(dict.fromkeys(name for group in pooled.values() for name in group.moves))
    limits = {}
    for name, group in pooled.items():
        limits[name] = scale_upper_limit(group.family, np.concatenate(group.values), each)

    def loss(canary: str, scales: Mapping[str, float]) -> float:
        laplace, mu2 = 0.0, 0.0
        for name, group in pooled.items():
            move = group.moves.get(canary, 0.0)
            if group.family == "laplace":
                laplace += move / scales[name]
            else:
                mu2 += (move / scales[name]) ** 2
        return max(laplace, gaussian_epsilon(math.sqrt(mu2), delta) if mu2 > 0 else 0.0)

    claimed = {name: group.claimed_scale for name, group in pooled.items()}
    at_limits = {canary: loss(canary, limits) for canary in canaries}
    at_claimed = {canary: loss(canary, claimed) for canary in canaries}
    # the canary a correct mechanism spends most on (ties, up to rounding: the audit's own canary, listed first)
    most = max(at_claimed.values())
    worst = next(c for c in canaries if at_claimed[c] >= most * (1 - 1e-9))
    groups = {}
    for name, group in pooled.items():
        values = np.concatenate(group.values)
        groups[name] = {"claimed_scale": group.claimed_scale, "scale_upper_limit": limits[name],
                        "canary_move": group.moves.get(worst, 0.0),
                        **{f"canary_move[{c}]": group.moves.get(c, 0.0) for c in canaries},
                        "noise_values": float(group.kept), "noise_values_seen": float(group.seen),
                        "gaussian": float(group.family == "gaussian"),
                        "discrete": float(group.family == "laplace" and bool(np.all(values == np.round(values))))}
    return CalibrationCheck(max(at_limits.values()), at_claimed[worst], groups, worst)


@dataclass(frozen=True)
class DeltaCheck:
    """The delta check's result: the 1 - alpha lower bound on delta (the largest group's), and per group the
    events, the items and the group's lower limit."""

    delta_lower_bound: float
    groups: dict[str, dict[str, float]]


def delta_check(events: Mapping[str, tuple[int, int]], alpha: float) -> DeltaCheck:
    """A lower bound on delta from delta events: per group, ``events[group] = (k, n)``, k of n items happened, each
    item an event E with P(E | D without its document) = 0, so (epsilon, delta)-DP gives P(E | D) <= delta. Items
    are independent with one probability (each its own coordinates of independent noise, the same count), so k is
    binomial and its one-sided Clopper-Pearson lower limit at alpha / (number of groups) bounds delta from below;
    the largest over the groups holds with probability >= 1 - alpha."""
    if not events:
        return DeltaCheck(0.0, {})
    each = alpha / len(events)
    groups = {}
    for name, (k, n) in events.items():
        lower = clopper_pearson(int(k), int(n), 2 * each)[0]  # two-sided at 2 * each: one-sided at each
        groups[name] = {"events": float(k), "items": float(n), "frequency": k / n, "delta_lower_limit": lower}
    return DeltaCheck(max(g["delta_lower_limit"] for g in groups.values()), groups)


def flag_probability(family: str, discrete: bool, values: int, move: float, true_scale: float, claim: float,
                     delta: float, alpha: float) -> float:
    """The probability that one group of the calibration check, alone, bounds epsilon above ``claim``: ``values``
    noise values of ``true_scale`` (what the mechanism really adds), the canary's ``move``, the group's share
    ``alpha`` of the level. Exact for each family, because the limit grows with the sufficient statistic (sum|x|,
    sum x^2): the check flags when that statistic is below a threshold whose probability is a Gamma, discrete
    Laplace or chi2 distribution function. The power of a whole audit is at least the largest of its groups'."""
    from scipy.optimize import brentq
    from scipy.stats import chi2, gamma

    if move <= 0:
        return 0.0
    if family == "gaussian":
        # the check flags when move / sigma_up > mu*, the mu whose epsilon at delta is the claim
        high = 1.0
        while gaussian_epsilon(high, delta) <= claim:
            high *= 2
        mu_star = brentq(lambda mu: gaussian_epsilon(mu, delta) - claim, 1e-9, high, xtol=1e-12)
        q = float(chi2.ppf(alpha, values))
        return float(chi2.cdf(q * (move / mu_star) ** 2 / true_scale ** 2, values))
    limit = move / claim  # the check flags when the scale's upper limit is below this
    if not discrete:
        q = float(chi2.ppf(alpha, 2 * values))
        return float(gamma.cdf(limit * q / 2, values, scale=true_scale))
    # discrete: flags when P_limit(sum <= T) < alpha; the largest such T, by bisection (P grows with T)
    a_limit = math.exp(-1 / limit)
    low, high_t = -1, 1
    while _discrete_laplace_sum_cdf(high_t, values, a_limit) < alpha:
        low, high_t = high_t, 2 * high_t
    while high_t - low > 1:
        mid = (low + high_t) // 2
        if _discrete_laplace_sum_cdf(mid, values, a_limit) < alpha:
            low = mid
        else:
            high_t = mid
    return 0.0 if low < 0 else _discrete_laplace_sum_cdf(low, values, math.exp(-1 / true_scale))


def delta_flag_probability(items: int, true_delta: float, claimed_delta: float, alpha: float) -> float:
    """The probability that one group of the delta check, alone, bounds delta above ``claimed_delta``: ``items``
    items, each an event of probability ``true_delta`` (what the mechanism really has), the group's share ``alpha``
    of the level. Exact: the lower limit grows with the count k, so the check flags when k reaches the smallest k*
    whose limit exceeds the claim, and P(flag) = P(Binomial(items, true_delta) >= k*)."""
    from scipy.stats import binom

    if items < 1:
        return 0.0
    low, high = 0, items + 1  # lower limit of k = low is <= claim; of k = high (a sentinel) > claim
    if clopper_pearson(items, items, 2 * alpha)[0] <= claimed_delta:
        return 0.0
    while high - low > 1:
        mid = (low + high) // 2
        if clopper_pearson(mid, items, 2 * alpha)[0] > claimed_delta:
            high = mid
        else:
            low = mid
    return float(binom.sf(high - 1, items, true_delta))


@dataclass(frozen=True)
class ThresholdTest:
    """"statistic > threshold" (direction +1) or "statistic < threshold" (direction -1) means "the canary is in
    the corpus"."""

    statistic: str
    threshold: float
    direction: int = 1

    def positives(self, values: np.ndarray) -> int:
        values = np.asarray(values, dtype=np.float64)
        return int(np.count_nonzero(values > self.threshold if self.direction > 0 else values < self.threshold))


def _candidate_thresholds(without: np.ndarray, with_canary: np.ndarray) -> np.ndarray:
    """Every distinct split of the pooled values: midpoints between neighbours, and one below/above all."""
    pooled = np.unique(np.concatenate([without, with_canary]))
    pooled = pooled[np.isfinite(pooled)] if np.isfinite(pooled).any() else np.zeros(1)
    mids = (pooled[:-1] + pooled[1:]) / 2.0
    return np.concatenate([[pooled[0] - 1.0], mids, [pooled[-1] + 1.0]])


def _bounds_for_thresholds(thresholds: np.ndarray, without: np.ndarray, with_canary: np.ndarray, delta: float,
                           alpha: float) -> np.ndarray:
    without = np.sort(without)
    with_canary = np.sort(with_canary)
    fp = without.size - np.searchsorted(without, thresholds, side="right")
    tp = with_canary.size - np.searchsorted(with_canary, thresholds, side="right")
    return np.array([epsilon_lower_bound(int(t), with_canary.size, int(f), without.size, delta, alpha)
                     for t, f in zip(tp, fp)])


def choose_test(calibration: Mapping[str, tuple[ArrayLike, ArrayLike]], delta: float = 0.0,
                alpha: float = DEFAULT_ALPHA) -> ThresholdTest:
    """The (statistic, threshold) with the largest lower bound on the calibration trials.

    ``calibration[statistic] = (values without the canary, values with it)``. Ties go to the first statistic
    listed and, within one, to the middle of the best thresholds (a threshold at the edge of a gap of equal bounds
    generalizes worse to new trials)."""
    if not calibration:
        raise ConfigError("the audit needs at least one test statistic")
    best: tuple[float, ThresholdTest] | None = None
    for statistic, (without, with_canary) in calibration.items():
        without = np.asarray(without, dtype=np.float64)
        with_canary = np.asarray(with_canary, dtype=np.float64)
        if without.size == 0 or with_canary.size == 0:
            raise ConfigError("calibration needs trials on both corpora")
        for direction in (1, -1):  # "statistic < t" is "-statistic > -t"
            thresholds = _candidate_thresholds(direction * without, direction * with_canary)
            bounds = _bounds_for_thresholds(thresholds, direction * without, direction * with_canary, delta, alpha)
            top = np.flatnonzero(bounds >= bounds.max() - 1e-12)
            choice = ThresholdTest(statistic, direction * float(thresholds[top[len(top) // 2]]), direction)
            if best is None or bounds.max() > best[0] + 1e-12:
                best = (float(bounds.max()), choice)
    assert best is not None  # the calibration is not empty, and the first candidate is always taken
    return best[1]


@dataclass(frozen=True)
class AuditRow:
    """One mechanism's audit: what the code claims and what the trials prove it at least spends."""

    mechanism: str
    claimed_epsilon: float
    delta: float
    test: str
    threshold: float
    trials: int  # evaluation trials per corpus (D and D' each); calibration trials come on top
    calibration_trials: int
    tpr: float
    fpr: float
    epsilon_lower_bound: float
    alpha: float
    noise: str  # what drew the noise in these trials: "secure", "insecure-reproducible", "seeded (main)"
    seconds: float = 0.0
    # The two checks behind epsilon_lower_bound (the larger of them): the threshold test's bound and the
    # calibration check's; the canary's epsilon at the recorded scales (what a correct mechanism spends on it);
    # the calibration check's groups (recorded scale, upper limit of the measured scale, canary's move).
    threshold_bound: float = 0.0
    calibration_bound: float = 0.0
    canary_epsilon: float = 0.0
    noise_groups: dict[str, dict[str, float]] = field(default_factory=dict)
    # The canary behind canary_epsilon (the audit's own, or one of its other shapes); the delta check's lower bound
    # on delta and its groups (0 and {} for a mechanism that reports no delta events).
    canary: str = CANARY
    delta_lower_bound: float = 0.0
    delta_groups: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def exceeds_claim(self) -> bool:
        """The claim is refuted: with 1 - alpha confidence the mechanism spends more epsilon, or more delta, than it
        says."""
        return (self.epsilon_lower_bound > self.claimed_epsilon + 1e-9
                or self.delta_lower_bound > self.delta * (1 + 1e-9))

    @property
    def verdict(self) -> str:
        return "VIOLATED" if self.exceeds_claim else "consistent"

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["verdict"] = self.verdict
        out["exceeds_claim"] = self.exceeds_claim
        return out


def evaluate_test(test: ThresholdTest, without: ArrayLike, with_canary: ArrayLike, delta: float,
                  alpha: float = DEFAULT_ALPHA) -> tuple[float, float, float]:
    """(TPR, FPR, epsilon lower bound) of a fixed test on evaluation trials."""
    without = np.asarray(without, dtype=np.float64)
    with_canary = np.asarray(with_canary, dtype=np.float64)
    fp, tp = test.positives(without), test.positives(with_canary)
    bound = epsilon_lower_bound(tp, with_canary.size, fp, without.size, delta, alpha)
    return tp / with_canary.size, fp / without.size, bound


def run_trials(trial: Trial, per_side: int, on_trial: Callable[[], None] | None = None,
               draws: list[Mapping[str, NoiseDraw]] | None = None,
               delta_events: list[Mapping[str, tuple[int, int]]] | None = None
               ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``per_side`` trials on D and on D', interleaved (D, D', D, D', ...) so any drift of the machine or of a
    cache hits both sides alike. Returns ``{statistic: (values on D, values on D')}``; the released blocks and the
    delta events of trials that report them are appended to ``draws`` and ``delta_events``."""
    if per_side < 1:
        raise ConfigError(f"the audit needs at least one trial per corpus, got {per_side}")
    values: dict[str, tuple[list[float], list[float]]] = {}
    for _ in range(per_side):
        for side, with_canary in enumerate((False, True)):
            outcome = trial(with_canary)
            statistics = outcome.statistics if isinstance(outcome, TrialOutcome) else outcome
            if isinstance(outcome, TrialOutcome) and draws is not None:
                draws.append(outcome.draws)
            if isinstance(outcome, TrialOutcome) and delta_events is not None and outcome.delta_events:
                delta_events.append(outcome.delta_events)
            for name, value in statistics.items():
                values.setdefault(name, ([], []))[side].append(float(value))
            if on_trial is not None:
                on_trial()
    lengths = {len(v[0]) for v in values.values()} | {len(v[1]) for v in values.values()}
    if lengths != {per_side}:
        raise ConfigError("every trial must report the same statistics")
    return {name: (np.asarray(a), np.asarray(b)) for name, (a, b) in values.items()}


def audit(mechanism: str, trial: Trial, *, claimed_epsilon: float, delta: float, calibration_trials: int,
          evaluation_trials: int, noise: str, alpha: float = DEFAULT_ALPHA,
          on_trial: Callable[[], None] | None = None) -> AuditRow:
    """Calibrate a threshold test on fresh trials, measure it on other fresh trials, run the calibration check on
    the noise of all of them, and bound epsilon from below by the larger of the two; where the trials report delta
    events, also bound delta from below (the delta check). Each check is at confidence 1 - alpha / (number of
    checks), so the verdict's bounds hold together with confidence 1 - alpha."""
    import time

    started = time.perf_counter()
    draws: list[Mapping[str, NoiseDraw]] = []
    events: list[Mapping[str, tuple[int, int]]] = []
    calibration = run_trials(trial, calibration_trials, on_trial, draws, events)
    test = choose_test(calibration, delta, min(alpha / 2, CALIBRATION_ALPHA))
    evaluation = run_trials(trial, evaluation_trials, on_trial, draws, events)
    share = alpha / (3 if events else 2)
    without, with_canary = evaluation[test.statistic]
    tpr, fpr, threshold_bound = evaluate_test(test, without, with_canary, delta, share)
    check = calibration_check(pool_draws(draws), delta, share)
    totals: dict[str, list[int]] = {}
    for trial_events in events:
        for group, (k, n) in trial_events.items():
            total = totals.setdefault(group, [0, 0])
            total[0] += int(k)
            total[1] += int(n)
    deltas = delta_check({group: (k, n) for group, (k, n) in totals.items()}, share)
    return AuditRow(mechanism=mechanism, claimed_epsilon=float(claimed_epsilon), delta=float(delta),
                    test=test.statistic, threshold=test.threshold, trials=evaluation_trials,
                    calibration_trials=calibration_trials, tpr=tpr, fpr=fpr,
                    epsilon_lower_bound=max(threshold_bound, check.epsilon_lower_bound), alpha=alpha,
                    noise=noise, seconds=round(time.perf_counter() - started, 2), threshold_bound=threshold_bound,
                    calibration_bound=check.epsilon_lower_bound, canary_epsilon=check.canary_epsilon,
                    noise_groups=check.groups, canary=check.canary, delta_lower_bound=deltas.delta_lower_bound,
                    delta_groups=deltas.groups)


def format_table(rows: Sequence[AuditRow]) -> str:
    """The audit as a fixed-width text table (also used in docs/privacy.md)."""
    header = ("mechanism", "claimed eps", "delta", "trials", "TPR", "FPR", "test bound", "canary eps", "canary",
              "calibration bound", "eps lower bound", "delta lower bound", "verdict", "test")
    lines = [[r.mechanism, f"{r.claimed_epsilon:.3f}", f"{r.delta:.3g}" if r.delta else "0", f"{r.trials}x2",
              f"{r.tpr:.3f}", f"{r.fpr:.3f}", f"{r.threshold_bound:.3f}", f"{r.canary_epsilon:.3f}", r.canary,
              f"{r.calibration_bound:.3f}", f"{r.epsilon_lower_bound:.3f}",
              f"{r.delta_lower_bound:.3g}" if r.delta_groups else "-", r.verdict, r.test] for r in rows]
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*header), fmt.format(*("-" * w for w in widths)),
                      *(fmt.format(*line) for line in lines)])
