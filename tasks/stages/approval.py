"""A release that waits for a person (``--require-approval``, issue 47).

After the release gate passes and before anything is published, the run shows the candidate as Prefect artifacts
(the gate's report, the ledger with its guarantee in words, twenty sample rows: DP outputs, safe to show) and
pauses with Prefect's pause-with-input. The UI's Resume form asks for :class:`ReleaseApproval`; approving
publishes as usual; rejecting, resuming without an answer or no answer within ``--approval-timeout`` seconds
(24 h by default) puts the candidate where a refused candidate goes (``STATE/quarantine/<release id>/``, the owner's
private state, never under OUT) and fails the run with one line saying why and how to ask again: the same command
with ``--run-id`` of this run re-reads its drawn values and the LLM's cached answers, so it charges nothing again
and puts the same candidate to a person (a later answer to the expired pause is refused by the Prefect server).

The three release commands (``privseed dpkps``, ``augpe``, ``secpe``) wait here between generation and
``publish``, with their Dask cluster closed.

A person can only answer on a Prefect server they can reach: without ``PREFECT_API_URL`` (an ephemeral API that
lives and dies with the run) the option is refused before anything starts
(``privseed.tasks.config.preflight.check_approval_server``, which the flow repeats).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
from prefect import get_client
from prefect.context import FlowRunContext
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from prefect.states import Running
from pydantic import Field

from privseed.tasks import jsonable, storage
from privseed.tasks.config.commands import ReleaseConfig
from privseed.tasks.data.corpus import SYNTHETIC_DIR, StagedRelease, new_release_id, quarantine_uri, read_columns
from privseed.tasks.dp.ledger import PrivacyLedger, public_rng
from privseed.tasks.errors import GateFailedError
from privseed.tasks.stages import public_stage, stage_logger
from privseed.tasks.stages.artifacts import approval_artifacts
from privseed.tasks.stages.release import gate_from_config

#: How often the paused run asks the Prefect API whether it was resumed.
APPROVAL_POLL_S = 5
#: Sample rows the approver sees (text, label, keyphrases only).
SAMPLE_ROWS = 20
#: The pause's key: one approval per run.
PAUSE_KEY = "release-approval"
#: The columns of the sample: the DP outputs, nothing of the generation's bookkeeping.
SAMPLE_COLUMNS = ["text", "label", "keyphrases"]


class ReleaseApproval(RunInput):
    """The answer the Prefect UI's Resume form asks for. Resuming without one is a rejection."""

    approve: bool = Field(default=False, description="publish this candidate release under OUT")
    comment: str = Field(default="", max_length=2000, description="why, for the run's log (never published)")


def candidate_rows(synthetic: pd.DataFrame | StagedRelease, storage_options: Mapping[str, Any] | None,
                   *, enough: int) -> pd.DataFrame:
    """At least ``enough`` rows of the candidate (all when it has fewer), text, label and keyphrases only: the
    frame's, or those of the fewest staged parts that hold them (from the first, in the parts' order)."""
    if isinstance(synthetic, pd.DataFrame):
        return synthetic[SAMPLE_COLUMNS]
    frames, rows = [], 0
    for part in synthetic.parts:
        if rows >= enough:
            break
        frames.append(read_columns(storage.join(synthetic.out, part.path), SAMPLE_COLUMNS, storage_options))
        rows += len(frames[-1])
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=SAMPLE_COLUMNS)


def sample_rows(candidate: pd.DataFrame, seed: int, rows: int = SAMPLE_ROWS) -> pd.DataFrame:
    """``rows`` rows of the candidate drawn with public randomness (``--seed``), in the candidate's order."""
    if len(candidate) <= rows:
        return candidate.reset_index(drop=True)
    picked = public_rng(seed, "approval-sample").choice(len(candidate), size=rows, replace=False)
    return candidate.iloc[sorted(picked)].reset_index(drop=True)


def rows_per_label(synthetic: pd.DataFrame | StagedRelease) -> dict[str, int]:
    """The candidate's documents per label (synthetic counts, from the configuration: public)."""
    if isinstance(synthetic, pd.DataFrame):
        return {str(k): int(v) for k, v in synthetic["label"].astype(str).value_counts().sort_index().items()}
    counts: dict[str, int] = {}
    for part in synthetic.parts:
        for label, count in part.rows_per_label.items():
            counts[label] = counts.get(label, 0) + count
    return dict(sorted(counts.items()))


def gate_verdict(cfg: ReleaseConfig, synthetic: pd.DataFrame | StagedRelease, labels: Sequence[Any]) -> dict | None:
    """The release gate's result, as ``publish_release`` will compute it (None with ``--no-gate``)."""

    gate = gate_from_config(cfg, labels)
    if gate is None:
        return None
    if isinstance(synthetic, StagedRelease):
        checks = [part.check for part in synthetic.parts]
        if synthetic.gate is None or any(check is None for check in checks):
            return None  # publish_release refuses such parts itself, with its own message
        return synthetic.gate.combine([check for check in checks if check is not None])
    return gate(synthetic)


