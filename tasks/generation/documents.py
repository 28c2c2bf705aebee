"""DP-KPS step 7: one LLM prompt per released keyphrase sequence (post-processing, no privacy cost).

Pure parts (no I/O): ``candidate_seed``, ``build_generation_requests``, ``candidate_rounds`` (best-of-k and
regeneration, the calls left to a ``send`` function; ``seeded_rounds`` for released seeds), ``select_best``,
``assemble_rows``, ``no_llm_rows``, ``split_documents``, ``merge_generation_reports``, ``estimate_cost``. I/O part:
``generate_shard`` (backend + call cache + progress bar) runs on Dask workers over shards of seeds (each worker
process loads the local model once, see privseed.tasks.llm.get_backend). A release is written by the shards themselves
(``generate_release_parts``: each shard writes and gate-checks one part, the flow gathers descriptors only; the
Prefect task ``generate_release(sequences, cfg, gate)``); ``generate_seeds`` / the task
``generate_documents(sequences, cfg)`` return the rows as a frame for callers that keep them in memory. Either way
the call cache is listed once per generation and a batching Anthropic run submits all its Message Batches at once
(``fill_cache``).

Privacy: the inputs are ``ReleasedSeed`` objects (terms of the released vocabulary V~, sampled from released
DP-KDEs), recipient few-shot examples and public configuration. Nothing here reads the private corpus, and
logs carry counts only.

Best-of-k (``best_of``): k candidates per seed, each a separate call with its own derived seed. Every candidate
is checked by THE document predicate (``privseed.tasks.quality.document_rejection``: loops, meta-talk, seed echo, other
language, truncation, ...); among the documents, the one with the highest seed-term coverage
(``privseed.tasks.quality.metrics.term_coverage``, the measure the report shows) is kept, ties to the lowest index.

Regeneration (``max_regenerations``): a seed none of whose candidates is a document gets one more candidate,
with a new call seed, per round, for at most that many rounds. A seed that still has no document is marked
(``document_reason``) and ``split_documents`` drops it before the release gate: one stubborn seed must not
block a release of thousands, and a dropped synthetic row leaks nothing (the decision reads only synthetic text
and released seeds). The counts per reason, the regenerations and the drops go into the release's quality.json.
All of this reads only released seeds and synthetic text, so it costs no privacy. Token counts in a row are the
sum over all its candidates (what the run actually spent).

Seed steering (``steer``, local llama.cpp only): see tasks/llm/steering.py.

Unseeded prompts (``generate_unseeded``, the only-LLM baseline of ``privseed experiment``) take the same path to
the backend (``llm_spec``: concurrency, the API key's Secret block, batch state; the call cache; the progress
bar), from a template without seed terms, and their answers meet the same predicate and regeneration policy.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import pandas as pd

from privseed.tasks.data.corpus import ReleasePart, StagedRelease, candidate_folder, new_release_id, write_part
from privseed.tasks.errors import ConfigError, retry_if_transient
from privseed.tasks.generation.defaults import (NO_REPEAT_NGRAM_DEFAULT, REPEAT_PENALTY_DEFAULT, STEER_DEFAULT,
                                                STEER_END_COVERAGE_DEFAULT)
from privseed.tasks.generation.examples import examples_for_doc_type, prompt_examples
from privseed.tasks.llm.base import ChatRequest, ChatResult, LLMBackend, OnEach, SeedSteering
from privseed.tasks.llm.cache import CacheIndex, CallCache
from privseed.tasks.llm.prompting import PromptTemplate, build_request, build_unseeded_request
from privseed.tasks.llm.released import PublicClassNames, RecipientExample, ReleasedSeed, ReleasedVocabulary
from privseed.tasks.llm.service import (KINDS, LLMSpec, as_spec, call_prices, close_backend, complete, get_backend,
                                        kind_of, serving, spec_from_config)
from privseed.tasks.llm.steering import SCHEDULES
from privseed.tasks.quality.metrics import term_coverage
from privseed.tasks.quality import (DEFAULT_RULES, DocumentRules, ReleaseGate, document_rejection, misused_seed_terms,
                                    rewrite_score)

log = logging.getLogger("privseed.generation")

ROW_COLUMNS = ["text", "label", "keyphrases", "backend", "model", "prompt_version", "seed", "tokens_in",
               "tokens_out", "coverage", "candidates", "finish_reason", "regenerations", "rejections",
               "document_reason"]


@dataclass(frozen=True)
class GenerationParams:
    """Public generation settings. ``template`` is a packaged template name or a YAML path."""

    doc_type: str = "document"
    template: str = "generic"
    max_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 1.0
    best_of: int = 1
    few_shot: tuple[RecipientExample, ...] = field(default=())
    # Rounds of regeneration for seeds none of whose candidates is a document: each round asks for one more
    # candidate (a new call seed) for those seeds only. 8, not 3: SmolLM2-135M's DBPedia-14 per-class-20 release
    # keeps 222 rows of 280 instead of 157 (TF-IDF 58.5 % instead of 50.9 %) for 57 % more calls
    # (docs/generation.md); a model that writes documents rarely needs a round at all.
    max_regenerations: int = 8
    # Rounds of one more candidate for a seed whose documents all score 1 or more (``rewrite_score``: a content word
    # six times in 40 words, a type-token ratio of 0.55 or less, a seed glossed as a label); the lowest is kept. 2:
    # without a repeat penalty about one SmolLM2 demo document in seven was repetitive; at the CLI's default
    # penalty (1.15) the demo's first answers rarely are, so the rounds cost almost nothing there
    # (experiments/results/generation.md).
    max_rewrites: int = 2
    # Local llama.cpp decoding (tasks/llm/steering.py): seed-steering strength (0: off), llama.cpp's repeat
    # penalty (1: off) and a token no-repeat n-gram size (0: off). Remote backends ignore them.
    # Their defaults are the command line's (defaults.py), so every caller -- the only-LLM baseline too -- decodes
    # as DP-KPS does unless it says otherwise.
    steer: float = STEER_DEFAULT
    steer_schedule: str = "budget"  # tasks/llm/steering.py SCHEDULES
    # The "budget" schedule holds the end of the answer until this share of the seed terms is written (1: all).
    steer_end_coverage: float = STEER_END_COVERAGE_DEFAULT
    repeat_penalty: float = REPEAT_PENALTY_DEFAULT
    no_repeat_ngram: int = NO_REPEAT_NGRAM_DEFAULT
    # The corpus's declared language for the document predicate (None: no language test).
    language: str | None = "en"
    # The owner's public class names (--class-names): when set, each prompt names its seed's class.
    class_names: PublicClassNames | None = None
    # Thresholds of the document predicate set by name (--document-rule), as sorted (name, value) pairs.
    document_rules: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.max_regenerations < 0:
            raise ConfigError(f"max_regenerations must be >= 0, got {self.max_regenerations}")
        if self.max_rewrites < 0:
            raise ConfigError(f"max_rewrites must be >= 0, got {self.max_rewrites}")
        if self.steer < 0:
            raise ConfigError(f"steer must be >= 0 (0 turns seed steering off), got {self.steer}")
        if self.steer_schedule not in SCHEDULES:
            raise ConfigError(f"steer_schedule must be one of {', '.join(SCHEDULES)}, got {self.steer_schedule!r}")
        if not 0.0 <= self.steer_end_coverage <= 1.0:
            raise ConfigError(f"steer_end_coverage must be in [0, 1], got {self.steer_end_coverage}")
        if self.repeat_penalty <= 0:
            raise ConfigError(f"repeat_penalty must be > 0 (1 turns it off), got {self.repeat_penalty}")
        if self.no_repeat_ngram < 0:
            raise ConfigError(f"no_repeat_ngram must be >= 0 (0 turns it off), got {self.no_repeat_ngram}")
        if self.best_of < 1:
            raise ConfigError(f"best_of must be >= 1, got {self.best_of}")
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")
        document_rules(self)  # an unknown rule or a bad value fails here, not on the first candidate


def candidate_seed(seed: int, j: int) -> int:
    """Call seed of candidate j of a prompt seed: candidate 0 uses the seed itself, others a hash of (seed, j),
    kept in [0, 2^31) for llama.cpp and OpenAI-compatible servers."""
    if j == 0:
        return int(seed) & 0x7FFFFFFF
    return int.from_bytes(hashlib.sha256(f"{int(seed)}:{j}".encode()).digest()[:4], "big") & 0x7FFFFFFF


def steering_for(seed: ReleasedSeed, params: GenerationParams, backend_kind: str) -> SeedSteering | None:
    """The decoding controls of ``seed``'s calls: only for kinds that apply them (``BackendKind.steering``: local
    models; remote APIs cannot), and only when one of them is on, so requests without them keep their cache keys."""
    kind = KINDS.get(backend_kind)
    if kind is None or kind.steering == "none" or (
            params.steer == 0 and params.repeat_penalty == 1.0 and params.no_repeat_ngram == 0):
        return None
    return SeedSteering(tuple(seed.keyphrases), float(params.steer), float(params.repeat_penalty),
                        int(params.no_repeat_ngram), params.steer_schedule, float(params.steer_end_coverage))


def candidate_request(template: PromptTemplate, seed: ReleasedSeed, params: GenerationParams, j: int,
                      backend_kind: str = "local", earlier: Sequence[ChatResult] = (),
                      rules: DocumentRules = DEFAULT_RULES) -> ChatRequest:
    """Candidate j of ``seed`` (pure): the prompt of ``prompt_seed(seed, earlier, rules)`` with call seed
    ``candidate_seed(seed.seed, j)``. ``earlier``: the seed's candidates 0..j-1 (none for the first round)."""
    terms = prompt_seed(seed, earlier, rules)
    return build_request(template, terms, params.doc_type, max_tokens=params.max_tokens, temperature=params.temperature,
                         top_p=params.top_p, call_seed=candidate_seed(seed.seed, j), few_shot=params.few_shot,
                         class_names=params.class_names, steering=steering_for(terms, params, backend_kind))


