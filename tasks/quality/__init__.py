"""Quality: is an LLM answer a document, and may a candidate corpus be released?

- ``predicate``: ``document_rejection`` / ``is_document``, THE predicate, with named reasons and ``DocumentRules``.
- ``text_stats``: the measured statistics it compares with thresholds (Gopher quality and repetition filters).
- ``language``: language identification (py3langid).
- ``patterns`` and ``patterns.json``: the regular expressions that remain (chat-template residue, meta-talk, a
  preamble naming the kind of document, links and tags, the chat frame) and the cleaning's.
- ``cleaning``: what generation strips from an answer before the predicate judges it (``clean_text``).
- ``shapes``: seed-shaped failures (the seed list echoed, a glossary of the seeds, a few-shot example copied).
- ``gate``: the Great Expectations release gate (``ReleaseGate``) over a candidate corpus.
"""

from typing import TYPE_CHECKING, Any

from privseed.tasks.quality.language import LANGUAGES, language_probability
from privseed.tasks.quality.patterns import (META_TALK_PATTERNS, TEMPLATE_RESIDUE_PATTERNS, document_preamble,
                                             meta_talk, template_residue)
from privseed.tasks.quality.predicate import (DEFAULT_RULES, REJECTION_REASONS, TUNABLE_RULES, DocumentRules,
                                              document_rejection, is_document, misused_seed_terms, repetition_score,
                                              rewrite_score, rules_from_bounds, statistic_over_threshold)
from privseed.tasks.quality.shapes import ends_a_sentence, example_names, is_keyphrase_passthrough
from privseed.tasks.quality.text_stats import TextStats, text_stats

if TYPE_CHECKING:
    from privseed.tasks.quality.gate import (DEFAULT_BOUNDS, REQUIRED_COLUMNS, PartCheck, ReleaseGate,
                                             build_expectations, derive_quality_columns, document_gate,
                                             release_gate, validate_release, validate_release_task)

#: The gate's names, imported on first use: the gate brings Great Expectations and Prefect, and the text measures
#: of this package (``metrics``, ``predicate``) are imported by the command line and the prompt layer, which must
#: start without them.
GATE_NAMES = frozenset({"DEFAULT_BOUNDS", "REQUIRED_COLUMNS", "PartCheck", "ReleaseGate", "build_expectations",
                        "derive_quality_columns", "document_gate", "release_gate", "validate_release",
                        "validate_release_task"})


def __getattr__(name: str) -> Any:
    if name in GATE_NAMES:
        from privseed.tasks.quality import gate  # deferred for start-up time (above)

        return getattr(gate, name)
    raise AttributeError(f"module 'privseed.tasks.quality' has no attribute {name!r}")


__all__ = [
    "DEFAULT_BOUNDS", "DEFAULT_RULES", "LANGUAGES", "META_TALK_PATTERNS", "REJECTION_REASONS", "REQUIRED_COLUMNS",
    "TEMPLATE_RESIDUE_PATTERNS", "TUNABLE_RULES", "DocumentRules", "PartCheck", "ReleaseGate", "TextStats",
    "build_expectations", "derive_quality_columns", "document_preamble", "document_rejection", "ends_a_sentence",
    "example_names",
    "document_gate", "is_document", "is_keyphrase_passthrough", "language_probability", "meta_talk",
    "misused_seed_terms", "release_gate", "repetition_score", "rewrite_score", "rules_from_bounds",
    "statistic_over_threshold", "template_residue", "text_stats", "validate_release", "validate_release_task",
]
