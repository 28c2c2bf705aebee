"""The streaming data path at scale: memory of the driver and the scheduler against the corpus size, extraction
speed per core of each pass, graph bytes, 1 -> 2 worker speed-up, and equivalence with the in-memory path.

Corpora: generated Parquet (N = 1e5, 3e5, 1e6 documents of ~1.4 KB, 14 labels, each label's topic words mixed
into common English words, shards of 100K rows in row groups of 10K) on a local S3 server (moto_server on
127.0.0.1, as tests/s3server.py starts it). For each N, a fresh `dask scheduler` and `dask worker` processes
(separate processes, as on a real cluster, worker spill off), then:

  passes   this process connects to the scheduler and runs pass 1 (labels, keyed identity, first-S counts over
           the English top-50K vocabulary) and pass 2 (independent sketch sums over a V~ of 1,000 terms, I = 300)
           with privseed.tasks.data.units.map_reduce_units, exactly as the flow's stages do; documents per CPU-second of
           the
           workers (psutil, worker processes only) and per wall second; graph bytes (the pickled per-unit tasks
           the driver submits) and the once-scattered spec bytes.
  flow     `privseed dpkps s3://... --dask-address ... --llm none` in a subprocess of its own (the driver):
           its peak RSS (ru_maxrss), and the scheduler's peak RSS (VmHWM) over the run.

At --equivalence-n (1e5) the pass results are compared with the in-memory computation (whole corpus read,
full extraction, one sum): identical histogram, sketch sums within 1e-9. At --speedup-n (3e5) both passes also
run on 1 worker. Nothing here is released: V~ for pass 2 is the top 1,000 exact counts and the embeddings are
random unit vectors (the cost of the sums does not depend on their values).

    python benchmarks/bench_scale.py [--sizes 100000,300000,1000000] [--workers 2] [--storage s3|local]
                                     [--out /tmp/bench-scale]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LABELS = list(range(14))
SHARD_ROWS = 100_000
ROW_GROUP_ROWS = 10_000
DOC_CHARS = 1_400
BUCKET = "privseed-bench"
#: What the workers need: the repository on the path, the S3 endpoint, and no spill of private partials to disk.
WORKER_ENV = {"DASK_DISTRIBUTED__WORKER__MEMORY__TARGET": "False",
              "DASK_DISTRIBUTED__WORKER__MEMORY__SPILL": "False",
              "DASK_DISTRIBUTED__WORKER__MEMORY__PAUSE": "False"}


# ------------------------------------------------------------------------------------------- the corpora
def sentence_pools(seed: int = 0, per_label: int = 2_000) -> dict[int, list[str]]:
    """Per label, sentences of 12-20 words: common English words (stop words included, by frequency) with about
    one word in four from the label's own 60 topic words (distinct per label, mid-frequency)."""
    import wordfreq

    rng = np.random.default_rng(seed)
    common = wordfreq.top_n_list("en", 3_000)
    weights = 1.0 / np.arange(1, len(common) + 1)
    weights /= weights.sum()
    mid = [w for w in wordfreq.top_n_list("en", 20_000)[3_000:] if w.isalpha()]
    topics = rng.choice(len(mid), size=(len(LABELS), 60), replace=False)
    pools = {}
    for label in LABELS:
        sentences = []
        for _ in range(per_label):
            n = int(rng.integers(12, 21))
            words = [common[i] for i in rng.choice(len(common), size=n, p=weights)]
            for position in rng.choice(n, size=max(1, n // 4), replace=False):
                words[position] = mid[topics[label, rng.integers(60)]]
            sentences.append(" ".join(words).capitalize())
        pools[label] = sentences
    return pools


def make_shard(pools: dict[int, list[str]], rows: int, seed: int) -> bytes:
    """One Parquet shard of ``rows`` documents of about DOC_CHARS characters, row groups of ROW_GROUP_ROWS."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(LABELS), size=rows)
    mean = np.mean([len(s) for p in pools.values() for s in p]) + 2
    per_doc = max(1, round(DOC_CHARS / mean))
    picks = rng.integers(0, len(pools[0]), size=(rows, per_doc))
    texts = [". ".join(pools[int(c)][i] for i in row) + "." for c, row in zip(labels, picks)]
    buffer = io.BytesIO()
    pq.write_table(pa.table({"text": texts, "label": labels.astype(np.int64)}), buffer, row_group_size=ROW_GROUP_ROWS)
    return buffer.getvalue()


def upload_corpora(server, sizes: list[int], local_root: Path | None = None) -> dict[int, str]:
    """s3://BUCKET/n<N>/part-*.parquet for every N (shards of SHARD_ROWS; the same shard bytes reused across N);
    with ``local_root`` (and no server), LOCAL_ROOT/n<N>/part-*.parquet on the local disk instead."""
    client = None
    if local_root is None:
        client = server.client()
        client.create_bucket(Bucket=BUCKET)
    pools = sentence_pools()
    shards: list[bytes] = []
    uris = {}
    for n in sizes:
        count = -(-n // SHARD_ROWS)
        while len(shards) < count:
            started = time.perf_counter()
            shards.append(make_shard(pools, SHARD_ROWS, seed=len(shards)))
            print(f"  generated shard {len(shards)}: {len(shards[-1]) / 1e6:.0f} MB Parquet "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
        for index in range(count):
            rows = min(SHARD_ROWS, n - index * SHARD_ROWS)
            data = shards[index] if rows == SHARD_ROWS else make_shard(pools, rows, seed=1000 + index)
            if client is None:
                (local_root / f"n{n}").mkdir(parents=True, exist_ok=True)
                (local_root / f"n{n}" / f"part-{index:05d}.parquet").write_bytes(data)
            else:
                client.put_object(Bucket=BUCKET, Key=f"n{n}/part-{index:05d}.parquet", Body=data)
        uris[n] = f"s3://{BUCKET}/n{n}/" if client is not None else str(local_root / f"n{n}")
    return uris


# ------------------------------------------------------------------------------------------- the cluster
class Cluster:
    """`dask scheduler` and `dask worker` subprocesses on 127.0.0.1 (one thread each, spill off)."""

    def __init__(self, workers: int, env: dict[str, str], workdir: Path) -> None:
        self.workdir = Path(tempfile.mkdtemp(dir=workdir))
        self.env = {**env, **WORKER_ENV, "PYTHONPATH": str(REPO)}
        dask = str(Path(sys.executable).with_name("dask"))
        scheduler_file = self.workdir / "scheduler.json"
        self.scheduler = subprocess.Popen(
            [dask, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file",
             str(scheduler_file)], env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while not scheduler_file.exists():
            if time.monotonic() > deadline:
                raise RuntimeError("the scheduler did not start")
            time.sleep(0.2)
        time.sleep(0.5)
        self.address = json.loads(scheduler_file.read_text())["address"]
        self.workers = [subprocess.Popen(
            [dask, "worker", self.address, "--nthreads", "1", "--nworkers", "1", "--no-dashboard",
             "--memory-limit", "0", "--local-directory", str(self.workdir / f"w{i}")],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(workers)]
        from distributed import Client

        with Client(self.address) as client:
            client.wait_for_workers(workers, timeout=180)

    def worker_cpu_seconds(self) -> float:
        """User + system CPU of the worker processes (the nannies' children), so far."""
        import psutil

        total = 0.0
        for process in self.workers:
            for child in psutil.Process(process.pid).children(recursive=True):
                times = child.cpu_times()
                total += times.user + times.system
        return total

    def scheduler_peak_rss_mb(self) -> float:
        for line in Path(f"/proc/{self.scheduler.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def close(self) -> None:
        for process in [*self.workers, self.scheduler]:
            process.terminate()
        for process in [*self.workers, self.scheduler]:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)


# ------------------------------------------------------------------------------------------- measurements
def run_passes(cluster: Cluster, data: str, storage_options: dict, check_in_memory: bool) -> dict:
    """Pass 1 and pass 2 over the units of ``data`` on ``cluster``, timed, as the flow's stages run them."""
    from distributed import Client

    from privseed.tasks.seeds.kde import FeatureSpec
    from privseed.tasks.seeds.passes import (DeclaredLabels, ScanPart, ScanSpec, SketchSpec, TermCounting, UnitReader,
                                             combine_sums, scan_unit, sketch_unit)
    from privseed.tasks.data.units import map_reduce_units, plan_corpus
    from privseed.tasks.seeds.vocabulary import load_vocabulary

    result: dict = {}
    with Client(cluster.address) as client:
        plan = plan_corpus(data, storage_options=storage_options)
        rows = sum(u.rows for u in plan.units)
        reader = UnitReader(storage_options=storage_options)
        labels = DeclaredLabels(tuple(LABELS))
        scan_spec = ScanSpec(reader, labels, os.urandom(32), TermCounting("english", 50_000, 10))
        client.run(warm_worker)  # imports and the indexed vocabulary, as a long-lived worker has them
        result["units"] = len(plan.units)
        result["graph_bytes"] = len(pickle.dumps([(scan_unit, u) for u in plan.units]))
        result["scattered_bytes_pass1"] = len(pickle.dumps(scan_spec))

        cpu, wall = cluster.worker_cpu_seconds(), time.perf_counter()
        part = map_reduce_units(scan_unit, plan.units, ScanPart.combine, scan_spec)
        result["pass1_wall_s"] = time.perf_counter() - wall
        result["pass1_docs_per_cpu_s"] = rows / (cluster.worker_cpu_seconds() - cpu)
        result["pass1_docs_per_wall_s"] = rows / result["pass1_wall_s"]

        vocabulary = load_vocabulary("english", 50_000)
        top = np.lexsort((np.arange(len(part.counts)), -part.counts))[:1000]
        terms = tuple(vocabulary.terms[int(i)] for i in top)
        embeddings = np.random.default_rng(0).standard_normal((len(terms), 384))
        embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)
        specs = (FeatureSpec(seed=0, name="independent-0", n_features=300, dim=384, blocks=1, bandwidth=0.5),)
        sketch_spec = SketchSpec(reader, labels, terms, embeddings, specs, single_terms=True)
        result["scattered_bytes_pass2"] = len(pickle.dumps(sketch_spec))
        cpu, wall = cluster.worker_cpu_seconds(), time.perf_counter()
        sums = map_reduce_units(sketch_unit, plan.units, combine_sums, sketch_spec)
        result["pass2_wall_s"] = time.perf_counter() - wall
        result["pass2_docs_per_cpu_s"] = rows / (cluster.worker_cpu_seconds() - cpu)
        result["pass2_docs_per_wall_s"] = rows / result["pass2_wall_s"]

    if check_in_memory:
        result["equivalence"] = in_memory_equivalence(data, storage_options, part.counts, terms, embeddings, specs,
                                                      sums)
    return result


def warm_worker() -> None:
    """What a worker does once, not per unit: import the passes and index the public vocabulary."""
    import privseed.tasks.seeds.passes  # noqa: F401
    from privseed.tasks.seeds.vocabulary import load_vocabulary, phrase_matcher

    phrase_matcher(load_vocabulary("english", 50_000))


def in_memory_equivalence(data, storage_options, counts, terms, embeddings, specs, sums) -> dict:
    """The whole corpus read into memory, every document fully extracted, one sum: today's reference."""
    from privseed.tasks.data.corpus import read_corpus
    from privseed.tasks.seeds.kde import shard_sketch_sums
    from privseed.tasks.seeds.vocabulary import first_terms_histogram, load_vocabulary, phrase_matcher

    corpus = read_corpus(data, storage_options=storage_options)
    vocabulary = load_vocabulary("english", 50_000)
    matcher = phrase_matcher(vocabulary)
    expected_counts = first_terms_histogram([matcher.match(t) for t in corpus["text"]], len(vocabulary), 10)
    expected_sums = shard_sketch_sums(corpus["text"].tolist(), corpus["label"].tolist(), LABELS, terms, embeddings,
                                      specs, True)
    relative = float(np.max(np.abs(sums - expected_sums)) / np.max(np.abs(expected_sums)))
    return {"histogram_identical": bool(np.array_equal(counts, expected_counts)),
            "sketch_max_abs_difference": float(np.max(np.abs(sums - expected_sums))),
            "sketch_max_relative_difference": relative}


def run_flow(cluster: Cluster, data: str, out: Path, env: dict[str, str]) -> dict:
    """The DP-KPS flow in a driver process of its own; its peak RSS and the scheduler's."""
    before = cluster.scheduler_peak_rss_mb()
    argv = ["dpkps", data, "--out", str(out), "--method", "independent", "--llm", "none", "--per-class", "100",
            "--labels", ",".join(map(str, LABELS)), "--dask-address", cluster.address, "--seed", "0"]
    started = time.perf_counter()
    completed = subprocess.run([sys.executable, __file__, "--driver", json.dumps(argv)],
                               env={**env, "PYTHONPATH": str(REPO)}, cwd=REPO, capture_output=True, text=True,
                               check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"the flow failed:\n{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}")
    driver = json.loads(completed.stdout.strip().splitlines()[-1])
    return {"flow_wall_s": time.perf_counter() - started, "driver_peak_rss_mb": driver["peak_rss_mb"],
            "driver_rss_after_pass1_mb": driver["rss_after_pass1_mb"],
            "driver_rss_after_pass2_mb": driver["rss_after_pass2_mb"],
            "scheduler_peak_rss_mb": cluster.scheduler_peak_rss_mb(), "scheduler_rss_before_flow_mb": before}


def driver_main(argv: list[str]) -> None:
    """The driver subprocess: the real CLI in-process, then its own peak RSS and its RSS right after each pass
    (where it holds what grows with N: the row identities, the counts) as stdout's last line, JSON."""
    import contextlib

    import psutil

    import privseed.flows.dpkps
    from privseed.flows.cli import main

    after: dict[str, float] = {}

    def measured(name: str, stage):  # the flow looks its stages up in privseed.flows.dpkps at call time
        def run(*args, **kwargs):
            result = stage(*args, **kwargs)
            after[name] = psutil.Process().memory_info().rss / 2**20
            return result
        return run

    privseed.flows.dpkps.scan_private_corpus = measured("pass1", privseed.flows.dpkps.scan_private_corpus)
    privseed.flows.dpkps.exact_sketch_sums = measured("pass2", privseed.flows.dpkps.exact_sketch_sums)
    with contextlib.redirect_stdout(sys.stderr):
        code = main(argv)
    if code != 0:
        raise SystemExit(code)
    print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "rss_after_pass1_mb": after.get("pass1"), "rss_after_pass2_mb": after.get("pass2")}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100000,300000,1000000")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--equivalence-n", type=int, default=100_000)
    parser.add_argument("--speedup-n", type=int, default=300_000, help="also run the passes on 1 worker (0: skip)")
    parser.add_argument("--no-flow", action="store_true", help="measure the passes only")
    parser.add_argument("--storage", choices=["s3", "local"], default="s3",
                        help="corpora on the local S3 server (default) or on the local disk: the S3 server is a "
                             "Python process on the same cores, which bounds the speed-up on a 2-core machine")
    parser.add_argument("--out", default="/tmp/bench-scale")
    parser.add_argument("--driver", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        return driver_main(json.loads(args.driver))

    from tests.s3server import MotoServer, clear_s3fs_cache

    sizes = [int(s) for s in args.sizes.split(",")]
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    print(f"machine: {os.cpu_count()} CPU core(s); load average {os.getloadavg()}", flush=True)
    server = MotoServer(log_path=out / "moto.log").start() if args.storage == "s3" else None
    env = {**os.environ, **(server.env() if server else {})}
    if server:
        os.environ.update(server.env())
        clear_s3fs_cache()
    results = []
    try:
        print("uploading corpora ...", flush=True)
        uris = upload_corpora(server, sizes, None if server else out / "corpus")
        for n in sizes:
            plans = [args.workers] + ([1] if n == args.speedup_n and args.workers > 1 else [])
            for workers in plans:
                cluster = Cluster(workers, env, out)
                try:
                    load = os.getloadavg()[0]
                    row = {"n": n, "workers": workers, "load_before": load}
                    row.update(run_passes(cluster, uris[n], {}, check_in_memory=(n == args.equivalence_n
                                                                                and workers == args.workers)))
                    if workers == args.workers and not args.no_flow:
                        row.update(run_flow(cluster, uris[n], out / f"release-{n}", env))
                    row["load_after"] = os.getloadavg()[0]
                finally:
                    cluster.close()
                results.append(row)
                print(json.dumps(row), flush=True)
    finally:
        if server:
            server.stop()
    (out / "results.json").write_text(json.dumps(results, indent=2))
    report(results, args.workers)


def report(results: list[dict], workers: int) -> None:
    main_rows = [r for r in results if r["workers"] == workers]
    print("\n| N | units | pass 1 docs/s per core | pass 2 docs/s per core | pass 1 / pass 2 wall s "
          "| driver peak RSS MB | driver RSS after pass 1 / 2 MB | scheduler peak RSS MB | graph bytes | load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    nan = float("nan")
    for r in main_rows:
        print(f"| {r['n']:,} | {r['units']} | {r['pass1_docs_per_cpu_s']:,.0f} | {r['pass2_docs_per_cpu_s']:,.0f} | "
              f"{r['pass1_wall_s']:.0f} / {r['pass2_wall_s']:.0f} | {r.get('driver_peak_rss_mb', nan):.0f} | "
              f"{r.get('driver_rss_after_pass1_mb') or nan:.0f} / {r.get('driver_rss_after_pass2_mb') or nan:.0f} | "
              f"{r.get('scheduler_peak_rss_mb', nan):.0f} | {r['graph_bytes']:,} | "
              f"{r['load_before']:.1f}-{r['load_after']:.1f} |")
    driver = [r["driver_peak_rss_mb"] for r in main_rows if "driver_peak_rss_mb" in r]
    if len(driver) > 1:
        print(f"driver peak RSS growth from N={main_rows[0]['n']:,} to N={main_rows[-1]['n']:,}: "
              f"{driver[-1] - driver[0]:+.0f} MB")
    for r in results:
        if "equivalence" in r:
            print(f"equivalence at N={r['n']:,}: {r['equivalence']}")
    one = {r["n"]: r for r in results if r["workers"] == 1}
    for n, r1 in one.items():
        r2 = next(r for r in main_rows if r["n"] == n)
        print(f"speed-up 1 -> {workers} workers at N={n:,}: pass 1 {r1['pass1_wall_s'] / r2['pass1_wall_s']:.2f}x, "
              f"pass 2 {r1['pass2_wall_s'] / r2['pass2_wall_s']:.2f}x (load {r1['load_before']:.1f} / "
              f"{r2['load_before']:.1f})")


if __name__ == "__main__":
    main()
