"""The regular expressions that remain in the document predicate, loaded once from ``patterns.json`` beside this
module: what an answer *says* (a chat template's tokens, the assistant talking about itself or the task, a preamble
naming the kind of document, a group of people called evil), which no statistic of its shape can see, and what
generation's cleaning removes before the predicate judges an answer (``privseed.tasks.quality.cleaning``). The file
gives each group of patterns the reason it was added."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

PATTERNS_FILE = Path(__file__).with_name("patterns.json")
_FLAGS = {"i": re.I, "m": re.M}


def _load() -> dict[str, Any]:
    return json.loads(PATTERNS_FILE.read_text(encoding="utf-8"))


def _flags(letters: str) -> int:
    flags = 0
    for letter in letters:
        flags |= _FLAGS[letter]
    return flags


_DATA = _load()
# Each entry: (name reported in the gate result, compiled regex).
TEMPLATE_RESIDUE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (entry["name"], re.compile(entry["pattern"], _flags(entry["flags"]))) for entry in _DATA["template_residue"])
META_TALK_PATTERNS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(pattern, re.I | re.M) for group in _DATA["meta_talk"] for pattern in group["patterns"])
# Links (URLs with a scheme or "www.", domains with a path, e-mail addresses) and tags (hashtags, @handles), counted by
# ``privseed.tasks.quality.shapes.web_markup``.
LINK_PATTERN: re.Pattern[str] = re.compile(_DATA["web_markup"]["link"], re.I)
TAG_PATTERN: re.Pattern[str] = re.compile(_DATA["web_markup"]["tag"], re.I)
# Each entry: (marker name, compiled regex) of the frame of a chat message or letter around a text.
CHAT_FRAME_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (entry["name"], re.compile(entry["pattern"], re.I)) for entry in _DATA["chat_frame"])


def _alternation(words: list[str]) -> str:
    """One non-capturing alternation of ``words`` (longest first; a space matches any white space)."""
    return "(?:" + "|".join(re.escape(w).replace(r"\ ", r"\s+") for w in sorted(words, key=len, reverse=True)) + ")"


_GROUP = _alternation(_DATA["hostility"]["groups"])
# A statement that a group of people is evil or should be harmed: the group, at most three words, then a copula and
# an attribute ("Muslims are violent", "immigrants are all criminals") or "should be" and a harm.
HOSTILITY_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(rf"\b{_GROUP}\b(?:\s+[\w'-]+){{0,3}}?\s+(?:is|are|was|were)\s+"
               rf"(?:(?:an?|so|very|all|just|pure|purely|truly|really|simply|nothing\s+but)\s+)*"
               rf"{_alternation(_DATA['hostility']['attributes'])}\b", re.I),
    re.compile(rf"\b{_GROUP}\b(?:\s+[\w'-]+){{0,3}}?\s+should\s+(?:all\s+)?(?:be\s+)?"
               rf"{_alternation(_DATA['hostility']['harms'])}\b", re.I),
)
# What ``privseed.tasks.quality.cleaning.clean_text`` removes, by name (a preamble line, a title's label, ...).
CLEANING_PATTERNS: dict[str, re.Pattern[str]] = {
    entry["name"]: re.compile(entry["pattern"], _flags(entry["flags"])) for entry in _DATA["cleaning"]}
# The kinds of document a preamble names ("review", "post", "abstract", ...), as one alternation (a plural allowed).
DOCUMENT_KINDS: tuple[str, ...] = tuple(_DATA["document_preamble"]["kinds"])
_KINDS = "(?:" + "|".join(re.escape(kind) for kind in DOCUMENT_KINDS) + ")s?"
# Each entry: (shape name, compiled regex) of a preamble that names the document's kind before a colon.
DOCUMENT_PREAMBLE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (entry["name"], re.compile(entry["pattern"].replace("{kinds}", _KINDS), re.I))
    for entry in _DATA["document_preamble"]["patterns"])


def template_residue(text: Any) -> str | None:
    """The name of the first residue pattern found in ``text``, or None when the text is clean."""
    if not isinstance(text, str):
        return None
    for name, pattern in TEMPLATE_RESIDUE_PATTERNS:
        if pattern.search(text):
            return name
    return None


def meta_talk(text: str) -> bool:
    """Whether the answer talks about itself, the task or the seed words instead of being the document, or opens
    with a preamble naming the kind of document it is (``document_preamble``)."""
    return any(p.search(text) for p in META_TALK_PATTERNS) or document_preamble(text) is not None


def document_preamble(text: Any) -> str | None:
    """The shape of the preamble naming the document's kind that ``text`` opens with ("The Yelp review is: ...",
    "Here's a possible Usenet newsgroup post about ...: ..."), or None."""
    if not isinstance(text, str):
        return None
    for name, pattern in DOCUMENT_PREAMBLE_PATTERNS:
        if pattern.search(text):
            return name
    return None


def chat_frame_markers(text: Any) -> tuple[str, ...]:
    """The names of the chat-frame markers (``chat_frame`` in patterns.json: a greeting to a crowd, "I hope this
    message finds you well", a sign-off, ...) in ``text``, each counted once. One is a real post's manner now and
    then; two are a chat message around the text (``DocumentRules.max_chat_markers``)."""
    if not isinstance(text, str):
        return ()
    return tuple(name for name, pattern in CHAT_FRAME_PATTERNS if pattern.search(text))


def hostility(text: Any) -> bool:
    """Whether ``text`` says a group of people is evil or should be harmed (patterns.json ``hostility``)."""
    return isinstance(text, str) and any(p.search(text) for p in HOSTILITY_PATTERNS)
