"""Random Fourier feature DP-KDE: accuracy, noise scale, sensitivity, zero padding (Theorem B.2)."""

import math

import numpy as np
import pytest

from privseed.tasks.errors import ConfigError
from privseed.tasks.seeds.kde import (RffSketch, draw_rff_features, exact_kde_sum, gaussian_sigma, laplace_scale,
                                      prefix_matrix, prefix_sketch_sum, release_sketch, sensitivity,
                                      single_term_sketch_sum, single_term_weights, sketch_mechanism)
from privseed.tasks.dp.mechanisms import secure_noise
from tests.noise_checks import assert_noise_is


def _unit(rng, n, d):
    x = rng.standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _sequences(embeddings, ids):
    """(n, l) ids (-1 = zero block) -> (n, l, d) block sequences."""
    out = np.zeros(ids.shape + (embeddings.shape[1],))
    real = ids >= 0
    out[real] = embeddings[ids[real]]
    return out


def test_rff_error_shrinks_like_one_over_sqrt_features():
    rng = np.random.default_rng(0)
    emb = _unit(rng, 40, 8)
    blocks, h = 2, 0.7
    points = _sequences(emb, rng.integers(0, 40, size=(30, blocks)))
    queries = _sequences(emb, rng.integers(0, 40, size=(25, blocks)))
    exact = exact_kde_sum(points, queries, h) / len(points)
    sizes = [64, 256, 1024, 4096]
    errors = []
    for n_features in sizes:
        rms = []
        for seed in range(6):
            f = draw_rff_features(np.random.default_rng([1, seed, n_features]), n_features=n_features, dim=8,
                                  blocks=blocks, bandwidth=h)
            sketch = RffSketch(f, f.features(points).sum(axis=0), epsilon=math.inf)
            rms.append(np.sqrt(np.mean((sketch.score(queries) / len(points) - exact) ** 2)))
        errors.append(np.mean(rms))
    slope = np.polyfit(np.log(sizes), np.log(errors), 1)[0]
    assert -0.65 < slope < -0.35, (slope, errors)
    assert errors[-1] < 0.05


def test_laplace_noise_matches_scale_sqrt2_I_over_eps():
    n_features, eps = 3000, 0.7
    noise = release_sketch(np.zeros(n_features), mechanism=sketch_mechanism("laplace", n_features, eps),
                           noise=secure_noise())
    b = math.sqrt(2) * n_features / eps
    assert laplace_scale(n_features, eps) == pytest.approx(b)
    assert sensitivity("laplace", n_features) == pytest.approx(math.sqrt(2) * n_features)
    assert_noise_is(noise, "laplace", b)  # refutes 2b (the appendix's 2 sqrt(2) I / eps) and b / 2


def test_gaussian_noise_is_calibrated_by_dp_accounting():
    n_features, eps, delta = 500, 1.0, 1e-5
    sigma = gaussian_sigma(n_features, eps, delta)
    multiplier = sigma / math.sqrt(2 * n_features)
    # analytic Gaussian mechanism (Balle & Wang 2018) at eps=1, delta=1e-5 needs about 3.73 sensitivities
    assert 3.6 < multiplier < 3.9
    mech = sketch_mechanism("gaussian", 4000, eps, delta)
    assert (mech.sigma, mech.sensitivity, mech.epsilon, mech.delta) == \
        (pytest.approx(gaussian_sigma(4000, eps, delta)), pytest.approx(math.sqrt(8000)), eps, delta)
    noise = release_sketch(np.zeros(4000), mechanism=mech, noise=secure_noise())
    assert_noise_is(noise, "gaussian", gaussian_sigma(4000, eps, delta))
    with pytest.raises(ConfigError):
        gaussian_sigma(n_features, eps, 0.0)


