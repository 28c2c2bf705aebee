"""Decoding that puts the seeds in: a logits processor for local models (llama.cpp) that steers towards the
released seed terms not yet written, away from terms already used, and away from loops.

Pure numpy plus two tokenizer callables, so it is tested without a model (tests/test_llm_steering.py) and
used by ``privseed.tasks.llm.local.LlamaCppBackend`` through llama-cpp-python's ``logits_processor`` hook, which calls
it once per generated token with every token id so far (prompt first) and the logits of the whole vocabulary.

At each step, with ``strength`` s (``SeedSteering.strength``, ``--steer``) and the push p (below):

- a word of ``avoid`` (words that read as another class than the seed's, ``SeedSteering.avoid``) gets -s: its
  token where the word is one token, its last token after the others where it is longer;
- a word of ``prefer`` (words that read as the seed's own class, ``SeedSteering.prefer``) that is one token and not
  yet in the answer gets +s * ``PREFER_SHARE`` once the answer's first sentence has ended, so the words a document
  adds to its seed's say its class too (a longer word is left alone: its first token begins other words, and a push
  on it would write them; pushed from the first word, "favorite" followed the opening "My" in 5-6 % of the star
  ratings' rows, real reviews 0.2 %);
- a token that **begins** a seed term not yet in the answer (its first token in any of the surface forms
  " term", " Term", "term", "Term"; the forms without a space only where a word begins without one, at the
  start of the answer, after white space or an opening bracket or quote, or the push glues the term onto what
  comes before: "artistyorkyorky york", "Togo.Tenth") gets +p, except in the ``gap`` tokens right after a term
  was written: boosting every missing term at every step makes a small model write the seed list ("Gillingham, General
  Resellers, Class Archdiocese, ..."), the gap makes it write prose between two terms;
- a token that **continues** a term the answer is in the middle of writing (the answer ends with the term's
  first k tokens) gets +2p, so a started term is finished rather than abandoned;
- the first token of a term **already written** gets -s, so the model moves on to the next term instead of
  repeating one ("Australia, Australia, ...");
- with ``whole_opening`` (an answer opened with its subject, ``SeedSteering.whole_opening``), the first token must
  begin with a space (``space_led``): the given opening is a whole word, neither glued onto ("Season" ->
  "Seasoned") nor made a topic label ("Iraq, the world's largest ...": 24 % of two AG News runs' rows, where 2.7 %
  of AG items have a comma after their first word);
- with ``no_repeat_ngram`` n > 0, a token that would repeat a token n-gram already in the answer is banned, and
  so is the token that would begin the answer's last word again right after it or after a comma ("the Yangtze
  Yangtze", "Khorasan, Khorasan Province": the loops a small model starts that an n-gram ban lets through).

Two schedules (``schedule``):

- ``"flat"`` (the first version): p = s throughout, and end of text gets -s times the share of terms still
  missing. A small model still stops after two or three sentences with a third of the terms unwritten.
- ``"budget"`` (the default): the push follows a pace through the call's token budget. Of ``max_tokens``, the
  last ``tail`` share (10 %, at least 8 tokens) is kept for finishing the last sentence; over the rest, T tokens,
  each of the n terms gets an equal share. With m terms missing after t tokens, the *urgency* is
  u = (m / n) / ((T - t) / T): the share of terms still missing over the share of the budget still left. On
  pace or ahead (u <= 1) the push is s and the gap is ``gap``, as in "flat"; behind (u > 1) the push is s * u
  and the gap shrinks to gap / u (never below ``min_gap``, so terms are not joined into a list). And the answer
  **cannot end while too many terms are missing**: every end-of-generation token is banned until a share
  ``end_coverage`` of the terms is written (or the budget is spent), so the model writes another sentence, and the
  push puts a missing term in it. At 1 (every term) a small model stuffs the terms it cannot place into its last
  sentence ("... reviewed by several prominent authors in recent years agree."); the CLI's default is 0.8
  (``STEER_END_COVERAGE_DEFAULT``).
  A term the answer has just finished is **closed**: right after the last token of one of its forms, tokens
  that would glue more letters or digits onto it (``continues_word``) are banned, so "dmitri" does not become
  "dmitrii" (no longer the term) and then get pushed again ("dmitrii, dmitrias, dmitres, ...").
  Measured on DP seeds from the public test split (experiments/results/generation.md, "Seed steering").

Privacy: the terms are the released seed (already in the prompt), the words to avoid and to prefer other released
seeds' words; nothing else is read. Costs no privacy.
"""
from __future__ import annotations

