"""Failures are boring: a run killed after privatization resumes without new noise, and a dead S3
endpoint fails the run with a StorageError while the last good release stays exactly as it was."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.errors import StorageError
from tests.test_s3_pipeline import run_cli

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SMALL = ["--vocab-top", "20000", "--vocab-size", "40", "--features", "64", "--per-class", "4", "--length", "5",
         "--llm", "none", "--seed", "11", "--workers", "1"]
# The last task that draws noise; after it only post-processing (sampling, rendering, gate, publish) is left.
PRIVATIZATION_DONE = "Task run 'sketch-per-class"


def ledger_state(out: Path) -> dict[str, tuple[bytes, int]]:
    """Every file of the draw-once store (entries and noise values): content and modification time."""
    state = {}
    for path in sorted((out / "_state" / "runs").rglob("*")):
        if path.is_file():
            state[str(path.relative_to(out))] = (path.read_bytes(), path.stat().st_mtime_ns)
    return state


def cli(corpus: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "flows.cli", "dpkps", str(corpus), "--out", str(out), *SMALL]


def subprocess_env() -> dict[str, str]:
    """The session's Prefect API for the child runs (no ephemeral server per child)."""
    from prefect.settings import get_current_settings

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env["PREFECT_API_URL"] = str(get_current_settings().api.url)
    return env


def test_killed_after_privatization_restart_draws_no_new_noise(prefect_harness, tmp_path, tiny_corpus):
    corpus = tmp_path / "corpus.parquet"
    tiny_corpus.to_parquet(corpus, index=False)
    out = tmp_path / "out"
    env = subprocess_env()

    run = subprocess.Popen(cli(corpus, out), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)
    seen = []
    deadline = time.monotonic() + 300
    for line in run.stdout:
        seen.append(line)
        if PRIVATIZATION_DONE in line and "Finished in state Completed" in line:
            os.killpg(run.pid, signal.SIGKILL)  # no cleanup, no flush: a crash, not a shutdown
            break
        assert time.monotonic() < deadline, "".join(seen[-50:])
    run.wait(timeout=30)
    assert run.returncode == -signal.SIGKILL, "the run ended before privatization finished:\n" + "".join(seen[-50:])
    assert not (out / "manifest.json").exists(), "killed too late: the release was already published"
    at_kill = ledger_state(out)
    assert any(name.endswith(".npz") for name in at_kill), "the ledger had no drawn values when the run was killed"
    entries_at_kill = [name for name in at_kill if "/entries/" in name]
    assert len(entries_at_kill) >= 2  # the vocabulary histogram and the per-class sketches

    # The restart runs in this process (already warm: imports, model), as `privseed dpkps` with the same flags.
    code, _, stderr = run_cli(*cli(corpus, out)[3:])
    assert code == 0, stderr[-3000:]

    # A redraw would rewrite the value files and the entries (new bytes or at least a new mtime, and a new
    # created_at): the store is byte-for-byte and timestamp-for-timestamp what the killed run left.
    after = ledger_state(out)
    assert after == at_kill
    ledger = json.loads((out / "ledger.json").read_text())
    assert len(ledger["entries"]) == len(entries_at_kill)
    assert ledger["total"]["epsilon"] == pytest.approx(11.0)  # charged once: eps_voc 1 + eps_kde 10
    for entry in ledger["entries"]:
        if entry.get("value"):
            stored = next(v for k, v in at_kill.items() if k.endswith(entry["value"]["path"]))
            assert hashlib.sha256(stored[0]).hexdigest() == entry["value"]["sha256"]
    assert (out / "manifest.json").exists()


def test_dead_s3_endpoint_fails_cleanly_and_keeps_the_last_release(prefect_harness, proxied_s3_bucket, tmp_path,
                                                                   tiny_corpus):
    from flows.dpkps import dpkps_flow
    from tasks.config import DpKpsConfig
    from tests.s3server import clear_s3fs_cache

    corpus = tmp_path / "corpus.parquet"
    tiny_corpus.to_parquet(corpus, index=False)
    bucket = proxied_s3_bucket
    config = DpKpsConfig(data=str(corpus), out=f"{bucket.url}/release", llm="none", per_class=4, length=5,
                         vocab_top=20000, vocab_size=40, n_features=64, n_workers=1, seed=2).model_dump()

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