def prompt_seed(seed: ReleasedSeed, earlier: Sequence[ChatResult],
                rules: DocumentRules = DEFAULT_RULES) -> ReleasedSeed:
    """The seed a candidate's prompt carries (pure): ``seed`` without the terms that its earlier documents misused
    (``misused_seed_terms``: glossed as a label, explained as a word, listed), in the order they were first
    misused, leaving at least half of its distinct terms. A small model that lists or explains a term it cannot
    place does it again at the same prompt (the demo's 84 seeds: rows whose three candidates all did it); asked
    without that term, it writes about the others. Rejected candidates leave the prompt alone: regeneration asks
    for the same seed. A subsequence of a released seed is released, so this costs no privacy."""
    distinct = list(dict.fromkeys(seed.keyphrases))
    budget = len(distinct) - (len(distinct) + 1) // 2
    drop: list[str] = []
    for result in earlier:
        cleaned = _cleaned(result)
        if rejection(seed, cleaned, rules) is not None:
            continue
        for term in misused_seed_terms(cleaned.text, seed.keyphrases, rules):
            if term not in drop and len(drop) < budget:
                drop.append(term)
    return seed.without(drop) if drop else seed


def build_generation_requests(seeds: Sequence[ReleasedSeed], template: PromptTemplate,
                              params: GenerationParams, backend_kind: str = "local") -> list[list[ChatRequest]]:
    """k requests per seed (pure)."""
    return [[candidate_request(template, s, params, j, backend_kind) for j in range(params.best_of)] for s in seeds]


_PREAMBLE = re.compile(
    r"^\s*(?:(?:here(?:'s| is)|sure|certainly|okay)\b[^\n]{0,120}:|"
    r"(?:an?|the|this|my)\s+[^\n:.]{0,60}\b(?:article|summary|document|text|entry|essay|story)\b[^\n:.]{0,40}:)"
    r"[ \t]*(?:\n+|$)", re.I)


_LAST_SENTENCE_END = re.compile(r"[.!?][\"'\u201d\u2019)\]]*(?=\s|$)")

# The report scaffolding instruction-tuned models wrap around a document although the prompt asks for "no
# title, no introduction": a title's label and markup ("**Document Title:** ...", "Title: ...", "# ..."; the
# title's words stay, as the first line: they are the model's words for the subject and often carry seed terms),
# a line that is only a generic section name ("### Introduction", "**Abstract:**", "I. Introduction"), and
# horizontal rules. Other headings stay, so the predicate still sees an outline of the seeds.
_TITLE_LINE = re.compile(r"\A[ \t]*(?:#{1,6}[ \t]+|[*_]*[ \t]*(?:document[ \t]+title|document|title)[ \t]*[*_]*[ \t]*:)"
                         r"(?P<title>[^\n]*)(?:\n|\Z)", re.I)
_TITLE_LABEL = re.compile(r"\A[ \t*_]*(?:document[ \t]+title|document|title)[ \t]*[*_]*[ \t]*:", re.I)
_SECTION_LINE = re.compile(r"^[ \t]*(?:#{1,6}[ \t]*)?[*_]*[ \t]*(?:(?:\d+|[IVX]+)[.)][ \t]*)?[*_]*[ \t]*"
                           r"(?:introduction|abstract|overview|summary|background|conclusions?)[ \t]*[*_]*[ \t]*:?"
                           r"[ \t]*[*_]*[ \t]*$\n?", re.I | re.M)
_RULE_LINE = re.compile(r"^[ \t]*(?:-{3,}|\*{3,}|_{3,})[ \t]*$\n?", re.M)
_BLANK_LINES = re.compile(r"\n[ \t]*\n(?:[ \t]*\n)+")


def strip_scaffolding(text: str) -> str:
    """``text`` with its title line reduced to the title's words, without generic section-name lines and
    horizontal rules (see _TITLE_LINE)."""
    out = _RULE_LINE.sub("", text).lstrip()
    title = _TITLE_LINE.match(out)
    if title:
        words = _TITLE_LABEL.sub("", title.group("title")).strip(" \t*_#\"'\u201c\u201d")
        out = (words + "\n\n" if words else "") + out[title.end():]
    out = _SECTION_LINE.sub("", out)
    return _BLANK_LINES.sub("\n\n", out).strip()


def clean_text(text: str, finish_reason: str | None = None) -> str:
    """Drop what small models put before the document ("Here's a summary of ...:", "A Wikipedia-style
    article:" lines, repeated), report scaffolding around it (``strip_scaffolding``: a title line, "###
    Introduction", "---") and quotes wrapped around the whole answer. An answer cut off at the token limit
    ("length") is trimmed back to its last full sentence when that keeps at least half of it (otherwise the
    document predicate calls it truncated). Touches nothing else."""
    out = text.strip()
    while True:
        m = _PREAMBLE.match(out)
        if not m:
            break
        out = out[m.end():].lstrip()
    out = strip_scaffolding(out)
    if len(out) >= 2 and out[0] == out[-1] and out[0] in "\"'":
        out = out[1:-1].strip()
    if finish_reason == "length":
        from privseed.tasks.quality import ends_a_sentence

        ends = list(_LAST_SENTENCE_END.finditer(out))
        if not ends_a_sentence(out) and ends:
            kept = out[:ends[-1].end()].strip()
            if len(kept.split()) * 2 >= len(out.split()):
                out = kept
    return out


def _cleaned(c: ChatResult) -> ChatResult:
    return dataclasses.replace(c, text=clean_text(c.text, c.finish_reason))


def rejection(seed: ReleasedSeed, candidate: ChatResult, rules: DocumentRules) -> str | None:
    """Why a (cleaned) candidate is not a document, or None: THE predicate,
    privseed.tasks.quality.document_rejection."""
    return document_rejection(candidate.text, seed.keyphrases, candidate.finish_reason, rules,
                              mean_logprob=candidate.mean_logprob)


def select_best(seed: ReleasedSeed, candidates: Sequence[ChatResult],
                rules: DocumentRules = DEFAULT_RULES) -> tuple[int, float]:
    """Index and coverage of the best candidate: documents first, plain ones (``rewrite_score`` under 1: not
    repetitive, no seed glossed as a label) before the others; among plain documents the most seed terms covered
    (privseed.tasks.quality.metrics.term_coverage), among the others the lowest score; then the lowest index. Candidates
    are ranked as given (clean them first)."""
    covs = [term_coverage(c.text, seed.keyphrases) for c in candidates]
    ok = [rejection(seed, c, rules) is None for c in candidates]
    best = best_candidate(ok, [rewrite_score(c.text, seed.keyphrases, rules) if ok[i] else 0.0
                               for i, c in enumerate(candidates)],
                          covs)
    return best, covs[best]


def best_candidate(ok: Sequence[bool], scores: Sequence[float], coverages: Sequence[float]) -> int:
    """Index of the best candidate (pure): documents (``ok``) first, plain ones (repetition score under 1) before
    repetitive ones, the highest coverage among plain documents and the lowest score among repetitive ones, then
    the lowest index."""
    def key(i: int) -> tuple:
        plain = scores[i] < 1.0
        return ok[i], plain, coverages[i] if plain else -scores[i], -i
    return max(range(len(ok)), key=key)


