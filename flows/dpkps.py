"""DP-KPS as a Prefect flow.

    plan units -> pass 1 (labels, identity, term counts) -> privatize vocabulary -> embed V~
        -> pass 2 (sketch sums) -> privatize sketches -> sample -> generate -> gate -> publish

The private corpus never comes to this process: it is planned into work units (shard URIs and Parquet row
groups) and each pass streams every unit on the Dask workers into a partial count or sum, combined in a tree on
the cluster; only |V|-sized and sketch-sized arrays come back (docs/operations.md, "Corpus size").

Privacy boundary: everything before ``sample`` touches private documents and runs with results kept in
memory only (``persist_result=False``): persisting them in Prefect's result store would copy private data
to a second place. What must survive a crash is exactly what was released, and that is persisted by the
privacy ledger (draw once, re-read on retry) and by the LLM call cache. A resumed run recomputes the private
intermediates deterministically and re-reads every released value. The stages are in tasks/stages/.
"""

from __future__ import annotations

import argparse
from typing import Any

import tasks._runtime  # noqa: F401  (offline settings before prefect is imported)
import numpy as np
import pandas as pd
from prefect import flow, get_run_logger

from tasks import storage
from tasks.cluster import dask_client
from tasks.config import DpKpsConfig, build_config
from tasks.histogram_seeds import HISTOGRAM_METHODS
from tasks.ledger import PrivacyLedger
from tasks.stages.corpus import declared_labels, plan_private_corpus, scan_private_corpus
from tasks.stages.dpkps import (embed_released_vocabulary, exact_sketch_sums, privatize_sketches,
                                privatize_vocabulary_stage, sample_keyphrase_sequences, term_counting)
from tasks.stages.generation import check_local_model, dry_run, generate_release_documents, with_class_names
from tasks.stages.histogram import (exact_pair_counts, privatize_class_histograms, privatize_class_pairs,
                                    sample_histogram_sequences)
from tasks.stages.ledger import log_cumulative_total, open_ledger, warn_if_insecure
from tasks.stages.release import publish, render_without_llm
from tasks.units import CorpusPlan


@flow(name="dpkps", log_prints=True)
def dpkps_flow(config: dict[str, Any]) -> dict:
    """DP-KPS end to end; ``config`` is a DpKpsConfig as a dict (JSON-able, so deployments can pass it)."""
    # Environment defaults (PRIVSEED_*) apply under the parameters, so deployments honour them like the CLI.
    cfg, class_names = with_class_names(build_config(DpKpsConfig, config))
    check_local_model(cfg.llm)  # before any private data is read or budget is spent
    warn_if_insecure(cfg, get_run_logger())
    if cfg.dry_run:  # before the corpus is read and the ledger opens: nothing drawn, charged or sent
        return dry_run(cfg)
    with dask_client(cfg.dask_address, cfg.n_workers):
        plan = plan_private_corpus(cfg)
        labels = declared_labels(cfg, plan.integer_labels)
        scan = scan_private_corpus(plan, labels, cfg, term_counting(cfg))  # pass 1
        ledger = open_ledger(cfg, scan.identity)
        privatize = privatize_histogram_sequences if cfg.method in HISTOGRAM_METHODS else privatize_keyphrase_sequences
        sequences = privatize(plan, scan.counts, labels, cfg, ledger)  # pass 2 and every noisy release
        del scan  # nothing private is needed past this line
        synthetic, report = ((render_without_llm(sequences), None) if cfg.llm == "none"
                             else generate_release_documents(sequences, cfg))
        manifest = publish(cfg, synthetic, ledger, labels, class_names, report)
    epsilon, delta = ledger.total()
    get_run_logger().info("release %s: %d documents, epsilon=%g, delta=%g, at %s",
                          manifest["release_id"], manifest["rows"], epsilon, delta, cfg.out)
    log_cumulative_total(ledger)
    return manifest


def privatize_keyphrase_sequences(plan: CorpusPlan, counts: np.ndarray, labels: list, cfg: DpKpsConfig,
                                  ledger: PrivacyLedger) -> pd.DataFrame:
    """privatize vocabulary -> embed V~ -> pass 2: sketch sums -> privatize sketches -> sample per class."""
    terms = privatize_vocabulary_stage(counts, cfg, ledger)
    embeddings = embed_released_vocabulary(terms, cfg)
    exact = exact_sketch_sums(plan, labels, terms, embeddings, cfg)
    released = privatize_sketches(exact, labels, terms, embeddings, cfg, ledger)
    return sample_keyphrase_sequences(released, labels, terms, embeddings, cfg)


def privatize_histogram_sequences(plan: CorpusPlan, counts: np.ndarray, labels: list, cfg: DpKpsConfig,
                                  ledger: PrivacyLedger) -> pd.DataFrame:
    """noise + top K per class (-> pass 2: pair counts -> noise) -> sample per class."""
    terms = privatize_class_histograms(counts, labels, cfg, ledger)
    pairs = None
    if cfg.method == "histogram-markov":
        starts, pair_counts = exact_pair_counts(plan, labels, terms, cfg)
        pairs = privatize_class_pairs(starts, pair_counts, labels, terms, cfg, ledger)
    return sample_histogram_sequences(terms, pairs, labels, cfg)


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
