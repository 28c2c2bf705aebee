"""The histogram seed methods: counting, sensitivity, budget split, the post-processing of the noisy rows
(q-values, candidate group, background share), samplers, coherence, and the noise the flow's stages actually
release (KS tests against the discrete Laplace of the stated scale, through the secure sampler)."""

import numpy as np
import pytest
from scipy import stats

from privseed.tasks.config.commands import DpKpsConfig
from privseed.tasks.errors import ConfigError, LedgerMismatchError
from privseed.tasks.generation.class_fit import SEED_POOL_CLASSES
from privseed.tasks.seeds.histogram_seeds import (ClassRelease, background_distribution, bh_q_values, build_mechanism,
                                                  class_pair_counts, class_term_counts, class_term_releases,
                                                  first_distinct_terms, l1_sensitivity, l2_sensitivity, noise_tail,
                                                  pair_candidates, pair_columns, pair_coherence, pair_l1_sensitivity,
                                                  pair_matrix, pair_mechanism, most_typical, sample_class_sequences,
                                                  sample_independent, sample_markov, stage_budgets,
                                                  seed_pool, typicality_margins)
from privseed.tasks.dp.ledger import PrivacyLedger
from privseed.tasks.seeds.sampling import SelectionRule
from privseed.tasks.stages.corpus import scan_private_corpus
from privseed.tasks.stages.dpkps import term_counting
from privseed.tasks.stages.histogram import (exact_pair_counts, pool_judge, privatize_class_histograms,
                                             privatize_class_pairs, sample_histogram_sequences)
from privseed.tasks.seeds.vocabulary import PhraseMatcher, Vocabulary
from tests.conftest import corpus_plan
from tests.noise_checks import assert_noise_is


# ------------------------------------------------------------------ counting
def test_first_distinct_terms_keeps_reading_order_skips_repeats_and_stops_at_s():
    assert first_distinct_terms([4, 4, 2, 4, 7, 2, 9, 1], 3) == [4, 2, 7]
    assert first_distinct_terms([4, 4, 2], 10) == [4, 2]
    assert first_distinct_terms([4, 5, 2, 6, 7], 2, allowed={2, 7}) == [2, 7]
    with pytest.raises(ConfigError, match="S must be"):
        first_distinct_terms([1], 0)


def test_multi_word_terms_count_once_per_document():
    vocab = Vocabulary.from_terms("t", ["heart failure", "heart", "failure", "acute", "chronic"])
    matcher = PhraseMatcher(vocab)
    docs = ["Acute heart failure after heart failure; heart attack", "chronic failure, chronic heart"]
    ids = [matcher.match(d) for d in docs]
    counts = class_term_counts(ids, [0, 1], n_classes=2, vocab_size=len(vocab), max_terms=10)
    hf, heart, failure, acute, chronic = (vocab.terms.index(t) for t in
                                          ("heart failure", "heart", "failure", "acute", "chronic"))
    assert counts[0, hf] == 1 and counts[0, heart] == 1 and counts[0, acute] == 1  # repeats count once
    assert counts[0, failure] == 0  # consumed by the longer match
    assert counts[1, chronic] == 1 and counts[1, failure] == 1 and counts[1, heart] == 1 and counts[1, hf] == 0
    assert counts[0].sum() == 3 and counts[1].sum() == 3
    # S cuts a document to its first S distinct terms
    first_only = class_term_counts(ids, [0, 1], 2, len(vocab), max_terms=1)
    assert first_only[0, acute] == 1 and first_only[0].sum() == 1 and first_only[1, chronic] == 1


