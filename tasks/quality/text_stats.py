"""Measured text statistics of one document: the Gopher quality and repetition filters, and a few more.

The definitions are those of Rae et al. 2021, "Scaling Language Models: Methods, Analysis & Insights from
Training Gopher", Appendix A.1.1 and Table A1, as Hugging Face's ``datatrove`` implements them
(``datatrove/pipeline/filters/gopher_repetition_filter.py`` and ``gopher_quality_filter.py``, 0.10.1): the same
fractions, computed the same way (duplicates counted after their first occurrence, characters over the text's
length, duplicated n-grams counted without overlap). datatrove itself is a pipeline framework (documents,
writers, executors, its own tokenizers); the two functions are a few lines each, so they live here and are
tested against the published behaviour instead of pulling the framework in.

The thresholds are not Gopher's: Gopher filtered web pages of 50 words and more, while a synthetic document here
is a paragraph. They are chosen on public real text (``benchmarks/document_predicate_real.py``, docs/generation.md).
Everything here is pure: a text in, numbers out.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

# Gopher's stop words (Rae et al. 2021, A.1.1: "the, be, to, of, and, that, have, with"): a document with fewer
# than two of them is not English prose (a bare list of nouns, a table, code).
GOPHER_STOP_WORDS: frozenset[str] = frozenset({"the", "be", "to", "of", "and", "that", "have", "with"})

_PARAGRAPH = re.compile(r"\n{2,}")
_LINES = re.compile(r"\n+")
_WORD = re.compile(r"[^\W_]+(?:['\u2019][^\W_]+)*")
# A comma-separated list of capitalised items of one or two words: "Singer, Hammy, Drying, Rooftop, Rowling".
_CAPITAL_LIST = re.compile(r"(?:\b[A-Z][\w'\-]*(?:[ \t]+[A-Z][\w'\-]*)?[ \t]*,[ \t]*){5,}[A-Z][\w'\-]*")
# A group of five letters or more written twice back to back inside one word: "AdministrativeAdministrative",
# "robertrobertro". (Real words double shorter groups: "couscous", "murmur", "Baden-Baden" is two words.)
# Markdown structure at a line start ("## Career", "- item", "1. item"): a document's layout, which the glossary
# and fragment tests judge; Gopher's symbol and letter shares count the words of the text, not its markup.
_LINE_MARKUP = re.compile(r"(?m)^[ \t]*(?:#{1,6}|[-*+\u2022]|\d{1,3}[.)])(?=[ \t])")
# An ellipsis: "...", "\u2026", or a longer run of dots ("good.............") counted once.
_ELLIPSIS = re.compile(r"\.{3,}|\u2026+")
_DOUBLED_GROUP = re.compile(r"([^\W\d_]{6,})\1", re.I)


def _doubled_group(word: str) -> bool:
    """A group of 6+ letters, 3+ of them distinct, twice back to back ("sooooooo" is one letter held)."""
    return any(len(set(m.lower())) >= 3 for m in _DOUBLED_GROUP.findall(word))


def _duplicates(items: Sequence[str]) -> tuple[int, int]:
    """How many items repeat an earlier one, and their characters (datatrove ``find_duplicates``)."""
    seen: set[str] = set()
    count = chars = 0
    for item in items:
        if item in seen:
            count += 1
            chars += len(item)
        else:
            seen.add(item)
    return count, chars


def top_ngram_char_fraction(words: Sequence[str], n: int, text_length: int) -> float:
    """Characters of the most frequent word n-gram times its count, over the text's length (Gopher's "top
    n-gram character fraction")."""
    grams = Counter(" ".join(words[i:i + n]) for i in range(len(words) - n + 1))
    if not grams or text_length == 0:
        return 0.0
    gram, count = grams.most_common(1)[0]
    return len(gram) * count / text_length if count > 1 else 0.0


def duplicate_ngram_char_fraction(words: Sequence[str], n: int, text_length: int) -> float:
    """Characters of word n-grams that repeat an earlier n-gram, counted without overlap, over the text's length
    (Gopher's "duplicate n-gram character fraction"; datatrove ``find_all_duplicate``)."""
    seen: set[str] = set()
    chars = i = 0
    while i < len(words) - n + 1:
        gram = "".join(words[i:i + n])
        if gram in seen:
            chars += len(gram)
            i += n
        else:
            seen.add(gram)
            i += 1
    return chars / text_length if text_length else 0.0


