"""Answers that open with a document kind's public openings, against answers the model opens itself: the same
released seeds, the same prompts (the example library's examples, the owner's class names), the first candidate of
each seed only, so the two arms differ in the opening alone (issue 48: SmolLM2-135M opened 83 % of its reviews with
"The" and the seed's first term, real Yelp reviews 5.6 %).

Reads the rows of a published release (their released keyphrases, labels and call seeds), writes each arm's
documents beside the output (``OUT/<arm>.parquet``), and prints for each arm: TF-IDF + logistic regression
(scikit-learn) trained on the documents and on their seeds, tested on the real test split; the most common first
words; the rows the document predicate rejects; the rows of the non-food categories that name food.

    python benchmarks/review_openings.py RELEASE --test test.parquet --class-names names.json --out OUT
        [--doc-type review] [--per-class 20] [--offset 0] [--openings "I went|We|..."] [--avoid-other-classes]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import platform
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

from benchmarks.bench_noise import cpu_model  # noqa: E402
from benchmarks.llm_local_utility import utility  # noqa: E402
from privseed.tasks.data.corpus import read_release  # noqa: E402
from privseed.tasks.generation.examples import answer_openings, examples_for_doc_type  # noqa: E402
from privseed.tasks.generation.class_fit import SeedClasses  # noqa: E402
from privseed.tasks.generation.params import GenerationParams  # noqa: E402
from privseed.tasks.generation.rounds import candidate_request, cleaned, foreign_words  # noqa: E402
from privseed.tasks.llm import PromptTemplate, ReleasedVocabulary  # noqa: E402
from privseed.tasks.llm.local import LlamaCppBackend  # noqa: E402
from privseed.tasks.llm.released import ReleasedSeed, load_class_names  # noqa: E402
from privseed.tasks.quality import document_rejection  # noqa: E402

#: Words that place a review at a meal (the restaurant pull measured in issue 48).
FOOD = re.compile(r"\b(?:food|restaurant|dinner|lunch|breakfast|menu|pizza|chicken|burger|sushi|meal|dish|taste|"
                  r"delicious)\b", re.I)
FOOD_CLASSES = re.compile(r"Restaurants|Bars|Food", re.I)


def released_seeds(rows: pd.DataFrame) -> list[ReleasedSeed]:
    """The rows' released seeds (keyphrases, label, call seed; a release without call seeds numbers its rows)."""
    vocabulary = ReleasedVocabulary(sorted({t for k in rows["keyphrases"] for t in k}), "the release's keyphrases")
    call_seeds = rows["seed"] if "seed" in rows else range(len(rows))
    return [vocabulary.seed(list(k), label, int(s))
            for k, label, s in zip(rows["keyphrases"], rows["label"], call_seeds)]


def arm_documents(rows: pd.DataFrame, params: GenerationParams, backend: LlamaCppBackend,
                  avoid: dict | None = None) -> pd.DataFrame:
    """Each row's first candidate under ``params``: the pipeline's own request (``candidate_request``) and cleaning;
    ``avoid``: each class's words to keep out (``foreign_words``; None: none)."""
    template = PromptTemplate.load(params.template)
    out = []
    for released, keyphrases, label in zip(released_seeds(rows), rows["keyphrases"], rows["label"]):
        words = (avoid or {}).get(label, ())
        answer = cleaned(backend.complete([candidate_request(template, released, params, 0, "local",
                                                             avoid=words)])[0])
        out.append({"text": answer.text, "label": label, "keyphrases": list(keyphrases),
                    "rejected": document_rejection(answer.text, tuple(keyphrases), answer.finish_reason) or ""})
    return pd.DataFrame(out)


def describe(name: str, docs: pd.DataFrame, test: pd.DataFrame) -> str:
    labels = docs["label"].astype(str)
    test = test.assign(label=test["label"].astype(str))
    documents = utility(docs["text"], labels, test)
    seeds = utility([" ".join(k) for k in docs["keyphrases"]], labels, test)
    first = collections.Counter(t.split()[0] if t.split() else "" for t in docs["text"])
    other = docs[~labels.str.contains(FOOD_CLASSES)]
    food = other["text"].str.contains(FOOD).mean() if len(other) else float("nan")
    rejected = collections.Counter(r for r in docs["rejected"] if r)
    return (f"{name}: {len(docs)} rows, documents {100 * documents:.1f} %, their seeds {100 * seeds:.1f} % "
            f"({100 * (documents - seeds):+.1f}); first words "
            + ", ".join(f"{w} {100 * c / len(docs):.0f} %" for w, c in first.most_common(4))
            + f"; rejected {sum(rejected.values())} {dict(rejected)}; food words in other classes' rows "
            f"{100 * food:.1f} %")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("release", help="a published release whose rows carry keyphrases and call seeds")
    ap.add_argument("--test", required=True, help="the real test split (text, label)")
    ap.add_argument("--class-names", required=True, help="the owner's public class names (JSON, TOML or CSV)")
    ap.add_argument("--out", required=True, help="folder for each arm's documents")
    ap.add_argument("--doc-type", default="review")
    ap.add_argument("--per-class", type=int, default=20)
    ap.add_argument("--offset", type=int, default=0, help="skip this many rows of each class first")
    ap.add_argument("--openings", default=None, help="'|'-separated openings (default: the library's for the kind)")
    ap.add_argument("--max-tokens", type=int, default=None, help="default: the release's own")
    ap.add_argument("--n-threads", type=int, default=1)
    ap.add_argument("--avoid-other-classes", action="store_true",
                    help="a third arm: the openings, and each class's words of the other classes kept out "
                    "(SeedClasses.foreign_words over the rows' seeds, as --avoid-other-classes does)")
    args = ap.parse_args()
    manifest, rows = read_release(args.release)
    rank = rows.groupby("label").cumcount()
    rows = rows[(rank >= args.offset) & (rank < args.offset + args.per_class)]
    openings = (tuple(args.openings.split("|")) if args.openings
                else answer_openings(None, "library", True, args.doc_type))
    if not openings:
        raise SystemExit(f"--doc-type {args.doc_type!r} names no library kind with openings; pass --openings")
    params = GenerationParams(doc_type=args.doc_type, few_shot=examples_for_doc_type(args.doc_type),
                              class_names=load_class_names(args.class_names),
                              max_tokens=args.max_tokens or int(manifest["config"].get("max_tokens") or 256))
    test = pd.read_parquet(args.test)
    backend = LlamaCppBackend(n_threads=args.n_threads)
    print(f"machine: {cpu_model()}, {os.cpu_count()} CPU core(s), {args.n_threads} thread(s), Python "
          f"{platform.python_version()}; model {backend.model}; {len(rows)} seeds of {args.release}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    with_openings = dataclasses.replace(params, openings=openings)
    arms: list[tuple[str, str, GenerationParams, dict | None]] = [
        ("own", "model's own opening", params, None), ("openings", "public openings", with_openings, None)]
    if args.avoid_other_classes:
        seeds = released_seeds(rows)
        avoid = foreign_words(seeds, SeedClasses.from_seeds(seeds), with_openings)
        arms.append(("avoid", "public openings, other classes' words kept out", with_openings, avoid))
    for file, name, arm, words in arms:
        start = time.perf_counter()
        docs = arm_documents(rows, arm, backend, words)
        docs.to_parquet(Path(args.out) / f"{file}.parquet", index=False)
        print(describe(name, docs, test) + f"; {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
