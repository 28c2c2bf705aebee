"""Prefect artifacts of a run: what the owner sees beside the flow run in the UI (Artifacts tab, and the run's
page). They hold only what the release itself publishes: its ledger (mechanism, epsilon and delta per release),
its row count and where it is; the evaluation's aggregate scores. Nothing here reads private data.

The tables are the report's (``privseed.tasks.evaluation.report.ledger_stage_rows``: one row per stage, partitions
collapsed,
epsilon as the ledger composes it) and :func:`score_rows`; the tasks only hand them to Prefect.
Artifact keys are stable per deployment kind (``release-ledger``, ``release-link``, ``evaluation-scores``,
``evaluation-report``), so the UI shows each key's history across scheduled runs. A description is Markdown shown
above its table: the scores' leads with the evaluation's warnings (:func:`score_description`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from privseed.tasks.dp.ledger import PrivacyLedger, plain_guarantee
from privseed.tasks.stages import public_stage


def score_rows(scores: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per classifier of an evaluation: accuracy and macro-F1 in percent, and the test set's size."""
    return [{"classifier": name, "accuracy %": round(100 * float(s["accuracy"]), 1),
             "macro-F1 %": round(100 * float(s["macro_f1"]), 1), "test documents": int(s["n_test"])}
            for name, s in scores.items()]


def score_description(result: Mapping[str, Any]) -> str:
    """The evaluation-scores artifact's text (Markdown, above its table in the UI), what to read first first: each
    warning of the evaluation (a degenerate classifier, no early stopping: ``classifier_warnings``), then what was
    trained and tested, the fidelity of the synthetic embeddings (precision / recall / density / coverage), the
    reference lines, the classes to distrust, how real and synthetic texts differ, and the guarantee in words."""
    lines = [f"**Warning:** {w['message']}" for w in result.get("warnings") or []]
    lines.append(f"Classifiers trained on the {result.get('n_train', '?')} documents of the synthetic release only, "
                 f"scored on {result.get('n_test', '?')} real test documents ({result.get('test_view', 'text')}).")
    fidelity = result.get("prdc")
    if fidelity:
        lines.append("Synthetic vs real test embeddings: " + ", ".join(
            f"{name} {float(fidelity[name]):.2f}" for name in ("precision", "recall", "density", "coverage")
            if name in fidelity) + ".")
    if result.get("references"):
        lines.append("To read the scores against: " + ", ".join(
            f"{r['reference']} {100 * float(r['accuracy']):.1f}%" for r in result["references"]) + ".")
    lines.extend(sentence for sentence in (result.get("distrust"), (result.get("distinguishability") or {})
                                           .get("sentence"), (result.get("lengths") or {}).get("sentence"))
                 if sentence)
    if result.get("privacy"):
        lines.append(f"Privacy spent by the release: {result['privacy']}.")
    if result.get("guarantee"):
        lines.append(str(result["guarantee"]))
    return "\n\n".join(lines)


def _link(uri: str) -> str:
    """A clickable address for a release: local folders as file:// URIs, object storage as it is."""
    return uri if "://" in uri else Path(uri).resolve().as_uri()


@public_stage("publish-artifacts")
def release_artifacts(manifest: Mapping[str, Any], ledger: PrivacyLedger, out: str) -> None:
    """The release's ledger summary (a table of the recipient's ledger.json) and a link to the release folder."""
    import json

    from prefect.artifacts import create_link_artifact, create_table_artifact

    from privseed.tasks.evaluation.report import ledger_stage_rows

    recipient = json.loads(ledger.to_json())
    total = recipient.get("total") or {}
    create_table_artifact(
        key="release-ledger", table=ledger_stage_rows(recipient),
        description=(f"Privacy ledger of release {manifest.get('release_id')} ({manifest.get('rows')} documents): "
                     f"total epsilon {_number(total.get('epsilon'))}, delta {_number(total.get('delta'))} "
                     f"({total.get('composition', 'composed')}), one row per stage. The full ledger is ledger.json "
                     f"in the release.\n\n{plain_guarantee({**total, 'stamp': recipient.get('stamp')})}"))
    create_link_artifact(key="release-link", link=_link(out), link_text=f"release {manifest.get('release_id')}",
                         description="The release folder to hand to the recipient (never its .private state).")


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


@public_stage("publish-score-artifacts")
def score_artifacts(result: Mapping[str, Any]) -> None:
    """The evaluation's scores (a table, its warnings and fidelity above it) and a link to its report."""
    from prefect.artifacts import create_link_artifact, create_table_artifact

    create_table_artifact(key="evaluation-scores", table=score_rows(result["scores"]),
                          description=score_description(result))
    create_link_artifact(key="evaluation-report", link=_link(result["report"]), link_text="report.html",
                         description="The evaluation's report: its warnings, the scores, the fidelity of the "
                                     "synthetic corpus, figures and the release's privacy ledger.")
