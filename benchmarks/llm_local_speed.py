"""Local generation speed: tokens/s and documents/min of a local model (llama.cpp, CPU); default the packaged
SmolLM2-135M, or an opt-in one (make setup-models) with --llm local:qwen2.5-coder-0.5b.

    nice -n 10 python benchmarks/llm_local_speed.py --docs 12 --max-tokens 128
    nice -n 10 python benchmarks/llm_local_speed.py --llm local:qwen2.5-coder-0.5b --threads 1 --skip-dask

Measures, with no cache: one process at 1 and at 2 llama.cpp threads, and the Dask path (2 worker processes,
1 thread each, the layout `privseed dpkps --workers 2` uses). Prints the machine's load average too: on a
shared machine the numbers move with it.
"""
from __future__ import annotations

import argparse
import os
import time

from privseed.tasks.generation.drivers import generate_seeds, generate_shard
from privseed.tasks.generation.params import GenerationParams
from privseed.tasks.llm import ReleasedVocabulary, get_backend, parse_llm_spec

TERMS = ["river", "village", "church", "football", "album", "company", "school", "species", "film", "novel",
         "railway", "mountain", "politician", "painter", "building", "plant", "island", "band", "station", "league"]


def seeds(n: int, base: int):
    v = ReleasedVocabulary(TERMS, "benchmark terms")
    return [v.seed([TERMS[(i * 7 + j * 3) % len(TERMS)] for j in range(10)], 0, base + i) for i in range(n)]


def report(name: str, df, dt: float) -> None:
    toks = int(df["tokens_out"].sum())
    print(f"{name:28s} {len(df):3d} docs  {toks:6d} output tokens  {dt:7.1f} s  {toks / dt:6.1f} tokens/s  "
          f"{60 * len(df) / dt:6.1f} docs/min  (load average {os.getloadavg()[0]:.1f})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llm", default="local", help="local | local:qwen2.5-coder-0.5b | local:PATH.gguf")
    ap.add_argument("--docs", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", default="1,2", help="llama.cpp thread counts to time in-process")
    ap.add_argument("--skip-dask", action="store_true")
    args = ap.parse_args()
    params = GenerationParams(doc_type="summary of a Wikipedia-style article", template="coverage",
                              max_tokens=args.max_tokens, temperature=0.4)
    print(f"cpu_count={os.cpu_count()}")
    for threads in [int(t) for t in args.threads.split(",") if t]:
        spec = parse_llm_spec(args.llm).with_options(n_threads=threads)
        t0 = time.time()
        get_backend(spec).llama  # noqa: B018 - load the model outside the timing
        print(f"model load ({threads} thread(s)): {time.time() - t0:.2f} s")
        t0 = time.time()
        df = generate_shard(seeds(args.docs, 10_000 * threads), spec, params, None, progress=False)
        report(f"in-process, {threads} thread(s)", df, time.time() - t0)
    if not args.skip_dask:
        from privseed.tasks.data.cluster import dask_client

        spec = parse_llm_spec(args.llm).with_options(n_threads=1)
        with dask_client(n_workers=2):
            # warm both workers (each loads its model once), then time a fresh set of seeds
            generate_seeds(seeds(4, 77_000), spec, params, None, shard_size=1, progress=False)
            t0 = time.time()
            df = generate_seeds(seeds(args.docs, 99_000), spec, params, None, shard_size=2, progress=False)
            report("dask, 2 workers x 1 thread", df, time.time() - t0)


if __name__ == "__main__":
    main()
