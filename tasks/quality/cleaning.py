"""What generation removes from an LLM answer before the document predicate judges it: a preamble line ("Here's a
summary of ...:"), an opening sentence that judges the review instead of being it, report scaffolding (a title's
label, "### Introduction", "---"), quotes around the whole answer, and, for an answer cut off at the token limit,
its unfinished last sentence. The patterns are data
(``patterns.json`` ``cleaning``, each with why it is there); this module only applies them. Pure: it reads a
synthetic text and the call's public finish reason."""

from __future__ import annotations


from privseed.tasks.quality.patterns import CLEANING_PATTERNS
from privseed.tasks.quality.shapes import ends_a_sentence

_PREAMBLE = CLEANING_PATTERNS["preamble"]
_JUDGED_OPENING = CLEANING_PATTERNS["judged_opening"]
_LAST_SENTENCE_END = CLEANING_PATTERNS["last_sentence_end"]
_TITLE_LINE = CLEANING_PATTERNS["title_line"]
_TITLE_LABEL = CLEANING_PATTERNS["title_label"]
_SECTION_LINE = CLEANING_PATTERNS["section_line"]
_RULE_LINE = CLEANING_PATTERNS["rule_line"]
_BLANK_LINES = CLEANING_PATTERNS["blank_lines"]


def strip_scaffolding(text: str) -> str:
    """``text`` with its title line reduced to the title's words, without generic section-name lines and
    horizontal rules (patterns.json ``cleaning``: title_line, section_line, rule_line)."""
    out = _RULE_LINE.sub("", text).lstrip()
    title = _TITLE_LINE.match(out)
    if title:
        words = _TITLE_LABEL.sub("", title.group("title")).strip(" \t*_#\"'\u201c\u201d")
        out = (words + "\n\n" if words else "") + out[title.end():]
    out = _SECTION_LINE.sub("", out)
    return _BLANK_LINES.sub("\n\n", out).strip()


def clean_text(text: str, finish_reason: str | None = None) -> str:
    """Drop what small models put before the document ("Here's a summary of ...:", "A Wikipedia-style
    article:" lines, repeated), an opening sentence that judges the review instead of being it ("The review was
    great, and I appreciate the kind words.") when the rest keeps at least half of the answer, report scaffolding
    around it (``strip_scaffolding``: a title line, "###
    Introduction", "---") and quotes wrapped around the whole answer. An answer cut off at the token limit
    ("length") is trimmed back to its last full sentence when that keeps at least half of it (otherwise the
    document predicate calls it truncated). Touches nothing else."""
    out = text.strip()
    while True:
        m = _PREAMBLE.match(out)
        if not m:
            break
        out = out[m.end():].lstrip()
    judged = _JUDGED_OPENING.match(out)
    if judged and len(out[judged.end():].split()) * 2 >= len(out.split()):
        out = out[judged.end():]
    out = strip_scaffolding(out)
    if len(out) >= 2 and out[0] == out[-1] and out[0] in "\"'":
        out = out[1:-1].strip()
    if finish_reason == "length":
        ends = list(_LAST_SENTENCE_END.finditer(out))
        if not ends_a_sentence(out) and ends:
            kept = out[:ends[-1].end()].strip()
            if len(kept.split()) * 2 >= len(out.split()):
                out = kept
    return out
