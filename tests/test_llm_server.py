"""A real model server end to end: llama.cpp's own OpenAI-compatible server (``python -m llama_cpp.server``,
from ``llama-cpp-python[server]``) serving the packaged SmolLM2 GGUF on 127.0.0.1, and a DP-KPS release
written through it with ``--llm openai-compatible:URL``. The fake server (tests/fakes) stays for error
injection; this test checks that the backend speaks to a real implementation of the API."""
import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pandas as pd
import pytest

from privseed.flows.cli import main
from privseed.tasks.data.corpus import read_release
from privseed.tasks.llm.local import packaged_gguf

pytestmark = pytest.mark.slow

pytest.importorskip("uvicorn")
pytest.importorskip("sse_starlette", reason="llama-cpp-python[server] is a test dependency (pyproject [test])")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    """The server on a free port with one thread and a small context; stopped (and waited for) at the end."""
    port = _free_port()
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(packaged_gguf()), "--host", "127.0.0.1",
             "--port", str(port), "--n_threads", "1", "--n_ctx", "1024", "--model_alias", "smollm2-served"],
            stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llama_cpp.server exited with {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama_cpp.server did not answer in 180 s: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_the_backend_talks_to_a_real_server(llama_server):
    from privseed.tasks.llm import PromptTemplate, ReleasedVocabulary, build_request, make_backend

    backend = make_backend(f"openai-compatible:{llama_server}")
    assert backend.model == "smollm2-served"  # discovered through GET /v1/models
    seed = ReleasedVocabulary(["river", "village"], "test").seed(["river", "village"], 0, 3)
    request = build_request(PromptTemplate.load("coverage"), seed, "short note", max_tokens=24, temperature=0.0,
                            call_seed=3)
    first, again = backend.complete([request]), backend.complete([request])
    assert first[0].text and first[0].tokens_out > 0 and first[0].tokens_in > 10
    assert first[0].text == again[0].text  # temperature 0 + fixed seed: the server answers the same


def test_dpkps_release_through_the_server(llama_server, prefect_harness, tmp_path):
    corpus = tmp_path / "corpus.parquet"
    rows = [(t, label) for label, texts in {
        0: ["football club player scored goals league season", "striker signed contract club league"],
        1: ["river valley mountain lake forest village", "mountain peak glacier valley river"],
    }.items() for t in texts for _ in range(4)]
    pd.DataFrame(rows, columns=["text", "label"]).to_parquet(corpus)
    names = tmp_path / "names.json"
    names.write_text(json.dumps({"0": "Sports club", "1": "Landscape"}))
    out = tmp_path / "out"
    assert main(["dpkps", str(corpus), "--out", str(out), "--method", "independent", "--vocab-top", "20000",
                 "--vocab-size", "40",
                 "--features", "64", "--per-class", "2", "--length", "4", "--workers", "1", "--no-gate",
                 "--llm", f"openai-compatible:{llama_server}", "--max-tokens", "48", "--temperature", "0.8",
                 "--document-rule", "reject_truncated=false",
                 "--class-names", str(names), "--doc-type", "short encyclopedia entry"]) == 0
    manifest, synthetic = read_release(str(out))
    # Every seed is accounted for: written, or dropped after its regenerations. Which seeds the run gets is random,
    # as the DP noise is: at temperature 0 and 32 tokens the 135M model stopped mid-sentence on every try of all
    # four seeds of one draw (a fresh-clone CI run, 2026-11-30), so the regenerations sample (temperature 0.8) and
    # an answer cut at the token limit counts as a document here: this test is about the server's wiring.
    generation = json.loads((out / "quality.json").read_text())["generation"]
    assert generation["rows_kept"] == len(synthetic) >= 1 and generation["rows_kept"] + generation["rows_dropped"] == 4
    assert set(synthetic["label"].tolist()) <= {0, 1}
    assert set(synthetic["backend"]) == {"openai-compatible"} and set(synthetic["model"]) == {"smollm2-served"}
    assert (synthetic["tokens_out"] > 0).all() and synthetic["text"].str.len().gt(0).all()
    # The prompts name the class; a seed whose answer opened with its class's name is asked again without it, and
    # its row says so (which seeds the model does that to is the model's, as the DP noise is the run's).
    assert set(synthetic["prompt_version"]) <= {"dpkps-generic-v1+class-name-v2", "dpkps-generic-v1"}
    # Asked without it after one candidate was rejected for it, or after two kept ones opened with it loosely
    # (rounds.named_its_class: a rewrite, not a rejection, so the row's third candidate at the earliest).
    unnamed = synthetic[synthetic["prompt_version"] == "dpkps-generic-v1"]
    assert all("names_class" in list(r) or n >= 3 for r, n in zip(unnamed["rejections"], unnamed["candidates"]))
    assert manifest["config"]["prompt_class_names"] == {"0": "Sports club", "1": "Landscape"}
    assert manifest["config"]["llm"] == f"openai-compatible:{llama_server}"
