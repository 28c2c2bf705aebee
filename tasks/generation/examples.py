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
from dataclasses import dataclass, field
from importlib import resources
from typing import Mapping

from privseed.tasks.errors import ConfigError
from privseed.tasks.llm.released import RecipientExample, load_few_shot

LIBRARY_INDEX = "example_library.toml"
#: The embedded model's documents may trail their own seeds by this many points before a run is told it works
#: outside the envelope measured for its kind (issue 48's bar).
ENVELOPE_MARGIN = 3.0
#: The embedded model's name in the library's ``measured`` tables: ``--llm local`` and ``local-server`` without a
#: model name, or naming it.
EMBEDDED_MODEL = "smollm2"
#: The models' names as the owner reads them in a warning.
MODEL_TITLES = {EMBEDDED_MODEL: "the embedded model (SmolLM2-135M)",
                "qwen2.5-coder-0.5b": "the opt-in Qwen2.5-Coder-0.5B"}


@dataclass(frozen=True)
class StrongerBackend:
    """A backend a run outside its model's envelope can go to: the ``--llm`` it takes, and the library's name of
    its local model (None for a remote one, which the library never measured)."""

    how: str
    model: str | None = None


#: Where a run that its local model cannot serve well can go (docs/generation.md), in the order suggested.
STRONGER_BACKENDS = (StrongerBackend("--llm local:qwen2.5-coder-0.5b (make setup-models)", "qwen2.5-coder-0.5b"),
                     StrongerBackend("vllm:URL for a served model"),
                     StrongerBackend("anthropic:MODEL"))
#: what the manifest's ``prompt_examples`` says when the owner's --few-shot file gave the examples
OWNER_EXAMPLES = "owner --few-shot"


@dataclass(frozen=True)
class ModelMeasure:
    """What a local model measured on a public corpus of one kind: TF-IDF + LR accuracy (percent) on real test
    documents, trained on its documents and on their own seeds, and where."""

    documents: float
    seeds: float
    where: str

    @property
    def inside_envelope(self) -> bool:
        """Whether the documents trailed their seeds by no more than ``ENVELOPE_MARGIN`` points (to a hundredth: the
        library's figures have one decimal)."""
        return round(self.seeds - self.documents, 2) <= ENVELOPE_MARGIN


@dataclass(frozen=True)
class ExampleKind:
    """One kind of document in the library: its name, the words of a doc type that select it, its examples' file
    (in ``tasks/demo_data/``, the ``--few-shot`` format), and the local models' measurements on it, by model."""

    name: str
    words: frozenset[str]
    file: str
    measured: Mapping[str, ModelMeasure] = field(default_factory=dict)
    #: The first words a document of the kind may open with, each as likely as its repeats make it, written for
    #: privseed like the examples; a model that can continue an answer starts from one of them
    #: (``privseed.tasks.generation.rounds.opening_for``). Empty: the model opens as it likes.
    openings: tuple[str, ...] = ()
    #: Whether a document of the kind opens with its subject: a word of its seed that reads as its class
    #: (``privseed.tasks.generation.rounds.subject_opening``), for a kind whose documents open with who or what they
    #: are about (a news story: "Oil prices ...", "Microsoft ..."), where no list of first words would fit every class.
    subject_openings: bool = False

    def __post_init__(self) -> None:
        if self.openings and self.subject_openings:
            raise ConfigError(f"example library kind {self.name!r}: give openings or subject_openings, not both")
        bad = [o for o in self.openings if not o or o != o.strip()]
        if bad:
            raise ConfigError(f"example library kind {self.name!r}: an opening must be words without leading or "
                              f"trailing spaces, got {bad!r}")

    @property
    def embedded(self) -> ModelMeasure | None:
        """The embedded model's measurement (None: never measured)."""
        return self.measured.get(EMBEDDED_MODEL)


def _library_folder() -> str:
    return str(resources.files("privseed.tasks") / "demo_data")


@functools.cache
def example_library() -> tuple[ExampleKind, ...]:
    """The library's kinds in the order of its index."""
    index = tomllib.loads((resources.files("privseed.tasks") / "demo_data" / LIBRARY_INDEX).read_text("utf-8"))
    return tuple(ExampleKind(name, frozenset(entry["words"]), entry["file"],
                             {model: ModelMeasure(**m) for model, m in entry.get("measured", {}).items()},
                             tuple(entry.get("openings", ())), bool(entry.get("subject_openings", False)))
                 for name, entry in index.items())


def doc_type_words(doc_type: str) -> list[frozenset[str]]:
    """The words of a doc type, lower case, each as written and, where it may be a plural, without its final s
    ("Usenet posts" -> {usenet}, {posts, post}; "news" -> {news, new}: a kind's word matches either form)."""
    words = re.findall(r"[a-z]+", doc_type.lower())
    return [frozenset({w, w[:-1]}) if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else frozenset({w})
            for w in words]


