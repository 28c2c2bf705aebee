"""The whole DP-KPS flow with its input and its output on s3:// against a real S3 server (moto_server).

The private corpus is three Parquet shards in a bucket, read in parallel by the Dask workers; the release,
the ledger, the gate result and the draw-once state are written to the bucket. The endpoint comes from
AWS_ENDPOINT_URL (the standard variable) in one test and from ``--storage-option endpoint_url=...`` in
the other. Credentials are recognisable strings, and every byte the run left behind (objects, stdout,
logs, the Prefect database) is scanned for them.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from privseed.flows.cli import main
from privseed.tasks.data.corpus import read_release
from tests.s3server import TEST_ACCESS_KEY, TEST_SECRET_KEY

pytestmark = pytest.mark.slow

SMALL = ["--method", "independent", "--vocab-top", "20000", "--vocab-size", "40", "--features", "64",
         "--per-class", "4", "--length", "5", "--llm", "none", "--seed", "5", "--labels", "0,1,2"]
FAKE_LLM_KEY = "sk-privseed-FAKE-LLM-KEY-3b1e77"


def run_cli(*argv: str) -> tuple[int, str, str]:
    """``privseed ARGV`` in-process; returns (exit code, stdout, stderr). Output goes to buffers that stay
    open (not capsys): Prefect binds its console handler to the stream current when it configures
    logging, and a capsys stream closed after one test would break logging in the next."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def put_corpus_shards(bucket, corpus: pd.DataFrame, prefix: str, n_shards: int = 3) -> list[str]:
    shuffled = corpus.sample(frac=1.0, random_state=1).reset_index(drop=True)
    keys = []
    for index, rows in enumerate(np.array_split(np.arange(len(shuffled)), n_shards)):
        buffer = io.BytesIO()
        shuffled.iloc[rows].to_parquet(buffer, index=False)
        key = f"{prefix}/part-{index:05d}.parquet"
        bucket.server.client().put_object(Bucket=bucket.name, Key=key, Body=buffer.getvalue())
        keys.append(key)
    return keys


def prefect_database_bytes() -> bytes:
    """The SQLite file behind the test session's Prefect API (flow-run parameters, logs, states)."""
    from prefect.settings import get_current_settings

    url = str(get_current_settings().server.database.connection_url or "")
    path = Path(url.split(":///", 1)[-1]) if url.startswith("sqlite") else None
    return path.read_bytes() if path and path.exists() else b""


def assert_no_secret(blobs: dict[str, bytes | str]) -> None:
    for where, blob in blobs.items():
        data = blob.encode() if isinstance(blob, str) else blob
        for secret in (TEST_SECRET_KEY, FAKE_LLM_KEY):
            assert secret.encode() not in data, f"a secret leaked into {where}"


