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

import flows._runtime  # noqa: F401  (offline settings before prefect is imported)
import numpy as np
import pandas as pd
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from tasks import storage
from tasks.cluster import dask_client
from tasks.config import DpKpsConfig, ReleaseConfig, build_config
from tasks.corpus import dataset_fingerprint, list_shards, publish_release, read_shard
from tasks.errors import ConfigError, CorpusError, retry_if_transient
from tasks.ledger import PrivacyLedger

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------
# Tasks: thin wrappers that do I/O around the pure functions in tasks/.
# ---------------------------------------------------------------------------------------------------
@task(name="load-private-corpus", retries=2, retry_condition_fn=retry_if_transient,
      retry_delay_seconds=[2, 10], persist_result=False, cache_policy=NO_CACHE)
def load_private_corpus(cfg: ReleaseConfig) -> pd.DataFrame:
    """All shards of the private corpus, read in parallel on the cluster."""
    from tasks.cluster import map_shards

    shards = list_shards(cfg.data, cfg.storage_options)
    frames = map_shards(read_shard, shards, cfg.text_column, cfg.label_column, cfg.storage_options)
    corpus = pd.concat(frames, ignore_index=True)
    if corpus.empty:
        raise CorpusError(f"the corpus at {cfg.data!r} is empty (0 rows in {len(shards)} shard(s))")
    get_run_logger().info("loaded the private corpus from %d shard(s)", len(shards))
    return corpus


def resolve_labels(cfg: ReleaseConfig, corpus: pd.DataFrame) -> list:
    """The public label set. Declared labels are authoritative: a declared class with no documents is
    still sampled (from pure noise), so an empty class is never revealed by a different code path."""
    present = sorted(corpus["label"].unique().tolist(), key=str)
    if cfg.labels is None:
        return present
    declared = [_as_label_type(label, present) for label in cfg.labels]
    unknown = sorted({str(v) for v in present} - {str(v) for v in declared})
    if unknown:
        raise ConfigError(f"the corpus has labels that are not in --labels: {', '.join(unknown[:10])}")
    return declared


def _as_label_type(label: Any, present: list) -> Any:
    """Labels declared on the command line are strings; match the corpus's integer labels."""
    if present and all(isinstance(v, (int, np.integer)) for v in present):
        try:
            return int(label)
        except (TypeError, ValueError):
            return label
    return label


@task(name="open-ledger", persist_result=False, cache_policy=NO_CACHE)
def open_ledger(cfg: ReleaseConfig, fingerprint: str) -> PrivacyLedger:
    run_id = cfg.run_id or cfg.privacy_key(fingerprint)
    ledger = PrivacyLedger(cfg.state_uri, fingerprint, run_id, cfg.storage_options)
    get_run_logger().info("privacy ledger for run %s (%d release(s) already drawn)", run_id, len(ledger.entries()))
    return ledger


# -- DP-KPS privatization stages (steps 2-6 of DESIGN.md). Pure math lives in tasks/vocabulary.py,
# tasks/kde.py and tasks/sampling.py; these wrappers map it over shards and route every release through
# the ledger, so noise is drawn once and re-read on retry or re-run.
PRIVATE_TASK = dict(persist_result=False, cache_policy=NO_CACHE)

#: Selection rule used when --selection is not given, chosen on public data (docs/dpkps.md).
DEFAULT_SELECTION = {"independent": "power-2", "iterative-linear": "top-5", "iterative-log": "top-5"}


def _stage_logger():
    """The run logger inside a flow; the module logger when a stage body is called directly (tests)."""
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return log


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


@task(name="privatize-vocabulary", retries=2, retry_condition_fn=retry_if_transient,
      retry_delay_seconds=[2, 10], **PRIVATE_TASK)
