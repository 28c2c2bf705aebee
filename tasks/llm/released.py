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

from tasks.errors import ConfigError, PrivseedError

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
    """A few-shot example supplied by the data recipient (Appendix C.2.5): a document and its keyphrases.
    Public by declaration: it comes from the recipient, never from the private corpus."""

    document: str
    keyphrases: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.document.strip():
            raise ConfigError("a few-shot example has an empty document")
        if not self.keyphrases:
            raise ConfigError("a few-shot example needs its keyphrases")


def load_few_shot(path: str, storage_options: dict | None = None) -> list[RecipientExample]:
    """Read recipient few-shot examples: JSON list, JSONL or Parquet with columns ``text`` (or ``document``)
    and ``keyphrases`` (a list of strings, or one comma-separated string)."""
    import io

    import pandas as pd

    from tasks import storage

    try:
        data = storage.read_bytes(path, storage_options)  # the run's storage options, with retries
        if path.endswith(".parquet"):
            records = pd.read_parquet(io.BytesIO(data)).to_dict("records")
        else:
            raw = data.decode("utf-8")
            stripped = raw.lstrip()
            if stripped.startswith("["):
                records = json.loads(raw)
            else:
                records = [json.loads(line) for line in raw.splitlines() if line.strip()]
    except FileNotFoundError as e:
        raise ConfigError(f"few-shot file not found: {path}") from e
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
        examples.append(RecipientExample(str(doc), tuple(str(k) for k in kps)))
    return examples
