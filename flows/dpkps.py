"""DP-KPS as a Prefect flow.

    plan units -> pass 1 (labels, identity, term counts) -> privatize vocabulary -> embed V~
        -> pass 2 (sketch sums) -> privatize sketches -> sample -> generate -> gate -> [approval] -> publish

The histogram methods (the default): pass 1 (labels, identity, per-class term weights, the corpus profile) ->
[release the corpus profile, settle the options left "auto"] -> privatize class histograms [-> K and L left
"auto" follow the release] [-> pass 2 (pairs) -> privatize pairs] -> sample -> generate -> ...

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


import numpy as np
import pandas as pd
from prefect import flow, get_run_logger

from privseed.tasks._runtime import apply_offline_defaults
from privseed.tasks import storage
from privseed.tasks.data.cluster import cluster_security, dask_client
from privseed.tasks.config.commands import TYPED_FLOW, DpKpsConfig, flow_config
from privseed.tasks.config.preflight import check_approval_server
from privseed.tasks.dp.ledger import PrivacyLedger
from privseed.tasks.seeds.seed_methods import HISTOGRAM_METHODS, SEED_METHODS
from privseed.tasks.stages.approval import await_approval
from privseed.tasks.stages.artifacts import release_artifacts
from privseed.tasks.stages.corpus import declared_labels, plan_private_corpus, scan_private_corpus
from privseed.tasks.stages.dpkps import (embed_released_vocabulary, exact_sketch_sums, privatize_sketches,
                                         privatize_vocabulary_stage, sample_keyphrase_sequences, term_counting)
from privseed.tasks.stages.generation import check_local_model, dry_run, generate_release_documents, with_class_names
from privseed.tasks.stages.histogram import (exact_pair_counts, privatize_class_histograms, privatize_class_pairs,
                                             sample_histogram_sequences, settle_after_release,
                                             settle_histogram_settings)
from privseed.tasks.stages.ledger import log_cumulative_total, open_ledger, state_summary, warn_if_insecure
from privseed.tasks.stages.release import publish, render_without_llm
from privseed.tasks.data.units import CorpusPlan


@flow(name="dpkps", log_prints=True, **TYPED_FLOW)
def dpkps_flow(config: DpKpsConfig) -> dict:
    """DP-KPS end to end. ``config`` is typed, so a deployment's form shows every option with its type, default,
    choices and help, and Prefect refuses a bad value when the run is submitted (a dict of fields is accepted)."""
    apply_offline_defaults()  # a run started by a deployment worker: the models and GX stay offline
    cfg, class_names = with_class_names(flow_config(DpKpsConfig, config))
    check_local_model(cfg.llm, cfg.doc_type)  # before any private data is read or budget is spent
    check_approval_server(cfg)  # --require-approval: a person must be able to reach this run
    warn_if_insecure(cfg, get_run_logger())
    if cfg.dry_run:  # before the corpus is read and the ledger opens: nothing drawn, charged or sent
        return dry_run(cfg)
    with dask_client(cfg.dask_address, cfg.n_workers, cluster_security(cfg)):
        plan = plan_private_corpus(cfg)
        labels = declared_labels(cfg, plan.integer_labels)
        scan = scan_private_corpus(plan, labels, cfg, term_counting(cfg))  # pass 1
        ledger = open_ledger(cfg, scan.identity)
        privatize = privatize_histogram_sequences if cfg.method in HISTOGRAM_METHODS else privatize_keyphrase_sequences
        # pass 2 and every noisy release; cfg as the run declares it from here on (the settings it derived)
        sequences, cfg = privatize(plan, scan.term_counts, labels, cfg, ledger)
        del scan  # nothing private is needed past this line
        synthetic, report = ((render_without_llm(sequences), None) if cfg.llm == "none"
                             else generate_release_documents(sequences, cfg, labels))
    if cfg.require_approval:  # the cluster is closed while the run waits: a rejection quarantines and stops here
        await_approval(cfg, synthetic, ledger, labels, report)
    manifest = publish(cfg, synthetic, ledger, labels, class_names, report)
    release_artifacts(manifest, ledger, cfg.out)  # the ledger summary and a link, in the Prefect UI
    epsilon, delta = ledger.total()
    get_run_logger().info("release %s: %d documents, epsilon=%g, delta=%g, at %s",
                          manifest["release_id"], manifest["rows"], epsilon, delta, cfg.out)
    log_cumulative_total(ledger)
    return manifest


def privatize_keyphrase_sequences(plan: CorpusPlan, counts: np.ndarray, labels: list, cfg: DpKpsConfig,
                                  ledger: PrivacyLedger) -> tuple[pd.DataFrame, DpKpsConfig]:
    """privatize vocabulary -> embed V~ -> pass 2: sketch sums -> privatize sketches -> sample per class."""
    terms = privatize_vocabulary_stage(counts, cfg, ledger)
    embeddings = embed_released_vocabulary(terms, cfg)
    exact = exact_sketch_sums(plan, labels, terms, embeddings, cfg)
    released = privatize_sketches(exact, labels, terms, embeddings, cfg, ledger)
    return sample_keyphrase_sequences(released, labels, terms, embeddings, cfg), cfg


def privatize_histogram_sequences(plan: CorpusPlan, counts: np.ndarray, labels: list, cfg: DpKpsConfig,
                                  ledger: PrivacyLedger) -> tuple[pd.DataFrame, DpKpsConfig]:
    """[corpus profile -> the settings left auto] -> noise per class [-> K and L left auto from how alike the
    classes' released terms are] (-> pass 2: pair counts among each class's heaviest terms -> noise) -> sample per
    class. Returns the seeds (their ``corpus_profile`` attribute: the
    released profile, the derived settings and the answer length, when a profile was released) and the
    configuration as the run declares it (the derived settings in place of "auto")."""
    settled = settle_histogram_settings(counts, labels, cfg, ledger)
    terms = privatize_class_histograms(settled.counts, labels, settled.spending, ledger)
    settled = settle_after_release(terms, settled.public())
    spending = settled.spending  # the derived settings, and the term stages' share of the budget
    pairs = None
    if SEED_METHODS[spending.method].ordered_pairs:
        pair_counts = exact_pair_counts(plan, labels, terms, spending)
        pairs = privatize_class_pairs(pair_counts, labels, terms, spending, ledger)
    sequences: pd.DataFrame = sample_histogram_sequences(terms, pairs, labels, spending)
    if settled.profile is not None:
        sequences.attrs["corpus_profile"] = settled.profile
    return sequences, settled.declared


# ---------------------------------------------------------------------------------------------------
# CLI (privseed.flows.cli builds the options from DpKpsConfig and checks the input before this runs)
# ---------------------------------------------------------------------------------------------------
def run_from_cli(cfg: DpKpsConfig) -> int:
    manifest = dpkps_flow(cfg)
    if manifest.get("dry_run"):
        print(f"dry run, nothing drawn, charged or sent: {manifest['estimate']}")
        print(manifest["privacy_plan"])
        return 0
    print(f"release {manifest['release_id']}: {manifest['rows']} synthetic documents")
    print(f"  synthetic corpus: {storage.join(cfg.out, 'synthetic')}")
    print(f"  ledger:           {storage.join(cfg.out, 'ledger.json')}  (epsilon={manifest['privacy']['epsilon']:g})")
    print(f"  manifest:         {storage.join(cfg.out, 'manifest.json')}")
    print(state_summary(cfg))  # the owner's budget over every run of the state, which no release shows
    return 0
