"""Release gate: Great Expectations (1.x, in code, no project folder) over a candidate synthetic corpus.

- ``derive_quality_columns`` (pure pandas/python): per-row facts the expectations need and GX cannot
  express directly -- the Python type of each value, word counts, a normalised text for duplicate
  detection, which prompt/template residue a text carries, and the document predicate's reason
  (``q_document_reason``, ``privseed.tasks.quality.predicate.document_rejection``; with the release's
  ``finish_reason`` and ``mean_logprob`` columns when it has them).
- ``ReleaseGate`` (made by ``release_gate``) runs the suite: ``check_part`` builds an ephemeral GX context, a
  pandas data source with a dataframe asset and a whole-dataframe batch, one suite of named expectations over
  those columns and a ``ValidationDefinition``, over every row of one part, and keeps a small ``PartCheck``;
  ``combine`` turns the checks of all parts into one JSON-able result naming every expectation and whether it
  held, by GX's own rules over the totals (so generation shards can gate their own parts on the workers and no
  process holds every row). ``validate_release(df)`` is the whole frame as one part.

The gate only reads the synthetic candidate, which is differentially private by post-processing, so the
details it reports (counts, a few truncated example values) leak nothing about the private corpus.

``release_gate`` makes the ``gate=`` of ``privseed.tasks.data.corpus.publish_release`` (callable on a frame, or
combining the
checks of staged parts); ``validate_release_task`` is the Prefect task for flows that gate outside of publishing.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from privseed.tasks.errors import ConfigError
from privseed.tasks.quality.patterns import template_residue
from privseed.tasks.quality.predicate import (DEFAULT_RULES, REJECTION_REASONS, DocumentRules, document_rejection,
                                              rules_from_bounds)

# GX must not phone home or draw progress bars; set before great_expectations is imported.
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

REQUIRED_COLUMNS: tuple[str, ...] = ("text", "label", "keyphrases")

DEFAULT_BOUNDS: dict[str, float | int | None] = {
    # A synthetic document shorter than this many words is not a document (a failed or truncated call).
    # None: 5 words when an LLM wrote the texts, 1 in the no-LLM ablation (a text is its keyphrases).
    "min_words": None,
    # Longer than this is a runaway generation (the LLM ignored max_tokens or looped).
    "max_words": 2000,
    # Share of rows whose normalised text repeats an earlier row; above this the LLM collapsed.
    "max_duplicate_rate": 0.05,
    # Share of rows allowed to carry prompt or chat-template residue (none by default).
    "max_residue_rate": 0.0,
    # When an LLM wrote the texts: share of rows allowed to fail each document test of ``document_rejection``
    # (none by default: generation regenerates and then drops what still fails, see tasks/generation/rounds.py).
    "max_non_document_rate": 0.0,
    "min_rows": 1,
}


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


def derive_quality_columns(df: pd.DataFrame, rules: DocumentRules | None = None) -> pd.DataFrame:
    """The frame GX validates: the required columns (when present) plus derived ``q_*`` columns.
    ``q_document_reason`` is ``document_rejection`` of each row (with its ``finish_reason`` column when the
    release has one) under ``rules`` (default DEFAULT_RULES).

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
    finish = column_or_missing("finish_reason")
    document_rules = rules or DEFAULT_RULES
    logprobs = [float(v) if isinstance(v, (int, float, np.number)) and np.isfinite(v) else None
                for v in column_or_missing("mean_logprob")]
    out["q_document_reason"] = [document_rejection(t, k, f if isinstance(f, str) else None, document_rules, lp, lab)
                                for t, k, f, lp, lab in zip(texts, keyphrases, finish, logprobs, labels)]
    return out