#: ``send(requests, owners, on_each)``: answer every request (a candidate of seed ``owners[j]``), calling
#: ``on_each(j, result)`` as each answer arrives.
SendCandidates = Callable[[list[ChatRequest], list[int], OnEach], None]


#: ``on_settled(i, kept)``: owner i needs no further candidate; ``kept``: it has a document (else it is dropped).
OnSettled = Callable[[int, bool], None]


def candidate_rounds(owners: int, first_round: int, max_regenerations: int,
                     request: Callable[[int, int, Sequence[ChatResult]], ChatRequest],
                     is_document: Callable[[int, ChatResult], bool],
                     send: SendCandidates, on_settled: OnSettled | None = None,
                     is_plain: Callable[[int, ChatResult], bool] | None = None, max_rewrites: int = 0) -> None:
    """Best-of-k, then regeneration (the control flow only; ``request(i, j, earlier)`` builds candidate j of owner
    i, given its candidates 0..j-1, and ``send`` makes the calls). Round 0 asks for candidates 0..first_round-1 of
    every owner; each later round asks for one more candidate (the next index) of every owner none of whose
    candidates so far ``is_document``, at most ``max_regenerations`` times per owner, and of every owner whose
    documents are all repetitive (not ``is_plain``), at most ``max_rewrites`` times per owner. Deterministic in the
    answers: run twice over the same cache, it asks for the same calls. Seeded generation (``seeded_rounds``) and
    the only-LLM baseline (``generate_unseeded``) both regenerate through it, so the two arms of a comparison follow
    one policy.

    ``on_settled(i, kept)`` is told once per owner, as soon as its fate is known: when the last of its candidates of
    a round arrives and no further one will be asked (it has a plain document, or a document and no rewrite left:
    kept; no document and no regeneration left: dropped). A progress bar over the documents advances on it, so its
    total never changes however many regenerations there are."""
    if max_rewrites < 0:
        raise ConfigError(f"max_rewrites must be >= 0, got {max_rewrites}")
    has_document = [False] * owners
    has_plain = [is_plain is None or max_rewrites == 0] * owners
    regenerations_left = [max_regenerations] * owners
    rewrites_left = [max_rewrites] * owners
    n_candidates = [first_round] * owners
    answers: list[dict[int, ChatResult]] = [{} for _ in range(owners)]  # owner -> candidate number -> answer
    lock = threading.Lock()  # backends may deliver answers from their own threads

    def done(i: int) -> bool:
        if has_document[i]:
            return has_plain[i] or rewrites_left[i] == 0
        return regenerations_left[i] == 0

    def judge(asked: list[int], numbers: list[int]) -> OnEach:
        pending = [0] * owners
        for i in asked:
            pending[i] += 1

        def on_each(j: int, result: ChatResult) -> None:
            i = asked[j]
            settled_before = has_document[i] and has_plain[i]  # nothing this answer says can change its fate
            document = not settled_before and is_document(i, result)
            plain = document and (has_plain[i] or is_plain is None or is_plain(i, result))
            with lock:
                answers[i][numbers[j]] = result
                has_document[i] = has_document[i] or document
                has_plain[i] = has_plain[i] or plain
                pending[i] -= 1
                settled = pending[i] == 0 and done(i)
            if settled and on_settled is not None:
                on_settled(i, has_document[i])
        return on_each

    first = [i for i in range(owners) for _ in range(first_round)]
    send([request(i, j, ()) for i in range(owners) for j in range(first_round)], first,
         judge(first, [j for _ in range(owners) for j in range(first_round)]))
    while True:
        again = [i for i in range(owners) if not done(i)]
        if not again:
            break
        for i in again:
            if has_document[i]:
                rewrites_left[i] -= 1
            else:
                regenerations_left[i] -= 1
        numbers = [n_candidates[i] for i in again]
        extra = [request(i, n, [answers[i][k] for k in range(n)]) for i, n in zip(again, numbers)]
        for i in again:
            n_candidates[i] += 1
        send(extra, again, judge(again, numbers))


def seeded_rounds(seeds: Sequence[ReleasedSeed], template: PromptTemplate, params: GenerationParams,
                  backend_kind: str, send: SendCandidates, rules: DocumentRules,
                  on_settled: OnSettled | None = None) -> None:
    """``candidate_rounds`` over released seeds: ``params.best_of`` candidates each (``candidate_request``), then
    up to ``params.max_regenerations`` rounds for the seeds whose cleaned candidates are all rejected and up to
    ``params.max_rewrites`` for those whose documents all score 1 or more (``rewrite_score``: repetitive, or a seed
    listed, glossed as a label or explained), each asked without the terms its earlier documents misused
    (``prompt_seed``)."""
    candidate_rounds(len(seeds), params.best_of, params.max_regenerations,
                     lambda i, j, earlier: candidate_request(template, seeds[i], params, j, backend_kind, earlier,
                                                             rules),
                     lambda i, result: rejection(seeds[i], _cleaned(result), rules) is None, send, on_settled,
                     lambda i, result: rewrite_score(_cleaned(result).text, seeds[i].keyphrases, rules) < 1.0,
                     params.max_rewrites)


def assemble_rows(seeds: Sequence[ReleasedSeed], candidates: Sequence[Sequence[ChatResult]], *, backend: str,
                  model: str, prompt_version: str, first_round: int | None = None,
                  rules: DocumentRules = DEFAULT_RULES) -> pd.DataFrame:
    """One row per seed from its candidates (pure). ``first_round``: candidates per seed before regeneration
    (default: all of them). ``rejections`` lists the reason of every candidate that was not a document;
    ``document_reason`` is the kept candidate's reason (None: it is a document)."""
    rows = []
    for s, cands in zip(seeds, candidates):
        cands = [_cleaned(c) for c in cands]
        reasons = [rejection(s, c, rules) for c in cands]
        best, cov = select_best(s, cands, rules)
        rows.append({"text": cands[best].text, "label": s.label, "keyphrases": list(s.keyphrases),
                     "backend": backend, "model": model, "prompt_version": prompt_version, "seed": s.seed,
                     "tokens_in": sum(c.tokens_in for c in cands), "tokens_out": sum(c.tokens_out for c in cands),
                     "coverage": cov, "candidates": len(cands), "finish_reason": cands[best].finish_reason,
                     "regenerations": max(0, len(cands) - (first_round or len(cands))),
                     "rejections": [r for r in reasons if r is not None], "document_reason": reasons[best]})
    return pd.DataFrame(rows, columns=ROW_COLUMNS)


def no_llm_rows(seeds: Sequence[ReleasedSeed]) -> pd.DataFrame:
    """``--llm none`` (the paper's no-LLM ablation): the keyphrase sequence itself is the document (the document
    predicate does not apply: these rows are keyphrase lists by design)."""
    rows = pd.DataFrame([{"text": " ".join(s.keyphrases), "label": s.label, "keyphrases": list(s.keyphrases),
                          "backend": "none", "model": "", "prompt_version": "none", "seed": s.seed, "tokens_in": 0,
                          "tokens_out": 0, "coverage": 1.0, "candidates": 1, "finish_reason": None,
                          "regenerations": 0, "rejections": [], "document_reason": None} for s in seeds],
                        columns=ROW_COLUMNS)
    return rows


def split_documents(rows: pd.DataFrame, max_regenerations: int | None = None) -> tuple[pd.DataFrame, dict]:
    """Drop the rows whose kept candidate is still not a document; return the kept rows (without the internal
    ``document_reason`` column) and the generation quality report for quality.json (pure).

    The report holds counts of synthetic rows and candidates only (post-processing of released values): rows
    generated/kept/dropped, kept per class, drops by reason, rejected candidates by reason, candidates and
    regeneration calls spent, seeds that needed a regeneration."""
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
    return kept, report


# -- cost ------------------------------------------------------------------------------------------------------
def worst_case_candidates(best_of: int, max_regenerations: int, max_rewrites: int) -> int:
    """The most candidates (calls) one seed can cost (pure): its ``best_of`` first candidates, then one per round of
    ``candidate_rounds``, and every later round spends either a regeneration (no document yet) or a rewrite (its
    documents all repetitive), so at most ``max_regenerations + max_rewrites`` rounds. Reached by a seed whose
    candidates are rejected until its regenerations run out, then repetitive until its rewrites do."""
    return best_of + max_regenerations + max_rewrites


