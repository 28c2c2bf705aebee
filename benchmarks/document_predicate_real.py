"""False-reject rate of the document predicate (privseed.tasks.quality.document_rejection) on REAL documents, and
its catch rate on labelled degenerate LLM answers.

    nice -n 10 python benchmarks/document_predicate_real.py --data DIR [--examples 2] [--limit N]

Public data only (DIR holds the corpora of docs/datasets.md): the thresholds of the measured statistics
were chosen on the tuning splits (DBPedia-14 train, OHSUMED-23 train, Yelp dev); the test splits of the same corpora
and Medical Abstracts (no split of it was seen in tuning) measure the false rejects. Each real document is checked
with its own first 10 distinct public-vocabulary terms as its "seed" (so the seed-echo tests see realistic seeds)
and finish_reason "stop", and as a row of a release whose prompts named the classes (its corpus's public class names,
experiments/class_names/, for the ``names_class`` test). A real document is a document: every rejection is a false
reject. Prints the rate per
corpus and per reason (and, for the statistics, which one), a few rejected texts per reason to read, then the catch
rate on tests/fixtures/degenerate_documents.json (rows quoted from releases, each labelled with its reason).
Beside the rejects, each corpus's share of the documents generation would ask to rewrite (``rewrite_score`` >= 1:
repetitive, a seed glossed as a label, a two-word class name opening it; a soft test that rejects nothing:
GenerationParams.max_rewrites), and the share the document-preamble family matches on its own (patterns.json
``document_preamble``: "The Yelp review is: ...", whatever reason the predicate reports first; a rejection it
alone makes is counted as ``meta_talk:document_preamble``).
"""
from __future__ import annotations

import argparse
import collections
import json
import re
from dataclasses import replace
from pathlib import Path

import pandas as pd

from privseed.tasks.quality import (DEFAULT_RULES, document_rejection, language_probability, rewrite_score,
                                    statistic_over_threshold)
from privseed.tasks.llm.released import load_class_names
from privseed.tasks.quality.patterns import META_TALK_PATTERNS, document_preamble
from privseed.tasks.quality.predicate import spam_markup
from privseed.tasks.quality.shapes import web_markup

#: corpus -> (file under --data, its label column, its public class names in experiments/class_names/): each real
#: document is checked as a row of a release whose prompts named the classes (the ``names_class`` test).
CORPORA = {
    "dbpedia14 train (tuning)": ("dbpedia14/train.parquet", "label", "dbpedia14.toml"),
    "ohsumed23 train (tuning)": ("ohsumed23/train.parquet", "label", "ohsumed23.toml"),
    "yelp dev (tuning)": ("augpe/yelp/dev.parquet", "label1", "yelp.toml"),
    "dbpedia14 test": ("dbpedia14/test.parquet", "label", "dbpedia14.toml"),
    "ohsumed23 test": ("ohsumed23/test.parquet", "label", "ohsumed23.toml"),
    "yelp test": ("augpe/yelp/test.parquet", "label1", "yelp.toml"),
    "medabstracts test": ("medabstracts/test.parquet", "label", "medabstracts.toml"),
}
CLASS_NAMES = Path(__file__).resolve().parent.parent / "experiments" / "class_names"
LABELLED = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "degenerate_documents.json"
STATISTIC_REASONS = ("repetitive", "not_prose")


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


