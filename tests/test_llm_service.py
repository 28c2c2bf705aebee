"""The LLM service: one registry of backend kinds that describe themselves, one complete(), the shared local
server (xllamacpp) behind the same OpenAI-compatible client a GPU server gets."""
import dataclasses
import re
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from privseed.tasks.errors import ConfigError
from privseed.tasks.generation.params import GenerationParams
from privseed.tasks.generation.rounds import steering_for
from privseed.tasks.llm import (KINDS, LLM_GRAMMAR, CallCache, ChatResult, ReleasedVocabulary, complete, kind_of,
                                parse_llm_spec, register_backend, serving)
from privseed.tasks.llm.base import ChatMessage, ChatRequest, SeedSteering
from privseed.tasks.llm.openai_compat import (STATIC_BIAS_PER_STEER, OpenAICompatibleBackend, continued_answer,
                                             mean_logprob, steering_body)
from privseed.tasks.llm.service import call_prices, llm_spec
from tests.fakes.recording import RecordingBackend

ROOT = Path(__file__).resolve().parents[1]
VOCAB = ReleasedVocabulary(["river", "village", "church"], "test")


def test_every_kind_parses_its_own_form_and_the_grammar_lists_them_all():
    examples = {"none": "none", "local": "local:smollm2", "local-server": "local-server:smollm2",
                "anthropic": "anthropic:claude-haiku-4-5", "openai-compatible": "openai-compatible:http://h:8000/v1#m",
                "vllm": "vllm:http://h:8000/v1#Qwen/Qwen2.5-7B-Instruct"}
    assert set(examples) == set(KINDS)
    for name, value in examples.items():
        assert parse_llm_spec(value).kind == name and KINDS[name].form in LLM_GRAMMAR
    with pytest.raises(ConfigError, match="local-server.*vllm"):
        parse_llm_spec("tgi:x")  # the error lists every kind the registry knows
    with pytest.raises(ConfigError, match=r"vllm needs a URL, vllm:http://HOST:PORT/v1\[#MODEL\]"):
        parse_llm_spec("vllm:")


def test_each_kind_takes_the_run_options_it_declares():
    offered = dict(state_uri="/state", storage_options={"anon": True}, llm_concurrency=8, llm_secret="block")
    anthropic = dict(llm_spec("anthropic:claude-haiku-4-5", **offered).options)
    assert anthropic == {"batch_state": "/state", "storage_options": {"anon": True}, "max_concurrency": 8,
                         "secret_block": "block"}
    assert dict(llm_spec("openai-compatible:http://h/v1", **offered).options) == {"max_concurrency": 8,
                                                                                   "secret_block": "block"}
    assert dict(llm_spec("vllm:http://h/v1", **offered).options) == {"max_concurrency": 8, "secret_block": "block"}
    assert llm_spec("local", **offered).options == () and llm_spec("local-server", **offered).options == ()


def test_price_and_batching_come_from_the_kind():
    assert call_prices(parse_llm_spec("local"), 5) == (0.0, 0.0) == call_prices(parse_llm_spec("local-server"), 5)
    haiku = parse_llm_spec("anthropic:claude-haiku-4-5")
    assert call_prices(haiku, 199) == (1.0, 5.0) and call_prices(haiku, 200) == (0.5, 2.5)  # Message Batches
    assert kind_of(haiku).batches(haiku, 200) and not kind_of(haiku).batches(haiku, 199)
    never = haiku.with_options(use_batches=False)
    assert not kind_of(never).batches(never, 10_000)
    assert call_prices(parse_llm_spec("openai-compatible:http://h/v1"), 3) is None


def test_steering_goes_to_the_kinds_that_apply_it():
    seed = VOCAB.seed(["river", "church"], 0, 1)
    params = GenerationParams(steer=4.0, no_repeat_ngram=4)
    assert steering_for(seed, params, "local") is not None and steering_for(seed, params, "local-server") is not None
    assert steering_for(seed, params, "vllm") is not None
    assert steering_for(seed, params, "anthropic") is None and steering_for(seed, params, "openai-compatible") is None
    off = GenerationParams(steer=0.0, no_repeat_ngram=0, repeat_penalty=1.0)
    assert steering_for(seed, off, "local-server") is None  # all off: the old cache keys


def test_static_steering_for_a_llama_cpp_server():
    body = steering_body(SeedSteering(("river", "old town"), strength=4.0, repeat_penalty=1.1, no_repeat_ngram=4))
    bias = 4.0 * STATIC_BIAS_PER_STEER
    assert body["logit_bias"] == [[f, bias] for f in (" river", "river", " River", "River", " old town", "old town",
                                                      " Old town", "Old town")]
    assert "presence_penalty" not in body and body["repeat_penalty"] == 1.1  # charged on every token: run-ons
    assert body["dry_multiplier"] > 0 and body["dry_allowed_length"] == 3
    assert steering_body(None) == {} and steering_body(SeedSteering(("river",))) == {}


def test_an_opening_goes_only_to_a_server_that_continues_it():
    """llama.cpp's server continues a last assistant turn and answers with the whole turn; a build that answers with
    the continuation alone gets the opening put back. Another OpenAI-compatible server is not sent one."""
    assert continued_answer("I went", "I went to the bakery. ") == "I went to the bakery."
    assert continued_answer("I went", " to the bakery.") == "I went to the bakery."
    request = ChatRequest((ChatMessage("user", "Write a review."),), 32, 0.5, 1, answer_prefix="I went")
    other = OpenAICompatibleBackend("http://127.0.0.1:9/v1", "m")
    with pytest.raises(ConfigError, match="continue a given opening"):
        other._messages(request)
    assert other._messages(dataclasses.replace(request, answer_prefix="")) == request.messages_dicts()
    server = OpenAICompatibleBackend("http://127.0.0.1:9/v1", "m", llama_cpp=True)
    assert server._messages(request)[-1] == {"role": "assistant", "content": "I went"}


