"""Release gate: Great Expectations (1.x, in code, no project folder) over a candidate synthetic corpus.

Two parts, following the project's stage shape:

- ``derive_quality_columns`` (pure pandas/python): per-row facts the expectations need and GX cannot
  express directly -- the Python type of each value, word counts, a normalised text for duplicate
  detection, which prompt/template residue a text carries, whether a text is just its keyphrase list.
- ``validate_release`` builds an ephemeral GX context, a pandas data source with a dataframe asset and a
  whole-dataframe batch, one suite of named expectations over those columns, a ``ValidationDefinition``,
  and returns a JSON-able result naming every expectation and whether it held.

The gate only reads the synthetic candidate, which is differentially private by post-processing, so the
details it reports (counts, a few truncated example values) leak nothing about the private corpus.

``release_gate`` makes the ``Callable[[DataFrame], dict]`` that ``tasks.corpus.publish_release(gate=...)``
calls; ``validate_release_task`` is the Prefect task for flows that gate outside of publishing.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from tasks.errors import ConfigError

# GX must not phone home or draw progress bars; set before great_expectations is imported.
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

REQUIRED_COLUMNS: tuple[str, ...] = ("text", "label", "keyphrases")

DEFAULT_BOUNDS: dict[str, float | int] = {
    # A synthetic document shorter than this many words is not a document (a failed or truncated call).
    # None: 5 words when an LLM wrote the texts, 1 in the no-LLM ablation (a text is its keyphrases).
    "min_words": None,
    # Longer than this is a runaway generation (the LLM ignored max_tokens or looped).
    "max_words": 2000,
    # Share of rows whose normalised text repeats an earlier row; above this the LLM collapsed.
    "max_duplicate_rate": 0.05,
    # Share of rows that are exactly their keyphrase list when an LLM was asked to write the text.
    "max_passthrough_rate": 0.02,
    # Share of rows allowed to carry prompt or chat-template residue (none by default).
    "max_residue_rate": 0.0,
    "min_rows": 1,
}

# Prompt echo and chat-template residue. Each entry: (name reported in the gate result, compiled regex).
# The prompt is "Write a {document type} that contains the following terms: ..." (DESIGN.md step 7);
# a copy of it, or a chat template's control tokens, in the output means the text is not a document.
TEMPLATE_RESIDUE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("prompt:contains the following terms", re.compile(r"contains\s+the\s+following\s+(terms|keyphrases|keywords)", re.I)),
    ("prompt:write a", re.compile(r"^\W*write\s+an?\s", re.I)),
    ("prompt:write a ... that contains", re.compile(r"\bwrite\s+an?\s+[^.\n]{0,80}\bthat\s+contains\b", re.I)),
    ("chat:<|...|> token", re.compile(r"<\|\s*(im_start|im_end|assistant|user|system|endoftext|eot_id|"
                                      r"start_header_id|end_header_id|begin_of_text|end|eos|bos)\s*\|>", re.I)),
    ("chat:[INST]", re.compile(r"\[/?INST\]")),
    ("chat:<s>/</s>", re.compile(r"</?s>")),
    ("chat:role header", re.compile(r"^\s*(assistant|user|system)\s*:", re.I | re.M)),
    ("chat:### Instruction/Response", re.compile(r"^\s*#{2,}\s*(instruction|response|input)\b", re.I | re.M)),
)

_WHITESPACE = re.compile(r"\s+")


def _normalise(text: str) -> str:
    """Case- and whitespace-insensitive form used for duplicate and passthrough checks."""
    return _WHITESPACE.sub(" ", text).strip().lower()


def _value_type(value: Any) -> str:
    """Name of a cell's type as the gate reports it: 'str', 'list[str]', 'NoneType', 'list[int]', ..."""
    if isinstance(value, (list, tuple, np.ndarray)):
        kinds = sorted({type(item).__name__ for item in value}) or ["str"]  # an empty list is a valid list[str]
        return "list[" + "|".join(kinds) + "]"
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "NoneType"
    if isinstance(value, (np.integer,)):
        return "int"
    if isinstance(value, (np.floating,)):
        return "float"
    if isinstance(value, (np.str_,)):
        return "str"
    return type(value).__name__


def template_residue(text: Any) -> str | None:
    """The name of the first residue pattern found in ``text``, or None when the text is clean."""
    if not isinstance(text, str):
        return None
    for name, pattern in TEMPLATE_RESIDUE_PATTERNS:
        if pattern.search(text):
            return name
    return None


