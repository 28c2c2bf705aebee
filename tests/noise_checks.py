"""Statistical checks on noise from the secure sampler.

Secure noise cannot be seeded, so a check on it is a hypothesis test that a correct mechanism fails by chance.
With about twenty such checks in the suite, a threshold of 1e-3 fails a correct build about once in fifty CI
runs (it did). Every check here therefore accepts at ``FALSE_ALARM`` = 1e-9, and shows its power with the scale
statistic, whose law is exact for continuous noise (Gamma for Laplace, chi-square for Gaussian) and whose
p-value under half or twice the stated scale is below 1e-30 at the sample sizes the tests use.

- ``shape_pvalue``: Kolmogorov-Smirnov against the stated law. Integer noise is jittered by U(0, 1) first, which
  makes the test exact: K + U has the continuous CDF P(K <= floor(x) - 1) + frac(x) P(K = floor(x)).
- ``scale_pvalue``: two-sided test of the mean |x| (Laplace) or mean x^2 (Gaussian) against the stated scale.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

FALSE_ALARM = 1e-9  # a correct mechanism fails one check with at most this probability


def _discrete_laplace(scale: float):
    return stats.dlaplace(1.0 / scale)


def _law(kind: str, scale: float):
    if kind == "laplace":
        return stats.laplace(scale=scale)
    if kind == "gaussian":
        return stats.norm(scale=scale)
    if kind == "discrete-laplace":
        return _discrete_laplace(scale)
    raise ValueError(kind)


def shape_pvalue(noise: np.ndarray, kind: str, scale: float) -> float:
    noise = np.asarray(noise, dtype=np.float64).ravel()
    if kind != "discrete-laplace":
        return float(stats.kstest(noise, _law(kind, scale).cdf).pvalue)
    law = _discrete_laplace(scale)
    jittered = noise + np.random.default_rng(0).random(noise.shape)  # public jitter: the check is on the noise

    def cdf(x):
        k = np.floor(x)
        return law.cdf(k - 1) + (x - k) * law.pmf(k)

    return float(stats.kstest(jittered, cdf).pvalue)


def scale_pvalue(noise: np.ndarray, kind: str, scale: float) -> float:
    noise = np.asarray(noise, dtype=np.float64).ravel()
    n = noise.size
    if kind == "laplace":  # |x| / b ~ Exp(1): the sum is Gamma(n, 1)
        total, law = float(np.abs(noise).sum() / scale), stats.gamma(n)
    elif kind == "gaussian":  # (x / sigma)^2 ~ chi2(1): the sum is chi2(n)
        total, law = float(np.sum((noise / scale) ** 2)), stats.chi2(n)
    elif kind == "discrete-laplace":
        # |K| has no closed-form sum law; its mean is a sum of n i.i.d. sub-exponential terms (n >= 1000 here),
        # so the normal approximation holds far into the tail
        q = np.exp(-1.0 / scale)
        mean = 2 * q / (1 - q * q)
        second = 2 * q * (1 + q) / ((1 - q) ** 2 * (1 + q))  # E K^2 = 2q / (1 - q)^2
        sd = np.sqrt((second - mean**2) / n)
        z = (float(np.abs(noise).mean()) - mean) / sd
        return float(2 * stats.norm.sf(abs(z)))
    else:
        raise ValueError(kind)
    return float(2 * min(law.cdf(total), law.sf(total)))


def assert_noise_is(noise: np.ndarray, kind: str, scale: float, *, wrong: tuple[float, ...] = (0.5, 2.0)) -> None:
    """The noise follows ``kind`` at ``scale``, and the same draws refute the scale times each factor in
    ``wrong`` (the bugs "eps instead of eps / K", "sensitivity counted twice"): the check can fail."""
    noise = np.asarray(noise).ravel()
    # below 400 draws, half a Gaussian scale is refuted at only about 1e-10 in the worst of 300 runs
    assert noise.size >= 400 or not wrong, "too few draws for a check with power"
    shape, fit = shape_pvalue(noise, kind, scale), scale_pvalue(noise, kind, scale)
    assert shape > FALSE_ALARM and fit > FALSE_ALARM, (kind, scale, shape, fit)
    for factor in wrong:
        refuted = scale_pvalue(noise, kind, scale * factor)
        assert refuted < FALSE_ALARM, (kind, scale, factor, refuted)
    assert scale_pvalue(np.zeros_like(noise), kind, scale) < FALSE_ALARM  # no noise at all is refuted too