@dataclass(frozen=True)
class LocalSpeed:
    """Decoding time of a local model on this machine, from a short calibration (``calibrate_local_speed``): a call
    costs ``seconds_per_call`` (prompt evaluation, decoding set-up) plus ``seconds_per_token`` per answer token, and
    a call of the run's shape (its seed length and max_tokens) took ``seconds_typical_call``. One process decoding
    one call at a time; ``source`` says what was timed."""

    seconds_per_call: float
    seconds_per_token: float
    seconds_typical_call: float
    source: str

    def seconds(self, calls: int, tokens_out: int) -> float:
        """Time of ``calls`` calls writing ``tokens_out`` tokens in all (every answer at max_tokens: the bound)."""
        return calls * self.seconds_per_call + tokens_out * self.seconds_per_token

    @property
    def tokens_per_second(self) -> float:
        return 1.0 / self.seconds_per_token if self.seconds_per_token > 0 else float("inf")


@dataclass(frozen=True)
class CostEstimate:
    """What a generation sends, before it sends anything. The first round (``calls`` ... ``usd``): every seed's
    ``best_of`` candidates, answers at ``max_tokens``, what a model that always writes plain documents sends. The
    upper bound (``*_bound``), which holds however the answers turn out::

        calls_bound      = first-round calls to send + seeds x (max_regenerations + max_rewrites)
                           (<= seeds x (best_of + max_regenerations + max_rewrites), ``worst_case_candidates``)
        tokens_out_bound = calls_bound x max_tokens
        tokens_in_bound  = first-round input tokens + seeds x (max_regenerations + max_rewrites) x the seed's longest
                           first-round prompt (a later candidate's prompt is the same seed's, or shorter:
                           ``prompt_seed`` only leaves terms out)
        usd_bound        = first round at its price + later rounds at the dearer of the batch and the single-call
                           price (a small later round may not be batched)

    Input tokens come from the local tokenizer, else ~4 characters per token, so they are estimates; the output
    tokens are bounds. ``speed``: a local model's calibrated decoding time (None: remote, or not calibrated)."""

    calls: int
    cached_calls: int
    tokens_in: int
    tokens_out_max: int
    usd: float | None  # None: price unknown for this backend/model
    calls_bound: int | None = None  # None: the same as the first round's calls to send (no later rounds)
    tokens_in_bound: int | None = None
    tokens_out_bound: int | None = None
    usd_bound: float | None = None
    later_rounds: int = 0  # max_regenerations + max_rewrites: the most extra candidates a seed can get
    speed: LocalSpeed | None = None

    @property
    def calls_to_send(self) -> int:
        return self.calls - self.cached_calls

    def seconds_first_round(self) -> float | None:
        """Typical case: the first round's calls, each as long as the calibration's call of the run's shape."""
        return None if self.speed is None else self.calls_to_send * self.speed.seconds_typical_call

    def seconds_bound(self) -> float | None:
        if self.speed is None:
            return None
        return self.speed.seconds(self.calls_bound if self.calls_bound is not None else self.calls_to_send,
                                  self.tokens_out_bound if self.tokens_out_bound is not None else self.tokens_out_max)

    def describe(self) -> str:
        cost = "unknown (no price for this model)" if self.usd is None else f"at most ${self.usd:,.4f}"
        text = (f"{self.calls} LLM calls ({self.cached_calls} already cached, {self.calls_to_send} to "
                f"send), ~{self.tokens_in:,} input tokens, at most {self.tokens_out_max:,} output tokens, cost {cost}")
        if self.later_rounds and self.calls_bound is not None:
            bound_cost = "unknown" if self.usd_bound is None else f"${self.usd_bound:,.4f}"
            text += (f"\n  upper bound with every regeneration and rewrite ({self.later_rounds} more candidates per "
                     f"seed): at most {self.calls_bound:,} calls, ~{self.tokens_in_bound or 0:,} input tokens, "
                     f"{self.tokens_out_bound or 0:,} output tokens, cost at most {bound_cost}")
        if self.speed is not None:
            text += (f"\n  time estimate on this machine, one process (calibrated: {self.speed.source}; "
                     f"{self.speed.seconds_per_call:.2f} s per call + {self.speed.tokens_per_second:,.1f} tokens/s): "
                     f"first round ~{_duration(self.seconds_first_round())} at that call's length, at most "
                     f"~{_duration(self.seconds_bound())} (the bound's calls, every answer at max_tokens); an "
                     f"estimate: it moves with the machine's load")
        return text


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def estimate_cost(spec: LLMSpec, requests: Sequence[ChatRequest], cache: CallCache | None = None,
                  backend: LLMBackend | None = None, later_rounds: int = 0, per_owner: int = 1) -> CostEstimate:
    """Estimate before sending anything (``CostEstimate`` states the bound's formula): ``requests`` are the first
    round, ``per_owner`` consecutive ones per seed (``best_of``), and each seed can get at most ``later_rounds``
    (max_regenerations + max_rewrites) more candidates. Output tokens at max_tokens for every uncached call; input
    tokens from the local tokenizer when a backend is given, else ~4 characters per token."""
    def n_in(r: ChatRequest) -> int:
        text = "\n".join(m.content for m in r.messages)
        return backend.count_tokens(text) if backend is not None else max(1, len(text) // 4)

    if per_owner < 1 or len(requests) % per_owner:
        raise ConfigError(f"{len(requests)} first-round requests do not split into seeds of {per_owner}")
    model_id = backend.model if backend is not None else (spec.model or "")
    kind = backend.name if backend is not None else spec.kind
    found = cache.get_many([r.cache_key(kind, model_id) for r in requests]) if cache is not None else []
    cached = [cache is not None and found[i] is not None for i in range(len(requests))]
    tokens = [n_in(r) for r in requests]
    t_in = sum(t for t, c in zip(tokens, cached) if not c)
    t_out = sum(r.max_tokens for r, c in zip(requests, cached) if not c)
    n_todo = len(requests) - sum(cached)
    p = call_prices(spec, n_todo)
    usd = None if p is None else (t_in * p[0] + t_out * p[1]) / 1e6
    owners = len(requests) // per_owner
    later_in = later_rounds * sum(max(tokens[i * per_owner:(i + 1) * per_owner]) for i in range(owners))
    later_out = later_rounds * sum(max(r.max_tokens for r in requests[i * per_owner:(i + 1) * per_owner])
                                   for i in range(owners))
    later_calls = later_rounds * owners
    single, batched = call_prices(spec, 1), call_prices(spec, max(1, owners))
    usd_later = (None if single is None or batched is None else
                 (later_in * max(single[0], batched[0]) + later_out * max(single[1], batched[1])) / 1e6)
    return CostEstimate(len(requests), sum(cached), t_in, t_out, usd,
                        calls_bound=n_todo + later_calls, tokens_in_bound=t_in + later_in,
                        tokens_out_bound=t_out + later_out,
                        usd_bound=None if usd is None or usd_later is None else usd + usd_later,
                        later_rounds=later_rounds)


#: The calibration's prompt seed: common English words, no data behind them (the first L of them).
CALIBRATION_TERMS = ("river", "village", "church", "market", "harbour", "school", "railway", "mountain", "album",
                     "football", "island", "company", "painter", "species", "novel", "station", "bridge", "film",
                     "league", "castle")


def calibrate_local_speed(backend: LLMBackend, template: PromptTemplate, params: GenerationParams, label: Any,
                          backend_kind: str, length: int = 10, short_tokens: int = 8) -> LocalSpeed:
    """Time a generation of a public seed (the first ``length`` of ``CALIBRATION_TERMS``) in the run's shape (its
    template, decoding and max_tokens) and one of ``short_tokens`` tokens, after an untimed one-token warm-up, and
    fit time = per call + per token x answer tokens. One answer's time for a small model; nothing private is read
    and nothing is cached."""
    terms = [CALIBRATION_TERMS[i % len(CALIBRATION_TERMS)] for i in range(max(1, min(length, len(CALIBRATION_TERMS))))]
    seed = ReleasedVocabulary(terms, "calibration: public words").seed(list(range(len(terms))), label, 12345)

    def timed_call(max_tokens: int) -> tuple[float, int]:
        request = candidate_request(template, seed, dataclasses.replace(params, max_tokens=max_tokens), 0, backend_kind)
        start = time.perf_counter()
        answer = backend.complete([request])[0]
        return time.perf_counter() - start, max(1, answer.tokens_out)

    # The warm-up, untimed: the model loads and the decoding controls build their per-model tables (llama.cpp's
    # steering scans the vocabulary once) there, not inside the timed calls.
    timed_call(1)
    t_short, n_short = timed_call(min(short_tokens, params.max_tokens))
    t_full, n_full = timed_call(params.max_tokens)
    per_token = (t_full - t_short) / (n_full - n_short) if n_full > n_short else 0.0
    if per_token <= 0:  # the model stopped early or the clock jittered: all of the longer call's time per token
        per_token, per_call = t_full / n_full, 0.0
    else:
        per_call = max(0.0, t_short - per_token * n_short)
    return LocalSpeed(per_call, per_token, t_full,
                      f"a public seed of {len(terms)} terms, {n_short} answer tokens in {t_short:.1f} s and "
                      f"{n_full} in {t_full:.1f} s")


# -- I/O -------------------------------------------------------------------------------------------------------
class CallProgress:
    """tqdm bar of a generation (thread-safe), over a total fixed when it is made. ``unit="call"``: every call is
    planned (private evolution's rounds), the bar moves with each call. ``unit="doc"``: the total is the documents
    to write, one per seed; the bar moves when a seed is settled (:func:`candidate_rounds`' ``on_settled``: a
    document kept, or the seed dropped after its last regeneration), and the calls, regenerations included, are a
    count beside it (``calls=``, ``dropped=``), so the percentage and the ETA mean what they say.

    Either way the postfix holds tokens in/out, answers served from the call cache and the cost so far. Pass the
    bar as ``on_result`` to :func:`privseed.tasks.llm.cached_complete` for per-call steps; shards on other processes
    go through :class:`ShardProgress`."""

    def __init__(self, total: int, prices: tuple[float, float] | None, desc: str, enabled: bool,
                 unit: str = "call"):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc=desc, unit=unit, disable=not enabled, leave=False)
        self.per_call = unit == "call"
        self.prices = prices
        self.calls = self.tokens_in = self.tokens_out = self.cached = self.dropped = 0
        self.lock = threading.Lock()

    def __call__(self, r: ChatResult) -> None:
        self.add(1, r.tokens_in, r.tokens_out, int(r.cached))

    def add(self, calls: int, tokens_in: int, tokens_out: int, cached: int = 0) -> None:
        """Calls answered (the bar moves with them when its unit is the call)."""
        with self.lock:
            self.calls += calls
            self.tokens_in += tokens_in
            self.tokens_out += tokens_out
            self.cached += cached
            self._show(calls if self.per_call else 0)

    def settle(self, documents: int = 1, dropped: int = 0) -> None:
        """Seeds settled, ``dropped`` of them without a document (the bar moves with them when its unit is the
        document)."""
        with self.lock:
            self.dropped += dropped
            self._show(0 if self.per_call else documents)

    def on_settled(self, i: int, kept: bool) -> None:
        """:func:`candidate_rounds`' ``on_settled``."""
        self.settle(1, int(not kept))

    def _show(self, steps: int) -> None:
        post: dict[str, int | str] = {} if self.per_call else {"calls": self.calls, "dropped": self.dropped}
        post.update({"in": self.tokens_in, "out": self.tokens_out, "cached": self.cached})
        if self.prices is not None:
            post["usd"] = f"{(self.tokens_in * self.prices[0] + self.tokens_out * self.prices[1]) / 1e6:.4f}"
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(steps)  # 0 redraws the postfix, as often as tqdm's own interval allows

    def close(self) -> None:
        self.bar.close()


