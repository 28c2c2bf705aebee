"""Time the DP-KPS privatization stage at paper scale and compare fast scoring with naive scoring.

Paper scale: 14 classes x 1,000 sequences, |V~| = 1,000, L = 10, on $PRIVSEED_DATA_ROOT/dbpedia14/train.parquet
(docs/datasets.md). Stages: extract (phrase matching over V), histogram (first-S counts + discrete Laplace noise
from OpenDP + top N), embed (V~ with MiniLM), sketch (V~ matching, features, per-class sums, noise), sample.
The pure functions run in-process here (no Prefect, no Dask), so the figures are the math itself.

Naive scoring builds every zero-padded d*B query vector and projects it in full; it is timed on a slice of
prefixes at one step and extrapolated to the whole run (same number of prefixes x |V~| scores).

    python benchmarks/bench_dp_stage.py [--features 300] [--per-class 1000] [--methods independent,...]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from privseed.tasks.data.embedding import embed_texts  # noqa: E402
from privseed.tasks.evaluation.experiment import data_root  # noqa: E402
from privseed.tasks.seeds.kde import FeatureSpec, release_sketch, shard_sketch_sums, sketch_mechanism  # noqa: E402
from privseed.tasks.dp.ledger import public_rng  # noqa: E402
from privseed.tasks.dp.mechanisms import secure_noise  # noqa: E402
from privseed.tasks.seeds.sampling import (  # noqa: E402
    METHODS, SelectionRule, SketchTables, default_device, ensemble_blocks, fast_scores, naive_scores,
    sample_sequences, split_budget,
)
from privseed.tasks.seeds.vocabulary import (  # noqa: E402
    PhraseMatcher, english_vocabulary, first_terms_histogram, privatize_vocabulary, vocabulary_mechanism,
)

DEFAULT_RULE = {"independent": "power-2", "iterative-linear": "top-5", "iterative-log": "top-5"}


def timed(label: str, fn, results: dict):
    start = time.perf_counter()
    value = fn()
    results[label] = time.perf_counter() - start
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="default: $PRIVSEED_DATA_ROOT/dbpedia14/train.parquet (docs/datasets.md)")
    parser.add_argument("--features", type=int, default=300)
    parser.add_argument("--per-class", type=int, default=1000)
    parser.add_argument("--length", type=int, default=10)
    parser.add_argument("--vocab-size", type=int, default=1000)
    parser.add_argument("--naive-slice", type=int, default=4, help="prefixes scored naively per method")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--scale-docs", type=int, default=100_000,
                        help="documents for the extraction scale check (0 to skip)")
    args = parser.parse_args()
    args.data = args.data or str(data_root() / "dbpedia14" / "train.parquet")

    device = default_device()
    print(f"machine: {os.cpu_count()} CPU core(s), torch {torch.__version__}, scoring device {device}, "
          f"torch threads {torch.get_num_threads()}")
    corpus = pd.read_parquet(args.data)
    texts, labels = corpus["text"].tolist(), corpus["label"].tolist()
    classes = sorted(set(labels))
    print(f"corpus: {len(texts)} documents, {len(classes)} classes; I={args.features}, |V~|={args.vocab_size}, "
          f"L={args.length}, {args.per_class} sequences per class")

    shared: dict[str, float] = {}
    vocabulary = timed("load V", lambda: english_vocabulary(50_000), shared)
    matcher = PhraseMatcher(vocabulary)
    sequences = timed("extract", lambda: [matcher.match(t) for t in texts], shared)

    def histogram():
        counts = first_terms_histogram(sequences, len(vocabulary), 10)
        start = time.perf_counter()
        released = privatize_vocabulary(counts, mechanism=vocabulary_mechanism(1.0, 10), noise=secure_noise(),
                                        top_n=args.vocab_size)
        shared["histogram noise"] = time.perf_counter() - start
        return released["term_ids"]

    term_ids = timed("histogram", histogram, shared)
    terms = tuple(vocabulary.terms[i] for i in term_ids)
    from privseed.tasks.data.embedding import load_embedder

    timed("load model", lambda: load_embedder("minilm"), shared)  # imports + weights, once per process
    embeddings = timed("embed", lambda: embed_texts(list(terms), batch_size=256), shared)
    print("shared stages (s): " + ", ".join(f"{k} {v:.2f}" for k, v in shared.items()))

    header = f"{'method':<17}{'sketches':>9}{'sketch s':>10}{'noise s':>9}{'sample s':>10}{'DP stage s':>12}" \
             f"{'naive/prefix ms':>17}{'fast/prefix ms':>16}{'ratio':>8}{'naive full est. s':>19}"
    print(header)
    for method in args.methods.split(","):
        t: dict[str, float] = {}
        blocks = ensemble_blocks(method, args.length)
        specs = [FeatureSpec(seed=0, name=f"{method}-{k}", n_features=args.features, dim=embeddings.shape[1],
                             blocks=b, bandwidth=0.5) for k, b in enumerate(blocks)]
        budgets = split_budget(method, 10.0, args.length)

        def sketch():
            exact = shard_sketch_sums(texts, labels, classes, terms, embeddings, specs, method == "independent")
            start = time.perf_counter()
            released = np.stack([[release_sketch(exact[c, k], mechanism=sketch_mechanism("laplace", args.features,
                                                                                          budgets[k]),
                                                 noise=secure_noise())
                                  for k in range(len(specs))] for c in range(len(classes))])
            t["noise"] = time.perf_counter() - start  # OpenDP's secure sampler, one draw per (class, sketch)
            return released

        released = timed("sketch", sketch, t)

        def sample():
            sketches = [SketchTables.build(spec.draw(), embeddings, device=device) for spec in specs]
            return sample_sequences(method, sketches, released, per_class=args.per_class, length=args.length,
                                    rule=SelectionRule.parse(DEFAULT_RULE[method]), rng=public_rng(0, "sample"))

        timed("sample", sample, t)

        # Naive vs fast on the same slice: the longest sketch, at its last step (the most expensive query).
        k = len(blocks) - 1
        step = blocks[k]
        features = specs[k].draw()
        rng = np.random.default_rng(0)
        prefixes = rng.integers(0, len(terms), size=(args.naive_slice, step - 1))
        start = time.perf_counter()
        naive = naive_scores(features, released[0, k], embeddings.astype(np.float64), prefixes)
        naive_ms = (time.perf_counter() - start) / args.naive_slice * 1e3
        tables = SketchTables.build(features, embeddings, device=device)
        rows = len(classes) * args.per_class
        big = torch.as_tensor(rng.integers(0, len(terms), size=(rows, step - 1)), device=device)
        sums = torch.as_tensor(np.repeat(released[:, k], args.per_class, axis=0), device=device)
        start = time.perf_counter()
        fast_scores(tables, sums, big)
        fast_ms = (time.perf_counter() - start) / rows * 1e3
        small = fast_scores(tables, sums[: args.naive_slice], torch.as_tensor(prefixes, device=device)).cpu().numpy()
        err = np.abs(small - naive).max() / np.abs(naive).max()
        queries = len(classes) if method == "independent" else rows * args.length
        dp_stage = shared["extract"] + shared["histogram"] + shared["embed"] + t["sketch"] + t["sample"]
        print(f"{method:<17}{len(blocks):>9}{t['sketch']:>10.2f}{t['noise']:>9.2f}{t['sample']:>10.2f}{dp_stage:>12.2f}"
              f"{naive_ms:>17.2f}{fast_ms:>16.4f}{naive_ms / fast_ms:>8.0f}{naive_ms * queries / 1e3:>19.0f}"
              f"   (max rel. diff fast vs naive {err:.1e})", flush=True)
    if args.scale_docs:
        extraction_scale(texts, args.scale_docs)
    print("DP stage = extract + histogram + embed + sketch + sample (one-time loads of V and the model excluded); "
          "'noise s' = the sketches' OpenDP noise (part of 'sketch s'; the histogram's is 'histogram noise'); "
          "'naive full est.' = naive time per prefix "
          "x prefixes scored in the run (per_class x classes x L for iterative, per class x classes for independent)")


def extraction_scale(texts: list[str], n_docs: int) -> None:
    """Phrase extraction with a ~400K-term vocabulary (wordfreq top 400K + the medical term file) over
    ``n_docs`` documents (the corpus repeated)."""
    from privseed.tasks.seeds.vocabulary import Vocabulary, file_vocabulary

    start = time.perf_counter()
    english = english_vocabulary(400_000)
    root = os.environ.get("PRIVSEED_DATA_ROOT")  # the medical terms join the English list when they are there
    medical_path = Path(root) / "vocab" / "medical_terms.txt" if root else None
    medical = file_vocabulary(str(medical_path)).terms if medical_path and medical_path.exists() else ()
    big = Vocabulary.from_terms("english400k+medical", [*english.terms, *medical])
    matcher = PhraseMatcher(big)
    build = time.perf_counter() - start
    docs = (texts * (n_docs // len(texts) + 1))[:n_docs]
    start = time.perf_counter()
    matched = sum(len(matcher.match(t)) for t in docs)
    seconds = time.perf_counter() - start
    print(f"extraction scale: |V| = {len(big):,} terms (max {max(len(k) for k in big.keys)} tokens), index built in "
          f"{build:.1f} s; {n_docs:,} documents matched in {seconds:.1f} s ({n_docs / seconds:,.0f} docs/s, "
          f"{matched / n_docs:.1f} phrases/doc), single process")


if __name__ == "__main__":
    main()
