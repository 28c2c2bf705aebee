"""Time of Aug-PE's nearest-neighbour vote histogram per round: chunked GEMM (tasks.evolution) vs naive.

The naive version is what brute-force PE voting does: one distance vector per private document, in a Python
loop. Both give the same histogram (checked here on every measured slice). Random unit vectors of dimension d
stand in for MiniLM embeddings; the work does not depend on their values.

    nice -n 10 python benchmarks/bench_pe_histogram.py --private 10000 100000 --synthetic 3000

At large n the naive loop is timed on a slice of --naive-max documents and scaled linearly (it is a loop of
identical, independent per-document steps); such rows are marked "(scaled from N)".
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's tasks/, not an installed copy


def unit(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def main() -> None:
    import torch

    from tasks.evolution import naive_nearest_neighbour_votes, nearest_neighbour_votes

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--private", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--synthetic", type=int, default=3000, help="candidates per round (N (K+1))")
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--naive-max", type=int, default=10_000, help="largest slice the naive loop runs on")
    ap.add_argument("--chunk-rows", type=int, default=16384)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    synthetic = unit(rng, args.synthetic, args.dim)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPU(s) visible, torch {torch.__version__}, "
          f"{torch.get_num_threads()} torch thread(s), device {device}")
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    print(f"synthetic candidates M = {args.synthetic}, d = {args.dim}")
    print(f"{'private n':>10} | {'GEMM (s/round)':>15} | {'naive (s/round)':>24} | {'speed-up':>8}")
    print("-" * 68)
    for n in args.private:
        private = unit(rng, n, args.dim)
        nearest_neighbour_votes(private[:1000], synthetic, chunk_rows=args.chunk_rows)  # warm-up
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            fast = nearest_neighbour_votes(private, synthetic, chunk_rows=args.chunk_rows)
            times.append(time.perf_counter() - t0)
        gemm = min(times)
        m = min(n, args.naive_max)
        t0 = time.perf_counter()
        slow = naive_nearest_neighbour_votes(private[:m], synthetic)
        naive = (time.perf_counter() - t0) * (n / m)
        ref = nearest_neighbour_votes(private[:m], synthetic, chunk_rows=args.chunk_rows)
        assert np.array_equal(slow, ref), "GEMM and naive histograms differ"
        assert fast.sum() == n
        note = "" if m == n else f" (scaled from {m})"
        print(f"{n:>10} | {gemm:>15.3f} | {naive:>9.2f}{note:>15} | {naive / gemm:>7.0f}x")


if __name__ == "__main__":
    main()
