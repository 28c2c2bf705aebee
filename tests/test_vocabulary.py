"""Public vocabularies, phrase extraction and the DP vocabulary histogram."""

import numpy as np
import pytest

from privseed.tasks.errors import ConfigError
from privseed.tasks.seeds.vocabulary import (PhraseMatcher, Vocabulary, english_vocabulary, file_vocabulary,
                                             first_terms_histogram, privatize_vocabulary, tokenize, top_terms,
                                             vocabulary_mechanism, withheld_terms)
from privseed.tasks.dp.mechanisms import secure_noise
from tests.noise_checks import assert_noise_is


def test_tokenize_lowercases_and_splits_on_punctuation():
    assert tokenize("Congestive Heart-Failure, (CHF) in 2019's_notes") == [
        "congestive", "heart", "failure", "chf", "in", "2019", "s", "notes"]


def _vocab(*terms: str) -> Vocabulary:
    return Vocabulary.from_terms("t", terms)


def test_greedy_longest_match_left_to_right():
    v = _vocab("new", "new york", "new york city", "york", "city hall", "hall")
    m = PhraseMatcher(v)

    def names(text):
        return [v.terms[i] for i in m.match(text)]

    assert names("New York City Hall") == ["new york city", "hall"]  # longest first consumes "city"
    assert names("new york hall") == ["new york", "hall"]
    assert names("york city hall") == ["york", "city hall"]
    assert names("the new yorker in new york") == ["new", "new york"]  # "yorker" is not "york"
    assert names("nothing here") == []


def test_overlapping_terms_and_reading_order_with_repeats():
    v = _vocab("heart failure", "congestive heart failure", "failure", "heart", "chronic kidney disease", "kidney")
    m = PhraseMatcher(v)
    text = "Chronic kidney disease and congestive heart failure; heart failure again, kidney."
    assert [v.terms[i] for i in m.match(text)] == [
        "chronic kidney disease", "congestive heart failure", "heart failure", "kidney"]
    # a longer candidate that fails part-way falls back to the longest shorter one
    assert [v.terms[i] for i in m.match("congestive heart")] == ["heart"]
    assert m.extract(["heart", "heart heart"]) == [[v.keys.index(("heart",))], [v.keys.index(("heart",))] * 2]


def test_vocabulary_deduplicates_by_tokens_and_rejects_empty():
    v = _vocab("Heart Failure", "heart  failure", "heart-failure", "", "  ")
    assert v.terms == ("heart failure",)
    with pytest.raises(ConfigError):
        _vocab("", "!!")


def test_english_vocabulary_is_filtered_cut_and_cached():
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    v = english_vocabulary(5000)
    assert v is english_vocabulary(5000)
    assert 4000 < len(v) <= 5000
    assert all(t.isalpha() for t in v.terms)
    assert not set(v.terms) & set(ENGLISH_STOP_WORDS)
    assert "school" in v.terms and "the" not in v.terms
    assert len(english_vocabulary(20000)) > len(v)


def test_english_vocabulary_withholds_slurs_and_keeps_words_with_an_everyday_sense():
    """Noise lifts words no document holds into the seeds, so V itself must not hold a slur: the withheld list
    reaches into wordfreq's cut (the filter is not vacuous), and none of it is left in V at any cut."""
    import wordfreq

    withheld = withheld_terms()
    top = set(wordfreq.top_n_list("en", 50_000, wordlist="large"))
    assert len(withheld & top) >= 50
    assert all(w == w.strip().lower() and w.isalpha() for w in withheld)
    for cut in (5000, 50_000, 100_000):
        assert not withheld & set(english_vocabulary(cut).terms)
    # words with an everyday other sense stay, and so does what medical and encyclopedia corpora hold
    kept = {"cock", "pussy", "bitch", "dyke", "retard", "sex", "nude", "porn", "gay", "breast", "vagina", "penis"}
    assert kept <= set(english_vocabulary(50_000).terms)


def test_file_vocabulary_multiword(tmp_path):
    p = tmp_path / "terms.txt"
    p.write_text("# comment\ncongestive heart failure\n\natrial fibrillation\nheart\n", encoding="utf-8")
    v = file_vocabulary(str(p))
    assert v.terms == ("congestive heart failure", "atrial fibrillation", "heart")
    assert [v.terms[i] for i in PhraseMatcher(v).match("Atrial fibrillation with congestive heart failure")] == [
        "atrial fibrillation", "congestive heart failure"]
    with pytest.raises(ConfigError):
        file_vocabulary(str(tmp_path / "missing.txt"))


def test_histogram_counts_first_s_terms_and_is_additive():
    seqs = [[0, 1, 1, 2, 3], [3, 3], [], [4, 0, 0, 0]]
    h = first_terms_histogram(seqs, 6, max_terms_per_doc=3)
    assert h.tolist() == [1 + 1 + 1, 2, 0, 2, 1, 0]
    assert h.sum() <= 3 * len(seqs)
    np.testing.assert_array_equal(
        first_terms_histogram(seqs[:2], 6, 3) + first_terms_histogram(seqs[2:], 6, 3), h)