def privatize_vocabulary_stage(counts: np.ndarray, cfg: DpKpsConfig, ledger: PrivacyLedger) -> list[str]:
    """V~: Laplace(S / eps_voc) on every term of V, top N. Drawn once through the ledger."""
    from tasks.ledger import stage_rng
    from tasks.vocabulary import DEFAULT_ENGLISH_TOP_N, load_vocabulary, privatize_vocabulary

    top_n = cfg.vocab_top or DEFAULT_ENGLISH_TOP_N
    vocabulary = load_vocabulary(cfg.vocab, top_n)
    params = {"vocab": vocabulary.name, "vocab_terms": len(vocabulary), "first_terms": cfg.first_terms,
              "vocab_size": cfg.vocab_size, "seed": cfg.seed, "adjacency": "add/remove one document"}
    released = ledger.draw_once(
        "vocabulary", mechanism="laplace", params=params, epsilon=cfg.eps_voc, sensitivity=float(cfg.first_terms),
        stage="vocabulary",
        draw=lambda: privatize_vocabulary(counts, epsilon=cfg.eps_voc, max_terms_per_doc=cfg.first_terms,
                                          top_n=cfg.vocab_size, rng=stage_rng(cfg.seed, "vocabulary-noise")),
    )
    terms = [vocabulary.terms[i] for i in released["term_ids"]]
    _stage_logger().info("privatized vocabulary: %d terms", len(terms))
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
    from tasks.kde import release_sketch, sensitivity, sketch_sums_of_shard
    from tasks.ledger import stage_rng
    from tasks.sampling import split_budget

    specs = feature_specs(cfg, embeddings.shape[1])
    parts = map_shards(sketch_sums_of_shard, shards, labels, tuple(terms), embeddings, specs, cfg.method == "independent")
    exact = np.sum(parts, axis=0)
    budgets = split_budget(cfg.method, cfg.eps_kde, cfg.length)
    delta_each = cfg.delta / len(specs) if cfg.mechanism == "gaussian" else 0.0
    released = np.zeros_like(exact)
    for c in range(len(labels)):
        for k, spec in enumerate(specs):
            params = {"method": cfg.method, "length": cfg.length, "sketch": k, "blocks": spec.blocks,
                      "n_features": spec.n_features, "bandwidth": spec.bandwidth, "feature_seed": spec.seed,
                      "feature_stream": spec.name, "embedding_model": cfg.embedding_model, "dim": spec.dim,
                      "mechanism": cfg.mechanism, "vocabulary": _terms_digest(terms),
                      "adjacency": "add/remove one document", "contribution": "sum of per-document phi"}
            released[c, k] = ledger.draw_once(
                f"kde-class{c}-sketch{k}", mechanism=cfg.mechanism, params=params, epsilon=budgets[k],
                delta=delta_each, sensitivity=sensitivity(cfg.mechanism, spec.n_features),
                partition=f"class{c}", stage="kde",
                draw=lambda c=c, k=k: {"noisy_sum": release_sketch(
                    exact[c, k], epsilon=budgets[k], delta=delta_each, mechanism=cfg.mechanism,
                    rng=stage_rng(cfg.seed, "kde-noise", str(c), str(k)))},
            )["noisy_sum"]
    _stage_logger().info("released %d sketch(es) per class, I=%d", len(specs), cfg.n_features)
    return released


def _terms_digest(terms: list[str]) -> str:
    import hashlib

    return hashlib.sha256("\n".join(terms).encode()).hexdigest()[:16]


@task(name="sample-sequences", retries=2, retry_condition_fn=retry_if_transient,
      retry_delay_seconds=[2, 10], **PRIVATE_TASK)
def sample_keyphrase_sequences(released: np.ndarray, labels: list, terms: list[str], embeddings: np.ndarray,
                               cfg: DpKpsConfig) -> pd.DataFrame:
    """Post-processing of the released sketches: per_class sequences of length L per class."""
    from tasks.ledger import stage_rng
    from tasks.sampling import SelectionRule, SketchTables, default_device, sample_sequences

    device = default_device()
    rule = SelectionRule.parse(selection_rule(cfg))
    sketches = [SketchTables.build(spec.draw(), embeddings, device=device)
                for spec in feature_specs(cfg, embeddings.shape[1])]
    ids = sample_sequences(cfg.method, sketches, released, per_class=cfg.per_class, length=cfg.length, rule=rule,
                           rng=stage_rng(cfg.seed, "sample"))
    rows = [(label, [terms[t] for t in seq]) for c, label in enumerate(labels) for seq in ids[c]]
    _stage_logger().info("sampled %d sequences per class (%s, %s, device %s)", cfg.per_class, cfg.method, rule, device)
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


@task(name="render-without-llm", persist_result=False, cache_policy=NO_CACHE)
def render_without_llm(sequences: pd.DataFrame) -> pd.DataFrame:
    """The paper's no-LLM ablation: the released keyphrases joined by single spaces are the document."""
    synthetic = sequences.copy()
    synthetic["text"] = synthetic["keyphrases"].map(lambda phrases: " ".join(phrases))
    return synthetic[["text", "label", "keyphrases", *[c for c in synthetic.columns if c not in ("text", "label", "keyphrases")]]]


@task(name="publish-release", retries=2, retry_condition_fn=retry_if_transient,
      retry_delay_seconds=[2, 10], persist_result=False, cache_policy=NO_CACHE)
