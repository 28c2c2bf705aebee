"""The power of `privseed audit`: how often it catches a 2x calibration error in each mechanism (docs/privacy.md).

For every mechanism and every condition (the correct mechanism, half the noise, a sensitivity counted half, and the
shape faults of privseed.tasks.audit.faults that break that mechanism: a class counted twice, repeated terms, long
documents, the thresholded histogram's unfixed OpenDP map), this runs the audit at the suite's profile (10 calibration +
10 evaluation trials per corpus, confidence 1 - 1e-5, as tests/test_audit.py runs it) ``--repeats`` times through the
flows' own passes and counts the VIOLATED verdicts. From the first run's noise groups (how many noise values a trial
releases, the canary's move, the scale the mechanism really draws with) it also computes the calibration check's exact
probability of saying VIOLATED (``privseed.tasks.audit.statistics.flag_probability``) at the suite's, the quick and the
full profile, at 95 % and at 1 - 1e-5, for the group that flags most easily alone: a lower bound on the audit's
P(catch), since the other groups and the threshold test can only add to it. For the correct mechanism the same number is
that group's false-alarm probability. Where the audit also bounds delta (the thresholded histogram), the delta check's
exact P(VIOLATED) is printed after a slash.

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
from privseed.tasks.audit.faults import SHAPE_FAULTS
from privseed.tasks.audit.faults import fault as injected
from privseed.tasks.config.commands import AUDIT_MECHANISMS, AUDIT_PROFILES
from privseed.tasks.dp.mechanisms import laplace_threshold_delta, opendp_threshold_map

SUITE = (10, 10)
SUITE_ALPHA = 1e-5
CONDITIONS = (None, "half-noise", "half-sensitivity")
#: The profiles and confidence levels of the P(catch) columns: the suite's, quick and full at 95 %, full at the suite's.
LEVELS = ((SUITE, SUITE_ALPHA), (AUDIT_PROFILES["quick"], 0.05), (AUDIT_PROFILES["full"], 0.05),
          (AUDIT_PROFILES["full"], SUITE_ALPHA))
#: The thresholded histogram's audit: first S = 4 distinct terms a document (tasks/audit/trials.py).
THRESHOLD_AUDIT_TERMS = 4


def conditions_for(mechanism: str) -> list[str | None]:
    """The correct mechanism, the 2x calibration errors, and the shape faults that break this mechanism's
    sensitivity (``SHAPE_FAULTS``)."""
    return [*CONDITIONS, *(name for name, mechanisms in SHAPE_FAULTS.items() if mechanism in mechanisms)]


def power(row: stats.AuditRow, condition: str | None, profile: tuple[int, int], alpha: float) -> float:
    """The calibration check's P(VIOLATED) for ``row``'s mechanism under ``condition`` at ``profile``, ``alpha``
    (the check's share of alpha: a third where a delta check runs too, else a half)."""
    groups = row.noise_groups
    checks = 3 if row.delta_groups else 2
    trials = 2 * (row.calibration_trials + row.trials)
    best = 0.0
    for group in groups.values():
        per_trial = group["noise_values_seen"] / trials
        values = int(min(stats.MAX_NOISE_VALUES, per_trial * 2 * sum(profile)))
        family = "gaussian" if group["gaussian"] else "laplace"
        true_scale = group["claimed_scale"] * (0.5 if condition == "half-noise" else 1.0)
        best = max(best, stats.flag_probability(family, bool(group["discrete"]), values, group["canary_move"],
                                                true_scale, row.claimed_epsilon, row.delta,
                                                alpha / checks / len(groups)))
    return best


def true_deltas(row: stats.AuditRow, condition: str | None) -> dict[str, float] | None:
    """The true release probability of each delta group's item of the threshold audit under ``condition`` (None
    where the condition does not change it)."""
    scale = next(iter(row.noise_groups.values()))["claimed_scale"]
    s = THRESHOLD_AUDIT_TERMS
    if condition == "unfixed-threshold-map":  # the threshold whose (too small) map delta is the recorded one
        t = next(t for t in range(1, 200) if opendp_threshold_map(scale, t, s, s, 1)[1] <= row.delta)
    else:
        t = next(t for t in range(1, 200) if laplace_threshold_delta(scale, t, s, s, 1) <= row.delta)
    if condition not in (None, "unfixed-threshold-map", "repeated-terms"):
        return None
    repeated = (laplace_threshold_delta(scale, t, 1, s, s) if condition == "repeated-terms"  # one term, S times
                else laplace_threshold_delta(scale, t, 1, 1, 1))
    return {"distinct": laplace_threshold_delta(scale, t, s, s, 1), "repeated": repeated}


def delta_power(row: stats.AuditRow, condition: str | None, profile: tuple[int, int], alpha: float) -> float | None:
    """The delta check's P(VIOLATED) (``stats.delta_flag_probability``), for the audits that run one."""
    truth = true_deltas(row, condition) if row.delta_groups else None
    if truth is None:
        return None
    trials = 2 * (row.calibration_trials + row.trials)
    best = 0.0
    for name, group in row.delta_groups.items():
        items = int(group["items"] / trials * 2 * sum(profile))
        true = truth["repeated" if "written" in name else "distinct"]
        best = max(best, stats.delta_flag_probability(items, true, row.delta, alpha / 3 / len(row.delta_groups)))
    return best


def run(mechanisms: list[str], repeats: int) -> list[dict[str, Any]]:
    out = []
    for mechanism in mechanisms:
        for condition in conditions_for(mechanism):
            rows = []
            started = time.perf_counter()
            for _ in range(repeats):
                with injected(condition, mechanism):
                    rows += audit_trials.run_audit([mechanism], audit_trials.Profile(*SUITE), progress=False,
                                                   alpha=SUITE_ALPHA)
            first = rows[0]
            out.append({
                "mechanism": mechanism, "condition": condition or "correct", "claim": first.claimed_epsilon,
                "delta": first.delta, "canary": first.canary_epsilon,
                "violated": sum(r.exceeds_claim for r in rows), "repeats": repeats,
                "bounds": [r.calibration_bound for r in rows],
                "delta_bounds": [r.delta_lower_bound for r in rows] if first.delta_groups else [],
                "catch": [power(first, condition, profile, alpha) for profile, alpha in LEVELS],
                "delta_catch": [delta_power(first, condition, profile, alpha) for profile, alpha in LEVELS],
                "seconds": (time.perf_counter() - started) / repeats})
            print(f"{mechanism} {condition}: {out[-1]}", file=sys.stderr, flush=True)
    return out


def table(results: list[dict[str, Any]]) -> str:
    head = ("| mechanism | fault | claimed eps | claimed delta | canary eps | suite: VIOLATED (measured) | "
            "calibration bounds | delta bounds | P(catch) suite, 1 - 1e-5 | quick, 95 % | full, 95 % | "
            "full, 1 - 1e-5 | s per audit |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        catch = [_p(c) if d is None else f"{_p(c)} / {_p(d)}" for c, d in zip(r["catch"], r["delta_catch"])]
        lines.append(f"| {r['mechanism']} | {r['condition']} | {r['claim']:.3f} | {r['delta']:.3g} | "
                     f"{r['canary']:.3f} | {r['violated']} of {r['repeats']} | "
                     f"{', '.join(f'{b:.2f}' for b in r['bounds'])} | "
                     f"{', '.join(f'{b:.2g}' for b in r['delta_bounds']) or '-'} | {' | '.join(catch)} | "
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
