"""Stages that open and report the privacy ledger of a run (tasks/dp/ledger.py holds the ledger itself)."""

from __future__ import annotations

import logging
from typing import Any

from privseed.tasks.config.commands import ReleaseConfig
from privseed.tasks.dp.identity import DataIdentity, new_run_id
from privseed.tasks.dp.ledger import OWNER_LEDGER, PrivacyLedger, cumulative_total, unfinished_runs
from privseed.tasks.stages import public_stage, stage_logger


@public_stage("open-ledger")
def open_ledger(cfg: ReleaseConfig, identity: DataIdentity) -> PrivacyLedger:
    """The run's ledger in the owner's private state. The corpus is identified by its keyed identity
    (``scan_private_corpus``, tasks/stages/corpus.py; the key lives in the state folder)
    and the run id is random unless ``--run-id`` resumes a run: nothing about the data goes into a name or a
    release.

    A new run beside runs of the state that drew values and did not publish charges the budget again: the command
    line refuses it unless ``--new-run`` asks for it (privseed.tasks.config.preflight); a run that does not pass there
    (a
    deployment's, a subflow's) says so here, loudly unless it was asked for."""
    if cfg.run_id is None:
        asked, unfinished = cfg.new_run, unfinished_runs(cfg.state_uri, cfg.storage_options)
        if unfinished:
            stage_logger().log(logging.INFO if asked else logging.WARNING,
                               "the private state %s holds %d unfinished run(s), the latest %s: this new run charges "
                               "the budget again%s", cfg.state_uri, len(unfinished), unfinished[-1],
                               " (new_run)" if asked else f"; to resume that run instead, set run_id {unfinished[-1]}")
    run_id = cfg.run_id or new_run_id()
    ledger = PrivacyLedger(cfg.state_uri, identity, run_id, cfg.storage_options)
    stage_logger().info("privacy ledger: run %s in the private state %s (%d release(s) already drawn); to resume "
                        "this run after a failure, pass --run-id %s", run_id, cfg.state_uri, len(ledger.entries()),
                        run_id)
    return ledger


def log_cumulative_total(ledger: PrivacyLedger) -> None:
    """Operator log: what every run in this state folder spent, composed conservatively (owner-only figure)."""
    stage_logger().info("state folder %s: %s (runs compose unless their corpora are provably disjoint); the full "
                        "account is %s", ledger.state_uri, cumulative_text(ledger.cumulative_total()),
                        ledger.private_uri(OWNER_LEDGER))


def cumulative_text(cumulative: dict[str, Any]) -> str:
    """``cumulative epsilon=22, delta=0 over 2 runs``: a state folder's cumulative total
    (privseed.tasks.dp.ledger.cumulative_total) as the owner reads it after every run."""
    runs = len(cumulative["runs"])
    return (f"cumulative epsilon={cumulative['epsilon']:g}, delta={cumulative['delta']:g} over {runs} "
            f"run{'' if runs == 1 else 's'}")


def state_summary(cfg: ReleaseConfig) -> str:
    """The line the command line prints after every run: where the owner's private state is and what every run
    recorded in it spent together (never written to a release)."""
    cumulative = cumulative_total(cfg.state_uri, cfg.storage_options)
    return f"  private state:    {cfg.state_uri}  ({cumulative_text(cumulative)}; the owner's, never shared)"


def warn_if_insecure(cfg: ReleaseConfig, logger: Any = None) -> None:
    """Says loudly, before anything is drawn, that this run's noise is reproducible from the public seed; with an
    LLM whose calls leave this machine such a run stops here (its seeds are not DP: docs/privacy.md)."""
    if cfg.insecure_reproducible_noise:
        from privseed.tasks.generation.drivers import refuse_remote_llm_for_reproducible_noise
        from privseed.tasks.dp.mechanisms import INSECURE_STAMP

        refuse_remote_llm_for_reproducible_noise(cfg.llm, cfg.insecure_reproducible_noise)

        (logger or stage_logger()).warning(
            "%s: --insecure-reproducible-noise draws every noise value from --seed %d, which is published; the "
            "release is stamped and the release gate refuses it unless --allow-insecure-release",
            INSECURE_STAMP, cfg.seed)
