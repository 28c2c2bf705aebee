"""A release that waits for a person (--require-approval, issue 47): the run pauses after the gate with the
candidate as Prefect artifacts, publishes when resumed with approve=true, and otherwise leaves nothing under OUT."""

from __future__ import annotations

import contextvars
import os
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from prefect.exceptions import FlowPauseTimeout
from prefect.settings import PREFECT_API_URL, temporary_settings

from privseed.tasks.config.commands import AugPeConfig, DpKpsConfig, SecPeConfig, validate_config
from privseed.tasks.config.preflight import check_approval_server
from privseed.tasks.dp.ledger import PrivacyLedger
from privseed.tasks.errors import ConfigError, GateFailedError
from privseed.tasks.stages import approval
from privseed.tasks.stages.artifacts import approval_request, sample_table

LABELS = ["0", "1", "2"]


def candidate(rows_per_class: int = 10) -> pd.DataFrame:
    rows = [{"text": f"club league goals {label} {i}", "label": label, "keyphrases": ["club", f"league {i}"],
             "seed": i} for label in LABELS for i in range(rows_per_class)]
    return pd.DataFrame(rows)


def config(tmp_path: Path, **values: Any) -> DpKpsConfig:
    corpus = tmp_path / "corpus.parquet"
    if not corpus.exists():
        pd.DataFrame({"text": ["a b c"], "label": ["0"]}).to_parquet(corpus)
    return DpKpsConfig(data=str(corpus), out=str(tmp_path / "out"), labels=LABELS, llm="none", gate=False, **values)


def test_the_option_is_refused_without_a_prefect_server(tmp_path):
    cfg = config(tmp_path, require_approval=True)
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        with pytest.raises(ConfigError, match="--require-approval needs a Prefect server.*PREFECT_API_URL"):
            check_approval_server(cfg)
        check_approval_server(config(tmp_path))  # without the option: nothing to refuse
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:4200/api"}):
        check_approval_server(cfg)


@pytest.mark.parametrize("model, required", [
    (DpKpsConfig, {}), (AugPeConfig, {}), (SecPeConfig, {"public": "p.parquet", "noise_multiplier": 3.0})])
def test_every_release_command_takes_the_approval_and_its_timeout(model, required):
    values = {"data": "d.parquet", "out": "o", "labels": LABELS, **required}
    assert validate_config(model, {**values, "require_approval": True}).approval_timeout == 24 * 3600
    assert validate_config(model, {**values, "require_approval": True, "approval_timeout": 600}).approval_timeout == 600
    with pytest.raises(ConfigError, match="--approval-timeout applies to a run that waits for a person only"):
        validate_config(model, {**values, "approval_timeout": 600})
    with pytest.raises(ConfigError, match="--approval-timeout"):
        validate_config(model, {**values, "require_approval": True, "approval_timeout": 5})


