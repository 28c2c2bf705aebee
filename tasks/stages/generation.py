"""Stages around the LLM: the local-model check before any private data is read, the dry run's cost estimate,
and generation of the synthetic documents from released seeds, from a command's configuration (the settings it
implies, ``params_from_config``; the Prefect tasks ``generate_release`` and ``generate_documents``). The work is
tasks/generation/'s: rounds.py (pure rounds), rows.py (row assembly), drivers.py (backends, shards, parts)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, NamedTuple, Sequence

import pandas as pd
from prefect import task

from privseed.tasks import storage
from privseed.tasks.config.commands import DpKpsConfig, ReleaseConfig
from privseed.tasks.data.corpus import StagedRelease, candidate_folder, list_shards, new_release_id
from privseed.tasks.errors import retry_if_transient
from privseed.tasks.dp.mechanisms import mechanism_kind
from privseed.tasks.generation.drivers import (calibrate_local_speed, generate_release_parts, generate_seeds,
                                               refuse_remote_llm_for_reproducible_noise, seeds_from_sequences)
from privseed.tasks.generation.class_fit import SEED_POOL_CLASSES
from privseed.tasks.generation.examples import (answer_openings, answers_open_with_subject, envelope_warning,
                                                examples_for_doc_type, prompt_examples)
from privseed.tasks.generation.params import GenerationParams
from privseed.tasks.generation.rounds import build_generation_requests
from privseed.tasks.llm.cache import CallCache
from privseed.tasks.llm.cost import CostEstimate, estimate_cost
from privseed.tasks.llm.prompting import PromptTemplate
from privseed.tasks.llm.released import RecipientExample, load_few_shot
from privseed.tasks.llm.service import LLMSpec, get_backend, kind_of, llm_spec, parse_llm_spec
from privseed.tasks.quality import ReleaseGate
from privseed.tasks.seeds.corpus_profile import (ADAPTIVE_OPTIONS, asks_for_profile, planned_settings, profile_budget,
                                                 settled)
from privseed.tasks.stages import NOT_PERSISTED, stage_logger
from privseed.tasks.stages.release import class_names_from_config, gate_from_config

log = logging.getLogger("privseed.generation")


def check_local_model(llm: str, doc_type: str | None = None) -> None:
    """A local model that is missing (or an opt-in one whose parts are not installed or do not verify) stops
    the run here, before any private data is read or budget is spent; an opt-in model is assembled now, once,
    rather than by every Dask worker at its first call. The embedded model asked for a kind of document it was
    measured to write poorly, or never measured on, is said so here too (``envelope_warning``)."""
    spec = parse_llm_spec(llm)
    if kind_of(spec).local_weights:
        get_backend(spec)  # resolves (and verifies) the weights; they are loaded only at the first call
    warning = envelope_warning(spec.kind, spec.model, doc_type) if doc_type is not None else None
    if warning:
        stage_logger().warning("%s", warning)


def with_class_names(cfg: DpKpsConfig) -> tuple[DpKpsConfig, dict[str, str] | None]:
    """The owner's public class names (checked now, before any private data is read) for the prompts and the
    manifest; a class-names file with no --labels declares the label set itself."""
    class_names = class_names_from_config(cfg)
    if class_names is None:
        return cfg, None
    if cfg.labels is None:
        cfg = cfg.model_copy(update={"labels": class_names.labels})
    return cfg, class_names.to_dict()


def generate_release_documents(sequences: pd.DataFrame, cfg: DpKpsConfig, labels: list) -> tuple[StagedRelease, dict]:
    """One document per released seed (``generate_release``: the generation shards call the LLM through the call
    cache, split documents from seeds dropped after ``max_regenerations`` rounds, and
    write and gate-check the release's parts); only the parts' descriptors come back here, with the report that
    goes into quality.json."""
    staged = generate_release(sequences, cfg, gate_from_config(cfg, labels))
    report = staged.generation_report
    assert report is not None  # generate_release_parts always counts what its shards kept and dropped
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
                              "keyphrases": [[term] * settled(cfg.length, "--length")
                                             for _ in range(len(cfg.labels) * cfg.per_class)]})
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
        epsilon, delta = cfg.histogram_epsilon, cfg.delta
        profile: list[PlannedSpend] = []
        if asks_for_profile({option: getattr(cfg, option) for option in ADAPTIVE_OPTIONS}):
            (profile_epsilon, profile_delta), (epsilon, delta) = profile_budget(epsilon, delta)
            profile = [PlannedSpend("corpus profile", profile_epsilon, profile_delta,
                                    "the noisy count of documents per class and length bin (discrete Laplace), "
                                    "from which the options left auto are derived")]
        budgets = stage_budgets(cfg.method, epsilon, delta, cfg.markov_term_share)
        names = [("term histograms", f"the noisy term histogram of each class ({cfg.mechanism})"),
                 ("co-occurrence pairs", "the noisy pair counts among each class's heaviest terms")]
        return profile + [PlannedSpend(name, epsilon, delta, what)
                          for (name, what), (epsilon, delta) in zip(names, budgets)]
    sketch_delta = cfg.delta if mechanism_kind(cfg.mechanism).spends_delta else 0.0
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
    list_shards(cfg.data, cfg.storage_options)  # a wrong path fails now, not at the real run
    spend = planned_privacy_spend(cfg)  # the corpus profile's share included while an option is "auto"
    # "auto" settings as their cost's upper bound: the corpus profile that settles them is not read yet
    cfg = cfg.model_copy(update=planned_settings({option: getattr(cfg, option) for option in ADAPTIVE_OPTIONS}))
    privacy = {"stages": [s._asdict() for s in spend], "epsilon": sum(s.epsilon for s in spend),
               "delta": sum(s.delta for s in spend)}
    if cfg.llm == "none":
        description = "--llm none sends no LLM call"
        result = {"dry_run": True, "estimate": description, "calls": 0, "usd": 0.0, "tokens_in": 0,
                  "tokens_out_max": 0, "calls_bound": 0, "tokens_out_bound": 0, "usd_bound": 0.0}
    else:
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


def params_from_config(cfg: ReleaseConfig) -> GenerationParams:
    """GenerationParams from a flow config (DpKpsConfig or any ReleaseConfig); fields it lacks keep defaults."""
    few = getattr(cfg, "few_shot", None)
    # The owner's --few-shot wins; else a kind that shows them (local models, vLLM) is shown the example library's
    # documents of the doc type's kind (tasks/generation/examples.py); a config without the option (PE) keeps its
    # prompts without examples.
    library = getattr(cfg, "examples", "none")
    shows = kind_of(spec_from_config(cfg)).shows_examples
    shown = prompt_examples(few, library, shows, cfg.doc_type)
    examples: tuple[RecipientExample, ...] = ()
    if few:
        examples = tuple(load_few_shot(few, cfg.storage_options))
    elif shown is not None:
        examples = examples_for_doc_type(cfg.doc_type)
        log.info("prompts show the example library's %s documents (--doc-type %r)", shown, cfg.doc_type)
    elif library == "library" and shows:
        log.info("no example documents: --doc-type %r names no kind of the example library", cfg.doc_type)
    class_names = class_names_from_config(cfg)
    kw = {k: getattr(cfg, k) for k in ("max_tokens", "temperature", "best_of", "max_regenerations", "max_rewrites",
                                       "rewrite_off_class", "avoid_other_classes", "prefer_own_class", "steer",
                                       "steer_schedule", "steer_end_coverage", "repeat_penalty", "no_repeat_ngram")
          if getattr(cfg, k, None) is not None}
    if hasattr(cfg, "language"):
        kw["language"] = cfg.language
    if getattr(cfg, "document_rules", None):
        kw["document_rules"] = tuple(sorted(cfg.document_rules.items()))
    template = getattr(cfg, "prompt_template", None)
    if template:
        kw["template"] = template
    prefill = kind_of(spec_from_config(cfg)).prefill
    openings = answer_openings(few, library, prefill, cfg.doc_type)
    subject = answers_open_with_subject(few, library, prefill, cfg.doc_type)
    return GenerationParams(doc_type=cfg.doc_type, few_shot=examples, class_names=class_names, openings=openings,
                            subject_openings=subject, **kw)


def estimate_generation(sequences: pd.DataFrame, cfg: ReleaseConfig, vocabulary: Sequence[str] | None = None,
                        calibrate: bool = True) -> CostEstimate:
    """``--dry-run``: what generation would send, from the released seeds (``estimate_cost``: the first round and
    the upper bound over every regeneration and rewrite round); sends nothing. For a local model (``calibrate``)
    also the time it would take on this machine, from two short timed generations of a public seed
    (``calibrate_local_speed``) with the model that counted the prompts."""
    seeds = seeds_from_sequences(sequences, vocabulary, cfg.seed)
    spec, params = spec_from_config(cfg), params_from_config(cfg)
    template = PromptTemplate.load(params.template)
    flat = [r for per in build_generation_requests(seeds, template, params, spec.kind) for r in per]
    backend = get_backend(spec) if kind_of(spec).local_weights else None
    cache = CallCache(llm_cache_uri(cfg), cfg.storage_options)
    try:
        later_rounds = params.max_regenerations + params.max_rewrites
        estimate = estimate_cost(spec, flat, cache, backend, later_rounds=later_rounds, per_owner=params.best_of)
        if backend is not None and calibrate and seeds:
            speed = calibrate_local_speed(backend, template, params, seeds[0].label, spec.kind,
                                          getattr(cfg, "length", 10))
            estimate = dataclasses.replace(estimate, speed=speed)
        return estimate
    finally:
        if backend is not None:
            backend.close()  # its tokenizer counted the prompts; the weights are not needed any more


def spec_from_config(cfg: ReleaseConfig) -> LLMSpec:
    """The backend of a run's ``--llm`` with the run options its kind takes: the LLM options (concurrency, secret
    block) and where the run keeps its private state (a batch API's pending batches)."""
    return llm_spec(cfg.llm, state_uri=cfg.state_uri, storage_options=cfg.storage_options,
                    llm_concurrency=cfg.llm_concurrency, llm_secret=cfg.llm_secret)


def llm_cache_uri(cfg: ReleaseConfig) -> str:
    """The run's LLM call cache: in the owner's private state, never in the release."""
    return storage.join(cfg.state_uri, "llm-cache")


def documents_from_config(sequences: pd.DataFrame, cfg: ReleaseConfig,
                          vocabulary: Sequence[str] | None = None) -> pd.DataFrame:
    """One document per released seed as a frame (rows of ``ROW_COLUMNS``, in sequence order; non-documents still
    in, marked by ``document_reason``), by ``generate_seeds`` with the generation settings of ``cfg``."""
    seeds = seeds_from_sequences(sequences, vocabulary, cfg.seed)
    spec, params = spec_from_config(cfg), params_from_config(cfg)
    refuse_remote_llm_for_reproducible_noise(spec, cfg.insecure_reproducible_noise)
    return generate_seeds(seeds, spec, params, llm_cache_uri(cfg), cfg.storage_options or None,
                          pool=sequences.attrs.get(SEED_POOL_CLASSES))


def release_from_config(sequences: pd.DataFrame, cfg: ReleaseConfig, gate: ReleaseGate | None,
                        vocabulary: Sequence[str] | None = None) -> StagedRelease:
    """One document per released seed, written by the generation shards as the parts of a new release and checked
    there by ``gate`` (``generate_release_parts``; non-documents already dropped), with the settings of ``cfg``."""
    seeds = seeds_from_sequences(sequences, vocabulary, cfg.seed)
    spec, params = spec_from_config(cfg), params_from_config(cfg)
    refuse_remote_llm_for_reproducible_noise(spec, cfg.insecure_reproducible_noise)
    # A candidate drawn from reproducible noise is written to the private state, not OUT: a run that dies before
    # its gate must leave nothing of it where the recipient looks (privseed.tasks.data.corpus.candidate_folder).
    release_id = new_release_id()
    folder = candidate_folder(cfg.out, cfg.state_uri, release_id, cfg.insecure_reproducible_noise)
    return generate_release_parts(seeds, spec, params, llm_cache_uri(cfg), cfg.storage_options or None, out=folder,
                                  gate=gate, release_id=release_id, pool=sequences.attrs.get(SEED_POOL_CLASSES))


#: The generation tasks' retries: the call cache makes them idempotent, so a retry re-sends only the calls that never
#: finished (a retried release generation writes its parts under a new release id; the first attempt's go at the
#: next commit). Transient errors only, like every stage's.
GENERATION_RETRIES: dict[str, Any] = dict(retries=2, retry_delay_seconds=[5, 30], retry_condition_fn=retry_if_transient,
                                          **NOT_PERSISTED)
#: Prefect task: ``generate_documents(sequences, cfg)`` -> synthetic rows (ROW_COLUMNS), in sequence order.
generate_documents = task(name="generate-documents", **GENERATION_RETRIES)(documents_from_config)
#: Prefect task: ``generate_release(sequences, cfg, gate)`` -> the release's parts, written and checked by the
#: generation shards (a StagedRelease for ``privseed.tasks.data.corpus.publish_release``); non-documents already
#: dropped.
generate_release = task(name="generate-release", **GENERATION_RETRIES)(release_from_config)
