"""Release gate: a good corpus passes; each kind of bad corpus fails on exactly the expectations that name it."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from privseed.tasks.errors import ConfigError
from privseed.tasks.quality import (DEFAULT_RULES, REJECTION_REASONS, DocumentRules, derive_quality_columns,
                                    document_rejection, example_names, is_document, is_keyphrase_passthrough,
                                    release_gate, rewrite_score, template_residue, validate_release,
                                    validate_release_task)
from privseed.tasks.quality.patterns import PATTERNS_FILE, document_preamble
from privseed.tasks.quality.shapes import doubled_phrase, short_item_run

LABELS = ["business", "science", "sports"]
TOPICS = {
    "business": ["quarterly earnings", "merger talks", "retail sales", "interest rates"],
    "science": ["telescope images", "protein folding", "climate model", "gene editing"],
    "sports": ["final whistle", "league table", "transfer window", "grand slam"],
}


def good_corpus(rows_per_class: int = 8) -> pd.DataFrame:
    rows = []
    for label, phrases in TOPICS.items():
        for i in range(rows_per_class):
            keyphrases = [phrases[i % 4], phrases[(i + 1) % 4], f"item {i}"]
            text = (f"Report {i} on {label}: analysts discussed {keyphrases[0]} and {keyphrases[1]} "
                    f"while {keyphrases[2]} drew attention across the region this week.")
            rows.append({"text": text, "label": label, "keyphrases": keyphrases})
    return pd.DataFrame(rows)


def with_rows(df: pd.DataFrame, index: int | slice, column: str, values) -> pd.DataFrame:
    bad = df.copy()
    bad[column] = bad[column].astype(object)
    positions = range(len(bad))[index] if isinstance(index, slice) else [index]
    for pos in positions:
        bad.at[pos, column] = values(pos) if callable(values) else values
    return bad


def run_gate(df: pd.DataFrame, llm_used: bool = True, **bounds) -> dict:
    result = validate_release(df, labels=LABELS, llm_used=llm_used, **bounds)
    json.dumps(result, allow_nan=False)  # stored as quality.json: must be strict JSON
    return result


def test_good_corpus_passes_every_expectation():
    result = run_gate(good_corpus())
    assert result["success"] is True
    assert result["failed"] == []
    names = {e["name"] for e in result["expectations"]}
    assert {"schema:required columns", "type:text is str", "type:keyphrases is list[str]", "text:not null",
            "text:not empty", "text:word count within bounds", "label:in declared set",
            "label:every class present", "text:duplicate rate under bound",
            "text:no prompt or template residue"} <= names
    assert {f"document:no {reason}" for reason in REJECTION_REASONS[4:]} <= names
    assert all(e["success"] for e in result["expectations"])


def test_good_corpus_read_back_from_parquet_passes():
    # Parquet gives keyphrases back as numpy arrays and text as pandas' string dtype.
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(good_corpus(), preserve_index=False), buffer)
    df = pq.read_table(io.BytesIO(buffer.getvalue())).to_pandas()
    assert isinstance(df["keyphrases"].iloc[0], np.ndarray)
    assert run_gate(df)["success"] is True


def test_int_labels_pass_against_int_label_set():
    df = good_corpus()
    df["label"] = df["label"].map({name: i for i, name in enumerate(LABELS)}).astype("int64")
    assert validate_release(df, labels=[0, 1, 2], llm_used=True)["success"] is True


BAD_CASES = {
    # name: (corrupt the good corpus, expectations that must fail, others allowed to fail with them)
    "missing keyphrases column": (lambda df: df.drop(columns=["keyphrases"]),
                                  {"schema:required columns", "type:keyphrases is list[str]"}, set()),
    "text is not a string": (lambda df: with_rows(df, 3, "text", 12345),
                             {"type:text is str"}, {"text:not null"}),
    "keyphrases is a plain string": (lambda df: with_rows(df, 0, "keyphrases", "a, b, c"),
                                     {"type:keyphrases is list[str]"}, set()),
    "null text": (lambda df: with_rows(df, 5, "text", None), {"text:not null", "type:text is str"}, set()),
    "blank text": (lambda df: with_rows(df, 5, "text", "   \n "),
                   {"text:not empty", "text:word count within bounds"}, {"text:duplicate rate under bound"}),
    "too short": (lambda df: with_rows(df, 2, "text", "Too short."), {"text:word count within bounds"}, set()),
    "too long": (lambda df: with_rows(df, 2, "text", " ".join(["word"] * 2500)),
                 {"text:word count within bounds"}, set()),
    "label outside the declared set": (lambda df: with_rows(df, 1, "label", "politics"),
                                       {"label:in declared set"}, set()),
    "a class is missing": (lambda df: df[df["label"] != "science"].reset_index(drop=True),
                           {"label:every class present"}, set()),
    "too many duplicates": (lambda df: with_rows(df, slice(0, 4), "text", lambda i: df.at[10, "text"].upper()),
                            {"text:duplicate rate under bound"}, set()),
    "prompt echo: contains the following terms": (
        lambda df: with_rows(df, 7, "text", "Here is a business report that contains the following terms: "
                                            "merger talks, retail sales."),
        {"text:no prompt or template residue"}, set()),
    "prompt echo: Write a": (lambda df: with_rows(df, 7, "text", "Write a news article about the league table "
                                                                 "and the transfer window please."),
                             {"text:no prompt or template residue"}, set()),
    "chat token <|im_start|>": (lambda df: with_rows(df, 8, "text", "<|im_start|>assistant The league table "
                                                                    "changed after the final whistle today."),
                                {"text:no prompt or template residue"}, set()),
    "chat token <|assistant|>": (lambda df: with_rows(df, 9, "text", "The telescope images arrived late. "
                                                                     "<|assistant|> More on protein folding."),
                                 {"text:no prompt or template residue"}, set()),
    "keyphrase list passed through": (
        lambda df: with_rows(df, slice(0, 3), "text", lambda i: ", ".join(df.at[i, "keyphrases"]) + ", "
                             + " ".join(reversed(df.at[i, "keyphrases"]))),
        {"document:no seed_echo"}, set()),
    "assistant meta-talk": (lambda df: with_rows(df, 4, "text", "I'm an AI assistant designed to help with "
                                                                "Wikipedia articles and reports."),
                            {"document:no meta_talk"}, set()),
    "a loop to the token limit": (lambda df: with_rows(df, 6, "text", "The league table, " + "league, " * 40),
                                  {"document:no repetition_loop"}, set()),
    "truncated at the token limit": (
        lambda df: with_rows(df.assign(finish_reason="stop"), 11, "finish_reason", "length")
        .pipe(lambda d: with_rows(d, 11, "text", "Analysts discussed the grand slam and the league table while")),
        {"document:no truncated"}, set()),
    "empty corpus": (lambda df: df.iloc[0:0], {"rows:at least min_rows", "label:every class present"},
                     {"text:duplicate rate under bound"}),  # a unique-value proportion of 0 rows is undefined
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_each_kind_of_bad_corpus_is_rejected_by_name(case):
    corrupt, must_fail, may_fail = BAD_CASES[case]
    result = run_gate(corrupt(good_corpus()))
    assert result["success"] is False
    failed = set(result["failed"])
    assert must_fail <= failed, f"{case}: expected {must_fail} among failed {failed}"
    assert failed <= must_fail | may_fail, f"{case}: unrelated expectations failed: {failed - must_fail - may_fail}"
    for entry in result["expectations"]:
        assert entry["success"] is (entry["name"] not in failed)


@pytest.mark.parametrize("case", ["good corpus", *sorted(BAD_CASES)])
def test_a_corpus_gated_in_parts_gets_the_verdict_of_the_whole(case):
    """Generation shards gate their own parts and the driver combines the checks: the combination must be GX's
    verdict on the whole corpus, expectation by expectation, counts and examples included, also when the
    duplicates, the classes or the bad rows are spread over different parts."""
    df = good_corpus() if case == "good corpus" else BAD_CASES[case][0](good_corpus())
    gate = release_gate(labels=LABELS, llm_used=True)
    whole = gate.check_part(df)
    combined = gate.combine([whole])
    for gx_record, entry in zip(whole.expectations, combined["expectations"]):  # GX's own result on the whole
        assert entry["success"] is gx_record["success"], entry["name"]
        if gx_record["expectation"] != "expect_table_columns_to_match_set" and "observed_value" in gx_record:
            assert entry["details"]["observed_value"] == pytest.approx(gx_record["observed_value"])
        for count in ("element_count", "unexpected_count", "missing_count"):
            if count in gx_record and count in entry["details"]:
                assert entry["details"][count] == gx_record[count], (entry["name"], count)
    n = len(df)
    cuts = [0, min(5, n), min(13, n), n]
    parts = [gate.check_part(df.iloc[a:b].reset_index(drop=True)) for a, b in zip(cuts, cuts[1:])]
    assert gate.combine(parts) == {**combined, "parts": 3}


def test_a_gate_does_not_combine_checks_of_another_suite():
    part = release_gate(labels=LABELS, llm_used=True).check_part(good_corpus())
    other = release_gate(labels=LABELS, llm_used=False).check_part(good_corpus())
    with pytest.raises(ConfigError, match="different release-gate suites"):
        release_gate(labels=LABELS, llm_used=True).combine([part, other])
    assert release_gate(labels=LABELS, llm_used=True) == release_gate(labels=list(LABELS), llm_used=True)


def test_failed_expectations_carry_details():
    result = run_gate(good_corpus().pipe(lambda df: df[df["label"] != "sports"].reset_index(drop=True)))
    present = next(e for e in result["expectations"] if e["name"] == "label:every class present")
    assert present["details"]["missing"] == ["sports"]
    dropped = run_gate(good_corpus().drop(columns=["keyphrases"]))
    schema = next(e for e in dropped["expectations"] if e["name"] == "schema:required columns")
    assert schema["details"] == {"missing_columns": ["keyphrases"]}


def test_passthrough_is_the_expected_output_without_an_llm():
    df = good_corpus()
    df["text"] = [" ".join(k) + " and more words here" for k in df["keyphrases"]]
    df.loc[:2, "text"] = [" ".join(k) for k in df.loc[:2, "keyphrases"]]
    assert "document:no seed_echo" in run_gate(df, llm_used=True, min_words=1)["failed"]
    assert run_gate(df, llm_used=False, min_words=1)["success"] is True


def test_bounds_move_the_thresholds():
    df = with_rows(good_corpus(), slice(0, 2), "text", lambda i: good_corpus().at[20, "text"])  # 2 of 24 repeat
    assert "text:duplicate rate under bound" in run_gate(df, max_duplicate_rate=0.05)["failed"]
    assert run_gate(df, max_duplicate_rate=0.10)["success"] is True


def test_bad_bounds_are_config_errors():
    with pytest.raises(ConfigError, match="unknown release-gate bound"):
        validate_release(good_corpus(), labels=LABELS, llm_used=True, max_dupes=0.1)
    with pytest.raises(ConfigError, match="max_duplicate_rate"):
        release_gate(labels=LABELS, llm_used=True, max_duplicate_rate=1.5)
    with pytest.raises(ConfigError, match="label set"):
        validate_release(good_corpus(), labels=[], llm_used=True)


def test_release_gate_callable_and_prefect_task_body():
    gate = release_gate(labels=LABELS, llm_used=True, max_words=30)
    assert gate(good_corpus())["success"] is True
    assert gate(with_rows(good_corpus(), 0, "text", " ".join(["long"] * 40)))["failed"] == [
        "text:word count within bounds"]
    result = validate_release_task.fn(good_corpus(), LABELS, True, {"min_rows": 100})
    assert result["failed"] == ["rows:at least min_rows"]


def test_pure_helpers():
    assert template_residue("A calm report on retail sales.") is None
    assert template_residue("Sure. Write an essay on it") is None  # "Write a" only counts as an opening
    assert template_residue("  Write an article on x") == "prompt:write a"
    assert template_residue("text <|eot_id|>") == "chat:<|...|> token"
    assert template_residue("[INST] do it [/INST] ok") == "chat:[INST]"
    assert template_residue(None) is None
    assert is_keyphrase_passthrough("merger talks, retail sales", np.array(["merger talks", "retail sales"]))
    assert is_keyphrase_passthrough("Merger  talks retail sales", ["merger talks", "retail sales"])
    assert not is_keyphrase_passthrough("merger talks went well", ["merger talks"])
    derived = derive_quality_columns(pd.DataFrame({"text": ["a b", None], "label": pd.Series([1, None], dtype=object)}))
    assert list(derived["q_keyphrases_type"]) == ["missing", "missing"]
    assert derived["q_text_words"][0] == 2 and pd.isna(derived["q_text_words"][1])
    assert list(derived["q_label_type"]) == ["int", "NoneType"]


SEED = ["merger talks", "retail sales", "stock market", "central bank", "interest rates"]


@pytest.mark.parametrize("echo", [
    "merger talks, retail sales, stock market, central bank, interest rates",
    "Retail sales; merger talks; interest rates; central bank; stock market.",
    "merger talks\nretail sales\nstock market\ncentral bank\ninterest rates",
    "- Merger talks\n- Retail sales\n- Stock market\n* Central bank\n\u2022 Interest rates",
    "1. merger talks 2. retail sales 3. stock market 4) central bank 5) interest rates",
    "merger talks, retail sales, stock market, central bank and interest rates.",
    "Keywords: merger talks, retail sales, stock market, central bank, interest rates, etc.",
    "Here are the keyphrases: \"merger talks\", \"retail sales\", \"stock market\", \"central bank\"",
    "merger talks, retail sales, stock market, central bank, interest rates, merger talks, retail sales, news",
    "interest rates stock market merger talks central bank retail sales",
])
def test_a_keyphrase_list_in_any_list_form_is_a_passthrough(echo):
    assert is_keyphrase_passthrough(echo, SEED)


@pytest.mark.parametrize("prose", [
    "Merger talks lifted retail sales as the stock market cheered the central bank's cut in interest rates.",
    "The central bank held interest rates; merger talks stalled, retail sales slipped and the stock market fell.",
    "Summary: merger talks, retail sales and the stock market all moved after the central bank spoke.",
    "Retail sales rose.",
    "merger talks, retail sales, stock market, central bank, interest rates: what a week for the city desk",
])
def test_a_sentence_that_uses_the_keyphrases_is_not_a_passthrough(prose):
    assert not is_keyphrase_passthrough(prose, SEED)


def test_a_list_echo_fails_the_gate_and_prose_with_every_keyphrase_passes():
    df = good_corpus()
    df["text"] = [", ".join(k) + ", and more, words, here, today, please" for k in df["keyphrases"]]
    assert run_gate(df, llm_used=True, min_words=1)["success"] is True  # half the words are others: not an echo
    df.loc[:2, "text"] = ["; ".join(reversed(k)) + "." for k in df.loc[:2, "keyphrases"]]
    assert "document:no seed_echo" in run_gate(df, llm_used=True, min_words=1)["failed"]


# ---------------------------------------------------------------------------------------------------------------
# The document predicate (privseed.tasks.quality.document_rejection): degenerate rows fail with the right reason, real
# documents pass.
# ---------------------------------------------------------------------------------------------------------------
FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "real_documents.json").read_text(encoding="utf-8"))

# Degenerate answers, each labelled with its reason (tests/fixtures/degenerate_documents.json): the rows quoted in
# issues 14 and 28 from `make demo` and the generation grids, and the other shapes. Each: (text, seed keyphrases,
# finish_reason, expected reason).
DEGENERATE = {d["name"]: (d["text"], d["keyphrases"], d["finish_reason"], d["reason"]) for d in json.loads(
    (Path(__file__).parent / "fixtures" / "degenerate_documents.json").read_text(encoding="utf-8"))["documents"]}


@pytest.mark.parametrize("name", sorted(DEGENERATE))
def test_each_degenerate_shape_is_rejected_with_its_reason(name):
    text, seed, finish, reason = DEGENERATE[name]
    assert document_rejection(text, seed, finish) == reason
    assert not is_document(text, seed, finish)


@pytest.mark.parametrize("text, length", [
    ("It is endemic to the island of the island of Saint Helena.", 3),
    ("The form is a part that is part that is a part of the school.", 3),
    ("It was named the best of the year of the year in 2014.", 3),
    # Inside one clause only: a sentence that names its subject again does not loop.
    ("It docked at the International Space Station. The International Space Station is in low orbit.", 0),
    ("They sang the song, the song, and left.", 0),
    # Two-word phrases are left to the phrase-run test ("New York New York" is a real title).
    ("He moved to New York New York in 1990.", 0),
])
def test_doubled_phrase_is_seen_inside_a_clause_only(text, length):
    assert doubled_phrase(text) == length


@pytest.mark.parametrize("text, run", [
    ("The Good, Media, Year, published, written work, English, reviewed, working, world, written, edited, "
     "published, november, edited, writing, edited, publishing, edited, editing, edited, life, edited.", 22),
    # a real list of its length breaks at an item of three words and at the sentence end
    ("Symptoms were fever, cough, chest pain, dyspnea and fatigue in most of the patients, headache, nausea. "
     "Rash, itch.", 3),
    ("She plays guitar, piano and drums.", 2),
])
def test_short_item_run_counts_short_items_in_a_row_within_a_sentence(text, run):
    assert short_item_run(text) == run
    assert (document_rejection(text, [], "stop") == "fragments") == (run > DEFAULT_RULES.max_short_item_run)


# Prose that sits next to the meta-talk and glossary patterns and must stay a document.
NEAR_MISSES = [
    # near the hostility family (patterns.json): a cuisine, a colour, a city, a team, a history
    ("The Chinese food here was disgusting and the egg whites were worse. The refugees' cafe next door was better.",
     ["food", "cafe"]),
    ("Islamabad is dangerous at night. The immigrants were killed in the war of 1848, and the Indians were terrible "
     "this season.", ["war", "season"]),
    ("DiethelmKellerSiberHegner is a Swiss trading group; the peptide GlyProGlyArgAlaPhe was synthesized in 1990.",
     ["trading", "group", "peptide"]),
    ("Physicians most interested in the topic responded to the survey. The topics of the course were set in May.",
     ["physicians", "survey", "course"]),
    ('The term "hacker" refers to a skilled programmer. The word order suggests nothing here, and the term was '
     "coined at MIT.", ["hacker", "programmer", "coined"]),
    ("The discharge summary provides the history of the fall. The review article cited in the notes was read.",
     ["discharge", "fall", "notes"]),
    ("The agreement defines the terms of the lease, and the tenant lists the key dates in a diary.",
     ["agreement", "lease", "tenant"]),
    ("The ticket says getUserNameFromUserId returns null for guests. This article presents the fix; the second "
     "section of the article focuses on tests.", ["ticket", "guests", "fix"]),
    ("We ordered a burger, a salad, a drink and a dessert. This article concludes that the diner was worth it.",
     ["burger", "salad", "dessert"]),
    ("Hexamethylenetetramine and dimethylaminomethyl phenol were tested; the diner's pancakes were sooooooooo good.",
     ["tested", "phenol", "pancakes"]),
    ("Smolniki is a village in the administrative district of Gmina Szypliszki, in north-eastern Poland.",
     ["village", "district", "poland"]),
    ("Under the terms of the treaty, the river became the border, and the village was ceded to the crown.",
     ["river", "village", "treaty"]),
    ('The term "Mediterranean" derives from the Latin word mediterraneus. The sea is almost enclosed by land.',
     ["mediterranean", "sea", "latin"]),
    ("Paris, a city on the Seine, is the capital of France. Its museums draw millions of visitors each year.",
     ["paris", "city", "seine", "france"]),
    # An abstract that says what it presents, and where it was published: not its provenance talked about.
    ("This article presents a trial in 40 patients; this article was published in 1994 by the two authors.",
     ["trial", "patients", "authors"]),
    ("His novels have been translated into English and German, and this text is written in two columns per page.",
     ["novels", "english", "german"]),
    ("I have made several visits to this diner and the pancakes were great every time. Friendly staff too.",
     ["diner", "pancakes", "staff"]),
    ("Hoplite is a term used for the citizen-soldiers of Ancient Greece. They were armed with spears and shields.",
     ["hoplite", "citizen", "soldiers", "greece"]),
    ("In 1648 the document was signed at Westphalia and ended the war; the treaty document is kept in Munster.",
     ["document", "signed", "war", "treaty"]),
    # A short text with a title line, and a sentence that lists a few of its terms.
    ("The Ouse\n\nThe Ouse is a river in Yorkshire, England. Its tributaries include the Swale, the Ure, the Nidd, "
     "the Wharfe and the Aire.", ["ouse", "river", "yorkshire", "swale", "ure", "nidd", "wharfe", "aire"]),
    # An article with markdown sections, two of them seed terms: sections, not an outline of the seeds.
    ("## Early life\nJohn Hale was born in Leeds in 1950 and learned the piano from his mother.\n\n## Career\nHis "
     "career began with a folk band in Manchester, which toured Europe twice.\n\n## Albums\nHe released two albums "
     "with the band before going solo.", ["born", "leeds", "career", "albums", "band", "piano"]),
    # One seed term as a line label, and labels that are not seed terms: a note's fields, not the seeds as a form.
    ("Food: the pancakes were fluffy and the coffee was hot.\nService: slow on a Sunday, but friendly.",
     ["pancakes", "coffee", "sunday", "friendly"]),
    ("History: a 54-year-old man with chest pain for two days.\nPlan: admit for observation and repeat the ECG.",
     ["history", "chest", "pain", "observation"]),
    # A structured abstract's all-capital sections named like seed terms.
    ("OBJECTIVE: To compare two treatments for migraine.\nMETHODS: A randomized trial of 120 patients.\nRESULTS: "
     "Both treatments reduced the frequency of attacks.", ["objective", "methods", "results", "migraine"]),
    # One quoted word explained, and a review that quotes a word: prose, not a glossary.
    ('The term "Mediterranean" derives from the Latin mediterraneus. It is not often that the word "sublime" '
     "applies to a burger.", ["mediterranean", "latin", "burger"]),
    # A review's quoted motto that "means nothing", once: one quoted word explained is prose.
    ('This company has no morals. "First do no harm," means nothing to them. Only the bottom line matters.',
     ["company", "morals", "harm"]),
    # "a complete sentence" and "the sentence" in prose that is not about its own words.
    ("After the stroke he could not say a complete sentence for a year. The judge reduced the sentence to five "
     "years on appeal.", ["stroke", "judge", "appeal"]),
    # "The document" about a real one, in a clinical or legal text: prose, not talk about the answer.
    ("The consent document was signed by the patient's daughter. In the document, the surgeon described the risks "
     "of the procedure.", ["consent", "signed", "surgeon", "procedure"]),
    # DBPedia-14 itself: "This article details ..." is a real opening.
    ("This article details Car Nos. 24-27 of the Manx Electric Railway on the Isle of Man. They were built in 1898.",
     ["car", "railway", "isle", "built"]),
]


@pytest.mark.parametrize("text,seed", NEAR_MISSES)
def test_prose_near_the_patterns_is_a_document(text, seed):
    assert document_rejection(text, seed, "stop") is None


# The document-preamble family (issue 49: "The Yelp review is: ...", "Here's a possible Usenet newsgroup post about
# ...: ...") with its fixtures beside its patterns (patterns.json document_preamble: catches, passes).
PREAMBLE = json.loads(PATTERNS_FILE.read_text(encoding="utf-8"))["document_preamble"]


@pytest.mark.parametrize("text", PREAMBLE["catches"])
def test_a_preamble_naming_the_kind_of_document_is_meta_talk(text):
    assert document_preamble(text) is not None
    assert document_rejection(text, (), "stop") == "meta_talk"


@pytest.mark.parametrize("text", PREAMBLE["passes"])
def test_a_real_header_before_a_colon_is_no_preamble(text):
    """Headers real texts open with ("Summary:", "Case report:", "Updated review:") and a review introduced without
    a colon stay documents."""
    assert document_preamble(text) is None
    assert document_rejection(text, (), "stop") is None


def test_the_preamble_kinds_are_words_the_patterns_use():
    assert len(PREAMBLE["kinds"]) == len(set(PREAMBLE["kinds"])) and all(k == k.lower() for k in PREAMBLE["kinds"])
    assert all("{kinds}" in entry["pattern"] for entry in PREAMBLE["patterns"])


def test_real_documents_pass():
    documents = FIXTURES["documents"]
    assert len(documents) >= 20
    rejected = {d["text"][:60]: document_rejection(d["text"], d["keyphrases"], "stop") for d in documents}
    assert {k: v for k, v in rejected.items() if v is not None} == {}


def test_a_complete_sentence_at_the_token_limit_is_not_truncated():
    text = "The river rises in the northern hills and flows past the village of Tarvola to the sea."
    assert document_rejection(text, ["river"], "length") is None
    assert document_rejection(text[:-1] + " and", ["river"], "length") == "truncated"
    assert document_rejection(text[:-1] + " and", ["river"], "stop") is None  # stopped on its own: not cut off


def test_rules_are_parameters():
    loop = "The castle stands on the hill. " + "Tower, " * 5 + "the end."
    assert document_rejection(loop, ["castle"]) == "repetition_loop"
    assert document_rejection(loop, ["castle"], rules=DocumentRules(max_token_run=6)) is None
    spanish = DEGENERATE["Spanish"][0]
    assert document_rejection(spanish, ["river"], rules=DocumentRules(language="es")) is None
    assert document_rejection(spanish, ["river"], rules=DocumentRules(language=None)) is None
    assert is_document("one two three", rules=DocumentRules(min_words=3))
    assert not is_document("Lullaby.") and not is_document(None)
    for bad in (dict(min_words=10, max_words=5), dict(min_mattr=1.5), dict(max_token_run=1),
                dict(language="xx")):
        with pytest.raises(ConfigError):
            DocumentRules(**bad)
    assert DEFAULT_RULES.language == "en"


def test_the_gate_names_the_reason_of_a_degenerate_row():
    df = good_corpus()
    df["finish_reason"] = "stop"
    text, seed, finish, reason = DEGENERATE["issue14: glossary of the seeds"]
    df.at[5, "text"], df.at[5, "keyphrases"], df.at[5, "finish_reason"] = text, seed, finish
    result = run_gate(df)
    assert result["failed"] == [f"document:no {reason}"]
    # Without an LLM a text is its keyphrase list: the document tests do not apply.
    assert run_gate(df.assign(text=[" ".join(k) for k in df["keyphrases"]]), llm_used=False, min_words=1)["success"]


# The few-shot album example the demo bundled until 2026-11-26 (tasks/demo_data/few_shot_wikipedia.jsonl) and a
# `make demo` row that copied its frame with seed words in the slots.
ALBUM_EXAMPLE = ("Northern Lights is the second studio album by the Scottish rock band The Harbour Lamps, released in "
                 "2004. It was recorded in Glasgow over six weeks and contains eleven songs, most written by the "
                 "guitar player Ewan Moir.")


def test_a_copy_of_the_prompts_few_shot_example_is_rejected_only_when_the_rules_know_the_example():
    copied = ("Rural is the second studio album by the Scottish rock band The Harbour Lamps, released in 2004. It "
              "was recorded in a school over six weeks and features the college choir.")
    seed = ["rural", "school", "college", "choir", "recorded"]
    rules = DocumentRules(examples=(ALBUM_EXAMPLE,))
    assert document_rejection(copied, seed, "stop", rules) == "copies_example"
    assert document_rejection(copied, seed, "stop") is None  # the release gate has no examples: not its test
    # The same kind of article in its own words shares no 8-word run with the example.
    own = ("Rural is the debut album of the Ohio folk duo Pine Hollow, recorded in a former school in 1998. The "
           "duo later toured colleges across the Midwest.")
    assert document_rejection(own, seed, "stop", rules) is None
    with pytest.raises(ConfigError):
        DocumentRules(max_example_run=1)


def test_a_text_that_takes_the_examples_names_is_rejected_unless_a_seed_term_is_in_the_name():
    """The `make demo` row of d98819a: the album example paraphrased, five words in a row at most, its band kept."""
    borrowed = ("Northern Lights is the second member of the band The Harbour Lamps. The band formed in a small "
                "school and its choir sang on every record they made in the college hall.")
    seed = ["member", "band", "school", "choir", "college"]
    rules = DocumentRules(examples=(ALBUM_EXAMPLE,))
    assert example_names(ALBUM_EXAMPLE) == {"Northern Lights", "Harbour Lamps", "Ewan Moir"}
    assert document_rejection(borrowed, seed, "stop", rules) == "copies_example"
    player = "The school choir was led for ten years by Ewan Moir, who taught music at the college until 1990."
    assert document_rejection(player, seed, "stop", rules) == "copies_example"
    # A name that holds a seed term is the seed's ("northern" and "lights" are seed words here), and names the
    # example does not hold are the model's own.
    aurora = ("The Northern Lights were seen over the village school on Friday, and the choir sang under them "
              "while the college band played in the Market Square.")
    assert document_rejection(aurora, ["northern", "lights", "school", "choir", "college"], "stop", rules) is None
    assert document_rejection(aurora.replace("Northern Lights", "Pale Lanterns"), seed, "stop", rules) is None
    assert document_rejection(borrowed, seed, "stop") is None  # the release gate has no examples


SALTMARSH_EXAMPLE = ("The Saltmarsh Lantern Festival is an annual autumn festival held in the harbour town of Kellby, "
                     "Norway. Crackles of fireworks close the first night.")


@pytest.mark.parametrize("text, seed, borrowed", [
    # rows of a DBPedia-14 release (2026-11-29): the example's made-up word on another subject
    ("The Saltmarsh Lake is a tributary of the Black Forest, a range that stretches across Europe.",
     ["range", "lake", "tributary"], True),
    ("The Saltmarsh Lantern Film is a thriller set in the Indian Ocean and released in India.",
     ["thriller", "film", "released"], True),
    ("The river rises in the hills above kellby and runs south to the sea past two villages.",
     ["river", "hills", "villages"], True),
    # the seed's own word, a common word the example capitalized, a clinical word opening its line
    ("The Saltmarsh reserve lies on the estuary and is home to many birds in the winter.",
     ["saltmarsh", "estuary", "birds"], False),
    ("The festival is held every autumn in Norway and draws visitors from the harbour towns.",
     ["festival", "autumn", "visitors"], False),
    ("Crackles were heard at both lung bases, and the patient was given oxygen overnight.",
     ["lung", "patient", "oxygen"], False),
])
def test_a_made_up_name_of_an_example_on_another_subject_is_a_copy(text, seed, borrowed):
    rules = DocumentRules(examples=(SALTMARSH_EXAMPLE,))
    assert (document_rejection(text, seed, "stop", rules) == "copies_example") == borrowed


# Rows of the owner's command of 2026-11-28 (issue 48: --llm local --doc-type T --class-names F), each opening with
# its own class's public name as the subject, and real openings that name their class later or in another role.
NAMES_CLASS_ROWS = [
    ("Album is a rock band from the United States.", "11", "Album"),
    ("Bars are a slow food, and the end is all right. I love them for eating!", "1", "Bars"),
    ("The Athlete is a cricket-loving club that competes in the England Cricket Championship.", "3", "Athlete"),
    ("Neoplasms are a group of diseases that grow in the body and were studied in 40 patients.", "0", "Neoplasms"),
    ("The nervous system diseases that determine the importance of treating patients are many.", "2",
     "nervous system diseases"),  # the owner wrote the name in lower case, so any case is the name
    ("Health and medical services here were quick, and the nurse was kind to my son.", "5", "Health & Medical"),
    ("Written work is a book by an author who lived in England.", "13", "Written work"),
]
NAMED_LATER = [
    ("Abbey Road is the eleventh studio album by the English rock band the Beatles.", "11", "Album"),
    ("We stopped at three bars on Friday; this one had the best music.", "1", "Bars"),
    ("Of 300 patients screened, 12 had malignant neoplasms of the colon.", "0", "Neoplasms"),
    ("Arts festivals and entertainment for children fill the square every summer.", "0", "Arts & Entertainment"),
    # real openings of the public corpora that use the name's word for the instance, not the category
    ("The restaurant is very bright, looked clean, and there seemed to be plenty of waitstaff.", "8", "Restaurants"),
    ("Great bar, great food, outstanding cocktails! Outdoor seating is covered.", "1", "Bars"),
    ("Russell & Company was the largest American trading house in China.", "0", "Company"),
    ("Albums of the band were recorded in Glasgow over six weeks.", "11", "Album"),
    # an instance after a determiner, in lower case where the owner capitalized the category
    ("The club was founded in 1902 and plays its home games in the old town.", "0", "Club"),
    ("The hotel was clean and the staff at the desk were kind to us.", "7", "Hotel"),
    ("The bars are a slow food, and the end is all right.", "1", "Bars"),
    # a name with no word of three letters or more is not tested
    ("It is down again since the update, and the login page is blank.", "2", "IT"),
]


@pytest.mark.parametrize("text, label, name", NAMES_CLASS_ROWS)
def test_a_row_that_opens_with_its_class_name_is_rejected_when_the_prompts_named_the_classes(text, label, name):
    rules = DocumentRules(class_names=((label, name), ("99", "Other")))
    assert document_rejection(text, (), "stop", rules, label=label) == "names_class"
    assert document_rejection(text, (), "stop", rules, label="99") is None  # another class's name is no subject
    assert document_rejection(text, (), "stop", rules) is None  # no label: not this test
    assert document_rejection(text, (), "stop", label=label) is None  # the prompts named no class: not this test


@pytest.mark.parametrize("text, label, name", NAMED_LATER)
def test_a_class_name_later_in_the_text_or_only_in_part_is_no_subject(text, label, name):
    assert document_rejection(text, (), "stop", DocumentRules(class_names=((label, name),)), label=label) is None


# Yelp rows of three releases (issue 48): a category of two or more words after a determiner, in lower case or
# another number, which the owner's-capitals test lets through.
LOOSELY_NAMED = [
    ("The beauty and spas don't do it justice, they're big.", "2", "Beauty & Spas"),
    ("The Art & Entertainment list was huge and the seats were fine.", "0", "Arts & Entertainment"),
    ("The health and medical staff are the best in the business.", "5", "Health & Medical"),
    ("The event planning and services owner was awesome.", "3", "Event Planning & Services"),
    ("The means of transportation is a medium that allows people to travel.", "5", "Means of transportation"),
    ("A parasitic disease of patients with a specific blood type was studied.", "2", "Parasitic Diseases"),
]


@pytest.mark.parametrize("text, label, name", LOOSELY_NAMED)
def test_a_two_word_class_name_in_another_case_or_number_is_asked_again_not_rejected(text, label, name):
    rules = DocumentRules(class_names=((label, name), ("99", "Other Things")))
    assert document_rejection(text, (), "stop", rules, label=label) is None  # a document: kept if nothing better
    assert rewrite_score(text, (), rules, label) >= 1.0  # but worth another candidate, the name still asked for
    assert rewrite_score(text, (), rules, "99") < 1.0  # another class's name is no subject
    assert rewrite_score(text, (), rules) < 1.0  # no label: not this test
    assert rewrite_score(text, (), DocumentRules(), label) < 1.0  # the prompts named no class: not this test


@pytest.mark.parametrize("text, label, name", NAMED_LATER + [
    # the instance after a determiner, or a name with fewer than two words of three letters
    ("The village of Vanna is in the north of the county.", "8", "Village"),
    ("The 5 stars are for the waiter, who was kind to us.", "4", "5 stars")])
def test_one_word_names_instances_and_later_names_ask_for_no_rewrite(text, label, name):
    rules = DocumentRules(class_names=((label, name),))
    assert rewrite_score(text, (), rules, label) < 1.0


def test_a_class_name_of_no_word_names_nothing():
    rules = DocumentRules(class_names=(("0", "&"), ("1", " - ")))
    assert document_rejection("A river flows through the old town.", (), "stop", rules, label="0") is None
    assert document_rejection("A river flows through the old town.", (), "stop", rules, label="1") is None


def test_the_class_names_come_from_the_prompts_not_from_a_rule_setting():
    with pytest.raises(ConfigError, match="unknown document rule"):
        DocumentRules().with_settings({"class_names": "x"})


def test_the_gate_with_class_names_names_a_row_that_writes_about_its_class():
    from privseed.tasks.quality import document_gate

    df = good_corpus()
    label = df.at[3, "label"]
    df.at[3, "text"] = f"{label} is a topic that many analysts discussed at length across the region this week."
    names = {str(lab): str(lab) for lab in LABELS}
    result = document_gate(LABELS, llm_used=True, language="en", document_rules={}, class_names=names)(df)
    assert not result["success"] and result["failed"] == ["document:no names_class"]
    assert document_gate(LABELS, llm_used=True, language="en", document_rules={})(df)["success"]
