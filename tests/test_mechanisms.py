"""The noise module: each mechanism's noise has the stated distribution, and only the opt-in source repeats."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from privseed.tasks.errors import ConfigError
from privseed.tasks.dp.mechanisms import GaussianMechanism, LaplaceMechanism, insecure_noise, noise_source, secure_noise
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


def test_a_calibrated_gaussian_draws_on_a_lattice_whose_opendp_map_is_the_rho_it_records():
    """A calibrated Gaussian samples on OpenDP's lattice 2^k (3.5x faster than its default) and raises sigma by the
    sensitivity share the lattice's rounding may add: OpenDP's own map of the measurement it draws with, at the
    stated sensitivity, is never above the rho it records, which is what its sigma was calibrated for."""
    import opendp.prelude as dp

    from privseed.tasks.dp.mechanisms import GAUSSIAN, GAUSSIAN_LATTICE_SLACK, Sensitivity, gaussian_noise_multiplier

    dp.enable_features("contrib")
    for l2 in (1e-3, 1.0, 30.0):
        mech = GAUSSIAN.calibrated(Sensitivity(l2=l2, l1=l2), 4.0, 1e-6)
        assert mech.lattice_slack == GAUSSIAN_LATTICE_SLACK
        assert mech.rho == pytest.approx(1.0 / (2.0 * gaussian_noise_multiplier(4.0, 1e-6) ** 2), rel=1e-12)
        for size in (1, 1_000, 700_000, 10**8):
            k = mech.lattice(size)
            assert k is not None and 2.0 ** k * size ** 0.5 <= GAUSSIAN_LATTICE_SLACK * l2
            opendp = dp.m.make_gaussian(dp.vector_domain(dp.atom_domain(T=float, nan=False), size=size),
                                        dp.l2_distance(T=float), scale=mech.sigma, k=k)
            assert opendp.map(l2) <= mech.rho, (l2, size, k)
    # one uncalibrated (Aug-PE's noise multiplier): OpenDP's default lattice, exact
    assert GaussianMechanism(sensitivity=1.0, sigma=3.0, epsilon=1.0, delta=1e-5).lattice(1000) is None


def test_the_lattice_gaussian_has_sigma_and_not_half_of_it():
    from privseed.tasks.dp.mechanisms import GAUSSIAN, Sensitivity

    mech = GAUSSIAN.calibrated(Sensitivity(l2=2.0, l1=4.0), 1.0, 1e-5)
    exact = np.linspace(-3.0, 7.0, N)
    noise = mech.release(exact) - exact
    assert _ks_pvalue(noise, mech.noise_distribution()) > FALSE_ALARM
    assert_noise_is(noise, "gaussian", mech.sigma)


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
    from privseed.tasks.dp.mechanisms import gaussian_noise_multiplier
    from privseed.tasks.dp.mechanisms import GAUSSIAN, LAPLACE, Sensitivity, mechanism_kind

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
    from privseed.tasks.seeds.histogram_seeds import noise_floor

    laplace = LaplaceMechanism(sensitivity=2.0, epsilon=1.0)
    assert noise_floor(laplace, 1000, 1.0) == pytest.approx(2.0 * np.log(1000 / 2))
    assert laplace.noise_tail(np.array([3.0]), discrete=True)[0] == pytest.approx(stats.dlaplace(0.5).sf(2))
    gaussian = GaussianMechanism(sensitivity=1.0, sigma=2.0, epsilon=1.0, delta=1e-5)
    assert noise_floor(gaussian, 1000, 1.0) == pytest.approx(2.0 * stats.norm.isf(1e-3))
    assert gaussian.noise_tail(np.array([2.0]))[0] == pytest.approx(stats.norm.sf(1.0))


def test_the_thresholded_histogram_noises_only_occurring_terms_and_meets_the_exact_delta():
    from privseed.tasks.dp.mechanisms import (LAPLACE_THRESHOLD, Sensitivity, laplace_threshold_delta,
                                              opendp_threshold_map)

    mechanism = LAPLACE_THRESHOLD.calibrated(Sensitivity.of_counts(10), 1.0, 1e-6)
    assert mechanism.scale == pytest.approx(10.0) and mechanism.delta <= 1e-6 and mechanism.epsilon == 1.0
    # epsilon is OpenDP's map (L1 / scale); delta the exact one; the threshold the smallest integer that meets it
    assert opendp_threshold_map(10.0, mechanism.threshold, 10, 10, 1)[0] == mechanism.epsilon
    assert mechanism.delta == laplace_threshold_delta(10.0, mechanism.threshold, 10, 10, 1)
    assert laplace_threshold_delta(10.0, mechanism.threshold - 1, 10, 10, 1) > 1e-6
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


@pytest.mark.parametrize("scale, threshold, l0", [(1.0, 5, 1), (4.0, 51, 4), (10 / 11, 18, 10), (0.5, 9, 3)])
def test_threshold_delta_is_the_discrete_laplace_tail(scale, threshold, l0):
    """delta = 1 - (1 - p)^L0, p = P(Z >= k) = e^(-t k) / (1 + e^(-t)), k = threshold - Linf, t = 1 / scale: the
    closed form, without scipy; a document that creates fewer coordinates (L1 < L0) is bounded by its L1."""
    from privseed.tasks.dp.mechanisms import laplace_threshold_delta

    t = 1.0 / scale
    p = np.exp(-t * (threshold - 1)) / (1 + np.exp(-t))
    assert laplace_threshold_delta(scale, threshold, l0, l0, 1) == pytest.approx(1 - (1 - p) ** l0, rel=1e-12)
    assert laplace_threshold_delta(scale, threshold, l0, 1, 1) == pytest.approx(p, rel=1e-12)
    # Linf 2: a created count of 2 is one step closer to the threshold
    p2 = np.exp(-t * (threshold - 2)) / (1 + np.exp(-t))
    assert laplace_threshold_delta(scale, threshold, l0, 2 * l0, 2) == pytest.approx(1 - (1 - p2) ** l0, rel=1e-12)


def test_opendps_threshold_map_is_still_one_step_off():
    """OpenDP 0.16.0's map of make_laplace_threshold bounds P(Z > threshold - Linf) where a count is kept at
    noisy >= threshold: its delta is the exact one of the next threshold, e^(1 / scale) too small
    (opendp/opendp#2922, open upstream). This test fails when an upgrade fixes the map."""
    from privseed.tasks.dp.mechanisms import laplace_threshold_delta, opendp_threshold_map

    fixed = ("OpenDP's privacy map of make_laplace_threshold no longer matches the off-by-one of opendp/opendp#2922: "
             "if it now equals laplace_threshold_delta (the exact delta), the upstream bug is fixed: note the OpenDP "
             "version in docs/privacy.md, keep or drop privseed's exact delta (tasks/dp/mechanisms.py), and delete "
             "this test; otherwise find out what changed before trusting either")
    for scale, threshold in ((1.0, 5), (4.0, 51), (10 / 11, 18), (0.5, 9), (10.0, 156)):
        _, mapped = opendp_threshold_map(scale, threshold, 1, 1, 1)
        assert laplace_threshold_delta(scale, threshold, 1, 1, 1) == pytest.approx(mapped * np.exp(1 / scale),
                                                                                   rel=1e-9), fixed
    for scale, threshold, l0 in ((1.0, 7, 4), (4.0, 51, 4), (10 / 11, 18, 10)):
        _, mapped = opendp_threshold_map(scale, threshold, l0, l0, 1)
        assert mapped == pytest.approx(laplace_threshold_delta(scale, threshold + 1, l0, l0, 1), rel=1e-9), fixed


def test_threshold_delta_is_the_release_frequency_of_a_term_one_document_creates():
    """The mechanism's own release at scale 1, threshold 5: a coordinate one document creates (count 1, 0 on the
    other corpus) is released with the probability the delta states (L0 = 1: p, 1.34 %), and one of the four a
    document of four new terms creates with 1 - (1 - p)^4 (L0 = 4). 200,000 coordinates (about 2 s) pin p to
    +-0.16 % at the check's level and refute OpenDP's 0.49 % (and 2.0 % for four terms) by far."""
    from privseed.tasks.dp.mechanisms import (LAPLACE_THRESHOLD, Sensitivity, laplace_threshold_delta,
                                              opendp_threshold_map)

    one = LAPLACE_THRESHOLD.calibrated(Sensitivity(l2=1.0, l1=1.0, l0=1, linf=1.0), 1.0, 0.02)
    assert (one.scale, one.threshold) == (1.0, 5)
    released = one.release(np.ones(200_000, dtype=np.int64), secure_noise()) != 0
    documents = released.reshape(-1, 4).any(axis=1)  # four created coordinates per document
    four = laplace_threshold_delta(1.0, 5, 4, 4, 1)
    for hits, claimed, unfixed in ((released, one.delta, opendp_threshold_map(1.0, 5, 1, 1, 1)[1]),
                                   (documents, four, opendp_threshold_map(1.0, 5, 4, 4, 1)[1])):
        k, n = int(hits.sum()), hits.size
        assert stats.binomtest(k, n, claimed).pvalue > FALSE_ALARM, (k, n, claimed)
        assert stats.binomtest(k, n, unfixed).pvalue < FALSE_ALARM, (k, n, unfixed)


def test_one_gaussian_release_is_calibrated_exactly_and_agrees_with_the_pld_accountant():
    """The analytic Gaussian mechanism's z: the exact delta at z meets the target and a z 1e-6 smaller does not;
    dp-accounting's PLD calibration (the accountant the schedules use) lands within 1e-4 of it, above."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant
    from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss

    from privseed.tasks.dp.mechanisms import gaussian_noise_multiplier

    def exact_delta(z: float, epsilon: float) -> float:
        return GaussianPrivacyLoss(standard_deviation=z, sensitivity=1.0).get_delta_for_epsilon(epsilon)

    for epsilon, delta in [(10.45, 7.2e-8), (1.0, 1e-5), (0.01, 0.5), (50.0, 1e-9)]:
        z = gaussian_noise_multiplier(epsilon, delta)
        assert exact_delta(z, epsilon) <= delta < exact_delta(z * (1 - 1e-6), epsilon)
    pld = dp_accounting.calibrate_dp_mechanism(
        pld_privacy_accountant.PLDAccountant, dp_accounting.GaussianDpEvent, target_epsilon=1.0, target_delta=1e-5,
        bracket_interval=dp_accounting.LowerEndpointAndGuess(0.1, 1.0), tol=1e-4)
    assert gaussian_noise_multiplier(1.0, 1e-5) <= pld <= gaussian_noise_multiplier(1.0, 1e-5) * (1 + 1e-4)
    with pytest.raises(ConfigError, match="positive and finite"):
        gaussian_noise_multiplier(float("inf"), 1e-5)
