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
from tasks.config import DpKpsConfig, build_config
from tasks.corpus import dataset_fingerprint, list_shards, publish_release, read_shard
from tasks.errors import ConfigError, CorpusError
from tasks.ledger import PrivacyLedger

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------
# Tasks: thin wrappers that do I/O around the pure functions in tasks/.
# ---------------------------------------------------------------------------------------------------
@task(name="load-private-corpus", retries=2, retry_delay_seconds=[2, 10], persist_result=False, cache_policy=NO_CACHE)
def load_private_corpus(cfg: DpKpsConfig) -> pd.DataFrame:
    """All shards of the private corpus, read in parallel on the cluster."""
    from tasks.cluster import map_shards

    shards = list_shards(cfg.data, cfg.storage_options)
    frames = map_shards(read_shard, shards, cfg.text_column, cfg.label_column, cfg.storage_options)
    corpus = pd.concat(frames, ignore_index=True)
    if corpus.empty:
        raise CorpusError(f"the corpus at {cfg.data!r} is empty (0 rows in {len(shards)} shard(s))")
    get_run_logger().info("loaded the private corpus from %d shard(s)", len(shards))
    return corpus


def resolve_labels(cfg: DpKpsConfig, corpus: pd.DataFrame) -> list:
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
def open_ledger(cfg: DpKpsConfig, fingerprint: str) -> PrivacyLedger:
    run_id = cfg.run_id or cfg.privacy_key(fingerprint)
    ledger = PrivacyLedger(cfg.state_uri, fingerprint, run_id, cfg.storage_options)
    get_run_logger().info("privacy ledger for run %s (%d release(s) already drawn)", run_id, len(ledger.entries()))
    return ledger


@task(name="render-without-llm", persist_result=False, cache_policy=NO_CACHE)
def render_without_llm(sequences: pd.DataFrame) -> pd.DataFrame:
    """The paper's no-LLM ablation: the released keyphrases joined by single spaces are the document."""
    synthetic = sequences.copy()
    synthetic["text"] = synthetic["keyphrases"].map(lambda phrases: " ".join(phrases))
    return synthetic[["text", "label", "keyphrases", *[c for c in synthetic.columns if c not in ("text", "label", "keyphrases")]]]


@task(name="publish-release", retries=2, retry_delay_seconds=[2, 10], persist_result=False, cache_policy=NO_CACHE)
def publish(cfg: DpKpsConfig, synthetic: pd.DataFrame, ledger: PrivacyLedger, labels: list) -> dict:
    gate = None
    if cfg.gate:
        from tasks.quality import release_gate

        gate = release_gate(labels=labels, llm_used=cfg.llm != "none")
    return publish_release(cfg.out, synthetic, ledger=ledger, config=cfg.public_dict(), gate=gate,
                           storage_options=cfg.storage_options)


# ---------------------------------------------------------------------------------------------------
# The flow
# ---------------------------------------------------------------------------------------------------
@flow(name="dpkps", log_prints=True)
def dpkps_flow(config: dict[str, Any]) -> dict:
    """DP-KPS end to end; ``config`` is a DpKpsConfig as a dict (JSON-able, so deployments can pass it)."""
    from tasks.sampling import privatize_keyphrase_sequences

    cfg = DpKpsConfig.model_validate(config)
    logger = get_run_logger()
    with dask_client(cfg.dask_address, cfg.n_workers):
        corpus = load_private_corpus(cfg)
        labels = resolve_labels(cfg, corpus)
        fingerprint = dataset_fingerprint(corpus)
        ledger = open_ledger(cfg, fingerprint)
        sequences = privatize_keyphrase_sequences(corpus, labels, cfg, ledger)
        del corpus  # nothing private is needed past this line
        if cfg.llm == "none":
            synthetic = render_without_llm(sequences)
        else:
            from tasks.generation import generate_documents

            synthetic = generate_documents(sequences, cfg)
        manifest = publish(cfg, synthetic, ledger, labels)
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


def flags_from_args(args: argparse.Namespace, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    values = {k: v for k, v in vars(args).items() if k not in ("func", "config_file", "storage_option", "verbose", "command", *skip)}
    if args.storage_option:
        values["storage_options"] = storage.parse_storage_options(args.storage_option)
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
    parser.add_argument("--selection", choices=["proportional", "greedy", "top-k"])
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--embedding-model", help="'minilm' or a local sentence-transformers folder")
    parser.add_argument("--few-shot", help="the recipient's few-shot examples (document + keyphrases)")
    parser.add_argument("--dry-run", action="store_const", const=True, help="print the LLM cost estimate, send nothing")
    parser.set_defaults(func=run_from_cli)


def run_from_cli(args: argparse.Namespace) -> int:
    cfg = build_config(DpKpsConfig, flags_from_args(args), args.config_file)
    manifest = dpkps_flow(cfg.model_dump())
    print(f"release {manifest['release_id']}: {manifest['rows']} synthetic documents")
    print(f"  synthetic corpus: {storage.join(cfg.out, 'synthetic')}")
    print(f"  ledger:           {storage.join(cfg.out, 'ledger.json')}  (epsilon={manifest['privacy']['epsilon']:g})")
    print(f"  manifest:         {storage.join(cfg.out, 'manifest.json')}")
    return 0
