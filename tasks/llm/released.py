"""Types for the only values a prompt may carry.

Privacy boundary (docs/privacy.md, "Threat model"): the LLM never sees private text. A prompt is built from
(a) keyphrase sequences whose every term belongs to the released, privatized vocabulary V~ and which were
sampled from released DP-KDE sketches (post-processing of an (eps_voc + eps_kde)-DP release, so no further
privacy cost), (b) few-shot examples the data recipient supplies (public by declaration), and (c) public
configuration (the document type). The prompt builder (tasks/llm/prompting.py) accepts only the types below.

``ReleasedSeed`` cannot be constructed directly: the constructor checks a module-private mint token, and the
only minting path is ``ReleasedVocabulary.seed``, which refuses any term that is not in V~. A private phrase
that did not survive the DP vocabulary release therefore cannot reach a prompt by construction; the canary
test in tests/test_llm_privacy.py checks this end to end.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from privseed.tasks.errors import ConfigError, PrivseedError

_MINT = object()


class UnreleasedValueError(PrivseedError):
    """A value that is not part of a release was about to be put into a prompt."""


@dataclass(frozen=True)
class ReleasedSeed:
    """One prompt seed: terms of V~ in sampled order, the public label of the class whose DP-KDE produced it,
    and the public call seed (derived from the run seed, never from data)."""

    keyphrases: tuple[str, ...]
    label: Any
    seed: int
    _mint: object = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._mint is not _MINT:
            raise UnreleasedValueError(
                "ReleasedSeed is made only from a released vocabulary: use ReleasedVocabulary.seed(...)")

    def without(self, terms: Iterable[str]) -> ReleasedSeed:
        """This seed with every occurrence of ``terms`` left out, the rest in their order (a subsequence of a
        released seed is released: post-processing, no privacy cost). Keeps at least one term."""
        dropped = set(terms)
        kept = tuple(t for t in self.keyphrases if t not in dropped)
        if not kept:
            raise ConfigError("a seed needs at least one keyphrase: cannot leave out all of its terms")
        return ReleasedSeed(kept, self.label, self.seed, _mint=_MINT)

    def __reduce__(self):
        # Crossing a process boundary (Dask workers) re-mints through the module's own constructor path;
        # the value was released when it was first minted.
        return (_remint, (self.keyphrases, self.label, self.seed))


def _remint(keyphrases: tuple[str, ...], label: Any, seed: int) -> ReleasedSeed:
    return ReleasedSeed(tuple(keyphrases), label, int(seed), _mint=_MINT)


class ReleasedVocabulary:
    """The privatized vocabulary V~ (public once released). ``source`` names the ledger entry it came from."""

    def __init__(self, terms: Sequence[str], source: str):
        self.terms: tuple[str, ...] = tuple(str(t) for t in terms)
        self.source = source
        self._index = {t: i for i, t in enumerate(self.terms)}

    def __len__(self) -> int:
        return len(self.terms)

    def __contains__(self, term: object) -> bool:
        return term in self._index

    def seed(self, keyphrases: Iterable[str | int], label: Any, seed: int) -> ReleasedSeed:
        """Mint a seed from terms of V~ (strings) or indices into V~ (ints). Refuses anything else."""
        terms: list[str] = []
        for k in keyphrases:
            if isinstance(k, (int,)) or (hasattr(k, "__index__") and not isinstance(k, str)):
                i = int(k)
                if not 0 <= i < len(self.terms):
                    raise UnreleasedValueError(f"seed term index {i} is outside the released vocabulary "
                                               f"({len(self.terms)} terms, {self.source})")
                terms.append(self.terms[i])
            else:
                if k not in self._index:
                    # The message must not echo the term: it may be private text.
                    raise UnreleasedValueError(
                        f"a seed term is not in the released vocabulary {self.source}; only released terms "
                        "may enter a prompt")
                terms.append(str(k))
        if not terms:
            raise ConfigError("a seed needs at least one keyphrase")
        return ReleasedSeed(tuple(terms), label, int(seed), _mint=_MINT)

    def seeds(self, sequences: Sequence[Iterable[str | int]], labels: Sequence[Any],
              seeds: Sequence[int]) -> list[ReleasedSeed]:
        if not (len(sequences) == len(labels) == len(seeds)):
            raise ConfigError("sequences, labels and seeds must have the same length")
        return [self.seed(s, lab, sd) for s, lab, sd in zip(sequences, labels, seeds)]


@dataclass(frozen=True)
class RecipientExample:
    """A few-shot example supplied by the data recipient (Appendix C.2.5): a document and its keyphrases, and
    optionally the public topic it was written on. Public by declaration: it comes from the recipient (or the
    example library), never from the private corpus. With ``--class-names`` the seed's prompt names its class, and
    an example with a topic is shown the same way (its turn names its topic), so a small model sees a named topic
    answered by a document that does not write the name out as its subject."""

    document: str
    keyphrases: tuple[str, ...]
    topic: str | None = None

    def __post_init__(self) -> None:
        if not self.document.strip():
            raise ConfigError("a few-shot example has an empty document")
        if not self.keyphrases:
            raise ConfigError("a few-shot example needs its keyphrases")
        if self.topic is not None and not self.topic.strip():
            raise ConfigError("a few-shot example's topic is empty: give a public topic or leave the field out")


def load_few_shot(path: str, storage_options: dict | None = None) -> list[RecipientExample]:
    """Read recipient few-shot examples: JSON list, JSONL or Parquet with columns ``text`` (or ``document``)
    and ``keyphrases`` (a list of strings, or one comma-separated string), and optionally ``topic`` (the public
    topic the example was written on, shown when the prompts name the seeds' classes)."""
    from privseed.tasks import storage
    from privseed.tasks.data.corpus import read_columns
    from privseed.tasks.errors import CorpusError

    try:
        if path.endswith(".parquet"):
            records = read_columns(path, None, storage_options).to_dict("records")
        else:
            raw = storage.read_bytes(path, storage_options).decode("utf-8")  # the run's options, with retries
            stripped = raw.lstrip()
            if stripped.startswith("["):
                records = json.loads(raw)
            else:
                records = [json.loads(line) for line in raw.splitlines() if line.strip()]
    except FileNotFoundError as e:
        raise ConfigError(f"few-shot file not found: {path}") from e
    except CorpusError as e:
        raise ConfigError(f"few-shot file {path}: {e}") from e
    except (ValueError, OSError) as e:
        raise ConfigError(f"few-shot file {path} is not JSON, JSONL or Parquet: {type(e).__name__}") from e
    examples = []
    for i, r in enumerate(records):
        doc = r.get("text", r.get("document"))
        kps = r.get("keyphrases")
        if doc is None or kps is None:
            raise ConfigError(f"few-shot file {path}: record {i} needs 'text' (or 'document') and 'keyphrases'")
        if isinstance(kps, str):
            kps = [k.strip() for k in kps.split(",") if k.strip()]
        topic = r.get("topic")
        examples.append(RecipientExample(str(doc), tuple(str(k) for k in kps),
                                         None if topic is None else str(topic)))
    return examples


@dataclass(frozen=True)
class PublicClassNames:
    """The data owner's public name for each class (label -> name), read from a configuration file.

    The paper keeps class topics out of prompts because in its setting they are private; many owners' class
    names are public (a hospital's departments). When the owner declares them, a prompt may name the class of
    its seed. They come from configuration only (``load_class_names``), never from the data, and the file's
    labels must be exactly the declared label set."""

    names: tuple[tuple[str, str], ...]  # (str(label), name), in the file's order
    source: str

    def __post_init__(self) -> None:
        if not self.names:
            raise ConfigError(f"class-names file {self.source} names no class")
        labels = [label for label, _ in self.names]
        if len(set(labels)) != len(labels):
            dup = sorted({label for label in labels if labels.count(label) > 1})
            raise ConfigError(f"class-names file {self.source} names label(s) {', '.join(dup)} more than once")
        for label, name in self.names:
            if not name.strip() or len(name) > 200 or "\n" in name:
                raise ConfigError(f"class-names file {self.source}: the name of label {label} must be one "
                                  "non-empty line of at most 200 characters")

    @property
    def labels(self) -> list[str]:
        return [label for label, _ in self.names]

    def name_of(self, label: Any) -> str:
        for key, name in self.names:
            if key == str(label):
                return name
        raise ConfigError(f"class-names file {self.source} has no name for label {label}")

    def to_dict(self) -> dict[str, str]:
        return dict(self.names)

    def check_labels(self, declared: Sequence[Any]) -> None:
        """Refuse unless the file names exactly the declared (public) labels."""
        have, want = set(self.labels), {str(label) for label in declared}
        if have != want:
            extra, missing = sorted(have - want), sorted(want - have)
            parts = ([f"labels that are not declared: {', '.join(extra)}"] if extra else []) + \
                    ([f"no name for declared labels: {', '.join(missing)}"] if missing else [])
            raise ConfigError(f"class-names file {self.source} must name exactly the declared labels; it has "
                              + "; ".join(parts))


def load_class_names(path: str, storage_options: dict | None = None) -> PublicClassNames:
    """Read label -> public class name from JSON (an object), TOML (a table, top level or ``[class_names]``)
    or CSV (columns ``label`` and ``name``). Labels are compared as strings (``3`` and ``"3"`` are one label)."""
    import csv
    import io
    import tomllib

    from privseed.tasks import storage

    try:
        raw = storage.read_bytes(path, storage_options).decode("utf-8")
    except FileNotFoundError as e:
        raise ConfigError(f"class-names file not found: {path}") from e
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read class-names file {path}: {type(e).__name__}") from e
    suffix = Path(path.split("?")[0]).suffix.lower()
    try:
        if suffix == ".json":
            mapping = json.loads(raw)
        elif suffix == ".toml":
            mapping = tomllib.loads(raw)
            mapping = mapping.get("class_names", mapping)
        elif suffix == ".csv":
            rows = list(csv.DictReader(io.StringIO(raw)))
            if rows and not {"label", "name"} <= set(rows[0]):
                raise ConfigError(f"class-names file {path} needs the columns 'label' and 'name'")
            if len({r["label"] for r in rows}) != len(rows):
                raise ConfigError(f"class-names file {path} names a label more than once")
            mapping = {r["label"]: r["name"] for r in rows}
        else:
            raise ConfigError(f"class-names file {path} must be .json, .toml or .csv")
    except (json.JSONDecodeError, tomllib.TOMLDecodeError, csv.Error) as e:
        raise ConfigError(f"class-names file {path} is not valid {suffix[1:].upper()}: {type(e).__name__}") from e
    if not isinstance(mapping, dict) or not all(isinstance(v, str) for v in mapping.values()):
        raise ConfigError(f"class-names file {path} must map each label to a name (a string)")
    return PublicClassNames(tuple((str(k).strip(), v.strip()) for k, v in mapping.items()), source=path)
