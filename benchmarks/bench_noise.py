"""Time privseed's secure noise (OpenDP's samplers) per draw, at the size of a histogram stage.

The histogram methods put noise on every term of V for every class: 14 classes x the 50,000-term English list is
700,000 draws, the largest privatization of a default run. This times each sampler the mechanisms use on such a
vector (``tasks/dp/mechanisms.py``): discrete Laplace on integer counts, Laplace on floats, the Gaussian on OpenDP's
default lattice (a mechanism built from a noise multiplier: Aug-PE, SecPE) and the calibrated Gaussian on its
coarser lattice (``GaussianKind.calibrated``: the histogram stages' Gaussian, the DP-KDE sketch), and checks each
draw's spread against its law's.

    python benchmarks/bench_noise.py [--classes 14] [--vocab 50000] [--repeats 1]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from privseed.tasks.dp.mechanisms import (  # noqa: E402
    GAUSSIAN, GaussianMechanism, LaplaceMechanism, Sensitivity, secure_noise,
)


def cpu_model() -> str:
    """The CPU's model name (Linux), or the platform's machine type."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classes", type=int, default=14)
    parser.add_argument("--vocab", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=1, help="timed draws of the whole vector per sampler")
    args = parser.parse_args()
    size = args.classes * args.vocab
    print(f"machine: {cpu_model()}, {os.cpu_count()} CPU core(s), Python "
          f"{platform.python_version()}; load average {os.getloadavg()[0]:.2f}")
    print(f"vector: {args.classes} classes x {args.vocab} terms = {size} draws, {args.repeats} time(s) each")
    calibrated = GAUSSIAN.calibrated(Sensitivity(l2=1.0, l1=1.0), 10.45, 7e-8)  # rank-l2 at the default budget
    samplers = {
        "discrete Laplace (integer counts)": (LaplaceMechanism(sensitivity=1, epsilon=1.0), np.zeros(size, np.int64)),
        "Laplace (floats)": (LaplaceMechanism(sensitivity=1.0, epsilon=1.0), np.zeros(size)),
        "Gaussian, OpenDP's default lattice": (
            GaussianMechanism(sensitivity=1.0, sigma=calibrated.sigma, epsilon=10.45, delta=7e-8), np.zeros(size)),
        f"Gaussian, calibrated (lattice 2^{calibrated.lattice(size)})": (calibrated, np.zeros(size)),
    }
    print(f"{'sampler':<44}{'s per vector':>14}{'us per draw':>13}{'std / its law':>15}")
    for name, (mechanism, exact) in samplers.items():
        start = time.perf_counter()
        for _ in range(args.repeats):
            noise = np.asarray(mechanism.release(exact, secure_noise()), dtype=np.float64) - exact
        seconds = (time.perf_counter() - start) / args.repeats
        discrete = np.issubdtype(exact.dtype, np.integer)
        expected = (mechanism.noise_distribution(discrete=discrete) if isinstance(mechanism, LaplaceMechanism)
                    else mechanism.noise_distribution()).std()
        print(f"{name:<44}{seconds:>14.2f}{seconds / size * 1e6:>13.1f}{noise.std() / expected:>15.3f}")


if __name__ == "__main__":
    main()