def test_the_command_line_refuses_it_in_one_line_before_prefect_starts(tmp_path, capsys, monkeypatch):
    from privseed.flows.cli import main
    from privseed.tasks import _runtime

    def no_server():
        raise AssertionError("a temporary Prefect server was started for a refused run")

    monkeypatch.setattr(_runtime, "temporary_prefect_server", no_server)

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    cfg = config(tmp_path)
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        code = main(["dpkps", cfg.data, "--out", cfg.out, "--labels", "0,1,2", "--llm", "none", "--require-approval"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "PREFECT_API_URL" in err, err
    assert not os.path.exists(cfg.out) and not os.path.exists(f"{cfg.out}.private")


def test_the_sample_is_twenty_rows_of_text_label_and_keyphrases_drawn_from_the_seed():
    frame = candidate()
    rows = approval.candidate_rows(frame, None, enough=100)
    sample = approval.sample_rows(rows, seed=3)
    assert list(sample.columns) == ["text", "label", "keyphrases"] and len(sample) == approval.SAMPLE_ROWS
    assert sample.equals(approval.sample_rows(rows, seed=3))
    assert not sample.equals(approval.sample_rows(rows, seed=4))
    assert set(sample["text"]) <= set(frame["text"])
    table = sample_table(sample)
    assert set(table[0]) == {"text", "label", "keyphrases"} and table[0]["keyphrases"].startswith("club; league")
    assert len(approval.sample_rows(rows.head(5), seed=3)) == 5  # a smaller candidate is shown whole


def test_the_request_shows_the_ledger_the_guarantee_and_the_gate():
    recipient = {"entries": [{"name": "vocabulary", "stage": "vocabulary", "mechanism": "laplace", "epsilon": 1.0,
                              "delta": 0.0}],
                 "total": {"epsilon": 1.0, "delta": 0.0, "secure": True,
                           "guarantee": {"kind": "(epsilon, delta)-DP"}}}
    text = approval_request({"0": 4, "1": 4}, recipient, {"success": True, "expectations": [{"name": "a",
                            "success": True}]}, {"rows_kept": 8}, "runs/x", 24 * 3600)
    assert "8 documents for `runs/x`" in text and "within 24 h" in text
    assert "| vocabulary |" in text and "changes the probability of any output" in text
    assert "passed: 1 of 1 expectations met" in text and "rows_kept: 8" in text


@pytest.mark.parametrize("answer", ["timeout", "reject", "no answer"])
def test_a_candidate_nobody_approves_goes_to_quarantine_and_nothing_under_out(tmp_path, monkeypatch, answer):
    cfg = config(tmp_path, require_approval=True, approval_timeout=600)
    ledger = PrivacyLedger(cfg.state_uri, "id-of-the-corpus", "run1")
    shown: list[Any] = []
    monkeypatch.setattr(approval, "approval_artifacts", lambda *args: shown.append(args))

    def pause(wait_for_input, timeout, poll_interval, key):
        assert timeout == 600 and key == approval.PAUSE_KEY
        if answer == "timeout":
            raise FlowPauseTimeout("Flow run was paused and never resumed.")
        return wait_for_input(approve=False, comment="too few classes") if answer == "reject" else wait_for_input()

    monkeypatch.setattr(approval, "pause_flow_run", pause)
    with pytest.raises(GateFailedError, match="release not approved") as refused:
        approval.await_approval.fn(cfg, candidate(), ledger, LABELS)
    assert shown and len(shown[0][4]) == approval.SAMPLE_ROWS
    message = str(refused.value)
    assert {"timeout": "no answer within 600 s", "reject": "rejected in the Prefect UI (too few classes)",
            "no answer": "rejected in the Prefect UI;"}[answer] in message
    assert message.endswith("rerun the same command with --run-id run1 (a deployment: run_id in its config): its "
                            "drawn values and the LLM's answers are re-read, nothing is charged again")
    assert not os.path.exists(cfg.out)
    folder = Path(refused.value.quarantine)
    assert folder.parent == Path(cfg.state_uri) / "quarantine"
    assert (folder / "synthetic" / "part-00000.parquet").exists() and (folder / "ledger.json").exists()
    assert pd.read_parquet(folder / "synthetic" / "part-00000.parquet")["text"].tolist() == candidate()["text"].tolist()


def test_a_rejected_candidate_written_in_parts_leaves_the_release_folder(tmp_path, monkeypatch):
    """With an LLM the generation shards write the parts under OUT before the gate: a rejection moves them out."""
    from privseed.tasks.data.corpus import StagedRelease, write_part

    cfg = config(tmp_path, require_approval=True)
    ledger = PrivacyLedger(cfg.state_uri, "id-of-the-corpus", "run1")
    frame = candidate()
    parts = tuple(write_part(cfg.out, "abc123", index, frame.iloc[index * 15:(index + 1) * 15]) for index in range(2))
    staged = StagedRelease(out=cfg.out, release_id="abc123", parts=parts, gate=None)
    shown: list[Any] = []
    monkeypatch.setattr(approval, "approval_artifacts", lambda *args: shown.append(args))
    monkeypatch.setattr(approval, "pause_flow_run", lambda wait_for_input, **_: wait_for_input(approve=False))
    with pytest.raises(GateFailedError) as refused:
        approval.await_approval.fn(cfg, staged, ledger, LABELS)
    assert shown[0][0] == {"0": 10, "1": 10, "2": 10} and len(shown[0][4]) == approval.SAMPLE_ROWS
    assert not any(path.is_file() for path in Path(cfg.out).rglob("*"))
    folder = Path(refused.value.quarantine)
    assert folder == Path(cfg.state_uri) / "quarantine" / "abc123"
    assert sorted(p.name for p in (folder / "synthetic").iterdir()) == sorted(Path(p.path).name for p in parts)


def test_an_approved_candidate_returns_to_be_published(tmp_path, monkeypatch):
    cfg = config(tmp_path, require_approval=True)
    ledger = PrivacyLedger(cfg.state_uri, "id-of-the-corpus", "run1")
    monkeypatch.setattr(approval, "approval_artifacts", lambda *args: None)
    monkeypatch.setattr(approval, "pause_flow_run", lambda wait_for_input, **_: wait_for_input(approve=True))
    approval.await_approval.fn(cfg, candidate(), ledger, LABELS)
    assert not os.path.exists(cfg.out) and not (Path(cfg.state_uri) / "quarantine").exists()


# ---------------------------------------------------------------------------------------------------------
# The round trip through a real Prefect API
# ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("approval")
    rows = [(t, label) for label, texts in {
        "0": ["football club player scored goals league season", "striker signed contract club league"],
        "1": ["river valley mountain lake forest village", "mountain peak glacier valley river"],
        "2": ["album band song released records guitar", "singer recorded album single records"],
    }.items() for t in texts for _ in range(4)]
    path = tmp / "corpus.parquet"
    pd.DataFrame(rows, columns=["text", "label"]).to_parquet(path)
    return path


class FlowInThread:
    """A flow (``dpkps_flow`` unless told) in a thread of this process (its Prefect settings copied in), so the test
    can resume it."""

    def __init__(self, name: str, cfg: dict[str, Any], flow_fn: Any = None) -> None:
        from privseed.flows.dpkps import dpkps_flow

        self.name, self.result, self.error = name, None, None
        flow = (flow_fn or dpkps_flow).with_options(flow_run_name=name)
        context = contextvars.copy_context()

        def run() -> None:
            try:
                self.result = context.run(flow, cfg)
            except BaseException as exc:  # noqa: BLE001  (the test reads it)
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def flow_run(self) -> Any:
        from prefect import get_client
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[self.name])))
        return runs[0] if runs else None

    def paused_run_id(self, within_s: float = 300) -> Any:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            assert self.thread.is_alive(), f"the run ended without pausing: {self.error!r}"
            run = self.flow_run()
            if run is not None and run.state is not None and run.state.is_paused():
                return run.id
            time.sleep(1)
        raise AssertionError(f"run {self.name} did not pause within {within_s} s")

    def join(self, within_s: float = 120) -> None:
        self.thread.join(within_s)
        assert not self.thread.is_alive(), f"run {self.name} did not finish after its answer"


