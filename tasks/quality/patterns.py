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
