"""The rounds of a generation, pure (no I/O): the requests of a seed's candidates (``candidate_request``: call
seed, decoding controls, the seed without the terms its earlier documents misused), the judgement of an answer
(cleaned by ``privseed.tasks.quality.cleaning.clean_text``, then THE document predicate,
``privseed.tasks.quality.document_rejection``), the choice among a seed's candidates (``select_best``) and the control
flow of best-of-k, regeneration and rewrites (``candidate_rounds``; ``seeded_rounds`` for released seeds), which
leaves the calls to a ``send`` function. The drivers (``drivers.py``) give it one that goes to a backend.

Best-of-k (``best_of``): k candidates per seed, each a separate call with its own derived seed. Every candidate
is checked by the document predicate (loops, meta-talk, seed echo, other language, truncation, ...); among the
documents, the one with the highest seed-term coverage (``privseed.tasks.quality.metrics.term_coverage``, the measure
the report shows) is kept, ties to the lowest index.

A document that reads as another class (``privseed.tasks.generation.class_fit``: the naive Bayes of the generation's
released seeds) is worth another candidate, as a repetitive one is (``max_rewrites``), and a seed's documents that
fit its class are kept before the others.

Regeneration (``max_regenerations``): a seed none of whose candidates is a document gets one more candidate,
with a new call seed, per round, for at most that many rounds (after a candidate that wrote its class's public name
out as its subject, or two that opened with it in another case, asked without the name: ``named_its_class``). A
seed that still has no document is marked (``document_reason``) and
``privseed.tasks.generation.rows.split_documents`` drops it before the release gate.

Privacy: the inputs are ``ReleasedSeed`` objects (terms of the released vocabulary V~), recipient few-shot examples
and public configuration; everything here reads only released seeds and synthetic text, so it costs no privacy.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from typing import Callable, Sequence

from privseed.tasks.errors import ConfigError
from privseed.tasks.generation.class_fit import SeedClasses
from privseed.tasks.generation.params import GenerationParams
from privseed.tasks.llm.base import ChatRequest, ChatResult, OnEach, SeedSteering
from privseed.tasks.llm.prompting import PromptTemplate, build_request
from privseed.tasks.llm.released import ReleasedSeed
from privseed.tasks.llm.service import KINDS
from privseed.tasks.quality import DEFAULT_RULES, DocumentRules, document_rejection, misused_seed_terms, rewrite_score
from privseed.tasks.quality.cleaning import clean_text
from privseed.tasks.quality.shapes import opens_with_name_loosely
from privseed.tasks.quality.metrics import term_coverage, tokenize


def candidate_seed(seed: int, j: int) -> int:
    """Call seed of candidate j of a prompt seed: candidate 0 uses the seed itself, others a hash of (seed, j),
    kept in [0, 2^31) for llama.cpp and OpenAI-compatible servers."""
    if j == 0:
        return int(seed) & 0x7FFFFFFF
    return int.from_bytes(hashlib.sha256(f"{int(seed)}:{j}".encode()).digest()[:4], "big") & 0x7FFFFFFF


def steering_for(seed: ReleasedSeed, params: GenerationParams, backend_kind: str,
                 avoid: Sequence[str] = (), prefer: Sequence[str] = (), whole_opening: bool = False
                 ) -> SeedSteering | None:
    """The decoding controls of ``seed``'s calls: only for kinds that apply them (``BackendKind.steering``: local
    models; remote APIs cannot), and only when one of them is on, so requests without them keep their cache keys.
    ``avoid``: words that read as another class (``SeedClasses.foreign_words``), kept out by every kind that steers
    (the processor takes each down; the shared server, with a static bias, those that are one token); ``prefer``:
    words that read as the seed's own class (``SeedClasses.own_words``), pushed by the in-process processor while
    the answer does not hold them (a static bias on the shared server could not stop once a word is written, and
    the server leaves them out); ``whole_opening``: the answer opens with its subject, a whole word the in-process
    processor lets the answer go on from only after a space (``SeedSteering.whole_opening``)."""
    kind = KINDS.get(backend_kind)
    if kind is None or kind.steering == "none" or (
            params.steer == 0 and params.repeat_penalty == 1.0 and params.no_repeat_ngram == 0):
        return None
    return SeedSteering(tuple(seed.keyphrases), float(params.steer), float(params.repeat_penalty),
                        int(params.no_repeat_ngram), params.steer_schedule, float(params.steer_end_coverage),
                        tuple(avoid), tuple(prefer), whole_opening)


#: ``subject_opening``: a class's strongest words a seed that holds none of them may open with.
SUBJECT_FALLBACK = 5
#: ``subject_opening``: the endings of a word that is likelier a verb's or an adverb's form than a subject
#: ("Killed", "Bombing", "Sharply"; 5-6 of 80 openings of two AG News runs before they were left out).
_NOT_A_SUBJECT = ("ed", "ing", "ly")


def opening_draw(seed: ReleasedSeed, j: int, choices: Sequence[str]) -> str:
    """One of ``choices`` for candidate j of ``seed``, drawn by a hash of the public call seed and j (``--seed``
    drives it); "" when there is none."""
    if not choices:
        return ""
    draw = hashlib.sha256(f"opening:{int(seed.seed)}:{j}".encode()).digest()[:4]
    return choices[int.from_bytes(draw, "big") % len(choices)]


def subject_opening(seed: ReleasedSeed, subjects: Sequence[str], class_name: str | None, j: int) -> str:
    """The word candidate j of ``seed`` opens with when its kind opens with its subject (pure): one of its seed's
    words that read as its class (``subjects``: ``SeedClasses.own_words``, strongest first), or, for a seed that
    holds none, one of its class's ``SUBJECT_FALLBACK`` strongest, capitalised ("Oil", "Microsoft", "Olympics").
    Left out: words of three letters or fewer (often an acronym the seed's lower case hides: "ceo", "afp"), words
    with a verb's or an adverb's ending, and the words of the class's public name, which a document must not open
    with as its subject (``names_class``). SmolLM2 opened 86-89 % of its AG News stories with "The" (AG News items:
    0.5 %; issue 48). "" when the class has no such word."""
    named = {w for w in tokenize(class_name or "")}
    named |= {w + "s" for w in named} | {w[:-1] for w in named if w.endswith("s")}
    usable = [w for w in subjects if len(w) > 3 and w.isalpha() and not w.endswith(_NOT_A_SUBJECT)
              and w not in named]
    allowed = set(usable)
    held = [w for w in dict.fromkeys(tokenize(" ".join(seed.keyphrases))) if w in allowed]
    word = opening_draw(seed, j, held or usable[:SUBJECT_FALLBACK])
    return word[:1].upper() + word[1:]


def opening_for(seed: ReleasedSeed, params: GenerationParams, j: int, backend_kind: str,
                subjects: Sequence[str] = ()) -> str:
    """The words candidate j of ``seed`` opens with, for kinds that continue a given opening
    (``BackendKind.prefill``; "" for the others): its subject (``subject_opening`` of ``subjects``, the words that
    read as its class) where the kind opens with its subject (``GenerationParams.subject_openings``), else one of the
    document kind's public openings (``GenerationParams.openings``) drawn from the public call seed, else "".
    SmolLM2 opens 83 % of its reviews with "The" and the seed's first term (real Yelp reviews: 5.6 %; issue 48)."""
    kind = KINDS.get(backend_kind)
    if kind is None or not kind.prefill:
        return ""
    if params.subject_openings:
        names = dict(params.class_names.names) if params.class_names is not None else {}
        return subject_opening(seed, subjects, names.get(str(seed.label)), j)
    return opening_draw(seed, j, params.openings)


def candidate_request(template: PromptTemplate, seed: ReleasedSeed, params: GenerationParams, j: int,
                      backend_kind: str = "local", earlier: Sequence[ChatResult] = (),
                      rules: DocumentRules = DEFAULT_RULES, avoid: Sequence[str] = (),
                      prefer: Sequence[str] = (), subjects: Sequence[str] = ()) -> ChatRequest:
    """Candidate j of ``seed`` (pure): the prompt of ``prompt_seed(seed, earlier, rules)`` with call seed
    ``candidate_seed(seed.seed, j)``. ``earlier``: the seed's candidates 0..j-1 (none for the first round);
    ``avoid`` and ``prefer``: words its decoding keeps out and pushes (``steering_for``); ``subjects``: the words that
    read as its class, which it may open with (``opening_for``)."""
    terms = prompt_seed(seed, earlier, rules)
    class_names = None if named_its_class(seed, earlier, rules) else params.class_names
    opening = opening_for(seed, params, j, backend_kind, subjects)
    steering = steering_for(terms, params, backend_kind, avoid, prefer, bool(opening) and params.subject_openings)
    return build_request(template, terms, params.doc_type, max_tokens=params.max_tokens, temperature=params.temperature,
                         top_p=params.top_p, call_seed=candidate_seed(seed.seed, j), few_shot=params.few_shot,
                         class_names=class_names, steering=steering, answer_prefix=opening)


def named_its_class(seed: ReleasedSeed, earlier: Sequence[ChatResult], rules: DocumentRules = DEFAULT_RULES) -> bool:
    """Whether one of ``seed``'s earlier candidates opened with its class's public name as its subject
    (``names_class``), or two in a row opened with a name of two or more words in another case or number
    (``opens_with_name_loosely``: "The event planning and services were great"). Its later candidates are asked
    without the name, in the paper's plain prompt: SmolLM2 asked for "a topic: Album" writes "The Album is ..." again
    and again (DBPedia-14's Album seeds, issue 48: 12 of 20 dropped after 8 rounds), and the seed's released terms
    still carry the class. The loose form is asked once more with the name first (a rewrite, ``rewrite_score``):
    on Yelp's thin seeds the name is what carries the class, and rejected at once such rows lost 1.7 points; 17 of
    600 rows named it in all three candidates. Rows say which prompt their document answered (``assemble_rows``)."""
    if any(rejection(seed, cleaned(result), rules) == "names_class" for result in earlier):
        return True
    name = dict(rules.class_names).get(str(seed.label))
    if name is None:
        return False
    loose = [opens_with_name_loosely(cleaned(result).text, name) for result in earlier]
    return any(a and b for a, b in zip(loose, loose[1:]))


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
        answer = cleaned(result)
        if rejection(seed, answer, rules) is not None:
            continue
        for term in misused_seed_terms(answer.text, seed.keyphrases, rules):
            if term not in drop and len(drop) < budget:
                drop.append(term)
    return seed.without(drop) if drop else seed


def build_generation_requests(seeds: Sequence[ReleasedSeed], template: PromptTemplate,
                              params: GenerationParams, backend_kind: str = "local") -> list[list[ChatRequest]]:
    """k requests per seed (pure)."""
    return [[candidate_request(template, s, params, j, backend_kind) for j in range(params.best_of)] for s in seeds]


def cleaned(c: ChatResult) -> ChatResult:
    """The answer with its text cleaned (``privseed.tasks.quality.cleaning.clean_text``): what the predicate judges
    and a release keeps."""
    return dataclasses.replace(c, text=clean_text(c.text, c.finish_reason))


def rejection(seed: ReleasedSeed, candidate: ChatResult, rules: DocumentRules) -> str | None:
    """Why a (cleaned) candidate is not a document, or None: THE predicate,
    privseed.tasks.quality.document_rejection."""
    return document_rejection(candidate.text, seed.keyphrases, candidate.finish_reason, rules,
                              mean_logprob=candidate.mean_logprob, label=seed.label)


def select_best(seed: ReleasedSeed, candidates: Sequence[ChatResult], rules: DocumentRules = DEFAULT_RULES,
                classes: SeedClasses | None = None) -> tuple[int, float]:
    """Index and coverage of the best candidate: documents first, then those that read as the seed's class
    (``classes``; None: every one does), plain ones (``rewrite_score`` under 1: not repetitive, no seed glossed as a
    label) before the others; among plain documents the most seed terms covered
    (privseed.tasks.quality.metrics.term_coverage), among the others the lowest score; then the lowest index.
    Candidates are ranked as given (clean them first)."""
    covs = [term_coverage(c.text, seed.keyphrases) for c in candidates]
    ok = [rejection(seed, c, rules) is None for c in candidates]
    best = best_candidate(ok, [rewrite_score(c.text, seed.keyphrases, rules, seed.label) if ok[i] else 0.0
                               for i, c in enumerate(candidates)],
                          covs, [fits_class(seed, c, classes) for c in candidates])
    return best, covs[best]


def fits_class(seed: ReleasedSeed, candidate: ChatResult, classes: SeedClasses | None) -> bool:
    """Whether a (cleaned) candidate reads as ``seed``'s class (``SeedClasses.fits``); always, without ``classes``."""
    return classes is None or classes.fits(candidate.text, seed.label)


def best_candidate(ok: Sequence[bool], scores: Sequence[float], coverages: Sequence[float],
                   on_class: Sequence[bool] | None = None) -> int:
    """Index of the best candidate (pure): documents (``ok``) first, those that read as their class (``on_class``;
    None: all do) next, plain ones (repetition score under 1) before repetitive ones, the highest coverage among
    plain documents and the lowest score among repetitive ones, then the lowest index."""
    def key(i: int) -> tuple:
        plain = scores[i] < 1.0
        return ok[i], on_class is None or on_class[i], plain, coverages[i] if plain else -scores[i], -i
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
                  on_settled: OnSettled | None = None, classes: SeedClasses | None = None) -> None:
    """``candidate_rounds`` over released seeds: ``params.best_of`` candidates each (``candidate_request``), then
    up to ``params.max_regenerations`` rounds for the seeds whose cleaned candidates are all rejected and up to
    ``params.max_rewrites`` for those whose documents all score 1 or more (``rewrite_score``: repetitive, or a seed
    listed, glossed as a label or explained) or all read as another class (``classes``, built from every seed of the
    generation, not one shard's), each asked without the terms its earlier documents misused (``prompt_seed``)."""
    def plain(i: int, result: ChatResult) -> bool:
        answer = cleaned(result)
        return (rewrite_score(answer.text, seeds[i].keyphrases, rules, seeds[i].label) < 1.0
                and fits_class(seeds[i], answer, classes))

    avoid = foreign_words(seeds, classes, params)
    prefer = own_words(seeds, classes, params)
    subjects = subject_words(seeds, classes, params)
    candidate_rounds(len(seeds), params.best_of, params.max_regenerations,
                     lambda i, j, earlier: candidate_request(template, seeds[i], params, j, backend_kind, earlier,
                                                             rules, avoid.get(seeds[i].label, ()),
                                                             prefer.get(seeds[i].label, ()),
                                                             subjects.get(seeds[i].label, ())),
                     lambda i, result: rejection(seeds[i], cleaned(result), rules) is None, send, on_settled,
                     plain, params.max_rewrites)


