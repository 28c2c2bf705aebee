"""The noise module: each mechanism's noise has the stated distribution, and only the opt-in source repeats."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from privseed.tasks.errors import ConfigError
from privseed.tasks.mechanisms import (
                                       GaussianMechanism,
                                       LaplaceMechanism,
                                       insecure_noise,
                                       noise_source,
                                       secure_noise,
                                       )
from tests.noise_checks import FALSE_ALARM, assert_noise_is

N = 20_000


def _ks_pvalue(samples: np.ndarray, distribution) -> float:
    return stats.kstest(samples, distribution.cdf).pvalue


def test_laplace_float_noise_has_the_stated_scale_and_not_half_of_it():
    mech = LaplaceMechanism(sensitivity=10.0, epsilon=2.0)
    exact = np.linspace(-3.0, 7.0, N)
    noise = mech.release(exact) - exact
    assert mech.scale == 5.0
    assert _ks_pvalue(noise, mech.noise_distribution()) > FALSE_ALARM
    # the same samples refute half the scale (the bug "eps instead of eps/K") and twice it: the test has power
    assert_noise_is(noise, "laplace", mech.scale)


def test_discrete_laplace_on_counts_matches_its_pmf():
    mech = LaplaceMechanism(sensitivity=4, epsilon=1.0)
    exact = np.arange(N, dtype=np.int64) % 50
    released = mech.release(exact)
    assert released.dtype == np.int64
    noise = released - exact
    assert mech.noise_distribution(discrete=True).pmf(3) == pytest.approx(stats.dlaplace(1 / mech.scale).pmf(3))
    assert_noise_is(noise, "discrete-laplace", 4.0)


def test_gaussian_noise_has_sigma_and_reports_rho():
    mech = GaussianMechanism(sensitivity=1.0, sigma=3.0, epsilon=1.0, delta=1e-5)
    noise = mech.release(np.zeros(N))
    assert _ks_pvalue(noise, mech.noise_distribution()) > FALSE_ALARM
    assert_noise_is(noise, "gaussian", 3.0)
    assert mech.rho == pytest.approx(1.0 / 18.0)
    described = mech.describe()
    assert described["secure"] is True and described["noise_source"] == "opendp"


def test_secure_noise_never_repeats_and_insecure_noise_always_does():
    exact = np.zeros(100)
    mech = LaplaceMechanism(sensitivity=1.0, epsilon=1.0)
    assert not np.array_equal(mech.release(exact), mech.release(exact))
    insecure = insecure_noise(0, "vocabulary")
    assert np.array_equal(mech.release(exact, insecure), mech.release(exact, insecure))
    assert mech.describe(insecure)["secure"] is False
    assert noise_source(None, "x") is secure_noise()
    assert noise_source(7, "x").secure is False


def test_secure_bernoulli_has_the_requested_rate():
    draws = secure_noise().bernoulli(np.full(N, 0.25))
    assert stats.binomtest(int(draws.sum()), N, 0.25).pvalue > FALSE_ALARM
    with pytest.raises(ValueError):
        secure_noise().bernoulli(np.array([1.5]))


@pytest.mark.parametrize("kwargs", [dict(sensitivity=0.0, epsilon=1.0), dict(sensitivity=1.0, epsilon=0.0),
                                    dict(sensitivity=1.0, epsilon=float("inf")), dict(sensitivity=1.0, epsilon=-1)])
def test_laplace_refuses_invalid_parameters(kwargs):
    with pytest.raises(ConfigError):
        LaplaceMechanism(**kwargs)


def test_non_finite_input_is_refused():
    with pytest.raises(ValueError, match="NaN or infinite"):
        LaplaceMechanism(sensitivity=1.0, epsilon=1.0).release(np.array([np.nan, 1.0]))


def test_each_kind_calibrates_on_its_own_norm_and_composes_by_its_own_rule():
    from privseed.tasks.kde import gaussian_noise_multiplier
    from privseed.tasks.mechanisms import GAUSSIAN, LAPLACE, Sensitivity, mechanism_kind

    counts = Sensitivity.of_counts(9)  # a document adds 1 to at most 9 coordinates: L1 9, L2 3
    laplace = mechanism_kind("laplace").calibrated(counts, 2.0)
    assert laplace.kind is LAPLACE and laplace.scale == pytest.approx(4.5)
    gaussian = mechanism_kind("gaussian").calibrated(counts, 2.0, 1e-5)
    assert gaussian.kind is GAUSSIAN and gaussian.sensitivity == pytest.approx(3.0)
    assert gaussian.sigma == pytest.approx(3.0 * gaussian_noise_multiplier(2.0, 1e-5))
    assert LAPLACE.compose(0.5, 0.0, 3) == (1.5, 0.0)
    assert GAUSSIAN.compose(4.0, 1e-5, 10) == (4.0, 1e-5)  # sigma was calibrated for the whole schedule
    # A unit-L2 contribution has no bounded L1 norm: Laplace refuses it, Gaussian calibrates on L2 = 1.
    with pytest.raises(ConfigError, match="no bounded L1"):
        LAPLACE.calibrated(Sensitivity(l2=1.0), 1.0)
    assert GAUSSIAN.calibrated(Sensitivity(l2=1.0), 1.0, 1e-5).sensitivity == 1.0
    with pytest.raises(ConfigError, match="choose one of laplace, gaussian"):
        mechanism_kind("exponential")
    for kind in (LAPLACE, GAUSSIAN):
        assert {"mechanism", "input_metric", "output_measure", "composition"} <= set(kind.describe())


def test_noise_tails_and_floors_come_from_the_mechanism():
    from privseed.tasks.histogram_seeds import noise_floor

    laplace = LaplaceMechanism(sensitivity=2.0, epsilon=1.0)
    assert noise_floor(laplace, 1000, 1.0) == pytest.approx(2.0 * np.log(1000 / 2))
    assert laplace.noise_tail(np.array([3.0]), discrete=True)[0] == pytest.approx(stats.dlaplace(0.5).sf(2))
    gaussian = GaussianMechanism(sensitivity=1.0, sigma=2.0, epsilon=1.0, delta=1e-5)
    assert noise_floor(gaussian, 1000, 1.0) == pytest.approx(2.0 * stats.norm.isf(1e-3))
    assert gaussian.noise_tail(np.array([2.0]))[0] == pytest.approx(stats.norm.sf(1.0))


def test_the_thresholded_histogram_noises_only_occurring_terms_and_meets_opendps_map():
    import opendp.prelude as dp

    from privseed.tasks.mechanisms import LAPLACE_THRESHOLD, Sensitivity

    mechanism = LAPLACE_THRESHOLD.calibrated(Sensitivity.of_counts(10), 1.0, 1e-6)
    assert mechanism.scale == pytest.approx(10.0) and mechanism.delta <= 1e-6 and mechanism.epsilon == 1.0
    # OpenDP's own map of the same measurement: the threshold is the smallest integer that meets delta
    dp.enable_features("contrib")
    domain = dp.map_domain(dp.atom_domain(T=int), dp.atom_domain(T=int))
    for threshold, meets in ((mechanism.threshold, True), (mechanism.threshold - 1, False)):
        measurement = dp.m.make_laplace_threshold(domain, dp.l01inf_distance(dp.absolute_distance(T=int)),
                                                  scale=10.0, threshold=threshold)
        assert (measurement.map((10, 10, 1))[1] <= 1e-6) is meets
    exact = np.zeros(200_000, dtype=np.int64)
    exact[:3] = [10_000, 5_000, 1]
    released = mechanism.release(exact, secure_noise())
    assert released.dtype == np.float64 and set(np.flatnonzero(released)) == {0, 1}  # zero counts never noised
    assert abs(released[0] - 10_000) < 300 and released[2] == 0.0  # 1 is far below the threshold
    noise = np.concatenate([mechanism.release(np.full(2000, 10_000, dtype=np.int64), secure_noise()) - 10_000
                            for _ in range(2)])
    assert_noise_is(noise, "discrete-laplace", 10.0)
    assert LAPLACE_THRESHOLD.compose(1.0, 1e-6, 3) == (3.0, 3e-6)
    with pytest.raises(ConfigError, match="declared delta"):
        LAPLACE_THRESHOLD.calibrated(Sensitivity.of_counts(10), 1.0, 0.0)
    with pytest.raises(ConfigError, match="L0, L1 and Linf"):
        LAPLACE_THRESHOLD.calibrated(Sensitivity(l2=1.0), 1.0, 1e-6)
