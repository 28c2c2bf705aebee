"""Versioned prompt templates and the prompt builder.

Templates live as YAML files in tasks/llm/prompts/ (or any path the user gives). Each carries a ``version``
string that is written into every output row, so a synthetic document can always be traced to the exact
wording that produced it. Placeholders are limited to ``{doc_type}`` and ``{terms}``: a template cannot ask
for a class name or any other field, and the builder only takes ``ReleasedSeed`` and ``RecipientExample``
values (tasks/llm/released.py).

Few-shot prompting (Appendix C.2.5) is rendered as prior chat turns: for each recipient example the user
turn is the same instruction filled with the example's keyphrases and the assistant turn is the example
document. The chat template that turns messages into model text comes from the model (GGUF metadata for
llama.cpp, the server for remote APIs); nothing here guesses it.
"""
from __future__ import annotations

import string
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Sequence

import yaml

from tasks.errors import ConfigError
from tasks.llm.base import ChatMessage, ChatRequest, SeedSteering
from tasks.llm.released import RecipientExample, ReleasedSeed, UnreleasedValueError
# One coverage measure in the codebase (tasks/metrics.py), re-exported for the prompt layer's users.
from tasks.metrics import term_coverage  # noqa: F401

ALLOWED_FIELDS = {"doc_type", "terms"}
DEFAULT_TEMPLATE = "generic"


def _fields(fmt: str) -> set[str]:
    return {f for _, f, _, _ in string.Formatter().parse(fmt) if f is not None}


@dataclass(frozen=True)
class PromptTemplate:
    name: str
    version: str
    user: str
    system: str | None = None
    terms_separator: str = ", "

    def __post_init__(self) -> None:
        for part in (self.user, self.system or ""):
            extra = _fields(part) - ALLOWED_FIELDS
            if extra:
                raise ConfigError(f"prompt template {self.name!r} uses unknown placeholders {sorted(extra)}; "
                                  f"allowed: {sorted(ALLOWED_FIELDS)}")
        if "{terms}" not in self.user:
            raise ConfigError(f"prompt template {self.name!r}: the user prompt must contain {{terms}}")
        if not self.version:
            raise ConfigError(f"prompt template {self.name!r} has no version")

    @classmethod
    def load(cls, name_or_path: str = DEFAULT_TEMPLATE) -> "PromptTemplate":
        """A packaged template by name (``generic``, ``coverage``) or a YAML file path."""
        p = Path(name_or_path)
        if p.suffix in (".yaml", ".yml") and p.exists():
            text = p.read_text(encoding="utf-8")
        else:
            res = resources.files("tasks.llm").joinpath("prompts", f"{name_or_path}.yaml")
            if not res.is_file():
                raise ConfigError(f"unknown prompt template {name_or_path!r}; packaged: {available_templates()}")
            text = res.read_text(encoding="utf-8")
        try:
            d = yaml.safe_load(text)
            return cls(name=str(d["name"]), version=str(d["version"]), user=str(d["user"]),
                       system=d.get("system"), terms_separator=str(d.get("terms_separator", ", ")))
        except (KeyError, TypeError, yaml.YAMLError) as e:
            raise ConfigError(f"prompt template {name_or_path!r} is malformed: {type(e).__name__}: {e}") from e

    def render_user(self, doc_type: str, terms: Sequence[str]) -> str:
        return self.user.format(doc_type=doc_type, terms=self.terms_separator.join(terms))

    def render_system(self, doc_type: str) -> str | None:
        return None if self.system is None else self.system.format(doc_type=doc_type)


def available_templates() -> list[str]:
    folder = resources.files("tasks.llm").joinpath("prompts")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def build_messages(template: PromptTemplate, seed: ReleasedSeed, doc_type: str,
                   few_shot: Sequence[RecipientExample] = ()) -> tuple[ChatMessage, ...]:
    """The chat for one seed. Accepts released seeds and recipient examples only (type-checked)."""
    if not isinstance(seed, ReleasedSeed):
        raise UnreleasedValueError("build_messages takes a ReleasedSeed, not raw text")
    if not isinstance(doc_type, str) or not doc_type.strip():
        raise ConfigError("doc_type must be a non-empty string, e.g. 'summary of a Wikipedia-style article'")
    msgs: list[ChatMessage] = []
    system = template.render_system(doc_type)
    if system:
        msgs.append(ChatMessage("system", system))
    for ex in few_shot:
        if not isinstance(ex, RecipientExample):
            raise UnreleasedValueError("few-shot examples must be RecipientExample objects (load_few_shot)")
        msgs.append(ChatMessage("user", template.render_user(doc_type, ex.keyphrases)))
        msgs.append(ChatMessage("assistant", ex.document))
    msgs.append(ChatMessage("user", template.render_user(doc_type, seed.keyphrases)))
    return tuple(msgs)


def build_request(template: PromptTemplate, seed: ReleasedSeed, doc_type: str, *, max_tokens: int,
                  temperature: float, call_seed: int, few_shot: Sequence[RecipientExample] = (),
                  top_p: float = 1.0, steering: SeedSteering | None = None) -> ChatRequest:
    """One request for ``seed``. ``steering`` (local backends) must steer towards this seed's own terms."""
    if steering is not None and tuple(steering.terms) != tuple(seed.keyphrases):
        raise UnreleasedValueError("steering terms must be the seed's own released keyphrases")
    if max_tokens <= 0:
        raise ConfigError(f"max_tokens must be positive, got {max_tokens}")
    if temperature < 0:
        raise ConfigError(f"temperature must be >= 0, got {temperature}")
    return ChatRequest(build_messages(template, seed, doc_type, few_shot), int(max_tokens), float(temperature),
                       int(call_seed), float(top_p), steering)
