"""DP-KPS as a Prefect flow.

    load -> extract -> privatize vocabulary -> embed -> sketch -> sample -> generate -> gate -> publish

Privacy boundary: everything before ``sample`` touches private documents and runs with results kept in
memory only (``persist_result=False``): persisting them in Prefect's result store would copy private data
to a second place. What must survive a crash is exactly what was released, and that is persisted by the
privacy ledger (draw once, re-read on retry) and by the LLM call cache. A resumed run recomputes the private
intermediates deterministically and re-reads every released value.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

import tasks._runtime  # noqa: F401  (offline settings before prefect is imported)
import numpy as np
import pandas as pd
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from tasks import storage
from tasks.cluster import dask_client
from tasks.config import DpKpsConfig, ReleaseConfig, build_config
from tasks.corpus import list_shards, publish_release, read_shard
from tasks.errors import ConfigError, CorpusError, retry_if_transient
from tasks.ledger import PrivacyLedger
from tasks.stages import stage_logger
from tasks.stages.corpus import load_private_corpus, resolve_labels
from tasks.stages.ledger import log_cumulative_total, open_ledger, warn_if_insecure

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------
# Tasks: thin wrappers that do I/O around the pure functions in tasks/.
# ---------------------------------------------------------------------------------------------------
# -- DP-KPS privatization stages (steps 2-6 of docs/dpkps.md). Pure math lives in tasks/vocabulary.py,
# tasks/kde.py and tasks/sampling.py; these wrappers map it over shards and route every release through
# the ledger, so noise is drawn once and re-read on retry or re-run.
PRIVATE_TASK = dict(persist_result=False, cache_policy=NO_CACHE)

#: Selection rule used when --selection is not given, chosen on public data (docs/dpkps.md).
DEFAULT_SELECTION = {"independent": "power-2", "iterative-linear": "top-5", "iterative-log": "top-5",
                     "histogram": "power-1", "histogram-markov": "power-1"}


def selection_rule(cfg: DpKpsConfig) -> str:
    if cfg.selection is None:
        return DEFAULT_SELECTION[cfg.method]
    if cfg.selection == "top-k":
        return f"top-{cfg.top_k}"
    if cfg.selection == "power":
        return f"power-{cfg.power:g}"
    return cfg.selection


def corpus_shards(corpus: pd.DataFrame, n_workers: int) -> list[tuple[list[str], list]]:
    """Row chunks of the loaded corpus, the unit of the map steps (two per worker keeps both busy)."""
    n_parts = max(1, min(len(corpus), 2 * n_workers))
    bounds = np.linspace(0, len(corpus), n_parts + 1).astype(int)
    return [(corpus["text"].iloc[a:b].tolist(), corpus["label"].iloc[a:b].tolist())
            for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


@task(name="vocabulary-histogram", retries=1, retry_condition_fn=retry_if_transient,
      **PRIVATE_TASK)
def vocabulary_histogram(shards: list[tuple[list[str], list]], cfg: DpKpsConfig) -> np.ndarray:
    """Extract phrases and count each document's first S terms over V: map over shards, sum (private)."""
    from tasks.cluster import map_shards
    from tasks.vocabulary import DEFAULT_ENGLISH_TOP_N, shard_histogram

    top_n = cfg.vocab_top or DEFAULT_ENGLISH_TOP_N
    parts = map_shards(shard_histogram, [texts for texts, _ in shards], cfg.vocab, top_n, cfg.first_terms)
    counts = np.sum(parts, axis=0)
    if counts.sum() == 0:
        # Fails before any noise is drawn; says nothing about any single document.
        raise CorpusError(f"no document contains a term of the public vocabulary {cfg.vocab!r}: "
                          "check --vocab and --text-column")
    return counts


