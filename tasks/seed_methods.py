"""The seed methods of ``privseed dpkps --method``: one registry, from which the configuration (its choices), the
samplers, the histogram path, the experiment grid, its table and the report take their lists.

A seed method turns the private corpus into DP keyphrase sequences (the seeds the LLM writes from). Two families
share the pipeline up to pass 1:

- ``dpkps``: the paper's DP-KPS samplers (DP vocabulary, DP-KDE sketches, then a sampler over the released
  vocabulary; docs/dpkps.md). ``sketch_blocks`` is the ensemble of prefix lengths the sampler scores with.
- ``histogram``: privseed's own comparator, per-class DP term histograms (tasks/histogram_seeds.py), with or
  without a second stage of co-occurrence pairs that orders the terms.

Adding a method is one entry here plus its math in the module its family names; nothing else spells its name.
This module imports nothing heavy: the command line builds its choices from it before any stage is imported.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal


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


def _iterative_log_blocks(length: int) -> list[int]:
    return [min(2**k, length) for k in range(math.ceil(math.log2(length)) + 1)]


SEED_METHODS: dict[str, SeedMethod] = {method.name: method for method in (
    SeedMethod("independent", "dpkps", "the paper's independent sampler: each keyphrase drawn from one DP-KDE",
               default_selection="power-2", color="#d62728", paper_sampler="independent",
               sketch_blocks=lambda length: [1]),
    SeedMethod("iterative-linear", "dpkps", "the paper's iterative sampler, one sketch per prefix length",
               default_selection="top-5", color="#9467bd", paper_sampler="iterative",
               sketch_blocks=lambda length: list(range(1, length + 1))),
    SeedMethod("iterative-log", "dpkps", "the paper's iterative sampler, sketches at prefix lengths 1, 2, 4, ...",
               default_selection="top-5", color="#1f77b4", paper_sampler="iterative",
               sketch_blocks=_iterative_log_blocks),
    SeedMethod("histogram", "histogram", "privseed's per-class DP term histograms (one stage)",
               default_selection="power-1", color="#e377c2"),
    SeedMethod("histogram-markov", "histogram", "per-class DP term histograms, ordered by DP co-occurrence pairs",
               default_selection="power-1", color="#7f7f7f", ordered_pairs=True),
)}

#: Every --method, in the order --help lists them.
SEED_METHOD_NAMES: tuple[str, ...] = tuple(SEED_METHODS)
#: The paper's DP-KPS samplers (DP vocabulary + DP-KDE sketches).
DPKPS_SAMPLERS: tuple[str, ...] = tuple(n for n, m in SEED_METHODS.items() if m.family == "dpkps")
#: privseed's per-class DP term histograms.
HISTOGRAM_METHODS: tuple[str, ...] = tuple(n for n, m in SEED_METHODS.items() if m.family == "histogram")
