"""Seed steering (tasks/llm/steering.py) on a toy tokenizer: which logits move, by how much, and when."""
import numpy as np
import pytest

from privseed.tasks.llm.steering import (PREFER_SHARE, SeedSteeringProcessor, avoided_forms, preferred_forms,
                                        surface_forms)

# A toy vocabulary: whole words with and without a leading space, plus two pieces of "burrowing".
PIECES = ["<eos>", " the", " a", " river", " River", "river", "River", " burr", " Burr", "burr", "Burr", "owing",
          " flows", " north", " village", " Village", "village", "Village", ".", " of", " arm", "s", "\n", " (", ","]
PIECES += [" " + p[1:].capitalize() for p in PIECES if p[:1] == " " and p[1:2].islower()]  # " The", " Flows"
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


#: Pieces that would extend the word before them (they begin with a letter or digit).
CONTINUES_WORD = np.array([p[:1].isalnum() for p in PIECES])


def processor(strength=2.0, terms=("river", "burrowing", "village"), ngram=0, gap=0, schedule="flat",
              max_tokens=None, min_gap=2, continues_word=None, end_coverage=1.0, avoid=(),
              prefer=()) -> SeedSteeringProcessor:
    return SeedSteeringProcessor(terms, strength, tokenize, detokenize, eos_ids=[0], no_repeat_ngram=ngram, gap=gap,
                                 schedule=schedule, max_tokens=max_tokens, min_gap=min_gap,
                                 continues_word=continues_word, end_coverage=end_coverage, avoid=avoid, prefer=prefer)


def test_surface_forms():
    assert surface_forms("river") == [" river", "river", " River", "River"]


def test_missing_terms_are_boosted_at_their_first_tokens():
    delta = processor().bonus(ids(" the"), len(PIECES))
    for piece in (" river", " River", " burr", " Burr", " village", " Village"):
        assert delta[INDEX[piece]] == 2.0, piece
    for piece in ("river", "River", "burr", "village"):  # after "the" they would glue on: "theriver"
        assert delta[INDEX[piece]] == 0.0, piece
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
    doubled = [INDEX[" the"], INDEX[" The"]]  # "the the": the last word again
    assert (delta[doubled] == -np.inf).all()
    assert np.isfinite(np.delete(delta, [INDEX[" arm"], *doubled])).all()


def test_words_of_another_class_are_taken_down_whole_words_at_once_longer_ones_at_their_last_token():
    """" flows" and " Flows" are one token each: down by s at every step. "burrowing" is " burr" + "owing": " burr"
    begins other words too, so only "owing" right after it goes down. A word that is one of the seed's own terms
    ("village") is never avoided."""
    p = processor(terms=("river",), avoid=("flows", "burrowing", "Village"))
    delta = p.bonus(ids(" the"), len(PIECES))
    assert delta[INDEX[" flows"]] == -2.0 and delta[INDEX[" Flows"]] == -2.0
    assert delta[INDEX[" burr"]] == 0.0 and delta[INDEX["owing"]] == 0.0
    assert delta[INDEX[" Village"]] == -2.0 and delta[INDEX[" village"]] == 0.0  # the word as given, and capitalised
    after = p.bonus(ids(" the", " burr"), len(PIECES))
    assert after[INDEX["owing"]] == -2.0 and after[INDEX[" flows"]] == -2.0
    own = processor(terms=("river", "village"), avoid=("village", "flows")).bonus(ids(" the"), len(PIECES))
    assert own[INDEX[" village"]] == 2.0 and own[INDEX[" flows"]] == -2.0  # a seed term is pushed, not avoided
    assert (processor(strength=0.0, avoid=("flows",)).bonus(ids(" the"), len(PIECES)) == 0).all()  # off with s
    assert avoided_forms(("flows", "Village", " ", "flows"), ("village",)) == [" flows", " Flows"]


