"""Generation I/O: checking the call cache, and publishing a release written as parallel parts.

    python benchmarks/bench_generation_io.py cache [--calls 10000 100000] [--store local s3] [--s3-calls N ...]
        [--scenario rerun first] [--probe-max N] [--repeat K]
    python benchmarks/bench_generation_io.py publish [--rows 20000 100000] [--workers 2]

``cache``: a call cache of N entries (~1.4 KB documents, as a generation stores them) on local disk or on the
local S3 server (``moto_server`` on 127.0.0.1, as tests/s3server.py starts it). For N cached calls (a re-run) and
N uncached ones (the first run), it times the check the way it was (one probe per call, one after another:
``CallCache.get`` without an index) against one listing plus concurrent reads of the hits only
(``CallCache.get_many``).

``publish``: N synthetic rows (demo-corpus texts, as benchmarks/bench_release_gate.py builds them), published
the old way (the whole frame in this process: the release gate over every row, then the parts written one after
another, ``publish_release(frame)``) and the new way (parts of 5,000 rows, already on the Dask workers as
generation shards leave them, written and gate-checked there by ``privseed.tasks.data.corpus.write_part`` as the shards
call
it, then ``publish_release(staged)``, which combines the checks and commits the manifest). GX is warmed up in every
process first; building the rows is not timed. It prints both times, and what the driver held: the frame's
memory against the pickled size of the staged descriptors.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _keys(n: int, salt: str) -> list[str]:
    return [hashlib.sha256(f"{salt}:{i}".encode()).hexdigest() for i in range(n)]


def _fill(root: str, keys: list[str]) -> None:
    from privseed.tasks.llm.base import ChatResult
    from privseed.tasks.llm.cache import CallCache

    cache = CallCache(root)
    document = ("The old church by the river was rebuilt after the flood, and the village grew around it. " * 16)[:1400]
    with ThreadPoolExecutor(max_workers=32) as pool:
        list(pool.map(lambda k: cache.put(k, ChatResult(document, 300, 280, finish_reason="stop")), keys))


def _timed(fn) -> tuple[float, object]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def bench_cache(calls: list[int], stores: list[str], s3_calls: list[int], scenarios: list[str],
                probe_max: int | None, repeat: int) -> None:
    from privseed.tasks.llm.cache import CallCache

    server = None
    if "s3" in stores:
        from tests.s3server import MotoServer

        server = MotoServer().start()
        os.environ.update(server.env())
    try:
        for store in stores:
            for n in (s3_calls if store == "s3" else calls):
                if store == "s3":
                    root = f"s3://{server.create_bucket()}/llm-cache"
                else:
                    root = tempfile.mkdtemp(prefix="privseed-cache-bench-") + "/llm-cache"
                cached = _keys(n, "cached")
                started = time.perf_counter()
                _fill(root, cached)
                fill_s = time.perf_counter() - started
                uncached = _keys(n, "uncached")
                for scenario, keys in (("rerun", cached), ("first", uncached)):
                    if scenario not in scenarios:
                        continue
                    # Alternating, best of `repeat`: neither way gets a warmer page cache or a quieter machine.
                    probe_s = listed_s = float("inf")
                    for _ in range(repeat):
                        took, listed = _timed(lambda: CallCache(root).get_many(keys))
                        listed_s = min(listed_s, took)
                        assert sum(r is not None for r in listed) == (len(keys) if scenario == "rerun" else 0)
                        if probe_max is None or len(keys) <= probe_max:
                            before = CallCache(root)  # no index: get() probes one object per call, as before
                            took, probed = _timed(lambda: [before.get(k) for k in keys])
                            probe_s = min(probe_s, took)
                            assert [r is None for r in probed] == [r is None for r in listed]
                    if probe_s == float("inf"):
                        probe_s = None
                    print(json.dumps({"store": store, "entries": n, "lookups": len(keys),
                                      "scenario": {"rerun": "all cached (a re-run)",
                                                   "first": "none cached (a first run)"}[scenario],
                                      "probe_per_call_s": None if probe_s is None else round(probe_s, 2),
                                      "list_once_s": round(listed_s, 2),
                                      "speedup": None if probe_s is None else round(probe_s / listed_s, 1),
                                      "fill_s": round(fill_s, 1)}), flush=True)
    finally:
        if server is not None:
            server.stop()


def _candidate(rows: int):
    from benchmarks.bench_release_gate import candidate

    return candidate(rows)


def _part_rows(item: tuple[int, int, int]):
    """A generation shard's rows (built on the worker, as generation leaves them there)."""
    index, start, stop = item
    frame, _ = _candidate(stop)
    return frame.iloc[start:stop].reset_index(drop=True)


