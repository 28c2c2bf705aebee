"""Prefect artifacts of a run: what the owner sees beside the flow run in the UI (Artifacts tab, and the run's
page). They hold only what the release itself publishes: its ledger (mechanism, epsilon and delta per release),
its row count and where it is; the evaluation's aggregate scores. Nothing here reads private data.

The pure part (:func:`ledger_summary`, :func:`score_rows`) builds the tables; the tasks only hand them to Prefect.
Artifact keys are stable per deployment kind (``release-ledger``, ``release-link``, ``evaluation-scores``), so the
UI shows each key's history across scheduled runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pathlib import Path

from privseed.tasks.ledger import PrivacyLedger
from privseed.tasks.stages import public_stage


def ledger_summary(entries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per stage of the recipient ledger: the partitions of a stage (one release per class, say) are
    collapsed into one row that says how many there are. A stage's partitions are disjoint slices of the data, so
    its epsilon is the largest of theirs (parallel composition), not their sum; the ledger's own total is the
    authority and is shown beside this table."""
    stages: dict[str, dict[str, Any]] = {}
    for entry in entries:
        stage = str(entry.get("stage") or entry.get("name"))
        row = stages.setdefault(stage, {"stage": stage, "mechanism": entry.get("mechanism"), "releases": 0,
                                        "epsilon": 0.0, "delta": 0.0})
        row["releases"] += 1
        row["epsilon"] = max(row["epsilon"], float(entry.get("epsilon") or 0.0))
        row["delta"] = max(row["delta"], float(entry.get("delta") or 0.0))
        if row["mechanism"] != entry.get("mechanism"):
            row["mechanism"] = "mixed"
    return list(stages.values())


def score_rows(scores: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per classifier of an evaluation: accuracy and macro-F1 in percent, and the test set's size."""
    return [{"classifier": name, "accuracy %": round(100 * float(s["accuracy"]), 1),
             "macro-F1 %": round(100 * float(s["macro_f1"]), 1), "test documents": int(s["n_test"])}
            for name, s in scores.items()]


def _link(uri: str) -> str:
    """A clickable address for a release: local folders as file:// URIs, object storage as it is."""
    return uri if "://" in uri else Path(uri).resolve().as_uri()


@public_stage("publish-artifacts")
def release_artifacts(manifest: Mapping[str, Any], ledger: PrivacyLedger, out: str) -> None:
    """The release's ledger summary (a table of the recipient's ledger.json) and a link to the release folder."""
    import json

    from prefect.artifacts import create_link_artifact, create_table_artifact

    recipient = json.loads(ledger.to_json())
    total = recipient.get("total") or {}
    create_table_artifact(
        key="release-ledger", table=ledger_summary(recipient.get("entries", [])),
        description=(f"Privacy ledger of release {manifest.get('release_id')}: total epsilon "
                     f"{total.get('epsilon')}, delta {total.get('delta')} ({total.get('composition', 'composed')}); "
                     f"{manifest.get('rows')} documents. The full ledger is ledger.json in the release."))
    create_link_artifact(key="release-link", link=_link(out), link_text=f"release {manifest.get('release_id')}",
                         description="The release folder to hand to the recipient (never its .private state).")


@public_stage("publish-score-artifacts")
def score_artifacts(scores: Mapping[str, Mapping[str, Any]], report: str) -> None:
    """The evaluation's scores (a table) and a link to its report."""
    from prefect.artifacts import create_link_artifact, create_table_artifact

    create_table_artifact(key="evaluation-scores", table=score_rows(scores),
                          description="Classifiers trained on the synthetic release only, scored on the real test set.")
    create_link_artifact(key="evaluation-report", link=_link(report), link_text="report.html")