def foreign_words(seeds: Sequence[ReleasedSeed], classes: SeedClasses | None,
                  params: GenerationParams) -> dict[object, tuple[str, ...]]:
    """Each class's words to avoid (``SeedClasses.foreign_words``) when ``params.avoid_other_classes`` is on and
    there are classes to tell apart; {} otherwise."""
    if classes is None or not params.avoid_other_classes:
        return {}
    return _per_class(seeds, classes.foreign_words)


def own_words(seeds: Sequence[ReleasedSeed], classes: SeedClasses | None,
              params: GenerationParams) -> dict[object, tuple[str, ...]]:
    """Each class's words to prefer (``SeedClasses.own_words``) when ``params.prefer_own_class`` is on and there are
    classes to tell apart; {} otherwise."""
    if classes is None or not params.prefer_own_class:
        return {}
    return _per_class(seeds, classes.own_words)


def subject_words(seeds: Sequence[ReleasedSeed], classes: SeedClasses | None,
                  params: GenerationParams) -> dict[object, tuple[str, ...]]:
    """Each class's words its answers may open with (``SeedClasses.own_words``) when its kind opens with its subject
    (``params.subject_openings``) and there are classes to tell apart; {} otherwise (whether or not the words are
    also pushed: ``prefer_own_class``)."""
    if classes is None or not params.subject_openings:
        return {}
    return _per_class(seeds, classes.own_words)


def _per_class(seeds: Sequence[ReleasedSeed], words: Callable[[object], tuple[str, ...]]
               ) -> dict[object, tuple[str, ...]]:
    """``words(label)`` for each class the seeds hold, in their order."""
    return {label: words(label) for label in dict.fromkeys(s.label for s in seeds)}