def false_rejects(path: Path, label_column: str, class_names: str, vocab: set[str],
                  limit: int) -> tuple[int, collections.Counter[str], dict[str, list[str]], int, int]:
    frame = pd.read_parquet(path, columns=["text", label_column])
    texts = frame["text"].astype(str).tolist()
    labels = frame[label_column].tolist()
    if limit:
        texts, labels = texts[:limit], labels[:limit]
    rules = replace(DEFAULT_RULES, class_names=load_class_names(str(CLASS_NAMES / class_names)).names)
    reasons: collections.Counter[str] = collections.Counter()
    examples: dict[str, list[str]] = collections.defaultdict(list)
    repetitive = preambles = 0
    for text, label in zip(texts, labels):
        seed = first_terms(text, vocab)
        repetitive += rewrite_score(text, seed, rules, label) >= 1.0
        # The preamble family on its own, whatever reason comes first (patterns.json document_preamble).
        preamble = document_preamble(text)
        if preamble is not None:
            preambles += 1
            examples[f"document_preamble:{preamble} (alone)"].append(text)
        reason = document_rejection(text, seed, "stop", rules, label=label)
        if reason:
            if reason in STATISTIC_REASONS:
                reason = f"{reason}:{statistic_over_threshold(text)}"
            elif reason == "web_markup":
                reason = f"{reason}:{spam_markup(web_markup(text), DEFAULT_RULES)}"
            elif reason == "meta_talk" and preamble is not None and not any(p.search(text) for p in META_TALK_PATTERNS):
                reason = f"{reason}:document_preamble"
            reasons[reason] += 1
            examples[reason].append(text)
    return len(texts), reasons, examples, repetitive, preambles


def catch_rate() -> None:
    rows = json.loads(LABELLED.read_text(encoding="utf-8"))["documents"]
    caught = collections.Counter()
    missed = []
    # Per source, the name's prefix before its colon ("issue48", "issue48 variation"): the catch rate of one issue's
    # rows reads apart from the rest.
    sources: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for row in rows:
        reason = document_rejection(row["text"], row["keyphrases"], row["finish_reason"])
        source = sources[row["name"].split(":")[0]]
        source[1] += 1
        if reason is None:
            missed.append(row["name"])
        else:
            caught[reason] += 1
            source[0] += 1
    total = len(rows)
    # The measured statistics alone (no pattern, no seed test): Gopher repetition and quality, MATTR, language.
    statistics = sum(statistic_over_threshold(row["text"]) is not None
                     or language_probability(row["text"], "en") < DEFAULT_RULES.min_language_prob for row in rows)
    print(f"\nlabelled degenerate answers ({LABELLED.name}): {total - len(missed)} of {total} caught = "
          f"{100 * (total - len(missed)) / total:.1f} % ({', '.join(f'{r} {c}' for r, c in caught.most_common())})")
    print(f"  of them by the measured statistics alone (Gopher, MATTR, language): {statistics} of {total} = "
          f"{100 * statistics / total:.1f} %")
    for name, (hit, seen) in sorted(sources.items()):
        if name.startswith("issue"):
            print(f"  {name}: {hit} of {seen} caught")
    for name in missed:
        print(f"  missed: {name}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=2)
    parser.add_argument("--limit", type=int, default=0, help="documents per corpus (0: all)")
    parser.add_argument("--data", type=Path, required=True,
                        help="folder of the public corpora: dbpedia14/, ohsumed23/, augpe/yelp/, medabstracts/")
    args = parser.parse_args()
    vocab = public_vocabulary()
    print(f"rules: {DEFAULT_RULES}")
    for name, (relative, label_column, class_names) in CORPORA.items():
        n, reasons, examples, repetitive, preambles = false_rejects(args.data / relative, label_column, class_names,
                                                                    vocab, args.limit)
        rejected = sum(reasons.values())
        print(f"\n{name}: {n} real documents, {rejected} rejected = {100 * rejected / n:.2f} % "
              f"({', '.join(f'{r} {c}' for r, c in reasons.most_common()) or 'none'}); "
              f"{100 * repetitive / n:.2f} % would be rewritten (rewrite_score >= 1); "
              f"the document-preamble family alone matches {preambles} = {100 * preambles / n:.2f} %")
        for reason, items in examples.items():
            for text in items[:args.examples]:
                print(f"  [{reason}] {text[:220]!r}")
    catch_rate()


if __name__ == "__main__":
    main()