class ShardProgress:
    """Per-call progress of a generation split into shards that finish long after their first call (a local
    model writes a few documents a minute): each call of shard i, and each of its seeds as it is settled, arrives
    as a message (``on_call``, from :func:`privseed.tasks.data.cluster.publish_event` on whichever process runs the
    shard) and moves the bar at once; when shard i finishes, ``finished`` adds whatever its messages did not carry
    yet (messages are best-effort), and later messages of that shard are ignored, so the bar counts each call and
    each seed once. ``planned[i]``: shard i's share of the bar's total (its seeds for a bar over documents, its
    calls for a bar over calls)."""

    def __init__(self, bar: CallProgress, planned: Sequence[int]):
        self.bar = bar
        self.planned = [int(p) for p in planned]
        self.seen = [[0, 0, 0, 0, 0] for _ in self.planned]  # calls, tokens in, tokens out, settled, dropped
        self.done: set[int] = set()
        self.lock = threading.Lock()

    def on_call(self, message: dict) -> None:
        i = int(message["shard"])
        with self.lock:
            if i in self.done:
                return
            seen = self.seen[i]
            if "settled" in message:
                if seen[3] < self.planned[i]:
                    seen[3] += 1
                    seen[4] += int(not message["kept"])
                    self.bar.settle(1, int(not message["kept"]))
                return
            seen[0] += 1
            seen[1] += int(message["in"])
            seen[2] += int(message["out"])
            self.bar.add(1, int(message["in"]), int(message["out"]), int(message["cached"]))

    def finished(self, i: int, calls: int, tokens_in: int, tokens_out: int, dropped: int = 0) -> None:
        """Shard i is done: ``calls`` answered (``tokens_in``, ``tokens_out``), ``dropped`` of its seeds without a
        document."""
        with self.lock:
            self.done.add(i)
            seen_calls, seen_in, seen_out, settled, seen_dropped = self.seen[i]
            self.bar.add(max(0, calls - seen_calls), max(0, tokens_in - seen_in), max(0, tokens_out - seen_out))
            if not self.bar.per_call:
                self.bar.settle(max(0, self.planned[i] - settled), max(0, dropped - seen_dropped))


def call_messages(topic: str | None, shard: int) -> Callable[[ChatResult], None] | None:
    """What a shard's calls report to ``ShardProgress.on_call`` through ``topic`` (None: no progress wanted)."""
    if topic is None:
        return None
    from privseed.tasks.data.cluster import publish_event

    def report(result: ChatResult) -> None:
        publish_event(topic, {"shard": shard, "in": result.tokens_in, "out": result.tokens_out,
                              "cached": int(result.cached)})
    return report


def settle_messages(topic: str | None, shard: int) -> OnSettled | None:
    """What a shard's settled seeds report to ``ShardProgress.on_call`` through ``topic`` (None: no progress
    wanted)."""
    if topic is None:
        return None
    from privseed.tasks.data.cluster import publish_event

    def report(i: int, kept: bool) -> None:
        publish_event(topic, {"shard": shard, "settled": 1, "kept": int(kept)})
    return report


def generate_shard(seeds: Sequence[ReleasedSeed], spec: LLMSpec | str, params: GenerationParams,
                   cache_uri: str | None, storage_options: dict | None = None, progress: bool = True,
                   shard: int = 0, cache_index: CacheIndex | None = None,
                   on_call: Callable[[ChatResult], None] | None = None,
                   on_settled: OnSettled | None = None) -> pd.DataFrame:
    """Write one document per seed. Every call goes through the call cache, so re-running a crashed shard
    sends only the calls that never finished. ``cache_index``: the generation's listing of the cache (then
    only its hits are read); None lists the cache here when that is cheaper than probing. ``on_call``: told of
    every finished call, ``on_settled`` of every seed settled (a driver's progress bar, :func:`call_messages`,
    :func:`settle_messages`)."""
    spec = as_spec(spec)
    if not kind_of(spec).writes_text:
        return no_llm_rows(seeds)
    template = PromptTemplate.load(params.template)
    backend = get_backend(spec)
    cache = CallCache(cache_uri, storage_options, index=cache_index) if cache_uri else None
    n_first = len(seeds) * params.best_of
    bar = CallProgress(len(seeds), call_prices(spec, n_first), f"generate[{shard}] {spec.kind}", progress, unit="doc")
    k = params.best_of
    rules = document_rules(params)
    per_seed: list[list[ChatResult]] = [[] for _ in seeds]

    def on_result(result: ChatResult) -> None:
        bar(result)
        if on_call is not None:
            on_call(result)

    def settled(i: int, kept: bool) -> None:
        bar.on_settled(i, kept)
        if on_settled is not None:
            on_settled(i, kept)

    def send(requests: list[ChatRequest], owners: list[int], on_each: OnEach) -> None:
        for i, result in zip(owners, complete(spec, requests, cache, on_result=on_result, on_each=on_each)):
            per_seed[i].append(result)

    try:
        seeded_rounds(seeds, template, params, spec.kind, send, rules, settled)
    finally:
        bar.close()
    df = assemble_rows(seeds, per_seed, backend=backend.name, model=backend.model,
                       prompt_version=template.version_for(params.class_names is not None), first_round=k,
                       rules=rules)
    log.info("shard %d: %d documents, %d calls (%d cached), %d input / %d output tokens", shard, len(df),
             sum(len(c) for c in per_seed), bar.cached, bar.tokens_in, bar.tokens_out)
    return df