def _write_part(rows, index: int, out: str, release_id: str, gate):
    """A generation shard's last step, on its worker: its rows written and checked as one part."""
    from privseed.tasks.data.corpus import write_part

    return write_part(out, release_id, index, rows, None, gate)


def _warm_gate(gate) -> None:
    frame, _ = _candidate(50)
    gate(frame)  # GX imported and its context created, in every process, before anything is timed


def bench_publish(rows_list: list[int], workers: int) -> None:
    from distributed import wait

    from privseed.tasks.data.cluster import dask_client
    from privseed.tasks.data.corpus import StagedRelease, new_release_id, publish_release
    from privseed.tasks.generation.drivers import MAX_PART_ROWS
    from privseed.tasks.dp.ledger import PrivacyLedger
    from privseed.tasks.quality import release_gate

    with dask_client(n_workers=workers) as client:
        for rows in rows_list:
            frame, labels = _candidate(rows)
            # Some demo texts fail a document test (they are real abstracts, not LLM answers); every row is still
            # checked, the bound only lets the release through so that both paths run to the manifest.
            gate = release_gate(labels=labels, llm_used=True, max_non_document_rate=1.0)
            _warm_gate(gate)
            client.run(_warm_gate, gate)
            base = tempfile.mkdtemp(prefix="privseed-publish-bench-")
            ledger = PrivacyLedger(f"{base}/state", "bench", "bench")
            old_s, old = _timed(lambda: publish_release(f"{base}/old", frame, ledger=ledger, config={}, gate=gate,
                                                        rows_per_shard=MAX_PART_ROWS))
            held_old = int(frame.memory_usage(deep=True).sum())
            frame = None  # the new path starts without the rows in this process
            release_id = new_release_id()
            out = f"{base}/new"
            items = [(i, start, min(rows, start + MAX_PART_ROWS))
                     for i, start in enumerate(range(0, rows, MAX_PART_ROWS))]
            built = client.map(_part_rows, items, pure=False)
            wait(built)

            def staged_publish():
                parts = client.gather(client.map(_write_part, built, [i for i, _, _ in items], out=out,
                                                 release_id=release_id, gate=gate, pure=False))
                staged = StagedRelease(out, release_id, tuple(parts), gate)
                return staged, publish_release(out, staged, ledger=ledger, config={}, gate=gate)

            new_s, (staged, new) = _timed(staged_publish)
            built = None
            assert old["rows"] == new["rows"] == rows and old["gate"] == new["gate"]
            print(json.dumps({"rows": rows, "parts": len(items), "workers": workers,
                              "old_publish_s": round(old_s, 1), "parallel_parts_s": round(new_s, 1),
                              "speedup": round(old_s / new_s, 2), "driver_frame_mb": round(held_old / 1e6, 1),
                              "driver_descriptors_mb": round(len(pickle.dumps(staged)) / 1e6, 2),
                              "gate_success": new["gate"]["success"]}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what", required=True)
    cache = sub.add_parser("cache")
    cache.add_argument("--calls", type=int, nargs="+", default=[10_000, 100_000])
    cache.add_argument("--store", nargs="+", default=["local", "s3"], choices=["local", "s3"])
    cache.add_argument("--s3-calls", type=int, nargs="+", default=None, help="sizes on S3 (default: --calls)")
    cache.add_argument("--scenario", nargs="+", default=["rerun", "first"], choices=["rerun", "first"],
                       help="rerun: every call cached; first: none cached")
    cache.add_argument("--repeat", type=int, default=1, help="best of this many, the two ways alternating")
    cache.add_argument("--probe-max", type=int, default=None,
                       help="time the old probe-per-call check only up to this many lookups")
    publish = sub.add_parser("publish")
    publish.add_argument("--rows", type=int, nargs="+", default=[20_000, 100_000])
    publish.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    print(f"# {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}", flush=True)
    if args.what == "cache":
        bench_cache(args.calls, args.store, args.s3_calls or args.calls, args.scenario, args.probe_max, args.repeat)
    else:
        bench_publish(args.rows, args.workers)
    print(f"# load average at the end {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
