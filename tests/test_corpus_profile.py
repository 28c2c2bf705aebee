"""The corpus profile (tasks/seeds/corpus_profile.py): the small DP statistic the histogram methods' defaults adapt
to, its rule, its ledger stage, and its noise in a real flow."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from privseed.tasks.config.commands import DpKpsConfig
from privseed.tasks.dp.ledger import PrivacyLedger
from privseed.tasks.errors import ConfigError
from privseed.tasks.seeds.corpus_profile import (AFTER_RELEASE_OPTIONS, ALIKE_CLASSES, BROAD_RELEASE,
                                                 FEW_MEDIAN_TERMS, FEW_SETTINGS, answer_words_for,
                                                 LENGTH_EDGES, LONG_MEDIAN_TERMS, LONG_SETTINGS, PROFILE_SHARE,
                                                 RELEASE_TOP_K, SHORT_SETTINGS, CorpusProfile, adaptive_settings,
                                                 asks_for_profile, class_alikeness, class_length_counts,
                                                 counted_contributions, length_bin, planned_settings, profile_budget,
                                                 profile_mechanism, release_breadth, resolve_settings,
                                                 settings_after_release,
                                                 settings_arrays, settings_from_arrays, split_profiled_counts,
                                                 temperature_after_release, ALIKE_TEMPERATURE)
from privseed.tasks.seeds.histogram_seeds import ClassRelease

B = len(LENGTH_EDGES)


def _profile_at(median_terms: float, documents: int = 1000, classes: int = 4) -> CorpusProfile:
    """A noiseless profile whose documents all sit in the bin of ``median_terms``, spread over the classes."""
    noisy = np.zeros((classes, B))
    noisy[:, length_bin(int(median_terms))] = documents / classes
    return CorpusProfile(noisy)


# ------------------------------------------------------------------ the pure functions
def test_length_bins_and_exact_counts():
    assert [length_bin(n) for n in (0, 3, 4, 11, 12, 511, 512, 10_000)] == [0, 0, 1, 2, 3, 13, 14, 14]
    counts = class_length_counts([0, 5, 5, 600], [0, 1, 1, 0], n_classes=3)
    assert counts.shape == (3, B) and counts.dtype == np.int64
    assert counts[0, 0] == 1 and counts[0, B - 1] == 1 and counts[1, 1] == 2 and counts.sum() == 4
    with pytest.raises(ConfigError):
        length_bin(-1)


def test_one_document_moves_one_cell_by_one():
    """The sensitivity the mechanism is calibrated to: add/remove one document changes the (classes, B) matrix by
    exactly 1 in L1 (and L2) norm, whatever its length and label."""
    rng = np.random.default_rng(0)
    lengths, classes = rng.integers(0, 900, size=200), rng.integers(0, 5, size=200)
    full = class_length_counts(lengths, classes, 5)
    for drop in range(0, 200, 17):
        keep = np.arange(200) != drop
        moved = full - class_length_counts(lengths[keep], classes[keep], 5)
        assert np.abs(moved).sum() == 1
    assert profile_mechanism(0.5).scale == pytest.approx(2.0)  # Laplace(1 / eps): L1 sensitivity 1


def test_budget_adds_up_to_the_declared_epsilon():
    (eps_p, delta_p), (eps_rest, delta_rest) = profile_budget(11.0, 7e-8)
    assert eps_p == pytest.approx(11.0 * PROFILE_SHARE) and delta_p == 0.0
    assert eps_p + eps_rest == pytest.approx(11.0) and delta_rest == 7e-8
    with pytest.raises(ConfigError):
        profile_budget(0.0, 1e-6)


def test_median_read_off_the_histogram():
    profile = CorpusProfile(np.array([[0, 0, 0, 0, 0, 10, 10, 0, 0, 0, 0, 0, 0, 0, 0]], dtype=float))
    assert profile.length_quantile(0.5) == pytest.approx(32.0)  # the edge between the two filled bins
    assert 24 <= profile.length_quantile(0.25) <= 32
    negative = CorpusProfile(-np.ones((2, B)))  # noise may leave no mass: a length of 0, never an error
    assert negative.length_quantile(0.5) == 0.0 and negative.class_sizes.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("median, expected", [(6, FEW_SETTINGS), (11, FEW_SETTINGS), (19, SHORT_SETTINGS),
                                              (29, SHORT_SETTINGS),
                                              (LONG_MEDIAN_TERMS + 10, LONG_SETTINGS), (150, LONG_SETTINGS)])
def test_the_rule_follows_the_released_length(median, expected):
    derived = adaptive_settings(_profile_at(median))
    assert (derived.contribution, derived.top_k, derived.length) == expected
    assert 40 <= derived.answer_words <= 400


def test_answer_length_grows_with_the_documents():
    short, long = adaptive_settings(_profile_at(20)), adaptive_settings(_profile_at(150))
    assert short.answer_words < long.answer_words


def test_an_explicit_option_wins_over_the_rule():
    derived = adaptive_settings(_profile_at(150))
    given = {"hist_contribution": "unit-l2", "hist_top_k": "auto", "length": 12}
    assert resolve_settings(given, derived) == {"hist_contribution": "unit-l2", "hist_top_k": derived.top_k,
                                                "length": 12}
    assert asks_for_profile(given)
    assert not asks_for_profile({"hist_contribution": "rank-l2", "hist_top_k": 300, "length": 10})
    assert planned_settings(given)["length"] == 12 and planned_settings(given)["hist_top_k"] == LONG_SETTINGS[1]


def _release(weights: dict[int, float]) -> ClassRelease:
    return ClassRelease(np.array(list(weights), dtype=np.int64), np.array(list(weights.values()), dtype=float))


def test_alikeness_is_the_mean_cosine_between_classes():
    same = [_release({1: 3.0, 2: 1.0}), _release({2: 1.0, 1: 3.0})]  # the same weights in another order
    assert class_alikeness(same) == pytest.approx(1.0)
    assert class_alikeness([_release({1: 1.0}), _release({2: 1.0})]) == 0.0  # nothing shared
    # three classes: cosines 1/sqrt(2) (a, b), 0 (a, c), 1/sqrt(2) (b, c)
    three = [_release({1: 1.0}), _release({1: 1.0, 2: 1.0}), _release({2: 1.0})]
    assert class_alikeness(three) == pytest.approx(2 / np.sqrt(2) / 3)
    assert class_alikeness([_release({1: 1.0})]) == 0.0  # one class: nothing to compare
    assert class_alikeness([_release({1: 0.0}), _release({1: 2.0})]) == 0.0  # a class that released no weight


@pytest.mark.parametrize("alikeness", [0.1, ALIKE_CLASSES - 0.01])
def test_classes_told_apart_keep_the_short_settings(alikeness):
    derived = adaptive_settings(_profile_at(20))
    assert settings_after_release(derived, alikeness) == derived


def test_alike_classes_of_a_short_corpus_take_the_long_k_and_l():
    derived = adaptive_settings(_profile_at(20))
    after = settings_after_release(derived, ALIKE_CLASSES)
    assert (after.contribution, after.top_k, after.length) == (derived.contribution, *LONG_SETTINGS[1:])
    # the answer holds the long L's terms (30 x 2.7 words), where the documents' median length (20) gave 50
    assert (derived.answer_words, after.answer_words) == (50, answer_words_for(LONG_SETTINGS[2])) == (50, 80)
    nearer_long = adaptive_settings(_profile_at(35))  # a median answer longer than the long L needs is kept
    assert nearer_long.answer_words > 80
    assert settings_after_release(nearer_long, ALIKE_CLASSES).answer_words == nearer_long.answer_words
    long = adaptive_settings(_profile_at(150))
    assert settings_after_release(long, 0.0) == long  # a long corpus keeps its settings either way
    assert RELEASE_TOP_K >= max(SHORT_SETTINGS[1], LONG_SETTINGS[1])


def test_breadth_is_the_mean_share_of_a_class_weight_past_the_short_k():
    """``release_breadth``: per class, the share of its released weight on terms past its ``short_k`` heaviest (in
    weight order, not term order), averaged over classes; a class that released nothing counts 0."""
    narrow = _release({i: 1.0 for i in range(3)})  # three terms, all within the first 3
    broad = _release({10: 1.0, 11: 3.0, 12: 1.0, 13: 1.0, 14: 2.0})  # 3 + 2 + 1 inside, 1 + 1 past: 2/8
    assert release_breadth([narrow], short_k=3) == 0.0
    assert release_breadth([broad], short_k=3) == pytest.approx(2 / 8)
    assert release_breadth([narrow, broad], short_k=3) == pytest.approx(1 / 8)
    assert release_breadth([_release({1: 0.0})], short_k=3) == 0.0 and release_breadth([]) == 0.0
    flat = _release({i: 1.0 for i in range(SHORT_SETTINGS[1] * 2)})  # the default short K: half the weight past it
    assert release_breadth([flat]) == pytest.approx(0.5)


def test_broad_classes_of_a_short_corpus_take_the_long_k_and_l():
    """Issue 48 (2026-12-01): classes told apart (not alike) whose release reaches far past the short K (AG News,
    0.39: K 1000 L 30 scored 2.0 points over K 300 L 10) take the long K and L; narrower ones keep the short (Yelp's
    business categories 0.26, where K 1000 lost 5 points). A few-term or long corpus keeps its settings."""
    derived = adaptive_settings(_profile_at(20))
    assert settings_after_release(derived, 0.1, BROAD_RELEASE - 0.01) == derived
    after = settings_after_release(derived, 0.1, BROAD_RELEASE)
    assert (after.contribution, after.top_k, after.length) == (derived.contribution, *LONG_SETTINGS[1:])
    assert after.answer_words == answer_words_for(LONG_SETTINGS[2])
    few = adaptive_settings(_profile_at(8))
    assert settings_after_release(few, 0.1, 0.9) == few
    long = adaptive_settings(_profile_at(150))
    assert settings_after_release(long, 0.1, 0.9) == long


def test_the_shorter_the_documents_the_slower_their_weights_decay():
    """Issue 48 (2026-11-29): documents of a few terms count each alike (unit-l2), short ones take slow-rank-l2
    (i^-0.25), long ones rank-l2 (i^-0.5); pass 1 counts the three when the kind is left to the rule."""
    assert adaptive_settings(_profile_at(8)).contribution == "unit-l2"
    assert adaptive_settings(_profile_at(20)).contribution == "slow-rank-l2"
    assert adaptive_settings(_profile_at(150)).contribution == "rank-l2"
    assert set(counted_contributions("auto")) == {"unit-l2", "slow-rank-l2", "rank-l2"}
    assert counted_contributions("unit-l2") == ("unit-l2",)


def test_alike_classes_of_documents_of_a_few_terms_keep_the_short_k_and_l():
    """A review's first sentence by its stars (median 6 terms, alikeness 0.79) lost 2.2 points with the long L: a
    corpus whose median is under FEW_MEDIAN_TERMS keeps K 300 and L 10 however alike its classes are."""
    few = adaptive_settings(_profile_at(8))
    assert FEW_MEDIAN_TERMS > 8 and not few.alike_takes_long
    assert settings_after_release(few, 0.99) == few
    enough = adaptive_settings(_profile_at(20))
    assert enough.alike_takes_long and settings_after_release(enough, 0.99).length == LONG_SETTINGS[2]


def test_settings_stored_before_the_length_bound_resume_as_drawn():
    """A run stored before the bound has no ``alike_takes_long``: it resumes without the bound, as it was drawn."""
    derived = adaptive_settings(_profile_at(8))
    arrays = settings_arrays(derived)
    assert settings_from_arrays(arrays) == derived
    old = {k: v for k, v in arrays.items() if k != "alike_takes_long"}
    assert settings_from_arrays(old).alike_takes_long


def test_split_takes_pass_one_apart_and_refuses_another_shape():
    counts = np.arange(3 * (7 + B), dtype=np.float64).reshape(3, 7 + B)
    matrices, profile = split_profiled_counts(counts, 7, "rank-l2", True)
    assert np.array_equal(matrices["rank-l2"], counts[:, :7])
    assert profile is not None and profile.dtype == np.int64 and np.array_equal(profile, counts[:, 7:])
    with pytest.raises(ConfigError):
        split_profiled_counts(np.zeros((3, 7)), 7, "rank-l2", True)


def test_configuration_defaults_are_auto_and_explicit_values_stay():
    base = dict(data="/tmp/x.csv", out="/tmp/o", labels=["a", "b"])
    cfg = DpKpsConfig(**base)
    assert (cfg.hist_contribution, cfg.hist_top_k, cfg.length) == ("auto", "auto", "auto")
    given = DpKpsConfig(**base, hist_top_k="500", length="20", hist_contribution="unit-l2")
    assert (given.hist_top_k, given.length, given.hist_contribution) == (500, 20, "unit-l2")
    assert DpKpsConfig(**base, method="independent").length == 10  # the paper's samplers release no profile
    assert DpKpsConfig(**base, mechanism="laplace").hist_contribution == "first-terms"
    with pytest.raises(ValueError):
        DpKpsConfig(**base, hist_top_k="many")


# ------------------------------------------------------------------ the stage, with real noise and the ledger
def _stage_config(tmp_path: Path, **overrides) -> DpKpsConfig:
    values = dict(data="unused", out=str(tmp_path / "out"), labels=["0", "1", "2", "3"], method="histogram",
                  vocab_top=20000, per_class=6, epsilon=20.0, gate=False)
    values.update(overrides)
    return DpKpsConfig(**values)


def test_stage_charges_its_own_stage_and_resume_rereads_the_draw(tmp_path, tiny_corpus):
    from privseed.tasks.stages.corpus import scan_private_corpus
    from privseed.tasks.stages.dpkps import term_counting
    from privseed.tasks.stages.histogram import privatize_class_histograms, settle_histogram_settings
    from tests.conftest import corpus_plan

    cfg = _stage_config(tmp_path)
    labels = [0, 1, 2, 3]
    exact = scan_private_corpus.fn(corpus_plan(tiny_corpus, tmp_path / "corpus"), labels, cfg,
                                   term_counting(cfg)).counts
    ledger = PrivacyLedger(str(tmp_path / "state"), "fingerprint", "run1")
    settled = settle_histogram_settings.fn(exact, labels, cfg, ledger)
    assert "auto" not in (settled.declared.hist_contribution, settled.declared.hist_top_k, settled.declared.length)
    assert settled.declared.epsilon == 20.0 and settled.spending.epsilon == pytest.approx(20.0 * (1 - PROFILE_SHARE))
    privatize_class_histograms.fn(settled.counts, labels, settled.spending, ledger)
    entries = {e["name"]: e for e in ledger.entries()}
    assert entries["corpus-profile"]["stage"] == "corpus-profile"
    assert entries["corpus-profile"]["epsilon"] == pytest.approx(20.0 * PROFILE_SHARE)
    assert entries["corpus-profile"]["delta"] == 0.0
    assert ledger.total()[0] == pytest.approx(20.0)  # the declared budget, profile included
    # A resumed run (a new ledger object on the same state and run id) re-reads the stored draw: the same noise,
    # the same settings, even when the exact counts it is handed differ; nothing is charged again.
    changed = exact.copy()
    changed[:, -B:] += 50
    resumed = PrivacyLedger(str(tmp_path / "state"), "fingerprint", "run1")
    again = settle_histogram_settings.fn(changed, labels, cfg, resumed)
    assert again.profile == settled.profile
    assert resumed.total()[0] == pytest.approx(20.0) and len(resumed.entries()) == len(entries)
    # Every option given: no profile is released and the term stages spend the whole budget.
    fixed = _stage_config(tmp_path, hist_contribution="rank-l2", hist_top_k=40, length=5)
    plain = PrivacyLedger(str(tmp_path / "state2"), "fingerprint", "run1")
    exact_fixed = scan_private_corpus.fn(corpus_plan(tiny_corpus, tmp_path / "corpus2"), labels, fixed,
                                         term_counting(fixed)).counts
    none = settle_histogram_settings.fn(exact_fixed, labels, fixed, plain)
    assert none.profile is None and none.spending is fixed and not plain.entries()


def _settled_short(tmp_path: Path, **overrides):
    """The stage's settings for a short corpus (a noiseless profile at 20 terms) as settle_histogram_settings
    leaves them, with the options in ``overrides`` given."""
    from privseed.tasks.stages.histogram import SettledSettings

    cfg = _stage_config(tmp_path, **overrides)
    derived = adaptive_settings(_profile_at(20))
    after = tuple(name for name in AFTER_RELEASE_OPTIONS if getattr(cfg, name) == "auto")
    declared = cfg.model_copy(update=resolve_settings({n: getattr(cfg, n) for n in ("hist_contribution",
                                                                                  "hist_top_k", "length")},
                                                      derived))
    spending = declared.model_copy(update={"hist_top_k": RELEASE_TOP_K} if "hist_top_k" in after else {})
    profile = {"settled": {"hist_top_k": declared.hist_top_k, "length": declared.length}}
    return SettledSettings(np.zeros((0, 0)), spending, declared, profile, derived, after)


def _terms(rows: np.ndarray) -> list[dict[str, np.ndarray]]:
    return [{"noisy": row, "term_ids": np.arange(len(row)), "noisy_counts": row} for row in rows]


def _alike_and_apart(vocab: int = 20_000) -> tuple[np.ndarray, np.ndarray]:
    """Released rows of four classes far above the noise: all weighing the same 50 terms (alike), and each its own
    50 (apart)."""
    alike = np.zeros((4, vocab))
    alike[:, :50] = 1000.0
    apart = np.zeros((4, vocab))
    for c in range(4):
        apart[c, c * 50:(c + 1) * 50] = 1000.0
    return alike, apart


def test_after_release_alike_classes_take_the_long_k_and_l_and_told_apart_keep_theirs(tmp_path):
    """The rule's second step on released rows: classes with the same heavy terms (alike) take K and L long;
    classes each with terms of their own keep the short ones; an option given stays as given."""
    from privseed.tasks.stages.histogram import settle_after_release

    alike, apart = _alike_and_apart()
    after = settle_after_release.fn(_terms(alike), _settled_short(tmp_path))
    assert (after.declared.hist_top_k, after.declared.length) == LONG_SETTINGS[1:]
    assert (after.spending.hist_top_k, after.spending.length) == LONG_SETTINGS[1:]
    assert after.profile["class_alikeness"] == pytest.approx(1.0)
    assert after.profile["settled"]["length"] == LONG_SETTINGS[2] and not after.after_release
    kept = settle_after_release.fn(_terms(apart), _settled_short(tmp_path))
    assert (kept.declared.hist_top_k, kept.declared.length) == SHORT_SETTINGS[1:]
    assert kept.spending.hist_top_k == SHORT_SETTINGS[1] and kept.profile["class_alikeness"] == pytest.approx(0.0)
    given = settle_after_release.fn(_terms(alike), _settled_short(tmp_path, length=12))
    assert (given.declared.hist_top_k, given.declared.length) == (LONG_SETTINGS[1], 12)
    with pytest.raises(TypeError, match="public"):  # the exact counts never enter a public stage
        settle_after_release.fn(_terms(alike), dataclasses.replace(_settled_short(tmp_path), counts=np.ones((1, 1))))


def test_after_release_broad_classes_take_the_long_l_and_an_answer_that_holds_it(tmp_path):
    """Classes each told by terms of their own (not alike) whose weight reaches far past the short K (400 terms a
    class, 100 past the first 300: breadth 0.25; 600 terms: 0.5) take K and L long when the breadth is over
    ``BROAD_RELEASE``, and a ``max_tokens`` the rule set follows the answer that holds the long L (50 words, 112
    tokens at the median's 20 terms; 80 words, 144 tokens for 30 terms); a --max-tokens given is not left to it."""
    from privseed.tasks.stages.histogram import settle_after_release

    def rows(per_class: int) -> np.ndarray:
        apart = np.zeros((4, 20_000))
        for c in range(4):
            apart[c, c * per_class:(c + 1) * per_class] = 1000.0
        return apart

    left = _settled_short(tmp_path)
    left = dataclasses.replace(left, after_release=left.after_release + ("max_tokens",),
                               declared=left.declared.model_copy(update={"max_tokens": 112}))
    narrow = settle_after_release.fn(_terms(rows(400)), left)
    assert narrow.profile["release_breadth"] == pytest.approx(0.25) and 0.25 < BROAD_RELEASE
    assert (narrow.declared.hist_top_k, narrow.declared.length, narrow.declared.max_tokens) == (300, 10, 112)
    broad = settle_after_release.fn(_terms(rows(600)), left)
    assert broad.profile["release_breadth"] == pytest.approx(0.5) and broad.profile["class_alikeness"] == 0.0
    assert (broad.declared.hist_top_k, broad.declared.length) == LONG_SETTINGS[1:]
    assert broad.declared.max_tokens == broad.profile["settled"]["max_tokens"] == 144
    kept = settle_after_release.fn(_terms(rows(600)), _settled_short(tmp_path, max_tokens=64))  # given: as given
    assert kept.declared.length == LONG_SETTINGS[2] and kept.declared.max_tokens == 64


def test_after_release_alike_classes_lower_the_llm_temperature_unless_it_was_given(tmp_path):
    """Where an LLM writes and --temperature was not given, alike classes write at ALIKE_TEMPERATURE and classes
    told apart at the option's default; a temperature given is never changed (it is not left to the rule)."""
    from privseed.tasks.stages.histogram import settle_after_release

    assert temperature_after_release(ALIKE_CLASSES, 0.7) == ALIKE_TEMPERATURE
    assert temperature_after_release(ALIKE_CLASSES - 0.01, 0.7) == 0.7
    alike, apart = _alike_and_apart()
    left = _settled_short(tmp_path)
    left = dataclasses.replace(left, after_release=left.after_release + ("temperature",))
    lowered = settle_after_release.fn(_terms(alike), left)
    assert lowered.declared.temperature == ALIKE_TEMPERATURE < 0.7
    assert lowered.profile["settled"]["temperature"] == ALIKE_TEMPERATURE
    kept = settle_after_release.fn(_terms(apart), left)
    assert kept.declared.temperature == 0.7 and kept.profile["settled"]["temperature"] == 0.7
    given = settle_after_release.fn(_terms(alike), _settled_short(tmp_path))  # not left: as declared
    assert given.declared.temperature == 0.7 and "temperature" not in given.profile["settled"]


def test_the_llm_temperature_is_left_to_the_rule_only_when_an_llm_writes_and_it_was_not_given(tmp_path, tiny_corpus):
    """settle_histogram_settings leaves ``temperature`` to the second step only for a run with an LLM and no
    --temperature: a seeds-only run, and a run that gave one, keep theirs."""
    from privseed.tasks.stages.corpus import scan_private_corpus
    from privseed.tasks.stages.dpkps import term_counting
    from privseed.tasks.stages.histogram import settle_histogram_settings
    from tests.conftest import corpus_plan

    labels = [0, 1, 2, 3]
    for options, left in (({"llm": "local"}, True), ({"llm": "local", "temperature": 0.9}, False), ({}, False)):
        cfg = _stage_config(tmp_path, **options)
        ledger = PrivacyLedger(str(tmp_path / f"state-{len(options)}-{left}"), "fingerprint", "run1")
        exact = scan_private_corpus.fn(corpus_plan(tiny_corpus, tmp_path / f"c-{len(options)}-{left}"), labels, cfg,
                                       term_counting(cfg)).counts
        settled_ = settle_histogram_settings.fn(exact, labels, cfg, ledger)
        assert ("temperature" in settled_.after_release) is left, options


# ------------------------------------------------------------------ the flow: noise, the stored draw, the manifest
TEXTS = {0: "football club player scored goals league season striker contract coach team",
         1: "river valley mountain lake forest village glacier island park trail",
         2: "album band song released records guitar singer single chart music"}


def _flow_corpus(tmp: Path) -> tuple[str, pd.DataFrame]:
    rng = np.random.default_rng(3)
    rows = []
    for label, text in TEXTS.items():
        words = text.split()
        for _ in range(30):
            rows.append((" ".join(rng.choice(words, size=int(rng.integers(3, 10)), replace=False)), str(label)))
    frame = pd.DataFrame(rows, columns=["text", "label"])
    path = tmp / "corpus.parquet"
    frame.to_parquet(path, index=False)
    return str(path), frame


def _flow_config(data: str, out: Path, **overrides) -> DpKpsConfig:
    values = dict(data=data, out=str(out), state=str(out.parent / f"{out.name}-state"), vocab_top=20_000,
                  per_class=4, epsilon=20.0, llm="none", gate=False, n_workers=1, seed=0,
                  labels=[str(label) for label in TEXTS])
    values.update(overrides)
    return DpKpsConfig(**values)


def _stored_profile(out: Path) -> dict[str, np.ndarray]:
    [path] = (out.parent / f"{out.name}-state").glob("runs/*/values/corpus-profile.npz")
    with np.load(path, allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files if k != "__params__"}


def test_flow_profile_noise_is_laplace_of_its_share_and_differs_across_runs(tmp_path):
    """Two runs with the same --seed release different profiles (the noise is OpenDP's, not the seed's); the
    residual against the exact (class, length bin) counts, recomputed here, is integer discrete-Laplace noise of
    scale 1 / (share x epsilon) = 1: about half the cells move, by about 0.85 on average. A profile charged at the
    whole epsilon (scale 0.05) would leave nearly every cell exact; one at a tenth of the share (scale 10) would
    move them by about 10."""
    from privseed.flows.dpkps import dpkps_flow
    from privseed.tasks.seeds.vocabulary import load_vocabulary, phrase_matcher

    data, frame = _flow_corpus(tmp_path)
    manifests, residuals = [], []
    matcher = phrase_matcher(load_vocabulary("english", 20_000))
    labels = [str(label) for label in TEXTS]
    lengths = [len(set(matcher.match(text))) for text in frame["text"]]
    exact = class_length_counts(lengths, [labels.index(v) for v in frame["label"]], len(labels))
    for run in ("a", "b"):
        out = tmp_path / run
        manifests.append(dpkps_flow(_flow_config(data, out)))
        stored = _stored_profile(out)
        residual = stored["noisy"] - exact
        assert np.allclose(residual, np.rint(residual))  # discrete Laplace on integer counts
        residuals.append(residual)
        owner = {e["name"]: e for e in json.loads((out / "ledger.json").read_text())["entries"]}
        assert owner["corpus-profile"]["epsilon"] == pytest.approx(20.0 * PROFILE_SHARE)
        assert manifests[-1]["privacy"]["epsilon"] == pytest.approx(20.0)
        config = json.loads((out / "manifest.json").read_text())["config"]
        assert config["length"] == int(stored["length"]) and config["hist_top_k"] == int(stored["top_k"])
        # the released kind is the rule's reading of the noisy profile: post-processing, never of the exact counts
        derived = adaptive_settings(CorpusProfile(stored["noisy"]))
        assert config["hist_contribution"] == str(stored["contribution"]) == derived.contribution
        assert config["epsilon"] == 20.0
    assert not np.array_equal(residuals[0], residuals[1])
    moved = np.concatenate([r.ravel() for r in residuals])
    assert 0.3 < np.mean(moved != 0) < 0.8
    assert 0.4 < np.mean(np.abs(moved)) < 1.6
