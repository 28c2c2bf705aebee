"""How good is `privseed dpkps --dry-run`'s time estimate for a local model? (issue 47)

    nice -n 10 python benchmarks/dry_run_estimate.py                  # the demo's settings, 1 seed per class
    nice -n 10 python benchmarks/dry_run_estimate.py --per-class 2 --llm local:qwen2.5-coder-0.5b
    nice -n 10 python benchmarks/dry_run_estimate.py --data $PRIVSEED_DATA_ROOT/ohsumed23/train.parquet \
        --classes 5 --per-class 2 --doc-type "medical abstract"   # another corpus at the CLI's defaults

The demo's configuration (flows/demo.py: the bundled DBpedia-14 demo corpus, its 14 classes, its prompt, few-shot
examples, steering and max_regenerations 3), or with ``--data`` another public labelled corpus at the CLI's
defaults (its first ``--classes`` labels, their names from its ``label_name`` column when it has one, ``--doc-type``),
is planned by the dry run (timed calls of a public seed, the call and token bound, the time estimate), then the same
number of seeds is generated for real, in this process with no cache, from seeds of the corpus's own words (the
corpus is public; no DP is needed to time the LLM). Prints the machine, the estimate and what the run took. A few
minutes on two cores.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import tempfile
import time

import pandas as pd

from privseed.flows.demo import demo_config
from privseed.tasks.config.commands import DpKpsConfig, validate_config
from privseed.tasks.data.corpus import read_corpus
from privseed.tasks.llm.local import default_threads
from privseed.tasks.stages.generation import documents_from_config, dry_run

WORD = re.compile(r"[a-z]{4,}")


def machine() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{platform.node()}: {cpu}, {os.cpu_count()} cores, load average {load}, llama.cpp threads "
            f"{default_threads()}, Python {platform.python_version()}")


def corpus_seeds(cfg: DpKpsConfig) -> pd.DataFrame:
    """per_class seeds of L distinct words (4+ letters) from the first documents of each class of the public
    corpus, in the shape a release has."""
    corpus = read_corpus(cfg.data)
    assert cfg.labels is not None
    rows = []
    for label in cfg.labels:
        texts = corpus.loc[corpus["label"].astype(str) == str(label), "text"].head(cfg.per_class)
        for text in texts:
            words = list(dict.fromkeys(WORD.findall(text.lower())))[:cfg.length]
            rows.append({"label": label, "keyphrases": words})
    sequences = pd.DataFrame(rows)
    sequences.attrs["released_vocabulary"] = sorted({w for r in rows for w in r["keyphrases"]})
    sequences.attrs["released_vocabulary_source"] = "benchmark: words of the public corpus"
    return sequences


def corpus_config(data: str, classes: int, doc_type: str, out: str, llm: str) -> dict:
    """A public labelled corpus at the CLI's defaults: its first ``classes`` labels, named from its ``label_name``
    column when it has one (written to a class-names file beside ``out``)."""
    corpus = read_corpus(data)
    labels = sorted(corpus["label"].unique().tolist())[:classes]
    values = {"data": data, "out": out, "labels": [str(label) for label in labels], "llm": llm, "doc_type": doc_type}
    if "label_name" in corpus.columns:
        names = corpus.groupby("label")["label_name"].first()
        path = out + ".class-names.json"
        with open(path, "w") as f:
            json.dump({str(label): str(names[label]) for label in labels}, f)
        values["class_names"] = path
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llm", default="local")
    parser.add_argument("--per-class", type=int, default=1)
    parser.add_argument("--data", default=None, help="another public labelled corpus (default: the demo's)")
    parser.add_argument("--classes", type=int, default=5, help="with --data: its first this many labels")
    parser.add_argument("--doc-type", default="document", help="with --data: the kind of document")
    parser.add_argument("--length", type=int, default=10, help="L: terms per seed (a dry run reads no corpus "
                        "profile, so it is given)")
    args = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out")
        base = (demo_config(out, args.llm) if args.data is None
                else corpus_config(args.data, args.classes, args.doc_type, out, args.llm))
        values = {**base, "per_class": args.per_class, "length": args.length, "dry_run": True, "n_workers": 1}
        cfg = validate_config(DpKpsConfig, values)
        start = time.perf_counter()
        plan = dry_run(cfg)
        dry_seconds = time.perf_counter() - start
        print(f"dry run ({dry_seconds:.1f} s, model load and calibration included):\n  {plan['estimate']}")
        print(plan["privacy_plan"])

        sequences = corpus_seeds(cfg)
        start = time.perf_counter()
        rows = documents_from_config(sequences, cfg.model_copy(update={"dry_run": False}))
        run_seconds = time.perf_counter() - start
    calls, tokens_out = int(rows["candidates"].sum()), int(rows["tokens_out"].sum())
    print(f"real run: {len(rows)} seeds, {calls} calls, {tokens_out:,} output tokens in {run_seconds:.1f} s "
          f"({tokens_out / run_seconds:.1f} tokens/s, model load included)")
    first, bound = plan["seconds_first_round"], plan["seconds_bound"]
    print(f"estimate vs run: first round ~{first:.0f} s, bound ~{bound:.0f} s, run {run_seconds:.0f} s "
          f"(run / first-round estimate {run_seconds / first:.2f}, run / bound {run_seconds / bound:.2f}); "
          f"calls {calls} <= bound {plan['calls_bound']}: {calls <= plan['calls_bound']}")
    # Where the ratio comes from: the calls the first round does not count (regenerations, rewrites) times how much
    # longer a real call took than the calibrated one (answer length, machine load, the model's load in the run).
    first_calls, per_call = plan["calls"], first / plan["calls"]
    print(f"  = calls {calls} / {first_calls} first-round ({calls / first_calls:.2f}) x seconds per call "
          f"{run_seconds / calls:.1f} / {per_call:.1f} calibrated ({run_seconds / calls / per_call:.2f}); answers "
          f"{tokens_out / calls:.0f} tokens on average; load average now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
