"""Time the Great Expectations release gate (privseed.tasks.quality.validate_release) on candidates of growing size.

    python benchmarks/bench_release_gate.py [--rows 100 1000 10000 50000]

Candidates are built from the bundled demo corpus's texts (public DBpedia-14 sample) with keyphrases taken
from each text, so every expectation has real work to do; the first call includes importing GX and
creating its ephemeral context.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402


def candidate(rows: int) -> tuple[pd.DataFrame, list]:
    from privseed.flows.demo import demo_corpus_path

    demo = pd.read_parquet(demo_corpus_path()).sample(frac=1.0, random_state=0)  # classes interleaved
    texts = demo["text"].astype(str).tolist()
    labels = demo["label"].tolist()
    frame = pd.DataFrame({
        "text": [f"{texts[i % len(texts)]} ({i})" for i in range(rows)],  # unique, like a healthy release
        "label": [labels[i % len(labels)] for i in range(rows)],
        "keyphrases": [texts[i % len(texts)].split()[:5] for i in range(rows)],
    })
    return frame, sorted(set(labels), key=str)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[100, 1000, 10000, 50000])
    args = parser.parse_args()

    started = time.perf_counter()
    from privseed.tasks.quality import validate_release

    print(f"import privseed.tasks.quality: {time.perf_counter() - started:.2f} s")
    for i, rows in enumerate(args.rows):
        frame, labels = candidate(rows)
        started = time.perf_counter()
        result = validate_release(frame, labels=labels, llm_used=True)
        elapsed = time.perf_counter() - started
        note = " (first call: GX import + context)" if i == 0 else ""
        print(f"rows={rows:>6}  gate={elapsed:6.2f} s  success={result['success']}  "
              f"expectations={len(result['expectations'])}{note}")


if __name__ == "__main__":
    main()
