"""The histogram seed methods: counting, sensitivity, budget split, samplers, coherence, and the noise the flow's
stages actually release (KS test against Laplace(S / eps) through the secure sampler)."""

import numpy as np
import pytest
from scipy import stats

from tasks.config import DpKpsConfig
from tasks.errors import ConfigError, LedgerMismatchError
from tasks.histogram_seeds import (
    ClassRelease,
    class_pair_counts,
    class_term_counts,
    first_distinct_terms,
    l1_sensitivity,
    l2_sensitivity,
    pair_coherence,
    sample_independent,
    sample_markov,
    stage_budgets,
)
from tasks.ledger import PrivacyLedger
from tasks.sampling import SelectionRule
from tasks.stages.corpus import scan_private_corpus
from tasks.stages.dpkps import term_counting
from tasks.stages.histogram import (
    exact_pair_counts,
    privatize_class_histograms,
    privatize_class_pairs,
    sample_histogram_sequences,
)
from tasks.vocabulary import PhraseMatcher, Vocabulary
from tests.conftest import corpus_plan


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


@pytest.mark.parametrize("s", [1, 3, 10])
def test_one_document_moves_only_its_class_by_at_most_s(s):
    rng = np.random.default_rng(0)
    vocab_size, n_classes = 30, 3
    docs = [rng.integers(0, vocab_size, size=rng.integers(0, 25)).tolist() for _ in range(40)]
    classes = rng.integers(0, n_classes, size=40).tolist()
    released = [rng.choice(vocab_size, size=12, replace=False) for _ in range(n_classes)]
    base = class_term_counts(docs, classes, n_classes, vocab_size, s)
    base_starts, base_pairs = class_pair_counts(docs, classes, released, s)
    for _ in range(50):
        doc = rng.integers(0, vocab_size, size=rng.integers(0, 40)).tolist()
        c = int(rng.integers(0, n_classes))
        diff = class_term_counts(docs + [doc], classes + [c], n_classes, vocab_size, s) - base
        assert np.abs(diff).sum() <= l1_sensitivity(s) and np.linalg.norm(diff) <= l2_sensitivity(s) + 1e-12
        assert np.abs(np.delete(diff, c, axis=0)).sum() == 0  # parallel composition: other classes untouched
        starts, pairs = class_pair_counts(docs + [doc], classes + [c], released, s)
        joint = np.concatenate([(starts - base_starts).ravel(), (pairs - base_pairs).ravel()])
        assert np.abs(joint).sum() <= l1_sensitivity(s) and np.linalg.norm(joint) <= l2_sensitivity(s) + 1e-12
        assert np.abs(np.delete(pairs - base_pairs, c, axis=0)).sum() == 0


def test_pair_counts_follow_the_reduced_reading_order():
    released = [np.array([10, 20, 30, 40])]
    starts, pairs = class_pair_counts([[5, 20, 7, 10, 20, 40, 30]], [0], released, max_terms=3)
    # reduced to released terms, distinct, first 3: 20, 10, 40 -> start 20, pairs (20, 10), (10, 40)
    assert starts[0].tolist() == [0, 1, 0, 0]
    expected = np.zeros((4, 4), dtype=int)
    expected[1, 0] = expected[0, 3] = 1
    np.testing.assert_array_equal(pairs[0], expected)


def test_budget_split_adds_up_and_refuses_bad_shares():
    assert stage_budgets("histogram", 11.0, 0.0, 0.5) == [(11.0, 0.0)]
    (e1, d1), (e2, d2) = stage_budgets("histogram-markov", 6.0, 1e-5, 0.7)
    assert e1 + e2 == pytest.approx(6.0) and e1 == pytest.approx(4.2) and d1 + d2 == pytest.approx(1e-5)
    with pytest.raises(ConfigError):
        stage_budgets("histogram-markov", 6.0, 0.0, 1.0)
    with pytest.raises(ConfigError):
        stage_budgets("independent", 6.0, 0.0, 0.5)


# ------------------------------------------------------------------ samplers
def test_independent_sampler_draws_in_proportion_to_clipped_counts():
    release = ClassRelease(term_ids=np.array([7, 8, 9, 3]), noisy_counts=np.array([30.0, 10.0, -5.0, 0.0]))
    ids = sample_independent(release, 4000, 10, SelectionRule.parse("power-1"), np.random.default_rng(1))
    assert ids.shape == (4000, 10) and set(np.unique(ids)) == {7, 8}  # clipped-to-zero terms are never drawn
    share = np.mean(ids == 7)
    assert share == pytest.approx(0.75, abs=0.01)
    squared = sample_independent(release, 4000, 10, SelectionRule.parse("power-2"), np.random.default_rng(1))
    assert np.mean(squared == 7) == pytest.approx(0.9, abs=0.01)


