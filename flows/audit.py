"""`privseed audit`: an empirical privacy audit of every mechanism (lower bounds on epsilon, with 95 % confidence,
against what each ledger claims). The trials and the mechanisms' fixtures are in tasks/audit_trials.py (its
docstring is this command's description), the statistics in tasks/audit.py.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path

import tasks._runtime  # noqa: F401  (offline settings before prefect is imported)
from tasks import __version__
from tasks import audit as stats
from tasks import audit_trials
from tasks.audit_trials import MECHANISMS, PROFILES, Profile, run_audit, write_outputs
from tasks.errors import ConfigError


# ---------------------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------------------
def _mechanism_list(value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in MECHANISMS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(MECHANISMS)} (comma separated)")
    return names


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("audit", help="empirical privacy audit: lower bounds on each mechanism's epsilon",
                                   description=audit_trials.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="quick",
                        help="quick: 100 evaluation trials per corpus (tests); full: 500 (docs)")
    parser.add_argument("--mechanisms", type=_mechanism_list, default=list(MECHANISMS),
                        help=f"comma separated subset of {','.join(MECHANISMS)} (default: all)")
    parser.add_argument("--trials", type=int, help="evaluation trials per corpus (calibration: half as many)")
    parser.add_argument("--insecure-reproducible-noise", action="store_true",
                        help="audit the opt-in reproducible noise (same seed every trial): must be VIOLATED")
    parser.add_argument("--out", default="audit-out", help="folder for audit.json and audit.png")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    parser.set_defaults(func=run_from_cli)


def run_from_cli(args: argparse.Namespace) -> int:
    profile = PROFILES[args.profile]
    if args.trials is not None:
        if args.trials < 10:
            raise ConfigError(f"--trials must be >= 10, got {args.trials}")
        profile = Profile(calibration=max(10, args.trials // 2), evaluation=args.trials)
    started = time.perf_counter()
    rows = run_audit(args.mechanisms, profile, insecure=args.insecure_reproducible_noise, progress=args.progress)
    print(stats.format_table(rows))
    command = ["privseed", "audit", "--profile", args.profile, "--mechanisms", ",".join(args.mechanisms)]
    command += (["--trials", str(args.trials)] if args.trials is not None else [])
    command += (["--insecure-reproducible-noise"] if args.insecure_reproducible_noise else [])
    meta = {"command": " ".join(command), "privseed_version": __version__,
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "profile": args.profile, "calibration_trials": profile.calibration,
            "evaluation_trials": profile.evaluation, "insecure_reproducible_noise": args.insecure_reproducible_noise,
            "confidence": 1 - stats.DEFAULT_ALPHA, "seconds": round(time.perf_counter() - started, 1)}
    paths = write_outputs(rows, Path(args.out), meta)
    print(f"wrote {paths['json']} and {paths['plot']} ({meta['seconds']:.0f} s)")
    violated = [r.mechanism for r in rows if r.exceeds_claim]
    if violated:
        print(f"privseed audit: the lower bound exceeds the claimed epsilon for {', '.join(violated)}: "
              "these releases are not as private as their ledger says", file=sys.stderr)
        return 1
    return 0
