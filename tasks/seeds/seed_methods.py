"""The seed methods of ``privseed dpkps --method``: one registry, from which the configuration (its choices), the
samplers, the histogram path, the experiment grid, its table and the report take their lists.

A seed method turns the private corpus into DP keyphrase sequences (the seeds the LLM writes from). Two families
share the pipeline up to pass 1:

- ``dpkps``: the paper's DP-KPS samplers (DP vocabulary, DP-KDE sketches, then a sampler over the released
  vocabulary; docs/dpkps.md). ``sketch_blocks`` is the ensemble of prefix lengths the sampler scores with.
- ``histogram``: privseed's own comparator, per-class DP term histograms (tasks/seeds/histogram_seeds.py), with or
  without a second stage of co-occurrence pairs that orders the terms.

Each entry also names the options of ``privseed dpkps`` that it reads beyond those every method reads
(``options``) and how it spends the budget (``budget``): the configuration refuses an option the chosen method
does not read (tasks/config/commands.py, ``OptionScope``) instead of ignoring it.

Adding a method is one entry here plus its math in the module its family names; nothing else spells its name.
This module imports nothing heavy: the command line builds its choices from it before any stage is imported.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from privseed.tasks.errors import ConfigError


@dataclass(frozen=True)
class SeedMethod:
    """One ``--method``: what it is, where its numbers come from, and its public defaults."""

    name: str
    family: Literal["dpkps", "histogram"]
    summary: str
    #: The selection rule when --selection is not given, chosen on public data (docs/dpkps.md).
    default_selection: str
    #: The report's and the experiment figures' colour for this method.
    color: str
    #: The paper's name for the sampler in experiments/paper_numbers.csv, None for privseed's own methods.
    paper_sampler: str | None = None
    #: DP-KPS samplers: the prefix length of each sketch of the ensemble, for a sequence length L.
    sketch_blocks: Callable[[int], list[int]] | None = None
    #: Histogram methods: whether a second stage releases co-occurrence pairs that order the sampled terms.
    ordered_pairs: bool = False
    #: The options (DpKpsConfig fields) this method reads that some other method does not.
    options: frozenset[str] = frozenset()
    #: What this method spends its budget on, by flag, for the refusal of an option it does not read.
    budget: str = ""


def _iterative_log_blocks(length: int) -> list[int]:
    return [min(2**k, length) for k in range(math.ceil(math.log2(length)) + 1)]


#: The options only the paper's samplers read: the size of the DP vocabulary V~ and the DP-KDE sketches over its
#: embeddings.
SAMPLER_OPTIONS = frozenset({"vocab_size", "n_features", "bandwidth", "embedding_model"})
#: The options only the histogram methods read: their one budget, the public corpus-size bound behind its default
#: delta, how a document enters a class's histogram, how released counts become term weights, and the pool the
#: seeds are kept from.
HISTOGRAM_OPTIONS = frozenset({"epsilon", "n_upper_bound", "hist_top_k", "hist_denoise", "hist_contribution",
                               "hist_candidates", "hist_background_cap", "hist_seed_pool"})
#: The options of the histogram methods' second stage, the co-occurrence pairs that order the terms.
PAIR_OPTIONS = frozenset({"markov_pair_floor", "markov_term_share", "markov_pair_top", "markov_pair_terms",
                          "markov_pair_weight"})
SAMPLER_BUDGET = "--eps-voc (the vocabulary) and --eps-kde (the sketches)"
HISTOGRAM_BUDGET = "one budget, --epsilon (default --eps-voc + --eps-kde)"

SEED_METHODS: dict[str, SeedMethod] = {method.name: method for method in (
    SeedMethod("independent", "dpkps", "the paper's independent sampler: each keyphrase drawn from one DP-KDE",
               default_selection="power-2", color="#d62728", paper_sampler="independent",
               sketch_blocks=lambda length: [1], options=SAMPLER_OPTIONS, budget=SAMPLER_BUDGET),
    SeedMethod("iterative-linear", "dpkps", "the paper's iterative sampler, one sketch per prefix length",
               default_selection="top-5", color="#9467bd", paper_sampler="iterative",
               sketch_blocks=lambda length: list(range(1, length + 1)), options=SAMPLER_OPTIONS,
               budget=SAMPLER_BUDGET),
    SeedMethod("iterative-log", "dpkps", "the paper's iterative sampler, sketches at prefix lengths 1, 2, 4, ...",
               default_selection="top-5", color="#1f77b4", paper_sampler="iterative",
               sketch_blocks=_iterative_log_blocks, options=SAMPLER_OPTIONS, budget=SAMPLER_BUDGET),
    SeedMethod("histogram", "histogram", "privseed's per-class DP term histograms (one stage)",
               default_selection="power-1", color="#e377c2", options=HISTOGRAM_OPTIONS, budget=HISTOGRAM_BUDGET),
    SeedMethod("histogram-markov", "histogram", "per-class DP term histograms, ordered by DP co-occurrence pairs",
               default_selection="power-1", color="#7f7f7f", ordered_pairs=True,
               options=HISTOGRAM_OPTIONS | PAIR_OPTIONS, budget=HISTOGRAM_BUDGET),
)}

#: L, keyphrases per sequence, of the paper's samplers (the paper's value; the histogram methods take theirs from the
#: corpus profile unless --length is given: tasks/seeds/corpus_profile.py).
PAPER_LENGTH = 10

#: Every --method, in the order --help lists them.
SEED_METHOD_NAMES: tuple[str, ...] = tuple(SEED_METHODS)
#: The paper's DP-KPS samplers (DP vocabulary + DP-KDE sketches).
DPKPS_SAMPLERS: tuple[str, ...] = tuple(n for n, m in SEED_METHODS.items() if m.family == "dpkps")
#: privseed's per-class DP term histograms.
HISTOGRAM_METHODS: tuple[str, ...] = tuple(n for n, m in SEED_METHODS.items() if m.family == "histogram")
#: The options some methods read and others do not; every other option of ``privseed dpkps`` every method reads.
METHOD_OPTIONS: frozenset[str] = frozenset().union(*(m.options for m in SEED_METHODS.values()))


def methods_reading(option: str) -> tuple[str, ...]:
    """The methods that read ``option`` (a DpKpsConfig field), in registry order."""
    return tuple(name for name, method in SEED_METHODS.items()
                 if option not in METHOD_OPTIONS or option in method.options)


def method_options(method: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (DpKpsConfig fields shared by several methods, e.g. an experiment grid's [dpkps] table) without the
    options ``method`` does not read, which its configuration would refuse."""
    return {name: value for name, value in values.items()
            if name not in METHOD_OPTIONS or name in SEED_METHODS[method].options}


