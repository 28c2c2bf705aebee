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


def processor(strength=2.0, terms=("river", "burrowing", "village"), ngram=0, gap=0) -> SeedSteeringProcessor:
    return SeedSteeringProcessor(terms, strength, tokenize, detokenize, eos_ids=[0], no_repeat_ngram=ngram, gap=gap)


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
