"""Time of Aug-PE's nearest-neighbour vote histogram per round: chunked GEMM (privseed.tasks.pe.evolution) vs naive, and
the flows' per-unit path on a Dask cluster (read + embed + vote on the workers, counts summed on the cluster).

The naive version is what brute-force PE voting does: one distance vector per private document, in a Python
loop. Both give the same histogram (checked here on every measured slice). Random unit vectors of dimension d
stand in for MiniLM embeddings; the work does not depend on their values.

    nice -n 10 python benchmarks/bench_pe_histogram.py --private 10000 100000 --synthetic 3000

At large n the naive loop is timed on a slice of --naive-max documents and scaled linearly (it is a loop of
identical, independent per-document steps); such rows are marked "(scaled from N)".

``--unit-docs N`` adds the per-unit rounds the flows run (privseed.tasks.pe.pe_units): N generated documents of about
1.4
KB in ``--unit-shards`` Parquet shards, a LocalCluster of ``--workers`` workers, real MiniLM embeddings. Round 1
reads and embeds every unit on its worker (cold); round 2 finds the embeddings in the workers' memory (warm).
The difference is what recomputing the private embeddings in every round would cost per round.

    nice -n 10 python benchmarks/bench_pe_histogram.py --private 10000 --unit-docs 2000 --workers 2
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

    from privseed.tasks.pe.evolution import naive_nearest_neighbour_votes, nearest_neighbour_votes

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--private", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--synthetic", type=int, default=3000, help="candidates per round (N (K+1))")
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--naive-max", type=int, default=10_000, help="largest slice the naive loop runs on")
    ap.add_argument("--chunk-rows", type=int, default=16384)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--unit-docs", type=int, default=0, help="documents of the per-unit benchmark (0: skip it)")
    ap.add_argument("--unit-shards", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
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
    if args.unit_docs:
        per_unit_rounds(args.unit_docs, args.unit_shards, args.workers, args.synthetic)


def per_unit_rounds(docs: int, shards: int, workers: int, candidates: int) -> None:
    """Two rounds of the flows' per-unit vote (cold, then warm) on generated documents; see the module doc."""
    import tempfile
    import uuid

    import pandas as pd
    from wordfreq import top_n_list

    from privseed.tasks.data.cluster import dask_client
    from privseed.tasks.data.units import add_parts, map_reduce_units
    from privseed.tasks.data.embedding import embed_texts
    from privseed.tasks.pe.pe_units import PrivateUnits, forget_run, unit_class_votes
    from privseed.tasks.data.units import plan_units

    rng = np.random.default_rng(1)
    words = np.array([w for w in top_n_list("en", 5000) if w.isalpha()])
    labels = [str(c) for c in range(14)]
    texts = [" ".join(rng.choice(words, size=190)) for _ in range(docs)]  # ~1.4 KB each
    frame = pd.DataFrame({"text": texts, "label": rng.integers(0, 14, size=docs).astype(str)})
    candidate_texts = [" ".join(rng.choice(words, size=60)) for _ in range(candidates)]
    candidate_class = np.arange(candidates) % 14
    with tempfile.TemporaryDirectory() as folder:
        for i, part in enumerate(np.array_split(np.arange(docs), shards)):
            frame.iloc[part].to_parquet(f"{folder}/part-{i:03d}.parquet", index=False)
        candidate_emb = embed_texts(candidate_texts)  # public: embedded here, broadcast to the workers
        print(f"\nper-unit rounds: {docs} documents of {frame['text'].str.len().mean():.0f} characters in {shards} "
              f"shards, {candidates} candidates, LocalCluster of {workers} worker(s) (1 thread each), MiniLM")
        with dask_client(None, workers) as client:
            client.run(embed_texts, ["warm-up"])  # model loaded on every worker before timing
            units = PrivateUnits(tuple(plan_units(folder)), "text", "label", {}, "minilm", tuple(labels),
                                 uuid.uuid4().hex)
            times = []
            for _ in ("cold", "warm"):
                t0 = time.perf_counter()
                votes = map_reduce_units(unit_class_votes, units.units, add_parts, units, candidate_emb,
                                         candidate_class, affinity=True)
                times.append(time.perf_counter() - t0)
                assert votes.sum() == docs
            kept = sum(client.run(forget_run, units.run).values())
        cold, warm = times
        print(f"  round 1 (read + embed + vote per unit): {cold:8.2f} s  ({docs / cold / workers:.0f} documents/s "
              f"per worker)")
        print(f"  round 2 (embeddings kept on the workers): {warm:6.2f} s  ({kept} of {len(units.units)} units "
              "cached on the workers after both rounds: one each when every unit ran where it was embedded)")
        print(f"  recomputing the embeddings every round would add {cold - warm:.2f} s per round "
              f"({(cold - warm) / docs * 1e3:.2f} ms per document per round)")
        print(f"  driver: receives {candidates * 8 / 1e3:.1f} KB of summed counts per round; the in-process path "
              f"held {docs * 384 * 4 / 1e6:.1f} MB of private embeddings")


if __name__ == "__main__":
    main()
