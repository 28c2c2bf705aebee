"""Kept documents per minute: one shared llama.cpp server (``--llm local-server``, xllamacpp, continuous batching)
at 1, 2, 4, 8 slots against today's per-worker llama-cpp-python (``--llm local``), in one run, interleaved.

    nice -n 10 python benchmarks/llm_server_throughput.py                       # SmolLM2, 14 seeds, 2 repeats
    nice -n 10 python benchmarks/llm_server_throughput.py --llm-model qwen2.5-coder-0.5b --seeds 8

What a user waits for: the seeds' documents through best-of-1 and up to --max-regenerations rounds of
regeneration, every answer judged by THE document predicate (privseed.tasks.quality.document_rejection, the
release gate's), so "kept" is what a release would keep. Both paths run the same generation code
(privseed.tasks.generation.drivers.generate_shard) on the same public seeds (the first 10 public-vocabulary terms of
one
DBPedia-14 TEST-split document per class, never the train split releases are made from), the demo's prompt
(template ``coverage``, its two few-shot articles, temperature 0.4, max tokens, steering 4, no-repeat 4-grams),
the same cores, no call cache:

- ``llama-cpp-python``: two worker processes (a Dask LocalCluster's shape on 2 cores), each loading its own model
  on one thread and decoding one request at a time with the token-by-token seed-steering processor; the seeds
  are split between them.
- ``server xN``: one xllamacpp server with N slots on every core (started and stopped inside the timed span: a
  run pays for it as for the workers' model loads), the same two worker processes sending their requests to it
  concurrently through the openai SDK; steering is the server's static logit bias on the seed terms plus the DRY
  sampler (tasks/llm/openai_compat.steering_body); with ``--grammar prose`` also a grammar against markdown.

The worker processes are started (and have imported privseed) before the clock starts. Configurations run in
turn, the order reversed every other repeat, so a change of machine load hits them alike; the load average is
printed beside every run (the machine is shared).
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from document_predicate_real import first_terms, public_vocabulary

ROOT = Path(__file__).resolve().parents[1]
FEW_SHOT = ROOT / "tasks" / "demo_data" / "few_shot_wikipedia.jsonl"


def _warm(_: int) -> int:
    import privseed.tasks.generation.drivers  # noqa: F401 - import cost before the clock

    return os.getpid()


def _shard(seeds: list, spec, params) -> pd.DataFrame:
    from privseed.tasks.generation.drivers import generate_shard
    from privseed.tasks.llm import close_backend

    try:
        return generate_shard(seeds, spec, params, None, progress=False)
    finally:
        close_backend(spec)


def public_seeds(n: int, per_class: int = 1) -> list:
    from privseed.tasks.evaluation.experiment import data_root
    from privseed.tasks.llm import ReleasedVocabulary

    test = pd.read_parquet(os.environ.get("PRIVSEED_DBPEDIA_TEST") or data_root() / "dbpedia14" / "test.parquet")
    rng = np.random.default_rng(2024)
    vocab = public_vocabulary()
    picks = [i for label in sorted(test["label"].unique())
             for i in rng.choice(np.flatnonzero(test["label"] == label), per_class, replace=False)][:n]
    labels, terms = [int(test["label"][i]) for i in picks], [first_terms(test["text"][i], vocab) for i in picks]
    released = ReleasedVocabulary(sorted({t for ts in terms for t in ts}), "public DBPedia-14 test terms")
    return [released.seed(ts, lab, 7000 + k) for k, (lab, ts) in enumerate(zip(labels, terms))]


def run(config: str, seeds: list, params, pool: ProcessPoolExecutor, args) -> dict:
    from privseed.tasks.llm.service import LLMSpec, serving

    halves = [seeds[0::2], seeds[1::2]]
    load = os.getloadavg()[0]
    started = time.perf_counter()
    if config == "llama-cpp-python":
        spec = LLMSpec("local", args.llm_model).with_options(n_threads=1)
        frames = list(pool.map(_shard, halves, [spec] * 2, [params] * 2))
    else:
        slots = int(config.removeprefix("server x"))
        spec = LLMSpec("local-server", args.llm_model).with_options(slots=slots, threads=args.server_threads,
                                                                      grammar=args.grammar)
        with serving(spec) as served:
            frames = list(pool.map(_shard, halves, [served] * 2, [params] * 2))
    wall = time.perf_counter() - started
    df = pd.concat(frames, ignore_index=True)
    kept = df["document_reason"].isna()
    reasons = collections.Counter(r for rs in df["rejections"] for r in rs)
    return {"config": config, "wall_s": wall, "kept": int(kept.sum()), "seeds": len(df),
            "calls": int(df["candidates"].sum()), "tokens_out": int(df["tokens_out"].sum()),
            "kept_per_min": 60 * kept.sum() / wall, "tokens_per_s": df["tokens_out"].sum() / wall,
            "coverage_kept": float(df.loc[kept, "coverage"].mean()) if kept.any() else float("nan"),
            "load_before": load, "load_after": os.getloadavg()[0],
            "rejected": dict(reasons.most_common(4)), "example": df.loc[kept, "text"].head(1).tolist()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=14)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--slots", default="1,2,4,8")
    ap.add_argument("--llm-model", default=None, help="smollm2 (default) | qwen2.5-coder-0.5b | a .gguf path")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-regenerations", type=int, default=3)
    ap.add_argument("--steer", type=float, default=4.0)
    ap.add_argument("--no-repeat-ngram", type=int, default=4)
    ap.add_argument("--server-threads", type=int, default=0, help="0: every core")
    ap.add_argument("--grammar", choices=["prose"], default=None)
    ap.add_argument("--show", action="store_true", help="print one kept text per run")
    args = ap.parse_args()

    from privseed.tasks.generation.params import GenerationParams
    from privseed.tasks.llm import load_few_shot

    seeds = public_seeds(args.seeds)
    params = GenerationParams(doc_type="Wikipedia article", template="coverage", temperature=0.4,
                              max_tokens=args.max_tokens, best_of=1, max_regenerations=args.max_regenerations,
                              few_shot=tuple(load_few_shot(str(FEW_SHOT))), steer=args.steer,
                              no_repeat_ngram=args.no_repeat_ngram)
    configs = ["llama-cpp-python"] + [f"server x{n}" for n in args.slots.split(",")]
    print(f"{len(seeds)} seeds, max tokens {args.max_tokens}, up to {args.max_regenerations} regenerations, "
          f"steer {args.steer}, no-repeat {args.no_repeat_ngram}, model {args.llm_model or 'smollm2'}, "
          f"grammar {args.grammar}, {os.cpu_count()} cores",
          flush=True)
    results: list[dict] = []
    with ProcessPoolExecutor(max_workers=2) as pool:
        list(pool.map(_warm, range(4)))
        for r in range(args.repeats):
            for config in (configs if r % 2 == 0 else configs[::-1]):
                out = run(config, seeds, params, pool, args)
                results.append(out)
                print(f"[{r}] {config:17s} {out['kept']:2d}/{out['seeds']} kept  {out['calls']:3d} calls  "
                      f"{out['wall_s']:6.1f} s  {out['kept_per_min']:5.2f} kept/min  {out['tokens_per_s']:5.1f} tok/s  "
                      f"coverage {out['coverage_kept']:.0%}  load {out['load_before']:.1f}->{out['load_after']:.1f}  "
                      f"rejected {out['rejected']}", flush=True)
                if args.show and out["example"]:
                    print(f"      {out['example'][0][:240]!r}", flush=True)
    table = pd.DataFrame(results)
    summary = table.groupby("config", sort=False).agg(
        kept=("kept", "sum"), seeds=("seeds", "sum"), calls=("calls", "sum"), wall_s=("wall_s", "sum"),
        tokens_out=("tokens_out", "sum"), coverage=("coverage_kept", "mean"), load=("load_before", "mean"))
    summary["kept_per_min"] = 60 * summary["kept"] / summary["wall_s"]
    summary["tokens_per_s"] = summary["tokens_out"] / summary["wall_s"]
    base = summary.loc["llama-cpp-python", "kept_per_min"]
    summary["vs_today"] = summary["kept_per_min"] / base
    summary["calls_per_kept"] = summary["calls"] / summary["kept"].clip(lower=1)
    print("\nsummed over repeats:")
    print(summary[["kept", "seeds", "calls", "calls_per_kept", "wall_s", "kept_per_min", "tokens_per_s", "coverage",
                   "load", "vs_today"]].round(2).to_string())
    best = summary.drop(index="llama-cpp-python")["vs_today"]
    print(f"\nbest server setting: {best.idxmax()} at {best.max():.2f}x today's kept documents per minute "
          f"(median over settings {statistics.median(best):.2f}x)")


if __name__ == "__main__":
    main()
