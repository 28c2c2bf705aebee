"""What one DP-KPS release's LLM step made of its seeds (experiments/results/generation.md).

    python benchmarks/generation_release_summary.py OUT [--log RUN.log]
        [--test $PRIVSEED_DATA_ROOT/dbpedia14/test.parquet]

Prints: rows generated / kept / dropped (and why), rejected candidates by reason and regeneration calls (the
release's quality.json), mean seed-term coverage of the kept rows (privseed.tasks.quality.metrics.term_coverage), their
degenerate rate by the document predicate (privseed.tasks.quality.metrics.degenerate_rate; 0 by construction for a gated
release, so the candidates' rejection rate is printed too), TF-IDF + LR accuracy on the real test split of the
documents and of the same rows' keyphrase sequences (privseed.tasks.evaluation.evaluation.documents_vs_seeds: what
`--llm none` would release from the same seeds), the same per class, worst first (where the documents lose),
output tokens, median words, and, given the flow's log (`privseed dpkps ... > RUN.log 2>&1`), the generation
stage's wall time (from the end of `sample-sequences` to the end of `generate-documents`) with its output
tokens/s and documents/min. Reads only the published release (and the public test split).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import re
from pathlib import Path

from privseed.tasks.data.corpus import read_corpus
from privseed.tasks.evaluation.evaluation import documents_and_seeds_predictions, recall_by_class
from privseed.tasks.data.release_reader import read_release
from privseed.tasks.evaluation.experiment import data_root
from privseed.tasks.quality.metrics import classification_scores, degenerate_rate, seed_term_coverage

_FINISHED = re.compile(r"^(\d\d:\d\d:\d\d\.\d+) \| INFO +\| "
                       r"Task run '([a-z-]+)-[0-9a-f]+' - Finished in state Completed")


def stage_seconds(log: str) -> dict[str, float]:
    """Seconds between consecutive finished tasks of a flow log, keyed by task name."""
    times = [(name, dt.datetime.strptime(t, "%H:%M:%S.%f")) for t, name in
             (m.groups() for m in map(_FINISHED.match, Path(log).read_text(errors="ignore").splitlines()) if m)]
    out = {}
    for (_, before), (name, after) in zip(times, times[1:]):
        out[name] = (after - before).total_seconds() % 86400
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("release")
    ap.add_argument("--log", help="the flow's output (for the generation stage's wall time)")
    ap.add_argument("--test", help="the real test split (default: "
                    "$PRIVSEED_DATA_ROOT/dbpedia14/test.parquet, docs/datasets.md)")
    args = ap.parse_args()
    args.test = args.test or str(data_root() / "dbpedia14" / "test.parquet")
    rows = read_release(args.release).rows
    quality = json.loads((Path(args.release) / "quality.json").read_text())
    gen = quality.get("generation", {})
    texts, seeds = rows["text"].astype(str).tolist(), [list(map(str, k)) for k in rows["keyphrases"]]
    test = read_corpus(args.test)
    docs_predicted, seeds_predicted = documents_and_seeds_predictions(rows, test)
    truth = test["label"].tolist()
    docs = classification_scores(truth, docs_predicted)["accuracy"]
    seeds_alone = classification_scores(truth, seeds_predicted)["accuracy"]
    rejected = sum(gen.get("rejected_candidates_by_reason", {}).values())
    tokens = int(rows["tokens_out"].sum())
    print(f"release {args.release}: model {rows['model'].iloc[0]}, prompt {rows['prompt_version'].iloc[0]}")
    print(f"  rows generated {gen.get('rows_generated')}, kept {gen.get('rows_kept')}, "
          f"dropped {gen.get('rows_dropped')} {gen.get('dropped_by_reason')}; "
          f"kept per class {gen.get('kept_per_class')}")
    print(f"  candidates {gen.get('candidates')}, rejected {rejected} "
          f"({rejected / max(gen.get('candidates', 1), 1):.1%}): {gen.get('rejected_candidates_by_reason')}; "
          f"regeneration calls {gen.get('regeneration_calls')}, "
          f"rows regenerated {gen.get('rows_regenerated')}")
    print(f"  kept rows: seed-term coverage {seed_term_coverage(texts, seeds):.1%}, "
          f"degenerate (document predicate) {degenerate_rate(texts, seeds):.1%}, "
          f"median words {rows['text'].str.split().str.len().median():.0f}, "
          f"finish {rows['finish_reason'].value_counts().to_dict()}")
    print(f"  TF-IDF + LR on {args.test}: documents {docs:.1%}, their keyphrase sequences alone {seeds_alone:.1%} "
          f"(gap {100 * (seeds_alone - docs):+.1f} points)")
    # Where the documents lose: per class, the share of its real test documents each classifier gets right.
    by_docs, by_seeds = recall_by_class(truth, docs_predicted), recall_by_class(truth, seeds_predicted)
    worst = sorted(by_docs, key=lambda c: by_docs[c] - by_seeds[c])
    print("  recall per class, documents / seeds, worst first: " + ", ".join(
        f"{c} {by_docs[c]:.0%}/{by_seeds[c]:.0%}" for c in worst))
    line = f"  output tokens {tokens:,} (all candidates)"
    if args.log:
        seconds = stage_seconds(args.log).get("generate-documents")
        if seconds:
            line += (f"; generation stage {seconds / 60:.1f} min: {tokens / seconds:.2f} output tokens/s, "
                     f"{60 * gen.get('candidates', len(rows)) / seconds:.2f} calls/min, "
                     f"{60 * len(rows) / seconds:.2f} kept documents/min")
    print(line)


if __name__ == "__main__":
    main()