def example_kind_for(doc_type: str, library: tuple[ExampleKind, ...] | None = None) -> str | None:
    """The library kind a doc type names: the kind that matches the most of its words, a tie to the kind whose
    word comes first in the doc type; None when no word matches (``"document"``)."""
    words = doc_type_words(doc_type)
    best: tuple[int, int] | None = None
    chosen = None
    for kind in library if library is not None else example_library():
        positions = [i for i, forms in enumerate(words) if forms & kind.words]
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


def opening_kind(few_shot: str | None, examples: str, prefill: bool, doc_type: str) -> ExampleKind | None:
    """The library kind whose openings a generation's answers start from (public: configuration only): the kind the
    prompts show when the backend continues a given opening (``BackendKind.prefill``); None with the owner's
    ``--few-shot`` (their examples show how their kind opens), with ``--examples none``, or when the doc type names
    no kind."""
    if few_shot or examples != "library" or not prefill:
        return None
    name = example_kind_for(doc_type)
    return next((k for k in example_library() if k.name == name), None)


def answer_openings(few_shot: str | None, examples: str, prefill: bool, doc_type: str) -> tuple[str, ...]:
    """The openings a generation's answers start from, as the manifest records them: the ``openings`` of
    ``opening_kind``, none without one."""
    kind = opening_kind(few_shot, examples, prefill, doc_type)
    return kind.openings if kind is not None else ()


def answers_open_with_subject(few_shot: str | None, examples: str, prefill: bool, doc_type: str) -> bool:
    """Whether a generation's answers open with their subject (``ExampleKind.subject_openings`` of
    ``opening_kind``), as the manifest records it."""
    kind = opening_kind(few_shot, examples, prefill, doc_type)
    return kind is not None and kind.subject_openings


def prompt_examples(few_shot: str | None, examples: str, shows_examples: bool, doc_type: str) -> str | None:
    """Which examples the prompts show, as the manifest records it (public: it depends on configuration only):
    ``OWNER_EXAMPLES`` when the owner gave ``--few-shot`` (it always wins), the library kind when the library is on
    (``examples == "library"``) and the backend's kind shows it (``BackendKind.shows_examples``), else None."""
    if few_shot:
        return OWNER_EXAMPLES
    if examples != "library" or not shows_examples:
        return None
    return example_kind_for(doc_type)


def envelope_warning(backend_kind: str, model: str | None, doc_type: str) -> str | None:
    """One line for the owner before generation starts when a local model is asked for a kind of document where it
    was measured to trail its own seeds by more than ``ENVELOPE_MARGIN`` points, or the embedded model (SmolLM2-135M)
    for a kind it was never measured on; None for remote backends, for kinds inside the measured envelope and for
    other local models never measured on the kind. The backends it suggests leave out the model itself and a local
    model measured outside the envelope for the kind (named, with its figure). Public: it depends on the
    configuration and the library's published figures only."""
    if backend_kind not in ("local", "local-server"):
        return None
    name = model or EMBEDDED_MODEL
    kind_name = example_kind_for(doc_type)
    kind = next((k for k in example_library() if k.name == kind_name), None)
    measures: Mapping[str, ModelMeasure] = kind.measured if kind is not None else {}
    measured = measures.get(name)
    if measured is None and name != EMBEDDED_MODEL:
        return None
    stronger, worse = [], []
    for backend in STRONGER_BACKENDS:
        if backend.model == name:
            continue
        theirs = measures.get(backend.model) if backend.model is not None else None
        if backend.model is None or theirs is None or theirs.inside_envelope:
            stronger.append(backend.how)
        else:
            worse.append(f" ({MODEL_TITLES[backend.model]} measured {theirs.documents:.1f} % against "
                         f"{theirs.seeds:.1f} % here)")
    listed = ", ".join(stronger[:-1]) + " or " + stronger[-1] if len(stronger) > 1 else stronger[0]
    advice = "for better documents use " + listed + "".join(worse)
    title = MODEL_TITLES.get(name, name)
    kind_words = (kind_name or "").replace("_", " ")
    if measured is None:
        what = (f"{'an' if kind_words[:1] in 'aeiou' else 'a'} {kind_words}" if kind_name
                else f"--doc-type {doc_type!r}")
        return f"{title} was never measured writing {what}: compare the report's documents with its 'seeds alone' " \
               f"line, and {advice}"
    if measured.inside_envelope:
        return None
    return (f"{title} writes {kind_words}s poorly: its documents scored {measured.documents:.1f} % "
            f"against {measured.seeds:.1f} % for their own seeds ({measured.where}); {advice}")
