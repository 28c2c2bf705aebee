"""Coverage and downstream utility of locally written documents vs. the keyphrase sequences themselves.

    nice -n 10 python benchmarks/llm_local_utility.py --per-class 10 --configs none,generic,coverage3

Seeds: until the DP samplers are wired in, each seed is the first 10 distinct public-vocabulary terms of a real
DBPedia-14 *training* document (public vocabulary = wordfreq's 50K most frequent alphabetic English words minus
sklearn's stop words). This is NOT private (it reads documents directly); it only compares generation settings
on identical, realistic seeds. Every configuration uses the same seeds. Utility: TF-IDF + logistic regression
trained on the synthetic text only, tested on the real DBPedia-14 test set (2,100 documents).
Calls go through the call cache (--cache), so an interrupted run resumes where it stopped.
"""
from __future__ import annotations

import argparse
import re
import time

import numpy as np
import pandas as pd

from privseed.tasks.evaluation.experiment import data_root
from privseed.tasks.generation.drivers import generate_shard
from privseed.tasks.generation.params import GenerationParams
from privseed.tasks.llm import LLMSpec, RecipientExample, ReleasedVocabulary, get_backend

DOC_TYPE = "summary of a Wikipedia-style article"
# One public example of the document type, written for this benchmark (not from the dataset).
PUBLIC_EXAMPLE = RecipientExample(
    document=("Lake Tarvo is a freshwater lake in the northern highlands of Finland. It covers about 40 square "
              "kilometres and drains into the Kemi River. The lake is surrounded by pine forest, and the small "
              "village of Tarvola on its eastern shore is known for fishing and summer cottages."),
    keyphrases=("lake", "northern", "finland", "square", "river", "forest", "village", "shore", "fishing", "summer"))

CONFIGS = {
    "none": None,
    "generic": dict(template="generic", temperature=0.7, best_of=1),
    "coverage": dict(template="coverage", temperature=0.4, best_of=1),
    "coverage3": dict(template="coverage", temperature=0.4, best_of=3),
    "coverage_example": dict(template="coverage", temperature=0.4, best_of=1, few_shot=(PUBLIC_EXAMPLE,)),
    "coverage3_example": dict(template="coverage", temperature=0.4, best_of=3, few_shot=(PUBLIC_EXAMPLE,)),
}


def public_vocabulary(n: int = 50_000) -> list[str]:
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS
    from wordfreq import top_n_list

    return [w for w in top_n_list("en", n) if w.isalpha() and len(w) > 2 and w not in ENGLISH_STOP_WORDS]


def first_terms(text: str, vocab: set[str], length: int = 10) -> list[str]:
    out: list[str] = []
    for tok in re.findall(r"[a-z]+", text.lower()):
        if tok in vocab and tok not in out:
            out.append(tok)
            if len(out) == length:
                break
    return out


def utility(train_text, train_y, test: pd.DataFrame) -> float:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    vec = TfidfVectorizer(sublinear_tf=True, ngram_range=(1, 2), min_df=1)
    X = vec.fit_transform(train_text)
    clf = LogisticRegression(max_iter=2000, C=10.0).fit(X, train_y)
    return float((clf.predict(vec.transform(test["text"])) == test["label"].to_numpy()).mean())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-class", type=int, default=10)
    ap.add_argument("--configs", default="none,generic,coverage3")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--model", default=None, help="local model (default: packaged SmolLM2-135M)")
    ap.add_argument("--n-threads", type=int, default=2)
    ap.add_argument("--cache", default="/tmp/privseed-llm-bench-cache")
    ap.add_argument("--seed", type=int, default=20240601)
    ap.add_argument("--retry-rounds", type=int, default=2,
                    help="extra candidates for seeds whose answers the release gate would reject (0: off)")
    ap.add_argument("--out", default=None, help="write the generated rows of each config to OUT_<config>.parquet")
    args = ap.parse_args()

    data = data_root() / "dbpedia14"  # $PRIVSEED_DATA_ROOT (docs/datasets.md)
    train = pd.read_parquet(data / "train.parquet")
    test = pd.read_parquet(data / "test.parquet")
    rng = np.random.default_rng(args.seed)
    picked = pd.concat([g.iloc[rng.permutation(len(g))[: args.per_class]] for _, g in train.groupby("label")])
    vocab_list = public_vocabulary()
    vocab = set(vocab_list)
    seqs = [first_terms(t, vocab) for t in picked["text"]]
    released = ReleasedVocabulary(vocab_list, "benchmark public vocabulary (not DP)")
    seeds = [released.seed(s, int(lab), args.seed + i) for i, (s, lab) in enumerate(zip(seqs, picked["label"]))
             if s]
    print(f"{len(seeds)} seeds ({args.per_class} per class), "
          f"mean length {np.mean([len(s.keyphrases) for s in seeds]):.1f}")
    spec = LLMSpec("local", args.model).with_options(n_threads=args.n_threads)
    for name in args.configs.split(","):
        cfg = CONFIGS[name]
        t0 = time.time()
        if cfg is None:
            df = generate_shard(seeds, "none", GenerationParams(doc_type=DOC_TYPE), None)
        else:
            params = GenerationParams(doc_type=DOC_TYPE, max_tokens=args.max_tokens,
                                      max_regenerations=args.retry_rounds, **cfg)
            get_backend(spec)  # load outside the timing
            t0 = time.time()
            df = generate_shard(seeds, spec, params, args.cache, progress=False)
        dt = time.time() - t0
        acc = utility(df["text"], df["label"], test)
        words = df["text"].str.split().str.len()
        toks = int(df["tokens_out"].sum())
        from privseed.tasks.quality import is_document

        ok = sum(is_document(t, k, f) for t, k, f in zip(df["text"], df["keyphrases"], df["finish_reason"])) / len(df)
        print(f"{name:18s} documents {ok:6.1%}  coverage {df['coverage'].mean():6.1%}  accuracy {acc:6.1%}  "
              f"median words {words.median():5.0f}  "
              f"calls {int(df['candidates'].sum())}  out tokens {toks}  wall {dt:7.1f}s  "
              f"(uncached: {toks / dt if dt > 1 else float('nan'):.1f} tok/s, "
              f"{60 * len(df) / dt if dt > 1 else float('nan'):.1f} docs/min)",
              flush=True)
        if args.out:
            df.to_parquet(f"{args.out}_{name}.parquet")


if __name__ == "__main__":
    main()
