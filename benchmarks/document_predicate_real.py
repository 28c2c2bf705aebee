"""False-reject rate of the "is this a document" predicate (privseed.tasks.quality.document_rejection) on REAL
documents.

    nice -n 10 python benchmarks/document_predicate_real.py [--examples 3]

Public data only: the test splits of DBPedia-14, OHSUMED-23, Yelp (Aug-PE's copy) and Medical Abstracts. Each real
document is checked with its own first 10 distinct public-vocabulary terms as its "seed" (so the seed-echo tests
see realistic seeds) and finish_reason "stop". A real document is a document: every rejection here is a false
reject. Prints the rate per corpus and per reason, and a few rejected texts per reason to read.
"""
from __future__ import annotations

import argparse
import collections
import re

import pandas as pd

from privseed.tasks.quality import DEFAULT_RULES, document_rejection

CORPORA = {
    "dbpedia14": "/work/shared/data/dbpedia14/test.parquet",
    "ohsumed23": "/work/shared/data/ohsumed23/test.parquet",
    "yelp": "/work/shared/data/augpe/yelp/test.parquet",
    "medabstracts": "/work/shared/data/medabstracts/test.parquet",
}


def public_vocabulary(n: int = 50_000) -> set[str]:
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS
    from wordfreq import top_n_list

    return {w for w in top_n_list("en", n) if w.isalpha() and len(w) > 2 and w not in ENGLISH_STOP_WORDS}


def first_terms(text: str, vocab: set[str], length: int = 10) -> list[str]:
    out: list[str] = []
    for tok in re.findall(r"[a-z]+", text.lower()):
        if tok in vocab and tok not in out:
            out.append(tok)
            if len(out) == length:
                break
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=2)
    parser.add_argument("--limit", type=int, default=0, help="documents per corpus (0: all)")
    args = parser.parse_args()
    vocab = public_vocabulary()
    print(f"rules: {DEFAULT_RULES}")
    for name, path in CORPORA.items():
        texts = pd.read_parquet(path, columns=["text"])["text"].astype(str).tolist()
        if args.limit:
            texts = texts[:args.limit]
        reasons = collections.Counter()
        examples = collections.defaultdict(list)
        for text in texts:
            reason = document_rejection(text, first_terms(text, vocab), "stop")
            if reason:
                reasons[reason] += 1
                examples[reason].append(text)
        rejected = sum(reasons.values())
        print(f"\n{name}: {len(texts)} real documents, {rejected} rejected = {100 * rejected / len(texts):.2f} % "
              f"({', '.join(f'{r} {c}' for r, c in reasons.most_common()) or 'none'})")
        for reason, items in examples.items():
            for text in items[:args.examples]:
                print(f"  [{reason}] {text[:220]!r}")


if __name__ == "__main__":
    main()