def test_words_of_the_own_class_are_pushed_by_half_the_strength_after_the_first_sentence_until_written():
    """" north" and " North" are one token each: up by s/2 from the end of the answer's first sentence until "north"
    is written, then left alone. "burrowing" is two tokens and is not pushed (its " burr" begins other words); a seed
    term ("village") keeps the term's push."""
    assert PREFER_SHARE == 0.5
    p = processor(terms=("river",), prefer=("north", "burrowing", "village"))
    first = p.bonus(ids(" the"), len(PIECES))
    assert first[INDEX[" north"]] == 0.0 and first[INDEX[" village"]] == 0.0  # the first sentence is the model's
    delta = p.bonus(ids(" the", " river", ".", " the"), len(PIECES))
    assert delta[INDEX[" north"]] == 1.0 and delta[INDEX[" North"]] == 1.0
    assert delta[INDEX[" burr"]] == 0.0 and delta[INDEX["owing"]] == 0.0
    assert delta[INDEX[" village"]] == 1.0  # not a term of this seed: preferred
    written = p.bonus(ids(" the", ".", " North", " of", " the"), len(PIECES))
    assert written[INDEX[" north"]] == 0.0 and written[INDEX[" North"]] == 0.0  # written once: no more push
    sentence = ids(" the", ".", " the")
    own = processor(terms=("river", "village"), prefer=("village", "north")).bonus(sentence, len(PIECES))
    assert own[INDEX[" village"]] == 2.0 and own[INDEX[" north"]] == 1.0  # the term's push, not the preferred one
    after = processor(terms=("river",), avoid=("north",), prefer=("north",)).bonus(sentence, len(PIECES))
    assert after[INDEX[" north"]] == -2.0  # a word to avoid stays avoided
    assert (processor(strength=0.0, prefer=("north",)).bonus(sentence, len(PIECES)) == 0).all()  # off with s
    assert preferred_forms(("north", "Village", " ", "north"), ("village",)) == {" north": "north", " North": "north"}


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError):
        processor(strength=-1.0)
    with pytest.raises(ValueError):
        processor(ngram=-1)
    with pytest.raises(ValueError):
        processor(gap=-1)


# -- the "budget" schedule (the default) -------------------------------------------------------------------------
def test_budget_schedule_pushes_as_before_while_on_pace():
    # max_tokens 101: the tail keeps max(8, 10) tokens, 91 are paced. At the start every term is missing and
    # the whole budget is left (urgency 1); after "river" at token 1 the model is ahead (2/3 missing, 90/91 left).
    p = processor(gap=0, schedule="budget", max_tokens=101)
    start = p.bonus(ids(), len(PIECES))
    assert p.paced_tokens == 91 and p.urgency(0, ["river", "burrowing", "village"]) == pytest.approx(1.0)
    assert start[INDEX[" river"]] == processor(gap=0).bonus(ids(), len(PIECES))[INDEX[" river"]] == 2.0
    ahead = p.bonus(ids(" river"), len(PIECES))
    assert p.urgency(1, ["burrowing", "village"]) == pytest.approx((2 / 3) / (90 / 91))
    assert ahead[INDEX[" village"]] == 2.0 and ahead[INDEX[" flows"]] == 0.0


def test_budget_schedule_pushes_harder_when_behind_pace():
    # max_tokens 28: tail max(8, 3) = 8, 20 paced. Ten tokens in with every term missing: half the terms'
    # budget is gone and none is written, urgency (3/3) / (10/20) = 2, so the push doubles (to 4) and a started
    # term is finished with twice that.
    p = processor(gap=0, schedule="budget", max_tokens=28)
    behind = p.bonus(ids(" the", " a") * 5, len(PIECES))
    assert behind[INDEX[" river"]] == pytest.approx(4.0) and behind[INDEX[" Village"]] == pytest.approx(4.0)
    started = processor(gap=0, schedule="budget", max_tokens=28).bonus(ids(" the", " a") * 4 + ids(" the", " burr"),
                                                                       len(PIECES))
    assert started[INDEX["owing"]] == pytest.approx(8.0)  # "burrowing" is not written yet: urgency still 2
    roomy = processor(gap=0, schedule="budget", max_tokens=1000).bonus(ids(" the", " a") * 5, len(PIECES))
    assert behind[INDEX[" river"]] > roomy[INDEX[" river"]] > 2.0  # a larger budget: barely behind pace
    past = processor(gap=0, schedule="budget", max_tokens=28).bonus(ids(" the", " a") * 11, len(PIECES))
    assert past[INDEX[" river"]] == pytest.approx(2.0 * 20)  # in the tail: one paced token counts as left