import math
import re
from typing import Callable, Sequence

import numpy as np

from privseed.tasks.quality.metrics import terms_present, tokenize as tokenize_words

SCHEDULES = ("flat", "budget")
#: Characters a word may follow without a space.
WORD_OPENERS = frozenset("([{\"'\u201c\u2018")
#: The answer's last word, alone or followed by a comma (the next word must not repeat it).
LAST_WORD = re.compile(r"([^\W\d_][\w'\u2019-]*),?$")
#: The end of a sentence in the answer: the preferred words are pushed after the first one.
SENTENCE_END = re.compile(r"[.!?](?:\s|$)")
#: A preferred word's push, as a share of the steering strength: half, so a missing seed term (pushed by the whole
#: strength, more when behind pace) still comes first. On `yelp-stars`' first candidates at 1/2 of 4 the documents
#: scored 37.3 % against 35.2 % without (issue 48). The whole strength, on seven paired owner's runs of three corpora:
#: +0.8 accuracy, -0.3 macro-F1, the gain the majority class's recall (experiments/results/generation.md).
PREFER_SHARE = 0.5


def surface_forms(term: str) -> list[str]:
    """How a term may appear in running text: after a space or at the start, lower case or capitalised."""
    forms = []
    for word in dict.fromkeys((term, term[:1].upper() + term[1:])):
        forms += [" " + word, word]
    return forms


def preferred_forms(prefer: Sequence[str], terms: Sequence[str]) -> dict[str, str]:
    """The surface forms of the words to prefer (pure): " word" and " Word" of each, mapped to the word in lower
    case, without the seed's own terms (they are pushed as terms) and blanks."""
    own = {str(t).lower() for t in terms}
    forms: dict[str, str] = {}
    for word in (str(w) for w in prefer):
        if word.strip() and word.lower() not in own:
            for form in (" " + word, " " + word[:1].upper() + word[1:]):
                forms.setdefault(form, word.lower())
    return forms


def avoided_forms(avoid: Sequence[str], terms: Sequence[str]) -> list[str]:
    """The surface forms of the words to keep out (pure): " word" and " Word" of each, in order, without the seed's
    own terms (a word of the seed is never avoided) and blanks."""
    own = {str(t).lower() for t in terms}
    forms: dict[str, None] = {}
    for word in (str(w) for w in avoid):
        if word.strip() and word.lower() not in own:
            forms.update(dict.fromkeys((" " + word, " " + word[:1].upper() + word[1:])))
    return list(forms)


