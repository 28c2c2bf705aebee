"""``--llm vllm:URL``: a served model gets the openings and the seed steering the local kinds get, in the fields
vLLM's chat completions take, against a local fake that refuses what vLLM refuses (tests/fakes/vllm_server.py)."""
import dataclasses

import pytest

from privseed.tasks.errors import ConfigError, PrivseedError
from privseed.tasks.generation.drivers import generate_seeds
from privseed.tasks.generation.examples import prompt_examples
from privseed.tasks.generation.params import GenerationParams
from privseed.tasks.generation.rounds import candidate_request
from privseed.tasks.llm import KINDS, PromptTemplate, ReleasedVocabulary, make_backend
from privseed.tasks.llm.openai_compat import STATIC_BIAS_PER_STEER, OpenAICompatibleBackend
from privseed.tasks.llm.vllm_backend import VLLMBackend
from tests.fakes.vllm_server import FakeVLLM

VOCAB = ReleasedVocabulary(["river", "village", "church", "stone bridge"], "test")
MODEL = "Qwen/Qwen2.5-7B-Instruct"


@pytest.fixture
def vllm():
    with FakeVLLM(MODEL) as fake:
        yield fake


def review_request(kind: str, steer: float = 4.0, avoid: tuple[str, ...] = ()):
    params = GenerationParams(doc_type="review", max_tokens=40, steer=steer, repeat_penalty=1.1,
                              openings=("I went",))
    return candidate_request(PromptTemplate.load("coverage"), VOCAB.seed(["river", "stone bridge"], 0, 7), params,
                             0, kind, avoid=avoid)


def test_the_kind_describes_itself():
    kind = KINDS["vllm"]
    assert kind.prefill and kind.steering == "logit-bias" and not kind.local_weights and not kind.shared_server
    assert "openings" in kind.summary and kind.writes_text
    # the prompts a local-server run sends, example library included: a served SmolLM2 gets the measured recipe
    assert kind.shows_examples and prompt_examples(None, "library", kind.shows_examples, "Yelp review") == "review"
    assert [name for name, k in KINDS.items() if k.shows_examples] == ["local", "local-server", "vllm"]


def test_an_opening_is_continued_and_the_answer_keeps_it(vllm):
    backend = make_backend(f"vllm:{vllm.base_url}")
    assert isinstance(backend, VLLMBackend) and backend.model == MODEL  # the first of /v1/models
    request = review_request("vllm")
    assert request.answer_prefix == "I went"
    result = backend.complete([request])[0]
    sent = vllm.requests[-1]["body"]
    assert sent["messages"][-1] == {"role": "assistant", "content": "I went"}
    assert sent["continue_final_message"] is True and sent["add_generation_prompt"] is False
    assert result.text.startswith("I went and then a fake document") and result.text.count("I went") == 1


def test_seed_steering_is_a_logit_bias_on_first_tokens_from_vllms_tokenizer(vllm):
    backend = VLLMBackend(vllm.base_url + "/v1", MODEL)
    request = review_request("vllm", avoid=("food", "menu", "deliciously", "river"))
    backend.complete([request])
    sent = vllm.requests[-1]["body"]
    tokenized = [r["body"] for r in vllm.requests if r["path"] == "/tokenize"]
    assert tokenized and all(b["add_special_tokens"] is False and b["model"] == MODEL for b in tokenized)
    bias = sent["logit_bias"]
    push = 4.0 * STATIC_BIAS_PER_STEER
    # the seed terms: the first token of each surface form, the BOS id never
    for form in (" river", "river", " River", " stone bridge", "Stone bridge"):
        assert bias[str(vllm.tokenize(form)[0])] == push
    assert str(vllm.tokenize(" bridge")[0]) not in bias  # a term's later tokens are not pushed
    # the other classes' words: taken down where one token; a longer one and the seed's own term left alone
    assert bias[str(vllm.tokenize(" food")[0])] == -4.0 and bias[str(vllm.tokenize(" Menu")[0])] == -4.0
    assert len(vllm.tokenize(" deliciously")) > 1 and str(vllm.tokenize(" deliciously")[0]) not in bias
    assert bias[str(vllm.tokenize(" river")[0])] == push
    assert sent["repetition_penalty"] == 1.1 and "repeat_penalty" not in sent and "dry_multiplier" not in sent
    backend.complete([request])
    assert len([r for r in vllm.requests if r["path"] == "/tokenize"]) == len(tokenized)  # ids cached per form


def test_a_request_without_opening_or_steering_is_plain_openai(vllm):
    backend = VLLMBackend(vllm.base_url, MODEL)
    plain = dataclasses.replace(review_request("vllm", steer=0.0), answer_prefix="", steering=None)
    assert backend.complete([plain])[0].text.startswith("A fake document")
    sent = vllm.requests[-1]["body"]
    assert not {"continue_final_message", "add_generation_prompt", "logit_bias", "repetition_penalty"} & set(sent)
    assert sent["messages"][-1]["role"] == "user"


def test_the_fake_refuses_what_vllm_refuses(vllm):
    """The checks the tests above rely on: an opening sent as a plain OpenAI client would send it (no
    ``add_generation_prompt`` false) is refused, and so is a bias keyed by a string instead of a token id."""
    opened = review_request("vllm", steer=0.0)
    assert vllm.chat_error({"model": MODEL, "messages": [{"role": "assistant", "content": "I"}],
                            "continue_final_message": True}) is not None
    assert vllm.chat_error({"model": MODEL, "messages": [], "logit_bias": {" river": 3}}) is not None
    backend = VLLMBackend(vllm.base_url, MODEL)
    broken = dataclasses.replace(opened, answer_prefix="I went")
    original = backend.request_body
    backend.request_body = lambda req: {k: v for k, v in original(req).items()  # type: ignore[method-assign]
                                        if k != "add_generation_prompt"}
    with pytest.raises(PrivseedError, match="HTTP 400: Cannot set both `continue_final_message` and "
                                            "`add_generation_prompt` to True"):
        backend.complete([broken])  # the owner reads what the server said


def test_a_bad_url_is_named_for_its_kind():
    with pytest.raises(ConfigError, match="vllm needs an http"):
        make_backend("vllm:gpu-box:8000")


def test_a_plain_openai_compatible_server_gets_no_opening_or_steering(vllm):
    """``openai-compatible:`` is any server: the pipeline gives it neither, and the client refuses an opening."""
    request = review_request("openai-compatible")
    assert request.answer_prefix == "" and request.steering is None
    backend = OpenAICompatibleBackend(vllm.base_url, MODEL)
    assert backend.complete([request])[0].text.startswith("A fake document")


def test_the_pipeline_writes_rows_through_a_vllm_server(vllm, tmp_path):
    """Generation with the kind end to end (class fit off: two classes share the fixture's terms): every row opens
    with one of the kind's openings, and every call carried its steering."""
    seeds = [VOCAB.seed(["river", "church"], 0, 21), VOCAB.seed(["village", "stone bridge"], 1, 22)]
    params = GenerationParams(doc_type="review", max_tokens=40, steer=4.0, openings=("I went", "We"),
                              rewrite_off_class=False)
    rows = generate_seeds(seeds, f"vllm:{vllm.base_url}#{MODEL}", params, str(tmp_path), progress=False)
    assert len(rows) == 2 and rows["backend"].eq("vllm").all() and rows["model"].eq(MODEL).all()
    assert all(text.startswith(("I went and then", "We and then")) for text in rows["text"])
    chats = [r["body"] for r in vllm.requests if r["path"] == "/v1/chat/completions"]
    assert chats and all(c["continue_final_message"] and c["logit_bias"] for c in chats)
