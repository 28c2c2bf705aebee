"""Stages that read the private corpus and check it against the declared configuration.

The streaming path (DP-KPS): ``plan_private_corpus`` (work units from the Parquet footers), ``declared_labels``,
then ``scan_private_corpus`` (pass 1 on the workers: label check, keyed identity, term counts, tree-reduced on
the cluster). The rows never come to the flow process; DP-KPS, Aug-PE and SecPE all start this way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privseed.tasks.config.commands import LABELS_HELP, ReleaseConfig
from privseed.tasks.errors import ConfigError
from privseed.tasks.dp.identity import DataIdentity
from privseed.tasks.seeds.passes import TermCounting, UnitReader
from privseed.tasks.stages import private_stage, stage_logger
from privseed.tasks.data.units import CorpusPlan


# -- the streaming path ---------------------------------------------------------------------------------------
@private_stage("plan-private-corpus")
def plan_private_corpus(cfg: ReleaseConfig) -> CorpusPlan:
    """The work units of the private corpus, from its Parquet footers (no row is read). A missing column, an
    unreadable shard or an empty corpus fails here, naming the shard."""
    from privseed.tasks.data.units import plan_corpus

    plan = plan_corpus(cfg.data, cfg.text_column, cfg.label_column, cfg.storage_options)
    stage_logger().info("private corpus: %d work unit(s) in %d shard(s)", len(plan.units),
                        len({u.uri for u in plan.units}))
    return plan


def declared_labels(cfg: ReleaseConfig, integer: bool | None) -> list:
    """The declared label set, in the type of the label column (``integer``: the corpus stores integers; None: the
    corpus declares no types (CSV, JSON Lines), so integers exactly when every declared label is one).
    Declared labels are the only classes: a declared class with no documents is sampled from its noisy release
    like any other (no error, no special path, so emptiness is never revealed); a row whose label is not
    declared stops the run before anything is drawn (``privseed.tasks.data.corpus.declared_positions``, on the
    workers)."""
    if cfg.labels is None:
        raise ConfigError("no label set declared; " + LABELS_HELP)
    if integer is None:
        integer = all(label.strip().lstrip("-").isdigit() for label in cfg.labels)
    return [as_label_type(label, integer, cfg.label_column) for label in cfg.labels]


@dataclass(frozen=True)
class CorpusScan:
    """What pass 1 brings back to the flow process: the corpus's keyed identity (for the ledger) and the exact
    term counts (private; |V| or classes x |V| integers), or None when no counting was asked for."""

    identity: DataIdentity
    counts: np.ndarray | None = field(default=None, repr=False)

    @property
    def term_counts(self) -> np.ndarray:
        """The term counts of a scan that was given a ``TermCounting``."""
        if self.counts is None:
            raise ValueError("this scan counted no terms: scan_private_corpus was given no TermCounting")
        return self.counts


@private_stage("scan-private-corpus", retries=0)  # a unit retries its own transient failures (tasks/data/units.py)
def scan_private_corpus(plan: CorpusPlan, labels: list, cfg: ReleaseConfig,
                        counting: TermCounting | None = None) -> CorpusScan:
    """Pass 1 over every work unit on the cluster: the label check, the keyed data identity and (``counting``)
    the term counts, combined in a tree on the cluster; the identity key is loaded from the private state here.
    A corpus in which no document contains a term of V fails before any noise is drawn."""
    from privseed.tasks.dp.identity import existing_or_new_key, store_new_key
    from privseed.tasks.seeds.passes import DeclaredLabels, ScanPart, ScanSpec, scan_unit
    from privseed.tasks.data.units import map_reduce_units

    key, stored = existing_or_new_key(cfg.state_uri, cfg.storage_options)
    while True:
        spec = ScanSpec(unit_reader(cfg), DeclaredLabels(tuple(labels), cfg.label_column), key, counting)
        part = map_reduce_units(scan_unit, plan.units, ScanPart.combine, spec, on_done=unit_progress("pass 1"))
        # A refused scan (an undeclared label) stored nothing; a new key is stored once the scan has passed. Lost
        # a race for the key to a run of the same state that started together: scan again under the stored one.
        if stored or store_new_key(cfg.state_uri, key, cfg.storage_options):
            break
        key, stored = existing_or_new_key(cfg.state_uri, cfg.storage_options)
    if counting is not None:
        from privseed.tasks.seeds.vocabulary import require_vocabulary_hits

        assert part.counts is not None  # a spec with a TermCounting counts every unit
        require_vocabulary_hits(part.counts, counting.vocab)
    return CorpusScan(part.identity.finish(key), part.counts)


def unit_reader(cfg: ReleaseConfig) -> UnitReader:
    """How the workers read a unit of this run's corpus."""
    return UnitReader(cfg.text_column, cfg.label_column, dict(cfg.storage_options))


def unit_progress(name: str) -> Callable[[int, int], None]:
    """Operator progress of a pass: units done out of units planned (about 20 lines a pass; never a row count)."""
    logger = stage_logger()

    def report(done: int, total: int) -> None:
        step = max(1, total // 20)
        if done == total or done % step == 0:
            logger.info("%s: %d of %d work unit(s) done", name, done, total)

    return report


def as_label_type(label: str, integer: bool, column: str) -> Any:
    """Labels are declared as text; an integer label column gets integer labels (the released rows then
    carry the same type as the recipient's test split)."""
    if not integer:
        return label
    try:
        return int(label)
    except ValueError:
        raise ConfigError(f"declared label {label!r} is not an integer, but the label column {column!r} holds "
                          "integers; declare the integer labels (e.g. --labels 0,1,2)") from None
