"""Private evolution baselines as Prefect flows: Aug-PE, AugPE+V~ (``--vocab-words``) and SecPE.

    augpe:  load -> [privatize vocabulary] -> RANDOM_API -> T x (embed candidates -> DP vote histogram, votes
            per unit on the workers (drawn once) -> select -> VARIATION_API) -> gate -> publish
    secpe:  load -> secrets per unit -> SecretNoise (LP -> rho; the public sigma checked) -> public k-means
            -> RANDOM_API -> T x (embed candidates -> SecretClustering per class, sums per unit on the workers
            (drawn once) -> cluster votes -> top N -> VARIATION_API) -> publish
            (--advise-sigma: load -> secrets per unit -> the calibrated sigma, printed; nothing drawn or written)

Both run one round loop (tasks/stages/pe_rounds.py) with their own vote step. Private documents are read and
embedded per work unit on the Dask workers and never persisted; what crosses the boundary are the noisy
histograms / noisy cluster statistics, each drawn once through the ledger, and text the LLM wrote from public
prompts or from earlier synthetic text. Every LLM call is cached in the private state (``--state``, default
``OUT.private/llm-cache``) so a crash mid-round repeats none that finished.
"""
from __future__ import annotations

import argparse
from typing import Any

import privseed.tasks._runtime  # noqa: F401  (offline settings before prefect is imported)
from prefect import flow

from privseed.tasks import evolution as ev
from privseed.tasks import storage
from privseed.tasks.cluster import cluster_security, dask_client
from privseed.tasks.config import AugPeConfig, SecPeConfig, build_config
from privseed.tasks.stages.corpus import declared_labels, plan_private_corpus, scan_private_corpus
from privseed.tasks.stages.dpkps import privatize_vocabulary_stage, term_counting
from privseed.tasks.stages.ledger import log_cumulative_total, open_ledger, warn_if_insecure
from privseed.tasks.stages.pe import (advise_sigma, charge_augpe_schedule, charge_secpe_schedule, detect_unit_secrets,
                                      dry_run_plan, private_units, public_clusters, publish_evolution)
from privseed.tasks.stages.pe_rounds import AugPeVote, SecPeVote, evolve


@flow(name="augpe", log_prints=True)
def augpe_flow(config: dict[str, Any]) -> dict:
    """Aug-PE / AugPE+V~ end to end; ``config`` is an AugPeConfig as a dict."""
    # Environment defaults (PRIVSEED_*) apply under the parameters, as for DP-KPS; ConfigError names the problem.
    cfg = build_config(AugPeConfig, config)
    if cfg.dry_run:  # before the corpus is read and the ledger opens: nothing drawn, charged or sent
        return dry_run_plan(cfg)
    warn_if_insecure(cfg)
    with dask_client(cfg.dask_address, cfg.n_workers, cluster_security(cfg)):
        plan = plan_private_corpus(cfg)
        labels = declared_labels(cfg, plan.integer_labels)
        # pass 1 on the workers: label check, keyed identity and, for AugPE+V~, the vocabulary histogram
        scan = scan_private_corpus(plan, labels, cfg, term_counting(cfg) if cfg.vocab_words else None)
        ledger = open_ledger(cfg, scan.identity)
        schedule = charge_augpe_schedule(ledger, cfg)
        # AugPE+V~: DP-KPS's own vocabulary privatization (discrete Laplace, scale S / eps_voc, top N)
        words = privatize_vocabulary_stage(scan.term_counts, cfg, ledger) if cfg.vocab_words else None
        del scan  # the rounds read the private documents per unit, on the workers
        with private_units(cfg, labels, plan) as units:
            result = evolve(cfg, labels, AugPeVote(ledger, cfg, schedule, units), words)
        summary = {"method": "augpe+vocab" if cfg.vocab_words else "augpe", "schedule": schedule,
                   "llm_calls": result.calls, "vocabulary_words": len(words) if words else 0, "rounds": result.rounds}
        manifest = publish_evolution(cfg, result.final, ledger, labels, summary)
    log_cumulative_total(ledger)
    return manifest