def _bounds(overrides: dict[str, Any], llm_used: bool) -> dict[str, Any]:
    unknown = sorted(set(overrides) - set(DEFAULT_BOUNDS))
    if unknown:
        raise ConfigError(f"unknown release-gate bound(s) {unknown}; known: {sorted(DEFAULT_BOUNDS)}")
    bounds = {**DEFAULT_BOUNDS, **{k: v for k, v in overrides.items() if v is not None}}
    if bounds["min_words"] is None:
        bounds["min_words"] = 5 if llm_used else 1
    for rate in ("max_duplicate_rate", "max_residue_rate", "max_non_document_rate"):
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
        # One expectation per reason of the document predicate (privseed.tasks.quality.document_rejection), all read
        # from the same q_document_reason column, so the gate names what is wrong. Type and length problems have
        # their own expectations above.
        for reason in REJECTION_REASONS:
            if reason in ("not_text", "too_short", "too_long", "prompt_residue"):
                continue
            expectations.append(named(f"document:no {reason}", gxe.ExpectColumnValuesToNotBeInSet(
                column="q_document_reason", value_set=[reason],
                mostly=1.0 - float(bounds["max_non_document_rate"]))))
    return expectations


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


def _run_suite(frame: pd.DataFrame, labels: Sequence[Any], llm_used: bool, limits: dict[str, Any]) -> list[Any]:
    """The GX suite over a frame of derived columns (every row): GX's expectation results, in suite order."""
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
        # Keep the process-wide context small when many releases (or parts) are gated in one process.
        context.validation_definitions.delete(definition.name)
        context.suites.delete(suite.name)
        context.data_sources.delete(source.name)
    return list(run.results)


# GX expectation types by how their findings add up over parts (see ReleaseGate.combine).
_MAP_IGNORING_NULLS = ("expect_column_values_to_be_in_set", "expect_column_values_to_be_between",
                       "expect_column_values_to_not_be_in_set")
_MAP_OVER_ALL_ROWS = ("expect_column_values_to_be_null", "expect_column_values_to_not_be_null")
_EXAMPLES = 3


@dataclass(frozen=True, eq=False)
class PartCheck:
    """The release gate's findings on one part of a candidate corpus, in a form that adds up over parts.

    GX has checked every row of the part; what is kept is small: per expectation its counts (rows, unexpected,
    missing), a few truncated examples and its thresholds; the declared labels the part holds; and a 64-bit
    digest of each distinct normalised text (8 bytes a row) for the corpus-wide duplicate rate. Everything is
    read from the synthetic candidate only (post-processing of released values)."""

    rows: int
    expectations: tuple[dict[str, Any], ...]
    labels_present: frozenset[str]
    text_digests: np.ndarray
    texts_nonnull: int


def _text_digests(texts: Sequence[str]) -> np.ndarray:
    """Sorted distinct 64-bit digests. Two different texts share one with probability 2^-64 per pair (under
    3e-8 for a million rows); it could only count a text as a duplicate, never hide one."""
    import hashlib

    return np.unique(np.fromiter(
        (int.from_bytes(hashlib.blake2b(t.encode("utf-8"), digest_size=8).digest(), "little") for t in texts),
        dtype=np.uint64, count=len(texts)))


def _part_record(result: Any) -> dict[str, Any]:
    """What one GX expectation result contributes to the combined verdict."""
    config = result.expectation_config
    raw = result.result or {}
    kwargs = config.kwargs or {}
    record: dict[str, Any] = {
        "name": (config.meta or {}).get("name", config.type), "expectation": config.type,
        "success": bool(result.success),
        "mostly": kwargs.get("mostly", 1.0), "min_value": kwargs.get("min_value"),
        "max_value": kwargs.get("max_value"),
    }
    for key in ("element_count", "unexpected_count", "missing_count", "observed_value"):
        if raw.get(key) is not None:
            record[key] = _jsonable(raw[key])
    record["examples"] = [_truncate(v) for v in (raw.get("partial_unexpected_list") or [])[:_EXAMPLES]]
    if config.type == "expect_table_columns_to_match_set":
        mismatched = (raw.get("details") or {}).get("mismatched") or {}
        record["missing_columns"] = sorted(str(c) for c in mismatched.get("missing", []))
    exception = (result.exception_info or {}) if hasattr(result, "exception_info") else {}
    if exception.get("raised_exception"):
        record["exception"] = str(exception.get("exception_message", ""))[:300]
    return record