class SeedSteeringProcessor:
    """``processor(input_ids, scores) -> scores`` for one generation call (it keeps that call's state).

    ``max_tokens``: the call's output budget (the "budget" schedule's clock; without it the push stays s).
    ``tail``: the share of the budget kept for finishing the last sentence (at least ``min_tail`` tokens).
    ``continues_word``: one flag per token id, whether its text begins with a letter or digit (it would extend
    the word before it); the "budget" schedule uses it to close a finished term (none given: no closing).
    ``space_led``: one flag per token id, whether its text begins with a space; with ``whole_opening`` the first
    token must be one (none given: no such ban).
    The processor remembers what it computed for the answer so far, so each step costs one detokenization
    and one coverage test, not one per earlier token."""

    def __init__(self, terms: Sequence[str], strength: float, tokenize: Callable[[str], list[int]],
                 detokenize: Callable[[Sequence[int]], str], eos_ids: Sequence[int] = (), no_repeat_ngram: int = 0,
                 gap: int = 6, max_tokens: int | None = None, schedule: str = "budget", min_gap: int = 2,
                 tail: float = 0.1, min_tail: int = 8, continues_word: np.ndarray | None = None,
                 end_coverage: float = 1.0, avoid: Sequence[str] = (), prefer: Sequence[str] = (),
                 space_led: np.ndarray | None = None, whole_opening: bool = False):
        if strength < 0:
            raise ValueError(f"steering strength must be >= 0, got {strength}")
        if no_repeat_ngram < 0:
            raise ValueError(f"no_repeat_ngram must be >= 0, got {no_repeat_ngram}")
        if gap < 0 or min_gap < 0:
            raise ValueError(f"gap and min_gap must be >= 0, got {gap}, {min_gap}")
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown steering schedule {schedule!r}; known: {', '.join(SCHEDULES)}")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if not 0 <= tail < 1 or min_tail < 0:
            raise ValueError(f"tail must be in [0, 1) and min_tail >= 0, got {tail}, {min_tail}")
        if not 0 <= end_coverage <= 1:
            raise ValueError(f"end_coverage must be in [0, 1], got {end_coverage}")
        self.gap = int(gap)
        self.min_gap = min(int(min_gap), self.gap)
        self.schedule = schedule
        self.max_tokens = None if max_tokens is None else int(max_tokens)
        # The paced part of the budget: all of it but the tail, and at least one token.
        self.paced_tokens = None if max_tokens is None else \
            max(1, int(max_tokens) - max(int(min_tail), round(tail * int(max_tokens))))
        self.terms = [t for t in dict.fromkeys(str(t) for t in terms) if t.strip()]
        # Terms that may still be missing when the answer ends ("budget" schedule; the rest must be written first).
        self.may_miss = math.floor((1.0 - float(end_coverage)) * len(self.terms) + 1e-9)
        self.strength = float(strength)
        self.detokenize = detokenize
        self.tokenize = tokenize
        self._word_starts: dict[str, frozenset[int]] = {}
        self.eos_ids = sorted({int(i) for i in eos_ids})
        self.no_repeat_ngram = int(no_repeat_ngram)
        self.continues_word = None if continues_word is None else np.flatnonzero(np.asarray(continues_word, dtype=bool))
        # The first tokens banned after a whole-word opening: every token that does not begin with a space.
        self.opening_ban = np.flatnonzero(~np.asarray(space_led, dtype=bool)) \
            if whole_opening and space_led is not None else np.zeros(0, dtype=np.int64)
        # Token sequences of each term's surface forms (distinct, non-empty).
        self.forms: dict[str, list[tuple[int, ...]]] = {}
        # Sequences of the forms without a leading space ("york"): they begin a term only where a word begins.
        self.bare: set[tuple[int, ...]] = set()
        for term in self.terms:
            spaced: set[tuple[int, ...]] = set()
            bare: set[tuple[int, ...]] = set()
            for form in surface_forms(term):
                (spaced if form.startswith(" ") else bare).add(tuple(int(i) for i in tokenize(form)))
            self.forms[term] = sorted(s for s in spaced | bare if s)
            self.bare |= {s for s in bare - spaced if s}
        # Words to keep out (``avoid``, the seed's own terms excepted): the token sequences of " word" and " Word".
        # A one-token word is taken down wherever it could come; a longer one where the answer has written all of
        # it but its last token (its first tokens begin other words too: " del" of " delicious" and " deli").
        self.avoided: set[int] = set()
        self.avoided_ends: list[tuple[int, ...]] = []
        for form in avoided_forms(avoid, self.terms):
            seq = tuple(int(i) for i in tokenize(form))
            if len(seq) == 1:
                self.avoided.add(seq[0])
            elif seq:
                self.avoided_ends.append(seq)
        # Words to prefer (``prefer``, the seed's own terms excepted): the token of " word" and " Word" where it is
        # one token, with the word it writes (pushed while the answer does not hold it).
        self.preferred: dict[int, str] = {}
        for form, word in preferred_forms(prefer, self.terms).items():
            seq = tuple(int(i) for i in tokenize(form))
            if len(seq) == 1:
                self.preferred.setdefault(seq[0], word)
        self.prompt_len: int | None = None
        # Memo of the answer seen so far: its tokens and, for each prefix length k, its text and the terms written.
        self._seen: list[int] = []
        self._text_at: list[str] = [""]
        self._written_at: list[frozenset[str]] = [frozenset()]

    def _written_text(self, text: str) -> frozenset[str]:
        return frozenset(t for t, present in zip(self.terms, terms_present(text, self.terms)) if present)

    def _advance(self, generated: Sequence[int] | np.ndarray) -> None:
        """Bring the memo up to ``generated`` (reuses the longest common prefix with what it saw last)."""
        common = 0
        limit = min(len(self._seen), len(generated))
        if self._seen[:limit] == list(generated[:limit]):
            common = limit
        else:
            while common < limit and self._seen[common] == generated[common]:
                common += 1
        del self._seen[common:]
        del self._text_at[common + 1:]
        del self._written_at[common + 1:]
        for token in generated[common:]:
            self._seen.append(int(token))
            text = self.detokenize(self._seen)
            self._text_at.append(text)
            self._written_at.append(self._written_text(text))

    def word_starts_at(self, position: int) -> bool:
        """Whether a word can begin without a space after the first ``position`` tokens of the answer the memo has
        seen (``written`` advances it): at its start, after white space or after an opening bracket or quote. Not
        after "." or "-" ("Togo.Tenth", "Albu-Albu")."""
        text = self._text_at[position]
        return not text or text[-1].isspace() or text[-1] in WORD_OPENERS

    def written(self, generated: Sequence[int] | np.ndarray) -> set[str]:
        """Terms the answer already contains (the coverage measure's own test,
        privseed.tasks.quality.metrics.terms_present)."""
        generated = [int(t) for t in generated]
        self._advance(generated)
        return set(self._written_at[len(generated)])

    def steps_since_last_term(self, generated: Sequence[int] | np.ndarray, done: set[str]) -> int:
        """Tokens generated since the answer last completed a term (len(generated) + 1 when it never did)."""
        if not done:
            return len(generated) + 1
        generated = [int(t) for t in generated]
        self._advance(generated)
        n = len(generated)
        for back in range(1, min(self.gap, n) + 1):  # did dropping the last `back` tokens lose a term?
            if len(self._written_at[n - back]) < len(done):
                return back - 1
        return self.gap + 1

    def urgency(self, n_generated: int, missing: Sequence[str]) -> float:
        """The share of terms still missing over the share of the paced budget still left (> 1: behind pace);
        0 without a budget, without missing terms, or under the "flat" schedule."""
        if self.schedule != "budget" or self.paced_tokens is None or not missing:
            return 0.0
        left = max(self.paced_tokens - n_generated, 1) / self.paced_tokens
        return (len(missing) / len(self.terms)) / left

    def closed_tokens(self, generated: Sequence[int] | np.ndarray) -> np.ndarray:
        """Token ids banned because the answer ends with the last token of a written term (one of its surface
        forms) and they would glue letters onto it ("budget" schedule with ``continues_word``; else none), and,
        for the first token after a whole-word opening, those that do not begin with a space."""
        if len(generated) == 0 and len(self.opening_ban):
            return self.opening_ban
        if self.schedule != "budget" or self.continues_word is None or self.strength <= 0:
            return np.zeros(0, dtype=np.int64)
        generated = [int(t) for t in generated]
        done = self.written(generated)
        n = len(generated)
        if any(n >= len(seq) and tuple(generated[n - len(seq):]) == seq for term in done for seq in self.forms[term]):
            return self.continues_word
        return np.zeros(0, dtype=np.int64)

    def adjustments(self, generated: Sequence[int] | np.ndarray) -> dict[int, float]:
        """The additive logit changes for the next token, by token id (pure in effect; -inf bans a token)."""
        delta: dict[int, float] = {}
        s = self.strength
        generated = [int(t) for t in generated]
        if s > 0:
            for token in self.avoided:
                delta[token] = -s
            for seq in self.avoided_ends:
                k = len(seq) - 1
                if len(generated) >= k and tuple(generated[-k:]) == seq[:-1]:
                    delta[seq[-1]] = -s
        if s > 0 and self.preferred:
            self._advance(generated)
            answer = self._text_at[len(generated)]
            held = set(tokenize_words(answer)) if SENTENCE_END.search(answer) else set(self.preferred.values())
            for token, word in self.preferred.items():
                if word not in held and token not in delta:
                    delta[token] = s * PREFER_SHARE
        if s > 0 and self.terms:
            done = self.written(generated)
            missing = [t for t in self.terms if t not in done]
            u = self.urgency(len(generated), missing)
            push = s * max(1.0, u)
            gap = self.gap if u <= 1 else max(self.min_gap, min(self.gap, math.floor(self.gap / u)))
            # Penalise first, then boost: a first token shared by a written and a missing term stays boosted.
            for term in done:
                for seq in self.forms[term]:
                    delta[seq[0]] = -s
            length = len(generated)
            if self.steps_since_last_term(generated, done) >= gap:
                at_word_start = self.word_starts_at(length)
                for term in missing:
                    for seq in self.forms[term]:
                        if seq in self.bare and not at_word_start:
                            continue  # "artist" + "york" would glue the term onto a word ("artistyorkyork")
                        delta[seq[0]] = max(delta.get(seq[0], -math.inf), push)
            for term in missing:
                for seq in self.forms[term]:
                    for k in range(len(seq) - 1, 0, -1):  # the answer ends with the first k tokens of the term
                        if length >= k and tuple(generated[-k:]) == seq[:k] and \
                                (seq not in self.bare or self.word_starts_at(length - k)):
                            delta[seq[k]] = max(delta.get(seq[k], -math.inf), 2 * push)
                            break
            if missing:
                for eos in self.eos_ids:
                    if self.schedule == "budget":
                        if len(missing) > self.may_miss:
                            delta[eos] = -math.inf
                    else:
                        delta[eos] = delta.get(eos, 0.0) - s * len(missing) / len(self.terms)
        n = self.no_repeat_ngram
        if n > 0 and len(generated) >= n:
            history = np.asarray(generated, dtype=np.int64)
            if n == 1:
                banned = np.unique(history)
            else:
                windows = np.lib.stride_tricks.sliding_window_view(history, n)
                banned = windows[(windows[:, :-1] == history[len(history) - n + 1:]).all(axis=1), -1]
            for token in banned.tolist():
                delta[token] = -math.inf
        if n > 0:
            for token in self.repeated_word_starts(generated):
                delta[token] = -math.inf
        return delta

    def repeated_word_starts(self, generated: Sequence[int]) -> frozenset[int]:
        """The first tokens of the answer's last word written again after a space (as it stands, lower case,
        capitalised), when the answer ends with that word or with it and a comma; a first token that is white
        space alone is left alone (it begins every word)."""
        self._advance([int(t) for t in generated])
        match = LAST_WORD.search(self._text_at[len(generated)])
        if match is None:
            return frozenset()
        word = match.group(1)
        if word not in self._word_starts:
            starts = set()
            for form in {word, word.lower(), word[:1].upper() + word[1:]}:
                ids = self.tokenize(" " + form)
                if ids and self.detokenize([ids[0]]).strip():
                    starts.add(int(ids[0]))
            self._word_starts[word] = frozenset(starts)
        return self._word_starts[word]

    def bonus(self, generated: Sequence[int] | np.ndarray, n_vocab: int) -> np.ndarray:
        """``adjustments`` and ``closed_tokens`` as a dense vector over a vocabulary of ``n_vocab`` tokens."""
        dense = np.zeros(n_vocab, dtype=np.float32)
        for token, value in self.adjustments(generated).items():
            if 0 <= token < n_vocab:
                dense[token] = value
        closed = self.closed_tokens(generated)
        dense[closed[closed < n_vocab]] = -np.inf
        return dense

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        if self.prompt_len is None:  # the first call sees the prompt only
            self.prompt_len = len(input_ids)
        generated = input_ids[self.prompt_len:]
        out = np.array(scores, dtype=np.float32, copy=True)
        n_vocab = len(out)
        for token, value in self.adjustments(generated).items():
            if 0 <= token < n_vocab:
                out[token] += value
        closed = self.closed_tokens(generated)
        out[closed[closed < n_vocab]] = -np.inf
        return out
