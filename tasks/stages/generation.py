"""Stages around the LLM: the local-model check before any private data is read, the dry run's cost estimate,
and generation of the synthetic documents from released seeds (tasks/generation/documents.py does the work)."""

from __future__ import annotations

import pandas as pd

from privseed.tasks.config.commands import DpKpsConfig
from privseed.tasks.data.corpus import StagedRelease
from privseed.tasks.stages import stage_logger


def check_local_model(llm: str) -> None:
    """A local model that is missing (or an opt-in one whose parts are not installed or do not verify) stops
    the run here, before any private data is read or budget is spent; an opt-in model is assembled now, once,
    rather than by every Dask worker at its first call."""
    from privseed.tasks.llm import get_backend, kind_of, parse_llm_spec

    spec = parse_llm_spec(llm)
    if kind_of(spec).local_weights:
        get_backend(spec)  # resolves (and verifies) the weights; they are loaded only at the first call


def with_class_names(cfg: DpKpsConfig) -> tuple[DpKpsConfig, dict[str, str] | None]:
    """The owner's public class names (checked now, before any private data is read) for the prompts and the
    manifest; a class-names file with no --labels declares the label set itself."""
    from privseed.tasks.generation.documents import class_names_from_config

    class_names = class_names_from_config(cfg)
    if class_names is None:
        return cfg, None
    if cfg.labels is None:
        cfg = cfg.model_copy(update={"labels": class_names.labels})
    return cfg, class_names.to_dict()


def generate_release_documents(sequences: pd.DataFrame, cfg: DpKpsConfig, labels: list) -> tuple[StagedRelease, dict]:
    """One document per released seed (``privseed.tasks.generation.documents.generate_release``: the generation shards
    call the
    LLM through the call cache, split documents from seeds dropped after ``max_regenerations`` rounds, and
    write and gate-check the release's parts); only the parts' descriptors come back here, with the report that
    goes into quality.json."""
    from privseed.tasks.generation.documents import generate_release
    from privseed.tasks.quality import gate_from_config

    staged = generate_release(sequences, cfg, gate_from_config(cfg, labels))
    report = staged.generation_report
    stage_logger().info("generation: %d documents kept, %d seeds dropped with no document after %d regeneration "
                        "rounds (%s)", report["rows_kept"], report["rows_dropped"], cfg.max_regenerations,
                        report["dropped_by_reason"] or "none")
    return staged, report


def placeholder_sequences(cfg: DpKpsConfig) -> pd.DataFrame:
    """Seeds of the shape a run releases (per_class sequences of L one-word terms per declared class), made
    from public settings only, for the dry run's cost estimate."""
    term = "keyphrase"
    assert cfg.labels is not None  # ReleaseConfig's validator requires a declared label set
    sequences = pd.DataFrame({"label": [label for label in cfg.labels for _ in range(cfg.per_class)],
                              "keyphrases": [[term] * cfg.length for _ in range(len(cfg.labels) * cfg.per_class)]})
    sequences.attrs["released_vocabulary"] = [term]
    sequences.attrs["released_vocabulary_source"] = "dry-run placeholder"
    return sequences


def dry_run(cfg: DpKpsConfig) -> dict:
    """``dry_run``: the LLM calls a run would send and what they would cost, from public settings only (the
    declared labels, per_class, L and the generation options). The corpus is not read, no ledger is opened:
    nothing is drawn, charged or sent. Terms are placeholders, so the input-token count is an estimate."""
    from privseed.tasks.data.corpus import list_shards

    list_shards(cfg.data, cfg.storage_options)  # a wrong path fails now, not at the real run
    if cfg.llm == "none":
        description = "--llm none sends no LLM call"
        result = {"dry_run": True, "estimate": description, "calls": 0, "usd": 0.0, "tokens_in": 0,
                  "tokens_out_max": 0}
    else:
        from privseed.tasks.generation.documents import estimate_generation

        estimate = estimate_generation(placeholder_sequences(cfg), cfg)
        result = {"dry_run": True, "estimate": estimate.describe(), "calls": estimate.calls, "usd": estimate.usd,
                  "tokens_in": estimate.tokens_in, "tokens_out_max": estimate.tokens_out_max}
    stage_logger().info("dry run, nothing drawn, charged or sent: %s", result["estimate"])
    return result
