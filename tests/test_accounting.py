"""Accounting for Aug-PE and SecPE against published vectors and closed forms."""
import math

import numpy as np
import pytest
from scipy.stats import norm

from privseed.tasks.dp import accounting as acc
from privseed.tasks.errors import ConfigError

# Aug-PE (Xie et al. 2024), T = 10, delta = 1 / (n ln n): published sigma for eps = 1, 2, 4.
PUBLISHED = {
    "yelp": (1_939_290, {1: 15.34, 2: 8.03, 4: 4.24}),
    "openreview": (8_396, {1: 11.60, 2: 6.22, 4: 3.38}),
    "pubmed": (75_316, {1: 13.26, 2: 7.01, 4: 3.75}),
}
NINE = [(name, n, eps, sigma) for name, (n, table) in PUBLISHED.items() for eps, sigma in table.items()]


# The authors' notebook (notebook/dp_budget.ipynb in the public Aug-PE repository) searched a 0.01 grid; its own
# search printed 15.40 for Yelp at eps = 1, while the paper's table says 15.34 (which is (1.0045, delta)-DP).
# The exact calibration therefore matches the table to 0.01 in eight of nine cells and the notebook in the ninth.
NOTEBOOK_OVERRIDES = {("yelp", 1): 15.40}


@pytest.mark.parametrize("name,n,eps,sigma", NINE)
def test_published_multipliers_give_their_epsilon(name, n, eps, sigma):
    got = acc.augpe_epsilon(sigma, acc.default_delta(n), 10)
    assert abs(got - eps) < 0.01, (name, got)


@pytest.mark.parametrize("name,n,eps,sigma", NINE)
def test_calibrated_multiplier_matches_published(name, n, eps, sigma):
    delta = acc.default_delta(n)
    ours = acc.augpe_noise_multiplier(eps, delta, 10, tol=1e-3)
    expected = NOTEBOOK_OVERRIDES.get((name, eps), sigma)
    assert abs(ours - expected) <= 0.0101, (name, eps, ours)
    assert ours == pytest.approx(sigma, rel=5e-3)          # and within 0.5 % of the table everywhere
    assert acc.augpe_epsilon(ours, delta, 10) <= eps + 1e-3  # never less private than claimed


def test_calibration_is_exact_gaussian_composition():
    # T Gaussian rounds with sigma are one Gaussian with sigma / sqrt(T) (mu-GDP, mu = sqrt(T)/sigma).
    delta = 1e-5
    sigma = acc.augpe_noise_multiplier(2.0, delta, 10)
    mu = math.sqrt(10) / sigma
    closed = norm.cdf(-2.0 / mu + mu / 2) - math.exp(2.0) * norm.cdf(-2.0 / mu - mu / 2)
    assert closed == pytest.approx(delta, rel=2e-2)


def test_default_delta_needs_public_bound():
    assert acc.default_delta(8396) == pytest.approx(1 / (8396 * math.log(8396)))
    with pytest.raises(ConfigError):
        acc.default_delta(None)


@pytest.mark.parametrize("sigma,T", [(2.0, 1), (4.0, 10), (1.5, 3)])
def test_blow_up_matches_gaussian_closed_form(sigma, T):
    # One certain holder: each round shifts the joint (sizes, centres) vector by sqrt(2), so T rounds are
    # mu-GDP with mu = sqrt(2 T) / sigma.
    p = 1e-4
    mu = math.sqrt(2 * T) / sigma
    closed = acc.gaussian_reconstruction_bound(p, mu)
    got = acc.secret_blow_up(sigma, [1.0], p, T, value_discretization_interval=1e-3)
    assert got >= closed * (1 - 1e-3)          # a valid upper bound never undercuts the exact value
    assert got == pytest.approx(closed, rel=3e-2)
    # a single released part (shift 1 per holder) is the mu = sqrt(T) / sigma case
    single = acc.secret_blow_up(sigma, [1.0], p, T, value_discretization_interval=1e-3, holder_shift=1.0)
    assert single == pytest.approx(acc.gaussian_reconstruction_bound(p, math.sqrt(T) / sigma), rel=3e-2)


def test_blow_up_grows_with_sampling_probability_and_rounds():
    p = 1e-4
    low = acc.secret_blow_up(3.0, [0.2, 0.2], p, 5)
    high = acc.secret_blow_up(3.0, [0.9, 0.9], p, 5)
    more_rounds = acc.secret_blow_up(3.0, [0.9, 0.9], p, 10)
    assert p <= low < high < more_rounds