# -- how a document enters the histogram methods' stage 1 (``--hist-contribution``) ----------------------------

#: ``rank-l2``'s decay (public, chosen on validation splits: experiments/results/dpkps.md).
RANK_DECAY = 0.5
#: ``slow-rank-l2``'s decay, the corpus profile's for short documents (public; chosen on eight short validation sets,
#: nine seeds each, and checked on more: experiments/results/dpkps.md, "The shorter the documents, the slower the
#: decay").
SLOW_RANK_DECAY = 0.25
#: ``rank-rare-l2``: the R = COMMON_RANK most common words of V weigh ((rank + 1) / R)^COMMON_POWER of their rank-l2
#: weight (public; chosen on OHSUMED-23's validation split among R 500-10,000 and powers 0.5-3:
#: experiments/results/dpkps.md, "rank-rare-l2").
COMMON_RANK = 2000
COMMON_POWER = 2.0


@dataclass(frozen=True)
class Contribution:
    """How one document enters stage 1's (classes, |V|) matrix, and how far that lets it move the matrix under
    add/remove of one document. The label is part of the document: removing it removes its own class's row's
    contribution and touches no other class (a relabelling -- replace-one adjacency -- moves two rows and would
    double the L2 sensitivity to sqrt(2)).

    ``decay`` None (``first-terms``): 1 on each of its first S distinct terms -> L1 S, L2 sqrt(S); any mechanism.
    ``decay`` d >= 0: every distinct term of V it holds, however long it is, the i-th in reading order weighted
    i^-d, scaled to L2 norm exactly 1 (``class_rank_l2_weights``; d = 0 is ``unit-l2``, 1 / sqrt(n) each) -> L2 1
    and no L1 bound that does not grow with the document (sqrt(n) at d = 0), so only an L2 mechanism (Gaussian)
    can release it. ``common_rank`` R (with ``common_power`` a): before the scaling, a term at position r of V (its
    public frequency rank for the English list) is also multiplied by min(1, (r + 1) / R)^a (``rank-rare-l2``;
    ``histogram_seeds.common_word_weights``): public factors, so the norm and the sensitivity are unchanged.
    ``ledger_text`` is what the ledger says of it, ``help_text`` what ``--help`` says. The math of each kind (its
    sensitivity, the matrix it adds up) is in tasks/seeds/histogram_seeds.py: ``contribution_sensitivity``,
    ``contribution_weights``."""

    name: str
    decay: float | None
    ledger_text: str
    help_text: str
    common_rank: int | None = None
    common_power: float = 0.0

    @property
    def whole_document(self) -> bool:
        """Pass 1 reads the whole document (every distinct term), not its first S."""
        return self.decay is not None