def release_vocabulary(counts: np.ndarray, cfg: ReleaseConfig, ledger: PrivacyLedger) -> list[str]:
    """V~: the vocabulary mechanism (discrete Laplace, scale S / eps_voc, on every term of V) then the top N,
    drawn once through the ledger under the name ``vocabulary``. The one vocabulary privatization of privseed:
    DP-KPS and AugPE+V~ both call it. ``cfg`` carries vocab, vocab_top, first_terms, vocab_size, eps_voc.

    The ledger stores the full noisy histogram next to the top-N ids, so the released values can be checked
    against the mechanism. The seed is not a parameter of this release: it does not influence the noise
    (except under --insecure-reproducible-noise, where the noise source names it)."""
    from tasks.vocabulary import DEFAULT_ENGLISH_TOP_N, load_vocabulary, top_terms, vocabulary_mechanism

    top_n = cfg.vocab_top or DEFAULT_ENGLISH_TOP_N
    vocabulary = load_vocabulary(cfg.vocab, top_n)
    params = {"vocab": vocabulary.name, "vocab_terms": len(vocabulary), "first_terms": cfg.first_terms,
              "vocab_size": cfg.vocab_size, "adjacency": "add/remove one document"}
    released = ledger.draw_once(
        "vocabulary", mechanism=vocabulary_mechanism(cfg.eps_voc, cfg.first_terms), noise=cfg.noise("vocabulary"),
        params=params, stage="vocabulary", exact=lambda: counts,
        postprocess=lambda noisy: top_terms(noisy, cfg.vocab_size),
    )
    return [vocabulary.terms[int(i)] for i in released["term_ids"]]


@task(name="privatize-vocabulary", retries=2, retry_condition_fn=retry_if_transient,
      retry_delay_seconds=[2, 10], **PRIVATE_TASK)
def privatize_vocabulary_stage(counts: np.ndarray, cfg: ReleaseConfig, ledger: PrivacyLedger) -> list[str]:
    """V~ (``release_vocabulary``), as a task."""
    terms = release_vocabulary(counts, cfg, ledger)
    stage_logger().info("privatized vocabulary: %d terms", len(terms))
    return terms


@task(name="embed-released-vocabulary", retries=2, retry_condition_fn=retry_if_transient,
      retry_delay_seconds=[2, 10], **PRIVATE_TASK)
def embed_released_vocabulary(terms: list[str], cfg: DpKpsConfig) -> np.ndarray:
    """Unit-norm embeddings of V~ (public from here on); private documents are looked up, not embedded."""
    from tasks.embedding import embed_texts

    return embed_texts(terms, cfg.embedding_model)


def feature_specs(cfg: DpKpsConfig, dim: int) -> list:
    from tasks.kde import FeatureSpec
    from tasks.sampling import ensemble_blocks

    return [FeatureSpec(seed=cfg.seed, name=f"{cfg.method}-{k}", n_features=cfg.n_features, dim=dim, blocks=b,
                        bandwidth=cfg.bandwidth)
            for k, b in enumerate(ensemble_blocks(cfg.method, cfg.length))]


@task(name="sketch-per-class", retries=2, retry_condition_fn=retry_if_transient,
      retry_delay_seconds=[2, 10], **PRIVATE_TASK)
def sketch_per_class(shards: list[tuple[list[str], list]], labels: list, terms: list[str], embeddings: np.ndarray,
                     cfg: DpKpsConfig, ledger: PrivacyLedger) -> np.ndarray:
    """Per-class DP-KDE sketches: exact partial sums per shard on the cluster, one reduce, then noise once
    per (class, sketch) through the ledger. Classes are disjoint (parallel composition); the sketches of
    one class split eps_kde (basic composition). Returns the released sums (classes, sketches, I)."""
    from tasks.cluster import map_shards
    from tasks.kde import sketch_mechanism, sketch_sums_of_shard
    from tasks.sampling import split_budget

    specs = feature_specs(cfg, embeddings.shape[1])
    parts = map_shards(sketch_sums_of_shard, shards, labels, tuple(terms), embeddings, specs, cfg.method == "independent")
    exact = np.sum(parts, axis=0)
    budgets = split_budget(cfg.method, cfg.eps_kde, cfg.length)
    delta_each = cfg.delta / len(specs) if cfg.mechanism == "gaussian" else 0.0
    released = np.zeros_like(exact)
    for c in range(len(labels)):
        for k, spec in enumerate(specs):
            # The feature seed identifies the public features the sum was computed on; it draws no noise.
            params = {"method": cfg.method, "length": cfg.length, "sketch": k, "blocks": spec.blocks,
                      "n_features": spec.n_features, "bandwidth": spec.bandwidth, "feature_seed": spec.seed,
                      "feature_stream": spec.name, "embedding_model": cfg.embedding_model, "dim": spec.dim,
                      "vocabulary": _terms_digest(terms),
                      "adjacency": "add/remove one document", "contribution": "sum of per-document phi"}
            released[c, k] = ledger.draw_once(
                f"kde-class{c}-sketch{k}", params=params, partition=f"class{c}", stage="kde",
                mechanism=sketch_mechanism(cfg.mechanism, spec.n_features, budgets[k], delta_each),
                noise=cfg.noise("kde-noise", str(c), str(k)), exact=lambda c=c, k=k: exact[c, k],
            )["noisy"]
    stage_logger().info("released %d sketch(es) per class, I=%d", len(specs), cfg.n_features)
    return released