def document_rules(params: GenerationParams) -> DocumentRules:
    """The document predicate's rules for this generation: the declared language, the prompt's few-shot
    documents, which a candidate must not copy, and the thresholds the owner set (``--document-rule``). (The
    release gate builds the same from the config, without the
    examples: rows that copied one were already regenerated or dropped here.)"""
    return DocumentRules(language=params.language, examples=tuple(e.document for e in params.few_shot)).with_settings(
        dict(params.document_rules))


def shard_seeds(seeds: Sequence[ReleasedSeed], shard_size: int) -> list[list[ReleasedSeed]]:
    size = max(1, int(shard_size))
    return [list(seeds[i:i + size]) for i in range(0, len(seeds), size)]


def _batched(spec: LLMSpec, n_calls: int) -> bool:
    """Whether a run of ``n_calls`` goes through a batch API (the kind's own rule)."""
    return kind_of(spec).batches(spec, n_calls)


def _listed_cache(cache_uri: str | None, storage_options: dict | None) -> CacheIndex | None:
    """The generation's one listing of the call cache (None without a cache)."""
    return CallCache(cache_uri, storage_options).list_index() if cache_uri else None


def generate_seeds(seeds: Sequence[ReleasedSeed], spec: LLMSpec | str, params: GenerationParams,
                   cache_uri: str | None, storage_options: dict | None = None, shard_size: int = 16,
                   progress: bool = True) -> pd.DataFrame:
    """One document per seed, as a frame (callers that keep the documents in memory: evaluation baselines,
    benchmarks; a release is written by :func:`generate_release_parts`). With a Dask client (the flow's),
    shards of ``shard_size`` seeds run on the workers, each worker process keeping its model loaded, and one
    progress bar here over the documents moves as each seed is settled (``ShardProgress``); without one,
    everything runs in this process with the same bar. Rows come back in seed order. The call cache is listed
    once, here, and every shard reads only its hits. A batching Anthropic run is one shard: Message Batches want
    one big submission."""
    spec = as_spec(spec)
    if not kind_of(spec).writes_text:
        return no_llm_rows(seeds)
    if not seeds:
        return pd.DataFrame(columns=ROW_COLUMNS)
    with serving(spec) as served:
        return _generate_seeds(seeds, served, params, cache_uri, storage_options, shard_size, progress)


def _generate_seeds(seeds: Sequence[ReleasedSeed], spec: LLMSpec, params: GenerationParams, cache_uri: str | None,
                    storage_options: dict | None, shard_size: int, progress: bool) -> pd.DataFrame:
    n_calls = len(seeds) * params.best_of
    if _batched(spec, n_calls):
        shard_size = len(seeds)
    from privseed.tasks.data.cluster import current_client

    client = current_client()
    shards = shard_seeds(seeds, shard_size)
    index = _listed_cache(cache_uri, storage_options)
    if client is None or len(shards) == 1:
        try:
            frames = [generate_shard(sh, spec, params, cache_uri, storage_options, progress, i, index)
                      for i, sh in enumerate(shards)]
        finally:
            # Generation is over in this process: free a local model now rather than at interpreter
            # teardown (workers keep theirs for their next shard and free them when they exit).
            close_backend(spec)
        return pd.concat(frames, ignore_index=True)
    from privseed.tasks.data.cluster import map_shards

    bar = CallProgress(len(seeds), call_prices(spec, n_calls), f"generate {spec.kind}", progress, unit="doc")
    calls = ShardProgress(bar, [len(shard) for shard in shards])

    def advance(i: int, df: pd.DataFrame) -> None:
        calls.finished(i, int(df["candidates"].sum()), int(df["tokens_in"].sum()), int(df["tokens_out"].sum()),
                       int(df["document_reason"].notna().sum()))

    try:
        with _call_topic(calls, progress) as topic:
            frames = map_shards(_numbered_shard, list(enumerate(shards)), spec, params, cache_uri, storage_options,
                                index, topic, on_done=advance)
    finally:
        bar.close()
    return pd.concat(frames, ignore_index=True)


def _call_topic(calls: ShardProgress, progress: bool) -> Any:
    """The topic shards report their calls on (``privseed.tasks.data.cluster.shard_events``), or none without a bar."""
    import contextlib

    from privseed.tasks.data.cluster import shard_events

    return shard_events(calls.on_call) if progress else contextlib.nullcontext(None)


def _numbered_shard(shard: tuple[int, Sequence[ReleasedSeed]], spec: LLMSpec, params: GenerationParams,
                    cache_uri: str | None, storage_options: dict | None,
                    cache_index: CacheIndex | None, topic: str | None = None) -> pd.DataFrame:
    number, seeds = shard
    return generate_shard(seeds, spec, params, cache_uri, storage_options, False, number, cache_index,
                          on_call=call_messages(topic, number), on_settled=settle_messages(topic, number))


# -- a release written by the shards -------------------------------------------------------------------------
#: Most rows in one part of a release written by generation shards.
MAX_PART_ROWS = 5000


