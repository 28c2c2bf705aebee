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

Nothing here knows about privseed's stages: a trial is any callable ``trial(with_canary) -> {statistic: value}``
(tasks/audit_trials.py runs the flows' own stage functions in it). The module is pure apart from the progress callback.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
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

Trial = Callable[[bool], Mapping[str, float]]


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

    @property
    def exceeds_claim(self) -> bool:
        """The claim is refuted: with 1 - alpha confidence the mechanism spends more than it says."""
        return self.epsilon_lower_bound > self.claimed_epsilon + 1e-9

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


def run_trials(trial: Trial, per_side: int, on_trial: Callable[[], None] | None = None
               ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``per_side`` trials on D and on D', interleaved (D, D', D, D', ...) so any drift of the machine or of a
    cache hits both sides alike. Returns ``{statistic: (values on D, values on D')}``."""
    if per_side < 1:
        raise ConfigError(f"the audit needs at least one trial per corpus, got {per_side}")
    values: dict[str, tuple[list[float], list[float]]] = {}
    for _ in range(per_side):
        for side, with_canary in enumerate((False, True)):
            for name, value in trial(with_canary).items():
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
    """Calibrate a test on fresh trials, then measure it on other fresh trials and bound epsilon from below."""
    import time

    started = time.perf_counter()
    calibration = run_trials(trial, calibration_trials, on_trial)
    test = choose_test(calibration, delta, min(alpha, CALIBRATION_ALPHA))
    evaluation = run_trials(trial, evaluation_trials, on_trial)
    without, with_canary = evaluation[test.statistic]
    tpr, fpr, bound = evaluate_test(test, without, with_canary, delta, alpha)
    return AuditRow(mechanism=mechanism, claimed_epsilon=float(claimed_epsilon), delta=float(delta),
                    test=test.statistic, threshold=test.threshold, trials=evaluation_trials,
                    calibration_trials=calibration_trials, tpr=tpr, fpr=fpr, epsilon_lower_bound=bound, alpha=alpha,
                    noise=noise, seconds=round(time.perf_counter() - started, 2))


def format_table(rows: Sequence[AuditRow]) -> str:
    """The audit as a fixed-width text table (also used in docs/privacy.md)."""
    header = ("mechanism", "claimed eps", "delta", "trials", "TPR", "FPR", "eps lower bound", "verdict", "test")
    lines = [[r.mechanism, f"{r.claimed_epsilon:.3f}", f"{r.delta:.0e}" if r.delta else "0", f"{r.trials}x2",
              f"{r.tpr:.3f}", f"{r.fpr:.3f}", f"{r.epsilon_lower_bound:.3f}", r.verdict, r.test] for r in rows]
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*header), fmt.format(*("-" * w for w in widths)),
                      *(fmt.format(*line) for line in lines)])