def test_laplace_noise_on_every_term_has_scale_s_over_eps():
    counts = np.zeros(5000, dtype=np.int64)
    # 200 is 40 noise scales: a counted term drops below the ~24 that the 20th-largest of 4,990 zero terms'
    # noise reaches with probability e^-35 (at 50 this test failed about once in 40 runs)
    counts[:10] = 200
    s, eps = 10, 2.0
    mech = vocabulary_mechanism(eps, s)
    assert (mech.sensitivity, mech.scale) == (10, 5.0)
    r = privatize_vocabulary(counts, mechanism=mech, noise=secure_noise(), top_n=len(counts))
    noise = r["noisy"] - counts  # the full released histogram: noise on every term, zero counts included
    assert r["noisy"].dtype == np.int64
    assert_noise_is(noise, "discrete-laplace", s / eps)  # and the same draws refute half or twice the scale
    # noisy counts come out sorted and zero-count terms can be selected
    np.testing.assert_array_equal(r["noisy_counts"], r["noisy"][r["term_ids"]])
    assert np.all(np.diff(r["noisy_counts"]) <= 0)
    small = privatize_vocabulary(counts, mechanism=mech, noise=secure_noise(), top_n=30)
    assert (counts[small["term_ids"]] == 0).sum() == 20


def test_top_terms_breaks_ties_by_term_id():
    r = top_terms(np.array([3, 7, 3, 7, 1]), 3)
    assert r["term_ids"].tolist() == [1, 3, 0] and r["noisy_counts"].tolist() == [7, 7, 3]


def test_privatize_rejects_bad_budget_and_public_randomness():
    with pytest.raises(ConfigError):
        vocabulary_mechanism(0.0, 10)
    with pytest.raises(ConfigError):
        privatize_vocabulary(np.zeros(3, dtype=np.int64), mechanism=vocabulary_mechanism(1.0, 10),
                             noise=secure_noise(), top_n=0)
    with pytest.raises(TypeError, match="public randomness"):
        privatize_vocabulary(np.zeros(3, dtype=np.int64), mechanism=vocabulary_mechanism(1.0, 10),
                             noise=np.random.default_rng(0), top_n=2)


# ------------------------------------------------------------------ early-stopping extraction
def _first_agrees(matcher: PhraseMatcher, texts, counts=(1, 3, 10, 40)) -> None:
    """``first_matches`` finds exactly the ids the full extraction's first ones are, in every mode."""
    from privseed.tasks.seeds.histogram_seeds import first_distinct_terms

    for text in texts:
        full = matcher.match(text)
        allowed = set(full[::3])  # an arbitrary subset of the document's own terms
        for count in counts:
            assert matcher.first_matches(text, count) == full[:count], text[:80]
            assert matcher.first_matches(text, count, distinct=True) == first_distinct_terms(full, count)
            assert (matcher.first_matches(text, count, distinct=True, allowed=allowed)
                    == first_distinct_terms(full, count, allowed))


def test_first_matches_agree_with_the_full_extraction_across_chunk_cuts():
    v = _vocab("new", "new york", "new york city", "york", "city hall", "hall", "a b c d e f g h")
    m = PhraseMatcher(v)
    filler = "x" * 250  # the first chunk (256 characters) ends inside or between the words that follow
    texts = [f"{filler} new york city hall", f"{filler}ab new york city", f"{filler}abcd new york",
             f"{filler[:-3]} new york city hall", "new " * 200 + "york", "y" * 3000 + " new york city",
             "a b c d e f g h " * 40, " ".join(["a b c d e f g"] * 60) + " h", "NEW YORK" + "İ" * 300 + " hall",
             "", "   ", "new"]
    _first_agrees(m, texts, counts=(1, 2, 5, 100))
    with pytest.raises(ConfigError):
        m.first_matches("new york", 0)


@pytest.mark.parametrize("corpus,vocab", [("dbpedia14/train.parquet", "english"),
                                          ("ohsumed23/train.parquet", "vocab/medical_terms.txt")])
def test_first_matches_agree_with_the_full_extraction_on_real_documents(corpus, vocab):
    """Real documents of the public corpora (docs/datasets.md): English words on DBPedia-14, and multi-word medical
    terms (up to 22 tokens, so a candidate often reaches past a chunk cut) on OHSUMED abstracts."""
    import pandas as pd

    from privseed.tasks.seeds.vocabulary import load_vocabulary
    from tests.conftest import DATA_ROOT

    if not (DATA_ROOT / corpus).exists():
        pytest.skip("the public corpora are not under $PRIVSEED_DATA_ROOT (docs/datasets.md)")
    texts = pd.read_parquet(DATA_ROOT / corpus, columns=["text"])["text"].tolist()[:1500]
    vocabulary = load_vocabulary("english" if vocab == "english" else str(DATA_ROOT / vocab))
    _first_agrees(PhraseMatcher(vocabulary), texts)
