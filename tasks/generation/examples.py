"""The example library: public example documents a local model is shown when the owner gives no ``--few-shot``.

A small model writes a document only when an example shows it the form (docs/generation.md: without examples
SmolLM2-135M answers with the seed list or talks about the request). The library holds one or two documents per
common kind, written for privseed (``tasks/demo_data/example_library.toml`` and the ``few_shot_*.jsonl`` files it
names); ``examples_for_doc_type`` picks a kind from the words of ``--doc-type``. ``params_from_config``
(tasks/generation/documents.py) shows them to local models only (on a paid API they cost input tokens on every
call), never when the owner's ``--few-shot`` is given, and not with ``--examples none``.

Privacy: the library is public data shipped with the package, and the kind depends on ``--doc-type`` alone.
"""
from __future__ import annotations

import functools
import re
import tomllib
from dataclasses import dataclass
from importlib import resources

from privseed.tasks.llm.released import RecipientExample, load_few_shot

LIBRARY_INDEX = "example_library.toml"
#: what the manifest's ``prompt_examples`` says when the owner's --few-shot file gave the examples
OWNER_EXAMPLES = "owner --few-shot"


@dataclass(frozen=True)
class ExampleKind:
    """One kind of document in the library: its name, the words of a doc type that select it, its examples' file
    (in ``tasks/demo_data/``, the ``--few-shot`` format)."""

    name: str
    words: frozenset[str]
    file: str


def _library_folder() -> str:
    return str(resources.files("privseed.tasks") / "demo_data")


@functools.cache
def example_library() -> tuple[ExampleKind, ...]:
    """The library's kinds in the order of its index."""
    index = tomllib.loads((resources.files("privseed.tasks") / "demo_data" / LIBRARY_INDEX).read_text("utf-8"))
    return tuple(ExampleKind(name, frozenset(entry["words"]), entry["file"]) for name, entry in index.items())


def doc_type_words(doc_type: str) -> list[str]:
    """The words of a doc type, lower case, a plural's final s dropped ("Usenet posts" -> usenet, post)."""
    words = re.findall(r"[a-z]+", doc_type.lower())
    return [w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w for w in words]


def example_kind_for(doc_type: str, library: tuple[ExampleKind, ...] | None = None) -> str | None:
    """The library kind a doc type names: the kind that matches the most of its words, a tie to the kind whose
    word comes first in the doc type; None when no word matches (``"document"``)."""
    words = doc_type_words(doc_type)
    best: tuple[int, int] | None = None
    chosen = None
    for kind in library if library is not None else example_library():
        positions = [i for i, w in enumerate(words) if w in kind.words]
        if not positions:
            continue
        rank = (len(positions), -positions[0])
        if best is None or rank > best:
            best, chosen = rank, kind.name
    return chosen


@functools.cache
def _kind_examples(file: str) -> tuple[RecipientExample, ...]:
    return tuple(load_few_shot(f"{_library_folder()}/{file}"))


def examples_for_doc_type(doc_type: str) -> tuple[RecipientExample, ...]:
    """The library's examples for a doc type (``example_kind_for``); none when no kind matches."""
    name = example_kind_for(doc_type)
    if name is None:
        return ()
    return _kind_examples(next(k.file for k in example_library() if k.name == name))


def prompt_examples(few_shot: str | None, examples: str, local_weights: bool, doc_type: str) -> str | None:
    """Which examples the prompts show, as the manifest records it (public: it depends on configuration only):
    ``OWNER_EXAMPLES`` when the owner gave ``--few-shot`` (it always wins), the library kind when the library is on
    (``examples == "library"``) and the backend runs local weights, else None (no examples)."""
    if few_shot:
        return OWNER_EXAMPLES
    if examples != "library" or not local_weights:
        return None
    return example_kind_for(doc_type)
