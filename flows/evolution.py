"""Private evolution baselines as Prefect flows: Aug-PE, AugPE+V~ (``--vocab-words``) and SecPE.

    augpe:  load -> [privatize vocabulary] -> RANDOM_API -> T x (embed candidates -> DP vote histogram, votes
            per unit on the workers (drawn once) -> select -> VARIATION_API) -> gate -> [approval] -> publish
    secpe:  load -> secrets per unit -> SecretNoise (LP -> rho; the public sigma checked) -> public k-means
            -> RANDOM_API -> T x (embed candidates -> SecretClustering per class, sums per unit on the workers
            (drawn once) -> cluster votes -> top N -> VARIATION_API) -> gate -> [approval] -> publish
            (--advise-sigma: load -> secrets per unit -> the calibrated sigma, printed; nothing drawn or written)

Both run one round loop (tasks/stages/pe_rounds.py) with their own vote step. Private documents are read and
embedded per work unit on the Dask workers and never persisted; what crosses the boundary are the noisy
histograms / noisy cluster statistics, each drawn once through the ledger, and text the LLM wrote from public
prompts or from earlier synthetic text. Every LLM call is cached in the private state (``--state``, default
``OUT.private/llm-cache``) so a crash mid-round repeats none that finished. With ``--require-approval`` the
final population waits for a person (tasks/stages/approval.py) after the cluster is closed, as DP-KPS's does.
"""
from __future__ import annotations

from typing import Any

from prefect import flow

from privseed.tasks._runtime import apply_offline_defaults
from privseed.tasks import storage
from privseed.tasks.data.cluster import cluster_security, dask_client
from privseed.tasks.config.commands import (TYPED_FLOW, AugPeConfig, EvolutionConfig, SecPeConfig, build_config,
                                            flow_config)
from privseed.tasks.config.preflight import check_approval_server
from privseed.tasks.dp.ledger import PrivacyLedger
from privseed.tasks.stages.approval import await_approval
from privseed.tasks.stages.artifacts import release_artifacts
from privseed.tasks.stages.corpus import declared_labels, plan_private_corpus, scan_private_corpus
from privseed.tasks.stages.dpkps import privatize_vocabulary_stage, term_counting
from privseed.tasks.stages.ledger import log_cumulative_total, open_ledger, state_summary, warn_if_insecure
from privseed.tasks.stages.pe import (advise_sigma, charge_augpe_schedule, charge_secpe_schedule, detect_unit_secrets,
                                      dry_run_plan, private_units, public_clusters, publish_evolution, release_frame,
                                      secret_noise, secret_protection)
from privseed.tasks.stages.pe_rounds import AugPeVote, Evolution, SecPeVote, evolve


@flow(name="augpe", log_prints=True, **TYPED_FLOW)
def augpe_flow(config: AugPeConfig) -> dict:
    """Aug-PE / AugPE+V~ end to end; ``config`` is typed like DP-KPS's (a dict of fields is accepted)."""
    apply_offline_defaults()  # a run started by a deployment worker: the models and GX stay offline
    cfg = flow_config(AugPeConfig, config)
    check_approval_server(cfg)  # --require-approval: a person must be able to reach this run
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
    return approve_and_publish(cfg, result, ledger, labels, summary)


@flow(name="secpe", log_prints=True, **TYPED_FLOW)
def secpe_flow(config: SecPeConfig) -> dict:
    """SecPE end to end; ``config`` is typed like DP-KPS's (a dict of fields is accepted)."""
    apply_offline_defaults()  # a run started by a deployment worker: the models and GX stay offline
    cfg = flow_config(SecPeConfig, config)
    check_approval_server(cfg)  # --require-approval: a person must be able to reach this run
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
            noise = secret_noise(cfg, detect_unit_secrets(cfg, units))
            schedule, mechanism = charge_secpe_schedule(ledger, cfg, noise)
            vote = SecPeVote(ledger, cfg, mechanism, public_clusters(cfg), units, noise.rho, labels)
            result = evolve(cfg, labels, vote)
    summary = {"method": "secpe", "schedule": schedule, "llm_calls": result.calls, "rounds": result.rounds,
               "guarantee": schedule["release_guarantee"]["statement"]}
    return approve_and_publish(cfg, result, ledger, labels, summary)


def approve_and_publish(cfg: EvolutionConfig, result: Evolution, ledger: PrivacyLedger, labels: list,
                        summary: dict[str, Any]) -> dict:
    """[--require-approval: the final population waits for a person; a rejection quarantines it and stops here]
    -> gate -> publish, after the Dask cluster is closed (the population is a frame on the driver)."""
    if cfg.require_approval:
        calls = {f"{kind}_calls": count for kind, count in result.calls.items()}
        report = {"method": summary["method"], "rounds": len(result.rounds), **calls}
        await_approval(cfg, release_frame(result.final, result.calls), ledger, labels, report)
    manifest = publish_evolution(cfg, result.final, ledger, labels, summary)
    release_artifacts(manifest, ledger, cfg.out)
    log_cumulative_total(ledger)
    return manifest


# ---------------------------------------------------------------------------------------------------------
# Entry points for `privseed experiment` and the CLI
# ---------------------------------------------------------------------------------------------------------
def run_augpe(config: dict[str, Any]) -> str:
    """Run Aug-PE (or AugPE+V~ with ``vocab_words=True``) from a config dict; returns the release path."""
    cfg = build_config(AugPeConfig, config)
    augpe_flow(cfg)
    return cfg.out


def run_secpe(config: dict[str, Any]) -> str:
    """Run SecPE from a config dict; returns the release path."""
    cfg = build_config(SecPeConfig, config)
    secpe_flow(cfg)
    return cfg.out


def run_augpe_from_cli(cfg: AugPeConfig) -> int:
    return _run_cli(cfg, augpe_flow)


def run_secpe_from_cli(cfg: SecPeConfig) -> int:
    return _run_cli(cfg, secpe_flow)


def _run_cli(cfg: AugPeConfig | SecPeConfig, flow_fn: Any) -> int:
    manifest = flow_fn(cfg)
    if manifest.get("dry_run") or manifest.get("advice"):
        print("\n".join(manifest["lines"]))
        return 0
    print(f"release {manifest['release_id']}: {manifest['rows']} synthetic documents")
    print(f"  synthetic corpus: {storage.join(cfg.out, 'synthetic')}")
    epsilon, delta = manifest["privacy"]["epsilon"], manifest["privacy"]["delta"]
    if isinstance(cfg, SecPeConfig):
        # SecPE's guarantee is (p, r)-secret protection; its DP epsilon is conditional (docs/baselines.md).
        r = secret_protection(cfg).r
        guarantee = (f"(p, r) = ({cfg.p:g}, {r:g}) secret protection for the detected secrets, not DP; DP "
                     f"epsilon={epsilon:g}, delta={delta:g} only if rho is taken as fixed")
    else:
        guarantee = f"epsilon={epsilon:g}, delta={delta:g}"
    print(f"  ledger:           {storage.join(cfg.out, 'ledger.json')}  ({guarantee})")
    print(f"  manifest:         {storage.join(cfg.out, 'manifest.json')}")
    print(state_summary(cfg))  # the owner's budget over every run of the state, which no release shows
    return 0
