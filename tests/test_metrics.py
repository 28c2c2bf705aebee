import numpy as np
import pandas as pd
import pytest

from privseed.tasks.quality import metrics


def test_classification_scores_known_values():
    s = metrics.classification_scores([0, 0, 1, 1], [0, 1, 1, 1])
    assert s["accuracy"] == pytest.approx(0.75)
    # class 0: P=1 R=.5 F1=2/3; class 1: P=2/3 R=1 F1=.8 -> macro 0.7333
    assert s["macro_f1"] == pytest.approx((2 / 3 + 0.8) / 2)
    # string and int labels of the same class compare equal
    assert metrics.classification_scores(["1", "0"], [1, 0])["accuracy"] == 1.0


def test_frechet_distance_matches_closed_form_for_gaussians():
    rng = np.random.default_rng(0)
    a = rng.normal(0.0, 1.0, size=(20000, 3))
    b = rng.normal(0.0, 2.0, size=(20000, 3)) + np.array([1.0, 0.0, 0.0])
    # closed form: |mu|^2 + tr(I + 4I - 2*2I) = 1 + 3*(1 + 4 - 4) = 4
    assert metrics.frechet_distance(a, b) == pytest.approx(4.0, rel=0.05)
    assert metrics.frechet_distance(a, a) == pytest.approx(0.0, abs=1e-6)


def test_distinct_n_and_duplicates():
    texts = ["a b c", "a b c", "a b d"]
    assert metrics.distinct_n(texts, 1) == pytest.approx(4 / 9)
    assert metrics.distinct_n(texts, 2) == pytest.approx(3 / 6)
    assert metrics.duplicate_rate(texts) == pytest.approx(1 / 3)
    assert metrics.duplicate_rate(["A  b", "a b", "c"]) == pytest.approx(1 / 3)


def test_seed_term_coverage_counts_whole_phrases():
    texts = ["Congestive heart failure was treated.", "nothing here"]
    seeds = [["congestive heart failure", "aspirin"], ["heart"]]
    assert metrics.seed_term_coverage(texts, seeds) == pytest.approx((0.5 + 0.0) / 2)


def test_degenerate_rate_uses_the_document_predicate():
    texts = ["The river rises in the hills and flows north to the sea past the village.",
             "I'm an AI assistant and I'm ready to help with your article."]
    assert metrics.degenerate_rate(texts, [["river"], ["river"]]) == pytest.approx(0.5)
    assert metrics.corpus_metrics(texts)["degenerate_rate"] == pytest.approx(0.5)


def test_llm_usage_from_release_columns():
    df = pd.DataFrame({"text": ["x", "y", "z"], "backend": ["local", "local", "none"],
                       "model": ["m", "m", None], "tokens_in": [10, 20, 0], "tokens_out": [5, 7, 0]})
    u = metrics.llm_usage(df)
    assert (u["llm_calls"], u["tokens_in"], u["tokens_out"]) == (2.0, 30.0, 12.0)
    assert metrics.llm_usage(pd.DataFrame({"text": ["a"]}))["llm_calls"] == 0.0
    best_of = df.assign(candidates=[3, 3, 0])  # DP-KPS best of 3: every candidate was a call
    assert metrics.llm_usage(best_of)["llm_calls"] == 6.0


def test_mean_and_spread():
    m, s = metrics.mean_and_spread([0.5, 0.7, 0.6])
    assert m == pytest.approx(0.6) and s == pytest.approx(0.1)
    assert metrics.mean_and_spread([0.4]) == (0.4, 0.0)


def test_precision_recall_density_coverage_on_a_hand_computed_case():
    # real 0, 1, 2, 3 on a line: each real ball (k = 1) has radius 1. synthetic 0.5 and 10: each synthetic ball
    # has radius 9.5 (the other synthetic point).
    real, synthetic = np.array([[0.0], [1.0], [2.0], [3.0]]), np.array([[0.5], [10.0]])
    out = metrics.precision_recall_density_coverage(real, synthetic, nearest_k=1)
    assert out["precision"] == 0.5  # 0.5 lies in the balls of 0 and 1; 10 in none
    assert out["recall"] == 1.0  # every real point is within 9.5 of 0.5
    assert out["density"] == 1.0  # (2 balls + 0 balls) / 2 points / k
    assert out["coverage"] == 0.5  # 0 and 1 have a synthetic point inside their ball, 2 and 3 do not


def test_prdc_balls_are_open_and_k_counts_neighbours_not_the_point_itself():
    # real 0, 2, 4, 6: k = 2 puts the radius of 0 at 4 (its 2nd neighbour), of 2 and 4 at 2, of 6 at 4
    real = np.array([[0.0], [2.0], [4.0], [6.0]])
    out = metrics.precision_recall_density_coverage(real, np.array([[4.0], [10.0], [-4.0]]), nearest_k=2)
    assert out["precision"] == 1 / 3  # 10 is exactly on 6's ball (radius 4): outside; -4 on 0's: outside
    # 4 lies in the balls of 4 (distance 0) and 6 (2 < 4), not of 2 (distance 2 = radius 2) nor 0 (4 = radius 4)
    assert out["density"] == (2 / 3) / 2
    assert out["recall"] == 1.0  # the synthetic 4's ball (radius 8, its 2nd neighbour -4) holds every real point
    assert out["coverage"] == 0.5  # 4 and 6 hold the synthetic 4 strictly inside; 0 and 2 do not
    with pytest.raises(ValueError, match="more than 2 embeddings"):
        metrics.precision_recall_density_coverage(real, np.array([[1.0], [2.0]]), nearest_k=2)


def test_prdc_separates_a_faithful_sample_from_a_collapsed_one():
    rng = np.random.default_rng(0)
    real = rng.normal(size=(300, 8))
    faithful = metrics.precision_recall_density_coverage(real, rng.normal(size=(300, 8)))
    collapsed = metrics.precision_recall_density_coverage(real, rng.normal(size=(300, 8)) * 0.05)
    assert faithful["precision"] > 0.8 and faithful["recall"] > 0.8 and faithful["coverage"] > 0.8
    assert 0.7 < faithful["density"] < 1.3
    assert collapsed["precision"] > 0.9 and collapsed["recall"] < 0.1 and collapsed["coverage"] < 0.2