#: How a document may enter stage 1 (``--hist-contribution``), by name.
CONTRIBUTIONS: dict[str, Contribution] = {c.name: c for c in (
    Contribution("first-terms", None, "first S distinct terms of the document",
                 "1 on each of its first S distinct terms (L1 S)"),
    Contribution("unit-l2", 0.0, "1/sqrt(n) on each of the document's n distinct terms (L2 norm 1)",
                 "1/sqrt(n) on each of its n distinct terms, the whole document at L2 sensitivity 1"),
    Contribution("rank-l2", RANK_DECAY,
                 f"the i-th of the document's n distinct terms i^-{RANK_DECAY:g}, scaled to L2 norm 1",
                 f"every distinct term too, the i-th in reading order weighted i^-{RANK_DECAY:g}, scaled to L2 norm 1"),
    Contribution("slow-rank-l2", SLOW_RANK_DECAY,
                 f"the i-th of the document's n distinct terms i^-{SLOW_RANK_DECAY:g}, scaled to L2 norm 1",
                 f"rank-l2 with a slower decay (the i-th term i^-{SLOW_RANK_DECAY:g}), the rule's kind for short "
                 "documents, whose later terms carry the class too (docs/dpkps.md)"),
    Contribution("rank-rare-l2", RANK_DECAY,
                 f"the i-th of the document's n distinct terms i^-{RANK_DECAY:g}, times min(1, (r + 1) / "
                 f"{COMMON_RANK})^{COMMON_POWER:g} for a term at public frequency rank r, scaled to L2 norm 1",
                 f"rank-l2 with the {COMMON_RANK:,} most common English words weighed less "
                 f"((rank/{COMMON_RANK})^{COMMON_POWER:g}), for corpora whose classes live in technical words (+1.2 "
                 "to +2.2 points on OHSUMED-23 and medical abstracts; general topics lose 4-6: docs/dpkps.md)",
                 common_rank=COMMON_RANK, common_power=COMMON_POWER),
)}


def contribution_kind(name: str) -> Contribution:
    """The ``Contribution`` called ``name`` (``--hist-contribution``)."""
    try:
        return CONTRIBUTIONS[name]
    except KeyError:
        raise ConfigError(f"unknown contribution {name!r}; choose one of {', '.join(CONTRIBUTIONS)}") from None
