"""`privseed evaluate`: the data recipient trains on a synthetic release only and scores on its real test set.

`privseed evaluate --synthetic OUT --test PATH [--client PATH] [--coral] [--classifier mlp|finetune]`

    release --read--> rows (text, label)            test set --read--> texts (labels held back)
         |                                               |  (no-LLM release: both as phrase sequences of V)
         +------> embed --> train MLP / fine-tune / TF-IDF (+ CORAL against client texts) --> predict
                                                                                                |
                               test labels, read once, after all training --> scores --> report.html, JSON

The stages are in tasks/stages/evaluation.py, what they compute in tasks/evaluation.py.
"""

from __future__ import annotations

import argparse
from typing import Any

import tasks._runtime  # noqa: F401  (offline settings before prefect is imported)
from prefect import flow  # noqa: E402  (after tasks._runtime)

from tasks import classify
from tasks.errors import ConfigError
from tasks.evaluation import (EvalOptions, build_run_report, choose_client_texts, evaluation_result,
                              label_names_from, resolve_test_view)
from tasks.release_reader import release_vocabulary, written_without_llm
from tasks.stages.evaluation import (load_client_texts, load_release, load_test_set, phrase_view, score_corpus,
                                    write_evaluation)

EVALUATE_KEYS = ("synthetic", "test", "client", "coral", "classifier", "json_path", "report_path", "test_view",
                 "seed", "max_epochs", "device", "text_column", "label_column", "progress")


# The flow that deployments/prefect.yaml names (flows/evaluate.py:evaluate): typed, flat parameters.
@flow(name="evaluate", log_prints=True)
def evaluate(synthetic: str, test: str, client: str | None = None, coral: bool = False,
             classifier: str = "mlp", json_path: str | None = None, report_path: str | None = None,
             test_view: str = "auto", seed: int = 0, max_epochs: int = 60, device: str | None = None,
             text_column: str = "text", label_column: str = "label", progress: bool = True) -> dict[str, Any]:
    """Train on the release at `synthetic` only; report accuracy and macro-F1 on the real test set."""
    if coral and not client:
        raise ConfigError("--coral needs --client PATH (unlabelled client documents, disjoint from the test set)")
    opts = EvalOptions(classifier=classifier, coral=coral, test_view=test_view, device=device,
                       train=classify.TrainConfig(seed=seed, max_epochs=max_epochs, progress=progress))
    release = load_release(synthetic)
    test_set = load_test_set(test, text_column, label_column)
    view = resolve_test_view(test_view, written_without_llm(release.rows, release.manifest))
    test_texts = test_set["text"].astype(str).tolist()
    client_texts = None
    if client:
        client_texts = choose_client_texts(load_client_texts(client, text_column), test_texts, len(release.rows), seed)
    if view == "phrases":
        vocabulary = release_vocabulary(release.manifest)
        test_texts = phrase_view(test_texts, vocabulary)
        client_texts = phrase_view(client_texts, vocabulary) if client_texts else client_texts
    held_out = classify.HeldOutTestSet(test_texts, test_set["label"].tolist())
    scored = score_corpus(release.rows[["text", "label"]], held_out, client_texts=client_texts, opts=opts)
    result = evaluation_result(title=f"release {synthetic}", synthetic=synthetic, test=test, client=client,
                               test_view=view, rows=release.rows, test_texts=held_out.texts,
                               client_texts=client_texts, scored=scored, ledger=release.ledger, opts=opts)
    html = build_run_report(result, scored, release.rows, held_out.texts, label_names_from(test, label_column),
                            manifest=release.manifest, ledger=release.ledger, opts=opts)
    result["report"] = report_path or f"{synthetic.rstrip('/')}/report.html"
    write_evaluation(result, html, result["report"], json_path)
    for label, s in result["scores"].items():
        print(f"{label}: accuracy {100 * s['accuracy']:.1f}%  macro-F1 {100 * s['macro_f1']:.1f}%  (n_test={s['n_test']})")
    print(f"report: {result['report']}")
    return result


def evaluate_flow(config: dict[str, Any]) -> dict[str, Any]:
    """Run the `evaluate` flow from one JSON-able dict of its parameters (`release` is accepted for
    `synthetic`); unknown or missing settings are refused before anything runs."""
    values = dict(config)
    if "release" in values:
        values["synthetic"] = values.pop("release")
    unknown = sorted(set(values) - set(EVALUATE_KEYS))
    if unknown:
        raise ConfigError(f"unknown evaluate setting(s): {', '.join(unknown)}")
    missing = [k for k in ("synthetic", "test") if not values.get(k)]
    if missing:
        raise ConfigError(f"evaluate needs {' and '.join(missing)}")
    return evaluate(**values)


# ================================================================ CLI
def register_cli(subparsers: argparse._SubParsersAction) -> None:
    ev = subparsers.add_parser("evaluate", help="train on a synthetic release only; score on a real test set",
                               description=evaluate.__doc__)
    ev.add_argument("--synthetic", required=True, metavar="OUT", help="a release folder (read through manifest.json)")
    ev.add_argument("--test", required=True, metavar="PATH", help="the real labelled test set (Parquet)")
    ev.add_argument("--client", metavar="PATH", help="unlabelled client documents for Deep CORAL (disjoint from --test)")
    ev.add_argument("--coral", action="store_true", help="Deep CORAL domain adaptation against --client")
    ev.add_argument("--classifier", choices=["mlp", "finetune"], default="mlp",
                    help="mlp: 3-layer MLP over frozen MiniLM embeddings (CPU); finetune: MiniLM end to end (GPU)")
    ev.add_argument("--test-view", choices=["auto", "text", "phrases"], default="auto",
                    help="phrases: test documents become phrase sequences (no-LLM ablation; auto when --llm none)")
    ev.add_argument("--json", dest="json_path", metavar="FILE", help="write the scores and metrics as JSON")
    ev.add_argument("--report", dest="report_path", metavar="FILE", help="where report.html goes (default OUT/report.html)")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--epochs", dest="max_epochs", type=int, default=60, help="maximum epochs (early stopping)")
    ev.add_argument("--device", help="torch device (default: cuda when available, else cpu)")
    ev.add_argument("--text-column", default="text")
    ev.add_argument("--label-column", default="label")
    ev.set_defaults(func=_evaluate_from_cli)


def _evaluate_from_cli(args: argparse.Namespace) -> int:
    evaluate(synthetic=args.synthetic, test=args.test, client=args.client, coral=args.coral,
             classifier=args.classifier, json_path=args.json_path, report_path=args.report_path,
             test_view=args.test_view, seed=args.seed, max_epochs=args.max_epochs, device=args.device,
             text_column=args.text_column, label_column=args.label_column)
    return 0
