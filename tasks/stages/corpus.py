"""Stages that read the private corpus and check it against the declared configuration."""

from __future__ import annotations

from typing import Any

import pandas as pd

from tasks.config import LABELS_HELP, ReleaseConfig
from tasks.corpus import list_shards, read_shard
from tasks.errors import ConfigError, CorpusError
from tasks.stages import private_stage, stage_logger


@private_stage("load-private-corpus")
def load_private_corpus(cfg: ReleaseConfig) -> pd.DataFrame:
    """All shards of the private corpus, read in parallel on the cluster."""
    from tasks.cluster import map_shards

    shards = list_shards(cfg.data, cfg.storage_options)
    frames = map_shards(read_shard, shards, cfg.text_column, cfg.label_column, cfg.storage_options)
    corpus = pd.concat(frames, ignore_index=True)
    if corpus.empty:
        raise CorpusError(f"the corpus at {cfg.data!r} is empty (no rows in {len(shards)} shard(s))")
    stage_logger().info("loaded the private corpus from %d shard(s)", len(shards))
    return corpus


def resolve_labels(cfg: ReleaseConfig, corpus: pd.DataFrame) -> list:
    """The declared label set, in the type of the label column (int or str). Declared labels are the only
    classes: a declared class with no documents is sampled from its noisy sketch like any other (no error, no
    special path, so emptiness is never revealed), and a row whose label is not declared stops the run before
    anything is drawn. That error is for the operator and names neither the labels nor how many rows carry
    them; it is never written to a release."""
    if cfg.labels is None:
        raise ConfigError("no label set declared; " + LABELS_HELP)
    integer = pd.api.types.is_integer_dtype(corpus["label"].dtype)
    declared = [as_label_type(label, integer, cfg.label_column) for label in cfg.labels]
    undeclared = ~corpus["label"].astype(str).isin({str(label) for label in declared})
    if undeclared.any():
        raise ConfigError(
            f"the corpus has rows whose label (column {cfg.label_column!r}) is not in the declared label set; "
            "privseed never turns an undeclared label into a class. Declare every label the corpus may carry "
            "(--labels / --labels-file / `labels` in the config file), drop those rows from the input, or check "
            "--label-column. (Which labels and how many rows are deliberately not shown.)")
    return declared


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