def test_dpkps_flow_with_input_and_output_on_s3(prefect_harness, s3_bucket, tiny_corpus, tmp_path, monkeypatch,
                                                caplog):
    """Private shards in, release out, draw-once state and LLM call cache, all in the bucket; the LLM is an
    OpenAI-compatible fake on 127.0.0.1 that requires the (fake) API key from the environment."""
    from tests.fakes.anthropic_server import FakeAnthropic

    monkeypatch.chdir(tmp_path)  # anything written locally by mistake would land here
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_LLM_KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_LLM_KEY)
    caplog.set_level("INFO")
    put_corpus_shards(s3_bucket, tiny_corpus, "private/corpus")
    out = f"{s3_bucket.url}/releases/dpkps"

    with FakeAnthropic(api_key=FAKE_LLM_KEY, seeded_answers=True) as llm:
        argv = [*SMALL]
        argv[argv.index("none")] = f"openai-compatible:{llm.base_url}/v1#fake-model"
        code, stdout, stderr = run_cli("dpkps", f"{s3_bucket.url}/private/corpus/", "--out", out, *argv,
                                       "--workers", "2")
        calls = [r for r in llm.requests if r["path"].startswith("/v1/chat/completions")]
    assert code == 0, stderr[-3000:]
    assert calls, "the LLM was never called"
    assert "release " in stdout and out in stdout

    manifest, synthetic = read_release(out)
    # What holds for every draw of the secure noise: 12 seeds were generated from (4 a class), each either kept or
    # dropped after its regenerations with a reason (the fake writes "A fake document that mentions a, b ..." from
    # its seed, and a seed the sampler drew with a term twice can make every candidate a repetition the predicate
    # rejects), and the release holds exactly the kept rows, of the declared labels only.
    generation = json.loads(s3_bucket.get("releases/dpkps/quality.json"))["generation"]
    assert generation["rows_generated"] == 12
    assert generation["rows_kept"] + generation["rows_dropped"] == 12
    assert sum(generation["dropped_by_reason"].values()) == generation["rows_dropped"]
    assert manifest["rows"] == len(synthetic) == generation["rows_kept"] > 0
    assert set(synthetic["label"].unique().tolist()) <= {0, 1, 2}
    assert {int(k): v for k, v in generation["kept_per_class"].items()} == \
        synthetic["label"].value_counts().to_dict()
    keys = s3_bucket.keys("releases/dpkps/")
    for entry in manifest["files"]:
        assert f"releases/dpkps/{entry['path']}" in keys
    for name in ("manifest.json", "ledger.json", "quality.json"):
        assert f"releases/dpkps/{name}" in keys
    # the private state is beside the release (releases/dpkps.private/), never inside it
    assert not any("/_state/" in k or k.endswith(".npz") for k in keys)
    private = s3_bucket.keys("releases/dpkps.private/")
    assert "releases/dpkps.private/identity.key" in private
    assert any(k.startswith("releases/dpkps.private/runs/") and k.endswith(".npz") for k in private)
    assert sum(k.startswith("releases/dpkps.private/llm-cache/") for k in private) == len(calls)
    assert synthetic["text"].str.startswith("A fake document").all()
    ledger = json.loads(s3_bucket.get("releases/dpkps/ledger.json"))
    assert ledger["total"]["epsilon"] == pytest.approx(11.0)
    assert json.loads(s3_bucket.get("releases/dpkps/quality.json"))["success"] is True
    assert list(tmp_path.iterdir()) == [], "the run wrote local files instead of s3://"

    assert_no_secret({
        **{f"s3://{s3_bucket.name}/{k}": s3_bucket.get(k) for k in keys + private},
        "stdout": stdout, "stderr": stderr, "logs": caplog.text,
        "the Prefect database": prefect_database_bytes(),
    })
    assert TEST_ACCESS_KEY not in json.dumps(manifest["config"])


def test_endpoint_from_storage_option_flags(prefect_harness, s3_bucket, tiny_corpus, monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    put_corpus_shards(s3_bucket, tiny_corpus, "in", n_shards=2)
    out = f"{s3_bucket.url}/out"
    # --no-gate: with secure noise two of the twelve seed rows are now and then equal, one repeat over the gate's 5 %,
    # and the gate is not what this test is about (the dead-endpoint test of test_fault_tolerance.py failed so once).
    flags = ["--storage-option", f"endpoint_url={s3_bucket.endpoint_url}", "--no-gate"]

    code, _, stderr = run_cli("dpkps", f"{s3_bucket.url}/in/", "--out", out, *SMALL, "--workers", "1", *flags)
    assert code == 0, stderr[-3000:]

    manifest = json.loads(s3_bucket.get("out/manifest.json"))
    assert manifest["config"]["storage_options"] == {"endpoint_url": s3_bucket.endpoint_url}
    assert manifest["rows"] == 12


def test_storage_secret_from_a_prefect_secret_block(prefect_harness, s3_bucket):
    from prefect.blocks.system import Secret

    from privseed.tasks import storage
    from privseed.tasks.errors import ConfigError

    Secret(value=TEST_SECRET_KEY).save("privseed-test-s3-secret", overwrite=True)
    options = {"key": TEST_ACCESS_KEY, "secret": "prefect-secret:privseed-test-s3-secret"}
    resolved = storage.resolve_storage_options(f"{s3_bucket.url}/x", options)
    assert resolved["secret"] == TEST_SECRET_KEY and resolved["key"] == TEST_ACCESS_KEY
    storage.write_bytes(f"{s3_bucket.url}/x", b"through the block", options)
    assert s3_bucket.get("x") == b"through the block"
    assert storage.redact_options(options)["secret"] == "***"  # what a manifest would hold
    with pytest.raises(ConfigError, match="no-such-block"):
        storage.resolve_storage_options(f"{s3_bucket.url}/x", {"secret": "prefect-secret:no-such-block"})