def test_budget_schedule_shrinks_the_gap_when_behind_but_never_below_min_gap():
    prose = ids(" the", " a") * 7 + ids(" river", " flows")  # "river" written one token ago, at token 15
    tight = processor(gap=6, schedule="budget", max_tokens=28, min_gap=2)
    # 16 of 20 paced tokens gone, 2 of 3 terms missing: urgency (2/3) / (4/20) = 3.3, gap 6 / 3.3 -> 1, floored at 2
    assert tight.bonus(prose, len(PIECES))[INDEX[" village"]] == 0.0  # one token after a term: no list of terms
    later = tight.bonus(prose + ids(" north"), len(PIECES))
    assert later[INDEX[" village"]] == pytest.approx(2.0 * (2 / 3) / (3 / 20))  # two tokens after: pushed, harder
    generous = processor(gap=6, schedule="budget", max_tokens=1000, min_gap=2)
    assert generous.bonus(prose + ids(" north"), len(PIECES))[INDEX[" village"]] == 0.0  # on pace: the full gap


def test_budget_schedule_does_not_let_the_answer_end_while_a_term_is_missing():
    p = processor(schedule="budget", max_tokens=200)
    assert p.bonus(ids(" the", " river", " burr", "owing"), len(PIECES))[0] == -np.inf  # "village" missing
    assert p.bonus(ids(" river", " burr", "owing", " village", "."), len(PIECES))[0] == 0.0  # all written: free
    flat = processor().bonus(ids(" the", " river", " burr", "owing"), len(PIECES))
    assert flat[0] == pytest.approx(-2.0 / 3)  # the flat schedule only lowers it by the share missing
    assert processor(strength=0.0, schedule="budget", max_tokens=200).bonus(ids(" the"), len(PIECES))[0] == 0.0


def test_budget_schedule_lets_the_answer_end_once_the_end_coverage_is_written():
    # Two of three terms written: at 0.6 one may stay out, so the answer may end; the missing term is still pushed.
    two_of_three = ids(" the", " river", " burr", "owing")
    loose = processor(schedule="budget", max_tokens=200, end_coverage=0.6).bonus(two_of_three, len(PIECES))
    assert loose[0] == 0.0 and loose[INDEX[" village"]] > 0
    assert processor(schedule="budget", max_tokens=200, end_coverage=0.6).bonus(ids(" the", " river"),
                                                                                len(PIECES))[0] == -np.inf
    assert processor(schedule="budget", max_tokens=200, end_coverage=0.7).bonus(two_of_three,
                                                                                len(PIECES))[0] == -np.inf
    with pytest.raises(ValueError, match="end_coverage"):
        processor(schedule="budget", max_tokens=200, end_coverage=1.5)


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
    with pytest.raises(ValueError, match="tail"):
        SeedSteeringProcessor(["river"], 2.0, tokenize, detokenize, max_tokens=10, tail=1.0)


def test_budget_schedule_closes_a_term_it_has_just_finished():
    p = processor(schedule="budget", max_tokens=200, continues_word=CONTINUES_WORD)
    closed = p.bonus(ids(" the", " river"), len(PIECES))
    # "rivers" would no longer be the term "river": every piece that glues onto the word is banned, right then
    assert closed[INDEX["s"]] == -np.inf and closed[INDEX["owing"]] == -np.inf and closed[INDEX["river"]] == -np.inf
    assert closed[INDEX[" flows"]] == 0.0 and closed[INDEX["."]] == 0.0 and closed[INDEX[" village"]] == 2.0
    finished = p.bonus(ids(" the", " burr", "owing"), len(PIECES))  # a two-token term, finished
    assert finished[INDEX["s"]] == -np.inf
    assert p.bonus(ids(" the", " river", " flows"), len(PIECES))[INDEX["s"]] == 0.0  # a word later: free again
    assert p.bonus(ids(" the", " burr"), len(PIECES))[INDEX["owing"]] >= 4.0  # started, not finished: continued
    flat = processor(continues_word=CONTINUES_WORD).bonus(ids(" the", " river"), len(PIECES))
    assert flat[INDEX["s"]] == 0.0  # the flat schedule does not close terms
    unknown = processor(schedule="budget", max_tokens=200).bonus(ids(" the", " river"), len(PIECES))
    assert unknown[INDEX["s"]] == 0.0  # no word-continuation flags from the model: nothing is closed
    q = processor(schedule="budget", max_tokens=200, continues_word=CONTINUES_WORD)
    prompt = np.array(ids(" the"), dtype=np.intc)
    q(prompt, np.zeros(len(PIECES), dtype=np.float32))
    out = q(np.concatenate([prompt, ids(" village")]).astype(np.intc), np.zeros(len(PIECES), dtype=np.float32))
    assert out[INDEX["s"]] == -np.inf  # the logits processor applies the closing too


