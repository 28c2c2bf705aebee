"""Downstream utility of published releases: TF-IDF + logistic regression trained on each release's synthetic
text, tested on a real test set, beside the same classifier trained on the keyphrase sequences of the same rows
(what `--llm none` releases from those seeds). Also: mean seed-term coverage and the rows the document
predicate (privseed.tasks.quality.document_rejection) rejects, by reason.

    python benchmarks/llm_release_utility.py OUT [OUT ...] [--test $PRIVSEED_DATA_ROOT/dbpedia14/test.parquet]
"""
from __future__ import annotations

import argparse
import collections

import pandas as pd

from benchmarks.llm_local_utility import utility
from privseed.tasks.data.corpus import read_release
from privseed.tasks.evaluation.experiment import data_root
from privseed.tasks.llm import term_coverage
from privseed.tasks.quality import document_rejection


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("releases", nargs="+")
    ap.add_argument("--test", help="the real test split (default: "
                    "$PRIVSEED_DATA_ROOT/dbpedia14/test.parquet, docs/datasets.md)")
    args = ap.parse_args()
    test = pd.read_parquet(args.test or data_root() / "dbpedia14" / "test.parquet")
    for out in args.releases:
        manifest, df = read_release(out)
        labels = df["label"].astype(int)
        acc = utility(df["text"], labels, test)
        line = (f"{out}: {len(df)} docs, epsilon {manifest['privacy']['epsilon']:g}, "
                f"median words {df['text'].str.split().str.len().median():.0f}, accuracy {acc:.1%}")
        if "keyphrases" in df and df["keyphrases"].map(len).sum():
            cov = sum(term_coverage(t, list(k)) for t, k in zip(df["text"], df["keyphrases"])) / len(df)
            seeds = utility([" ".join(k) for k in df["keyphrases"]], labels, test)
            reasons = collections.Counter(r for r in (document_rejection(t, list(k))
                                                      for t, k in zip(df["text"], df["keyphrases"])) if r)
            line += (f"; seeds of the same rows: accuracy {seeds:.1%} (documents {100 * (acc - seeds):+.1f} "
                     f"points); coverage {cov:.1%}; rows the predicate rejects: {sum(reasons.values())} "
                     f"{dict(reasons)}")
        print(line)


if __name__ == "__main__":
    main()