def test_markov_sampler_walks_released_pairs_without_repeats_and_falls_back_to_counts():
    k = 5
    pairs = np.zeros((k, k))
    pairs[0, 2] = pairs[2, 4] = 5.0  # chain 0 -> 2 -> 4, then nothing: fall back to the term counts
    starts = np.array([9.0, -1.0, 0.0, 0.0, 0.0])
    counts = np.array([1.0, 50.0, 1.0, 1.0, 1.0])
    release = ClassRelease(np.array([100, 101, 102, 103, 104]), counts, starts, pairs)
    ids = sample_markov(release, 200, 4, SelectionRule.parse("power-1"), np.random.default_rng(0))
    assert (ids[:, :3] == [100, 102, 104]).all()
    assert np.mean(ids[:, 3] == 101) > 0.9  # the heaviest unused term of the class
    assert all(len(set(row)) == 4 for row in ids.tolist())
    short = sample_markov(release, 3, 8, SelectionRule.parse("power-1"), np.random.default_rng(0))
    assert (short[:, 5:] == -1).all() and all(len(set(r[:5])) == 5 for r in short.tolist())
    with pytest.raises(ConfigError):
        sample_markov(ClassRelease(release.term_ids, counts), 1, 2, SelectionRule.parse("power-1"),
                      np.random.default_rng(0))


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
    values = dict(data="unused", out=str(tmp_path / "out"), labels=["0", "1", "2", "3"], method="histogram",
                  vocab_top=20000, hist_top_k=40,
                  per_class=6, length=5, epsilon=4.0, gate=False, first_terms=4)
    values.update(overrides)
    return DpKpsConfig(**values)


