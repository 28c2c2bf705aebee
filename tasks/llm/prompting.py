"""Versioned prompt templates and the prompt builder.

Templates live as YAML files in tasks/llm/prompts/ (or any path the user gives). Each carries a ``version``
string that is written into every output row, so a synthetic document can always be traced to the exact
wording that produced it. Placeholders are limited to ``{doc_type}`` and ``{terms}``, and the builder only
takes ``ReleasedSeed``, ``RecipientExample`` and ``PublicClassNames`` values (tasks/llm/released.py).

Public class names (``--class-names``): a template may carry a second user prompt, ``class_name_user``, the
only place ``{class_name}`` is allowed. It is used when, and only when, the data owner declared public class
names; its rows carry the version ``<version>+<class_name_version>`` (``class-name`` unless the template says
otherwise), so the two prompts are versioned apart. Without declared names no prompt can name a
class (the paper's setting, where class topics are private).

Unseeded templates (``seeded: false``, e.g. ``only_llm``, the only-LLM baseline of ``privseed experiment``) carry
no ``{terms}``: their prompts hold public configuration only (the document type, and in ``class_name_user`` a
public class name). They are built by ``build_unseeded_request`` and refused by ``build_messages``, so a seed is
never silently dropped from a DP-KPS prompt.

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

from privseed.tasks.errors import ConfigError
from privseed.tasks.llm.base import ChatMessage, ChatRequest, SeedSteering
from privseed.tasks.llm.released import PublicClassNames, RecipientExample, ReleasedSeed, UnreleasedValueError
# One coverage measure in the codebase (tasks/quality/metrics.py), re-exported for the prompt layer's users.
from privseed.tasks.quality.metrics import term_coverage  # noqa: F401

ALLOWED_FIELDS = {"doc_type", "terms"}
CLASS_NAME_FIELD = "class_name"
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
    class_name_user: str | None = None  # the user prompt when the owner declared public class names
    class_name_version: str = "class-name"  # appended to ``version`` in the rows written with class_name_user
    seeded: bool = True  # False: a prompt without seed terms (see the module docstring)

    def __post_init__(self) -> None:
        for part in (self.user, self.system or ""):
            extra = _fields(part) - ALLOWED_FIELDS
            if extra:
                hint = (" ({class_name} belongs in class_name_user, used only with declared public class names)"
                        if CLASS_NAME_FIELD in extra else "")
                raise ConfigError(f"prompt template {self.name!r} uses unknown placeholders {sorted(extra)}; "
                                  f"allowed: {sorted(ALLOWED_FIELDS)}{hint}")
        if self.seeded and "{terms}" not in self.user:
            raise ConfigError(f"prompt template {self.name!r}: the user prompt must contain {{terms}}")
        if not self.seeded and any("terms" in _fields(part) for part in (self.user, self.system or "",
                                                                          self.class_name_user or "")):
            raise ConfigError(f"prompt template {self.name!r} is unseeded (seeded: false) and may not use {{terms}}")
        if self.class_name_user is not None:
            fields = _fields(self.class_name_user)
            extra = fields - ALLOWED_FIELDS - {CLASS_NAME_FIELD}
            needed = {"terms", CLASS_NAME_FIELD} if self.seeded else {CLASS_NAME_FIELD}
            if extra or not needed <= fields:
                raise ConfigError(f"prompt template {self.name!r}: class_name_user must contain "
                                  f"{' and '.join('{' + f + '}' for f in sorted(needed, reverse=True))} "
                                  "and no other placeholder than {doc_type}")
        if not self.version or not self.class_name_version:
            raise ConfigError(f"prompt template {self.name!r} has no version")

    @classmethod
    def load(cls, name_or_path: str = DEFAULT_TEMPLATE) -> "PromptTemplate":
        """A packaged template by name (``generic``, ``coverage``) or a YAML file path."""
        p = Path(name_or_path)
        if p.suffix in (".yaml", ".yml") and p.exists():
            text = p.read_text(encoding="utf-8")
        else:
            res = resources.files("privseed.tasks.llm").joinpath("prompts", f"{name_or_path}.yaml")
            if not res.is_file():
                raise ConfigError(f"unknown prompt template {name_or_path!r}; packaged: {available_templates()}")
            text = res.read_text(encoding="utf-8")
        try:
            d = yaml.safe_load(text)
            named = d.get("class_name_user")
            return cls(name=str(d["name"]), version=str(d["version"]), user=str(d["user"]),
                       system=d.get("system"), terms_separator=str(d.get("terms_separator", cls.terms_separator)),
                       class_name_user=None if named is None else str(named), seeded=bool(d.get("seeded", True)),
                       class_name_version=str(d.get("class_name_version", cls.class_name_version)))
        except (KeyError, TypeError, yaml.YAMLError) as e:
            raise ConfigError(f"prompt template {name_or_path!r} is malformed: {type(e).__name__}: {e}") from e

    def render_user(self, doc_type: str, terms: Sequence[str], class_name: str | None = None) -> str:
        if class_name is None:
            return self.user.format(doc_type=doc_type, terms=self.terms_separator.join(terms))
        if self.class_name_user is None:
            raise ConfigError(f"prompt template {self.name!r} has no class_name_user prompt, so it cannot name "
                              "the public class names (--class-names); the packaged templates have one")
        return self.class_name_user.format(doc_type=doc_type, terms=self.terms_separator.join(terms),
                                           class_name=class_name)

    def version_for(self, class_names: bool) -> str:
        """The prompt version written into each row: prompts that name the class are told apart."""
        return f"{self.version}+{self.class_name_version}" if class_names else self.version

    def render_system(self, doc_type: str) -> str | None:
        return None if self.system is None else self.system.format(doc_type=doc_type)


def available_templates() -> list[str]:
    folder = resources.files("privseed.tasks.llm").joinpath("prompts")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def build_messages(template: PromptTemplate, seed: ReleasedSeed, doc_type: str,
                   few_shot: Sequence[RecipientExample] = (),
                   class_names: PublicClassNames | None = None) -> tuple[ChatMessage, ...]:
    """The chat for one seed. Accepts released seeds, recipient examples and the owner's declared public
    class names only (type-checked). With class names, the seed's own class is named in its user turn, and
    an example with a public topic is asked for in the same words with its topic named (an example without one
    keeps the plain prompt): an example turn that names no topic teaches a small model nothing about a named one,
    and SmolLM2 then writes the name out as its subject ("Album is a rock band ...")."""
    if not isinstance(seed, ReleasedSeed):
        raise UnreleasedValueError("build_messages takes a ReleasedSeed, not raw text")
    if not template.seeded:
        raise ConfigError(f"prompt template {template.name!r} is unseeded: it would drop the seed's terms "
                          "(choose a seeded template, e.g. generic or coverage)")
    if class_names is not None and not isinstance(class_names, PublicClassNames):
        raise UnreleasedValueError("class names must be PublicClassNames from a configuration file (load_class_names)")
    if not isinstance(doc_type, str) or not doc_type.strip():
        raise ConfigError("doc_type must be a non-empty string, e.g. 'summary of a Wikipedia-style article'")
    msgs: list[ChatMessage] = []
    system = template.render_system(doc_type)
    if system:
        msgs.append(ChatMessage("system", system))
    for ex in few_shot:
        if not isinstance(ex, RecipientExample):
            raise UnreleasedValueError("few-shot examples must be RecipientExample objects (load_few_shot)")
        example_topic = ex.topic if class_names is not None else None
        msgs.append(ChatMessage("user", template.render_user(doc_type, ex.keyphrases, example_topic)))
        msgs.append(ChatMessage("assistant", ex.document))
    class_name = None if class_names is None else class_names.name_of(seed.label)
    msgs.append(ChatMessage("user", template.render_user(doc_type, seed.keyphrases, class_name)))
    return tuple(msgs)


def build_request(template: PromptTemplate, seed: ReleasedSeed, doc_type: str, *, max_tokens: int,
                  temperature: float, call_seed: int, few_shot: Sequence[RecipientExample] = (),
                  top_p: float = 1.0, class_names: PublicClassNames | None = None,
                  steering: SeedSteering | None = None, answer_prefix: str = "") -> ChatRequest:
    """One request for ``seed``. ``steering`` (local backends) must steer towards this seed's own terms;
    ``answer_prefix``: the public words its answer opens with (backends that continue one)."""
    if steering is not None and tuple(steering.terms) != tuple(seed.keyphrases):
        raise UnreleasedValueError("steering terms must be the seed's own released keyphrases")
    if max_tokens <= 0:
        raise ConfigError(f"max_tokens must be positive, got {max_tokens}")
    if temperature < 0:
        raise ConfigError(f"temperature must be >= 0, got {temperature}")
    return ChatRequest(build_messages(template, seed, doc_type, few_shot, class_names), int(max_tokens),
                       float(temperature), int(call_seed), float(top_p), steering, answer_prefix)


def build_unseeded_request(template: PromptTemplate, label: object, doc_type: str, *, max_tokens: int,
                           temperature: float, call_seed: int, class_names: PublicClassNames | None = None,
                           top_p: float = 1.0) -> ChatRequest:
    """One request of an unseeded template for a document of class ``label``: public configuration only (the
    document type and, with the owner's declared class names, the class's public name)."""
    if template.seeded:
        raise ConfigError(f"prompt template {template.name!r} needs seed terms; unseeded prompts use a template "
                          "with seeded: false (e.g. only_llm)")
    if class_names is not None and not isinstance(class_names, PublicClassNames):
        raise UnreleasedValueError("class names must be PublicClassNames from a configuration file (load_class_names)")
    if not isinstance(doc_type, str) or not doc_type.strip():
        raise ConfigError("doc_type must be a non-empty string, e.g. 'summary of a Wikipedia-style article'")
    if max_tokens <= 0:
        raise ConfigError(f"max_tokens must be positive, got {max_tokens}")
    if temperature < 0:
        raise ConfigError(f"temperature must be >= 0, got {temperature}")
    msgs: list[ChatMessage] = []
    system = template.render_system(doc_type)
    if system:
        msgs.append(ChatMessage("system", system))
    class_name = None if class_names is None else class_names.name_of(label)
    msgs.append(ChatMessage("user", template.render_user(doc_type, (), class_name)))
    return ChatRequest(tuple(msgs), int(max_tokens), float(temperature), int(call_seed), float(top_p))