def publish(cfg: DpKpsConfig, synthetic: pd.DataFrame, ledger: PrivacyLedger, labels: list,
            generation_report: dict | None = None) -> dict:
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
    return publish_release(cfg.out, synthetic, ledger=ledger, config=cfg.public_dict(), gate=gate,
                           extra_files=extra, storage_options=cfg.storage_options)


# ---------------------------------------------------------------------------------------------------
# The flow
# ---------------------------------------------------------------------------------------------------
@flow(name="dpkps", log_prints=True)
def dpkps_flow(config: dict[str, Any]) -> dict:
    """DP-KPS end to end; ``config`` is a DpKpsConfig as a dict (JSON-able, so deployments can pass it)."""
    # Environment defaults (PRIVSEED_*) apply under the parameters, so deployments honour them like the CLI.
    cfg = build_config(DpKpsConfig, config)
    logger = get_run_logger()
    with dask_client(cfg.dask_address, cfg.n_workers):
        corpus = load_private_corpus(cfg)
        labels = resolve_labels(cfg, corpus)
        fingerprint = dataset_fingerprint(corpus)
        ledger = open_ledger(cfg, fingerprint)
        sequences = privatize_keyphrase_sequences(corpus, labels, cfg, ledger)
        del corpus  # nothing private is needed past this line
        if cfg.dry_run:
            from tasks.generation import estimate_generation

            estimate = estimate_generation(sequences, cfg)
            logger.info("dry run, nothing sent: %s", estimate.describe())
            return {"dry_run": True, "estimate": estimate.describe(), "calls": estimate.calls,
                    "usd": estimate.usd, "tokens_in": estimate.tokens_in, "tokens_out_max": estimate.tokens_out_max}
        report = None
        if cfg.llm == "none":
            synthetic = render_without_llm(sequences)
        else:
            from tasks.generation import generate_documents, split_documents

            synthetic, report = split_documents(generate_documents(sequences, cfg), cfg.max_regenerations)
            logger.info("generation: %d documents kept, %d seeds dropped with no document after %d regeneration "
                        "rounds (%s)", report["rows_kept"], report["rows_dropped"], cfg.max_regenerations,
                        report["dropped_by_reason"] or "none")
        manifest = publish(cfg, synthetic, ledger, labels, report)
    epsilon, delta = ledger.total()
    logger.info("release %s: %d documents, epsilon=%g, delta=%g, at %s",
                manifest["release_id"], manifest["rows"], epsilon, delta, cfg.out)
    return manifest


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
                        help="the public label set, comma separated (default: read from the data)")
    parser.add_argument("--per-class", type=int, help="synthetic documents per class")
    parser.add_argument("--llm", help="none | local[:GGUF] | anthropic[:MODEL] | openai-compatible:URL")
    parser.add_argument("--doc-type", help="what to write, e.g. 'Wikipedia article' (never a class name)")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--run-id", help="re-use the released values of this run (default: hash of data+config+seed)")
    parser.add_argument("--state", help="where drawn values and caches live (default OUT/_state)")
    parser.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                        help="fsspec/s3fs option, e.g. endpoint_url=http://127.0.0.1:9000 (repeatable)")
    parser.add_argument("--dask-address", help="an existing Dask scheduler (default: a LocalCluster)")
    parser.add_argument("--workers", dest="n_workers", type=int, help="LocalCluster workers (default 2)")
    parser.add_argument("--no-gate", dest="gate", action="store_const", const=False, help="skip the release gate")
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
    parser.add_argument("--method", choices=["independent", "iterative-linear", "iterative-log"])
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
    parser.add_argument("--dry-run", action="store_const", const=True, help="print the LLM cost estimate, send nothing")
    parser.set_defaults(func=run_from_cli)


def run_from_cli(args: argparse.Namespace) -> int:
    cfg = build_config(DpKpsConfig, flags_from_args(args), args.config_file)
    manifest = dpkps_flow(cfg.model_dump())
    if manifest.get("dry_run"):
        print(f"dry run, nothing sent: {manifest['estimate']}")
        return 0
    print(f"release {manifest['release_id']}: {manifest['rows']} synthetic documents")
    print(f"  synthetic corpus: {storage.join(cfg.out, 'synthetic')}")
    print(f"  ledger:           {storage.join(cfg.out, 'ledger.json')}  (epsilon={manifest['privacy']['epsilon']:g})")
    print(f"  manifest:         {storage.join(cfg.out, 'manifest.json')}")
    return 0
