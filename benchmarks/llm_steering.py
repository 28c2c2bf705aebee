"""Seed steering on/off for the local model, on PUBLIC seeds (for choosing --steer's default and schedule).

    nice -n 10 python benchmarks/llm_steering.py --per-class 3 --configs off,s2,s4,s8,s4nr
    nice -n 19 python benchmarks/llm_steering.py --seeds-from PUBLIC_RELEASE --configs s4nr-flat,s4nr

Seeds: the first 10 distinct public-vocabulary terms (wordfreq top 50K, no stop words) of documents of the
DBPedia-14 TEST split, --per-class per class, drawn with a fixed public seed; or, with ``--seeds-from``, the
keyphrase sequences of a ``--llm none`` DP-KPS release made FROM THE TEST SPLIT (DP seeds of the real shape,
which mix terms that rarely co-occur, but built from public data), the first --per-class of each class. Never
the data results are reported on: the reported runs use DP seeds released from the TRAIN split. No
regeneration, one candidate, so the degenerate rate is the model's own. A name ending in "-flat" runs the
first ("flat") steering schedule; the others run the default "budget" schedule (tasks/llm/steering.py). Prints
per configuration: seed-term coverage (privseed.tasks.quality.metrics.term_coverage),
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
from privseed.tasks.generation.defaults import (NO_REPEAT_NGRAM_DEFAULT, REPEAT_PENALTY_DEFAULT, STEER_DEFAULT,
                                                STEER_END_COVERAGE_DEFAULT)
from privseed.tasks.generation.drivers import generate_shard
from privseed.tasks.generation.params import GenerationParams
from privseed.tasks.llm import LLMSpec, ReleasedVocabulary, load_few_shot
from privseed.tasks.quality import document_rejection

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
    # the CLI's defaults (tasks/config/commands.py)
    "cli": dict(steer=STEER_DEFAULT, no_repeat_ngram=NO_REPEAT_NGRAM_DEFAULT, repeat_penalty=REPEAT_PENALTY_DEFAULT,
                steer_end_coverage=STEER_END_COVERAGE_DEFAULT),
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
    ap.add_argument("--few-shot",
                    help="recipient few-shot examples (JSONL), e.g. tasks/demo_data/few_shot_wikipedia.jsonl")
    ap.add_argument("--seeds-from", help="a --llm none DP-KPS release made from the DBPedia-14 TEST split")
    ap.add_argument("--llm", default="local", help="local | local:qwen2.5-coder-0.5b | ...")
    ap.add_argument("--show", type=int, default=2, help="texts printed per configuration")
    args = ap.parse_args()
    if args.seeds_from:
        from privseed.tasks.data.release_reader import read_release

        rows = read_release(args.seeds_from).rows
        rows = rows.groupby("label", sort=True).head(args.per_class)
        labels, terms = rows["label"].tolist(), [list(map(str, k)) for k in rows["keyphrases"]]
        source = "DP-KPS release from the public DBPedia-14 test split"
    else:
        from privseed.tasks.evaluation.experiment import data_root

        test = pd.read_parquet(data_root() / "dbpedia14" / "test.parquet")
        rng = np.random.default_rng(2024)
        vocab = public_vocabulary()
        picks = [i for label in sorted(test["label"].unique())
                 for i in rng.choice(np.flatnonzero(test["label"] == label), args.per_class, replace=False)]
        labels, terms = [int(test["label"][i]) for i in picks], [first_terms(test["text"][i], vocab) for i in picks]
        source = "public DBPedia-14 test terms"
    released = ReleasedVocabulary(sorted({t for ts in terms for t in ts}), source)
    seeds = [released.seed(ts, lab, 7000 + n) for n, (lab, ts) in enumerate(zip(labels, terms))]
    spec = LLMSpec("local", args.llm.partition(":")[2] or None).with_options(n_threads=args.threads)
    few_shot = tuple(load_few_shot(args.few_shot)) if args.few_shot else ()
    for name in args.configs.split(","):
        schedule = "flat" if name.endswith("-flat") else "budget"
        params = GenerationParams(doc_type=args.doc_type, template=args.template, temperature=args.temperature,
                                  max_tokens=args.max_tokens, best_of=1, max_regenerations=0, few_shot=few_shot,
                                  steer_schedule=schedule, **CONFIGS[name.removesuffix("-flat")])
        started = time.perf_counter()
        df = generate_shard(seeds, spec, params, tempfile.mkdtemp(), progress=False)
        wall = time.perf_counter() - started
        reasons = collections.Counter(document_rejection(t, k, f) for t, k, f in
                                      zip(df["text"], df["keyphrases"], df["finish_reason"]))
        bad = sum(c for r, c in reasons.items() if r is not None)
        print(f"{name:6s} {CONFIGS[name.removesuffix('-flat')]} {schedule} few-shot {len(few_shot)}  "
              f"coverage {df['coverage'].mean():6.1%}  degenerate {bad / len(df):6.1%} "
              f"({', '.join(f'{r} {c}' for r, c in reasons.items() if r) or 'none'})  "
              f"{df['tokens_out'].sum() / wall:5.1f} tokens/s  {60 * len(df) / wall:5.1f} docs/min  "
              f"median words {df['text'].str.split().str.len().median():.0f}  "
              f"finish {dict(collections.Counter(df['finish_reason']))}", flush=True)
        for text, kp in list(zip(df["text"], df["keyphrases"]))[:args.show]:
            print(f"    seed: {', '.join(kp)}\n    text: {text[:300]!r}", flush=True)


if __name__ == "__main__":
    main()
