"""The public settings of a generation (``GenerationParams``) and the document predicate's rules they imply
(``document_rules``). Every caller -- DP-KPS, the only-LLM baseline, benchmarks -- builds its generation from one
of these; the decoding defaults are the command line's (``defaults.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from privseed.tasks.errors import ConfigError
from privseed.tasks.generation.defaults import (NO_REPEAT_NGRAM_DEFAULT, REPEAT_PENALTY_DEFAULT, STEER_DEFAULT,
                                                STEER_END_COVERAGE_DEFAULT)
from privseed.tasks.llm.released import PublicClassNames, RecipientExample
from privseed.tasks.llm.steering import SCHEDULES
from privseed.tasks.quality import DocumentRules


@dataclass(frozen=True)
class GenerationParams:
    """Public generation settings. ``template`` is a packaged template name or a YAML path."""

    doc_type: str = "document"
    template: str = "generic"
    max_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 1.0
    best_of: int = 1
    few_shot: tuple[RecipientExample, ...] = field(default=())
    # Rounds of regeneration for seeds none of whose candidates is a document: each round asks for one more
    # candidate (a new call seed) for those seeds only. 8, not 3: SmolLM2-135M's DBPedia-14 per-class-20 release
    # keeps 222 rows of 280 instead of 157 (TF-IDF 58.5 % instead of 50.9 %) for 57 % more calls
    # (docs/generation.md); a model that writes documents rarely needs a round at all.
    max_regenerations: int = 8
    # Rounds of one more candidate for a seed whose documents all score 1 or more (``rewrite_score``: a content word
    # six times in 40 words, a type-token ratio of 0.55 or less, a seed glossed as a label); the lowest is kept. 2:
    # without a repeat penalty about one SmolLM2 demo document in seven was repetitive; at the CLI's default
    # penalty (1.15) the demo's first answers rarely are, so the rounds cost almost nothing there
    # (experiments/results/generation.md).
    max_rewrites: int = 2
    # A document that reads as another class than its seed's (tasks/generation/class_fit.py: the naive Bayes of the
    # generation's released seeds) is worth a rewrite too, and documents that fit their class are kept first.
    # SmolLM2 writes a restaurant for about one Yelp seed in four of the other categories (issue 48).
    rewrite_off_class: bool = True
    # Local decoding takes down the words that read as another class than the seed's (tasks/generation/class_fit.py
    # ``SeedClasses.foreign_words``; needs ``rewrite_off_class``'s seed classes; issue 48).
    avoid_other_classes: bool = True
    # Local in-process decoding pushes the words that read as the seed's own class (``SeedClasses.own_words``), so
    # the words a small model adds to its seed's say its class too (issue 48).
    prefer_own_class: bool = True
    # Local llama.cpp decoding (tasks/llm/steering.py): seed-steering strength (0: off), llama.cpp's repeat
    # penalty (1: off) and a token no-repeat n-gram size (0: off). Remote backends ignore them.
    # Their defaults are the command line's (defaults.py), so every caller -- the only-LLM baseline too -- decodes
    # as DP-KPS does unless it says otherwise.
    steer: float = STEER_DEFAULT
    steer_schedule: str = "budget"  # tasks/llm/steering.py SCHEDULES
    # The "budget" schedule holds the end of the answer until this share of the seed terms is written (1: all).
    steer_end_coverage: float = STEER_END_COVERAGE_DEFAULT
    repeat_penalty: float = REPEAT_PENALTY_DEFAULT
    no_repeat_ngram: int = NO_REPEAT_NGRAM_DEFAULT
    # The corpus's declared language for the document predicate (None: no language test).
    language: str | None = "en"
    # The owner's public class names (--class-names): when set, each prompt names its seed's class.
    class_names: PublicClassNames | None = None
    # Thresholds of the document predicate set by name (--document-rule), as sorted (name, value) pairs.
    document_rules: tuple[tuple[str, Any], ...] = ()
    # The public words a document of the kind may open with (the example library's ``openings`` for --doc-type);
    # each candidate of a backend that continues a given opening starts with one (rounds.opening_for).
    openings: tuple[str, ...] = ()
    # Whether each candidate of such a backend opens with its subject instead: a word of its seed that reads as its
    # class (the example library's ``subject_openings``, the news kind; rounds.subject_opening).
    subject_openings: bool = False

    def __post_init__(self) -> None:
        if self.max_regenerations < 0:
            raise ConfigError(f"max_regenerations must be >= 0, got {self.max_regenerations}")
        if self.max_rewrites < 0:
            raise ConfigError(f"max_rewrites must be >= 0, got {self.max_rewrites}")
        if self.steer < 0:
            raise ConfigError(f"steer must be >= 0 (0 turns seed steering off), got {self.steer}")
        if self.steer_schedule not in SCHEDULES:
            raise ConfigError(f"steer_schedule must be one of {', '.join(SCHEDULES)}, got {self.steer_schedule!r}")
        if not 0.0 <= self.steer_end_coverage <= 1.0:
            raise ConfigError(f"steer_end_coverage must be in [0, 1], got {self.steer_end_coverage}")
        if self.repeat_penalty <= 0:
            raise ConfigError(f"repeat_penalty must be > 0 (1 turns it off), got {self.repeat_penalty}")
        if self.no_repeat_ngram < 0:
            raise ConfigError(f"no_repeat_ngram must be >= 0 (0 turns it off), got {self.no_repeat_ngram}")
        if self.best_of < 1:
            raise ConfigError(f"best_of must be >= 1, got {self.best_of}")
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")
        document_rules(self)  # an unknown rule or a bad value fails here, not on the first candidate


def document_rules(params: GenerationParams) -> DocumentRules:
    """The document predicate's rules for this generation: the declared language, the prompt's few-shot
    documents, which a candidate must not copy, the public class names the prompts name, which a candidate must
    not open with as its subject, and the thresholds the owner set (``--document-rule``). (The
    release gate builds the same from the config, without the
    examples: rows that copied one were already regenerated or dropped here.)"""
    names = params.class_names.names if params.class_names is not None else ()
    return DocumentRules(language=params.language, examples=tuple(e.document for e in params.few_shot),
                         class_names=names).with_settings(dict(params.document_rules))
