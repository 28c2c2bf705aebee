"""Seed steering (tasks/llm/steering.py) on a toy tokenizer: which logits move, by how much, and when."""
import numpy as np
import pytest

from tasks.llm.steering import SeedSteeringProcessor, surface_forms

# A toy vocabulary: whole words with and without a leading space, plus two pieces of "burrowing".
PIECES = ["<eos>", " the", " a", " river", " River", "river", "River", " burr", " Burr", "burr", "Burr", "owing",
          " flows", " north", " village", " Village", "village", "Village", ".", " of", " arm"]
INDEX = {p: i for i, p in enumerate(PIECES)}


def tokenize(text: str) -> list[int]:
    """Greedy longest-piece tokenizer over PIECES (enough for the forms the processor asks for)."""
    out, i = [], 0
    while i < len(text):
        piece = max((p for p in PIECES[1:] if text.startswith(p, i)), key=len, default=None)
        if piece is None:
            raise ValueError(f"toy tokenizer cannot split {text[i:]!r}")
        out.append(INDEX[piece])
        i += len(piece)
    return out


def detokenize(ids) -> str:
    return "".join(PIECES[i] for i in ids)


def ids(*pieces: str) -> list[int]:
    return [INDEX[p] for p in pieces]


def processor(strength=2.0, terms=("river", "burrowing", "village"), ngram=0, gap=0, schedule="flat",
              max_tokens=None, min_gap=2) -> SeedSteeringProcessor:
    return SeedSteeringProcessor(terms, strength, tokenize, detokenize, eos_ids=[0], no_repeat_ngram=ngram, gap=gap,
                                 schedule=schedule, max_tokens=max_tokens, min_gap=min_gap)


def test_surface_forms():
    assert surface_forms("river") == [" river", "river", " River", "River"]


def test_missing_terms_are_boosted_at_their_first_tokens():
    delta = processor().bonus(ids(" the"), len(PIECES))
    for piece in (" river", " River", "river", "River", " burr", " Burr", " village", " Village"):
        assert delta[INDEX[piece]] == 2.0, piece
    assert delta[INDEX[" flows"]] == 0.0 and delta[INDEX["owing"]] == 0.0  # not a first token: no boost yet
    assert delta[0] == pytest.approx(-2.0)  # end of text: every term still missing


def test_a_started_term_is_continued_and_a_written_one_is_lowered():
    p = processor()
    delta = p.bonus(ids(" the", " river", " flows", " burr"), len(PIECES))
    assert delta[INDEX["owing"]] == 4.0  # finish "burrowing" (2 x strength)
    assert delta[INDEX[" river"]] == -2.0 and delta[INDEX[" River"]] == -2.0  # "river" is written
    assert delta[INDEX[" village"]] == 2.0
    assert delta[0] == pytest.approx(-2.0 * 2 / 3)  # two of three terms still missing ("burr" is not "burrowing")
    done = p.bonus(ids(" river", " burr", "owing", " village", "."), len(PIECES))
    assert done[0] == 0.0 and done[INDEX[" village"]] == -2.0


def test_no_new_term_is_pushed_within_the_gap_after_a_written_one():
    p = processor(gap=3)
    just_written = p.bonus(ids(" the", " river"), len(PIECES))
    assert just_written[INDEX[" village"]] == 0.0 and just_written[INDEX[" river"]] == -2.0  # prose first
    started = p.bonus(ids(" river", " flows", " burr"), len(PIECES))
    assert started[INDEX["owing"]] == 4.0  # a started term is still finished inside the gap
    later = p.bonus(ids(" the", " river", " flows", " north", " of"), len(PIECES))
    assert later[INDEX[" village"]] == 2.0  # three tokens of prose: push the next term again
    assert p.steps_since_last_term(ids(" the", " a"), set()) == 3


def test_zero_strength_changes_nothing_and_the_call_adds_to_the_scores():
    p = processor(strength=0.0)
    assert not p.bonus(ids(" the", " river"), len(PIECES)).any()
    q = processor()
    prompt = np.array(ids(" the", " a"), dtype=np.intc)
    scores = np.zeros(len(PIECES), dtype=np.float32)
    first = q(prompt, scores)  # the first call sees the prompt only: nothing generated yet
    assert first[INDEX[" river"]] == 2.0 and q.prompt_len == 2
    later = q(np.concatenate([prompt, ids(" river")]).astype(np.intc), scores)
    assert later[INDEX[" river"]] == -2.0  # "river" in the prompt does not count as written, in the answer it does


