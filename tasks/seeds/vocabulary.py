"""Public vocabularies, phrase extraction and the DP vocabulary histogram (DP-KPS steps 1-3).

Step 1: a *public* vocabulary V (a frequency-cut English word list from wordfreq, or a file of terms).
Step 2: deterministic phrase extraction: lower-case, tokenize, greedy longest match left to right.
Step 3: the privatized vocabulary V~: counts of the first S matched terms of every document,
        Laplace(S / eps_voc) noise on EVERY term of V (zero counts included), top N noisy counts.

Nothing in this module does I/O beyond reading a public vocabulary file, and nothing logs text.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from privseed.tasks.errors import ConfigError
from privseed.tasks.dp.mechanisms import LaplaceMechanism, NoiseSource

# Unicode word characters without the underscore; one rule for documents and vocabulary terms,
# so a term matches exactly when its tokens appear consecutively in a document.
_TOKEN_RE = re.compile(r"[^\W_]+")
_TOKEN_CHAR_RE = re.compile(r"[^\W_]")
#: Characters of a document tokenized at a time by ``PhraseMatcher.first_matches`` (doubling while it needs more):
#: about 40 English tokens, enough for the first 10 vocabulary terms of most documents.
_FIRST_CHUNK_CHARS = 256

DEFAULT_ENGLISH_TOP_N = 50_000
#: The slurs, explicit words and strong profanity the English vocabulary withholds (the file says why and which).
WITHHELD_TERMS_FILE = Path(__file__).with_name("withheld_terms.txt")


def tokenize(text: str) -> list[str]:
    """Lower-case and split into word tokens (letters and digits; punctuation separates tokens)."""
    return _TOKEN_RE.findall(text.lower())


@dataclass(frozen=True)
class Vocabulary:
    """A public list of terms. ``terms[i]`` is the display form, ``keys[i]`` its token tuple."""

    name: str
    terms: tuple[str, ...]
    keys: tuple[tuple[str, ...], ...]

    def __len__(self) -> int:
        return len(self.terms)

    @classmethod
    def from_terms(cls, name: str, terms: Iterable[str]) -> "Vocabulary":
        """Tokenize terms; drop empty ones and duplicates (same tokens), keeping the first occurrence."""
        seen: set[tuple[str, ...]] = set()
        out_terms: list[str] = []
        out_keys: list[tuple[str, ...]] = []
        for term in terms:
            key = tuple(tokenize(term))
            if not key or key in seen:
                continue
            seen.add(key)
            out_terms.append(" ".join(key))
            out_keys.append(key)
        if not out_terms:
            raise ConfigError(f"vocabulary {name!r} has no usable terms")
        return cls(name=name, terms=tuple(out_terms), keys=tuple(out_keys))

    def subset(self, term_ids: Sequence[int], name: str | None = None) -> "Vocabulary":
        ids = [int(i) for i in term_ids]
        return Vocabulary(
            name=name or f"{self.name}[subset]",
            terms=tuple(self.terms[i] for i in ids),
            keys=tuple(self.keys[i] for i in ids),
        )


def _english_stop_words() -> frozenset[str]:
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    return frozenset(ENGLISH_STOP_WORDS)


@functools.lru_cache(maxsize=1)
def withheld_terms() -> frozenset[str]:
    """The words ``english_vocabulary`` withholds: a public, fixed list (tasks/seeds/withheld_terms.txt), so that
    the noise of a term histogram never lifts a slur into a released seed. A ``--vocab FILE`` is used as given."""
    with WITHHELD_TERMS_FILE.open(encoding="utf-8") as fh:
        return frozenset(ln.strip() for ln in fh if ln.strip() and not ln.startswith("#"))


@functools.lru_cache(maxsize=8)
def english_vocabulary(top_n: int = DEFAULT_ENGLISH_TOP_N, min_length: int = 2) -> Vocabulary:
    """The ``top_n`` most frequent English words of wordfreq's 'large' list (shipped in the wheel,
    no download), alphabetic only, sklearn's English stop words and privseed's withheld words (``withheld_terms``)
    removed.

    ``top_n`` is a *public* frequency cut: it costs no privacy, and it keeps Laplace noise over
    hundreds of thousands of rare words from pushing junk into V~ when the private corpus is small.
    The cut is applied to wordfreq's list before filtering, so it is a rank threshold.
    """
    if top_n < 1:
        raise ConfigError(f"english vocabulary top_n must be >= 1, got {top_n}")
    import wordfreq

    dropped = _english_stop_words() | withheld_terms()
    words = wordfreq.top_n_list("en", top_n, wordlist="large")
    keep = (w for w in words if w.isalpha() and len(w) >= min_length and w not in dropped)
    return Vocabulary.from_terms(f"english-top{top_n}", keep)


@functools.lru_cache(maxsize=8)
def file_vocabulary(path: str) -> Vocabulary:
    """One term per line (multi-word terms allowed); blank lines and '#' comments ignored."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"vocabulary file not found: {path}")
    with p.open(encoding="utf-8") as fh:
        lines = (ln.strip() for ln in fh)
        return Vocabulary.from_terms(p.name, (ln for ln in lines if ln and not ln.startswith("#")))


