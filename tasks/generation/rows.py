"""Rows of a synthetic corpus from the candidates of a generation, pure (no I/O): one row per seed
(``assemble_rows``; ``unseeded_rows`` for the only-LLM baseline's prompts; ``no_llm_rows`` for ``--llm none``), the
split of documents from rows whose kept candidate is still not one (``split_documents``) with the generation report
for quality.json, and that report summed over shards (``merge_generation_reports``). Token counts in a row are the
sum over all its candidates (what the run actually spent). Counts only: the report holds no text."""

from __future__ import annotations

from typing import Sequence

import pandas as pd

from privseed.tasks.generation.class_fit import SeedClasses
from privseed.tasks.generation.rounds import best_candidate, cleaned, named_its_class, rejection, select_best
from privseed.tasks.llm.base import ChatResult
from privseed.tasks.llm.released import ReleasedSeed
from privseed.tasks.quality import DEFAULT_RULES, DocumentRules, document_rejection, rewrite_score

#: The columns of a generation's rows (``document_reason`` is dropped by ``split_documents`` before a release).
ROW_COLUMNS = ["text", "label", "keyphrases", "backend", "model", "prompt_version", "seed", "tokens_in",
               "tokens_out", "coverage", "candidates", "finish_reason", "regenerations", "rejections",
               "document_reason"]


def assemble_rows(seeds: Sequence[ReleasedSeed], candidates: Sequence[Sequence[ChatResult]], *, backend: str,
                  model: str, prompt_version: str, first_round: int | None = None,
                  rules: DocumentRules = DEFAULT_RULES, unnamed_version: str | None = None,
                  classes: SeedClasses | None = None) -> pd.DataFrame:
    """One row per seed from its candidates (pure), the best by ``select_best`` (``classes``: the generation's
    judge of class fit, ``privseed.tasks.generation.class_fit``). ``first_round``: candidates per seed before
    regeneration (default: all of them). ``rejections`` lists the reason of every candidate that was not a document;
    ``document_reason`` is the kept candidate's reason (None: it is a document). ``prompt_version`` is the
    prompts'; a kept candidate that was asked without the class name (``named_its_class``) carries
    ``unnamed_version``, the template's plain version (default: ``prompt_version``)."""
    rows = []
    for s, cands in zip(seeds, candidates):
        cands = [cleaned(c) for c in cands]
        reasons = [rejection(s, c, rules) for c in cands]
        best, cov = select_best(s, cands, rules, classes)
        # asked after the first round, once earlier candidates named its class (rounds.named_its_class)
        unnamed = best >= (first_round or len(cands)) and named_its_class(s, cands[:best], rules)
        rows.append({"text": cands[best].text, "label": s.label, "keyphrases": list(s.keyphrases),
                     "backend": backend, "model": model,
                     "prompt_version": (unnamed_version or prompt_version) if unnamed else prompt_version,
                     "seed": s.seed,
                     "tokens_in": sum(c.tokens_in for c in cands), "tokens_out": sum(c.tokens_out for c in cands),
                     "coverage": cov, "candidates": len(cands), "finish_reason": cands[best].finish_reason,
                     "regenerations": max(0, len(cands) - (first_round or len(cands))),
                     "rejections": [r for r in reasons if r is not None], "document_reason": reasons[best]})
    return pd.DataFrame(rows, columns=ROW_COLUMNS)


def unseeded_rows(labels: Sequence, call_seeds: Sequence[int], answers: Sequence[Sequence[ChatResult]], *,
                  backend: str, model: str, prompt_version: str,
                  rules: DocumentRules = DEFAULT_RULES) -> pd.DataFrame:
    """One row per unseeded prompt from its answers (pure), as ``select_best`` without seed terms to cover: the first
    plain document, else the least repetitive one. Row i is ``labels[i]``'s, asked with ``call_seeds[i]``; its
    first answer is the first round, every later one a regeneration or a rewrite."""
    candidates = [[cleaned(a) for a in row] for row in answers]
    reasons = [[document_rejection(c.text, (), c.finish_reason, rules, mean_logprob=c.mean_logprob, label=label)
                for c in row] for row, label in zip(candidates, labels)]
    best = [best_candidate([r is None for r in rs],
                           [rewrite_score(c.text, (), rules) if r is None else 0.0 for c, r in zip(row, rs)],
                           [0.0] * len(rs))
            for row, rs in zip(candidates, reasons)]
    return pd.DataFrame({
        "text": [c[b].text for c, b in zip(candidates, best)], "label": list(labels),
        "keyphrases": [[] for _ in labels], "backend": backend, "model": model, "prompt_version": prompt_version,
        "seed": [int(s) for s in call_seeds],
        "tokens_in": [sum(a.tokens_in for a in c) for c in candidates],
        "tokens_out": [sum(a.tokens_out for a in c) for c in candidates],
        "finish_reason": [c[b].finish_reason for c, b in zip(candidates, best)],
        "candidates": [len(c) for c in candidates], "regenerations": [len(c) - 1 for c in candidates],
        "rejections": [[r for r in rs if r is not None] for rs in reasons],
        "document_reason": [rs[b] for rs, b in zip(reasons, best)],
    })