def quarantine_candidate(synthetic: pd.DataFrame | StagedRelease, ledger: PrivacyLedger,
                         documents: Mapping[str, Any], storage_options: Mapping[str, Any] | None) -> str:
    """Put a candidate nobody approved where a refused candidate goes (``STATE/quarantine/<release id>/``): a
    frame as one part, staged parts moved out of OUT (or out of the private staging folder); beside them the
    recipient's ledger and ``documents`` (name -> JSON value). Returns the folder."""
    release_id = synthetic.release_id if isinstance(synthetic, StagedRelease) else new_release_id()
    folder = quarantine_uri(ledger.state_uri, release_id)
    if isinstance(synthetic, StagedRelease):
        for part in synthetic.parts:
            source, target = storage.join(synthetic.out, part.path), storage.join(folder, part.path)
            if storage.exists(source, storage_options):
                storage.move(source, target, storage_options)
    else:
        storage.write_bytes(storage.join(folder, SYNTHETIC_DIR, "part-00000.parquet"),
                            synthetic.to_parquet(index=False), storage_options)
    storage.write_bytes(storage.join(folder, "ledger.json"), ledger.to_json().encode(), storage_options)
    for name, value in documents.items():
        storage.write_bytes(storage.join(folder, name), (jsonable.dumps(value, indent=2) + "\n").encode(),
                            storage_options)
    return folder


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:g} h" if seconds >= 3600 else f"{seconds:g} s"


def ask_again(run_id: str) -> str:
    """How the owner puts the same candidate to a person again, charging nothing (the words of the refusal)."""
    return (f"to ask again, rerun the same command with --run-id {run_id} (a deployment: run_id in its config): its "
            "drawn values and the LLM's answers are re-read, nothing is charged again")


def end_expired_pause() -> None:
    """After a pause that timed out the Prefect server turns any next state of the run into its own "The flow was
    paused and never resumed."; set the run Running again (forced), so that it fails, as a rejected run does, with
    the line that says what happened and how to ask again."""
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(context.flow_run.id, Running(message="no answer to the approval"), force=True)


@public_stage("await-approval")
def await_approval(cfg: ReleaseConfig, synthetic: pd.DataFrame | StagedRelease, ledger: PrivacyLedger,
                   labels: list, generation_report: dict | None = None) -> None:
    """Show the candidate (artifacts), pause the run until a person answers in the Prefect UI, and return when they
    approve. A candidate that ``publish`` will refuse anyway (a failing gate, reproducible noise without
    ``--allow-insecure-release``) is not put to anyone: publish refuses it as usual. A rejection, a resume without
    an answer or no answer within ``cfg.approval_timeout`` seconds quarantines the candidate and raises
    GateFailedError, whose message says how to ask again (:func:`ask_again`)."""
    log = stage_logger()
    timeout_s = cfg.approval_timeout
    verdict = gate_verdict(cfg, synthetic, labels)
    if verdict is not None and not verdict.get("success", False):
        log.info("the release gate refuses the candidate; nobody is asked to approve it")
        return
    if not ledger.noise_report()["secure"] and not cfg.allow_insecure_release:
        return
    sample = sample_rows(candidate_rows(synthetic, cfg.storage_options, enough=5 * SAMPLE_ROWS), cfg.seed)
    approval_artifacts(rows_per_label(synthetic), ledger, verdict, generation_report, sample, cfg.out, timeout_s)
    form = ReleaseApproval.with_initial_data(
        description=f"Publish this candidate release under `{cfg.out}`? Its report, ledger and {len(sample)} sample "
                    "rows are this run's artifacts (`approval-request`, `approval-sample`). Check **approve** to "
                    f"publish; otherwise (or with no answer within {_hours(timeout_s)}) it stays in the private "
                    "state, never under OUT.",
        approve=False, comment="")
    answer: ReleaseApproval | None
    try:
        answer = pause_flow_run(wait_for_input=form, timeout=timeout_s, poll_interval=APPROVAL_POLL_S, key=PAUSE_KEY)
    except FlowPauseTimeout:
        answer = None
        end_expired_pause()
    if answer is not None and answer.approve:
        log.info("release approved in the Prefect UI%s", f": {answer.comment}" if answer.comment else "")
        return
    reason = (f"no answer within {_hours(timeout_s)}" if answer is None
              else "rejected in the Prefect UI" + (f" ({answer.comment})" if answer.comment else ""))
    decision = {"approved": False, "reason": reason, "comment": answer.comment if answer is not None else None}
    documents: dict[str, Any] = {"approval.json": decision}
    if verdict is not None:
        documents["quality.json"] = {**verdict, **({"generation": generation_report} if generation_report else {})}
    folder = quarantine_candidate(synthetic, ledger, documents, cfg.storage_options)
    raise GateFailedError(f"release not approved: {reason}; nothing was published; candidate kept in the private "
                          f"state at {folder}; {ask_again(ledger.run_id)}", result=verdict, quarantine=folder)