# A keyphrase echo in list form: "Keywords: a, b; c", "- a\n- b", "1. a 2. b", "a, b and c". The list's
# separators are not words, so only its markers, connectors and a short "Keywords:" header need removing.
_LIST_HEADER = re.compile(r"\A\s*[^\n:]{0,60}:(?=\s)")
_LIST_MARKER = re.compile(r"(?:^|(?<=\s))(?:\(?\d{1,3}[.)]|\([a-z]\)|[-*+\u2022\u00b7\u2013\u2014\u25aa\u25ba\u2023]+)(?=\s)", re.M)
_WORD = re.compile(r"[^\W_]+(?:['\u2019][^\W_]+)*")
_LIST_FILLERS = frozenset({"and", "or", "etc", "keywords", "keyword", "keyphrases", "keyphrase", "terms", "tags"})
# At most this fraction of the remaining words may be other than the keyphrases' words. Seeds are vocabulary
# terms with stop words removed, so real prose, even prose that uses every keyphrase, is far above it
# (function words alone are ~40% of English running text).
PASSTHROUGH_MAX_OTHER_WORDS = 0.15


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def is_keyphrase_passthrough(text: Any, keyphrases: Any) -> bool:
    """True when the document is only its keyphrases (the LLM step was skipped, or the model echoed them):
    joined by spaces, commas, semicolons, newlines, bullets, numbers or "and", in any order, with at most
    an optional short "Keywords:" header and a few (PASSTHROUGH_MAX_OTHER_WORDS) other words."""
    if not isinstance(text, str) or not isinstance(keyphrases, (list, tuple, np.ndarray)) or len(keyphrases) == 0:
        return False
    phrase_words = {w for p in keyphrases for w in _words(str(p))}
    if not phrase_words:
        return False
    body = _LIST_MARKER.sub(" ", _LIST_HEADER.sub(" ", text, count=1))
    words = [w for w in _words(body) if w not in _LIST_FILLERS]
    if not words:
        return False
    others = sum(w not in phrase_words for w in words)
    return others <= PASSTHROUGH_MAX_OTHER_WORDS * len(words)


def is_document(text: Any, min_words: int = 5, max_words: int = int(DEFAULT_BOUNDS["max_words"])) -> bool:
    """What the release gate asks of one LLM-written row: a string of min_words..max_words words that carries no
    prompt or chat-template residue. Private evolution keeps candidates that fail it out of the vote (a public
    check of synthetic text, so it costs no privacy)."""
    if not isinstance(text, str):
        return False
    return min_words <= len(text.split()) <= max_words and template_residue(text) is None


def derive_quality_columns(df: pd.DataFrame) -> pd.DataFrame:
    """The frame GX validates: the required columns (when present) plus derived ``q_*`` columns.

    Missing required columns are not invented; their derived type column says ``missing`` so the
    type expectations name the problem instead of raising.
    """
    n = len(df)
    out = pd.DataFrame(index=pd.RangeIndex(n))
    for column in df.columns:
        out[column] = df[column].to_numpy(dtype=object)

    def column_or_missing(name: str) -> list[Any]:
        return list(df[name].to_numpy(dtype=object)) if name in df.columns else [None] * n

    texts = column_or_missing("text")
    labels = column_or_missing("label")
    keyphrases = column_or_missing("keyphrases")

    out["q_text_type"] = [_value_type(t) for t in texts] if "text" in df.columns else ["missing"] * n
    out["q_label_type"] = [_value_type(v) for v in labels] if "label" in df.columns else ["missing"] * n
    out["q_keyphrases_type"] = (
        [_value_type(k) for k in keyphrases] if "keyphrases" in df.columns else ["missing"] * n
    )
    # Blank text counts as empty; None stays None so "not null" and "not empty" are separate findings.
    out["q_text_blank"] = [(t.strip() == "") if isinstance(t, str) else None for t in texts]
    out["q_text_words"] = pd.array(
        [len(t.split()) if isinstance(t, str) else None for t in texts], dtype="Int64"
    ).astype(object)
    out["q_text_normalised"] = [_normalise(t) if isinstance(t, str) else None for t in texts]
    out["q_template_residue"] = [template_residue(t) for t in texts]
    out["q_keyphrase_passthrough"] = [is_keyphrase_passthrough(t, k) for t, k in zip(texts, keyphrases)]
    return out


