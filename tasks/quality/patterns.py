"""The regular expressions that remain in the document predicate, loaded once from ``patterns.json`` beside this
module: what an answer *says* (a chat template's tokens, the assistant talking about itself or the task), which
no statistic of its shape can see. The file gives each group of patterns the reason it was added."""

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


def template_residue(text: Any) -> str | None:
    """The name of the first residue pattern found in ``text``, or None when the text is clean."""
    if not isinstance(text, str):
        return None
    for name, pattern in TEMPLATE_RESIDUE_PATTERNS:
        if pattern.search(text):
            return name
    return None


def meta_talk(text: str) -> bool:
    """Whether the answer talks about itself, the task or the seed words instead of being the document."""
    return any(p.search(text) for p in META_TALK_PATTERNS)


def chat_frame_markers(text: Any) -> tuple[str, ...]:
    """The names of the chat-frame markers in ``text`` (a greeting to a crowd, "I hope this message finds you well",
    "I'm writing to share", an invitation to reply, a sign-off), each counted once. One is a real post's manner
    now and then; two are a chat message around the text (``DocumentRules.max_chat_markers``)."""
    if not isinstance(text, str):
        return ()
    return tuple(name for name, pattern in CHAT_FRAME_PATTERNS if pattern.search(text))