def test_no_repeat_ngram_bans_the_token_that_would_repeat_a_phrase():
    p = processor(strength=0.0, ngram=3)
    generated = ids(" of", " the", " arm", " of", " the")
    delta = p.bonus(generated, len(PIECES))
    assert delta[INDEX[" arm"]] == -np.inf
    assert np.isfinite(np.delete(delta, INDEX[" arm"])).all()


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError):
        processor(strength=-1.0)
    with pytest.raises(ValueError):
        processor(ngram=-1)
    with pytest.raises(ValueError):
        processor(gap=-1)


# -- the "budget" schedule (the default) -------------------------------------------------------------------------
def test_budget_schedule_pushes_as_before_while_the_budget_has_room():
    # Three missing terms need 3 x (gap 2 + 1 token) + 1 (burrowing is 2 tokens) = 10 tokens; 100 are left.
    roomy = processor(gap=2, schedule="budget", max_tokens=101).bonus(ids(" the"), len(PIECES))
    flat = processor(gap=2).bonus(ids(" the"), len(PIECES))
    assert roomy[INDEX[" river"]] == flat[INDEX[" river"]] == 2.0
    assert roomy[INDEX[" village"]] == 2.0 and roomy[INDEX[" flows"]] == 0.0


def test_budget_schedule_pushes_harder_as_the_budget_runs_out():
    p = processor(gap=2, schedule="budget", max_tokens=6)
    # After one token, 5 are left for 10 tokens of need: urgency 2, so the push doubles (to 4) and a started
    # term is finished with twice that.
    late = p.bonus(ids(" the"), len(PIECES))
    assert p.urgency(1, ["river", "burrowing", "village"]) == pytest.approx(10 / 5)
    assert late[INDEX[" river"]] == pytest.approx(4.0) and late[INDEX[" Village"]] == pytest.approx(4.0)
    started = processor(gap=2, schedule="budget", max_tokens=6).bonus(ids(" the", " burr"), len(PIECES))
    # need 3 + 3 + 4 = 10 (burrowing still missing), 4 tokens left: urgency 2.5, continuation 2 x 2 x 2.5
    assert started[INDEX["owing"]] == pytest.approx(10.0)
    assert late[INDEX[" river"]] > processor(gap=2, schedule="budget", max_tokens=50).bonus(
        ids(" the"), len(PIECES))[INDEX[" river"]]


def test_budget_schedule_shrinks_the_gap_when_behind_but_never_below_min_gap():
    generous = processor(gap=6, schedule="budget", max_tokens=1000, min_gap=2)
    written = ids(" river", " flows", " north")  # "river" written two tokens ago
    assert generous.bonus(written, len(PIECES))[INDEX[" village"]] == 0.0  # inside the 6-token gap: prose first
    tight = processor(gap=6, schedule="budget", max_tokens=6, min_gap=2)
    # 3 tokens left for two terms of need 6 + 2 and 6 + 1: urgency 5, gap 6 / 5 -> 1, floored at min_gap 2.
    assert tight.bonus(written, len(PIECES))[INDEX[" village"]] > 0.0
    just = processor(gap=6, schedule="budget", max_tokens=6, min_gap=2).bonus(ids(" the", " river", " flows"),
                                                                             len(PIECES))
    assert just[INDEX[" village"]] == 0.0  # one token after a term: still inside min_gap, no list of terms


def test_budget_schedule_does_not_let_the_answer_end_while_a_term_is_missing():
    p = processor(schedule="budget", max_tokens=200)
    assert p.bonus(ids(" the", " river", " burr", "owing"), len(PIECES))[0] == -np.inf  # "village" missing
    assert p.bonus(ids(" river", " burr", "owing", " village", "."), len(PIECES))[0] == 0.0  # all written: free
    flat = processor().bonus(ids(" the", " river", " burr", "owing"), len(PIECES))
    assert flat[0] == pytest.approx(-2.0 / 3)  # the flat schedule only lowers it by the share missing
    assert processor(strength=0.0, schedule="budget", max_tokens=200).bonus(ids(" the"), len(PIECES))[0] == 0.0


def test_the_memo_follows_a_sequence_that_changes_under_it():
    p = processor(schedule="budget", max_tokens=200)
    assert p.written(ids(" the", " river")) == {"river"}
    assert p.written(ids(" the", " village")) == {"village"}  # a different answer: recomputed, not remembered
    assert p.written(ids(" the")) == set()
    assert p.written(ids(" the", " burr", "owing", " river")) == {"burrowing", "river"}


def test_an_unknown_schedule_or_budget_is_refused():
    with pytest.raises(ValueError, match="schedule"):
        processor(schedule="steep")
    with pytest.raises(ValueError, match="max_tokens"):
        processor(schedule="budget", max_tokens=0)