def _terms_digest(terms: list[str]) -> str:
    import hashlib

    return hashlib.sha256("\n".join(terms).encode()).hexdigest()[:16]


@task(name="sample-sequences", retries=2, retry_condition_fn=retry_if_transient,
      retry_delay_seconds=[2, 10], **PRIVATE_TASK)
def sample_keyphrase_sequences(released: np.ndarray, labels: list, terms: list[str], embeddings: np.ndarray,
                               cfg: DpKpsConfig) -> pd.DataFrame:
    """Post-processing of the released sketches: per_class sequences of length L per class."""
    from tasks.ledger import public_rng
    from tasks.sampling import SelectionRule, SketchTables, default_device, sample_sequences

    device = default_device()
    rule = SelectionRule.parse(selection_rule(cfg))
    sketches = [SketchTables.build(spec.draw(), embeddings, device=device)
                for spec in feature_specs(cfg, embeddings.shape[1])]
    ids = sample_sequences(cfg.method, sketches, released, per_class=cfg.per_class, length=cfg.length, rule=rule,
                           rng=public_rng(cfg.seed, "sample"))
    rows = [(label, [terms[t] for t in seq]) for c, label in enumerate(labels) for seq in ids[c]]
    stage_logger().info("sampled %d sequences per class (%s, %s, device %s)", cfg.per_class, cfg.method, rule, device)
    sequences = pd.DataFrame({"label": [r[0] for r in rows], "keyphrases": [r[1] for r in rows]})
    # Generation mints prompt seeds only from terms of the released vocabulary (tasks/llm/released.py).
    sequences.attrs["released_vocabulary"] = list(terms)
    sequences.attrs["released_vocabulary_source"] = "ledger:vocabulary"
    return sequences


def privatize_keyphrase_sequences(corpus: pd.DataFrame, labels: list, cfg: DpKpsConfig,
                                  ledger: PrivacyLedger) -> pd.DataFrame:
    """extract -> privatize vocabulary -> embed V~ -> sketch per class -> sample per class."""
    shards = corpus_shards(corpus, cfg.n_workers)
    counts = vocabulary_histogram(shards, cfg)
    terms = privatize_vocabulary_stage(counts, cfg, ledger)
    del counts
    embeddings = embed_released_vocabulary(terms, cfg)
    released = sketch_per_class(shards, labels, terms, embeddings, cfg, ledger)
    return sample_keyphrase_sequences(released, labels, terms, embeddings, cfg)


# -- The histogram methods (tasks/histogram_seeds.py): privseed's own comparator, not the paper's method.
# No vocabulary stage and no embedding: per-class noisy histograms over the public V are the release.
@task(name="class-term-histograms", retries=1, retry_condition_fn=retry_if_transient, **PRIVATE_TASK)
def class_term_histograms(shards: list[tuple[list[str], list]], labels: list, cfg: DpKpsConfig) -> np.ndarray:
    """Exact (classes, |V|) counts of each document's first S distinct terms: map over shards, sum (private)."""
    from tasks.cluster import map_shards
    from tasks.histogram_seeds import shard_class_term_counts
    from tasks.vocabulary import DEFAULT_ENGLISH_TOP_N

    top_n = cfg.vocab_top or DEFAULT_ENGLISH_TOP_N
    return np.sum(map_shards(shard_class_term_counts, shards, list(labels), cfg.vocab, top_n, cfg.first_terms),
                  axis=0)


def _stage_sensitivity(cfg: DpKpsConfig) -> float:
    """S in L1 for Laplace, sqrt(S) in L2 for Gaussian (tasks/histogram_seeds.py states why)."""
    from tasks.histogram_seeds import l1_sensitivity, l2_sensitivity

    return l1_sensitivity(cfg.first_terms) if cfg.mechanism == "laplace" else l2_sensitivity(cfg.first_terms)