def no_llm_rows(seeds: Sequence[ReleasedSeed]) -> pd.DataFrame:
    """``--llm none`` (the paper's no-LLM ablation): the keyphrase sequence itself is the document (the document
    predicate does not apply: these rows are keyphrase lists by design)."""
    rows = pd.DataFrame([{"text": " ".join(s.keyphrases), "label": s.label, "keyphrases": list(s.keyphrases),
                          "backend": "none", "model": "", "prompt_version": "none", "seed": s.seed, "tokens_in": 0,
                          "tokens_out": 0, "coverage": 1.0, "candidates": 1, "finish_reason": None,
                          "regenerations": 0, "rejections": [], "document_reason": None} for s in seeds],
                        columns=ROW_COLUMNS)
    return rows


def split_documents(rows: pd.DataFrame, max_regenerations: int | None = None,
                    classes: SeedClasses | None = None) -> tuple[pd.DataFrame, dict]:
    """Drop the rows whose kept candidate is still not a document; return the kept rows (without the internal
    ``document_reason`` column) and the generation quality report for quality.json (pure).

    The report holds counts of synthetic rows and candidates only (post-processing of released values): rows
    generated/kept/dropped, kept per class, drops by reason, rejected candidates by reason, candidates and
    regeneration calls spent, seeds that needed a regeneration and, with ``classes``, kept rows that still read as
    another class (``SeedClasses.fits``)."""
    reasons = rows["document_reason"] if "document_reason" in rows else pd.Series([None] * len(rows))
    bad = reasons.notna().to_numpy()
    kept = rows.loc[~bad].drop(columns=["document_reason"], errors="ignore").reset_index(drop=True)
    rejected: dict[str, int] = {}
    for row_reasons in rows.get("rejections", pd.Series([], dtype=object)):
        for reason in list(row_reasons if row_reasons is not None else []):
            rejected[str(reason)] = rejected.get(str(reason), 0) + 1
    regenerations = pd.to_numeric(rows.get("regenerations", pd.Series(0, index=rows.index)), errors="coerce").fillna(0)
    report = {
        "policy": "rows with no document after the regenerations are dropped before the release gate",
        "max_regenerations": max_regenerations,
        "rows_generated": int(len(rows)),
        "rows_kept": int(len(kept)),
        "rows_dropped": int(bad.sum()),
        "dropped_by_reason": {str(k): int(v) for k, v in reasons[bad].value_counts().items()},
        "kept_per_class": {str(k): int(v) for k, v in kept["label"].value_counts().sort_index().items()}
        if len(kept) else {},
        "candidates": int(pd.to_numeric(rows.get("candidates", pd.Series(1, index=rows.index))).sum()),
        "rejected_candidates_by_reason": dict(sorted(rejected.items())),
        "regeneration_calls": int(regenerations.sum()),
        "rows_regenerated": int((regenerations > 0).sum()),
    }
    if classes is not None:
        report["rows_read_as_another_class"] = int(sum(not classes.fits(str(t), label)
                                                       for t, label in zip(kept["text"], kept["label"])))
    return kept, report


def merge_generation_reports(reports: Sequence[dict]) -> dict:
    """``split_documents``' report of a whole generation from its shards' reports: counts add up (pure)."""
    merged: dict = {}
    for report in reports:
        for key, value in report.items():
            if isinstance(value, dict):
                into = merged.setdefault(key, {})
                for k, v in value.items():
                    into[k] = into.get(k, 0) + v
            elif isinstance(value, int) and not isinstance(value, bool) and key != "max_regenerations":
                merged[key] = merged.get(key, 0) + value
            else:
                merged.setdefault(key, value)
    return {k: dict(sorted(v.items())) if isinstance(v, dict) else v for k, v in merged.items()}