@dataclass(frozen=True)
class TextStats:
    """The statistics of one text that the document predicate compares with its thresholds."""

    words: int                    # word tokens (letters or digits)
    lines: int                    # lines, empty ones included
    dup_line_frac: float          # lines that repeat an earlier line / lines
    dup_line_char_frac: float     # their characters / characters
    dup_para_frac: float          # paragraphs (split at blank lines) that repeat an earlier one / paragraphs
    dup_para_char_frac: float
    top_ngram_char_frac: tuple[float, float, float]  # n = 2, 3, 4
    dup_ngram_char_frac: tuple[float, ...]           # n = 5 .. 10
    symbol_word_ratio: float      # ("#" outside markdown headings + ellipses) / words
    bullet_line_frac: float       # lines starting with a bullet / lines
    ellipsis_line_frac: float     # lines ending with an ellipsis / lines
    alpha_word_frac: float        # tokens with a letter / tokens
    mattr: float                  # moving-average type-token ratio over 50-word windows (the whole text if shorter)
    stop_words: int               # distinct Gopher stop words present
    mean_word_length: float       # characters per word
    capital_list_chars: float     # characters in comma-separated lists of 6+ capitalised items / characters
    doubled_groups: int           # words with a 6+ letter group written twice back to back
    crowded_word: int             # the most times one content word occurs in any WORD_WINDOW words


def moving_type_token_ratio(words: Sequence[str], window: int = 50) -> float:
    """Mean share of distinct words in every window of ``window`` words (Covington & McFall 2010, MATTR): how
    often a text says something new, nearly independent of its length. "The genus of the group of animals known
    as the family of the group known as the group ..." is 0.24; real paragraphs are above 0.45."""
    if len(words) <= window:
        return len(set(words)) / max(1, len(words))
    counts = Counter(words[:window])
    distinct = total = len(counts)
    for i in range(window, len(words)):
        counts[words[i]] += 1
        distinct += counts[words[i]] == 1
        counts[words[i - window]] -= 1
        distinct -= counts[words[i - window]] == 0
        total += distinct
    return total / (len(words) - window + 1) / window


#: The window of ``crowded_word_count``: about two sentences.
WORD_WINDOW = 40


@functools.cache
def function_words() -> frozenset[str]:
    """scikit-learn's English stop words: the words a content-word statistic leaves out."""
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS  # imported when first needed: it is slow

    return frozenset(ENGLISH_STOP_WORDS)


def crowded_word_count(words: Sequence[str], window: int = WORD_WINDOW) -> int:
    """The most times one content word (three letters or more, not one of scikit-learn's English stop words, a
    final "s" dropped)
    occurs in any ``window`` consecutive words of ``words`` (lower-cased). A demo loop, "Football is played on a
    football field, and the football is played by a football player. Football is also played in the football
    stadium, and football is played in football stadiums.", is 8; a real paragraph about one subject names it two
    to four times in forty words."""
    stop = function_words()
    content = ["" if len(w) < 3 or w in stop or w.isdigit() else w[:-1] if len(w) > 3 and w.endswith("s") else w
               for w in words]
    counts: Counter[str] = Counter()
    best = 0
    for i, key in enumerate(content):
        if i >= window and content[i - window]:
            counts[content[i - window]] -= 1
        if key:
            counts[key] += 1
            best = max(best, counts[key])
    return best


def text_stats(text: str) -> TextStats:
    """All statistics of ``text`` (a non-empty string)."""
    length = max(1, len(text))
    paragraphs = _PARAGRAPH.split(text.strip())
    para_dups, para_chars = _duplicates(paragraphs)
    lines = [line for line in _LINES.split(text.strip())]
    line_dups, line_chars = _duplicates(lines)
    words = _WORD.findall(text)
    lowered = [w.lower() for w in words]
    unmarked = _LINE_MARKUP.sub(" ", text)
    spaced = unmarked.split()
    all_lines = text.splitlines() or [text]
    return TextStats(
        words=len(words),
        lines=len(all_lines),
        dup_line_frac=line_dups / max(1, len(lines)),
        dup_line_char_frac=line_chars / length,
        dup_para_frac=para_dups / max(1, len(paragraphs)),
        dup_para_char_frac=para_chars / length,
        top_ngram_char_frac=tuple(top_ngram_char_fraction(lowered, n, length) for n in (2, 3, 4)),  # type: ignore[arg-type]
        dup_ngram_char_frac=tuple(duplicate_ngram_char_fraction(lowered, n, length) for n in range(5, 11)),
        symbol_word_ratio=(unmarked.count("#") + len(_ELLIPSIS.findall(text))) / max(1, len(words)),
        bullet_line_frac=sum(line.lstrip().startswith(("\u2022", "-", "*")) for line in all_lines) / len(all_lines),
        ellipsis_line_frac=sum(line.rstrip().endswith(("...", "\u2026")) for line in all_lines) / len(all_lines),
        alpha_word_frac=sum(any(c.isalpha() for c in t) for t in spaced) / len(spaced) if spaced else 0.0,
        mattr=moving_type_token_ratio(lowered),
        stop_words=len(GOPHER_STOP_WORDS.intersection(w.lower() for w in words)),
        mean_word_length=sum(map(len, words)) / len(words) if words else 0.0,
        capital_list_chars=sum(len(m) for m in _CAPITAL_LIST.findall(text)) / length,
        doubled_groups=sum(_doubled_group(w) for w in words),
        crowded_word=crowded_word_count(lowered),
    )
