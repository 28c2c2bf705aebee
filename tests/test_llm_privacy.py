"""Canary tests: a phrase planted in the private corpus never reaches a request sent to any backend,
nor a log line, nor the console.

Part 1 exercises the generation layer with a worst-case stand-in sampler (it copies each document's terms
verbatim): even then only released-vocabulary terms can be minted into prompt seeds. Part 2 runs the whole
DP-KPS flow through the CLI against the fake Anthropic server.
"""
import json
import logging

import pandas as pd
import pytest

from privseed.tasks.generation.drivers import generate_seeds, generate_shard
from privseed.tasks.generation.params import GenerationParams
from privseed.tasks.llm import ReleasedVocabulary, UnreleasedValueError, register_backend
from privseed.tasks.llm.retry import RetryPolicy
from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.recording import RecordingBackend

CANARY = "zorblax quintessa"
KEY = "sk-ant-canary-test-key"


def private_corpus(tiny_corpus: pd.DataFrame) -> pd.DataFrame:
    planted = pd.DataFrame({"text": [f"the {CANARY} river valley mountain {CANARY} lake",
                                     f"album band {CANARY} song released records"] * 3,
                            "label": [1, 2] * 3})
    return pd.concat([tiny_corpus, planted], ignore_index=True)


def released_vocabulary() -> ReleasedVocabulary:
    """Stands in for V~: a public word list (the canary's words are in no English list)."""
    from wordfreq import top_n_list

    return ReleasedVocabulary([w for w in top_n_list("en", 20_000) if w.isalpha()], "public-english-20k")


def copying_sampler(corpus: pd.DataFrame, vocab: ReleasedVocabulary):
    """Worst case: a 'sampler' that copies each document's tokens. Tokens outside V~ are refused by the type."""
    sequences, refused = [], 0
    for i, row in enumerate(corpus.itertuples()):
        try:
            sequences.append(vocab.seed(row.text.split(), row.label, i))
        except UnreleasedValueError:
            refused += 1
            sequences.append(vocab.seed([t for t in row.text.split() if t in vocab], row.label, i))
    return sequences, refused


def assert_no_canary(*texts: str) -> None:
    for t in texts:
        for word in CANARY.split():
            assert word not in t, "the canary leaked"


def test_canary_cannot_be_minted_into_a_seed(tiny_corpus, caplog):
    caplog.set_level(logging.DEBUG)
    vocab = released_vocabulary()
    with pytest.raises(UnreleasedValueError) as e:
        vocab.seed(CANARY.split(), 0, 0)
    assert_no_canary(str(e.value), caplog.text)
    _, refused = copying_sampler(private_corpus(tiny_corpus), vocab)
    assert refused == 6  # exactly the planted documents


