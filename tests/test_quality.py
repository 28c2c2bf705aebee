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
from privseed.tasks.quality import (
                                    DEFAULT_RULES,
                                    REJECTION_REASONS,
                                    DocumentRules,
                                    derive_quality_columns,
                                    document_rejection,
                                    example_names,
                                    is_document,
                                    is_keyphrase_passthrough,
                                    release_gate,
                                    template_residue,
                                    validate_release,
                                    validate_release_task,
                                    )

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

# The six rows drawn from a `make demo` release in issue 14 (the first three as quoted there; the glossaries and
# the tails "..." written out to the token limit as the model wrote them), then the other degenerate shapes.
# Each: (text, seed keyphrases, finish_reason, expected reason).
DEGENERATE = {
    "issue14: AI self-description": (
        "I'm an AI assistant designed to help with Wikipedia articles. I've been trained on a vast dataset of "
        "articles and can write about many topics, including history, science and geography.",
        ["member", "legislative", "assembly", "constituency", "gujarat"], "stop", "meta_talk"),
    "issue14: a word to the token limit": (
        "The Australian, Southerland, Tasmania, " + "Australia, " * 60,
        ["australian", "southerland", "tasmania", "species", "coastal"], "length", "repetition_loop"),
    "issue14: MADES builder of builds": (
        " ".join(f'{w}: "{w}: BUILDER OF BUILDS"' for w in ["MADES", "DEMES", "BRETEUS", "CALOS", "MERIS", "TALOS",
                                                           "DORES", "VELES", "PANOS", "KIRES", "SOLES", "NEMES"]),
        ["builder", "mades", "published", "series", "village"], "length", "glossary"),
    "issue14: seed list then I'm ready": (
        '"Ship, published, Segal, worked, ireland, series, novel, action"  I\'m ready. I\'ll be ready to help.',
        ["ship", "published", "segal", "worked", "ireland", "series", "novel", "action"], "stop", "seed_echo"),
    "issue14: glossary of the seeds": (
        "Corporation: The Corporation is a legal entity that is separate from its owners. Dist: The Dist refers to "
        "a district, an area of a country or city. Railway: The Railway is a track made of steel rails. Founded: "
        "Founded means started or established.",
        ["corporation", "dist", "railway", "founded", "company"], "stop", "glossary"),
    "issue14: glossary without the seed names": (
        "Album: An album is a collection of recorded songs. Label: A label is a company that releases records. "
        "Producer: A producer oversees the recording. Single: A single is a song released on its own.",
        ["album", "label", "producer", "single", "band"], "stop", "glossary"),
    "make demo (steered): definitions of the seeds": (
        "The hotel is a luxury hotel in the United States. It is served by the television, and the primetime is "
        "aired on the cable channel. The internationals are a luxury resort in the United Kingdom. The el is a "
        "luxury resort located in the United Arab Emirates. The american is a luxury cruise ship.",
        ["hotel", "television", "primetime", "served", "representatives", "internationals", "el", "american"],
        "stop", "glossary"),
    "make demo (steered): the term X is used": (
        "The term refinement is a term used to describe the process of making something better. The term short is "
        "used to describe a piece of writing. The term rendered is used to refer to edited work. The term hanlon "
        "is a name given to a style of music.", ["refinement", "short", "rendered", "born", "hanlon", "musician"],
        "stop", "glossary"),
    "prompt echo": ("Write a Wikipedia article that contains the following terms: river, north, village.",
                    ["river", "north", "village"], "stop", "prompt_residue"),
    "chat opener": ("Sure, here is a short article about the river and the village that grew up on its banks.",
                    ["river", "village"], "stop", "meta_talk"),
    "as an AI language model": ("As an AI language model, I do not have opinions, but the river is long and wide.",
                                ["river"], "stop", "meta_talk"),
    "talk about the terms": ("This text uses all the given terms: the river flows north past the old village.",
                             ["river", "north", "village"], "stop", "meta_talk"),
    "refusal": ("I'm sorry, but I cannot write about that subject. Please ask me something else.", ["river"],
                "stop", "meta_talk"),
    "seed list as bullets": ("- river\n- north\n- village\n- bridge\n- market\n- church", ["river", "north", "village",
                             "bridge", "market", "church"], "stop", "seed_echo"),
    "seed list inside a sentence": ("The story mentions river, north, village, bridge, market and church in turn, "
                                    "nothing more.", ["river", "north", "village", "bridge", "market", "church"],
                                    "stop", "seed_echo"),
    "phrase loop": ("The castle stands on the hill " + "of the arm " * 20 + "in the old town.", ["castle", "hill"],
                    "length", "repetition_loop"),
    "two-sentence cycle": (" ".join(["The river runs north to the sea past the mill.",
                                     "The mill stands by the river and grinds the corn of the village."] * 8),
                           ["river", "mill"], "length", "low_distinct"),
    "counting loop": (" ".join(f"Volume {i} and chapter {i + 100} of the series." for i in range(1, 30)),
                      ["volume", "series"], "length", "compressible"),
    "Spanish": ("El río nace en las montañas del norte y desemboca en el mar después de pasar por la ciudad y el "
                "pueblo antiguo.", ["river"], "stop", "wrong_language"),
    "Cyrillic": ("Река берёт начало в горах на севере и впадает в море, протекая мимо старой деревни и города.",
                 ["river"], "stop", "wrong_language"),
    # Rows of the `privseed dpkps dbpedia14/train --llm local --per-class 20` release (SmolLM2-135M, budget steering)
    # that the predicate let through before; excerpts as the model wrote them.
    "per-class-20: the document contains the terms": (
        "Water is a term used to refer the use of water for various purposes. The above document contains the "
        "terms unknowns (meters, home, sea, and river) that describe a place.",
        ["unknowns", "meters", "home", "sea", "river"], "stop", "meta_talk"),
    "per-class-20: a list of words": (
        '"Mountain: Crenshaw Village: Silverstone Dena: Rural Shinab: District Shenam: Village Silent: Village"  '
        "This document contains a list of words that are related to mountains, villages, and can be found in the "
        "context of census data.", ["mountains", "village", "census", "rural", "district", "silent", "crenshaw"],
        "stop", "meta_talk"),
    "per-class-20: the words in quotes": (
        'The words "difficult" and "film" evoke a range of emotions in the viewer, and the director uses them well.',
        ["difficult", "film", "directed", "george"], "stop", "meta_talk"),
    "per-class-20: composing with these terms": (
        "To create a document with these terms, I'll need to incorporate them in a way that's easy for users to "
        "understand. Asa.com - The website plays a role in the game of academic.",
        ["greater", "combos", "academic", "asa", "plays"], "stop", "meta_talk"),
    "per-class-20: a helpful AI": (
        "I am a helpful AI designed to assist in creating documents. It has been reorganized for better "
        "readability, and the rest of it is self-explanatory.", ["commonly", "book", "species", "russian", "favors"],
        "stop", "meta_talk"),
    "per-class-20: editing talk": (
        "Class: Northern, Minister: Building, Saturation: Southern, Denominator: simply,  I made several changes to "
        "enhance the document's clarity and grammar.", ["class", "simply", "steamed", "northern", "minister"],
        "stop", "meta_talk"),
    "per-class-20: seeds as appositives": (
        "Born, a player that plays a lot of games. Px, a game that is played by a lot of people. Legume, a game "
        "where people can play. Democratic, a game in which people can play and make their own decisions.",
        ["born", "sayers", "px", "legume", "democratic", "player", "plays"], "stop", "glossary"),
    "per-class-20: the term X has": (
        "Family of London, a groupies of the Empire. Emitting, a term that refers to something that is emitted. A "
        "power is emitted. Feu, a term for a male. A center is a place where people gather.",
        ["emitting", "feu", "family", "power", "london", "center", "groupies", "grower"], "stop", "glossary"),
    "per-class-20: bulleted headers": (
        "- Canadabella - Universidad: USA - Appleton: Canada - Carlyle: School - Source: College - Tres: Source",
        ["american", "herodotus", "canada", "college", "universidad", "appleton", "carlyle", "school"], "stop",
        "glossary"),
    "per-class-20, stricter predicate: a term that ...": (
        "Ladies and Gentlemen,  Porky - a versatile term that encompasses many meanings. Small, singer - a term "
        "that means a songwriter. Singer - a term referring to someone who sings songs.",
        ["small", "singer", "retired", "born", "overtones", "porky"], "stop", "glossary"),
    "per-class-20, stricter predicate: sharing my article": (
        "I'm excited to share my World of Legends article with you. Ducati is a famous car made by a famous maker, "
        "and it starred in many races.", ["ducati", "calculated", "starred", "entered", "recollect", "ccm"], "stop",
        "meta_talk"),
    # Rows of the same release with Qwen2.5-Coder-0.5B: outlines of the seeds in markdown, one definition each.
    "qwen per-class-20: a heading per seed": (
        "### Drama\n\nA genre of film, television, and theater that deals with the emotional aspects of an "
        "individual's life.\n\n### Protestors\n\nAn organization that opposes certain policies, practices, or "
        "ideas.\n\n### Offence\n\nAn act of violence, assault, or assault on someone's life or property.",
        ["drama", "protestors", "offence", "listed", "schengen", "played", "talib", "minister"], "stop", "glossary"),
    "qwen per-class-20: bold labels in a list": (
        "**India:**\n- **Huts:** A type of housing structure where people stay together.\n- **General:** A broad "
        "word for a business that provides services.\n- **Albums:** A type of musical work that has been released."
        "\n- **Player:** A person who plays a role in a game or activity.",
        ["india", "huts", "company", "player", "dubuque", "general", "album", "telemedicine"], "stop", "glossary"),
    "qwen per-class-20: numbered headings and bold numbered labels": (
        "### Unionization\n\n**Definition:** The act of combining band members into a single unit. This process "
        "involves:\n\n1. **Bolo:** A group of musicians who work together.\n2. **Converges:** A process where two "
        "bands merge in the same genre.\n3. **Skit:** A collaborative project of two or more musicians.",
        ["unionization", "converges", "band", "album", "skit", "bolo"], "stop", "glossary"),
    "qwen per-class-20: numbered section headings": (
        "# Document on the Termology\n\n### 1. Jair\nJair is the body's ability to move through the air.\n\n### "
        "2. Companies\nIn business, a company is any organization, from start-ups to corporations.\n\n### 3. Huts"
        "\nIn technology, a hut is any office or building where employees work.\n\n### 4. Hydrolysis\nHydrolysis "
        "is a reaction with water.", ["ajar", "companies", "huts", "group", "oc", "hydrolysis", "yeshiva"], "stop",
        "glossary"),
    "qwen per-class-20: a report about itself": (
        "As the world faces an unprecedented challenge, companies play a crucial role in the global economy. This "
        "document explores the significance of corporation stars and their contributions to the global economy.",
        ["company", "year", "member", "stars", "corporation"], "stop", "meta_talk"),
    "qwen per-class-20: I am writing this document": (
        "I am writing this document to provide a detailed analysis of the film industry and the rights involved in "
        "the sale of the skit.", ["directed", "film", "rights", "skit", "sale"], "stop", "meta_talk"),
    "qwen per-class-20: a letter with its blanks": (
        "Dear [Company Name],\n\nI am pleased to introduce our corporation, a manufacturer of separate parts based "
        "in the city.\n\nSincerely,\n[Your Name]", ["corporation", "manufacturer", "separate", "based", "city"],
        "stop", "prompt_residue"),
    "qwen per-class-20: the seeds with variants, as a list": (
        "Born, Home, Birth, Set, Playing, Hear, Birth, Played, World",
        ["born", "home", "born", "set", "playing", "hear", "born", "played", "world"], "stop", "seed_echo"),
    "qwen per-class-20: in this document, we": (
        "The rise of rivers has been a profound phenomenon. In this document, we will explore the role of rivers in "
        "elevated areas.", ["river", "contemplated", "northern", "elevated", "seeks"], "stop", "meta_talk"),
    "qwen per-class-20: a dash per seed": (
        "Goo - A type of fruit that shines on its surface when exposed to sunlight.\n\nPoland - A country located in "
        "Europe, known for its rich culture.\n\nJuly - The month that is known as the most beautiful of the year.\n\n"
        "Offence - A crime that is punished by law.", ["goo", "glazing", "october", "haiku", "poland", "july",
                                                         "offence", "highest"], "stop", "glossary"),
    # The SmolLM2-135M per-class-20 release re-checked after the Qwen fixtures.
    "per-class-20: broken into fragments": (
        "Advocacy of the giant,\n\nPolitician,\n\nLadies and Gentlemen,\n\nWritten,\n\nIncentive,\n\nLarge,\n\n"
        "Overflowed,\n\nCommunicators,\n\nA\n\nreplenishment", ["politician", "hepatic", "novel", "written",
                                                                  "incentive", "giant", "replenishment"], "stop",
        "fragments"),
    "per-class-20: a line that lists the seeds, then prose": (
        "ducati, greenhouse, film, small, small, little, lar, republican, fc, livery, fair, sleeper, livery.\n\nducati "
        "was the name of a car produced in 1910. The car was the first of its kind with a camshaft.",
        ["ducati", "greenhouse", "film", "little", "lar", "republican", "sleeper", "fc"], "stop", "seed_echo"),
    "per-class-20: an assistant with a name": (
        "Hi there,\nI'm Emily, a creative writing assistant from the town of Eldoria. Lonnie, the town's resident, "
        "is a charming person with a passion for storytelling.", ["lonnie", "iwo", "state", "grandmother", "cougar"],
        "stop", "meta_talk"),
    "per-class-20: the prompt, reworded, and the model's name": (
        "Produced by SmolLM, written by Dexter. Produce a document that contains the terms born, playing, LAR and "
        "plays.", ["plays", "lar", "owen", "born", "chinese"], "stop", "prompt_residue"),
    "per-class-20: the model names itself": (
        "Produced by SmolLM, written by Dexter, Natural. Sandy is a fictional character from the story of a "
        "Canadian writer.", ["private", "canadian", "story", "sandy", "writer", "natural"], "stop", "meta_talk"),
    "per-class-20: X, is something": (
        "As for world, it is a wonderful place to live.\nBonding, is something that can make amazing things.\n"
        "Causation, is something very special.\nProto, is a word for the first.\nMorocco, is a country.",
        ["george", "bonding", "world", "causation", "proto", "built", "morocco"], "stop", "glossary"),
    # The SmolLM2 per-class-20 release with class names (docs/generation.md, the fair only-LLM comparison).
    "per-class-20 names: a search on Wikipedia": (
        "Crawley: River\n\nA search on Wikipedia reveals a page with the tag \"march. 2023\" that is actually for "
        "California. This article is about a search for lake in the state of Michigan.",
        ["closer", "crawley", "river", "california", "march", "persian", "lake"], "stop", "meta_talk"),
    "per-class-20 names: in a Wikipedia article": (
        "In a Wikipedia article, Manta is a colloquialism that refers to a school of fish in a particular region. "
        "Cum is the name of a type of appendicitis.", ["manta", "cum", "school", "american", "appendicitis"],
        "stop", "meta_talk"),
    "per-class-20 names: this article contains": (
        "This article contains a scotland, a politician, and a council of europeans, a part of a corporation. It "
        "covers the district and the council.", ["usernames", "district", "scotland", "politician", "corporation"],
        "stop", "meta_talk"),
    "per-class-20 names: a tutor's voice": (
        "This family of animals is said to be elf-like, but you have added the genus of the animals in the "
        "article. Gawker is a word that means a member of the group.", ["family", "genus", "south", "member",
                                                                         "gawker"], "stop", "meta_talk"),
    "per-class-20 names: I wrote": (
        "In a 2022 school article, I wrote:\n\nRiddles:\n\n\"In a university, a biggs was a graduate student. The "
        "students were served by the july.\"", ["riddles", "school", "served", "university", "biggs"], "stop",
        "meta_talk"),
    "per-class-20, 8 rounds: the model's name garbled": (
        "Produced by SmolRoles: Pants, based on roles in the fashion industry, hajj business and denim. Produced by "
        "Shatterer: Shorts, in the business.", ["pants", "based", "roles", "hajj", "company"], "stop", "meta_talk"),
    "per-class-20, 8 rounds: a conversational AI": (
        "A: Hello, I'm here to assist you with your digital world. I'm a conversational AI that can help with "
        "everything from business planning to tech.", ["company", "aircraft", "state", "records"], "stop",
        "meta_talk"),
    "per-class-20, 8 rounds: words used in the document": (
        "PART I: Unspoken Terms:\n1. The word \"SHARE\" is used in the document.\n2. The word Family is used, and "
        "the dog is a person.", ["population", "species", "unspoken", "family", "chagrin"], "stop", "meta_talk"),
    "grid 20/class names: the article contains the phrase": (
        "In the category \"Warships\", the article contains the phrase \"filth\", which is misspelled as \"flask\" "
        "and \"species\" is misspelled.", ["filth", "warships", "species", "grieving"], "stop", "meta_talk"),
    "grid 20/class names: the terms mentioned": (
        "A movie about the film-making process. In this instance, the article uses every single one of the terms "
        "mentioned in the category \"Piety\" to describe the subject.", ["film", "piety", "reversals"], "stop",
        "meta_talk"),
    "grid 20/class names: in the context of Wikipedia": (
        "In the context of Wikipedia, East and West is a genre of music that has a musician named Scott Carre. "
        "Carre is best known for his soundtrack.", ["east", "west", "musician", "soundtrack"], "stop", "meta_talk"),
    "grid 20/class names: here to share": (
        "I'm here to share a school with you. You know, riddles, which are like puzzles that have been passed "
        "down for centuries.", ["school", "riddles", "college", "university"], "stop", "meta_talk"),
    "make demo: a loop of two letters": (
        "The Australian is a film and television series created by the American comedy-drama team GG GG GgG GGG "
        "GGgG GggGG GgHHHHGG GhGG GHGGG Gfs. It is a new film series that has been released in 2019.",
        ["australian", "region", "gfs", "ship", "compilations", "new", "hologram"], "stop", "repetition_loop"),
    "make demo: letters looping inside a word": (
        "The FakarakunLtrLtrLFFFFLFFLtrLLtrLlLtrL ltr is the first published edition of the book by the Japanese "
        "fiction writer Takashi Murakami. It was released in 2015.", ["fiction", "unfold", "published", "ltr"],
        "stop", "repetition_loop"),
    "grid 20/class names: groups of letters repeated inside a word": (
        "A stagger album is a compilation of multiple albums released simultaneously. This is a new feature in the "
        "Wipk3WipwipedWipwipewipedwiped WipwipwipfairsWipwwipedFairswiped Fairs.",
        ["stagger", "fairs", "wiped", "released", "album"], "stop", "repetition_loop"),
    "Qwen 0.5B, document type: whole words glued and repeated": (
        "A long time ago, there was a boyfriends who lived in a rural area in a state called Ontario. They were all "
        "friends and loved each other very much. They were also veryResignationEnzymaticResignationResignation "
        "Resignation.", ["roman", "enzymatic", "rural", "state", "resignation", "drowsy"], "stop", "repetition_loop"),
    "Qwen 0.5B, document type: the article covers": (
        "A young man is in school, playing football. He is located in France. The article covers November, summer, "
        "and the various schools where he plays.", ["november", "school", "summer", "football", "french"], "stop",
        "meta_talk"),
    "Qwen 0.5B, document type: the article provides an overview": (
        "Passports are documents that identify individuals from different countries or regions, butternut is a "
        "popular fruit that is produced in Brazil. The article provides a general overview of these concepts and "
        "their relationships.", ["passports", "born", "business", "butternut", "produced"], "stop", "meta_talk"),
    "Qwen 0.5B, --max-tokens 128: a guide to the key terms": (
        "Abreu's Live Sdp: A Comprehensive Guide to Clay Music\n\nRobert Aubre is a celebrated figure of the solo "
        "music landscape. This comprehensive guide covers the key terms used in Aubre's album, including:\n\n1. "
        "**Aggregates**: These are the musical objects that are used to create a cohesive track.\n\n2.",
        ["abreu", "clay", "live", "sdp", "aggregates", "album", "solo", "robert"], "length", "meta_talk"),
    "Qwen 0.5B, 20/class, class names: the topic echoed": (
        "The topic is about a company. It mentions the creation of a Dalmatian restaurant in Salvadoran, where it "
        "conveys goods and services to local customers.", ["company", "dalmatian", "founded", "salvadoran"], "stop",
        "meta_talk"),
    "Qwen 0.5B, only-LLM baseline: the named article provides": (
        "The Athlete Wikipedia article provides a comprehensive overview of athletes, including their physical "
        "characteristics, achievements, and background. It also covers their sport and competition history.",
        [], "stop", "meta_talk"),
    "Qwen 0.5B, --max-tokens 128: what each term suggests": (
        'The summer sanders of the British company were exhumed in Canada. The term "short" suggests that the '
        "sanders were quite small. The term al also suggests that the Sanders were based in an island.",
        ["summer", "sanders", "company", "british", "short", "al", "exhumed", "canada"], "stop", "meta_talk"),
    "grid 20/class names, resumed: a list of words with articles": (
        "A company in California, a city, a glassy, a corporate, a live, a bonkers, a years.",
        ["company", "california", "city", "glassy", "live", "bonkers", "years"], "stop", "fragments"),
    "grid 20/class names, resumed: the subject of each term": (
        "Pretty straightforward. I used april as the subject of the methodist. It's not the fringed village. I used "
        "the district again.", ["fringed", "vertigo", "methodist", "district", "april"], "stop", "meta_talk"),
    "grid 20/class names, resumed: in my article": (
        "In my article, I am comparing film to its opposite. In my article, the tammy is a double edged sword.",
        ["film", "holiest", "amorous", "tammy", "directed"], "stop", "meta_talk"),
    "grid 20/class names, resumed: an article titled": (
        'In an article titled "Company: East, Presents", the text concludes with "Presents", a Persian word, and a '
        "kiss from the glassy predictability.", ["company", "east", "glassy", "predictability"], "stop", "meta_talk"),
    "grid 20/class names, resumed: the article states": (
        "Miki River, the official name of the tributary of the Amazons, is a significant part of the Amazonian "
        "basin. The article states that the Amazons are a part of the Slicing rivers.",
        ["miki", "river", "tributary", "amazons", "slicing"], "stop", "meta_talk"),
    "grid 20/class names, resumed: not a term": (
        "Agamemnon is a king from dillon that is not a quarterback. The legislative, which is not a term, was "
        "weeded by the council.", ["weeding", "agamemnon", "dillon", "quarterback", "legislative"], "stop",
        "meta_talk"),
    "grid 20/class names, a20b1d2: the seeds filled in as a form": (
        "Pawns: A very popular and highly prized item on the world stage, best indeed.\nRoses: The most beautiful "
        "and precious flowers, crafting is not just about creating something beautiful.",
        ["accelerate", "pawns", "roses", "crafting", "karnataka", "music", "species"], "stop", "glossary"),
    "grid 20/class names, a20b1d2: a numbered form of the seeds": (
        "In a written work, there are several key elements that make up the guevara era:\n1. Glimpse: A brief "
        "moment of vision, often a songwriter, which was inspired by dharma.\n2. Weight: A physical element, as "
        "undamaged banner, which is a visible example of bromance.",
        ["glimpse", "weight", "exemptions", "songwriter", "bromance", "written", "guevara"], "stop", "glossary"),
    "grid 20/class names, a20b1d2: the article on the subject": (
        "Preliminary Posters of a Magazine: The Northern Frontier\n\nThe article on the subject is a novel with a "
        "history of the Gunnar and the Promenaders. It was published in 1998.",
        ["posters", "magazine", "northern", "novel", "published"], "stop", "meta_talk"),
    "grid 20/class names, a20b1d2: thrilled to be your": (
        "Bravo! I'm thrilled to be your Patented, Driveway, Integrator, and the ultimate in cars. The company was "
        "founded in 1990.", ["patented", "driveway", "integrator", "company"], "stop", "meta_talk"),
    "grid 20/class names, a20b1d2: a written article on Wikipedia": (
        "A written article on Wikipedia, in particular, published by the internet to the Portuguese community, is a "
        "novel by the author.", ["written", "portuguese", "novel", "published"], "stop", "meta_talk"),
    "per-class 20, 95a8d1e: quoted words explained one by one": (
        'The term "la" is a masculine pronoun referring to the United States, while "LADY" is a feminine pronoun in '
        'Northern Europe.\n\nThe term "abusing" is a Latin expression that translates to "to the hildebrand" in '
        "German.", ["la", "united", "born", "abusing", "august", "northern", "hildebrand"], "stop", "glossary"),
    "per-class 20 unsteered, 97785cc: quoted seed words opening lines": (
        '"washington" refers to the capital city of the United States, where the government sits.\n"Roles" refers '
        "to the parts that actors play in a film or on the stage.", ["washington", "roles", "film", "capital"],
        "stop", "glossary"),
    "per-class 20 unsteered, 97785cc: advice on writing a document": (
        "In a document, you might use the following phrases to describe the river: it rises in the hills and "
        "flows to the sea past the old mill.", ["river", "hills", "sea", "mill"], "stop", "meta_talk"),
    "per-class 20 unsteered, 97785cc: the document explains itself": (
        "The document is provided to help the user understand the history of the abbey, which was founded in 1120 "
        "by monks from Normandy.", ["abbey", "founded", "monks", "normandy"], "stop", "meta_talk"),
    "per-class 20, 95a8d1e: a chatbot": (
        "As a chatbot, I am a good friend, ako. Ako is the town where goode, the best politician, gave an interview "
        "to the newspaper.", ["ako", "goode", "politician", "interview", "newspaper"], "stop", "meta_talk"),
    "per-class 20, 95a8d1e: a sample of": (
        "As for a document, here is a sample of the songwriter's artwork, written in a style of church and border. "
        "The music is the foundation of a tapestry.", ["songwriter", "church", "border", "music"], "stop",
        "meta_talk"),
    "per-class 20, 95a8d1e: a complete sentence": (
        "A city on the river was founded by Harrier in 1820. This is a complete sentence with multiple words, and "
        "the city grew.", ["city", "river", "harrier", "founded"], "stop", "meta_talk"),
    "per-class 20, 95a8d1e: in the sentence": (
        'In the sentence "ad hoc, fashion", the French word fashion has the same meaning as the Italian one. The '
        "shop opened in Milan in 1990.", ["fashion", "french", "italian", "shop", "milan"], "stop", "meta_talk"),
    "make demo: a syllable loop": (
        "The Island of Japuncoke is a Japanese island in the Pacific Ocean, located in the Izu Rerererere Rerere "
        "ReRerere ReRecrerereRererereRecrereReRecrereRecRecrere Re RerereRe Re Re Re Rere Re Re ReRe Re RereRe.",
        ["coke", "states", "iii", "reappear", "japanese", "uss"], "stop", "repetition_loop"),
    "cut at the token limit": ("The river rises in the northern hills and flows past the village of Tarvola, where "
                               "its banks were first settled by", ["river", "village"], "length", "truncated"),
}


@pytest.mark.parametrize("name", sorted(DEGENERATE))
def test_each_degenerate_shape_is_rejected_with_its_reason(name):
    text, seed, finish, reason = DEGENERATE[name]
    assert document_rejection(text, seed, finish) == reason
    assert not is_document(text, seed, finish)


# Prose that sits next to the meta-talk and glossary patterns and must stay a document.
NEAR_MISSES = [
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
    for bad in (dict(min_words=10, max_words=5), dict(min_distinct_2=1.5), dict(max_token_run=1),
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


# The bundled few-shot album example (tasks/demo_data/few_shot_wikipedia.jsonl) and a `make demo` row that
# copied its frame with seed words in the slots.
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
