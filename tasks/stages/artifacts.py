"""Prefect artifacts of a run: what the owner sees beside the flow run in the UI (Artifacts tab, and the run's
page). They hold only what the release itself publishes: its ledger (mechanism, epsilon and delta per release),
its row count and where it is; the evaluation's aggregate scores. Nothing here reads private data.

The tables are the report's (``privseed.tasks.evaluation.report.ledger_stage_rows``: one row per stage, partitions
collapsed, epsilon as the ledger composes it) and :func:`score_rows`; the tasks only hand them to Prefect.
Artifact keys are stable per deployment kind (``release-ledger``, ``release-link``, ``evaluation-scores``,
``evaluation-report``; ``approval-request`` and ``approval-sample`` of a run that waits for approval), so the UI
shows each key's history across scheduled runs. A description is Markdown shown above its table: the scores' leads
with the evaluation's warnings (:func:`score_description`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

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


#: Characters of a sample row's text shown in the approval-sample table (the whole text is in the candidate).
SAMPLE_TEXT_CHARS = 400


def sample_table(sample: pd.DataFrame) -> list[dict[str, Any]]:
    """The approval-sample table: one row per sampled document, its text (shortened), label and keyphrases."""
    def shortened(text: Any) -> str:
        text = str(text)
        return text if len(text) <= SAMPLE_TEXT_CHARS else text[:SAMPLE_TEXT_CHARS - 1] + "\u2026"

    return [{"text": shortened(row.text), "label": str(row.label), "keyphrases": "; ".join(map(str, row.keyphrases))}
            for row in sample.itertuples(index=False)]


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """Rows of equal keys as a Markdown table (numbers as %g)."""
    if not rows:
        return ""
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_number(row.get(name)) for name in header) + " |" for row in rows]
    return "\n".join(lines)


def approval_request(rows_per_label: Mapping[str, int], recipient_ledger: Mapping[str, Any],
                     gate: Mapping[str, Any] | None, generation_report: Mapping[str, Any] | None, out: str,
                     timeout_s: float) -> str:
    """The approval-request artifact (Markdown): what is waiting, what answering does, the report (the gate's
    verdict, the generation's counts), the ledger one row per stage and the guarantee in words."""
    from privseed.tasks.evaluation.report import ledger_stage_rows

    total = recipient_ledger.get("total") or {}
    guarantee = plain_guarantee({**total, "stamp": recipient_ledger.get("stamp")})
    documents = sum(rows_per_label.values())
    wait = f"{timeout_s / 3600:g} h" if timeout_s >= 3600 else f"{timeout_s:g} s"
    lines = [f"## A release waits for approval: {documents} documents for `{out}`",
             "Nothing is published until someone answers. **Resume** this run and check **approve** to publish it; "
             f"leave it unchecked (or give no answer within {wait}) and the candidate stays in the owner's private "
             "state (`quarantine/`), never under the release folder.",
             "Documents per label: " + ", ".join(f"{label}: {count}" for label, count in rows_per_label.items()) + ".",
             f"### Privacy\nTotal epsilon {_number(total.get('epsilon'))}, delta {_number(total.get('delta'))} "
             f"({total.get('composition', 'composed')}). {guarantee}",
             markdown_table(ledger_stage_rows(recipient_ledger))]
    if gate is None:
        lines.append("### Release gate\noff (`--no-gate`): the candidate was not checked.")
    else:
        expectations = gate.get("expectations") or []
        failed = [e.get("name", "?") for e in expectations if not e.get("success", True)]
        lines.append(f"### Release gate\npassed: {len(expectations) - len(failed)} of {len(expectations)} "
                     "expectations met." if not failed else f"### Release gate\nfailed: {', '.join(failed)}.")
    if generation_report:
        counts = {k: v for k, v in generation_report.items() if isinstance(v, (int, float, str))}
        if counts:
            lines.append("### Generation\n" + "\n".join(f"- {name}: {_number(v)}" for name, v in counts.items()))
    lines.append("Twenty rows of the candidate are the `approval-sample` artifact.")
    return "\n\n".join(lines)


def approval_artifacts(rows_per_label: Mapping[str, int], ledger: PrivacyLedger, gate: Mapping[str, Any] | None,
                       generation_report: Mapping[str, Any] | None, sample: pd.DataFrame, out: str,
                       timeout_s: float) -> None:
    """The approver's view of a paused run: ``approval-request`` (Markdown: the report, the ledger, the guarantee)
    and ``approval-sample`` (a table of sample rows: text, label, keyphrases). DP outputs only."""
    import json

    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    recipient = json.loads(ledger.to_json())
    create_markdown_artifact(key="approval-request", markdown=approval_request(
        rows_per_label, recipient, gate, generation_report, out, timeout_s),
        description="The candidate release waiting for approval: its report and privacy ledger.")
    create_table_artifact(key="approval-sample", table=sample_table(sample),
                          description=f"{len(sample)} rows of the candidate release (text, label, keyphrases).")