def test_joint_calibration_of_sizes_and_centres():
    """The issue's case: one holder with rho 0.3, T = 5, (p, r) = (1e-4, 1e-3). Calibrating sizes and centres as
    2T independent mixtures (shift 1 each) picks sigma 1.854, at which the true round, where one Bernoulli draw
    drives both parts (shift sqrt(2)), has B(p) = 1.43e-3 > r. The joint calibration meets r."""
    p, r, T = 1e-4, 1e-3, 5
    old = acc.calibrate_secret_sigma([[0.3]], p, r, 2 * T, holder_shift=1.0)
    assert old.sigma == pytest.approx(1.854, abs=2e-3)
    true_at_old = acc.secret_blow_up(old.sigma, [0.3], p, T)
    assert true_at_old == pytest.approx(1.43e-3, rel=2e-2) and true_at_old > r
    new = acc.calibrate_secret_sigma([[0.3]], p, r, T)
    assert new.sigma > old.sigma and new.rounds == T and new.holder_shift == pytest.approx(math.sqrt(2))
    assert acc.secret_blow_up(new.sigma, [0.3], p, T) <= r
    assert acc.secret_blow_up(new.sigma * 0.98, [0.3], p, T) > r  # and it is not much more noise than needed


def test_secpe_dp_epsilon_is_t_rounds_of_sensitivity_sqrt2():
    # T rounds with shift sqrt(2) and noise sigma = T Gaussian rounds with multiplier sigma / sqrt(2)
    # = 2T rounds with multiplier sigma (GDP: sqrt(2T) / sigma either way).
    got = acc.secpe_dp_epsilon(2.0, 1e-5, 5)
    assert got == pytest.approx(acc.augpe_epsilon(2.0 / math.sqrt(2), 1e-5, 5))
    assert got == pytest.approx(acc.augpe_epsilon(2.0, 1e-5, 10), rel=1e-2)


def test_poisson_binomial_pmf():
    support, probs, dropped = acc.poisson_binomial_pmf([0.5, 0.5])
    assert support.tolist() == [0, 1, 2]
    assert probs == pytest.approx([0.25, 0.5, 0.25])
    assert dropped == 0.0
    support, probs, dropped = acc.poisson_binomial_pmf([1e-3] * 20)
    assert support.size < 21 and 0 < dropped < 1e-12
    assert probs.sum() == pytest.approx(1.0)


def test_calibrated_secret_sigma_meets_every_budget():
    p, r = 1e-4, 1e-3
    rho_by_secret = [np.array([1.0]), np.array([0.3, 0.3]), np.array([0.05] * 4), np.array([])]
    cal = acc.calibrate_secret_sigma(rho_by_secret, p, r, rounds=4)
    assert np.all(cal.blow_ups <= r + 1e-12)
    assert cal.binding_secret == 0  # the certain-holder secret binds
    # minimality: 2 % less noise breaks the binding secret's bound
    assert acc.secret_blow_up(cal.sigma * 0.98, rho_by_secret[0], p, 4) > r
    # with a single certain holder, the sigma is the GDP one: sqrt(2 T)/sigma = mu
    mu = acc.gdp_mu_for_secret(p, r)
    assert cal.sigma == pytest.approx(math.sqrt(2 * 4) / mu, rel=3e-2)


def test_secret_budget_validation():
    with pytest.raises(ConfigError):
        acc.gdp_mu_for_secret(1e-4, 1e-5)
    assert acc.gdp_mu_for_secret(1e-4, 1.0) == math.inf


def test_secret_held_by_every_always_sampled_document_is_a_plain_gaussian():
    """rho = 1 for all n holders: every round shifts by sqrt(2) n, a Gaussian mechanism; the blow-up then depends
    on sigma / n only (dp-accounting's mixture used to fail on the zero-probability components at large n)."""
    from privseed.tasks.dp import accounting

    for n in (3, 40):
        many = accounting.secret_blow_up(2.0 * n, [1.0] * n, 1e-3, 3)
        one = accounting.secret_blow_up(2.0, [1.0], 1e-3, 3)
        assert abs(many - one) < 1e-3
    calibration = accounting.calibrate_secret_sigma([[1.0] * 40], 1e-3, 1e-2, 3)
    assert calibration.blow_ups[0] <= 1e-2 and calibration.sigma > 0