def test_a_form_without_a_space_is_pushed_only_where_a_word_begins():
    """The demo's "... the most celebrated musicianelecelec elec.": the term's bare form was pushed straight after
    a word, glued on, did not count as written, and was pushed again."""
    p = processor()
    at_start = p.bonus([], len(PIECES))
    assert at_start[INDEX["river"]] == 2.0 and at_start[INDEX["River"]] == 2.0  # the answer's first word
    after_stop = p.bonus(ids(" the", " river", "."), len(PIECES))
    assert after_stop[INDEX["Village"]] == 0.0 and after_stop[INDEX[" Village"]] == 2.0  # not "river.Village"
    for opener in ("\n", " ("):
        assert p.bonus(ids(" the", " river", ".", opener), len(PIECES))[INDEX["Village"]] == 2.0
    after_word = p.bonus(ids(" the", " arm"), len(PIECES))
    assert after_word[INDEX["village"]] == 0.0 and after_word[INDEX[" village"]] == 2.0
    # A bare start glued onto a word is not a started term: its rest is not pushed either ("armburr" + "owing").
    glued = p.bonus(ids(" arm", "burr"), len(PIECES))
    assert glued[INDEX["owing"]] == 0.0
    started = p.bonus(ids(" arm", ".", "\n", "Burr"), len(PIECES))
    assert started[INDEX["owing"]] == 4.0


def test_the_last_word_is_not_written_again_right_after_it_or_after_a_comma():
    """The demo's "the Yangtze Yangtze", "Khorasan, Khorasan Province": an n-gram ban of four tokens lets a word
    of one or two tokens be doubled."""
    p = processor(strength=0.0, ngram=4)
    doubled = p.bonus(ids(" the", " village"), len(PIECES))
    assert doubled[INDEX[" village"]] == -np.inf and doubled[INDEX[" Village"]] == -np.inf
    assert doubled[INDEX[" river"]] == 0.0 and doubled[INDEX[","]] == 0.0
    after_comma = p.bonus(ids(" the", " village", ","), len(PIECES))
    assert after_comma[INDEX[" village"]] == -np.inf and after_comma[INDEX[" Village"]] == -np.inf
    later = p.bonus(ids(" the", " village", ".", " the"), len(PIECES))
    assert later[INDEX[" village"]] == 0.0  # a sentence later the word may come back
    # Without the n-gram ban, nothing is banned.
    assert not processor(strength=0.0).bonus(ids(" the", " village"), len(PIECES)).any()


def test_after_a_whole_word_opening_the_answer_goes_on_after_a_space():
    """An answer opened with its subject ("Season") goes on with a token that begins with a space: not glued onto
    the word ("Seasoned") nor made a topic label ("Iraq, the ..."); from the second token on nothing more is banned,
    and without the flag (or without the tokens' flags) the first token is free."""
    space_led = np.array([p[:1] == " " for p in PIECES])
    p = SeedSteeringProcessor(("river",), 2.0, tokenize, detokenize, eos_ids=[0], schedule="budget", max_tokens=50,
                              continues_word=CONTINUES_WORD, space_led=space_led, whole_opening=True)
    first = p.bonus([], len(PIECES))
    assert all(first[INDEX[piece]] == -np.inf for piece in (",", ".", "s", "owing", "river", "\n"))
    assert all(np.isfinite(first[INDEX[piece]]) for piece in (" of", " river", " (", " the"))
    assert not np.isneginf(p.bonus(ids(" of"), len(PIECES))[INDEX[","]])
    free = SeedSteeringProcessor(("river",), 2.0, tokenize, detokenize, eos_ids=[0], schedule="budget", max_tokens=50,
                                 continues_word=CONTINUES_WORD, space_led=space_led)
    assert not np.isneginf(free.bonus([], len(PIECES))[INDEX[","]])
    assert not np.isneginf(SeedSteeringProcessor(("river",), 2.0, tokenize, detokenize, whole_opening=True)
                           .bonus([], len(PIECES))[INDEX[","]])
