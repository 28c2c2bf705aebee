"""The histogram seed methods' stages (tasks/seeds/histogram_seeds.py): privseed's own comparator, not the paper's
method. No vocabulary stage and no embedding: per-class noisy histograms over the public V are the release.

The exact per-class counts come from pass 1 (``privseed.tasks.stages.corpus.scan_private_corpus`` with
``privseed.tasks.stages.dpkps.term_counting``); histogram-markov's pair counts from pass 2 here (``exact_pair_counts``).
How the noisy rows become term weights (``term_releases``) and which terms stage 2 pairs (``pair_candidate_ids``)
is post-processing of stage 1's release, recomputed from the stored noisy rows wherever it is needed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from privseed.tasks.config.commands import DpKpsConfig
from privseed.tasks.data.units import CorpusPlan, map_reduce_units
from privseed.tasks.dp.accounting import default_delta
from privseed.tasks.dp.ledger import PrivacyLedger, public_rng
from privseed.tasks.generation.class_fit import SEED_POOL_CLASSES, SeedClasses
from privseed.tasks.seeds.corpus_profile import (ADAPTIVE_OPTIONS, AFTER_RELEASE_OPTIONS, adaptive_settings,
                                                 AdaptiveSettings, AUTO, answer_tokens, asks_for_profile,
                                                 class_alikeness, CorpusProfile, release_breadth,
                                                 LENGTH_EDGES, profile_budget, PROFILE_SHARE, RELEASE_TOP_K,
                                                 resolve_settings, settings_after_release, settings_arrays,
                                                 temperature_after_release,
                                                 settings_from_arrays, settled, split_profiled_counts)
from privseed.tasks.seeds import corpus_profile, histogram_seeds
from privseed.tasks.seeds.histogram_seeds import (class_term_releases, ClassRelease, most_typical, noise_floor,
                                                  pair_candidates, pair_matrix, released_support,
                                                  sample_class_sequences, seed_pool, stage_budgets, top_k)
from privseed.tasks.seeds.passes import combine_sums, DeclaredLabels, pair_unit, PairSpec
from privseed.tasks.seeds.sampling import SelectionRule
from privseed.tasks.seeds.seed_methods import contribution_kind
from privseed.tasks.seeds.vocabulary import DEFAULT_ENGLISH_TOP_N, load_vocabulary, require_vocabulary_hits
from privseed.tasks.stages import private_stage, public_stage, stage_logger
from privseed.tasks.stages.corpus import unit_progress, unit_reader
from privseed.tasks.stages.dpkps import selection_rule, term_counting


# The mechanism factories are called through their module: the audit's faults patch them there
# (tasks/audit/faults.py, SENSITIVITY_FACTORIES), and a name bound at import would miss the patch.


def _histogram_params(cfg: DpKpsConfig, vocabulary_name: str, vocab_terms: int) -> dict[str, Any]:

    return {"method": cfg.method, "vocab": vocabulary_name, "vocab_terms": vocab_terms,
            "first_terms": cfg.first_terms, "top_k": cfg.hist_top_k, "mechanism": cfg.mechanism,
            "adjacency": "add/remove one document",
            "contribution": contribution_kind(cfg.hist_contribution).ledger_text}


@dataclass(frozen=True)
class SettledSettings:
    """What the histogram methods run with once the adaptive options are settled (``settle_histogram_settings``).

    ``counts``: the exact (classes, |V|) matrix of the settled contribution kind (private). ``spending``: the
    configuration the term stages spend with (the derived settings; ``epsilon`` their share of the budget).
    ``declared``: the configuration as the run declares it (the derived settings, the user's ``epsilon``), for the
    manifest. ``profile``: the released profile and what the rule derived from it (post-processing of a DP
    release, publishable; None when no profile was released). ``derived``: the rule's settings from the profile;
    ``after_release``: the options (``hist_top_k``, ``length``) left auto, ``max_tokens`` when the rule set it and
    L is left auto (an answer holds its seed's L), and ``temperature`` when an LLM writes
    and it was not given, which the rule's second step settles from the term histograms' release
    (``settle_after_release``); until then ``spending`` keeps ``RELEASE_TOP_K`` terms a class."""

    counts: np.ndarray = field(repr=False)
    spending: DpKpsConfig
    declared: DpKpsConfig
    profile: dict[str, Any] | None = None
    derived: AdaptiveSettings | None = None
    after_release: tuple[str, ...] = ()

    def public(self) -> SettledSettings:
        """These settings without the exact counts (an empty matrix in their place): what a public stage may be
        handed."""
        return replace(self, counts=np.zeros((0, 0)))


@private_stage("release-corpus-profile")
def settle_histogram_settings(exact: np.ndarray, labels: list, cfg: DpKpsConfig,
                              ledger: PrivacyLedger) -> SettledSettings:
    """Stage 0 of the histogram methods when an adaptive option (``--hist-contribution``, ``--hist-top-k``,
    ``--length``) is ``auto``: release the corpus profile (``privseed.tasks.seeds.corpus_profile``), drawn once
    through the ledger, derive the settings by the rule, and take pass 1's counts apart.

    Sensitivity: a document adds 1 to one (class, length bin) cell -> L1 1, discrete Laplace of scale
    1 / eps_profile on every cell (pure DP), eps_profile = ``PROFILE_SHARE`` of the run's epsilon, charged as its
    own ledger stage (``corpus-profile``); the term histograms get the rest, so the total is the declared budget.
    The settings are post-processing of the release, stored with it and re-read on resume (never redrawn, never
    re-derived). Without an ``auto`` option nothing is released and both configurations are ``cfg``."""

    given = {name: getattr(cfg, name) for name in ADAPTIVE_OPTIONS}
    profiled = asks_for_profile(given)
    vocabulary = load_vocabulary(cfg.vocab, cfg.vocab_top or DEFAULT_ENGLISH_TOP_N)
    matrices, exact_profile = split_profiled_counts(exact, len(vocabulary), str(cfg.hist_contribution), profiled)
    if exact_profile is None:
        return SettledSettings(matrices[str(cfg.hist_contribution)], cfg, cfg)
    require_vocabulary_hits(np.stack(list(matrices.values())), cfg.vocab)  # before the profile is drawn
    (eps_profile, _), (eps_rest, _) = profile_budget(cfg.histogram_epsilon, cfg.delta)
    params = {"statistic": "documents per (class, length bin), length = distinct terms of V",
              "length_edges": list(LENGTH_EDGES), "share": PROFILE_SHARE, "vocab": vocabulary.name,
              "vocab_terms": len(vocabulary), "adjacency": "add/remove one document",
              "contribution": "1 on the cell of the document's class and length bin (L1 1)"}
    released = ledger.draw_once("corpus-profile", mechanism=corpus_profile.profile_mechanism(eps_profile),
                                noise=cfg.noise("corpus-profile"), params=params, stage="corpus-profile",
                                exact=lambda: exact_profile,
                                postprocess=lambda noisy: settings_arrays(adaptive_settings(CorpusProfile(noisy))))
    profile = CorpusProfile(np.asarray(released["noisy"]))
    derived = settings_from_arrays(released)  # as stored with the draw
    resolved = resolve_settings(given, derived)
    answer_cap = answer_tokens(derived.answer_words)
    if cfg.llm != "none" and "max_tokens" not in cfg.model_fields_set:  # answers of the documents' length, at most
        # --max-tokens (a function of the noisy profile only: post-processing)
        resolved = {**resolved, "max_tokens": min(cfg.max_tokens, answer_cap)}
    declared = cfg.model_copy(update=resolved)
    record = {"noisy_class_sizes": [round(float(v), 1) for v in profile.class_sizes],
              "noisy_length_histogram": [round(float(v), 1) for v in profile.lengths],
              "length_edges": list(LENGTH_EDGES), "median_distinct_terms": round(profile.length_quantile(0.5), 1),
              "derived": derived.as_dict(), "settled": resolved,
              "answer_tokens": answer_cap}
    stage_logger().info("corpus profile (epsilon %g, a share %g of the budget): median length %.0f distinct terms "
                        "of V; %s (the rule: contribution %s, K %d, L %d, answers of ~%d words, %d tokens)",
                        eps_profile, PROFILE_SHARE, record["median_distinct_terms"],
                        ", ".join(f"{name} {value}" for name, value in resolved.items()), derived.contribution,
                        derived.top_k, derived.length, derived.answer_words, record["answer_tokens"])
    after_release = tuple(name for name in AFTER_RELEASE_OPTIONS if given[name] == AUTO)
    if "max_tokens" in resolved and "length" in after_release:  # the answer holds the seed's L, settled below
        after_release += ("max_tokens",)
    if cfg.llm != "none" and "temperature" not in cfg.model_fields_set:  # the LLM's temperature follows too
        after_release += ("temperature",)
    spending = declared.model_copy(update={"epsilon": eps_rest,
                                           **({"hist_top_k": RELEASE_TOP_K} if "hist_top_k" in after_release else {})})
    return SettledSettings(matrices[str(declared.hist_contribution)], spending, declared, record, derived,
                           after_release)


@public_stage("settle-after-release")
def settle_after_release(terms: list[dict[str, np.ndarray]], settled: SettledSettings) -> SettledSettings:
    """The rule's second step (``privseed.tasks.seeds.corpus_profile.settings_after_release``,
    ``temperature_after_release``): K and L left auto, and the LLM's temperature when not given, follow the term
    histograms' release, by how alike the classes' released weights are (``class_alikeness``) and, for K and L, how
    far past the short K they reach (``release_breadth``).
    ``settled`` is ``SettledSettings.public()``: no exact counts in a public stage. Post-processing of released
    values only, so no budget: re-reading the stored release on resume gives the same settings. Without options
    left to it, ``settled`` as it is."""

    if settled.counts.size:
        raise TypeError("settle_after_release is a public stage: hand it settled.public(), not the exact counts")
    if not settled.after_release or settled.derived is None or settled.profile is None:
        return settled
    releases = term_releases(terms, settled.spending)
    alikeness, breadth = class_alikeness(releases), release_breadth(releases)
    final = settings_after_release(settled.derived, alikeness, breadth)
    answer_cap = answer_tokens(final.answer_words)  # left to the rule only when --max-tokens was not given
    from_rule = {"hist_top_k": final.top_k, "length": final.length,
                 "temperature": temperature_after_release(alikeness, settled.declared.temperature),
                 "max_tokens": min(DpKpsConfig.model_fields["max_tokens"].default, answer_cap)}
    chosen = {name: from_rule[name] for name in settled.after_release}
    profile = {**settled.profile, "class_alikeness": round(alikeness, 3), "release_breadth": round(breadth, 3),
               "derived": final.as_dict(), "answer_tokens": answer_cap,
               "settled": {**settled.profile["settled"], **chosen}}
    stage_logger().info("classes' released terms alike at %.2f (mean cosine; from %g a short corpus takes the long K "
                        "and L, and an LLM writes at temperature %g), %.2f of their weight past the first %d terms "
                        "(from %g a short corpus takes the long K and L): K %d, L %d%s", alikeness,
                        corpus_profile.ALIKE_CLASSES, corpus_profile.ALIKE_TEMPERATURE, breadth,
                        corpus_profile.SHORT_SETTINGS[1], corpus_profile.BROAD_RELEASE, final.top_k, final.length,
                        (f", temperature {chosen['temperature']:g}" if "temperature" in chosen else "")
                        + (f", answers of up to {chosen['max_tokens']} tokens" if "max_tokens" in chosen else ""))
    return replace(settled, spending=settled.spending.model_copy(update=chosen),
                   declared=settled.declared.model_copy(update=chosen), profile=profile, after_release=())


@private_stage("privatize-class-histograms")
def privatize_class_histograms(exact: np.ndarray, labels: list, cfg: DpKpsConfig,
                               ledger: PrivacyLedger) -> list[dict[str, np.ndarray]]:
    """Stage 1: noise on EVERY term of V for every class, top K per class; drawn once through the ledger.

    Sensitivity: a document adds 1 to at most S distinct terms of its own class -> L1 S (Laplace(S/eps_1)),
    L2 sqrt(S) (Gaussian); with ``--hist-contribution unit-l2`` or ``rank-l2`` it adds a vector of L2 norm 1 over
    all its distinct terms -> L2 1 (Gaussian only). Classes are disjoint: parallel composition (partition per class)."""

    vocabulary = load_vocabulary(cfg.vocab, cfg.vocab_top or DEFAULT_ENGLISH_TOP_N)
    eps_1, delta_1 = stage_budgets(cfg.method, cfg.histogram_epsilon, cfg.delta, cfg.markov_term_share)[0]
    mechanism = histogram_seeds.build_mechanism(cfg.mechanism, cfg.first_terms, eps_1, delta_1, cfg.hist_contribution)
    noise = cfg.noise("histogram-noise")
    threshold = getattr(mechanism, "threshold", None)
    if threshold is not None:  # said before any value is drawn (public: the configuration's threshold)
        stage_logger().warning(
            "laplace-threshold: a term is released only when its noisy count reaches %d, i.e. when about %d "
            "documents of a class hold it; a class with fewer documents releases few or no terms and draws the rest "
            "of its seeds from the terms released for every class (no privacy cost). For small classes the default "
            "Gaussian mechanism keeps more of each class's own terms.", threshold, threshold)
    params = {**_histogram_params(cfg, vocabulary.name, len(vocabulary)), "stage": "terms"}
    top_k_kept = settled(cfg.hist_top_k, "--hist-top-k")
    # The ledger applies the mechanism to each class's row and keeps the whole noisy row with the top K.
    released = [ledger.draw_once(f"histogram-class{c}", mechanism=mechanism, noise=noise, params=params,
                                 exact=lambda c=c: exact[c],  # type: ignore[misc]  # default-argument lambda
                                 postprocess=lambda noisy: top_k(np.asarray(noisy, dtype=np.float64), top_k_kept),
                                 partition=f"class{c}", stage="histogram")
                for c in range(len(labels))]
    stage_logger().info("released the top %d noisy terms of %d classes", cfg.hist_top_k, len(labels))
    if cfg.delta:
        stage_logger().info("%s, %s: the term stages spend (epsilon %g, delta %g), delta %s", cfg.mechanism,
                            cfg.hist_contribution, cfg.histogram_epsilon, cfg.delta, _delta_origin(cfg))
    return released


def _delta_origin(cfg: DpKpsConfig) -> str:
    """Where the run's delta came from, for the log: the default is a function of a public bound, never of the
    private corpus's size."""

    if cfg.delta == default_delta(cfg.n_upper_bound):
        return f"= 1/(n ln n) with the public bound n = --n-upper-bound {cfg.n_upper_bound}"
    return "as given (--delta)"


def term_releases(terms: list[dict[str, np.ndarray]], cfg: DpKpsConfig) -> list[ClassRelease]:
    """Each class's terms and weights (``privseed.tasks.seeds.histogram_seeds.class_term_releases``) from stage 1's
    stored
    noisy rows: post-processing of released values and public parameters only."""

    eps_1, delta_1 = stage_budgets(cfg.method, cfg.histogram_epsilon, cfg.delta, cfg.markov_term_share)[0]
    mechanism = histogram_seeds.build_mechanism(cfg.mechanism, cfg.first_terms, eps_1, delta_1, cfg.hist_contribution)
    return class_term_releases(np.stack([t["noisy"] for t in terms]), mechanism,
                               settled(cfg.hist_top_k, "--hist-top-k"), cfg.hist_candidates, cfg.hist_denoise,
                               cfg.hist_background_cap)


def pair_candidate_ids(terms: list[dict[str, np.ndarray]], cfg: DpKpsConfig) -> list[np.ndarray]:
    """Each class's P heaviest stage-1 terms, among which stage 2 counts pairs (post-processing of stage 1)."""

    return [pair_candidates(r, cfg.markov_pair_top) for r in term_releases(terms, cfg)]


@private_stage("class-pair-counts", retries=0)  # a unit retries its own transient failures (tasks/data/units.py)
def exact_pair_counts(plan: CorpusPlan, labels: list, terms: list[dict[str, np.ndarray]],
                      cfg: DpKpsConfig) -> np.ndarray:
    """Pass 2 of histogram-markov: exact co-occurrence counts (C, P (P - 1) / 2) of pairs among each class's P
    candidate terms (``pair_candidate_ids``), each unit re-read from storage on a worker, combined in a tree on
    the cluster (private)."""

    spec = PairSpec(unit_reader(cfg), DeclaredLabels(tuple(labels), cfg.label_column), term_counting(cfg),
                    tuple(pair_candidate_ids(terms, cfg)), cfg.markov_pair_terms)
    return map_reduce_units(pair_unit, plan.units, combine_sums, spec, on_done=unit_progress("pass 2"))


@private_stage("privatize-class-pairs")
def privatize_class_pairs(pair_counts: np.ndarray, labels: list, terms: list[dict[str, np.ndarray]],
                          cfg: DpKpsConfig, ledger: PrivacyLedger) -> list[dict[str, np.ndarray]]:
    """Stage 2 of histogram-markov: noise on the co-occurrence counts of pairs among each class's P heaviest
    stage-1 terms, drawn once through the ledger.

    Sensitivity: a document's first S_2 distinct candidate terms give at most S_2 (S_2 - 1) / 2 distinct pairs,
    each counted once -> L1 S_2 (S_2 - 1) / 2 (Laplace of that scale over eps_2), L2 its square root (Gaussian)
    (``privseed.tasks.seeds.histogram_seeds.pair_mechanism``). Noise on every pair of every class, zero counts included;
    classes in parallel; the candidates are post-processing of stage 1's release (public), so the stages compose
    sequentially: eps_1 + eps_2."""

    vocabulary = load_vocabulary(cfg.vocab, cfg.vocab_top or DEFAULT_ENGLISH_TOP_N)
    candidates = pair_candidate_ids(terms, cfg)
    eps_2, delta_2 = stage_budgets(cfg.method, cfg.histogram_epsilon, cfg.delta, cfg.markov_term_share)[1]
    mechanism = histogram_seeds.pair_mechanism(cfg.mechanism, cfg.markov_pair_terms, eps_2, delta_2)
    noise = cfg.noise("markov-noise")
    params = {**_histogram_params(cfg, vocabulary.name, len(vocabulary)), "stage": "pairs",
              "pair_top": cfg.markov_pair_top, "pair_terms": cfg.markov_pair_terms,
              "term_share": cfg.markov_term_share, "denoise": cfg.hist_denoise, "candidates": cfg.hist_candidates,
              "contribution": "pairs of the first S_2 distinct candidate terms of the document"}
    released = []
    for c in range(len(labels)):
        n = len(candidates[c])  # fewer than P only when a class has fewer than P released terms
        params_c = {**params, "pair_terms_of_class": _ids_digest(candidates[c])}
        released.append(ledger.draw_once(
            f"markov-class{c}", mechanism=mechanism, noise=noise, params=params_c,
            exact=lambda c=c, n=n: pair_counts[c, :n * (n - 1) // 2],  # type: ignore[misc]  # default-argument lambda
            postprocess=lambda noisy, ids=candidates[c]: {"pair_ids": ids},  # type: ignore[misc]  # as above
            partition=f"class{c}", stage="markov"))
    stage_logger().info("released pair counts among %d terms per class", cfg.markov_pair_top)
    return released


def _ids_digest(ids: np.ndarray) -> str:
    return hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()[:16]


def pool_judge(releases: list[ClassRelease], labels: list, pool: list[list[list[str]]]) -> SeedClasses | None:
    """The naive Bayes of the whole pool (``pool[c]``: class c's sampled sequences, as terms) that judges the
    documents written from the seeds kept of it and names the words they are steered by (``SEED_POOL_CLASSES``), or
    None where the classes' released terms are alike (``class_alikeness`` >= ``ALIKE_CLASSES``) and the kept seeds'
    own judges. Where each class has words of its own, 500 sequences a class name them better than the 20 kept
    (Yelp's business categories, alike at 0.64: the documents +1.8, +7.6 and +1.7 points on the same seeds; not
    tuned on, DBPedia-14, 0.11: +2.4, OHSUMED-23, 0.42, 5 a class: +5.5); where the classes share most words, the
    pool's lists are the few words the classes differ by and the documents lost (Yelp's star ratings, 0.84: -4.5,
    -2.2, -3.0; experiments/results/generation.md, "The pool's judge for the documents where the classes are not
    alike"). Post-processing of sampled sequences."""
    if class_alikeness(releases) >= corpus_profile.ALIKE_CLASSES:
        return None
    return SeedClasses.from_phrases([label for label, drawn in zip(labels, pool) for _ in drawn],
                                    [seq for drawn in pool for seq in drawn])


@public_stage("sample-histogram-sequences")
def sample_histogram_sequences(terms: list[dict[str, np.ndarray]], pairs: list[dict[str, np.ndarray]] | None,
                               labels: list, cfg: DpKpsConfig) -> pd.DataFrame:
    """Post-processing of the released histograms: per_class sequences of length L per class (public rng)."""


    vocabulary = load_vocabulary(cfg.vocab, cfg.vocab_top or DEFAULT_ENGLISH_TOP_N)
    releases = term_releases(terms, cfg)
    if pairs is not None:  # pair counts that pure noise reaches in about markov_pair_floor of a class's pairs
        eps_2, delta_2 = stage_budgets(cfg.method, cfg.histogram_epsilon, cfg.delta, cfg.markov_term_share)[1]
        mechanism = histogram_seeds.pair_mechanism(cfg.mechanism, cfg.markov_pair_terms, eps_2, delta_2)
        for c, released in enumerate(pairs):
            n = len(released["pair_ids"])
            floor = noise_floor(mechanism, n * (n - 1) // 2, cfg.markov_pair_floor)
            releases[c] = replace(releases[c], pair_ids=released["pair_ids"],
                                  pair_weights=pair_matrix(released["noisy"], n, floor))
    rule = SelectionRule.parse(selection_rule(cfg))
    length = settled(cfg.length, "--length")
    short = [str(label) for label, r in zip(labels, releases) if released_support(r) < length]
    if short:  # from released values only: which declared classes fell back is post-processing
        stage_logger().warning("%d of %d classes released fewer than L = %d terms (%s); they draw the missing share "
                               "of their seeds from the terms released for every class", len(short), len(labels),
                               length, ", ".join(short[:10]) + (" ..." if len(short) > 10 else ""))
    pool = seed_pool(cfg.per_class, cfg.hist_seed_pool)
    ids = sample_class_sequences(cfg.method, releases, pool, length, rule, public_rng(cfg.seed, "sample"),
                                 cfg.markov_pair_weight)
    pool_classes = None
    if pool > cfg.per_class:
        if cfg.llm != "none":  # a judge for the documents an LLM writes from the kept seeds
            as_terms = [[[vocabulary.terms[t] for t in seq] for seq in c] for c in ids]
            pool_classes = pool_judge(releases, labels, as_terms)
        ids = most_typical(ids, cfg.per_class)
        stage_logger().info("sampled %d sequences per class (%s, %s) and kept the %d that read most as their class%s",
                            pool, cfg.method, rule, cfg.per_class,
                            "" if pool_classes is None else "; the pool's naive Bayes judges the documents written "
                            "from them (the classes' released terms are not alike)")
    else:
        stage_logger().info("sampled %d sequences per class (%s, %s)", cfg.per_class, cfg.method, rule)
    rows = [(label, [vocabulary.terms[t] for t in seq]) for c, label in enumerate(labels) for seq in ids[c]]
    sequences = pd.DataFrame({"label": [r[0] for r in rows], "keyphrases": [r[1] for r in rows]})
    # The terms sequences can contain (every class's weighted terms) are what generation may mint prompt seeds from.
    released_terms = sorted({vocabulary.terms[int(t)] for r in releases for t in r.term_ids})
    sequences.attrs["released_vocabulary"] = released_terms
    sequences.attrs["released_vocabulary_source"] = "ledger:histogram"
    if pool_classes is not None:
        sequences.attrs[SEED_POOL_CLASSES] = pool_classes
    return sequences
