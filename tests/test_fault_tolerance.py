"""Failures are boring: a run killed after privatization resumes without new noise, and a dead S3
endpoint fails the run with a StorageError while the last good release stays exactly as it was."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from privseed.tasks.errors import StorageError
from tests.test_s3_pipeline import run_cli

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SMALL = ["--method", "independent", "--vocab-top", "20000", "--vocab-size", "40", "--features", "64",
         "--per-class", "4", "--length", "5", "--llm", "none", "--seed", "11", "--workers", "1", "--labels", "0,1,2",
         "--run-id", "resumable-run"]


def ledger_state(out: Path) -> dict[str, tuple[bytes, int]]:
    """Every file of the draw-once store (entries and noise values): content and modification time."""
    state = {}
    private = out.with_name(out.name + ".private")
    for path in sorted((private / "runs").rglob("*")):
        if path.is_file() and path.name != "ledger.json":  # the owner's ledger is (re)written at publish time
            state[str(path.relative_to(private))] = (path.read_bytes(), path.stat().st_mtime_ns)
    return state


def cli(corpus: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "privseed.flows.cli", "dpkps", str(corpus), "--out", str(out), *SMALL]


def subprocess_env() -> dict[str, str]:
    """The session's Prefect API for the child runs (no ephemeral server per child)."""
    from prefect.settings import get_current_settings

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env["PREFECT_API_URL"] = str(get_current_settings().api.url)
    return env


def test_dead_s3_endpoint_fails_cleanly_and_keeps_the_last_release(prefect_harness, proxied_s3_bucket, tmp_path,
                                                                   tiny_corpus):
    from privseed.flows.dpkps import dpkps_flow
    from privseed.tasks.config.commands import DpKpsConfig
    from tests.s3server import clear_s3fs_cache

    corpus = tmp_path / "corpus.parquet"
    tiny_corpus.to_parquet(corpus, index=False)
    bucket = proxied_s3_bucket
    # No release gate: it is not what this test is about, and with secure noise twelve sequences of five terms drawn
    # from forty sometimes repeat past its duplicate bound, which failed the first, healthy run of a fresh-clone CI run
    # (2026-11-30) instead of the dead endpoint's.
    config = DpKpsConfig(data=str(corpus), out=f"{bucket.url}/release", llm="none", per_class=4, length=5,
                         labels=["0", "1", "2"], run_id="resumable-run",
                         method="independent", vocab_top=20000, vocab_size=40, n_features=64, n_workers=1,
                         seed=2, gate=False).model_dump()

    first = dpkps_flow(config)
    before = {key: bucket.get(key) for key in bucket.keys("release/")}
    assert "release/manifest.json" in before
    assert json.loads(before["release/manifest.json"])["release_id"] == first["release_id"]

    bucket.proxy.stop()  # the endpoint is now dead: connections are refused
    clear_s3fs_cache()
    started = time.monotonic()
    with pytest.raises(StorageError) as failure:
        dpkps_flow(config)
    elapsed = time.monotonic() - started
    message = str(failure.value)
    assert bucket.endpoint_url in message and "Could not connect" in message, message
    assert f"{bucket.url}/release" in message  # names what was being read or written
    assert elapsed < 120, f"a dead endpoint took {elapsed:.0f} s to fail"
    print(f"dead endpoint: the run failed after {elapsed:.1f} s")

    after = {key: bucket.get(key) for key in bucket.keys("release/")}  # read behind the proxy
    assert after == before  # nothing added, removed or changed: the last good release is intact


def llm_cache_keys(out: Path) -> set[str]:
    return {path.name for path in (out.with_name(out.name + ".private") / "llm-cache").rglob("*.json")}


