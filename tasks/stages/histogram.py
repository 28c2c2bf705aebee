"""The histogram seed methods' stages (tasks/histogram_seeds.py): privseed's own comparator, not the paper's
method. No vocabulary stage and no embedding: per-class noisy histograms over the public V are the release.

The exact per-class counts come from pass 1 (``tasks.stages.corpus.scan_private_corpus`` with
``tasks.stages.dpkps.term_counting``); histogram-markov's pair counts from pass 2 here (``exact_pair_counts``).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pandas as pd

from tasks.config import DpKpsConfig
from tasks.ledger import PrivacyLedger
from tasks.stages import private_stage, public_stage, stage_logger
from tasks.units import CorpusPlan


def _histogram_params(cfg: DpKpsConfig, vocabulary_name: str, vocab_terms: int) -> dict[str, Any]:
    return {"method": cfg.method, "vocab": vocabulary_name, "vocab_terms": vocab_terms,
            "first_terms": cfg.first_terms, "top_k": cfg.hist_top_k, "mechanism": cfg.mechanism,
            "adjacency": "add/remove one document", "contribution": "first S distinct terms of the document"}


@private_stage("privatize-class-histograms")
def privatize_class_histograms(exact: np.ndarray, labels: list, cfg: DpKpsConfig,
                               ledger: PrivacyLedger) -> list[dict[str, np.ndarray]]:
    """Stage 1: noise on EVERY term of V for every class, top K per class; drawn once through the ledger.

    Sensitivity: a document adds 1 to at most S distinct terms of its own class -> L1 S (Laplace(S/eps_1)),
    L2 sqrt(S) (Gaussian). Classes are disjoint: parallel composition (partition per class)."""
    from tasks.histogram_seeds import build_mechanism, stage_budgets, top_k
    from tasks.vocabulary import DEFAULT_ENGLISH_TOP_N, load_vocabulary

    vocabulary = load_vocabulary(cfg.vocab, cfg.vocab_top or DEFAULT_ENGLISH_TOP_N)
    eps_1, delta_1 = stage_budgets(cfg.method, cfg.histogram_epsilon, cfg.delta, cfg.markov_term_share)[0]
    mechanism = build_mechanism(cfg.mechanism, cfg.first_terms, eps_1, delta_1)
    noise = cfg.noise("histogram-noise")
    params = {**_histogram_params(cfg, vocabulary.name, len(vocabulary)), "stage": "terms"}
    # The ledger applies the mechanism to each class's row and keeps the whole noisy row with the top K.
    released = [ledger.draw_once(f"histogram-class{c}", mechanism=mechanism, noise=noise, params=params,
                                 exact=lambda c=c: exact[c],  # type: ignore[misc]  # default-argument lambda
                                 postprocess=lambda noisy: top_k(np.asarray(noisy, dtype=np.float64), cfg.hist_top_k),
                                 partition=f"class{c}", stage="histogram")
                for c in range(len(labels))]
    stage_logger().info("released the top %d noisy terms of %d classes", cfg.hist_top_k, len(labels))
    return released


@private_stage("class-pair-counts", retries=0)  # a unit retries its own transient failures (tasks/units.py)
def exact_pair_counts(plan: CorpusPlan, labels: list, terms: list[dict[str, np.ndarray]],
                      cfg: DpKpsConfig) -> tuple[np.ndarray, np.ndarray]:
    """Pass 2 of histogram-markov: exact start counts (C, K) and pair counts (C, K, K) among each class's
    released terms, each unit re-read from storage on a worker, combined in a tree on the cluster (private)."""
    from tasks.passes import DeclaredLabels, PairSpec, combine_pairs, pair_unit
    from tasks.stages.corpus import unit_progress, unit_reader
    from tasks.stages.dpkps import term_counting
    from tasks.units import map_reduce_units

    spec = PairSpec(unit_reader(cfg), DeclaredLabels(tuple(labels), cfg.label_column), term_counting(cfg),
                    tuple(np.asarray(r["term_ids"], dtype=np.int64) for r in terms))
    return map_reduce_units(pair_unit, plan.units, combine_pairs, spec, on_done=unit_progress("pass 2"))


@private_stage("privatize-class-pairs")
def privatize_class_pairs(starts: np.ndarray, pairs: np.ndarray, labels: list, terms: list[dict[str, np.ndarray]],
                          cfg: DpKpsConfig, ledger: PrivacyLedger) -> list[dict[str, np.ndarray]]:
    """Stage 2 of histogram-markov: noise on the start and adjacent-pair counts among each class's released K
    terms, drawn once through the ledger.

    Sensitivity: a document's first S distinct released terms give 1 start and at most S - 1 distinct pairs
    -> L1 S, L2 sqrt(S) for the joint (starts, pairs) vector. Noise on every entry (K + K^2 per class);
    classes in parallel; the released term sets it restricts to are stage-1 outputs (public)."""
    from tasks.histogram_seeds import build_mechanism, stage_budgets
    from tasks.vocabulary import DEFAULT_ENGLISH_TOP_N, load_vocabulary

    vocabulary = load_vocabulary(cfg.vocab, cfg.vocab_top or DEFAULT_ENGLISH_TOP_N)
    released_ids = [r["term_ids"] for r in terms]
    eps_2, delta_2 = stage_budgets(cfg.method, cfg.histogram_epsilon, cfg.delta, cfg.markov_term_share)[1]
    mechanism = build_mechanism(cfg.mechanism, cfg.first_terms, eps_2, delta_2)
    k = starts.shape[1]
    noise = cfg.noise("markov-noise")
    # One class's release is the joint (starts, pairs) vector: starts in row 0, pairs below it.
    joint = np.concatenate([starts[:, None, :], pairs], axis=1)  # (C, 1 + K, K)
    params = {**_histogram_params(cfg, vocabulary.name, len(vocabulary)), "stage": "pairs", "k": k,
              "term_share": cfg.markov_term_share}
    released = []
    for c in range(len(labels)):
        n = len(released_ids[c])  # a class may have fewer than K terms only when |V| < K
        params_c = {**params, "released_terms": _ids_digest(released_ids[c])}
        released.append(ledger.draw_once(
            f"markov-class{c}", mechanism=mechanism, noise=noise, params=params_c,
            exact=lambda c=c, n=n: joint[c, :n + 1, :n],  # type: ignore[misc]  # default-argument lambda
            postprocess=lambda noisy: {"noisy_starts": np.asarray(noisy[0], dtype=np.float64),
                                       "noisy_pairs": np.asarray(noisy[1:], dtype=np.float64)},
            partition=f"class{c}", stage="markov"))
    stage_logger().info("released start and pair counts over %d terms per class", k)
    return released


def _ids_digest(ids: np.ndarray) -> str:
    return hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()[:16]


@public_stage("sample-histogram-sequences")
def sample_histogram_sequences(terms: list[dict[str, np.ndarray]], pairs: list[dict[str, np.ndarray]] | None,
                               labels: list, cfg: DpKpsConfig) -> pd.DataFrame:
    """Post-processing of the released histograms: per_class sequences of length L per class (public rng)."""
    from tasks.histogram_seeds import (
        ClassRelease,
        build_mechanism,
        noise_floor,
        sample_class_sequences,
        stage_budgets,
    )
    from tasks.ledger import public_rng
    from tasks.sampling import SelectionRule
    from tasks.stages.dpkps import selection_rule
    from tasks.vocabulary import DEFAULT_ENGLISH_TOP_N, load_vocabulary

    vocabulary = load_vocabulary(cfg.vocab, cfg.vocab_top or DEFAULT_ENGLISH_TOP_N)
    pair_floor = 0.0
    if pairs is not None:  # the count pure noise reaches in about markov_pair_floor of the K + K^2 entries
        eps_2, delta_2 = stage_budgets(cfg.method, cfg.histogram_epsilon, cfg.delta, cfg.markov_term_share)[1]
        k = len(terms[0]["term_ids"])
        pair_floor = noise_floor(build_mechanism(cfg.mechanism, cfg.first_terms, eps_2, delta_2), k * (k + 1),
                                 cfg.markov_pair_floor)
    releases = [ClassRelease(term_ids=t["term_ids"], noisy_counts=t["noisy_counts"],
                             noisy_starts=None if pairs is None else pairs[c]["noisy_starts"],
                             noisy_pairs=None if pairs is None else pairs[c]["noisy_pairs"],
                             pair_floor=pair_floor)
                for c, t in enumerate(terms)]
    rule = SelectionRule.parse(selection_rule(cfg))
    ids = sample_class_sequences(cfg.method, releases, cfg.per_class, cfg.length, rule, public_rng(cfg.seed, "sample"))
    rows = [(label, [vocabulary.terms[t] for t in seq]) for c, label in enumerate(labels) for seq in ids[c]]
    stage_logger().info("sampled %d sequences per class (%s, %s)", cfg.per_class, cfg.method, rule)
    sequences = pd.DataFrame({"label": [r[0] for r in rows], "keyphrases": [r[1] for r in rows]})
    # The released terms of every class are what generation may mint prompt seeds from.
    released_terms = sorted({vocabulary.terms[int(t)] for r in releases for t in r.term_ids})
    sequences.attrs["released_vocabulary"] = released_terms
    sequences.attrs["released_vocabulary_source"] = "ledger:histogram"
    return sequences
