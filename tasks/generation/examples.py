"""The example library: public example documents a local model is shown when the owner gives no ``--few-shot``.

A small model writes a document only when an example shows it the form (docs/generation.md: without examples
SmolLM2-135M answers with the seed list or talks about the request). The library holds one or two documents per
common kind, written for privseed (``tasks/demo_data/example_library.toml`` and the ``few_shot_*.jsonl`` files it
names); ``examples_for_doc_type`` picks a kind from the words of ``--doc-type``. ``params_from_config``
(tasks/stages/generation.py) shows them to local models only (on a paid API they cost input tokens on every
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
#: The embedded model's documents may trail their own seeds by this many points before a run is told it works
#: outside the envelope measured for its kind (issue 48's bar).
ENVELOPE_MARGIN = 3.0
#: The model the library's ``embedded`` figures were measured with: ``--llm local`` and ``local-server`` without a
#: model name, or naming it.
EMBEDDED_MODEL = "smollm2"
#: Where a run that the embedded model cannot serve well can go (docs/generation.md).
STRONGER_BACKENDS = ("--llm local:qwen2.5-coder-0.5b (make setup-models), openai-compatible:URL for a served model, "
                     "or anthropic:MODEL")
#: what the manifest's ``prompt_examples`` says when the owner's --few-shot file gave the examples
OWNER_EXAMPLES = "owner --few-shot"


@dataclass(frozen=True)
class EmbeddedMeasure:
    """What the embedded model measured on a public corpus of one kind: TF-IDF + LR accuracy (percent) on real test
    documents, trained on its documents and on their own seeds, and where."""

    documents: float
    seeds: float
    where: str


@dataclass(frozen=True)
class ExampleKind:
    """One kind of document in the library: its name, the words of a doc type that select it, its examples' file
    (in ``tasks/demo_data/``, the ``--few-shot`` format), and the embedded model's measurement on it, if any."""

    name: str
    words: frozenset[str]
    file: str
    embedded: EmbeddedMeasure | None = None


def _library_folder() -> str:
    return str(resources.files("privseed.tasks") / "demo_data")


@functools.cache
def example_library() -> tuple[ExampleKind, ...]:
    """The library's kinds in the order of its index."""
    index = tomllib.loads((resources.files("privseed.tasks") / "demo_data" / LIBRARY_INDEX).read_text("utf-8"))
    return tuple(ExampleKind(name, frozenset(entry["words"]), entry["file"],
                             EmbeddedMeasure(**entry["embedded"]) if "embedded" in entry else None)
                 for name, entry in index.items())


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


def envelope_warning(backend_kind: str, model: str | None, doc_type: str) -> str | None:
    """One line for the owner before generation starts when the embedded model (SmolLM2-135M) is asked for a kind
    of document where it was measured to trail its own seeds by more than ``ENVELOPE_MARGIN`` points, or that was
    never measured; None for other backends and for kinds inside the measured envelope. Public: it depends on the
    configuration and the library's published figures only."""
    if backend_kind not in ("local", "local-server") or (model or EMBEDDED_MODEL) != EMBEDDED_MODEL:
        return None
    name = example_kind_for(doc_type)
    kind = next((k for k in example_library() if k.name == name), None)
    if kind is None or kind.embedded is None:
        what = f"a {name.replace('_', ' ')}" if name else f"--doc-type {doc_type!r}"
        return (f"the embedded model (SmolLM2-135M) was never measured writing {what}: compare the report's "
                f"documents with its 'seeds alone' line, and for better documents use {STRONGER_BACKENDS}")
    measured = kind.embedded
    if measured.seeds - measured.documents <= ENVELOPE_MARGIN:
        return None
    return (f"the embedded model (SmolLM2-135M) writes {kind.name.replace('_', ' ')}s poorly: its documents scored "
            f"{measured.documents:g} % against {measured.seeds:g} % for their own seeds ({measured.where}); for better "
            f"documents use {STRONGER_BACKENDS}")
