"""Downstream utility of published releases: TF-IDF + logistic regression trained on each release's synthetic
text, tested on a real test set. Used to compare `--llm none` and `--llm local` runs at the same budget/seed.

    python benchmarks/llm_release_utility.py OUT_NONE OUT_LOCAL [--test /work/shared/data/dbpedia14/test.parquet]
"""
from __future__ import annotations

import argparse

import pandas as pd

from benchmarks.llm_local_utility import utility
from tasks.corpus import read_release
from tasks.llm import term_coverage


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("releases", nargs="+")
    ap.add_argument("--test", default="/work/shared/data/dbpedia14/test.parquet")
    args = ap.parse_args()
    test = pd.read_parquet(args.test)
    for out in args.releases:
        manifest, df = read_release(out)
        cov = sum(term_coverage(t, list(k)) for t, k in zip(df["text"], df["keyphrases"])) / len(df)
        acc = utility(df["text"], df["label"].astype(int), test)
        backend = df["backend"].iloc[0] if "backend" in df else "none"
        print(f"{out}: {len(df)} docs, backend {backend}, epsilon {manifest['privacy']['epsilon']:g}, "
              f"coverage {cov:.1%}, median words {df['text'].str.split().str.len().median():.0f}, accuracy {acc:.1%}")


if __name__ == "__main__":
    main()
