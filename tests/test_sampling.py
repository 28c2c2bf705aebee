"""Ensembles, selection rules, fast scoring and the samplers."""

import math

import numpy as np
import pytest
import torch

from privseed.tasks.errors import ConfigError
from privseed.tasks.seeds.kde import (draw_rff_features, exact_kde_sum, prefix_matrix, prefix_sketch_sum,
                                      single_term_sketch_sum, single_term_weights)
from privseed.tasks.seeds.sampling import (SelectionRule, SketchTables, draw_rows, ensemble_blocks, fast_scores,
                                           naive_scores, sample_sequences, sketch_for_step, split_budget)


def _unit(rng, n, d):
    x = rng.standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_ensembles_and_budget_split():
    assert ensemble_blocks("independent", 10) == [1]
    assert ensemble_blocks("iterative-linear", 4) == [1, 2, 3, 4]
    assert ensemble_blocks("iterative-log", 10) == [1, 2, 4, 8, 10]
    for length in range(1, 40):
        blocks = ensemble_blocks("iterative-log", length)
        assert len(blocks) == math.ceil(math.log2(length)) + 1
        for step in range(1, length + 1):
            b = blocks[sketch_for_step(blocks, step)]
            assert step <= b and (b == length or b < 2 * step)  # at most half of the blocks are padding
    assert sum(split_budget("iterative-linear", 10.0, 10)) == pytest.approx(10.0)
    assert split_budget("iterative-log", 10.0, 10) == [2.0] * 5
    with pytest.raises(ConfigError):
        ensemble_blocks("bogus", 10)


def test_selection_rules():
    scores = np.array([[3.0, -1.0, 1.0, 0.5, 2.0]])
    assert SelectionRule.parse("greedy").weights(scores).tolist() == [[1.0, 0, 0, 0, 0]]
    np.testing.assert_allclose(SelectionRule.parse("proportional").weights(scores), [[3, 0, 1, 0.5, 2]])
    np.testing.assert_allclose(SelectionRule.parse("top-2").weights(scores), [[3, 0, 0, 0, 2]])
    np.testing.assert_allclose(SelectionRule.parse("power-2").weights(scores), [[9, 0, 1, 0.25, 4]])
    # all scores clipped away: uniform over the allowed terms
    np.testing.assert_allclose(SelectionRule.parse("top-2").weights(-np.array([[1.0, 2, 3]])), [[1, 1, 0]])
    assert str(SelectionRule.parse("top10")) == "top-10"
    with pytest.raises(ConfigError):
        SelectionRule.parse("softmax")
    rng = np.random.default_rng(0)
    w = np.tile([[0.0, 1.0, 3.0, 0.0]], (20000, 1))
    freq = np.bincount(draw_rows(w, rng), minlength=4) / 20000
    np.testing.assert_allclose(freq, [0, 0.25, 0.75, 0], atol=0.015)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-9), (torch.float32, 2e-4)])
def test_fast_scoring_equals_naive_full_dimension(dtype, tol):
    rng = np.random.default_rng(1)
    vocab, dim, blocks = 15, 7, 5
    emb = _unit(rng, vocab, dim)
    f = draw_rff_features(np.random.default_rng(2), n_features=96, dim=dim, blocks=blocks, bandwidth=0.6)
    sketch = SketchTables.build(f, emb, device=torch.device("cpu"), dtype=dtype)
    noisy = rng.normal(0, 30, size=96)
    for length in range(blocks):
        prefixes = rng.integers(0, vocab, size=(4, length))
        fast = fast_scores(sketch, torch.as_tensor(np.tile(noisy, (4, 1))), torch.as_tensor(prefixes)).numpy()
        naive = naive_scores(f, noisy, emb, prefixes)
        scale = np.abs(naive).max()
        np.testing.assert_allclose(fast, naive, atol=tol * scale)


def _exact_class_kde(emb, docs, h, blocks, prefix):
    """Exact (noise-free, infinite-I) kernel sums for every next term after ``prefix``."""
    pts = prefix_matrix(docs, blocks, "pad")
    points = np.zeros(pts.shape + (emb.shape[1],))
    points[pts >= 0] = emb[pts[pts >= 0]]
    queries = np.zeros((emb.shape[0], blocks, emb.shape[1]))
    for j, t in enumerate(prefix):
        queries[:, j] = emb[t]
    queries[:, len(prefix)] = emb
    return exact_kde_sum(points, queries, h)