def test_canary_never_reaches_a_backend_or_a_log(tiny_corpus, tmp_path, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    corpus = private_corpus(tiny_corpus)
    seeds, _ = copying_sampler(corpus, released_vocabulary())
    # No regeneration: the recorder echoes its prompt (not a document), and one call per seed is what is counted.
    params = GenerationParams(doc_type="summary of a Wikipedia-style article", template="coverage", max_tokens=32,
                              max_regenerations=0)

    recording = RecordingBackend()
    register_backend("local:canary-recorder", recording)
    try:
        generate_shard(seeds, "local:canary-recorder", params, str(tmp_path / "rec"), progress=True)
    finally:
        register_backend("local:canary-recorder", None)
    assert len(recording.requests) == len(corpus)

    with FakeAnthropic(api_key=KEY) as fake:
        for batched in (False, True):
            from privseed.tasks.llm import LLMSpec

            spec = LLMSpec("anthropic", "claude-haiku-4-5").with_options(
                api_key=KEY, base_url=fake.base_url, use_batches=batched, poll_interval=0.0,
                batch_state=str(tmp_path / "state"), retry=RetryPolicy(base_delay=0.0))
            fake.fail_next = [429, 529]
            df = generate_seeds(seeds, spec, params, str(tmp_path / f"anth{batched}"), progress=True)
            assert len(df) == len(corpus)
        assert len(fake.batches) == 1 and fake.message_calls >= len(corpus)
        sent = fake.sent_texts()

    out, err = capfd.readouterr()
    assert_no_canary(*recording.sent_strings(), *sent, caplog.text, out, err, *df["text"])
    # and no private document as such was sent either
    for doc in corpus["text"]:
        assert all(doc not in s for s in [*recording.sent_strings(), *sent])
    assert KEY not in caplog.text + out + err


@pytest.mark.slow
def test_canary_through_the_dpkps_flow(tiny_corpus, tmp_path, caplog, capfd, monkeypatch, prefect_harness):
    from privseed.flows.cli import main
    from privseed.tasks.data.corpus import read_release

    caplog.set_level(logging.DEBUG)
    corpus_path = tmp_path / "corpus.parquet"
    private_corpus(tiny_corpus).to_parquet(corpus_path)
    with FakeAnthropic(api_key=KEY) as fake:
        monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
        argv = ["dpkps", str(corpus_path), "--out", str(tmp_path / "out"), "--llm", "anthropic:claude-haiku-4-5",
                "--doc-type", "summary of a Wikipedia-style article", "--method", "independent", "--vocab-top", "20000",
                "--vocab-size", "40",
                "--features", "64", "--per-class", "4", "--length", "5", "--no-gate", "--workers", "1",
                "--max-tokens", "32", "--labels", "0,1,2"]
        assert main(argv) == 0
        assert fake.message_calls + sum(len(b["requests"]) for b in fake.batches.values()) >= 12
        sent = fake.sent_texts()
        assert main([*argv, "--dry-run"]) == 0  # the estimate reads, draws and sends nothing
        assert fake.sent_texts() == sent
    out, err = capfd.readouterr()
    manifest, synthetic = read_release(str(tmp_path / "out"))
    assert len(synthetic) == 12
    assert {"backend", "model", "prompt_version", "seed", "tokens_in", "tokens_out"} <= set(synthetic.columns)
    # The gate is off, so quality.json holds only the generation counts (synthetic rows only).
    quality = json.loads((tmp_path / "out" / "quality.json").read_text())
    assert quality["gate"] == "off" and quality["generation"]["rows_kept"] == 12
    assert quality["generation"]["rows_dropped"] == 0
    assert_no_canary(*sent, caplog.text, out, err, *synthetic["text"])
    assert KEY not in caplog.text + out + err


# ------------------------------------------------------------------------------------------------------------
# Part 3: the private-evolution flows, with their LLM calls sharded over a real Dask LocalCluster
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("method", ["augpe+v", "secpe-pii"])
def test_canary_through_the_evolution_flows_on_dask(method, tiny_corpus, tmp_path, caplog, capfd, prefect_harness):
    """Aug-PE+V~ (votes + the privatized vocabulary in prompts) and SecPE with PII secrets (the canary is also an
    e-mail address, i.e. a detected secret): the worker processes reach the OpenAI-compatible fake over HTTP, and
    the canary reaches no request, log record, console line or file of the release and its state."""
    from pathlib import Path

    from privseed.flows.evolution import run_augpe, run_secpe
    from privseed.tasks.pe.evolution import evolution_call_plan

    caplog.set_level(logging.DEBUG)
    corpus = private_corpus(tiny_corpus)
    corpus.loc[corpus.index[-2:], "text"] += f" write to {CANARY.replace(' ', '.')}@example.org"
    corpus_path = tmp_path / "corpus.parquet"
    corpus.to_parquet(corpus_path)
    out = tmp_path / "release"
    with FakeAnthropic(api_key="", model_ids=("m",)) as fake:
        cfg = {"data": str(corpus_path), "out": str(out), "llm": f"openai-compatible:{fake.base_url}#m",
               "llm_shards": 2, "n_workers": 2, "per_class": 2, "variations": 1, "iterations": 2, "max_tokens": 32,
               "gate": False, "doc_type": "summary of a Wikipedia-style article", "seed": 11,
               "labels": ["0", "1", "2"]}
        if method == "augpe+v":
            run_augpe({**cfg, "epsilon": 4.0, "delta": 1e-5, "vocab_words": True, "vocab_top": 20_000,
                       "vocab_size": 30, "words_per_prompt": 3})
        else:
            public = tmp_path / "public.parquet"
            pd.DataFrame({"text": tiny_corpus["text"].tolist()}).to_parquet(public)
            run_secpe({**cfg, "public": str(public), "clusters": 4, "secrets": "pii", "noise_multiplier": 8.0})
        assert fake.message_calls == evolution_call_plan(3, 2, 1, 2)["total"]  # every call sent once
        sent = fake.sent_texts()
    console_out, console_err = capfd.readouterr()
    stored = [p.read_bytes().decode("utf-8", "replace") for folder in (out, tmp_path / "release.private")
              for p in Path(folder).rglob("*") if p.is_file()]
    assert stored and sent
    assert_no_canary(*sent, caplog.text, console_out, console_err, *stored)
    for doc in corpus["text"]:
        assert all(doc not in s for s in sent)


# ------------------------------------------------------------------------------------------------------------
# Part 4: a run drawn from reproducible noise (--insecure-reproducible-noise): its seeds are not DP
# ------------------------------------------------------------------------------------------------------------
INSECURE_SPEC = "local:insecure-recorder"
TERMS = ["river", "village", "church", "album", "band", "football club"]


def insecure_config(tmp_path, **values):
    from privseed.tasks.config.commands import DpKpsConfig, validate_config

    return validate_config(DpKpsConfig, {"data": "unused.parquet", "out": str(tmp_path / "out"), "labels": ["0", "1"],
                                         "llm": INSECURE_SPEC, "insecure_reproducible_noise": True,
                                         "max_regenerations": 0, **values})


def document_answer(req) -> str:
    return (f"The old church by the river was rebuilt after flood number {req.seed}, and the village grew around "
            "it over the following years.")


@pytest.mark.parametrize("llm", ["anthropic:claude-haiku-4-5", "openai-compatible:http://127.0.0.1:9/v1#m"])
def test_reproducible_noise_with_a_remote_llm_is_refused_before_anything_is_read(tmp_path, llm):
    # Issue 46: the same non-DP seeds reached a remote provider before the release gate refused the run.
    from privseed.tasks.errors import ConfigError
    from privseed.tasks.generation.drivers import refuse_remote_llm_for_reproducible_noise
    from privseed.tasks.stages.ledger import warn_if_insecure

    cfg = insecure_config(tmp_path, llm=llm)
    with pytest.raises(ConfigError, match="--insecure-reproducible-noise with --llm .*local") as refused:
        warn_if_insecure(cfg)  # what every release flow calls before its corpus is read
    assert "\n" not in str(refused.value)
    for allowed in ("none", INSECURE_SPEC):
        refuse_remote_llm_for_reproducible_noise(allowed, True)
    refuse_remote_llm_for_reproducible_noise(llm, False)  # secure noise: the seeds are DP, a provider may see them


def test_a_crash_mid_generation_of_reproducible_noise_leaves_nothing_under_out(tmp_path):
    """Generation shards of an insecure run write the candidate's parts to the private state: killed after two of
    four shards wrote theirs, the run leaves OUT empty (before, 4 rows with keyphrases stayed in OUT/synthetic)."""
    from privseed.tasks.stages.generation import release_from_config as _generate_release

    # One call a seed until the crash (the two classes share their terms: class fit would ask again for some)
    cfg = insecure_config(tmp_path, rewrite_off_class=False)
    sequences = pd.DataFrame({"label": [str(i % 2) for i in range(64)],
                              "keyphrases": [[TERMS[i % 6], TERMS[(i + 1) % 6], TERMS[(i + 3) % 6]]
                                             for i in range(64)]})
    sequences.attrs["released_vocabulary"] = TERMS
    crashing = RecordingBackend(answer=document_answer, fail_at=40)  # 4 shards of 16 seeds: crash in the third
    register_backend(INSECURE_SPEC, crashing)
    try:
        with pytest.raises(RuntimeError, match="simulated crash"):
            _generate_release(sequences, cfg, None)
    finally:
        register_backend(INSECURE_SPEC, None)
    out, state = tmp_path / "out", tmp_path / "out.private"
    assert not out.exists() or [p for p in out.rglob("*")] == []
    staged = list((state / "staging").rglob("*.parquet"))
    assert len(staged) == 2  # the shards before the crash did write their parts: in the private state

    register_backend(INSECURE_SPEC, RecordingBackend(answer=document_answer))
    try:
        release = _generate_release(sequences, cfg, None)
    finally:
        register_backend(INSECURE_SPEC, None)
    assert release.out == str(state / "staging" / release.release_id) and release.rows == 64
    assert not out.exists() or [p for p in out.rglob("*")] == []