def load_vocabulary(spec: str, english_top_n: int = DEFAULT_ENGLISH_TOP_N) -> Vocabulary:
    """``"english"`` or a path to a term file. Cached once per process."""
    if spec == "english":
        return english_vocabulary(english_top_n)
    return file_vocabulary(str(Path(spec).expanduser().resolve()))


class PhraseMatcher:
    """Greedy longest-match phrase extraction over a vocabulary (docs/dpkps.md, step 2).

    Index: an n-gram hash (dict from token tuple to term id) plus, per first token, the longest term
    length starting with it. At every position we try the longest candidate first and step down;
    a match consumes its tokens, otherwise we advance one token. Cost per token is one dict lookup for
    tokens that start no term; it scales to |V| = 400K terms (no regex alternation).
    """

    def __init__(self, vocabulary: Vocabulary):
        self.vocabulary = vocabulary
        self._ids: dict[tuple[str, ...], int] = {}
        self._max_len: dict[str, int] = {}
        for term_id, key in enumerate(vocabulary.keys):
            self._ids.setdefault(key, term_id)
            first = key[0]
            if len(key) > self._max_len.get(first, 0):
                self._max_len[first] = len(key)
        # With one-token terms only (the English list, V~ drawn from it) greedy matching is a filter of the tokens.
        self._one_token: dict[str, int] | None = (
            {key[0]: term_id for key, term_id in self._ids.items()} if set(self._max_len.values()) <= {1} else None)

    def match_tokens(self, tokens: Sequence[str]) -> list[int]:
        """Term ids matched in reading order."""
        if self._one_token is not None:
            one_token = self._one_token
            return [one_token[t] for t in tokens if t in one_token]
        ids = self._ids
        max_len = self._max_len
        out: list[int] = []
        pos = 0
        n_tokens = len(tokens)
        while pos < n_tokens:
            longest = max_len.get(tokens[pos], 0)
            if longest == 0:
                pos += 1
                continue
            longest = min(longest, n_tokens - pos)
            for n in range(longest, 0, -1):
                term_id = ids.get(tuple(tokens[pos : pos + n]))
                if term_id is not None:
                    out.append(term_id)
                    pos += n
                    break
            else:
                pos += 1
        return out

    def match(self, text: str) -> list[int]:
        return self.match_tokens(tokenize(text))

    def extract(self, texts: Iterable[str]) -> list[list[int]]:
        return [self.match(t) for t in texts]

    def first_matches(self, text: str, count: int, *, distinct: bool = False,
                      allowed: Container[int] | None = None) -> list[int]:
        """The first ``count`` ids of ``match(text)`` that are in ``allowed`` (all ids when None), keeping only
        the first occurrence of each id when ``distinct``: the ids the histograms count (first S terms, first S
        distinct terms, a class's released terms), found without reading the rest of the document.

        Exactly those of the full match: greedy left-to-right matching decides a match from the tokens at and
        after its position only, so the document is tokenized a chunk at a time (never cutting a token) and
        matching stops at the ``count``-th kept id. On ~1.4 KB documents with S = 10 this reads the first
        200-300 characters instead of all of them."""
        if count < 1:
            raise ConfigError(f"terms per document must be >= 1, got {count}")
        ids = self._ids
        max_len = self._max_len
        lowered = text.lower()
        size = len(lowered)
        tokens: list[str] = []
        known = 0  # len(tokens)
        scanned = 0  # every token before this character offset is in ``tokens``, whole
        chunk = _FIRST_CHUNK_CHARS
        out: list[int] = []
        seen: set[int] = set()
        pos = 0
        need = 1
        while True:
            if need > known:  # tokenize on until the candidate at ``pos`` is whole, or the document ends
                while known < need and scanned < size:
                    end = min(size, scanned + chunk)
                    found = _TOKEN_RE.findall(lowered, scanned, end)
                    if (end < size and found and _TOKEN_CHAR_RE.match(lowered, end)
                            and _TOKEN_CHAR_RE.match(lowered, end - 1)):
                        end -= len(found.pop())  # the chunk cut a token: take it whole next time
                    tokens.extend(found)
                    known = len(tokens)
                    scanned = end
                    chunk *= 2
                if pos >= known:
                    return out
            longest = max_len.get(tokens[pos], 0)
            if longest == 0:
                pos += 1
                need = pos + 1
                continue
            if longest == 1:  # the one candidate is the token itself, which is a term (most of English)
                term_id = ids[(tokens[pos],)]
                pos += 1
                need = pos + 1
                if (allowed is None or term_id in allowed) and not (distinct and term_id in seen):
                    out.append(term_id)
                    if len(out) == count:
                        return out
                    seen.add(term_id)
                continue
            if pos + longest > known and scanned < size:
                need = pos + longest
                continue
            for n in range(min(longest, known - pos), 0, -1):
                match_id = ids.get(tuple(tokens[pos : pos + n]))
                if match_id is not None:
                    pos += n
                    if (allowed is None or match_id in allowed) and not (distinct and match_id in seen):
                        out.append(match_id)
                        if len(out) == count:
                            return out
                        seen.add(match_id)
                    break
            else:
                pos += 1
            need = pos + 1