def part_size(n_seeds: int, n_threads: int, shard_size: int = 16) -> int:
    """Seeds per generation shard when each shard writes one part: about four shards per worker thread (load
    balance and a moving progress bar), at least ``shard_size`` seeds, at most :data:`MAX_PART_ROWS`."""
    return max(1, min(MAX_PART_ROWS, max(shard_size, -(-n_seeds // (4 * max(1, n_threads))))))


@dataclass(frozen=True, eq=False)
class GeneratedPart:
    """What a generation shard sends back instead of its rows: the part it wrote (None when every row was
    dropped), its generation report (counts of synthetic rows and candidates) and what its calls spent."""

    part: ReleasePart | None
    report: dict
    calls: int
    tokens_in: int
    tokens_out: int


def generate_part(shard: tuple[int, Sequence[ReleasedSeed]], spec: LLMSpec, params: GenerationParams,
                  cache_uri: str | None, storage_options: dict | None, cache_index: CacheIndex | None, out: str,
                  release_id: str, gate: ReleaseGate | None, topic: str | None = None) -> GeneratedPart:
    """One generation shard, on a Dask worker: its documents (``generate_shard``), the non-documents dropped
    (``split_documents``), the rest written as part ``shard[0]`` of the release and checked by the gate there
    (``privseed.tasks.data.corpus.write_part``). Only the small descriptor leaves the worker; each call is reported on
    ``topic`` as it finishes (the driver's progress bar)."""
    number, seeds = shard
    rows = generate_shard(seeds, spec, params, cache_uri, storage_options, False, number, cache_index,
                          on_call=call_messages(topic, number), on_settled=settle_messages(topic, number))
    kept, report = split_documents(rows, params.max_regenerations)
    part = write_part(out, release_id, number, kept, storage_options, gate) if len(kept) else None
    return GeneratedPart(part, report, int(rows["candidates"].sum()), int(rows["tokens_in"].sum()),
                         int(rows["tokens_out"].sum()))


def fill_cache(seeds: Sequence[ReleasedSeed], spec: LLMSpec | str, params: GenerationParams, cache_uri: str,
               storage_options: dict | None, cache_index: CacheIndex | None, progress: bool = False) -> CacheIndex:
    """Every call of a batching run, sent at once (the backend submits all Message Batches together) with the
    regeneration rounds of ``seeded_rounds``; answers go to the call cache only (and are judged as they
    arrive), so the shards that write the parts afterwards find every call there. Returns the cache index with
    the new entries (the shards read it instead of listing the cache again)."""
    spec = as_spec(spec)
    template = PromptTemplate.load(params.template)
    cache = CallCache(cache_uri, storage_options, index=cache_index)
    cache.load_index()
    n_first = len(seeds) * params.best_of
    bar = CallProgress(len(seeds), call_prices(spec, n_first), f"generate {spec.kind} (batches)", progress,
                       unit="doc")
    sent: list[int] = []

    def send(requests: list[ChatRequest], owners: list[int], on_each: OnEach) -> None:
        sent.append(len(requests))
        complete(spec, requests, cache, on_result=bar, on_each=on_each, keep=False)

    try:
        seeded_rounds(seeds, template, params, spec.kind, send, document_rules(params), bar.on_settled)
    finally:
        bar.close()
    log.info("batched calls: %d requests in %d round(s), %d served from the cache", sum(sent), len(sent), bar.cached)
    return cache.index  # type: ignore[return-value]


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


def generate_release_parts(seeds: Sequence[ReleasedSeed], spec: LLMSpec | str, params: GenerationParams,
                           cache_uri: str | None, storage_options: dict | None, *, out: str,
                           gate: ReleaseGate | None, release_id: str | None = None, shard_size: int | None = None,
                           progress: bool = True) -> StagedRelease:
    """One document per seed, written straight into a release: each generation shard (a Dask task, or a loop
    here without a cluster) writes its documents as one part of release ``release_id`` under ``out`` and checks
    it with ``gate``; this process gathers the parts' descriptors only, never the rows, and hands them to
    ``privseed.tasks.data.corpus.publish_release``, which combines the checks and commits the manifest. Until then no
    manifest names the parts, so the last good release is untouched whatever happens here.

    The call cache is listed once, here; a batching Anthropic run first sends all its calls at once
    (``fill_cache``, on a worker when there is a cluster), then the shards read their answers from the cache."""
    spec = as_spec(spec)
    if not kind_of(spec).writes_text:
        raise ConfigError("--llm none writes no documents; its release is the keyphrase sequences themselves")
    with serving(spec) as served:
        return _generate_release_parts(seeds, served, params, cache_uri, storage_options, out=out, gate=gate,
                                       release_id=release_id, shard_size=shard_size, progress=progress)


def _generate_release_parts(seeds: Sequence[ReleasedSeed], spec: LLMSpec, params: GenerationParams,
                            cache_uri: str | None, storage_options: dict | None, *, out: str,
                            gate: ReleaseGate | None, release_id: str | None, shard_size: int | None,
                            progress: bool) -> StagedRelease:
    from privseed.tasks.data.cluster import current_client, map_shards

    release_id = release_id or new_release_id()
    client = current_client()
    threads = sum(client.nthreads().values()) if client is not None else 1
    shards = shard_seeds(seeds, shard_size or part_size(len(seeds), threads))
    index = _listed_cache(cache_uri, storage_options)
    n_calls = len(seeds) * params.best_of
    try:
        if cache_uri and _batched(spec, n_calls):
            if client is None:
                index = fill_cache(seeds, spec, params, cache_uri, storage_options, index, progress)
            else:
                index = client.submit(fill_cache, list(seeds), spec, params, cache_uri, storage_options, index,
                                      pure=False).result()
        bar = CallProgress(len(seeds), call_prices(spec, n_calls), f"generate {spec.kind}", progress, unit="doc")
        calls = ShardProgress(bar, [len(shard) for shard in shards])

        def advance(i: int, done: GeneratedPart) -> None:
            calls.finished(i, done.calls, done.tokens_in, done.tokens_out, int(done.report.get("rows_dropped", 0)))

        try:
            with _call_topic(calls, progress) as topic:
                generated = map_shards(generate_part, list(enumerate(shards)), spec, params, cache_uri,
                                       storage_options, index, out, release_id, gate, topic, on_done=advance)
        finally:
            bar.close()
    finally:
        if client is None or len(shards) <= 1:
            close_backend(spec)  # generation ran in this process: free a local model now (see generate_seeds)
    report = merge_generation_reports([g.report for g in generated])
    parts = tuple(g.part for g in generated if g.part is not None)
    log.info("generation wrote %d part(s) of release %s: %d rows kept of %d", len(parts), release_id,
             report.get("rows_kept", 0), report.get("rows_generated", 0))
    return StagedRelease(out, release_id, parts, gate, report)


def generate_unseeded(labels: Sequence, per_class: int, spec: LLMSpec | str, params: GenerationParams,
                      cache_uri: str | None, call_seeds: Sequence[int], storage_options: dict | None = None,
                      progress: bool = True) -> pd.DataFrame:
    """``per_class`` documents per label from an unseeded template (``params.template``, e.g. ``only_llm``): the
    prompt holds the document type and, with ``params.class_names``, the class's public name; nothing of any
    private corpus. One call per document, ``call_seeds[i]`` for row i (labels in order, ``per_class`` each),
    through the same backends, call cache and progress bar as seeded generation: a re-run sends only the calls
    that never finished.

    The answers go through the same cleaning and the same document predicate as a DP-KPS release, with the same
    regeneration policy (``params.max_regenerations`` rounds, one new call seed per round, ``candidate_seed``;
    ``params.max_rewrites`` for repetitive documents),
    and a row with no document after them is dropped. A baseline that kept its loops and meta-talk would be
    scored on other texts than the method it is compared with. There are no seed terms, so the seed-echo tests
    do not apply. The frame's ``attrs["quality"]`` is the same quality report a release writes
    (``split_documents``)."""
    spec = as_spec(spec)
    if not kind_of(spec).writes_text:
        raise ConfigError("unseeded prompts need an LLM (--llm local or anthropic:MODEL)")
    with serving(spec) as served:
        return _generate_unseeded(labels, per_class, served, params, cache_uri, call_seeds, storage_options, progress)


def _generate_unseeded(labels: Sequence, per_class: int, spec: LLMSpec, params: GenerationParams,
                       cache_uri: str | None, call_seeds: Sequence[int], storage_options: dict | None,
                       progress: bool) -> pd.DataFrame:
    template = PromptTemplate.load(params.template)
    row_labels = [label for label in labels for _ in range(per_class)]
    if len(call_seeds) != len(row_labels):
        raise ConfigError(f"{len(row_labels)} documents but {len(call_seeds)} call seeds")
    rules = document_rules(params)

    def request(row: int, j: int, earlier: Sequence[ChatResult]) -> ChatRequest:
        return build_unseeded_request(template, row_labels[row], params.doc_type, max_tokens=params.max_tokens,
                                      temperature=params.temperature, top_p=params.top_p,
                                      call_seed=candidate_seed(call_seeds[row], j), class_names=params.class_names)

    def unseeded_document(i: int, answer: ChatResult) -> bool:
        return document_rejection(_cleaned(answer).text, (), answer.finish_reason, rules,
                                  mean_logprob=answer.mean_logprob) is None

    def unseeded_plain(i: int, answer: ChatResult) -> bool:
        return rewrite_score(_cleaned(answer).text, (), rules) < 1.0

    backend = get_backend(spec)
    cache = CallCache(cache_uri, storage_options) if cache_uri else None
    bar = CallProgress(len(row_labels), call_prices(spec, len(row_labels)), f"generate {spec.kind}", progress,
                       unit="doc")
    answers: list[list[ChatResult]] = [[] for _ in row_labels]

    def send(requests: list[ChatRequest], owners: list[int], on_each: OnEach) -> None:
        for i, answer in zip(owners, complete(spec, requests, cache, on_result=bar, on_each=on_each)):
            answers[i].append(answer)

    try:
        candidate_rounds(len(row_labels), 1, params.max_regenerations, request, unseeded_document, send,
                         bar.on_settled, unseeded_plain, params.max_rewrites)
    finally:
        bar.close()
        close_backend(spec)
    candidates = [[_cleaned(a) for a in row] for row in answers]
    reasons = [[document_rejection(c.text, (), c.finish_reason, rules, mean_logprob=c.mean_logprob) for c in row]
               for row in candidates]
    # As select_best, without seed terms to cover: the first plain document, else the least repetitive one.
    best = [best_candidate([r is None for r in rs],
                           [rewrite_score(c.text, (), rules) if r is None else 0.0 for c, r in zip(row, rs)],
                           [0.0] * len(rs))
            for row, rs in zip(candidates, reasons)]
    rows = pd.DataFrame({
        "text": [c[b].text for c, b in zip(candidates, best)], "label": row_labels,
        "keyphrases": [[] for _ in row_labels], "backend": backend.name, "model": backend.model,
        "prompt_version": template.version_for(params.class_names is not None),
        "seed": [int(s) for s in call_seeds],
        "tokens_in": [sum(a.tokens_in for a in c) for c in candidates],
        "tokens_out": [sum(a.tokens_out for a in c) for c in candidates],
        "finish_reason": [c[b].finish_reason for c, b in zip(candidates, best)],
        "candidates": [len(c) for c in candidates], "regenerations": [len(c) - 1 for c in candidates],
        "rejections": [[r for r in rs if r is not None] for rs in reasons],
        "document_reason": [rs[b] for rs, b in zip(reasons, best)],
    })
    kept, report = split_documents(rows, params.max_regenerations)
    kept.attrs["quality"] = report
    log.info("unseeded generation: %d rows kept of %d", report["rows_kept"], report["rows_generated"])
    return kept


def seeds_from_sequences(sequences: pd.DataFrame, vocabulary: Sequence[str] | None, run_seed: int,
                         source: str = "released vocabulary") -> list[ReleasedSeed]:
    """Mint prompt seeds from the sampler's output (columns ``label``, ``keyphrases``). ``vocabulary`` is the
    released V~ (default: ``sequences.attrs["released_vocabulary"]``): every keyphrase must belong to it.
    Call seeds come from ``public_rng(run_seed, "generate")``, one per row, so a re-run repeats every call."""
    from privseed.tasks.dp.ledger import public_rng

    if vocabulary is None:
        vocabulary = sequences.attrs.get("released_vocabulary")
    if vocabulary is None:
        raise ConfigError("generation needs the released vocabulary V~ (pass it, or set "
                          "sequences.attrs['released_vocabulary']) to check that prompts carry released terms only")
    released = ReleasedVocabulary(list(vocabulary), sequences.attrs.get("released_vocabulary_source", source))
    call_seeds = public_rng(run_seed, "generate").integers(0, 2**31 - 1, size=len(sequences))
    return [released.seed(list(k), lab, int(sd))
            for k, lab, sd in zip(sequences["keyphrases"], sequences["label"], call_seeds)]


def refuse_remote_llm_for_reproducible_noise(llm: LLMSpec | str, reproducible_noise: bool) -> None:
    """A run drawn from reproducible noise (``--insecure-reproducible-noise``, research grids only) is refused with an
    LLM whose calls leave this machine (``anthropic:``, ``openai-compatible:``). Its seeds are a deterministic
    function of the private corpus (anyone who reads --seed can subtract the noise), and the provider would
    receive them before the release gate refuses the run; docs/privacy.md lets a provider see released DP seeds
    only. Local weights (``local``, ``local-server``) and ``none`` are allowed."""
    kind = kind_of(llm)
    if reproducible_noise and kind.writes_text and not kind.local_weights:
        raise ConfigError(f"--insecure-reproducible-noise with --llm {as_spec(llm)}: the seeds of such a run are not "
                          "differentially private and would be sent to the LLM provider; use --llm local or "
                          "local-server for a reproducible research run, or drop --insecure-reproducible-noise")


def class_names_from_config(cfg) -> PublicClassNames | None:
    """The owner's public class names (``--class-names FILE``), checked against the declared labels when the
    config declares them (a flow that has none takes the file's labels as the declared set); None when unset."""
    from privseed.tasks.llm.released import load_class_names

    path = getattr(cfg, "class_names", None)
    if not path:
        return None
    names = load_class_names(path, cfg.storage_options)
    if cfg.labels is not None:
        names.check_labels(cfg.labels)
    return names


def params_from_config(cfg) -> GenerationParams:
    """GenerationParams from a flow config (DpKpsConfig or any ReleaseConfig); fields it lacks keep defaults."""
    from privseed.tasks.llm.released import load_few_shot

    few = getattr(cfg, "few_shot", None)
    # The owner's --few-shot wins; else a local model is shown the example library's documents of the doc type's
    # kind (tasks/generation/examples.py); a config without the option (PE) keeps its prompts without examples.
    library = getattr(cfg, "examples", "none")
    local = kind_of(spec_from_config(cfg)).local_weights
    shown = prompt_examples(few, library, local, cfg.doc_type)
    examples: tuple[RecipientExample, ...] = ()
    if few:
        examples = tuple(load_few_shot(few, cfg.storage_options))
    elif shown is not None:
        examples = examples_for_doc_type(cfg.doc_type)
        log.info("prompts show the example library's %s documents (--doc-type %r)", shown, cfg.doc_type)
    elif library == "library" and local:
        log.info("no example documents: --doc-type %r names no kind of the example library", cfg.doc_type)
    class_names = class_names_from_config(cfg)
    kw = {k: getattr(cfg, k) for k in ("max_tokens", "temperature", "best_of", "max_regenerations", "max_rewrites",
                                       "steer",
                                       "steer_schedule", "steer_end_coverage", "repeat_penalty", "no_repeat_ngram")
          if getattr(cfg, k, None) is not None}
    if hasattr(cfg, "language"):
        kw["language"] = cfg.language
    if getattr(cfg, "document_rules", None):
        kw["document_rules"] = tuple(sorted(cfg.document_rules.items()))
    template = getattr(cfg, "prompt_template", None)
    if template:
        kw["template"] = template
    return GenerationParams(doc_type=cfg.doc_type, few_shot=examples, class_names=class_names, **kw)


def estimate_generation(sequences: pd.DataFrame, cfg, vocabulary: Sequence[str] | None = None,
                        calibrate: bool = True) -> CostEstimate:
    """``--dry-run``: what generation would send, from the released seeds (``estimate_cost``: the first round and
    the upper bound over every regeneration and rewrite round); sends nothing. For a local model (``calibrate``)
    also the time it would take on this machine, from two short timed generations of a public seed
    (``calibrate_local_speed``) with the model that counted the prompts."""
    seeds = seeds_from_sequences(sequences, vocabulary, cfg.seed)
    spec, params = spec_from_config(cfg), params_from_config(cfg)
    template = PromptTemplate.load(params.template)
    flat = [r for per in build_generation_requests(seeds, template, params, spec.kind) for r in per]
    backend = get_backend(spec) if kind_of(spec).local_weights else None
    cache = CallCache(_cache_uri(cfg), cfg.storage_options)
    try:
        later_rounds = params.max_regenerations + params.max_rewrites
        estimate = estimate_cost(spec, flat, cache, backend, later_rounds=later_rounds, per_owner=params.best_of)
        if backend is not None and calibrate and seeds:
            speed = calibrate_local_speed(backend, template, params, seeds[0].label, spec.kind,
                                          getattr(cfg, "length", 10))
            estimate = dataclasses.replace(estimate, speed=speed)
        return estimate
    finally:
        if backend is not None:
            backend.close()  # its tokenizer counted the prompts; the weights are not needed any more


def _cache_uri(cfg) -> str:
    from privseed.tasks import storage

    return storage.join(cfg.state_uri, "llm-cache")


def _generate_documents(sequences: pd.DataFrame, cfg, vocabulary: Sequence[str] | None = None) -> pd.DataFrame:
    seeds = seeds_from_sequences(sequences, vocabulary, cfg.seed)
    spec, params = spec_from_config(cfg), params_from_config(cfg)
    refuse_remote_llm_for_reproducible_noise(spec, cfg.insecure_reproducible_noise)
    return generate_seeds(seeds, spec, params, _cache_uri(cfg), cfg.storage_options or None)


def _generate_release(sequences: pd.DataFrame, cfg, gate: ReleaseGate | None,
                      vocabulary: Sequence[str] | None = None) -> StagedRelease:
    seeds = seeds_from_sequences(sequences, vocabulary, cfg.seed)
    spec, params = spec_from_config(cfg), params_from_config(cfg)
    refuse_remote_llm_for_reproducible_noise(spec, cfg.insecure_reproducible_noise)
    # A candidate drawn from reproducible noise is written to the private state, not OUT: a run that dies before
    # its gate must leave nothing of it where the recipient looks (privseed.tasks.data.corpus.candidate_folder).
    release_id = new_release_id()
    folder = candidate_folder(cfg.out, cfg.state_uri, release_id, cfg.insecure_reproducible_noise)
    return generate_release_parts(seeds, spec, params, _cache_uri(cfg), cfg.storage_options or None, out=folder,
                                  gate=gate, release_id=release_id)


def _task(fn, name: str):
    from prefect import task
    from prefect.cache_policies import NO_CACHE

    # The call cache makes these idempotent: a retry re-sends only calls that never finished (a retried
    # release generation writes its parts under a new release id; the first attempt's go at the next commit).
    return task(fn, name=name, retries=2, retry_delay_seconds=[5, 30], retry_condition_fn=retry_if_transient,
                persist_result=False, cache_policy=NO_CACHE)


#: Prefect task: ``generate_documents(sequences, cfg)`` -> synthetic rows (ROW_COLUMNS), in sequence order.
generate_documents = _task(_generate_documents, "generate-documents")
#: Prefect task: ``generate_release(sequences, cfg, gate)`` -> the release's parts, written and checked by the
#: generation shards (a StagedRelease for ``privseed.tasks.data.corpus.publish_release``); non-documents already
# dropped.
generate_release = _task(_generate_release, "generate-release")