def test_mean_logprob_of_an_answer():
    tokens = [SimpleNamespace(logprob=-1.0), SimpleNamespace(logprob=-3.0)]
    assert mean_logprob(SimpleNamespace(logprobs=SimpleNamespace(content=tokens))) == -2.0
    assert mean_logprob(SimpleNamespace(logprobs=None)) is None
    r = ChatResult("text", 1, 2, finish_reason="stop", mean_logprob=-0.5)
    assert ChatResult.from_dict(r.to_dict()).mean_logprob == -0.5
    assert "mean_logprob" not in ChatResult("t", 1, 2).to_dict()  # entries without it keep their old form


def test_complete_is_the_one_way_through_the_cache(tmp_path):
    spec = "local:service-test"
    backend = RecordingBackend()
    register_backend(spec, backend)
    try:
        from privseed.tasks.llm import PromptTemplate, build_request

        reqs = [build_request(PromptTemplate.load("generic"), VOCAB.seed(["river"], 0, i), "memo", max_tokens=5,
                              temperature=0.0, call_seed=i) for i in range(3)]
        cache = CallCache(str(tmp_path / "cache"))
        first = complete(spec, reqs, cache)
        again = complete(spec, reqs, cache)
        assert len(backend.requests) == 3 and [a.text for a in again] == [a.text for a in first]
        assert all(a.cached for a in again)
    finally:
        register_backend(spec, None)


def test_generation_asks_the_registry_not_the_kind_names():
    """The variation points are data: no ``spec.kind ==`` test in the generation stage, the batching rule once."""
    source = "".join(path.read_text() for path in sorted((ROOT / "tasks" / "generation").glob("*.py")))
    assert not re.search(r"\bkind\s*(==|!=|in)\s*[\"'(]", source)
    assert "batch_threshold" not in source


def test_serving_passes_other_kinds_through():
    spec = parse_llm_spec("openai-compatible:http://h/v1")
    with serving(spec) as served:
        assert served is spec


# -- the real server -------------------------------------------------------------------------------------------
def _listening(url: str) -> bool:
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, int(port))) == 0


@pytest.mark.slow
def test_local_server_generates_documents_and_stops(tmp_path):
    pytest.importorskip("xllamacpp")
    from privseed.tasks.generation.drivers import generate_seeds
    from privseed.tasks.generation.rounds import candidate_request
    from privseed.tasks.llm import PromptTemplate
    from privseed.tasks.llm.local_server import PROSE_GRAMMAR, LocalServerBackend

    spec = parse_llm_spec("local-server").with_options(slots=2, threads=1)
    seeds = [VOCAB.seed(["river", "village", "church"], 0, 11), VOCAB.seed(["church", "village"], 1, 12)]
    params = GenerationParams(doc_type="short story", max_tokens=48, temperature=0.4, steer=4.0, no_repeat_ngram=4,
                              max_regenerations=0)
    request = candidate_request(PromptTemplate.load("coverage"), seeds[1], params, 0, "local-server")
    with serving(spec) as served:
        url = dict(served.options)["url"]
        assert url.startswith("http://127.0.0.1:") and _listening(url)
        rows = generate_seeds(seeds, served, params, str(tmp_path / "cache"), progress=False)
        backend = LocalServerBackend(None, url=url, slots=2, grammar="prose")
        assert backend.grammar == PROSE_GRAMMAR and len(backend.tokens(" river")) == 1
        body = backend.request_body(request)
        assert body["cache_prompt"] is True and all(k.isdigit() for k in body["logit_bias"])  # first-token ids
        assert all(v > 0 for v in body["logit_bias"].values())
        # the other classes' words: down by the strength where one token, a longer word and a seed term left alone
        avoiding = dataclasses.replace(request, steering=dataclasses.replace(
            request.steering, avoid=("river", "village", "burrowingly")))
        avoided = backend.request_body(avoiding)["logit_bias"]
        assert avoided[str(backend.tokens(" river")[0])] == -4.0 and avoided[str(backend.tokens(" River")[0])] == -4.0
        assert len(backend.tokens(" burrowingly")) > 1 and str(backend.tokens(" burrowingly")[0]) not in avoided
        assert avoided[str(backend.tokens(" village")[0])] > 0  # the seed's own term keeps its push
        answer = backend.complete([request])[0]
        # an opening: the server continues the last assistant turn, and the answer starts with it
        opened = dataclasses.replace(request, answer_prefix="The church")
        sent = backend._messages(opened)
        assert sent[:-1] == request.messages_dicts() and sent[-1] == {"role": "assistant", "content": "The church"}
        continued = backend.complete([opened])[0]
        backend.close()
    assert len(rows) == 2 and rows["backend"].eq("local-server").all() and rows["model"].str.contains("@").all()
    assert rows["text"].str.len().gt(0).all()
    assert answer.mean_logprob is not None and answer.mean_logprob < 0 and answer.finish_reason in ("stop", "length")
    assert not answer.text.lstrip().startswith(("#", "-", "*"))
    assert continued.text.startswith("The church")  # "The churchyard ...": the model may go on with the word
    assert not continued.text.replace(" ", "").startswith("ThechurchThechurch")  # the opening is not doubled
    assert continued.tokens_in > answer.tokens_in  # the opening is prompt, not answer
    assert not _listening(url)  # stopped with the block