@pytest.mark.parametrize(("s", "s2"), [(1, 2), (3, 3), (10, 5)])
def test_one_document_moves_only_its_class_by_at_most_s(s, s2):
    rng = np.random.default_rng(0)
    vocab_size, n_classes = 30, 3
    docs = [rng.integers(0, vocab_size, size=rng.integers(0, 25)).tolist() for _ in range(40)]
    classes = rng.integers(0, n_classes, size=40).tolist()
    candidates = [rng.choice(vocab_size, size=12, replace=False) for _ in range(n_classes)]
    base = class_term_counts(docs, classes, n_classes, vocab_size, s)
    base_pairs = class_pair_counts(docs, classes, candidates, s2)
    assert base_pairs.shape == (n_classes, 12 * 11 // 2)
    worst = 0.0
    for _ in range(50):
        doc = rng.integers(0, vocab_size, size=rng.integers(0, 40)).tolist()
        c = int(rng.integers(0, n_classes))
        diff = class_term_counts(docs + [doc], classes + [c], n_classes, vocab_size, s) - base
        assert np.abs(diff).sum() <= l1_sensitivity(s) and np.linalg.norm(diff) <= l2_sensitivity(s) + 1e-12
        assert np.abs(np.delete(diff, c, axis=0)).sum() == 0  # parallel composition: other classes untouched
        pairs = class_pair_counts(docs + [doc], classes + [c], candidates, s2) - base_pairs
        assert pairs.min() >= 0 and pairs.max() <= 1  # distinct pairs: each moves by at most 1
        assert np.abs(pairs).sum() <= pair_l1_sensitivity(s2)
        assert np.linalg.norm(pairs) <= np.sqrt(pair_l1_sensitivity(s2)) + 1e-12
        assert np.abs(np.delete(pairs, c, axis=0)).sum() == 0
        worst = max(worst, np.abs(pairs).sum())
    assert worst == pair_l1_sensitivity(s2)  # the bound is reached: it is the sensitivity, not a loose cap
    with pytest.raises(ConfigError, match="pair needs two terms"):
        pair_l1_sensitivity(1)


def test_pair_counts_are_unordered_pairs_of_the_first_s2_candidate_terms():
    candidates = [np.array([10, 11, 12, 13])]
    columns = pair_columns(4)
    assert columns[0, 1] == columns[1, 0] == 0 and columns[2, 3] == 5 and columns[1, 1] == -1
    # reduced to candidates: 12, 10, 13 (11 comes after the third); S_2 = 3 -> pairs {12,10}, {12,13}, {10,13}
    counts = class_pair_counts([[5, 12, 12, 10, 6, 13, 11]], [0], candidates, 3)[0]
    expected = np.zeros(6, dtype=np.int64)
    expected[[columns[2, 0], columns[2, 3], columns[0, 3]]] = 1
    np.testing.assert_array_equal(counts, expected)
    # S_2 = 2: one pair per document, its first two distinct candidate terms
    assert class_pair_counts([[5, 12, 12, 10, 6, 13]], [0], candidates, 2)[0, columns[0, 2]] == 1
    assert class_pair_counts([[5, 12, 12, 10, 6, 13]], [0], candidates, 2).sum() == 1


def test_budget_split_adds_up_and_refuses_bad_shares():
    assert stage_budgets("histogram", 11.0, 0.0, 0.5) == [(11.0, 0.0)]
    (e1, d1), (e2, d2) = stage_budgets("histogram-markov", 6.0, 1e-5, 0.7)
    assert e1 + e2 == pytest.approx(6.0) and e1 == pytest.approx(4.2) and d1 + d2 == pytest.approx(1e-5)
    with pytest.raises(ConfigError):
        stage_budgets("histogram-markov", 6.0, 0.0, 1.0)
    with pytest.raises(ConfigError):
        stage_budgets("independent", 6.0, 0.0, 0.5)


# ------------------------------------------------------------------ post-processing of the noisy rows
def test_q_values_are_benjamini_hochberg_against_the_noise_tail():
    tail = np.array([0.0001, 0.001, 0.02, 0.01])
    values = np.array([9.0, 7.0, 4.0, 3.0])  # decreasing; tails need not be monotone for the formula
    q = bh_q_values(values, 100, tail)
    raw = np.minimum(1.0, 100 * tail / np.arange(1, 5))  # 0.01, 0.05, 0.667, 0.25
    np.testing.assert_allclose(q, [0.01, 0.05, 0.25, 0.25])
    assert np.all(q <= raw + 1e-12) and np.all(np.diff(q) >= 0)
    with pytest.raises(ConfigError, match="decreasing"):
        bh_q_values(np.array([1.0, 2.0]), 10, np.array([0.1, 0.1]))


def test_noise_tail_is_the_mechanisms_own_law():
    laplace = build_mechanism("laplace", 4, 2.0, 0.0)  # scale 2
    values = np.array([0.0, 1.0, 5.0])
    np.testing.assert_allclose(noise_tail(laplace, values, discrete=False), stats.laplace(scale=2.0).sf(values))
    law = stats.dlaplace(0.5)  # P(K >= k) = P(K > k - 1)
    np.testing.assert_allclose(noise_tail(laplace, values, discrete=True), law.sf(values - 1))
    gauss = build_mechanism("gaussian", 4, 2.0, 1e-5)
    np.testing.assert_allclose(noise_tail(gauss, values, discrete=False), stats.norm(scale=gauss.scale).sf(values))


def test_fdr_weights_keep_strong_terms_move_noise_mass_to_the_background_and_prefer_candidates():
    mech = build_mechanism("laplace", 1, 1.0, 0.0)  # scale 1: pure noise over 5,000 terms peaks near ln(2500) = 7.8
    rng = np.random.default_rng(3)
    vocab = 5000
    noisy = rng.laplace(0.0, 1.0, size=(3, vocab))
    noisy[0, :40] += 100.0  # class 0: 40 strong terms; class 1: the same 40 weaker; class 2: noise only
    noisy[1, :40] += 25.0
    noisy[:2, 40] += 6.0  # a weak term of classes 0 and 1, at the level of the noise maximum over V: a candidate
    releases = class_term_releases(noisy, mech, k=100, candidates=60)
    strong, weak, empty = releases
    assert set(strong.term_ids[:40]) == set(range(40)) and strong.weights[:40].min() > 85
    assert strong.background_share < 0.1  # its clipped mass is almost all signal
    # nothing above the noise: most of its draws come from the pooled classes (not all: a q-value is the FDR of the
    # whole top list, the minimum over the ranks below it, so the largest pure-noise counts keep some weight)
    assert empty.background_share > 0.6 and empty.background_share > 5 * strong.background_share
    # term 40 competes with the 60 candidates' noise, not with |V|: it keeps most of its weight
    where = dict(zip(weak.term_ids.tolist(), weak.weights.tolist()))
    assert 40 in where and where[40] > 3.0
    alone = class_term_releases(noisy, mech, k=100, candidates=vocab)[1]  # one group: |V| noise draws
    assert dict(zip(alone.term_ids.tolist(), alone.weights.tolist())).get(40, 0.0) < where[40]
    # clip: the K largest clipped counts as they are
    clipped = class_term_releases(noisy, mech, k=100, candidates=60, denoise="clip")[2]
    np.testing.assert_allclose(np.sort(clipped.weights)[::-1], np.maximum(np.sort(noisy[2])[::-1][:100], 0.0))
    assert clipped.background_share == 0.0
    with pytest.raises(ConfigError):
        class_term_releases(noisy, mech, k=100, candidates=60, denoise="sharpen")
    # the background cap: the noise-only class keeps at most that share for the pooled classes, the same terms and
    # weights; a share already under the cap is left as it is
    capped = class_term_releases(noisy, mech, k=100, candidates=60, background_cap=0.3)
    assert capped[2].background_share == pytest.approx(0.3)
    assert capped[0].background_share == pytest.approx(strong.background_share)
    for before, after in zip(releases, capped):
        assert before.term_ids.tolist() == after.term_ids.tolist()
        np.testing.assert_array_equal(before.weights, after.weights)
    assert class_term_releases(noisy, mech, k=100, candidates=60, background_cap=0.0)[2].background_share == 0.0
    with pytest.raises(ConfigError, match="cap"):
        class_term_releases(noisy, mech, k=100, candidates=60, background_cap=1.5)


def test_background_pools_the_weights_of_every_class():
    releases = [ClassRelease(np.array([1, 2]), np.array([3.0, 1.0])),
                ClassRelease(np.array([2, 5]), np.array([1.0, 5.0]))]
    ids, p = background_distribution(releases)
    assert ids.tolist() == [1, 2, 5] and p.tolist() == pytest.approx([0.3, 0.2, 0.5])


# ------------------------------------------------------------------ samplers
def test_independent_sampler_draws_in_proportion_to_clipped_counts():
    release = ClassRelease(term_ids=np.array([7, 8, 9, 3]), weights=np.array([30.0, 10.0, -5.0, 0.0]))
    ids = sample_independent(release, 4000, 10, SelectionRule.parse("power-1"), np.random.default_rng(1))
    assert ids.shape == (4000, 10) and set(np.unique(ids)) == {7, 8}  # clipped-to-zero terms are never drawn
    share = np.mean(ids == 7)
    assert share == pytest.approx(0.75, abs=0.01)
    squared = sample_independent(release, 4000, 10, SelectionRule.parse("power-2"), np.random.default_rng(1))
    assert np.mean(squared == 7) == pytest.approx(0.9, abs=0.01)


def test_background_share_of_draws_comes_from_the_pooled_distribution():
    own = ClassRelease(np.array([7, 8]), np.array([1.0, 1.0]), background_share=0.4)
    background = (np.array([50]), np.array([1.0]))
    ids = sample_independent(own, 5000, 10, SelectionRule.parse("power-1"), np.random.default_rng(2), background)
    assert np.mean(ids == 50) == pytest.approx(0.4, abs=0.01)  # sd of the share: 0.002
    with pytest.raises(ConfigError, match="background"):
        sample_independent(own, 2, 2, SelectionRule.parse("power-1"), np.random.default_rng(2))
    # sample_class_sequences builds the background from the classes themselves (sequences of L = 1: no class is
    # short of terms, so no fallback share is added)
    other = ClassRelease(np.array([50]), np.array([4.0]))
    seqs = sample_class_sequences("histogram", [own, other], 20000, 1, SelectionRule.parse("power-1"),
                                  np.random.default_rng(0))
    drawn = np.asarray(seqs[0])
    assert np.mean(drawn == 50) == pytest.approx(0.4 * 4 / 6, abs=0.02)  # pooled: 7, 8 weigh 1 each, 50 weighs 4


def test_markov_sampler_follows_released_pairs_with_the_pair_weight_and_otherwise_draws_the_class():
    term_ids = np.array([100, 101, 102, 103])
    pairs = np.zeros((3, 3))
    pairs[0, 1] = pairs[1, 0] = 5.0  # 100 <-> 101 released; 102 has no pair above the floor
    release = ClassRelease(term_ids, np.array([1.0, 0.0, 0.0, 1.0]), pair_ids=np.array([100, 101, 102]),
                           pair_weights=pairs)
    rule = SelectionRule.parse("power-1")
    walk = sample_markov(release, 3000, 2, rule, np.random.default_rng(0), pair_weight=1.0)
    assert set(walk[:, 0]) == {100, 103}  # the first term: the class distribution (101 and 102 weigh 0)
    assert (walk[walk[:, 0] == 100, 1] == 101).all()  # always follows the pair
    assert set(walk[walk[:, 0] == 103, 1]) == {100, 103}  # 103 is no candidate: the class distribution
    half = sample_markov(release, 4000, 2, rule, np.random.default_rng(0), pair_weight=0.5)
    after = half[half[:, 0] == 100, 1]
    # P(101) = 0.5 (pair) + 0.5 * 0 (class); P(100) = P(103) = 0.25
    assert np.mean(after == 101) == pytest.approx(0.5, abs=0.04)
    assert np.mean(after == 100) == pytest.approx(0.25, abs=0.04)
    never = sample_markov(release, 500, 3, rule, np.random.default_rng(0), pair_weight=0.0)
    assert not np.isin(never, [101, 102]).any()  # pair weight 0 is the histogram sampler
    with pytest.raises(ConfigError):
        sample_markov(ClassRelease(term_ids, release.weights), 1, 2, rule, np.random.default_rng(0))
    with pytest.raises(ConfigError):
        sample_markov(release, 1, 2, rule, np.random.default_rng(0), pair_weight=1.5)


def test_pair_counts_of_a_class_with_fewer_candidates_use_its_own_layout():
    # class 0 has 4 candidates, class 1 only 3: class 1's pairs fill its own 3 x 2 / 2 columns, as pair_matrix
    # and the pair stage read them, and nothing lands in the columns only class 0 has
    counts = class_pair_counts([[10, 12], [21, 22], [20, 22]], [0, 1, 1],
                               [np.array([10, 11, 12, 13]), np.array([20, 21, 22])], pair_terms=2)
    assert counts.shape == (2, 6)
    assert counts[0].tolist() == [0, 1, 0, 0, 0, 0]  # (10, 12): positions (0, 2)
    np.testing.assert_array_equal(pair_matrix(counts[1, :3].astype(float), 3, 0.0),
                                  [[0, 0, 1], [0, 0, 1], [1, 1, 0]])  # (20, 22) and (21, 22)
    assert counts[1, 3:].sum() == 0


def test_pair_candidates_and_matrix():
    release = ClassRelease(np.array([4, 5, 6, 7]), np.array([1.0, 9.0, 3.0, 0.0]))
    assert pair_candidates(release, 2).tolist() == [5, 6]
    matrix = pair_matrix(np.array([5.0, 1.0, 7.0]), 3, floor=2.0)  # pairs (0,1), (0,2), (1,2)
    np.testing.assert_array_equal(matrix, [[0, 5, 0], [5, 0, 7], [0, 7, 0]])
    with pytest.raises(ConfigError):
        pair_matrix(np.zeros(4), 3, 0.0)


def test_pair_coherence_counts_pairs_that_share_a_document_of_the_class():
    reference = [["heart", "failure", "valve"], ["lung", "asthma"], ["heart", "lung"]]
    ref_labels = [0, 0, 1]
    # (heart, failure) yes; (failure, lung) no; (lung, asthma) yes; in class 1 (heart, lung) yes, (lung, asthma) no
    value = pair_coherence([["heart", "failure", "lung", "asthma"], ["heart", "lung", "asthma"]], [0, 1],
                           reference, ref_labels)
    assert value == pytest.approx(3 / 5)
    assert np.isnan(pair_coherence([["one"]], [0], reference, ref_labels))


# ------------------------------------------------------------------ the flow's stages, with real noise
def _config(tmp_path, **overrides):
    # the first-S Laplace histogram, named: the histogram methods' default is the Gaussian unit-l2 one
    values = dict(data="unused", out=str(tmp_path / "out"), labels=["0", "1", "2", "3"], method="histogram",
                  mechanism="laplace", vocab_top=20000, hist_top_k=40,
                  per_class=6, length=5, epsilon=4.0, gate=False, first_terms=4)
    values.update(overrides)
    return DpKpsConfig(**values)


def test_markov_stages_charge_each_stage_once_in_parallel_over_classes(tmp_path, tiny_corpus):
    cfg = _config(tmp_path, method="histogram-markov", markov_term_share=0.25, markov_pair_top=8)
    ledger = PrivacyLedger(str(tmp_path / "state"), "fingerprint", "run1")
    labels = [0, 1, 2, 3]  # class 3 is declared but empty: released from pure noise like the others
    plan = corpus_plan(tiny_corpus, tmp_path / "corpus")
    exact = scan_private_corpus.fn(plan, labels, cfg, term_counting(cfg)).counts
    terms = privatize_class_histograms.fn(exact, labels, cfg, ledger)
    pairs = privatize_class_pairs.fn(exact_pair_counts.fn(plan, labels, terms, cfg), labels, terms, cfg, ledger)
    entries = {e["name"]: e for e in ledger.entries()}
    assert sorted(entries) == sorted([f"histogram-class{c}" for c in range(4)] + [f"markov-class{c}" for c in range(4)])
    assert all(e["partition"] == e["name"].split("-")[1] for e in entries.values())
    assert entries["histogram-class0"]["sensitivity"] == 4.0  # S
    assert entries["markov-class0"]["sensitivity"] == 1.0  # S_2 = 2: one pair per document
    assert entries["histogram-class0"]["epsilon"] == pytest.approx(1.0)
    assert entries["markov-class0"]["epsilon"] == pytest.approx(3.0)
    assert ledger.total() == (pytest.approx(4.0), 0.0)
    assert all(len(t["term_ids"]) == 40 for t in terms)
    assert all(p["noisy"].shape == (28,) and len(p["pair_ids"]) == 8 for p in pairs)  # 8 * 7 / 2 pairs
    # re-running re-reads every value and charges nothing
    again = privatize_class_histograms.fn(exact, labels, cfg, ledger)
    assert all(np.array_equal(a["noisy"], b["noisy"]) for a, b in zip(again, terms))
    assert all(np.array_equal(a["noisy"], b["noisy"]) for a, b in
               zip(privatize_class_pairs.fn(exact_pair_counts.fn(plan, labels, terms, cfg), labels, terms, cfg,
                                            ledger), pairs))
    assert ledger.total() == (pytest.approx(4.0), 0.0)
    with pytest.raises(LedgerMismatchError):
        privatize_class_histograms.fn(exact, labels, _config(tmp_path, method="histogram-markov",
                                                             markov_term_share=0.25, hist_top_k=30), ledger)
    other = _config(tmp_path, method="histogram-markov", markov_term_share=0.25, markov_pair_top=8,
                    markov_pair_terms=3)
    with pytest.raises(LedgerMismatchError):  # another S_2 changes the pair release's sensitivity
        privatize_class_pairs.fn(exact_pair_counts.fn(plan, labels, terms, other), labels, terms, other, ledger)
    sequences = sample_histogram_sequences.fn(terms, pairs, labels, cfg)
    assert sequences.groupby("label").size().to_dict() == {0: 6, 1: 6, 2: 6, 3: 6}
    assert all(len(k) == 5 for k in sequences["keyphrases"])
    assert set(sequences.attrs["released_vocabulary"]) >= {t for k in sequences["keyphrases"] for t in k}


def test_released_pair_noise_is_laplace_of_the_pair_sensitivity(tmp_path, tiny_corpus):
    """(released - exact) pair counts through the flow's stage and the secure sampler: discrete Laplace of scale
    S_2 (S_2 - 1) / 2 / eps_2. Checked by hand: fails with half or twice the scale."""
    cfg = _config(tmp_path, method="histogram-markov", markov_term_share=0.5, markov_pair_top=40,
                  markov_pair_terms=3, epsilon=6.0)  # eps_2 = 3, sensitivity 3: scale 1
    labels = [0, 1, 2]
    ledger = PrivacyLedger(str(tmp_path / "state"), "fingerprint", "run1")
    plan = corpus_plan(tiny_corpus, tmp_path / "corpus")
    terms = privatize_class_histograms.fn(scan_private_corpus.fn(plan, labels, cfg, term_counting(cfg)).counts,
                                          labels, cfg, ledger)
    pairs = privatize_class_pairs.fn(exact_pair_counts.fn(plan, labels, terms, cfg), labels, terms, cfg, ledger)
    matcher = PhraseMatcher(_vocabulary(cfg))
    ids = [matcher.match(t) for t in tiny_corpus["text"]]
    exact = class_pair_counts(ids, tiny_corpus["label"].tolist(), [p["pair_ids"] for p in pairs], 3)
    noise = np.concatenate([p["noisy"] - exact[c] for c, p in enumerate(pairs)])
    assert noise.shape == (3 * 780,)
    assert_noise_is(noise, "discrete-laplace", 1.0)  # and refuted at half or twice the scale


def _vocabulary(cfg):
    from privseed.tasks.seeds.vocabulary import load_vocabulary

    return load_vocabulary(cfg.vocab, cfg.vocab_top)


def _noise_of_class0(tmp_path, tiny_corpus, vocab_file, epsilon):
    cfg = _config(tmp_path, vocab=str(vocab_file), hist_top_k=100_000, epsilon=epsilon)
    ledger = PrivacyLedger(str(tmp_path / f"state-{epsilon}"), "fingerprint", "run1")
    exact = scan_private_corpus.fn(corpus_plan(tiny_corpus, tmp_path / f"corpus-{epsilon}"), [0, 1, 2], cfg,
                                   term_counting(cfg)).counts
    released = privatize_class_histograms.fn(exact, [0, 1, 2], cfg, ledger)[0]
    assert len(released["term_ids"]) == exact.shape[1]  # K >= |V|: every noisy count is released
    return released["noisy_counts"] - exact[0, released["term_ids"]]


def test_released_class_histogram_noise_is_laplace_s_over_eps(tmp_path, tiny_corpus):
    """(released - exact) of one class's histogram, through the flow's stages and the secure sampler, is the
    discrete Laplace of scale S / eps (integer counts: tasks/dp/mechanisms.py's exact-on-integers Laplace).
    Checked by hand: the test fails when the mechanism adds half the scale, or no noise."""
    words = sorted({w for t in tiny_corpus["text"] for w in t.split()})
    vocab_file = tmp_path / "vocab.txt"
    vocab_file.write_text("\n".join(words + [f"filler{i}" for i in range(3000)]))
    noise = _noise_of_class0(tmp_path, tiny_corpus, vocab_file, epsilon=2.0)
    scale = 4 / 2.0  # S / eps
    assert_noise_is(noise, "discrete-laplace", scale)  # and the same sample refutes half or twice the scale


def test_noise_floor_is_the_count_pure_noise_reaches_in_m_entries_and_markov_ignores_pairs_below_it():
    from privseed.tasks.seeds.histogram_seeds import noise_floor

    mech = build_mechanism("laplace", 10, 5.0, 0.0)  # scale 2
    floor = noise_floor(mech, 10_000, 1.0)
    assert floor == pytest.approx(2.0 * np.log(5_000))
    draws = stats.laplace(scale=2.0).rvs(size=(200, 10_000), random_state=1)
    assert np.mean((draws >= floor).sum(axis=1)) == pytest.approx(1.0, abs=0.2)
    assert noise_floor(mech, 10_000, 0.0) == 0.0
    gauss = build_mechanism("gaussian", 4, 2.0, 1e-5)
    assert noise_floor(gauss, 1000, 1.0) == pytest.approx(gauss.scale * stats.norm.isf(1e-3))
    assert pair_mechanism("laplace", 3, 1.5, 0.0).scale == pytest.approx(2.0)  # 3 pairs / 1.5
    assert pair_mechanism("gaussian", 3, 1.5, 1e-5).sensitivity == pytest.approx(np.sqrt(3))
    # a pair count below the floor is 0: the chain then draws from the class distribution
    release = ClassRelease(np.array([5, 6, 7]), np.array([1.0, 0.0, 100.0]), pair_ids=np.array([5, 6]),
                           pair_weights=pair_matrix(np.array([2.0]), 2, floor=3.0))
    ids = sample_markov(release, 200, 2, SelectionRule.parse("power-1"), np.random.default_rng(0), pair_weight=1.0)
    assert not (ids == 6).any()


def test_every_method_shares_one_vocabulary_cut_and_the_budget_rules():
    # One default for every sampler (chosen on held-out public data, docs/dpkps.md); an explicit cut always wins.
    for method in ("histogram", "histogram-markov", "independent"):
        assert DpKpsConfig(data="d", out="o", labels=["a"], method=method).vocab_top == 50_000
    assert DpKpsConfig(data="d", out="o", labels=["a"], method="histogram", vocab_top=20_000).vocab_top == 20_000
    cfg = DpKpsConfig(data="d", out="o", labels=["a"], method="histogram", eps_voc=1.0, eps_kde=5.0)
    assert cfg.histogram_epsilon == 6.0
    assert DpKpsConfig(data="d", out="o", labels=["a"], method="histogram", epsilon=4.0).histogram_epsilon == 4.0
    with pytest.raises(ValueError, match="--epsilon applies to --method histogram"):  # not read by the samplers
        DpKpsConfig(data="d", out="o", labels=["a"], method="independent", epsilon=4.0)
    with pytest.raises(ValueError):
        DpKpsConfig(data="d", out="o", labels=["a"], method="histogram", epsilon=0.0)


@pytest.mark.slow
def test_cli_histogram_markov_release_end_to_end(prefect_harness, corpus_file, tmp_path):
    """The command line, a real (ephemeral) Prefect API and a LocalCluster: ledger total, layout, re-run."""
    import json

    from privseed.flows.cli import main
    from privseed.tasks.data.corpus import read_release

    out = tmp_path / "out"
    argv = ["dpkps", corpus_file, "--out", str(out), "--method", "histogram-markov", "--epsilon", "3",
            "--hist-top-k", "20", "--per-class", "4", "--length", "5", "--llm", "none", "--no-gate", "--workers", "1",
            "--labels", "0,1,2"]
    assert main(argv) == 0
    ledger = json.loads((out / "ledger.json").read_text())
    assert ledger["total"]["epsilon"] == pytest.approx(3.0)
    # --hist-contribution is left auto: the corpus profile settles it, at its own share of the same total
    assert {e["name"].split("-")[0] for e in ledger["entries"]} == {"corpus", "histogram", "markov"}
    assert all(e["secure"] and e["noise_source"] == "opendp" for e in ledger["entries"])  # OpenDP, not a seed
    _, synthetic = read_release(str(out))
    assert synthetic.groupby("label").size().tolist() == [4, 4, 4]
    assert all(len(k) == 5 and row == " ".join(k) for k, row in zip(synthetic["keyphrases"], synthetic["text"]))
    # a resume under the same run id re-reads every drawn value and charges nothing new
    assert main([*argv, "--run-id", ledger["run_id"]]) == 0
    assert json.loads((out / "ledger.json").read_text())["entries"] == ledger["entries"]


def test_unit_l2_contribution_counts_every_distinct_term_at_norm_one_in_its_class_row():
    from privseed.tasks.seeds.histogram_seeds import build_mechanism, contribution_weights
    from privseed.tasks.seeds.seed_methods import CONTRIBUTIONS

    unit_l2 = CONTRIBUTIONS["unit-l2"]
    long_doc = list(range(40)) * 3  # 40 distinct terms, each repeated: far more than S
    weights = contribution_weights(unit_l2, [long_doc, [5], []], [1, 0, 2], n_classes=3, vocab_size=50, max_terms=10)
    assert weights.dtype == np.float64 and weights.shape == (3, 50)
    assert np.allclose(weights[1, :40], 1 / np.sqrt(40)) and not weights[1, 40:].any()
    assert weights[0, 5] == 1.0 and not weights[2].any()  # no term of V: no contribution
    # removing any one document moves the matrix by exactly 1 in L2 norm, however long it is
    without = contribution_weights(unit_l2, [[5], []], [0, 2], n_classes=3, vocab_size=50, max_terms=10)
    assert np.linalg.norm(weights - without) == pytest.approx(1.0)
    mechanism = build_mechanism("gaussian", 10, 2.0, 1e-6, contribution="unit-l2")
    assert mechanism.sensitivity == 1.0  # not sqrt(S), not sqrt(40)
    with pytest.raises(ConfigError, match="no bounded L1"):
        build_mechanism("laplace", 10, 2.0, 0.0, contribution="unit-l2")


def test_unit_l2_needs_the_gaussian_mechanism_and_pass_1_counts_whole_documents(tmp_path):
    from privseed.tasks.seeds.passes import TermCounting

    with pytest.raises(ValueError, match="--mechanism gaussian"):
        DpKpsConfig(data="d.parquet", out=str(tmp_path / "o"), labels=["a", "b"], method="histogram",
                    mechanism="laplace", hist_contribution="unit-l2")
    counting = TermCounting("english", 20_000, first_terms=2, per_class=True, contribution="unit-l2")
    text = "football club player scored goals league season"
    counts = counting.count([text], [0], n_classes=1)
    first = TermCounting("english", 20_000, first_terms=2, per_class=True).count([text], [0], n_classes=1)
    assert first.sum() == 2 and (counts > 0).sum() == 7
    assert np.linalg.norm(counts) == pytest.approx(1.0)


def test_rank_rare_l2_lowers_the_common_words_and_keeps_norm_one():
    from privseed.tasks.seeds.histogram_seeds import common_word_weights
    from privseed.tasks.seeds.passes import TermCounting
    from privseed.tasks.seeds.vocabulary import english_vocabulary

    factors = common_word_weights(5000, 2000, 2.0)
    assert factors[0] == pytest.approx((1 / 2000) ** 2) and factors[999] == pytest.approx(0.25)
    assert np.all(factors[1999:] == 1.0) and np.all(np.diff(factors) >= 0)
    with pytest.raises(ConfigError, match="rank >= 1"):
        common_word_weights(10, 0, 2.0)
    # the same document: its common words ("long", "term", "study") lose weight to its rare ones, norm still 1
    text = "long term study of catheter related sepsis"
    vocab = english_vocabulary(50_000)
    rare = TermCounting("english", 50_000, first_terms=2, per_class=True, contribution="rank-rare-l2").count(
        [text], [0], n_classes=1)[0]
    plain = TermCounting("english", 50_000, first_terms=2, per_class=True, contribution="rank-l2").count(
        [text], [0], n_classes=1)[0]
    assert np.linalg.norm(rare) == pytest.approx(1.0) and set(np.flatnonzero(rare)) == set(np.flatnonzero(plain))
    ids = {t: vocab.terms.index(t) for t in ("long", "study", "catheter", "sepsis")}
    assert ids["long"] < 2000 <= ids["catheter"]  # public English frequency ranks
    assert rare[ids["long"]] < plain[ids["long"]] / 10 and rare[ids["sepsis"]] > plain[ids["sepsis"]]
    # rank-l2 times the factors, renormalised: the factors' ratio between two terms is the ratio of their weights
    a, b = ids["long"], ids["sepsis"]
    assert (rare[a] / rare[b]) / (plain[a] / plain[b]) == pytest.approx(factors[a] / 1.0)


def test_rank_l2_contribution_leans_on_the_first_terms_at_norm_one_in_reading_order():
    from privseed.tasks.seeds.histogram_seeds import build_mechanism, class_rank_l2_weights, rank_l2_weights
    from privseed.tasks.seeds.passes import TermCounting

    assert np.allclose(rank_l2_weights(3, 0.0), 1 / np.sqrt(3))  # decay 0 is unit-l2
    w = rank_l2_weights(40, 0.5)
    assert np.linalg.norm(w) == pytest.approx(1.0) and np.all(np.diff(w) < 0)
    assert w[0] / w[3] == pytest.approx(2.0)  # 1/sqrt(1) against 1/sqrt(4)
    doc = [7, 3, 7, 9, 3, 1]  # distinct in reading order: 7, 3, 9, 1
    weights = class_rank_l2_weights([doc, []], [1, 0], n_classes=2, vocab_size=10, decay=0.5)
    assert np.allclose(weights[1, [7, 3, 9, 1]], rank_l2_weights(4, 0.5)) and not weights[0].any()
    assert np.linalg.norm(weights) == pytest.approx(1.0)
    assert build_mechanism("gaussian", 10, 2.0, 1e-6, contribution="rank-l2").sensitivity == 1.0
    with pytest.raises(ConfigError, match="no bounded L1"):
        build_mechanism("laplace", 10, 2.0, 0.0, contribution="rank-l2")
    with pytest.raises(ValueError, match="rank-l2 bounds a document's L2 norm only"):
        DpKpsConfig(data="d.parquet", out="o", labels=["a", "b"], method="histogram", mechanism="laplace",
                    hist_contribution="rank-l2")
    text = "football club player scored goals league season"
    counts = TermCounting("english", 20_000, first_terms=2, per_class=True, contribution="rank-l2").count(
        [text], [0], n_classes=1)
    row = counts[0][counts[0] > 0]
    assert row.size == 7 and np.linalg.norm(counts) == pytest.approx(1.0) and row.max() / row.min() > 2


def test_every_contribution_is_one_registry_entry_the_cli_offers():
    import typing

    from privseed.tasks.seeds.histogram_seeds import contribution_sensitivity
    from privseed.tasks.seeds.seed_methods import CONTRIBUTIONS, contribution_kind

    offered = typing.get_args(DpKpsConfig.model_fields["hist_contribution"].annotation)
    assert set(offered) == set(CONTRIBUTIONS) | {"auto"}  # auto: the corpus profile's choice
    assert [c.whole_document for c in CONTRIBUTIONS.values()] == [False, True, True, True, True]
    assert contribution_sensitivity(contribution_kind("first-terms"), 10).l1 == 10
    with pytest.raises(ConfigError, match="unknown contribution"):
        contribution_kind("half-l2")


def test_a_class_that_released_too_few_terms_draws_the_rest_from_every_class_release():
    """Issue 48: the thresholded histogram on a small class releases few or no terms; its seeds repeated and the
    gate refused the release after the budget was spent. Now such a class fills its draws from the pooled release
    (post-processing), and a class with enough terms is left as it was."""
    from privseed.tasks.seeds.histogram_seeds import (ClassRelease, released_support, sample_class_sequences,
                                                      short_release_fallback)
    from privseed.tasks.seeds.sampling import SelectionRule

    full = ClassRelease(np.arange(10, 20), np.linspace(1.0, 2.0, 10))
    two = ClassRelease(np.array([30, 31, 32]), np.array([5.0, 4.0, 0.0]))
    empty = ClassRelease(np.array([40, 41]), np.zeros(2))
    assert [released_support(r) for r in (full, two, empty)] == [10, 2, 0]
    assert short_release_fallback(full, 5) is full
    assert short_release_fallback(two, 5).background_share == pytest.approx(0.6)
    assert short_release_fallback(empty, 5).background_share == 1.0
    sequences = sample_class_sequences("histogram", [full, two, empty], 50, 5, SelectionRule.parse("power-1"),
                                       np.random.default_rng(0))
    pooled = set(range(10, 20)) | {30, 31}
    assert {t for seq in sequences[2] for t in seq} <= pooled  # the empty class: only released terms of others
    assert {t for seq in sequences[1] for t in seq} - {30, 31}  # the short class draws beyond its own two terms
    assert len({tuple(seq) for seq in sequences[1]}) > 40  # and its 50 seeds no longer repeat
    with pytest.raises(ConfigError, match="no class released any term"):
        sample_class_sequences("histogram", [empty], 5, 5, SelectionRule.parse("power-1"), np.random.default_rng(0))


def test_typicality_margin_is_own_class_likelihood_over_the_closest_other():
    ids = [[[1, 2, 3], [1, 5, 6], [7, 8, 9], [1, 2, 9]], [[7, 8, 9], [7, 8, 1], [4, 4, 4], [2, 8, 9]]]
    margins = typicality_margins(ids)
    # terms 1..9, add-one over 9 terms: class 0 holds 12 terms, class 1 holds 12 terms
    counts = np.ones((2, 9))
    for c, sequences in enumerate(ids):
        for seq in sequences:
            for t in seq:
                counts[c, t - 1] += 1
    log_p = np.log(counts / counts.sum(axis=1, keepdims=True))
    for c, sequences in enumerate(ids):
        for seq, margin in zip(sequences, margins[c]):
            own, other = (log_p[k, [t - 1 for t in seq]].sum() for k in (c, 1 - c))
            assert margin == pytest.approx(own - other)
    assert margins[0][2] < 0  # a class-0 sequence of class 1's terms reads as class 1


def test_most_typical_keeps_the_clearest_sequences_of_each_class_in_drawn_order():
    ids = [[[1, 2, 3], [1, 5, 6], [7, 8, 9], [1, 2, 9]], [[7, 8, 9], [7, 8, 1], [4, 4, 4], [2, 8, 9]]]
    assert most_typical(ids, 2) == [[[1, 2, 3], [1, 5, 6]], [[7, 8, 9], [4, 4, 4]]]
    assert most_typical(ids, 4) == ids and most_typical(ids, 9) == ids  # a class no larger than keep: as drawn
    assert most_typical([[[1, 1]], [[2, 2], [1, 1], [2, 3]]], 1) == [[[1, 1]], [[2, 2]]]


def test_sampled_pool_keeps_per_class_sequences_that_read_most_as_their_class(tmp_path, tiny_corpus):
    """The stage samples --hist-seed-pool sequences a class and keeps --per-class: the kept ones are the pool's
    most typical (their margins are the pool's largest), and a pool no larger than --per-class is the old draw."""
    labels = [0, 1, 2, 3]
    ledger = PrivacyLedger(str(tmp_path / "state"), "fingerprint", "run1")
    cfg = _config(tmp_path, hist_seed_pool=60)
    plan = corpus_plan(tiny_corpus, tmp_path / "corpus")
    terms = privatize_class_histograms.fn(scan_private_corpus.fn(plan, labels, cfg, term_counting(cfg)).counts,
                                          labels, cfg, ledger)
    kept = sample_histogram_sequences.fn(terms, None, labels, cfg)
    assert kept.groupby("label").size().to_dict() == {0: 6, 1: 6, 2: 6, 3: 6}
    whole = sample_histogram_sequences.fn(terms, None, labels, _config(tmp_path, hist_seed_pool=60, per_class=60))
    pool = [[list(k) for k in whole.loc[whole["label"] == c, "keyphrases"]] for c in labels]
    index = {t: i for i, t in enumerate(sorted({t for c in pool for s in c for t in s}))}
    margins = typicality_margins([[[index[t] for t in s] for s in c] for c in pool])
    for c in labels:
        chosen = [list(k) for k in kept.loc[kept["label"] == c, "keyphrases"]]
        at = [pool[c].index(s) for s in chosen]
        assert min(margins[c][at]) >= np.sort(margins[c])[-6]  # the six largest margins of the pool
    as_drawn = sample_histogram_sequences.fn(terms, None, labels, _config(tmp_path, hist_seed_pool=1))
    unpooled = sample_histogram_sequences.fn(terms, None, labels, _config(tmp_path, hist_seed_pool=6))
    assert [list(k) for k in as_drawn["keyphrases"]] == [list(k) for k in unpooled["keyphrases"]]
    assert [list(k) for k in as_drawn["keyphrases"]] != [list(k) for k in kept["keyphrases"]]
    # the pool's naive Bayes goes with the kept seeds when an LLM writes from them, to judge its documents; a
    # release as drawn, or one without an LLM, has none
    written = sample_histogram_sequences.fn(terms, None, labels, _config(tmp_path, hist_seed_pool=60, llm="local"))
    assert [list(k) for k in written["keyphrases"]] == [list(k) for k in kept["keyphrases"]]
    judge = written.attrs[SEED_POOL_CLASSES]
    assert judge.labels == tuple(labels) and judge.counts.sum() == sum(len(k) for k in whole["keyphrases"])
    assert SEED_POOL_CLASSES not in kept.attrs and SEED_POOL_CLASSES not in as_drawn.attrs


def test_the_pool_judges_the_documents_only_where_the_classes_are_not_alike():
    """Classes with terms of their own get the pool's naive Bayes (all of its sequences); classes that release the
    same terms in about the same proportions keep the kept seeds' own (None)."""
    pool = [[["doctor", "clinic"]] * 30, [["pasta", "menu"]] * 30]
    apart = [ClassRelease(np.array([1, 2]), np.array([5.0, 4.0])), ClassRelease(np.array([3, 4]), np.array([5.0, 4.0]))]
    judge = pool_judge(apart, ["health", "food"], pool)
    assert judge is not None and judge.rows.tolist() == [30, 30] and judge.own_words("food") == ("menu", "pasta")
    alike = [ClassRelease(np.array([1, 2]), np.array([5.0, 4.0])), ClassRelease(np.array([1, 2]), np.array([4.0, 4.0]))]
    assert pool_judge(alike, ["health", "food"], pool) is None


def test_most_typical_passes_over_repeats_while_other_sequences_are_left():
    ids = [[[1, 1], [1, 1], [1, 2], [3, 3]], [[3, 3], [3, 4], [4, 4]]]
    assert most_typical(ids, 2)[0] == [[1, 1], [1, 2]]  # not [1, 1] twice
    assert most_typical([[[1, 1], [1, 1], [1, 1]], [[2, 2]]], 2)[0] == [[1, 1], [1, 1]]  # nothing else to keep


def test_an_auto_seed_pool_is_500_a_class_or_per_class_when_that_is_more():
    assert [seed_pool(n, "auto") for n in (1, 20, 100, 500, 10_000)] == [500, 500, 500, 500, 10_000]
    assert seed_pool(20, 200) == 200 and seed_pool(20, 5) == 20  # a given pool; never under --per-class
