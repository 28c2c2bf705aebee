"""Seed steering on/off for the local model, on PUBLIC seeds (for choosing --steer's default).

    nice -n 10 python benchmarks/llm_steering.py --per-class 3 --configs off,s2,s4,s8,s4nr

Seeds: the first 10 distinct public-vocabulary terms (wordfreq top 50K, no stop words) of documents of the
DBPedia-14 TEST split, --per-class per class, drawn with a fixed public seed. Never the data results are
reported on: the reported runs use DP seeds released from the TRAIN split. No regeneration, one candidate, so
the degenerate rate is the model's own. Prints per configuration: seed-term coverage (tasks.metrics.term_coverage),
the share of answers the document predicate rejects and why, output tokens/s and documents/min, and two texts.
"""
from __future__ import annotations

import argparse
import collections
import tempfile
import time

import numpy as np
import pandas as pd

from document_predicate_real import first_terms, public_vocabulary
from tasks.generation import GenerationParams, generate_shard
from tasks.llm import LLMSpec, ReleasedVocabulary, load_few_shot
from tasks.quality import document_rejection

CONFIGS = {
    "off": dict(steer=0.0),
    "s1": dict(steer=1.0),
    "s2": dict(steer=2.0),
    "s4": dict(steer=4.0),
    "s8": dict(steer=8.0),
    "s4nr": dict(steer=4.0, no_repeat_ngram=4),
    "s2nr": dict(steer=2.0, no_repeat_ngram=4),
    "s4rp": dict(steer=4.0, repeat_penalty=1.15),
    "nr": dict(steer=0.0, no_repeat_ngram=4),
    "s1nr": dict(steer=1.0, no_repeat_ngram=4),
    "s3nr": dict(steer=3.0, no_repeat_ngram=4),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-class", type=int, default=3)
    ap.add_argument("--configs", default="off,s2,s4,s8,s4nr")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--template", default="coverage")
    ap.add_argument("--temperature", type=float, default=0.4)
    ap.add_argument("--doc-type", default="Wikipedia article")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--few-shot", help="recipient few-shot examples (JSONL), e.g. tasks/demo_data/few_shot_wikipedia.jsonl")
    args = ap.parse_args()
    test = pd.read_parquet("/work/shared/data/dbpedia14/test.parquet")
    rng = np.random.default_rng(2024)
    vocab = public_vocabulary()
    picks = [i for label in sorted(test["label"].unique())
             for i in rng.choice(np.flatnonzero(test["label"] == label), args.per_class, replace=False)]
    terms = [first_terms(test["text"][i], vocab) for i in picks]
    released = ReleasedVocabulary(sorted({t for ts in terms for t in ts}), "public DBPedia-14 test terms")
    seeds = [released.seed(ts, int(test["label"][i]), 7000 + n) for n, (i, ts) in enumerate(zip(picks, terms))]
    spec = LLMSpec("local").with_options(n_threads=args.threads)
    few_shot = tuple(load_few_shot(args.few_shot)) if args.few_shot else ()
    for name in args.configs.split(","):
        params = GenerationParams(doc_type=args.doc_type, template=args.template, temperature=args.temperature,
                                  max_tokens=args.max_tokens, best_of=1, max_regenerations=0, few_shot=few_shot,
                                  **CONFIGS[name])
        started = time.perf_counter()
        df = generate_shard(seeds, spec, params, tempfile.mkdtemp(), progress=False)
        wall = time.perf_counter() - started
        reasons = collections.Counter(document_rejection(t, k, f) for t, k, f in
                                      zip(df["text"], df["keyphrases"], df["finish_reason"]))
        bad = sum(c for r, c in reasons.items() if r is not None)
        print(f"{name:6s} {CONFIGS[name]} few-shot {len(few_shot)}  coverage {df['coverage'].mean():6.1%}  degenerate {bad / len(df):6.1%} "
              f"({', '.join(f'{r} {c}' for r, c in reasons.items() if r) or 'none'})  "
              f"{df['tokens_out'].sum() / wall:5.1f} tokens/s  {60 * len(df) / wall:5.1f} docs/min  "
              f"median words {df['text'].str.split().str.len().median():.0f}", flush=True)
        for text, kp in list(zip(df["text"], df["keyphrases"]))[:2]:
            print(f"    seed: {', '.join(kp)}\n    text: {text[:300]!r}", flush=True)


if __name__ == "__main__":
    main()