@functools.lru_cache(maxsize=4)
def _cached_matcher(vocabulary: Vocabulary) -> PhraseMatcher:
    return PhraseMatcher(vocabulary)


def phrase_matcher(vocabulary: Vocabulary) -> PhraseMatcher:
    """A matcher indexed once per process per vocabulary."""
    return _cached_matcher(vocabulary)


# ---------------------------------------------------------------------------------------------
# Step 3: DP histogram over V
# ---------------------------------------------------------------------------------------------

def first_terms_histogram(sequences: Iterable[Sequence[int]], vocab_size: int, max_terms_per_doc: int) -> np.ndarray:
    """Counts over V of the first S matched terms of every document (int64, length |V|).

    Additive: histograms of disjoint shards sum to the histogram of their union. Under add/remove of
    one document the vector changes by at most S in L1 norm (S = ``max_terms_per_doc``).
    """
    if max_terms_per_doc < 1:
        raise ConfigError(f"terms per document S must be >= 1, got {max_terms_per_doc}")
    flat: list[int] = []
    for seq in sequences:
        flat.extend(seq[:max_terms_per_doc])
    return np.bincount(np.asarray(flat, dtype=np.int64), minlength=vocab_size).astype(np.int64)


def require_vocabulary_hits(counts: np.ndarray, vocab: str) -> None:
    """Stops a run whose documents contain no term of V (wrong --vocab or --text-column) before any noise is
    drawn; the message says nothing about any document."""
    from privseed.tasks.errors import CorpusError

    if not np.any(counts):
        raise CorpusError(f"no document contains a term of the public vocabulary {vocab!r}: "
                          "check --vocab and --text-column")


def vocabulary_mechanism(epsilon: float, max_terms_per_doc: int) -> LaplaceMechanism:
    """The vocabulary histogram's mechanism: Laplace with scale S / eps on every coordinate of V.

    Guarantee: eps-DP under add/remove of one document. The L1 sensitivity of the first-S histogram is S
    (a document contributes at most S term occurrences). The counts are integers and S is an integer, so the
    mechanism draws discrete Laplace (two-sided geometric) noise of that scale, exact on integers."""
    if not np.isfinite(epsilon) or epsilon <= 0:
        raise ConfigError(f"eps_voc must be a positive finite number, got {epsilon}")
    if max_terms_per_doc < 1:
        raise ConfigError(f"terms per document S must be >= 1, got {max_terms_per_doc}")
    return LaplaceMechanism(sensitivity=int(max_terms_per_doc), epsilon=float(epsilon))


def top_terms(noisy: np.ndarray, top_n: int) -> dict[str, np.ndarray]:
    """Post-processing of the noisy histogram: the ``top_n`` term ids by decreasing noisy count (ties by id),
    and their noisy counts."""
    if top_n < 1:
        raise ConfigError(f"vocabulary size N must be >= 1, got {top_n}")
    noisy = np.asarray(noisy)
    # A full sort, not argpartition: integer noisy counts tie often, and which tied term argpartition keeps at
    # the cut depends on the array's layout; here the cut is the same function of the released vector always.
    top = np.lexsort((np.arange(noisy.shape[0]), -noisy))[:top_n]
    return {"term_ids": top.astype(np.int64), "noisy_counts": noisy[top]}


def privatize_vocabulary(
    counts: np.ndarray, *, mechanism: LaplaceMechanism, noise: NoiseSource, top_n: int
) -> dict[str, np.ndarray]:
    """The mechanism on the histogram, then the top N noisy counts (post-processing).

    Noise is added to EVERY coordinate of V, zero counts included (skipping zeros would reveal which terms
    occur). Returns the full noisy histogram (``noisy``, what the mechanism released) and the selected term
    ids with their noisy counts. The flows draw the same thing through ``PrivacyLedger.draw_once`` with
    ``exact=counts`` and ``postprocess=top_terms``; this function is for callers without a ledger
    (benchmarks, tests)."""
    top_terms(np.zeros(1), top_n)  # validates N before any noise is drawn
    noisy = mechanism.release(np.asarray(counts, dtype=np.int64), noise)
    return {"noisy": noisy, **top_terms(noisy, top_n)}


@functools.lru_cache(maxsize=4)
def released_vocabulary(terms: tuple[str, ...]) -> Vocabulary:
    """V~ as a Vocabulary (its terms are already normalized token strings); cached per process."""
    return Vocabulary.from_terms("released", terms)