@flow(name="secpe", log_prints=True)
def secpe_flow(config: dict[str, Any]) -> dict:
    """SecPE end to end; ``config`` is a SecPeConfig as a dict."""
    cfg = build_config(SecPeConfig, config)  # environment defaults under the parameters, as above
    if cfg.dry_run:  # before the corpus is read and the ledger opens: nothing drawn, charged or sent
        return dry_run_plan(cfg)
    warn_if_insecure(cfg)
    with dask_client(cfg.dask_address, cfg.n_workers, cluster_security(cfg)):
        plan = plan_private_corpus(cfg)
        labels = declared_labels(cfg, plan.integer_labels)
        identity = scan_private_corpus(plan, labels, cfg).identity  # pass 1: labels, identity
        if cfg.advise_sigma:  # the owner's advice: printed, nothing drawn, charged or written
            with private_units(cfg, labels, plan) as units:
                return advise_sigma(cfg, detect_unit_secrets(cfg, units))
        ledger = open_ledger(cfg, identity)
        with private_units(cfg, labels, plan) as units:  # secrets and rounds read the units on the workers
            secret_noise = ev.secpe_noise(cfg, detect_unit_secrets(cfg, units))
            schedule, mechanism = charge_secpe_schedule(ledger, cfg, secret_noise)
            vote = SecPeVote(ledger, cfg, mechanism, public_clusters(cfg), units, secret_noise.rho, labels)
            result = evolve(cfg, labels, vote)
        summary = {"method": "secpe", "schedule": schedule, "llm_calls": result.calls, "rounds": result.rounds,
                   "guarantee": schedule["release_guarantee"]["statement"]}
        manifest = publish_evolution(cfg, result.final, ledger, labels, summary)
    log_cumulative_total(ledger)
    return manifest


# ---------------------------------------------------------------------------------------------------------
# Entry points for `privseed experiment` and the CLI
# ---------------------------------------------------------------------------------------------------------
def run_augpe(config: dict[str, Any]) -> str:
    """Run Aug-PE (or AugPE+V~ with ``vocab_words=True``) from a config dict; returns the release path."""
    cfg = build_config(AugPeConfig, config)
    augpe_flow(cfg.model_dump())
    return cfg.out


def run_secpe(config: dict[str, Any]) -> str:
    """Run SecPE from a config dict; returns the release path."""
    cfg = build_config(SecPeConfig, config)
    secpe_flow(cfg.model_dump())
    return cfg.out


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """``privseed augpe`` and ``privseed secpe``: every flag comes from AugPeConfig / SecPeConfig (tasks/config.py)."""
    from privseed.tasks.config import add_config_arguments

    p = subparsers.add_parser("augpe", help="Aug-PE baseline (add --vocab-words for AugPE+V~)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(p, AugPeConfig)
    p.set_defaults(func=lambda args: _run_cli(AugPeConfig, augpe_flow, args))

    s = subparsers.add_parser("secpe", help="SecPE baseline: (p, r)-secret protection with secret clustering",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(s, SecPeConfig)
    s.set_defaults(func=lambda args: _run_cli(SecPeConfig, secpe_flow, args))


def _run_cli(model, flow_fn, args: argparse.Namespace) -> int:
    from privseed.tasks.config import config_from_args

    cfg = config_from_args(model, args)
    manifest = flow_fn(cfg.model_dump())
    if manifest.get("dry_run") or manifest.get("advice"):
        print("\n".join(manifest["lines"]))
        return 0
    print(f"release {manifest['release_id']}: {manifest['rows']} synthetic documents")
    print(f"  synthetic corpus: {storage.join(cfg.out, 'synthetic')}")
    epsilon, delta = manifest["privacy"]["epsilon"], manifest["privacy"]["delta"]
    if isinstance(cfg, SecPeConfig):
        # SecPE's guarantee is (p, r)-secret protection; its DP epsilon is conditional (docs/baselines.md).
        r = min(1.0, cfg.p * cfg.r_over_p)
        guarantee = (f"(p, r) = ({cfg.p:g}, {r:g}) secret protection for the detected secrets, not DP; DP "
                     f"epsilon={epsilon:g}, delta={delta:g} only if rho is taken as fixed")
    else:
        guarantee = f"epsilon={epsilon:g}, delta={delta:g}"
    print(f"  ledger:           {storage.join(cfg.out, 'ledger.json')}  ({guarantee})")
    print(f"  manifest:         {storage.join(cfg.out, 'manifest.json')}")
    return 0