def _combined_expectation(records: Sequence[dict[str, Any]], checks: Sequence[PartCheck],
                          labels: Sequence[Any]) -> dict[str, Any]:
    """One expectation's verdict over all parts, by GX's own rule for its type (expectation.py
    ``_mostly_success``, the null expectations' row-count ratio, ``column.unique_proportion``)."""
    first = records[0]
    kind = first["expectation"]
    details: dict[str, Any] = {}
    if kind == "expect_table_columns_to_match_set":
        missing = sorted({c for r in records for c in r.get("missing_columns", [])})
        success, details = all(r["success"] for r in records), {"missing_columns": missing}
    elif kind == "expect_table_row_count_to_be_between":
        rows = sum(c.rows for c in checks)
        success, details = rows >= (first["min_value"] or 0), {"observed_value": rows}
    elif kind in _MAP_IGNORING_NULLS or kind in _MAP_OVER_ALL_ROWS:
        element = sum(r.get("element_count", 0) for r in records)
        unexpected = sum(r.get("unexpected_count", 0) for r in records)
        missing = sum(r.get("missing_count", 0) for r in records)
        considered = element - missing if kind in _MAP_IGNORING_NULLS else element
        success = considered == 0 or (considered - unexpected) / considered >= float(first["mostly"])
        details = {"element_count": element, "unexpected_count": unexpected}
        if considered:
            details["unexpected_percent"] = 100.0 * unexpected / considered
        if kind in _MAP_IGNORING_NULLS:
            details["missing_count"] = missing
        examples = [e for r in records for e in r["examples"]][:_EXAMPLES]
        if examples:
            details["examples"] = examples
    elif kind == "expect_column_distinct_values_to_contain_set":
        present = frozenset().union(*(c.labels_present for c in checks))
        missing_labels = [str(_jsonable(v)) for v in labels if str(_jsonable(v)) not in present]
        success, details = not missing_labels, {"missing_count": len(missing_labels)}
        if missing_labels:
            details["missing"] = missing_labels[:20]
    elif kind == "expect_column_proportion_of_unique_values_to_be_between":
        nonnull = sum(c.texts_nonnull for c in checks)
        distinct = len(np.unique(np.concatenate([c.text_digests for c in checks]))) if checks else 0
        observed = distinct / nonnull if nonnull else 0.0  # GX's column.unique_proportion: 0 with no values
        low, high = first["min_value"], first["max_value"]
        success = (low is None or observed >= low) and (high is None or observed <= high)
        details = {"observed_value": observed}
    else:  # an expectation added to the suite without a combination rule must not pass silently
        raise ConfigError(f"the release gate cannot combine {kind} over parts")
    errors = [r["exception"] for r in records if r.get("exception")]
    if errors:
        success, details["exception"] = False, errors[0]
    return {"name": first["name"], "expectation": kind, "success": bool(success), "details": details}