def _bounds(overrides: dict[str, Any], llm_used: bool) -> dict[str, Any]:
    unknown = sorted(set(overrides) - set(DEFAULT_BOUNDS))
    if unknown:
        raise ConfigError(f"unknown release-gate bound(s) {unknown}; known: {sorted(DEFAULT_BOUNDS)}")
    bounds = {**DEFAULT_BOUNDS, **{k: v for k, v in overrides.items() if v is not None}}
    if bounds["min_words"] is None:
        bounds["min_words"] = 5 if llm_used else 1
    for rate in ("max_duplicate_rate", "max_passthrough_rate", "max_residue_rate"):
        if not 0.0 <= float(bounds[rate]) <= 1.0:
            raise ConfigError(f"release-gate bound {rate}={bounds[rate]} must be in [0, 1]")
    if not 0 <= int(bounds["min_words"]) <= int(bounds["max_words"]):
        raise ConfigError(
            f"release-gate word bounds must satisfy 0 <= min_words <= max_words, got "
            f"{bounds['min_words']}..{bounds['max_words']}"
        )
    return bounds


def build_expectations(labels: Sequence[Any], llm_used: bool, bounds: dict[str, Any]) -> list[Any]:
    """The suite, as GX expectation objects; each carries its gate name in ``meta['name']``."""
    import great_expectations.expectations as gxe

    def named(name: str, expectation: Any) -> Any:
        expectation.meta = {"name": name}
        return expectation

    label_set = list(labels)
    expectations = [
        named("schema:required columns", gxe.ExpectTableColumnsToMatchSet(
            column_set=list(REQUIRED_COLUMNS), exact_match=False)),
        named("rows:at least min_rows", gxe.ExpectTableRowCountToBeBetween(min_value=int(bounds["min_rows"]))),
        named("type:text is str", gxe.ExpectColumnValuesToBeInSet(column="q_text_type", value_set=["str"])),
        named("type:keyphrases is list[str]", gxe.ExpectColumnValuesToBeInSet(
            column="q_keyphrases_type", value_set=["list[str]"])),
        named("type:label is int or str", gxe.ExpectColumnValuesToBeInSet(
            column="q_label_type", value_set=["int", "str"])),
        named("text:not null", gxe.ExpectColumnValuesToNotBeNull(column="q_text_normalised")),
        named("text:not empty", gxe.ExpectColumnValuesToBeInSet(column="q_text_blank", value_set=[False])),
        named("text:word count within bounds", gxe.ExpectColumnValuesToBeBetween(
            column="q_text_words", min_value=int(bounds["min_words"]), max_value=int(bounds["max_words"]))),
        named("label:in declared set", gxe.ExpectColumnValuesToBeInSet(
            column="q_label_value", value_set=[str(v) for v in label_set])),
        named("label:every class present", gxe.ExpectColumnDistinctValuesToContainSet(
            column="q_label_value", value_set=[str(v) for v in label_set])),
        named("text:duplicate rate under bound", gxe.ExpectColumnProportionOfUniqueValuesToBeBetween(
            column="q_text_normalised", min_value=1.0 - float(bounds["max_duplicate_rate"]))),
        named("text:no prompt or template residue", gxe.ExpectColumnValuesToBeNull(
            column="q_template_residue", mostly=1.0 - float(bounds["max_residue_rate"]))),
    ]
    if llm_used:
        expectations.append(named("text:not the keyphrase list passed through", gxe.ExpectColumnValuesToBeInSet(
            column="q_keyphrase_passthrough", value_set=[False], mostly=1.0 - float(bounds["max_passthrough_rate"]))))
    return expectations


def _details(result: Any) -> dict[str, Any]:
    """A compact JSON-able summary of one GX expectation result (counts and a few truncated examples)."""
    raw = result.result or {}
    details: dict[str, Any] = {}
    if result.expectation_config.type == "expect_table_columns_to_match_set":
        # Derived q_* columns are expected extras; report only the required columns that are missing.
        mismatched = (raw.get("details") or {}).get("mismatched") or {}
        return {"missing_columns": sorted(str(c) for c in mismatched.get("missing", []))}
    for key in ("observed_value", "element_count", "unexpected_count", "unexpected_percent", "missing_count"):
        if key in raw and raw[key] is not None:
            value = raw[key]
            if isinstance(value, (list, tuple, set)):
                value = [_jsonable(v) for v in list(value)[:20]]
            details[key] = _jsonable(value)
    if raw.get("partial_unexpected_list"):
        details["examples"] = [_truncate(v) for v in raw["partial_unexpected_list"][:3]]
    if raw.get("partial_missing_list"):
        details["missing"] = [_jsonable(v) for v in raw["partial_missing_list"][:20]]
    if raw.get("details"):
        details["gx_details"] = _jsonable(raw["details"])
    exception = (result.exception_info or {}) if hasattr(result, "exception_info") else {}
    if exception.get("raised_exception"):
        details["exception"] = str(exception.get("exception_message", ""))[:300]
    return details


def _truncate(value: Any, limit: int = 80) -> Any:
    text = _jsonable(value)
    if isinstance(text, str) and len(text) > limit:
        return text[:limit] + "..."
    return text