def test_killed_after_privatization_restart_keeps_the_ledger_and_repeats_no_llm_call(prefect_harness, tmp_path,
                                                                                    tiny_corpus, monkeypatch):
    """SIGKILL a `privseed dpkps` process while it generates documents (privatization is over: every noise
    value is drawn), restart it: the ledger and its noise are unchanged and only unfinished calls are sent."""
    from tests.fakes import anthropic_server
    from tests.fakes.anthropic_server import FakeAnthropic

    corpus = tmp_path / "corpus.parquet"
    tiny_corpus.to_parquet(corpus, index=False)
    out = tmp_path / "out"
    fast_text = anthropic_server.fake_text

    answered, numbered = itertools.count(), itertools.count()

    def distinct_text(messages):
        # Two classes' seeds may be the same terms (the independent sampler on noise), and the fake's answer is a
        # function of the terms: numbered answers keep the release gate's duplicate check off this test's subject.
        return f"{fast_text(messages)} It is answer {next(numbered)} of the fake model."

    def slow_text(messages):
        # The first four calls are answered in 0.4 s, the rest in 5 s: the kill lands while calls are unfinished
        # even when this test process is scheduled late on a loaded machine (with 0.4 s for every call, all 12
        # could finish before the poll below saw the third).
        time.sleep(0.4 if next(answered) < 4 else 5.0)
        return distinct_text(messages)

    with FakeAnthropic(api_key="privseed-fake-openai-key") as fake:
        monkeypatch.setattr(anthropic_server, "fake_text", slow_text)
        monkeypatch.setenv("OPENAI_API_KEY", "privseed-fake-openai-key")
        argv = [*cli(corpus, out)[3:]]
        argv[argv.index("none")] = f"openai-compatible:{fake.base_url}/v1#fake-model"
        run = subprocess.Popen([sys.executable, "-m", "privseed.flows.cli", *argv], cwd=REPO, env=subprocess_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 300
        while len(llm_cache_keys(out)) < 3:
            assert run.poll() is None, run.stdout.read().decode()[-3000:]
            assert time.monotonic() < deadline, "no LLM call finished in time"
            time.sleep(0.05)
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=30)
        cached_at_kill = llm_cache_keys(out)
        ledger_at_kill = ledger_state(out)
        assert not (out / "manifest.json").exists()
        entries_at_kill = [name for name in ledger_at_kill if "/entries/" in name]
        assert len(entries_at_kill) >= 2  # the vocabulary histogram and the per-class sketches were drawn
        sent_before = len(fake.requests)

        monkeypatch.setattr(anthropic_server, "fake_text", distinct_text)
        code, _, stderr = run_cli(*argv)
        assert code == 0, stderr[-3000:]
        resent = [r for r in fake.requests[sent_before:] if r["path"].startswith("/v1/chat/completions")]

    cached_after = llm_cache_keys(out)
    assert cached_at_kill < cached_after  # killed mid-way: some calls were done, some were not
    # The restart sent exactly the calls that had not finished; every finished one came from the cache.
    assert len(resent) == len(cached_after - cached_at_kill)
    # A redraw would rewrite the value files and the entries (new bytes or at least a new mtime, and a new
    # created_at): the draw-once store is byte for byte and mtime for mtime what the killed run left.
    assert ledger_state(out) == ledger_at_kill
    ledger = json.loads((out / "ledger.json").read_text())
    assert len(ledger["entries"]) == len(entries_at_kill)
    assert ledger["total"]["epsilon"] == pytest.approx(11.0)  # charged once: eps_voc 1 + eps_kde 10
    owner = json.loads((tmp_path / "out.private" / "runs" / "resumable-run" / "ledger.json").read_text())
    for entry in owner["entries"]:  # value checksums are the owner's (private state), not the recipient's
        if entry.get("value"):
            stored = next(v for k, v in ledger_at_kill.items() if k.endswith(entry["value"]["path"]))
            assert hashlib.sha256(stored[0]).hexdigest() == entry["value"]["sha256"]
    manifest = json.loads((out / "manifest.json").read_text())
    # What holds for every draw of the secure noise (as in tests/test_s3_pipeline.py): 12 seeds, each kept or
    # dropped after its regenerations with a reason (a seed drawn with a term twice can make every candidate of the
    # fake a repetition the predicate rejects); the release holds exactly the kept rows.
    generation = json.loads((out / "quality.json").read_text())["generation"]
    assert generation["rows_generated"] == 12
    assert generation["rows_kept"] + generation["rows_dropped"] == 12
    assert manifest["rows"] == generation["rows_kept"] > 0 and manifest["gate"]["success"] is True


def test_deterministic_errors_are_not_retried_transient_ones_are(prefect_harness):
    """A failed gate, a bad config or a mismatched ledger fails the same way again: its task is not retried
    (no repeated work or tracebacks); a storage hiccup or a crashed call is."""
    from prefect import flow, task

    from privseed.tasks.errors import ConfigError, GateFailedError, StorageError, retry_if_transient

    attempts: dict[str, int] = {}

    @task(retries=2, retry_delay_seconds=0, retry_condition_fn=retry_if_transient)
    def fails_with(kind: str) -> None:
        attempts[kind] = attempts.get(kind, 0) + 1
        raise {"gate": GateFailedError("gate rejected the candidate"), "config": ConfigError("bad"),
               "storage": StorageError("endpoint unreachable"), "oserror": OSError("connection reset")}[kind]

    @flow
    def run(kind: str) -> None:
        fails_with(kind)

    raised = {"gate": GateFailedError, "config": ConfigError, "storage": StorageError, "oserror": OSError}
    for kind, error in raised.items():
        with pytest.raises(error):
            run(kind)
    assert attempts == {"gate": 1, "config": 1, "storage": 3, "oserror": 3}
