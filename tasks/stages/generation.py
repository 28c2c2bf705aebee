"""Stages around the LLM: the local-model check before any private data is read, the dry run's cost estimate,
and generation of the synthetic documents from released seeds (tasks/generation/documents.py does the work)."""

from __future__ import annotations

from typing import NamedTuple

import pandas as pd

from privseed.tasks.config.commands import DpKpsConfig
from privseed.tasks.data.corpus import StagedRelease
from privseed.tasks.stages import stage_logger


def check_local_model(llm: str, doc_type: str | None = None) -> None:
    """A local model that is missing (or an opt-in one whose parts are not installed or do not verify) stops
    the run here, before any private data is read or budget is spent; an opt-in model is assembled now, once,
    rather than by every Dask worker at its first call. The embedded model asked for a kind of document it was
    measured to write poorly, or never measured on, is said so here too (``envelope_warning``)."""
    from privseed.tasks.generation.examples import envelope_warning
    from privseed.tasks.llm import get_backend, kind_of, parse_llm_spec

    spec = parse_llm_spec(llm)
    if kind_of(spec).local_weights:
        get_backend(spec)  # resolves (and verifies) the weights; they are loaded only at the first call
    warning = envelope_warning(spec.kind, spec.model, doc_type) if doc_type is not None else None
    if warning:
        stage_logger().warning("%s", warning)


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


class PlannedSpend(NamedTuple):
    """One privatized stage of a run as its configuration plans it: name, (epsilon, delta) and what it releases."""

    stage: str
    epsilon: float
    delta: float
    releases: str


def planned_privacy_spend(cfg: DpKpsConfig) -> list[PlannedSpend]:
    """The (epsilon, delta) each stage of a ``privseed dpkps`` run will charge, from the configuration alone (pure;
    what the ledger then records): the histogram methods split --epsilon (default --eps-voc + --eps-kde) and delta
    by ``stage_budgets`` (term histograms, then histogram-markov's pairs); the paper's samplers spend eps_voc on
    the vocabulary (discrete Laplace, no delta) and eps_kde on the sketches (delta only with --mechanism gaussian).
    Each stage's classes compose in parallel and the stages add up (basic composition), so the total is the sum."""
    from privseed.tasks.seeds.histogram_seeds import stage_budgets
    from privseed.tasks.seeds.seed_methods import HISTOGRAM_METHODS

    if cfg.method in HISTOGRAM_METHODS:
        budgets = stage_budgets(cfg.method, cfg.histogram_epsilon, cfg.delta, cfg.markov_term_share)
        names = [("term histograms", f"the noisy term histogram of each class ({cfg.mechanism})"),
                 ("co-occurrence pairs", "the noisy pair counts among each class's heaviest terms")]
        return [PlannedSpend(name, epsilon, delta, what) for (name, what), (epsilon, delta) in zip(names, budgets)]
    sketch_delta = cfg.delta if cfg.mechanism == "gaussian" else 0.0
    return [PlannedSpend("vocabulary", cfg.eps_voc, 0.0, "the noisy vocabulary histogram, top N (discrete Laplace)"),
            PlannedSpend("sketches", cfg.eps_kde, sketch_delta, f"each class's DP-KDE sketches ({cfg.mechanism})")]


def describe_privacy_plan(spend: list[PlannedSpend]) -> str:
    lines = [f"  {s.stage}: epsilon={s.epsilon:g}, delta={s.delta:g} ({s.releases})" for s in spend]
    total_epsilon, total_delta = sum(s.epsilon for s in spend), sum(s.delta for s in spend)
    return "\n".join(["privacy spend per stage (from the configuration; classes in parallel, stages added):", *lines,
                      f"  total: epsilon={total_epsilon:g}, delta={total_delta:g}"])


def dry_run(cfg: DpKpsConfig, calibrate: bool = True) -> dict:
    """``dry_run``: the plan of a run from public settings only (the declared labels, per_class, L, the generation
    and privacy options): the LLM calls of the first round and their upper bound over every regeneration and
    rewrite round (``CostEstimate`` states the formula), the privacy spend per stage with its total
    (``planned_privacy_spend``) and, for a local model (``calibrate``), a time estimate from two short timed
    generations of a public seed on this machine. The corpus is not read, no ledger is opened: nothing is drawn,
    charged or sent to a remote backend. Terms are placeholders, so the input-token counts are estimates."""
    from privseed.tasks.data.corpus import list_shards

    list_shards(cfg.data, cfg.storage_options)  # a wrong path fails now, not at the real run
    spend = planned_privacy_spend(cfg)
    privacy = {"stages": [s._asdict() for s in spend], "epsilon": sum(s.epsilon for s in spend),
               "delta": sum(s.delta for s in spend)}
    if cfg.llm == "none":
        description = "--llm none sends no LLM call"
        result = {"dry_run": True, "estimate": description, "calls": 0, "usd": 0.0, "tokens_in": 0,
                  "tokens_out_max": 0, "calls_bound": 0, "tokens_out_bound": 0, "usd_bound": 0.0}
    else:
        from privseed.tasks.generation.documents import estimate_generation

        estimate = estimate_generation(placeholder_sequences(cfg), cfg, calibrate=calibrate)
        result = {"dry_run": True, "estimate": estimate.describe(), "calls": estimate.calls, "usd": estimate.usd,
                  "tokens_in": estimate.tokens_in, "tokens_out_max": estimate.tokens_out_max,
                  "calls_bound": estimate.calls_bound, "tokens_in_bound": estimate.tokens_in_bound,
                  "tokens_out_bound": estimate.tokens_out_bound, "usd_bound": estimate.usd_bound,
                  "seconds_first_round": estimate.seconds_first_round(), "seconds_bound": estimate.seconds_bound()}
    result["privacy"] = privacy
    result["privacy_plan"] = describe_privacy_plan(spend)
    stage_logger().info("dry run, nothing drawn, charged or sent: %s", result["estimate"])
    return result
