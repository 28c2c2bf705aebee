"""`privseed audit`: an empirical privacy audit of every mechanism (lower bounds on epsilon, with 95 % confidence
unless --confidence says otherwise, against what each ledger claims). The trials and the mechanisms' fixtures are
in tasks/audit/trials.py, the statistics in tasks/audit/statistics.py.
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from pathlib import Path

from privseed import __version__
from privseed.tasks.audit import statistics as stats
from privseed.tasks.audit.trials import Profile, run_audit, write_outputs
from privseed.tasks.config.commands import AuditConfig


# ---------------------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------------------
def run_from_cli(cfg: AuditConfig) -> int:
    return run(cfg)


def run(cfg: AuditConfig) -> int:
    """Audit the mechanisms ``cfg`` names, print the table, write audit.json and audit.png; 1 when a lower bound
    (on epsilon, or on delta) exceeds its claim."""
    profile = Profile(*cfg.trial_counts())
    started = time.perf_counter()
    rows = run_audit(cfg.mechanisms, profile, insecure=cfg.insecure_reproducible_noise, progress=cfg.progress,
                     alpha=1.0 - cfg.confidence)
    print(stats.format_table(rows))
    command = ["privseed", "audit", "--profile", cfg.profile, "--mechanisms", ",".join(cfg.mechanisms)]
    command += (["--trials", str(cfg.trials)] if cfg.trials is not None else [])
    command += (["--insecure-reproducible-noise"] if cfg.insecure_reproducible_noise else [])
    command += (["--confidence", str(cfg.confidence)] if cfg.confidence != 0.95 else [])
    meta = {"command": " ".join(command), "privseed_version": __version__,
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "profile": cfg.profile,
            "calibration_trials": profile.calibration, "evaluation_trials": profile.evaluation,
            "insecure_reproducible_noise": cfg.insecure_reproducible_noise,
            "confidence": cfg.confidence, "seconds": round(time.perf_counter() - started, 1)}
    paths = write_outputs(rows, Path(cfg.out), meta)
    print(f"wrote {paths['json']} and {paths['plot']} ({meta['seconds']:.0f} s)")
    violated = [r.mechanism for r in rows if r.exceeds_claim]
    if violated:
        print(f"privseed audit: a lower bound exceeds the claimed epsilon or delta for {', '.join(violated)}: "
              "these releases are not as private as their ledger says", file=sys.stderr)
        return 1
    return 0