def test_markov_stages_charge_each_stage_once_in_parallel_over_classes(tmp_path, tiny_corpus):
    cfg = _config(tmp_path, method="histogram-markov", markov_term_share=0.25)
    ledger = PrivacyLedger(str(tmp_path / "state"), "fingerprint", "run1")
    labels = [0, 1, 2, 3]  # class 3 is declared but empty: released from pure noise like the others
    plan = corpus_plan(tiny_corpus, tmp_path / "corpus")
    exact = scan_private_corpus.fn(plan, labels, cfg, term_counting(cfg)).counts
    terms = privatize_class_histograms.fn(exact, labels, cfg, ledger)
    pairs = privatize_class_pairs.fn(*exact_pair_counts.fn(plan, labels, terms, cfg), labels, terms, cfg, ledger)
    entries = {e["name"]: e for e in ledger.entries()}
    assert sorted(entries) == sorted([f"histogram-class{c}" for c in range(4)] + [f"markov-class{c}" for c in range(4)])
    assert all(e["sensitivity"] == 4.0 and e["partition"] == e["name"].split("-")[1] for e in entries.values())
    assert entries["histogram-class0"]["epsilon"] == pytest.approx(1.0)
    assert entries["markov-class0"]["epsilon"] == pytest.approx(3.0)
    assert ledger.total() == (pytest.approx(4.0), 0.0)
    assert all(len(t["term_ids"]) == 40 for t in terms) and pairs[0]["noisy_pairs"].shape == (40, 40)
    # re-running re-reads every value and charges nothing
    again = privatize_class_histograms.fn(exact, labels, cfg, ledger)
    assert all(np.array_equal(a["noisy_counts"], b["noisy_counts"]) for a, b in zip(again, terms))
    assert ledger.total() == (pytest.approx(4.0), 0.0)
    with pytest.raises(LedgerMismatchError):
        privatize_class_histograms.fn(exact, labels, _config(tmp_path, method="histogram-markov",
                                                             markov_term_share=0.25, hist_top_k=30), ledger)
    sequences = sample_histogram_sequences.fn(terms, pairs, labels, cfg)
    assert sequences.groupby("label").size().to_dict() == {0: 6, 1: 6, 2: 6, 3: 6}
    assert all(len(k) == 5 and len(set(k)) == 5 for k in sequences["keyphrases"])
    assert set(sequences.attrs["released_vocabulary"]) >= {t for k in sequences["keyphrases"] for t in k}


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
    discrete Laplace of scale S / eps (integer counts: tasks/mechanisms.py's exact-on-integers Laplace).
    Checked by hand: the test fails when the mechanism adds half the scale, or no noise."""
    words = sorted({w for t in tiny_corpus["text"] for w in t.split()})
    vocab_file = tmp_path / "vocab.txt"
    vocab_file.write_text("\n".join(words + [f"filler{i}" for i in range(3000)]))
    noise = _noise_of_class0(tmp_path, tiny_corpus, vocab_file, epsilon=2.0)
    scale = 4 / 2.0  # S / eps
    # KS needs a continuous law: K + U(0, 1) has the exact CDF F(x) = P(K <= floor(x) - 1) + frac(x) P(K = floor(x))
    jittered = noise + np.random.default_rng(0).random(noise.shape)

    def cdf(law):
        return lambda x: law.cdf(np.floor(x) - 1) + (x - np.floor(x)) * law.pmf(np.floor(x))

    law = stats.dlaplace(1.0 / scale)
    assert stats.kstest(jittered, cdf(law)).pvalue > 1e-3
    assert np.var(noise) == pytest.approx(law.var(), rel=0.15)
    # the same sample is rejected against half or twice the scale
    for wrong in (scale / 2, scale * 2):
        assert stats.kstest(jittered, cdf(stats.dlaplace(1.0 / wrong))).pvalue < 1e-6


def test_noise_floor_is_the_count_pure_noise_reaches_in_m_entries_and_markov_ignores_pairs_below_it():
    from tasks.histogram_seeds import build_mechanism, noise_floor

    mech = build_mechanism("laplace", 10, 5.0, 0.0)  # scale 2
    floor = noise_floor(mech, 10_000, 1.0)
    assert floor == pytest.approx(2.0 * np.log(5_000))
    draws = stats.laplace(scale=2.0).rvs(size=(200, 10_000), random_state=1)
    assert np.mean((draws >= floor).sum(axis=1)) == pytest.approx(1.0, abs=0.2)
    assert noise_floor(mech, 10_000, 0.0) == 0.0
    gauss = build_mechanism("gaussian", 4, 2.0, 1e-5)
    assert noise_floor(gauss, 1000, 1.0) == pytest.approx(gauss.scale * stats.norm.isf(1e-3))
    pairs = np.zeros((3, 3))
    pairs[0, 1] = 2.0  # below the floor: ignored, the next term comes from the stage-1 counts
    release = ClassRelease(np.array([5, 6, 7]), np.array([1.0, 1.0, 100.0]), np.array([9.0, 0.0, 0.0]), pairs,
                           pair_floor=3.0)
    ids = sample_markov(release, 50, 2, SelectionRule.parse("power-1"), np.random.default_rng(0))
    assert (ids[:, 0] == 5).all() and np.mean(ids[:, 1] == 7) > 0.9


def test_histogram_methods_default_to_the_smaller_vocabulary_cut_unless_given():
    assert DpKpsConfig(data="d", out="o", labels=["a"], method="histogram").vocab_top == 20_000
    markov = DpKpsConfig(data="d", out="o", labels=["a"], method="histogram-markov", vocab_top=50_000)
    assert markov.vocab_top == 50_000
    assert DpKpsConfig(data="d", out="o", labels=["a"], method="independent").vocab_top == 50_000
    cfg = DpKpsConfig(data="d", out="o", labels=["a"], method="histogram", eps_voc=1.0, eps_kde=5.0)
    assert cfg.histogram_epsilon == 6.0
    assert DpKpsConfig(data="d", out="o", labels=["a"], epsilon=4.0).histogram_epsilon == 4.0
    with pytest.raises(ValueError):
        DpKpsConfig(data="d", out="o", labels=["a"], method="histogram", epsilon=0.0)


@pytest.mark.slow
def test_cli_histogram_markov_release_end_to_end(prefect_harness, corpus_file, tmp_path):
    """The command line, a real (ephemeral) Prefect API and a LocalCluster: ledger total, layout, re-run."""
    import json

    from flows.cli import main
    from tasks.corpus import read_release

    out = tmp_path / "out"
    argv = ["dpkps", corpus_file, "--out", str(out), "--method", "histogram-markov", "--epsilon", "3",
            "--hist-top-k", "20", "--per-class", "4", "--length", "5", "--llm", "none", "--no-gate", "--workers", "1",
            "--labels", "0,1,2"]
    assert main(argv) == 0
    ledger = json.loads((out / "ledger.json").read_text())
    assert ledger["total"]["epsilon"] == pytest.approx(3.0)
    assert {e["name"].split("-")[0] for e in ledger["entries"]} == {"histogram", "markov"}
    assert all(e["secure"] and e["noise_source"] == "opendp" for e in ledger["entries"])  # OpenDP, not a seed
    _, synthetic = read_release(str(out))
    assert synthetic.groupby("label").size().tolist() == [4, 4, 4]
    assert all(len(k) == 5 and row == " ".join(k) for k, row in zip(synthetic["keyphrases"], synthetic["text"]))
    # a resume under the same run id re-reads every drawn value and charges nothing new
    assert main([*argv, "--run-id", ledger["run_id"]]) == 0
    assert json.loads((out / "ledger.json").read_text())["entries"] == ledger["entries"]