def _jsonable(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return None if np.isnan(value) else float(value)  # NaN is not JSON
    if isinstance(value, (np.bool_,)):
        return bool(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, np.ndarray)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


@functools.lru_cache(maxsize=1)
def _gx_context() -> Any:
    """One ephemeral GX context per process (no project folder, analytics and progress bars off)."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    return context


def validate_release(df: pd.DataFrame, *, labels: Sequence[Any], llm_used: bool, **bounds: Any) -> dict[str, Any]:
    """Run the release gate over a candidate synthetic corpus.

    ``labels`` is the declared (public) label set: every row's label must be in it and every class must
    appear. ``llm_used`` says whether an LLM was asked to write the texts (then a text equal to its
    keyphrase list is a failure; in the no-LLM ablation it is the expected output). ``bounds`` override
    ``DEFAULT_BOUNDS``. Returns ``{"success", "expectations": [{"name", "success", "details"}],
    "failed", "n_rows", "bounds", "llm_used", "labels"}``, all JSON-able.
    """
    if not labels:
        raise ConfigError("the release gate needs the declared label set (labels=[...]); got an empty list")
    limits = _bounds(bounds, llm_used)
    frame = derive_quality_columns(df)
    # Labels compare as strings so an int label set and labels read back as strings (or numpy ints) agree.
    frame["q_label_value"] = [None if t in ("NoneType", "missing") else str(_jsonable(v))
                              for v, t in zip(frame["label"] if "label" in frame else [None] * len(frame),
                                              frame["q_label_type"])]

    import great_expectations as gx

    context = _gx_context()
    tag = uuid.uuid4().hex[:12]
    source = context.data_sources.add_pandas(name=f"privseed-release-{tag}")
    asset = source.add_dataframe_asset(name="candidate")
    batch_definition = asset.add_batch_definition_whole_dataframe("whole-candidate")
    suite = context.suites.add(gx.ExpectationSuite(name=f"privseed-release-gate-{tag}"))
    for expectation in build_expectations(labels, llm_used, limits):
        suite.add_expectation(expectation)
    definition = context.validation_definitions.add(
        gx.ValidationDefinition(name=f"privseed-release-{tag}", data=batch_definition, suite=suite)
    )
    try:
        run = definition.run(batch_parameters={"dataframe": frame}, result_format="SUMMARY")
    finally:
        # Keep the process-wide context small when many releases are gated in one process.
        context.validation_definitions.delete(definition.name)
        context.suites.delete(suite.name)
        context.data_sources.delete(source.name)

    expectations = []
    for result in run.results:
        config = result.expectation_config
        name = (config.meta or {}).get("name", config.type)
        expectations.append({
            "name": name,
            "expectation": config.type,
            "success": bool(result.success),
            "details": _details(result),
        })
    failed = [e["name"] for e in expectations if not e["success"]]
    return {
        "success": not failed,
        "failed": failed,
        "expectations": expectations,
        "n_rows": int(len(df)),
        "labels": [_jsonable(v) for v in labels],
        "llm_used": bool(llm_used),
        "bounds": {k: _jsonable(v) for k, v in limits.items()},
    }


def release_gate(*, labels: Sequence[Any], llm_used: bool, **bounds: Any) -> Callable[[pd.DataFrame], dict[str, Any]]:
    """The ``gate=`` callable for ``tasks.corpus.publish_release``: candidate frame -> gate result."""
    _bounds(bounds, llm_used)  # fail on a bad bound when the flow is wired, not after generation
    return functools.partial(validate_release, labels=list(labels), llm_used=llm_used, **bounds)


def _make_task() -> Any:
    from prefect import task

    @task(name="release-gate", retries=0, log_prints=False)
    def validate_release_task(df: pd.DataFrame, labels: list[Any], llm_used: bool,
                              bounds: dict[str, Any] | None = None) -> dict[str, Any]:
        """Prefect task around ``validate_release``; logs only expectation names and counts."""
        from prefect import get_run_logger
        from prefect.exceptions import MissingContextError

        result = validate_release(df, labels=labels, llm_used=llm_used, **(bounds or {}))
        try:
            logger = get_run_logger()
        except MissingContextError:  # the task body called directly (validate_release_task.fn)
            logger = logging.getLogger("privseed.quality")
        if result["success"]:
            logger.info("release gate passed: %d expectations over %d rows", len(result["expectations"]),
                        result["n_rows"])
        else:
            logger.warning("release gate failed: %s", ", ".join(result["failed"]))
        return result

    return validate_release_task


validate_release_task = _make_task()