@dataclass(frozen=True)
class ReleaseGate:
    """The release gate: GX over every row of a candidate synthetic corpus, whole or in parts.

    ``labels`` is the declared (public) label set: every row's label must be in it and every class must
    appear. ``llm_used`` says whether an LLM was asked to write the texts (then a text equal to its
    keyphrase list is a failure; in the no-LLM ablation it is the expected output). ``bounds`` override
    ``DEFAULT_BOUNDS`` (as sorted (name, value) pairs, so a gate is hashable and compares by value).

    ``check_part(part)`` runs the suite over one part (on a Dask worker, beside the generation that wrote the
    part) and keeps a :class:`PartCheck`; ``combine(checks)`` gives the verdict over all parts: row-wise
    expectations add their counts and apply GX's thresholds to the totals, "every class present" takes the
    union of the parts' labels, the duplicate rate counts distinct text digests over all parts. So a corpus
    cut into parts gets the same verdict as the whole (tests/test_quality.py), and no process holds all rows.
    ``gate(frame)`` is ``combine([check_part(frame)])``: the ``gate=`` callable of ``publish_release``."""

    labels: tuple[Any, ...]
    llm_used: bool
    rules: DocumentRules | None = None
    bounds: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if not self.labels:
            raise ConfigError("the release gate needs the declared label set (labels=[...]); got an empty list")
        self.limits()  # fail on a bad bound when the flow is wired, not after generation

    def limits(self) -> dict[str, Any]:
        return _bounds(dict(self.bounds), self.llm_used)

    def check_part(self, df: pd.DataFrame) -> PartCheck:
        limits = self.limits()
        frame = derive_quality_columns(df, rules_from_bounds(limits, self.rules))
        # Labels compare as strings so an int label set and labels read back as strings (or numpy ints) agree.
        frame["q_label_value"] = [None if t in ("NoneType", "missing") else str(_jsonable(v))
                                  for v, t in zip(frame["label"] if "label" in frame else [None] * len(frame),
                                                  frame["q_label_type"])]
        records = tuple(_part_record(r) for r in _run_suite(frame, self.labels, self.llm_used, limits))
        declared = {str(_jsonable(v)) for v in self.labels}
        texts = [t for t in frame["q_text_normalised"] if isinstance(t, str)]
        return PartCheck(rows=int(len(df)), expectations=records,
                         labels_present=frozenset(v for v in frame["q_label_value"] if v in declared),
                         text_digests=_text_digests(texts), texts_nonnull=len(texts))

    def combine(self, checks: Sequence[PartCheck]) -> dict[str, Any]:
        """The gate result over all parts: ``{"success", "expectations": [{"name", "success", "details"}],
        "failed", "n_rows", "bounds", "llm_used", "labels", "parts"}``, all JSON-able."""
        if not checks:
            raise ConfigError("the release gate needs at least one part to combine")
        names = [[r["name"] for r in c.expectations] for c in checks]
        if any(n != names[0] for n in names):
            raise ConfigError("parts were checked with different release-gate suites; gate them with one gate")
        expectations = [_combined_expectation([c.expectations[j] for c in checks], checks, self.labels)
                        for j in range(len(names[0]))]
        failed = [e["name"] for e in expectations if not e["success"]]
        return {
            "success": not failed,
            "failed": failed,
            "expectations": expectations,
            "n_rows": int(sum(c.rows for c in checks)),
            "parts": len(checks),
            "labels": [_jsonable(v) for v in self.labels],
            "llm_used": bool(self.llm_used),
            "bounds": {k: _jsonable(v) for k, v in self.limits().items()},
        }

    def __call__(self, df: pd.DataFrame) -> dict[str, Any]:
        return self.combine([self.check_part(df)])


def validate_release(df: pd.DataFrame, *, labels: Sequence[Any], llm_used: bool, rules: DocumentRules | None = None,
                     **bounds: Any) -> dict[str, Any]:
    """Run the release gate over a whole candidate synthetic corpus (see :class:`ReleaseGate`). Returns
    ``{"success", "expectations": [{"name", "success", "details"}], "failed", "n_rows", "bounds", "llm_used",
    "labels", "parts"}``, all JSON-able."""
    return release_gate(labels=labels, llm_used=llm_used, rules=rules, **bounds)(df)


def release_gate(*, labels: Sequence[Any], llm_used: bool, rules: DocumentRules | None = None,
                 **bounds: Any) -> ReleaseGate:
    """The ``gate=`` of ``privseed.tasks.data.corpus.publish_release``: a :class:`ReleaseGate` (call it on a candidate
    frame,
    or check parts and combine them)."""
    return ReleaseGate(tuple(labels), bool(llm_used), rules, tuple(sorted(bounds.items())))


def document_gate(labels: Sequence[Any], *, llm_used: bool, language: str | None,
                  document_rules: Mapping[str, Any], class_names: Mapping[str, str] | None = None) -> ReleaseGate:
    """The release gate for the declared ``labels`` with the run's document test (``--language``, ``--document-rule``;
    tasks/config/options.py DocumentOptions; ``class_names``: the public names the prompts named, label -> name);
    the adapter from a command's configuration is tasks/stages/release.py ``gate_from_config``."""
    names = tuple((str(label), str(name)) for label, name in (class_names or {}).items())
    rules = DocumentRules(language=language, class_names=names).with_settings(dict(document_rules))
    return release_gate(labels=labels, llm_used=llm_used, rules=rules)


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