def artifacts_of(flow_run_id: Any) -> dict[str, Any]:
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(
            any_=[flow_run_id])))
    return {artifact.key: artifact for artifact in found}


@pytest.mark.slow
def test_an_approval_round_trip_through_a_real_prefect_api(prefect_harness, small_corpus, tmp_path):
    """One run of each release command pauses on a real Prefect API, all three at once: DP-KPS's is approved and
    published, Aug-PE's rejected (nothing under OUT, the candidate in quarantine), SecPE's gets no answer within
    --approval-timeout and fails with its own line, which names the --run-id that asks again."""
    import json

    from prefect.flow_runs import resume_flow_run

    from privseed.flows.evolution import augpe_flow, secpe_flow
    from privseed.tasks.data.corpus import read_release
    from privseed.tasks.dp.ledger import unfinished_runs
    from privseed.tasks.llm import register_backend
    from tests.test_evolution_flow import TOPICS, FakeBackend

    base: dict[str, Any] = {"data": str(small_corpus), "labels": LABELS, "gate": False, "n_workers": 1,
                            "require_approval": True}
    evolution = {**base, "llm": "local:fake-topics", "per_class": 2, "variations": 1, "iterations": 1,
                 "doc_type": "short text"}
    public, secrets = tmp_path / "public.parquet", tmp_path / "secrets.txt"
    pd.DataFrame({"text": [f"{TOPICS[i % 3]} public {i}" for i in range(30)]}).to_parquet(public)
    secrets.write_text("goals\nglacier\nguitar\n")
    out = {name: tmp_path / name for name in ("dpkps", "augpe", "secpe")}
    register_backend("local:fake-topics", FakeBackend())
    try:
        dpkps = FlowInThread("approval-dpkps", {**base, "out": str(out["dpkps"]), "per_class": 8, "llm": "none"})
        augpe = FlowInThread("approval-augpe", {**evolution, "out": str(out["augpe"]), "epsilon": 50.0,
                                                "delta": 1e-5}, augpe_flow)
        secpe = FlowInThread("approval-secpe", {**evolution, "out": str(out["secpe"]), "public": str(public),
                                                "secrets": str(secrets), "clusters": 6, "noise_multiplier": 8.0,
                                                "approval_timeout": 10}, secpe_flow)
        flow_run_id = dpkps.paused_run_id()
        assert not out["dpkps"].exists()  # nothing is published while the run waits
        artifacts = artifacts_of(flow_run_id)
        assert {"approval-request", "approval-sample"} <= set(artifacts)
        request = artifacts["approval-request"].data
        assert "24 documents" in request and "changes the probability of any output" in request
        sample = json.loads(artifacts["approval-sample"].data)
        assert len(sample) == approval.SAMPLE_ROWS and set(sample[0]) == {"text", "label", "keyphrases"}
        resume_flow_run(flow_run_id, run_input={"approve": True, "comment": "signed off"})

        flow_run_id = augpe.paused_run_id()
        assert {"approval-request", "approval-sample"} <= set(artifacts_of(flow_run_id))
        resume_flow_run(flow_run_id, run_input={"approve": False, "comment": "not this week"})
        for run in (dpkps, augpe):
            run.join()
        secpe.join(within_s=300)  # nobody answers it
    finally:
        register_backend("local:fake-topics", None)

    assert dpkps.error is None, dpkps.error
    manifest, synthetic = read_release(str(out["dpkps"]))
    assert manifest["rows"] == 24 and len(synthetic) == 24
    assert dpkps.result["release_id"] == manifest["release_id"]

    assert isinstance(augpe.error, GateFailedError) and "rejected in the Prefect UI (not this week)" in str(augpe.error)
    assert not out["augpe"].exists() or not any(p.is_file() for p in out["augpe"].rglob("*"))
    (quarantined,) = (tmp_path / "augpe.private" / "quarantine").iterdir()
    assert len(pd.read_parquet(quarantined / "synthetic" / "part-00000.parquet")) == 6
    assert json.loads((quarantined / "approval.json").read_text())["comment"] == "not this week"

    assert isinstance(secpe.error, GateFailedError), secpe.error
    (unfinished,) = unfinished_runs(str(tmp_path / "secpe.private"))
    assert str(secpe.error).startswith("release not approved: no answer within 10 s; nothing was published")
    assert f"rerun the same command with --run-id {unfinished} " in str(secpe.error)
    assert not out["secpe"].exists() or not any(p.is_file() for p in out["secpe"].rglob("*"))
    assert len(list((tmp_path / "secpe.private" / "quarantine").iterdir())) == 1
    state = secpe.flow_run().state  # the run's own line, not Prefect's "paused and never resumed"
    assert state.is_failed() and "release not approved: no answer within 10 s" in (state.message or ""), state
