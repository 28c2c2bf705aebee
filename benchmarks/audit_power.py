"""The power of `privseed audit`: how often it catches a 2x calibration error in each mechanism (docs/privacy.md).

For every mechanism and every condition (the correct mechanism, half the noise, a sensitivity counted half; the
faults of privseed.tasks.audit.faults), this runs the audit at the suite's profile (10 calibration + 10 evaluation
trials per corpus, confidence 1 - 1e-5, as tests/test_audit.py runs it) ``--repeats`` times through the flows'
own passes and counts the VIOLATED verdicts. From the first run's noise groups (how many noise values a trial
releases, the canary's move, the scale the mechanism really draws with) it also computes the calibration check's
exact probability of saying VIOLATED (``privseed.tasks.audit.statistics.flag_probability``) at the suite's, the quick
and the
full profile, at 95 % and at 1 - 1e-5, for the group that flags most easily alone: a lower bound on the audit's
P(catch), since the other groups and the threshold test can only add to it. For the correct mechanism the same
number is that group's false-alarm probability.

    PYTHONPATH=$PWD python benchmarks/audit_power.py --repeats 3 > power.md

Prints a Markdown table and the machine it ran on.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from typing import Any

from privseed.tasks.audit import statistics as stats
from privseed.tasks.audit import trials as audit_trials
from privseed.tasks.audit.faults import fault as injected
from privseed.tasks.config.commands import AUDIT_MECHANISMS, AUDIT_PROFILES

SUITE = (10, 10)
SUITE_ALPHA = 1e-5
CONDITIONS = (None, "half-noise", "half-sensitivity")


def power(row: stats.AuditRow, condition: str | None, profile: tuple[int, int], alpha: float) -> float:
    """The calibration check's P(VIOLATED) for ``row``'s mechanism under ``condition`` at ``profile``, ``alpha``."""
    groups = row.noise_groups
    trials = 2 * (row.calibration_trials + row.trials)
    best = 0.0
    for group in groups.values():
        per_trial = group["noise_values_seen"] / trials
        values = int(min(stats.MAX_NOISE_VALUES, per_trial * 2 * sum(profile)))
        family = "gaussian" if group["gaussian"] else "laplace"
        true_scale = group["claimed_scale"] * (0.5 if condition == "half-noise" else 1.0)
        best = max(best, stats.flag_probability(family, bool(group["discrete"]), values, group["canary_move"],
                                                true_scale, row.claimed_epsilon, row.delta, alpha / 2 / len(groups)))
    return best


def run(mechanisms: list[str], repeats: int) -> list[dict[str, Any]]:
    out = []
    for mechanism in mechanisms:
        for condition in CONDITIONS:
            rows = []
            started = time.perf_counter()
            for _ in range(repeats):
                with injected(condition, mechanism):
                    rows += audit_trials.run_audit([mechanism], audit_trials.Profile(*SUITE), progress=False,
                                                   alpha=SUITE_ALPHA)
            first = rows[0]
            quick, full = AUDIT_PROFILES["quick"], AUDIT_PROFILES["full"]
            out.append({
                "mechanism": mechanism, "condition": condition or "correct", "claim": first.claimed_epsilon,
                "canary": first.canary_epsilon, "violated": sum(r.exceeds_claim for r in rows), "repeats": repeats,
                "bounds": [r.calibration_bound for r in rows],
                "suite": power(first, condition, SUITE, SUITE_ALPHA),
                "quick95": power(first, condition, quick, 0.05), "full95": power(first, condition, full, 0.05),
                "full5": power(first, condition, full, SUITE_ALPHA),
                "seconds": (time.perf_counter() - started) / repeats})
            print(f"{mechanism} {condition}: {out[-1]}", file=sys.stderr, flush=True)
    return out


def table(results: list[dict[str, Any]]) -> str:
    head = ("| mechanism | fault | claimed eps | canary eps | suite: VIOLATED (measured) | calibration bounds | "
            "P(catch) suite, 1 - 1e-5 | quick, 95 % | full, 95 % | full, 1 - 1e-5 | s per audit |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        lines.append(f"| {r['mechanism']} | {r['condition']} | {r['claim']:.3f} | {r['canary']:.3f} | "
                     f"{r['violated']} of {r['repeats']} | {', '.join(f'{b:.2f}' for b in r['bounds'])} | "
                     f"{_p(r['suite'])} | {_p(r['quick95'])} | {_p(r['full95'])} | {_p(r['full5'])} | "
                     f"{r['seconds']:.0f} |")
    return "\n".join(lines)


def _p(p: float) -> str:
    if p >= 1 - 1e-6:
        return "> 0.999999"
    if p < 1e-6:
        return "< 1e-6"
    return f"{p:.6f}" if p > 0.999 else f"{p:.3g}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="suite-profile audits per mechanism and condition")
    parser.add_argument("--mechanisms", default=",".join(AUDIT_MECHANISMS))
    args = parser.parse_args(argv)
    started = time.perf_counter()
    results = run(args.mechanisms.split(","), args.repeats)
    print(table(results))
    load = os.getloadavg()
    print(f"\nmachine: {platform.node()}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"load average {load[0]:.1f} at the end; {time.perf_counter() - started:.0f} s in all; "
          f"python {platform.python_version()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
