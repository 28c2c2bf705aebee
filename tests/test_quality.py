"""Release gate: a good corpus passes; each kind of bad corpus fails on exactly the expectations that name it."""

from __future__ import annotations

import io
import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.errors import ConfigError
from tasks.quality import (
    derive_quality_columns,
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
            "text:no prompt or template residue", "text:not the keyphrase list passed through"} <= names
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
        lambda df: with_rows(df, slice(0, 3), "text", lambda i: " ".join(df.at[i, "keyphrases"]) + "  "),
        {"text:not the keyphrase list passed through"}, {"text:word count within bounds"}),
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
    assert "text:not the keyphrase list passed through" in run_gate(df, llm_used=True, min_words=1)["failed"]
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
    assert "text:not the keyphrase list passed through" in run_gate(df, llm_used=True, min_words=1)["failed"]