def test_independent_sampler_converges_to_exact_kde_as_eps_grows():
    rng = np.random.default_rng(3)
    vocab, dim, h = 8, 4, 0.6
    emb = _unit(rng, vocab, dim)
    docs = [list(rng.integers(0, 4, size=rng.integers(1, 6))) for _ in range(30)]
    f = draw_rff_features(np.random.default_rng(4), n_features=20000, dim=dim, blocks=1, bandwidth=h)
    tables = f.block_phase_tables(emb)
    exact_sum = single_term_sketch_sum(single_term_weights(docs, vocab), tables, f.offset)  # eps = inf: no noise
    sk = SketchTables.build(f, emb, device=torch.device("cpu"), dtype=torch.float64)
    out = sample_sequences("independent", [sk], exact_sum[None, None, :], per_class=4000, length=5,
                           rule=SelectionRule.parse("proportional"), rng=np.random.default_rng(5))
    freq = np.bincount(out.ravel(), minlength=vocab) / out.size
    # exact KDE of the class's single phrases (each document weight 1, spread over its phrases)
    weights = single_term_weights(docs, vocab)
    kernel = np.exp(-((emb[:, None] - emb[None]) ** 2).sum(-1) / h**2)
    p = kernel @ weights
    p /= p.sum()
    assert 0.5 * np.abs(freq - p).sum() < 0.02


def test_iterative_sampler_converges_to_exact_conditional_kde():
    rng = np.random.default_rng(6)
    vocab, dim, h = 6, 4, 0.7
    emb = _unit(rng, vocab, dim)
    docs = [[0, 1, 2]] * 10 + [[3, 4]] * 10 + [[1, 5, 5]] * 5
    sketches, sums = [], []
    for k, blocks in enumerate(ensemble_blocks("iterative-linear", 2)):
        f = draw_rff_features(np.random.default_rng([7, k]), n_features=8000, dim=dim, blocks=blocks, bandwidth=h)
        sums.append(prefix_sketch_sum(prefix_matrix(docs, blocks), f.block_phase_tables(emb), f.offset))
        sketches.append(SketchTables.build(f, emb, device=torch.device("cpu"), dtype=torch.float64))
    out = sample_sequences("iterative-linear", sketches, np.array(sums)[None], per_class=6000, length=2,
                           rule=SelectionRule.parse("proportional"), rng=np.random.default_rng(8))[0]
    p1 = _exact_class_kde(emb, docs, h, 1, [])
    p1 /= p1.sum()
    joint = np.zeros((vocab, vocab))
    for a in range(vocab):
        p2 = _exact_class_kde(emb, docs, h, 2, [a])
        joint[a] = p1[a] * p2 / p2.sum()
    freq = np.zeros((vocab, vocab))
    np.add.at(freq, (out[:, 0], out[:, 1]), 1.0 / len(out))
    assert 0.5 * np.abs(freq - joint).sum() < 0.06
    # the test has power: the exact joint is far from the product of its marginals (prefixes matter)
    independent = np.outer(joint.sum(1), joint.sum(0))
    assert 0.5 * np.abs(joint - independent).sum() > 0.08


def test_sampler_shapes_determinism_and_validation():
    rng = np.random.default_rng(9)
    emb = _unit(rng, 12, 5)
    sketches = [SketchTables.build(draw_rff_features(np.random.default_rng(b), n_features=32, dim=5, blocks=b,
                                                     bandwidth=0.5), emb, device=torch.device("cpu"))
                for b in ensemble_blocks("iterative-log", 5)]
    sums = rng.normal(10, 5, size=(3, len(sketches), 32))
    kwargs = dict(per_class=7, length=5, rule=SelectionRule.parse("top-3"))
    a = sample_sequences("iterative-log", sketches, sums, rng=np.random.default_rng(1), **kwargs)
    b = sample_sequences("iterative-log", sketches, sums, rng=np.random.default_rng(1), **kwargs)
    assert a.shape == (3, 7, 5) and a.min() >= 0 and a.max() < 12
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ConfigError):
        sample_sequences("iterative-linear", sketches, sums, rng=np.random.default_rng(1), **kwargs)


@pytest.mark.parametrize("spec", ["proportional", "top-3", "power-2", "greedy"])
def test_torch_draw_follows_the_rule_weights(spec):
    rule = SelectionRule.parse(spec)
    scores = np.array([[3.0, -1.0, 1.0, 0.5, 2.0, 0.1]] * 30000)
    idx = rule.draw(torch.as_tensor(scores), np.random.default_rng(1))
    freq = np.bincount(idx, minlength=6) / len(idx)
    w = rule.weights(scores[:1])[0]
    np.testing.assert_allclose(freq, w / w.sum(), atol=0.012)
    # all scores negative: uniform fallback over the allowed terms
    idx = rule.draw(torch.as_tensor(-np.abs(scores[:3000]) - 1), np.random.default_rng(2))
    assert len(set(idx.tolist())) == (1 if spec == "greedy" else 3 if spec == "top-3" else 6)