@pytest.mark.parametrize("blocks,short", [(1, "pad"), (3, "pad"), (3, "skip"), (6, "pad")])
def test_one_document_moves_the_sum_by_at_most_the_sensitivity(blocks, short):
    rng = np.random.default_rng(11)
    vocab, n_features = 25, 200
    emb = _unit(rng, vocab, 6)
    f = draw_rff_features(np.random.default_rng(12), n_features=n_features, dim=6, blocks=blocks, bandwidth=0.5)
    tables = f.block_phase_tables(emb)
    corpus = [list(rng.integers(0, vocab, size=rng.integers(1, 12))) for _ in range(40)]
    adversarial = [
        list(range(vocab)) * 4,  # many phrases
        [7] * 60,  # one phrase repeated
        [3],  # a single phrase
        [5, 5, 9, 5, 5, 9],
    ] + [list(rng.integers(0, vocab, size=rng.integers(1, 30))) for _ in range(60)]

    def total(docs):
        if blocks == 1:
            return single_term_sketch_sum(single_term_weights(docs, vocab), tables, f.offset)
        return prefix_sketch_sum(prefix_matrix(docs, blocks, short), tables, f.offset)

    base = total(corpus)
    worst_linf, worst_l1 = 0.0, 0.0
    for doc in adversarial:
        delta = total(corpus + [doc]) - base
        worst_linf = max(worst_linf, np.abs(delta).max())
        worst_l1 = max(worst_l1, np.abs(delta).sum())
        assert np.linalg.norm(delta) <= sensitivity("gaussian", n_features) + 1e-9
    assert worst_linf <= math.sqrt(2) + 1e-9
    assert worst_l1 <= sensitivity("laplace", n_features) + 1e-9
    assert worst_linf > 1.0  # the bound is nearly attained, so a wrong scaling would show


def test_sketch_sums_match_the_definition_and_are_additive():
    rng = np.random.default_rng(2)
    emb = _unit(rng, 10, 5)
    f = draw_rff_features(np.random.default_rng(3), n_features=50, dim=5, blocks=3, bandwidth=0.8)
    tables = f.block_phase_tables(emb)
    docs = [[1, 2, 3, 4], [5], [6, 7], [], [8, 8, 8, 8, 8]]
    direct = sum(f.features(_sequences(emb, prefix_matrix([d], 3, "pad")))[0] for d in docs if d)
    np.testing.assert_allclose(prefix_sketch_sum(prefix_matrix(docs, 3, "pad"), tables, f.offset), direct, atol=1e-10)
    assert prefix_matrix(docs, 3, "skip").shape == (2, 3)
    split = prefix_sketch_sum(prefix_matrix(docs[:2], 3), tables, f.offset) + prefix_sketch_sum(
        prefix_matrix(docs[2:], 3), tables, f.offset)
    np.testing.assert_allclose(split, direct, atol=1e-10)
    # single-term sketch: each document's weight is 1, spread over its terms
    f1 = draw_rff_features(np.random.default_rng(4), n_features=50, dim=5, blocks=1, bandwidth=0.8)
    expected = sum(f1.features(emb[d][:, None, :]).mean(axis=0) for d in docs if d)
    got = single_term_sketch_sum(single_term_weights(docs, 10), f1.block_phase_tables(emb), f1.offset)
    np.testing.assert_allclose(got, expected, atol=1e-10)


def test_zero_padding_identity_of_theorem_b2():
    """KDE over full length-L vectors at a zero-padded length-l query = e^{-u(L-l)} x the length-l prefix KDE,
    with u the squared norm of a (scaled) block; exactly for the kernel, approximately for a noise-free sketch."""
    rng = np.random.default_rng(8)
    dim, big_l, h = 6, 4, 0.9
    emb = _unit(rng, 30, dim)
    points = _sequences(emb, rng.integers(0, 30, size=(50, big_l)))
    f = draw_rff_features(np.random.default_rng(9), n_features=40000, dim=dim, blocks=big_l, bandwidth=h)
    exact_sum = f.features(points).sum(axis=0)  # a noise-free sketch
    u = 1.0 / (h**2 * big_l)  # squared norm of one scaled block
    for length in range(1, big_l + 1):
        query_ids = rng.integers(0, 30, size=(12, length))
        padded = _sequences(emb, np.concatenate([query_ids, -np.ones((12, big_l - length), int)], axis=1))
        prefix_kde = np.exp(-(((_sequences(emb, query_ids)[:, None] - points[None, :, :length]) ** 2).sum(axis=(2, 3)))
                            * u).sum(axis=1)
        full_at_padded = exact_kde_sum(points, padded, h)
        np.testing.assert_allclose(full_at_padded, math.exp(-u * (big_l - length)) * prefix_kde, rtol=1e-10)
        estimate = f.features(padded) @ exact_sum / f.n_features
        np.testing.assert_allclose(estimate, full_at_padded,
                                   atol=0.05 * len(points) * 0.1 + 0.02 * full_at_padded.max())


def test_feature_draw_validates_parameters():
    with pytest.raises(ConfigError):
        draw_rff_features(np.random.default_rng(0), n_features=0, dim=3)
    with pytest.raises(ConfigError):
        draw_rff_features(np.random.default_rng(0), n_features=3, dim=3, bandwidth=0)
    with pytest.raises(ConfigError):
        sketch_mechanism("exponential", 3, 1.0)
