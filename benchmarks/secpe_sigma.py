"""SecPE's noise multiplier at the paper's budgets: joint calibration of sizes and centres against the earlier
2T-independent-mixtures calibration, and the true blow-up at the earlier sigma.

    python benchmarks/secpe_sigma.py [--p 1e-4] [--r-over-p 2 10 50] [--rounds 2 5 10]

For each (r/p, T) the binding secret is the one a single document holds: SecretNoise's LP gives that document
w = min(1, eta) with eta = Phi^-1(1-p) - Phi^-1(1-r), so rho = min(1, eta) under ``--rho-norm max``. The joint
calibration (privseed.tasks.dp.accounting.calibrate_secret_sigma) composes T mixtures with shift sqrt(2) per sampled
holder; the earlier one composed 2T mixtures with shift 1, which under-counts because one Bernoulli draw drives both
released parts. Prints a Markdown table (docs/baselines.md).
"""
from __future__ import annotations

import argparse
import time

from privseed.tasks.dp import accounting


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--p", type=float, default=1e-4)
    parser.add_argument("--r-over-p", type=float, nargs="+", default=[2.0, 10.0, 50.0])
    parser.add_argument("--rounds", type=int, nargs="+", default=[2, 5, 10])
    args = parser.parse_args(argv)
    print("| r/p | T | eta | rho of a lone holder | sigma, 2T independent (before) | B(p) / r at that sigma "
          "| sigma, joint (now) | B(p) / r now | seconds |")
    print("|---|---|---|---|---|---|---|---|---|")
    for ratio in args.r_over_p:
        r = args.p * ratio
        eta = accounting.gdp_mu_for_secret(args.p, r)
        rho = [min(1.0, eta)]
        for rounds in args.rounds:
            start = time.perf_counter()
            before = accounting.calibrate_secret_sigma([rho], args.p, r, 2 * rounds, holder_shift=1.0).sigma
            true_before = accounting.secret_blow_up(before, rho, args.p, rounds)
            now = accounting.calibrate_secret_sigma([rho], args.p, r, rounds).sigma
            true_now = accounting.secret_blow_up(now, rho, args.p, rounds)
            seconds = time.perf_counter() - start
            print(f"| {ratio:g} | {rounds} | {eta:.3f} | {rho[0]:.3f} | {before:.3f} | {true_before / r:.2f} "
                  f"| {now:.3f} | {true_now / r:.3f} | {seconds:.1f} |", flush=True)
    # With rho = 1 (r/p = 50) the two agree: 2T Gaussians of shift 1 are T of shift sqrt(2), the closed form
    # mu = sqrt(2T) / sigma (tests/test_accounting.py). Sub-sampling (rho < 1) is where they part.
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
