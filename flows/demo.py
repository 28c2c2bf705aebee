"""``privseed demo``: privseed's best seeds made into documents on the bundled DBpedia-14 sample, with every
embedded default, then the recipient's evaluation.

The seeds are ``--method histogram`` (per-class DP term histograms, each document counted whole, its first terms
weighed more, under Gaussian noise, total epsilon 11 and delta 7.2e-8, the method's defaults; docs/dpkps.md), the
strongest method without an LLM; the packaged local LLM (SmolLM2-135M, llama.cpp) writes one document from each
seed, told the public class name (the demo declares DBpedia-14's ontology class names, as an owner would) and the
document type. Local files, a LocalCluster, the offline MiniLM embedding model: nothing is downloaded. The demo
writes 6 documents per class (20 without an LLM) so the demo step finishes within ten minutes on two cores; the
figures in experiments/results/ come from the full commands, not from the demo.
"""

from __future__ import annotations

import time
from importlib import resources
from pathlib import Path

from privseed.tasks import storage
from privseed.tasks.config.commands import DemoConfig, DpKpsConfig, EvaluateConfig, evaluation_folder, validate_config
from privseed.tasks.generation.defaults import REPEAT_PENALTY_DEFAULT, STEER_DEFAULT

DEMO_TRAIN = "dbpedia14_demo_train.parquet"
DEMO_FEW_SHOT = "few_shot_wikipedia.jsonl"
DEMO_STEER = STEER_DEFAULT  # the CLI default, chosen on public seeds (docs/generation.md "Seed steering")
DEMO_TEST = "dbpedia14_demo_test.parquet"
#: The demo's declared label set (0-13, one per line): like every run, the demo never reads labels from the data.
DEMO_LABELS = "dbpedia14_labels.txt"
#: The public names of those classes (DBpedia-14's ontology classes): each prompt names its class.
DEMO_CLASS_NAMES = "dbpedia14_class_names.toml"
#: The demo's seed method and its total epsilon (one budget for the term histograms).
DEMO_METHOD = "histogram"
DEMO_EPSILON = 11.0


def demo_corpus_path(name: str = DEMO_TRAIN) -> str:
    return str(resources.files("privseed.tasks") / "demo_data" / name)


def demo_config(out: str, llm: str) -> dict:
    return {
        "data": demo_corpus_path(),
        "out": out,
        "labels_file": demo_corpus_path(DEMO_LABELS),
        "class_names": demo_corpus_path(DEMO_CLASS_NAMES),
        "method": DEMO_METHOD,
        "epsilon": DEMO_EPSILON,
        "llm": llm,
        "doc_type": "Wikipedia article",
        "per_class": 6 if llm != "none" else 20,
        "seed": 0,
        # The embedded 135M model needs help to write documents from its seeds (docs/generation.md): a prompt
        # that demands every term and names the class, two short example articles written for the demo (public,
        # not from the data; they fix the format; their subjects, a festival and a dish, are none of the corpus's
        # classes, because an example album made the Artist documents write about albums), seed steering and no
        # repeated 4-grams and a repeat penalty while it decodes (without the penalty one document in five circled
        # back to its own words), a lower temperature, answers of an abstract's length (128 tokens: longer ones
        # drift off their seeds; measured in experiments/results/generation.md), and regeneration of answers that
        # are not documents.
        "prompt_template": "coverage",
        "few_shot": demo_corpus_path(DEMO_FEW_SHOT),
        "temperature": 0.4,
        "best_of": 1,
        "max_tokens": 128,
        "steer": DEMO_STEER,
        "no_repeat_ngram": 4,
        "repeat_penalty": REPEAT_PENALTY_DEFAULT,
        "max_regenerations": 3,
    }


def run_from_cli(demo: DemoConfig) -> int:
    return run_demo(demo)


def run_demo(demo: DemoConfig) -> int:
    """The demo's seeds and documents from the bundled corpus, then the recipient's evaluation of the release."""
    from privseed.flows.dpkps import dpkps_flow

    out = str(Path(demo.out).resolve()) if "://" not in demo.out else demo.out
    cfg = validate_config(DpKpsConfig, demo_config(out, demo.llm))
    print(f"privseed demo: {cfg.method} seeds from {cfg.data} (7,000 documents, 14 classes), LLM: {cfg.llm}")
    started = time.perf_counter()
    manifest = dpkps_flow(cfg)
    # The data recipient's side: train on the synthetic corpus only, score on the bundled real test split.
    from privseed.flows.evaluate import evaluate

    # The evaluation (a per-document t-SNE of the test split included) goes beside the release, not into it. The
    # demo plays the owner too, who holds real documents: the report's reference line for them is the bundled
    # corpus itself (the recipient of a real release has none).
    evaluated = evaluation_folder(out)
    evaluation = evaluate(validate_config(EvaluateConfig, {
        "synthetic": out, "test": demo_corpus_path(DEMO_TEST), "real_train": demo_corpus_path(DEMO_TRAIN),
        "json_path": storage.join(evaluated, "evaluation.json"),
        "report_path": storage.join(evaluated, "report.html")}))
    elapsed = time.perf_counter() - started
    privacy = manifest["privacy"]
    guarantee = f"epsilon = {privacy['epsilon']:g}"
    if privacy.get("delta"):
        guarantee += f", delta = {privacy['delta']:.2g}"
    print(f"\nDone in {elapsed:.0f} s: {manifest['rows']} synthetic documents, {guarantee} ({cfg.method} seeds)")
    print(f"  synthetic corpus: {storage.join(out, 'synthetic')}")
    print(f"  privacy ledger:   {storage.join(out, 'ledger.json')}")
    print(f"  manifest:         {storage.join(out, 'manifest.json')}")
    print(f"  private state:    {cfg.state_uri}  (the owner's: identity key, drawn values, LLM cache; never share it)")
    print(f"  evaluation:       {storage.join(evaluated, 'evaluation.json')}  {_headline(evaluation)}")
    if cfg.llm != "none":
        from privseed.tasks.data.corpus import read_corpus
        from privseed.tasks.evaluation.evaluation import documents_vs_seeds
        from privseed.tasks.data.release_reader import read_release

        docs, seeds = documents_vs_seeds(read_release(out).rows, read_corpus(demo_corpus_path(DEMO_TEST)))
        print(f"  TF-IDF + LR on the real test split: the documents {100 * docs:.1f}%, their DP seeds alone "
              f"(the keyphrase sequences, no LLM) {100 * seeds:.1f}%")
    report = storage.join(evaluated, "report.html")
    if storage.exists(report):
        print(f"  report:           {report}")
    return 0


def _headline(evaluation: dict) -> str:
    """Accuracy of each classifier trained on the synthetic corpus, on the real test split."""
    return ", ".join(f"{name}: accuracy {100 * s['accuracy']:.1f}%" for name, s in evaluation["scores"].items())
