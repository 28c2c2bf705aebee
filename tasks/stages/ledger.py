"""Stages that open and report the privacy ledger of a run (tasks/ledger.py holds the ledger itself)."""

from __future__ import annotations

from typing import Any

from privseed.tasks.config import ReleaseConfig
from privseed.tasks.identity import DataIdentity
from privseed.tasks.ledger import PrivacyLedger
from privseed.tasks.stages import public_stage, stage_logger


@public_stage("open-ledger")
def open_ledger(cfg: ReleaseConfig, identity: DataIdentity) -> PrivacyLedger:
    """The run's ledger in the owner's private state. The corpus is identified by its keyed identity
    (``scan_private_corpus``, tasks/stages/corpus.py; the key lives in the state folder)
    and the run id is random unless ``--run-id`` resumes a run: nothing about the data goes into a name or a
    release."""
    from privseed.tasks.identity import new_run_id

    run_id = cfg.run_id or new_run_id()
    ledger = PrivacyLedger(cfg.state_uri, identity, run_id, cfg.storage_options)
    stage_logger().info("privacy ledger: run %s in the private state %s (%d release(s) already drawn); to resume "
                        "this run after a failure, pass --run-id %s", run_id, cfg.state_uri, len(ledger.entries()),
                        run_id)
    return ledger


def log_cumulative_total(ledger: PrivacyLedger) -> None:
    """Operator log: what every run in this state folder spent, composed conservatively (owner-only figure)."""
    cumulative = ledger.cumulative_total()
    stage_logger().info("state folder %s: cumulative epsilon=%g, delta=%g over %d run(s) (runs compose unless "
                        "their corpora are provably disjoint; the full account is %s)", ledger.state_uri,
                        cumulative["epsilon"], cumulative["delta"], len(cumulative["runs"]),
                        ledger.private_uri("ledger.json"))


def warn_if_insecure(cfg: ReleaseConfig, logger: Any = None) -> None:
    """Says loudly, before anything is drawn, that this run's noise is reproducible from the public seed."""
    if cfg.insecure_reproducible_noise:
        from privseed.tasks.mechanisms import INSECURE_STAMP

        (logger or stage_logger()).warning(
            "%s: --insecure-reproducible-noise draws every noise value from --seed %d, which is published; the "
            "release is stamped and the release gate refuses it unless --allow-insecure-release",
            INSECURE_STAMP, cfg.seed)
