"""Decoding that puts the seeds in: a logits processor for local models (llama.cpp) that steers towards the
released seed terms not yet written, away from terms already used, and away from loops.

Pure numpy plus two tokenizer callables, so it is tested without a model (tests/test_llm_steering.py) and
used by ``tasks.llm.local.LlamaCppBackend`` through llama-cpp-python's ``logits_processor`` hook, which calls
it once per generated token with every token id so far (prompt first) and the logits of the whole vocabulary.

At each step, with ``strength`` s (``SeedSteering.strength``, ``--steer``):

- a token that **begins** a seed term not yet in the answer (its first token in any of the surface forms
  " term", " Term", "term", "Term") gets +s, except in the ``gap`` tokens right after a term was written:
  boosting every missing term at every step makes a small model write the seed list ("Gillingham, General
  Resellers, Class Archdiocese, ..."), the gap makes it write prose between two terms;
- a token that **continues** a term the answer is in the middle of writing (the answer ends with the term's
  first k tokens) gets +2s, so a started term is finished rather than abandoned;
- the first token of a term **already written** gets -s, so the model moves on to the next term instead of
  repeating one ("Australia, Australia, ...");
- end of text gets -s times the share of terms still missing, so the model does not stop after one sentence;
- with ``no_repeat_ngram`` n > 0, a token that would repeat a token n-gram already in the answer is banned.

Privacy: the terms are the released seed (already in the prompt); nothing else is read. Costs no privacy.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from tasks.metrics import term_coverage


def surface_forms(term: str) -> list[str]:
    """How a term may appear in running text: after a space or at the start, lower case or capitalised."""
    forms = []
    for word in dict.fromkeys((term, term[:1].upper() + term[1:])):
        forms += [" " + word, word]
    return forms


class SeedSteeringProcessor:
    """``processor(input_ids, scores) -> scores`` for one generation call (it keeps that call's state)."""

    def __init__(self, terms: Sequence[str], strength: float, tokenize: Callable[[str], list[int]],
                 detokenize: Callable[[Sequence[int]], str], eos_ids: Sequence[int] = (), no_repeat_ngram: int = 0,
                 gap: int = 6):
        if strength < 0:
            raise ValueError(f"steering strength must be >= 0, got {strength}")
        if no_repeat_ngram < 0:
            raise ValueError(f"no_repeat_ngram must be >= 0, got {no_repeat_ngram}")
        if gap < 0:
            raise ValueError(f"gap must be >= 0, got {gap}")
        self.gap = int(gap)
        self.terms = [t for t in dict.fromkeys(str(t) for t in terms) if t.strip()]
        self.strength = float(strength)
        self.detokenize = detokenize
        self.eos_ids = [int(i) for i in eos_ids]
        self.no_repeat_ngram = int(no_repeat_ngram)
        # Token sequences of each term's surface forms (distinct, non-empty).
        self.forms: dict[str, list[tuple[int, ...]]] = {}
        for term in self.terms:
            seqs = {tuple(int(i) for i in tokenize(form)) for form in surface_forms(term)}
            self.forms[term] = sorted(s for s in seqs if s)
        self.prompt_len: int | None = None

    def written(self, generated: Sequence[int]) -> set[str]:
        """Terms the answer already contains (the coverage measure's own test)."""
        text = self.detokenize(list(generated)) if len(generated) else ""
        return {t for t in self.terms if term_coverage(text, [t]) == 1.0}

    def steps_since_last_term(self, generated: Sequence[int], done: set[str]) -> int:
        """Tokens generated since the answer last completed a term (len(generated) + 1 when it never did)."""
        if not done:
            return len(generated) + 1
        for back in range(1, min(self.gap, len(generated)) + 1):  # did dropping the last `back` tokens lose one?
            if len(self.written(generated[:len(generated) - back])) < len(done):
                return back - 1
        return self.gap + 1

    def bonus(self, generated: Sequence[int], n_vocab: int) -> np.ndarray:
        """The additive logit change for the next token (pure; -inf marks a banned token)."""
        delta = np.zeros(n_vocab, dtype=np.float32)
        s = self.strength
        generated = [int(t) for t in generated]
        if s > 0 and self.terms:
            done = self.written(generated)
            # Penalise first, then boost: a first token shared by a written and a missing term stays boosted.
            for term in done:
                for seq in self.forms[term]:
                    if seq[0] < n_vocab:
                        delta[seq[0]] = -s
            missing = [t for t in self.terms if t not in done]
            if self.steps_since_last_term(generated, done) >= self.gap:
                for term in missing:
                    for seq in self.forms[term]:
                        if seq[0] < n_vocab:
                            delta[seq[0]] = max(delta[seq[0]], s)
            for term in missing:
                for seq in self.forms[term]:
                    for k in range(len(seq) - 1, 0, -1):  # the answer ends with the first k tokens of the term
                        if len(generated) >= k and tuple(generated[-k:]) == seq[:k] and seq[k] < n_vocab:
                            delta[seq[k]] = max(delta[seq[k]], 2 * s)
                            break
            share_missing = len(missing) / len(self.terms)
            for eos in self.eos_ids:
                if eos < n_vocab:
                    delta[eos] -= s * share_missing
        n = self.no_repeat_ngram
        if n > 0 and len(generated) >= n:
            prefix = tuple(generated[len(generated) - n + 1:]) if n > 1 else ()
            for i in range(len(generated) - n + 1):
                if tuple(generated[i:i + n - 1]) == prefix and generated[i + n - 1] < n_vocab:
                    delta[generated[i + n - 1]] = -np.inf
        return delta

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        if self.prompt_len is None:  # the first call sees the prompt only
            self.prompt_len = len(input_ids)
        generated = input_ids[self.prompt_len:]
        return scores + self.bonus(generated, len(scores))