def _histogram_params(cfg: DpKpsConfig, vocabulary_name: str, vocab_terms: int) -> dict[str, Any]:
    return {"method": cfg.method, "vocab": vocabulary_name, "vocab_terms": vocab_terms,
            "first_terms": cfg.first_terms, "top_k": cfg.hist_top_k, "mechanism": cfg.mechanism,
            "adjacency": "add/remove one document", "contribution": "first S distinct terms of the document"}


@task(name="privatize-class-histograms", retries=2, retry_condition_fn=retry_if_transient,
      retry_delay_seconds=[2, 10], **PRIVATE_TASK)
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
                                 exact=lambda c=c: exact[c],
                                 postprocess=lambda noisy: top_k(np.asarray(noisy, dtype=np.float64), cfg.hist_top_k),
                                 partition=f"class{c}", stage="histogram")
                for c in range(len(labels))]
    stage_logger().info("released the top %d noisy terms of %d classes", cfg.hist_top_k, len(labels))
    return released


@task(name="privatize-class-pairs", retries=2, retry_condition_fn=retry_if_transient,
      retry_delay_seconds=[2, 10], **PRIVATE_TASK)
def privatize_class_pairs(shards: list[tuple[list[str], list]], labels: list, terms: list[dict[str, np.ndarray]],
                          cfg: DpKpsConfig, ledger: PrivacyLedger) -> list[dict[str, np.ndarray]]:
    """Stage 2 of histogram-markov: co-occurrence counts of pairs among each class's P heaviest stage-1 terms.

    Sensitivity: a document's first S_2 distinct candidate terms give at most S_2 (S_2 - 1) / 2 distinct pairs
    -> L1 S_2 (S_2 - 1) / 2 (tasks/histogram_seeds.py). Noise on every pair of every class; classes in
    parallel; the candidates are post-processing of stage 1's release (public)."""
    from tasks.cluster import map_shards
    from tasks.histogram_seeds import pair_candidates, pair_mechanism, shard_class_pair_counts, stage_budgets
    from tasks.vocabulary import DEFAULT_ENGLISH_TOP_N, load_vocabulary

    top_n = cfg.vocab_top or DEFAULT_ENGLISH_TOP_N
    vocabulary = load_vocabulary(cfg.vocab, top_n)
    candidates = [pair_candidates(r, cfg.markov_pair_top) for r in _term_releases(terms, cfg)]
    parts = map_shards(shard_class_pair_counts, shards, list(labels), cfg.vocab, top_n, candidates,
                       cfg.markov_pair_terms)
    counts = np.sum(parts, axis=0)
    eps_2, delta_2 = stage_budgets(cfg.method, cfg.histogram_epsilon, cfg.delta, cfg.markov_term_share)[1]
    mechanism = pair_mechanism(cfg.mechanism, cfg.markov_pair_terms, eps_2, delta_2)
    noise = cfg.noise("markov-noise")
    params = {**_histogram_params(cfg, vocabulary.name, len(vocabulary)), "stage": "pairs",
              "pair_top": cfg.markov_pair_top, "pair_terms": cfg.markov_pair_terms,
              "term_share": cfg.markov_term_share, "contribution": "pairs of the first S_2 distinct candidate terms"}
    released = []
    for c in range(len(labels)):
        n = len(candidates[c])  # fewer than P only when a class has fewer than P weighted terms
        params_c = {**params, "released_terms": _ids_digest(candidates[c])}
        released.append(ledger.draw_once(
            f"markov-class{c}", mechanism=mechanism, noise=noise, params=params_c,
            exact=lambda c=c, n=n: counts[c, :n * (n - 1) // 2],
            postprocess=lambda noisy, ids=candidates[c]: {"pair_ids": ids},
            partition=f"class{c}", stage="markov"))
    stage_logger().info("released pair counts among %d terms per class", cfg.markov_pair_top)
    return released


def _term_releases(terms: list[dict[str, np.ndarray]], cfg: DpKpsConfig) -> list:
    """Post-processing of stage 1 (tasks.histogram_seeds.class_term_releases) from the stored noisy rows."""
    from tasks.histogram_seeds import build_mechanism, class_term_releases, stage_budgets

    eps_1, delta_1 = stage_budgets(cfg.method, cfg.histogram_epsilon, cfg.delta, cfg.markov_term_share)[0]
    mechanism = build_mechanism(cfg.mechanism, cfg.first_terms, eps_1, delta_1)
    return class_term_releases(np.stack([t["noisy"] for t in terms]), mechanism, cfg.hist_top_k,
                               cfg.hist_candidates, cfg.hist_denoise)


def _ids_digest(ids: np.ndarray) -> str:
    import hashlib

    return hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()[:16]


@task(name="sample-histogram-sequences", persist_result=False, cache_policy=NO_CACHE)
def sample_histogram_sequences(terms: list[dict[str, np.ndarray]], pairs: list[dict[str, np.ndarray]] | None,
                               labels: list, cfg: DpKpsConfig) -> pd.DataFrame:
    """Post-processing of the released histograms: per_class sequences of length L per class (public rng)."""
    from dataclasses import replace

    from tasks.histogram_seeds import noise_floor, pair_matrix, pair_mechanism, sample_class_sequences, stage_budgets
    from tasks.ledger import public_rng
    from tasks.sampling import SelectionRule
    from tasks.vocabulary import DEFAULT_ENGLISH_TOP_N, load_vocabulary

    vocabulary = load_vocabulary(cfg.vocab, cfg.vocab_top or DEFAULT_ENGLISH_TOP_N)
    releases = _term_releases(terms, cfg)
    if pairs is not None:  # pair counts that pure noise reaches in about markov_pair_floor of a class's pairs
        eps_2, delta_2 = stage_budgets(cfg.method, cfg.histogram_epsilon, cfg.delta, cfg.markov_term_share)[1]
        mechanism = pair_mechanism(cfg.mechanism, cfg.markov_pair_terms, eps_2, delta_2)
        for c, released in enumerate(pairs):
            n = len(released["pair_ids"])
            floor = noise_floor(mechanism, n * (n - 1) // 2, cfg.markov_pair_floor)
            releases[c] = replace(releases[c], pair_ids=released["pair_ids"],
                                  pair_weights=pair_matrix(released["noisy"], n, floor))
    rule = SelectionRule.parse(selection_rule(cfg))
    ids = sample_class_sequences(cfg.method, releases, cfg.per_class, cfg.length, rule, public_rng(cfg.seed, "sample"),
                                 cfg.markov_pair_weight)
    rows = [(label, [vocabulary.terms[t] for t in seq]) for c, label in enumerate(labels) for seq in ids[c]]
    stage_logger().info("sampled %d sequences per class (%s, %s)", cfg.per_class, cfg.method, rule)
    sequences = pd.DataFrame({"label": [r[0] for r in rows], "keyphrases": [r[1] for r in rows]})
    # The terms sequences can contain (every class's weighted terms) are what generation may mint prompt seeds from.
    released_terms = sorted({vocabulary.terms[int(t)] for r in releases for t in r.term_ids})
    sequences.attrs["released_vocabulary"] = released_terms
    sequences.attrs["released_vocabulary_source"] = "ledger:histogram"
    return sequences


def privatize_histogram_sequences(corpus: pd.DataFrame, labels: list, cfg: DpKpsConfig,
                                  ledger: PrivacyLedger) -> pd.DataFrame:
    """count per class -> noise + top K (-> pair counts + noise) -> sample per class."""
    shards = corpus_shards(corpus, cfg.n_workers)
    exact = class_term_histograms(shards, labels, cfg)
    terms = privatize_class_histograms(exact, labels, cfg, ledger)
    del exact
    pairs = privatize_class_pairs(shards, labels, terms, cfg, ledger) if cfg.method == "histogram-markov" else None
    return sample_histogram_sequences(terms, pairs, labels, cfg)


@task(name="render-without-llm", persist_result=False, cache_policy=NO_CACHE)
def render_without_llm(sequences: pd.DataFrame) -> pd.DataFrame:
    """The paper's no-LLM ablation: the released keyphrases joined by single spaces are the document."""
    synthetic = sequences.copy()
    synthetic["text"] = synthetic["keyphrases"].map(lambda phrases: " ".join(phrases))
    return synthetic[["text", "label", "keyphrases", *[c for c in synthetic.columns if c not in ("text", "label", "keyphrases")]]]


@task(name="publish-release", retries=2, retry_condition_fn=retry_if_transient,
      retry_delay_seconds=[2, 10], persist_result=False, cache_policy=NO_CACHE)
def publish(cfg: DpKpsConfig, synthetic: pd.DataFrame, ledger: PrivacyLedger, labels: list,
            class_names: dict[str, str] | None = None, generation_report: dict | None = None) -> dict:
    """Gate and publish. ``generation_report`` (counts of synthetic rows and candidates from
    tasks.generation.split_documents) goes into quality.json beside the gate's result."""
    import json

    from tasks.quality import DocumentRules, release_gate

    gate, extra = None, {}
    if cfg.gate:
        check = release_gate(labels=labels, llm_used=cfg.llm != "none", rules=DocumentRules(language=cfg.language))
        gate = (lambda df: {**check(df), "generation": generation_report}) if generation_report else check
    elif generation_report:
        extra["quality.json"] = json.dumps({"gate": "off", "generation": generation_report}, indent=2).encode()
    config = cfg.public_dict()
    # The manifest says whether prompts named the classes, and with which public names.
    config["prompt_class_names"] = class_names if cfg.llm != "none" else None
    return publish_release(cfg.out, synthetic, ledger=ledger, config=config, gate=gate, extra_files=extra,
                           storage_options=cfg.storage_options, allow_insecure=cfg.allow_insecure_release)


def _check_local_model(llm: str) -> None:
    """A local model that is missing (or an opt-in one whose parts are not installed or do not verify) stops
    the run here, before any private data is read or budget is spent; an opt-in model is assembled now, once,
    rather than by every Dask worker at its first call."""
    from tasks.llm import get_backend, parse_llm_spec

    spec = parse_llm_spec(llm)
    if spec.kind == "local":
        get_backend(spec)  # resolves (and verifies) the weights; they are loaded only at the first call


# ---------------------------------------------------------------------------------------------------
# The flow
# ---------------------------------------------------------------------------------------------------
@flow(name="dpkps", log_prints=True)
def dpkps_flow(config: dict[str, Any]) -> dict:
    """DP-KPS end to end; ``config`` is a DpKpsConfig as a dict (JSON-able, so deployments can pass it)."""
    # Environment defaults (PRIVSEED_*) apply under the parameters, so deployments honour them like the CLI.
    cfg = build_config(DpKpsConfig, config)
    logger = get_run_logger()
    from tasks.generation import class_names_from_config

    # Checked before any private data is read. A names file with no --labels declares the label set itself.
    class_names = class_names_from_config(cfg)
    if class_names is not None and cfg.labels is None:
        cfg = cfg.model_copy(update={"labels": class_names.labels})
    _check_local_model(cfg.llm)
    warn_if_insecure(cfg, logger)
    if cfg.dry_run:  # before the corpus is read and the ledger opens: nothing drawn, charged or sent
        return dry_run(cfg)
    with dask_client(cfg.dask_address, cfg.n_workers):
        corpus = load_private_corpus(cfg)
        labels = resolve_labels(cfg, corpus)
        ledger = open_ledger(cfg, corpus)
        if cfg.method in ("histogram", "histogram-markov"):
            sequences = privatize_histogram_sequences(corpus, labels, cfg, ledger)
        else:
            sequences = privatize_keyphrase_sequences(corpus, labels, cfg, ledger)
        del corpus  # nothing private is needed past this line
        report = None
        if cfg.llm == "none":
            synthetic = render_without_llm(sequences)
        else:
            from tasks.generation import generate_documents, split_documents

            synthetic, report = split_documents(generate_documents(sequences, cfg), cfg.max_regenerations)
            logger.info("generation: %d documents kept, %d seeds dropped with no document after %d regeneration "
                        "rounds (%s)", report["rows_kept"], report["rows_dropped"], cfg.max_regenerations,
                        report["dropped_by_reason"] or "none")
        manifest = publish(cfg, synthetic, ledger, labels, None if class_names is None else class_names.to_dict(),
                           report)
    epsilon, delta = ledger.total()
    logger.info("release %s: %d documents, epsilon=%g, delta=%g, at %s",
                manifest["release_id"], manifest["rows"], epsilon, delta, cfg.out)
    log_cumulative_total(ledger)
    return manifest


def placeholder_sequences(cfg: DpKpsConfig) -> pd.DataFrame:
    """Seeds of the shape a run releases (per_class sequences of L one-word terms per declared class), made
    from public settings only, for the dry run's cost estimate."""
    term = "keyphrase"
    sequences = pd.DataFrame({"label": [label for label in cfg.labels for _ in range(cfg.per_class)],
                              "keyphrases": [[term] * cfg.length for _ in range(len(cfg.labels) * cfg.per_class)]})
    sequences.attrs["released_vocabulary"] = [term]
    sequences.attrs["released_vocabulary_source"] = "dry-run placeholder"
    return sequences


def dry_run(cfg: DpKpsConfig) -> dict:
    """``dry_run``: the LLM calls a run would send and what they would cost, from public settings only (the
    declared labels, per_class, L and the generation options). The corpus is not read, no ledger is opened:
    nothing is drawn, charged or sent. Terms are placeholders, so the input-token count is an estimate."""
    list_shards(cfg.data, cfg.storage_options)  # a wrong path fails now, not at the real run
    if cfg.llm == "none":
        description = "--llm none sends no LLM call"
        result = {"dry_run": True, "estimate": description, "calls": 0, "usd": 0.0, "tokens_in": 0,
                  "tokens_out_max": 0}
    else:
        from tasks.generation import estimate_generation

        estimate = estimate_generation(placeholder_sequences(cfg), cfg)
        result = {"dry_run": True, "estimate": estimate.describe(), "calls": estimate.calls, "usd": estimate.usd,
                  "tokens_in": estimate.tokens_in, "tokens_out_max": estimate.tokens_out_max}
    stage_logger().info("dry run, nothing drawn, charged or sent: %s", result["estimate"])
    return result


# ---------------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------------
def add_release_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by every method that writes a release (dpkps, augpe, secpe)."""
    parser.add_argument("data", help="private corpus: Parquet file, folder or shard prefix (local, file://, s3://)")
    parser.add_argument("--out", required=True, help="release folder (local or s3://)")
    parser.add_argument("--config", dest="config_file", help="TOML or YAML file with defaults for these flags")
    parser.add_argument("--text-column")
    parser.add_argument("--label-column")
    parser.add_argument("--labels", type=lambda s: [x.strip() for x in s.split(",") if x.strip()],
                        help="the public label set, comma separated (required, or --labels-file / the config file)")
    parser.add_argument("--labels-file", help="a file with the label set, one label per line (# comments)")
    parser.add_argument("--per-class", type=int, help="synthetic documents per class")
    parser.add_argument("--llm", help="none | local[:GGUF] | anthropic[:MODEL] | openai-compatible:URL")
    parser.add_argument("--doc-type", help="what to write, e.g. 'Wikipedia article' (never a class name)")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--run-id", help="resume this run: re-read its drawn values (default: a new random run id)")
    parser.add_argument("--state", help="the owner's private state: identity key, drawn values, LLM cache "
                                        "(default OUT.private beside OUT; never inside OUT, never shared)")
    parser.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                        help="fsspec/s3fs option, e.g. endpoint_url=http://127.0.0.1:9000 (repeatable)")
    parser.add_argument("--dask-address", help="an existing Dask scheduler (default: a LocalCluster)")
    parser.add_argument("--workers", dest="n_workers", type=int, help="LocalCluster workers (default 2)")
    parser.add_argument("--no-gate", dest="gate", action="store_const", const=False, help="skip the release gate")
    parser.add_argument("--insecure-reproducible-noise", action="store_const", const=True,
                        help="research grids only: noise from --seed, bit-identical reruns; the release is NOT "
                             "differentially private (stamped, and refused unless --allow-insecure-release)")
    parser.add_argument("--allow-insecure-release", action="store_const", const=True,
                        help="publish a release made with --insecure-reproducible-noise anyway")
    parser.add_argument("--prompt-template", help="'generic' (the paper's prompt), 'coverage', or a YAML file")
    parser.add_argument("--temperature", type=float, help="LLM sampling temperature (default 0.7)")
    parser.add_argument("--max-tokens", type=int, help="output tokens per LLM call (default 256)")
    parser.add_argument("--best-of", type=int, help="candidates per seed, best by seed-term coverage (default 1)")
    parser.add_argument("--max-regenerations", type=int,
                        help="rounds of regeneration for a seed with no document among its candidates (default 3); "
                             "seeds still without one are dropped and counted in quality.json")
    parser.add_argument("--steer", type=float, help="seed steering strength for local models (default 4; 0 turns it off)")
    parser.add_argument("--repeat-penalty", type=float, help="llama.cpp repeat penalty for local models (1: off)")
    parser.add_argument("--no-repeat-ngram", type=int, help="local models: ban repeating a token n-gram (default 4; 0: off)")
    parser.add_argument("--language", help="the corpus's declared language for the document test "
                                           "(en default; de, fr, es, it, pt, nl; none)")
    parser.add_argument("--llm-concurrency", type=int, help="calls in flight for remote APIs (default 4)")
    parser.add_argument("--llm-secret", help="Prefect Secret block with the API key (default: the environment)")


def flags_from_args(args: argparse.Namespace, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    values = {k: v for k, v in vars(args).items() if k not in ("func", "config_file", "storage_option", "verbose", "command", *skip)}
    if args.storage_option:
        values["storage_options"] = storage.parse_storage_options(args.storage_option)
        storage.refuse_literal_secrets(values["storage_options"])
    return values


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("dpkps", help="DP-KPS: DP keyphrase sequences seed one LLM prompt per document",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_release_arguments(parser)
    parser.add_argument("--vocab", help="'english' or a file of terms, one per line")
    parser.add_argument("--vocab-top", type=int, help="public frequency cut of the English list (default 50000)")
    parser.add_argument("--eps-voc", type=float, help="epsilon of the vocabulary histogram (default 1.0)")
    parser.add_argument("--eps-kde", type=float, help="epsilon of the DP-KDE sketches (default 10.0)")
    parser.add_argument("--delta", type=float, help="delta, for --mechanism gaussian")
    parser.add_argument("--mechanism", choices=["laplace", "gaussian"])
    parser.add_argument("--method", choices=["independent", "iterative-linear", "iterative-log", "histogram",
                                             "histogram-markov"],
                        help="DP-KPS sampler, or privseed's per-class DP term histograms (docs/dpkps.md)")
    parser.add_argument("--epsilon", type=float,
                        help="total budget of the histogram methods (default eps_voc + eps_kde)")
    parser.add_argument("--hist-top-k", type=int, help="K: noisy terms kept per class by the histogram methods")
    parser.add_argument("--markov-pair-floor", type=float,
                        help="histogram-markov: sample as 0 the pair counts pure noise reaches in about this many "
                             "entries per class (default 1)")
    parser.add_argument("--markov-term-share", type=float,
                        help="histogram-markov: share of --epsilon for the term histogram (rest: the pairs)")
    parser.add_argument("--length", type=int, help="keyphrases per sequence (default 10)")
    parser.add_argument("--first-terms", type=int, help="S: terms per document in the histogram (default 10)")
    parser.add_argument("--vocab-size", type=int, help="N: privatized vocabulary size (default 1000)")
    parser.add_argument("--features", dest="n_features", type=int, help="I: random Fourier features (default 300)")
    parser.add_argument("--bandwidth", type=float, help="h: kernel bandwidth (default 0.5)")
    parser.add_argument("--selection", choices=["proportional", "greedy", "top-k", "power"],
                        help="how the next phrase is drawn (default: power-2 for independent, top-5 for iterative)")
    parser.add_argument("--power", type=float, help="G for --selection power (default 2)")
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--embedding-model", help="'minilm' or a local sentence-transformers folder")
    parser.add_argument("--few-shot", help="the recipient's few-shot examples (document + keyphrases)")
    parser.add_argument("--class-names", metavar="FILE",
                        help="public class names (JSON/TOML/CSV: label -> name, exactly the declared labels); "
                             "each prompt then names its class. Only when the names are public")
    parser.add_argument("--dry-run", action="store_const", const=True,
                        help="print the LLM cost estimate; read no data, draw, charge and send nothing")
    parser.set_defaults(func=run_from_cli)


def run_from_cli(args: argparse.Namespace) -> int:
    cfg = build_config(DpKpsConfig, flags_from_args(args), args.config_file)
    manifest = dpkps_flow(cfg.model_dump())
    if manifest.get("dry_run"):
        print(f"dry run, nothing drawn, charged or sent: {manifest['estimate']}")
        return 0
    print(f"release {manifest['release_id']}: {manifest['rows']} synthetic documents")
    print(f"  synthetic corpus: {storage.join(cfg.out, 'synthetic')}")
    print(f"  ledger:           {storage.join(cfg.out, 'ledger.json')}  (epsilon={manifest['privacy']['epsilon']:g})")
    print(f"  manifest:         {storage.join(cfg.out, 'manifest.json')}")
    return 0
