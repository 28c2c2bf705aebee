"""The stages of Aug-PE, AugPE+V~ and SecPE (docs/baselines.md): LLM calls through the call cache, candidate and
public embeddings, the private work per unit on the workers, the schedules charged once up front, each round's
noisy statistic drawn once through the ledger, the dry-run plan and the release. The round loop that wires them
is ``privseed.tasks.stages.pe_rounds``.

Privacy boundary: private documents are read, embedded and voted per work unit on the workers
(``privseed.tasks.pe.pe_units``); what reaches the driver is a sum of exact counts or cluster sums, which goes straight
into the ledger's draw-once, and what crosses the boundary is that noisy statistic and text the LLM wrote from public
prompts or from earlier synthetic text. Every LLM call is cached in the private state (``--state``, default
``OUT.private/llm-cache``) so a crash mid-round repeats none that finished.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd
from scipy import sparse

from privseed.tasks.dp import accounting
from privseed.tasks import storage
from privseed.tasks.pe import evolution as ev
from privseed.tasks.data.cluster import current_client, map_shards
from privseed.tasks.config.commands import AUGPE_DEFAULT_EPSILON, AugPeConfig, EvolutionConfig, SecPeConfig
from privseed.tasks.data.corpus import list_shards, publish_release, read_columns
from privseed.tasks.errors import ConfigError, CorpusError, LedgerMismatchError, retry_if_transient
from privseed.tasks.dp.ledger import PrivacyLedger
from privseed.tasks.dp.mechanisms import GaussianMechanism
from privseed.tasks.pe.pe_units import (PrivateUnits, SampledUnit, SecretDetector, forget_run, stack_incidence,
                                        unit_class_votes, unit_cluster_sums, unit_secret_incidence)
from privseed.tasks.stages import private_stage, public_stage, stage_logger
from privseed.tasks.stages.release import gate_from_config
from privseed.tasks.data.units import CorpusPlan, add_parts, map_reduce_units


# ---------------------------------------------------------------------------------------------------------
# LLM calls and public embeddings
# ---------------------------------------------------------------------------------------------------------
def _complete_chunk(requests: list, llm: Any, cache_root: str, storage_options: dict,
                    on_result: Callable | None = None) -> list[dict]:
    """One shard of calls on whichever process runs it (the backend is loaded once per process)."""
    from privseed.tasks.llm import CallCache, complete, get_backend

    backend = get_backend(llm)
    results = complete(llm, requests, CallCache(cache_root, storage_options), on_result=on_result)
    return [{"text": r.text.strip(), "tokens_in": r.tokens_in, "tokens_out": r.tokens_out,
             "backend": backend.name, "model": backend.model} for r in results]


def _numbered_chunk(chunk: tuple[int, list], llm: Any, cache_root: str, storage_options: dict,
                    topic: str | None) -> list[dict]:
    """``_complete_chunk`` on a worker, reporting each call on ``topic`` (the driver's bar)."""
    from privseed.tasks.llm.progress import call_messages

    number, requests = chunk
    return _complete_chunk(requests, llm, cache_root, storage_options, on_result=call_messages(topic, number))


def variation_settings(cfg: EvolutionConfig) -> dict[str, Any]:
    """What ``privseed.tasks.pe.evolution.variation_prompts`` reads of a run: its public seed, the document type and
    the variation options (K, paraphrase or fill-in-the-blanks, the share of words blanked)."""
    return {"seed": cfg.seed, "doc_type": cfg.doc_type, "variations": cfg.variations, "variation": cfg.variation,
            "mask_fraction": cfg.mask_fraction}


def chat_requests(prompts: list[ev.Prompt], cfg: EvolutionConfig) -> list:
    from privseed.tasks.llm import ChatMessage, ChatRequest

    return [ChatRequest(messages=((ChatMessage("system", system),) if system else ()) + (ChatMessage("user", user),),
                        max_tokens=cfg.max_tokens, temperature=cfg.temperature, seed=seed)
            for system, user, seed in prompts]


@public_stage("llm-calls", retries=2)
def llm_calls(prompts: list[ev.Prompt], cfg: EvolutionConfig, desc: str = "llm") -> list[dict]:
    """Send (system, user, seed) prompts through the call cache; a retry or a re-run repeats no finished call.
    Prompts hold public text only (the document type, released words, synthetic documents).

    With ``--llm-shards`` > 1 the calls are split into shards that run on the workers, each keeping its backend
    loaded and reporting each call to the bar here as it finishes. Otherwise they run here with a per-call bar.
    Answers come back in prompt order either way."""
    from privseed.tasks.llm.progress import CallProgress
    from privseed.tasks.llm.service import call_prices, serving
    from privseed.tasks.stages.generation import spec_from_config

    requests = chat_requests(prompts, cfg)
    cache_root = storage.join(cfg.state_uri, "llm-cache")
    shards = max(1, min(cfg.llm_shards, len(requests)))
    bounds = np.linspace(0, len(requests), shards + 1).astype(int)
    chunks = [requests[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    spec = spec_from_config(cfg)  # the LLM helper's backend options (batches, concurrency)
    bar = CallProgress(len(requests), call_prices(spec, len(requests)), desc, cfg.progress)
    with serving(spec) as served:  # a shared local server runs for this round's calls
        parts = _shard_calls(served, chunks, cache_root, cfg, bar)
    out = [answer for part in parts for answer in part]
    stage_logger().info("LLM (%s): %d calls answered (%d output tokens)", desc, len(out),
                        sum(r["tokens_out"] for r in out))
    return out


def _shard_calls(spec: Any, chunks: list, cache_root: str, cfg: EvolutionConfig, bar: Any) -> list[list[dict]]:
    """The chunks' answers: here with a per-call bar, or on the workers reporting each call to ``bar``."""
    from privseed.tasks.llm.progress import ShardProgress

    try:
        if current_client() is None or len(chunks) <= 1:
            parts = [_complete_chunk(chunk, spec, cache_root, cfg.storage_options, on_result=bar) for chunk in chunks]
        else:
            from privseed.tasks.data.cluster import shard_events

            calls = ShardProgress(bar, [len(chunk) for chunk in chunks])
            with shard_events(calls.on_call) as topic:
                parts = map_shards(_numbered_chunk, list(enumerate(chunks)), spec, cache_root, cfg.storage_options,
                                   topic, on_done=lambda i, part: calls.finished(
                                       i, len(part), sum(a["tokens_in"] for a in part),
                                       sum(a["tokens_out"] for a in part)))
    finally:
        bar.close()
    return parts


def generate_candidates(cfg: EvolutionConfig, prompts: list[ev.Prompt], meta: pd.DataFrame, desc: str) -> pd.DataFrame:
    """``meta`` (a row per prompt) with the answers' text, tokens, backend and model. Retried as often as
    ``--llm-retries`` says; a retry re-reads every finished call from the cache and sends only the rest."""
    calls = llm_calls.with_options(retries=cfg.llm_retries, retry_condition_fn=retry_if_transient)
    answers = calls(prompts, cfg, desc)
    out = meta.copy().reset_index(drop=True)
    for key in ("text", "tokens_in", "tokens_out", "backend", "model"):
        out[key] = [a[key] for a in answers]
    return out


@public_stage("embed-candidates", retries=2)
def embed_candidates(texts: list[str], model: str, progress: bool = False) -> np.ndarray:
    """Embeddings of LLM-written (public) text: here, or sharded over the workers when there are many."""
    from privseed.tasks.data.embedding import embed_sharded

    return embed_sharded(texts, model, progress=progress, desc="embed candidates")


@public_stage("load-public-corpus", retries=2)
def load_public_texts(cfg: SecPeConfig) -> list[str]:
    """SecPE's public corpus of the same domain (Parquet, CSV or JSON Lines, ``--public-text-column``)."""
    frame = read_columns(cfg.public, [cfg.public_text_column], cfg.storage_options)
    texts: list[str] = frame[cfg.public_text_column].dropna().astype(str).tolist()
    if not texts:
        raise CorpusError(f"the public corpus at {cfg.public!r} has no text")
    return texts


def public_clusters(cfg: SecPeConfig) -> ev.PublicClusters:
    """k-means on the embedded public corpus (no privacy cost)."""
    public_emb = embed_candidates(load_public_texts(cfg), cfg.embedding_model, cfg.progress)
    return ev.public_kmeans(public_emb, min(cfg.clusters, public_emb.shape[0]), cfg.seed)


# ---------------------------------------------------------------------------------------------------------
# The private corpus as work units, and the exact statistics summed over them on the cluster
# ---------------------------------------------------------------------------------------------------------
@private_stage("plan-private-units")
@contextlib.contextmanager
def private_units(cfg: EvolutionConfig, labels: list, plan: CorpusPlan) -> Iterator[PrivateUnits]:
    """The work units of the private corpus (``plan``, from ``plan_private_corpus``) for the rounds of one run;
    on the way out, every worker forgets the embeddings it kept for them (``privseed.tasks.pe.pe_units``)."""
    units = PrivateUnits(plan.units, cfg.text_column, cfg.label_column, dict(cfg.storage_options or {}),
                         cfg.embedding_model, tuple(str(label) for label in labels), uuid.uuid4().hex)
    try:
        yield units
    finally:
        client = current_client()
        if client is not None:
            client.run(forget_run, units.run)
        forget_run(units.run)


@private_stage("augpe-unit-votes")
def exact_class_votes(units: PrivateUnits, candidate_emb: np.ndarray, voting_class: np.ndarray) -> np.ndarray:
    """Aug-PE's exact votes of the whole corpus: every unit's counts on its worker, summed on the cluster."""
    return map_reduce_units(unit_class_votes, units.units, add_parts, units, candidate_emb, voting_class,
                            affinity=True)


@private_stage("secpe-unit-cluster-sums")
def exact_cluster_sums(units: PrivateUnits, rho: list[np.ndarray], cfg: SecPeConfig, t: int,
                       clusters: ev.PublicClusters) -> ev.ClusterSums:
    """SecPE's round-t counts and sums of the sampled documents per (class, cluster), every unit's part on its
    worker (its own Bernoulli mask, from the round's sampling source), summed on the cluster."""
    items = [SampledUnit(unit, part, cfg.noise("secpe", f"round-{t}", "sample", f"unit-{i}"))
             for i, (unit, part) in enumerate(zip(units.units, rho))]
    return map_reduce_units(unit_cluster_sums, items, add_parts, units, clusters, cfg.radius, affinity=True)


def secret_detector(cfg: SecPeConfig) -> SecretDetector:
    """The public part of secret detection: the word list or the file's terms (read here), or PII."""
    if cfg.secrets == "words":
        import wordfreq

        public_words = wordfreq.top_n_list("en", cfg.secret_vocab_top)  # public, frequency-ranked
        return SecretDetector("words", tuple(ev.quantile_secret_words(public_words, cfg.secret_quantile,
                                                                      cfg.secret_count)))
    if cfg.secrets == "pii":
        return SecretDetector("pii", key=secrets.token_bytes(32))
    if not storage.exists(cfg.secrets, cfg.storage_options):
        raise ConfigError(f"--secrets {cfg.secrets!r}: expected 'words', 'pii' or an existing file of secret terms")
    terms = storage.read_bytes(cfg.secrets, cfg.storage_options).decode("utf-8").splitlines()
    return SecretDetector("file", tuple(t for t in terms if t.strip()))


@private_stage("detect-secrets-per-unit")
def detect_unit_secrets(cfg: SecPeConfig, units: PrivateUnits) -> sparse.csr_matrix:
    """The corpus's secret incidence, each unit's rows detected on its worker, stacked here in unit order."""
    return stack_incidence(map_reduce_units(unit_secret_incidence, units.units, add_parts, units,
                                            secret_detector(cfg)))


def rho_per_unit(units: PrivateUnits, rho: np.ndarray) -> list[np.ndarray]:
    """``rho`` (corpus row order) split into the units' parts."""
    bounds = np.cumsum([u.rows for u in units.units])
    if bounds[-1] != rho.shape[0]:
        raise CorpusError("the corpus changed while it was read (its row count differs between two reads)")
    return np.split(rho, bounds[:-1])


# ---------------------------------------------------------------------------------------------------------
# Schedules, charged once up front
# ---------------------------------------------------------------------------------------------------------
def check_schedule(ledger: PrivacyLedger, name: str, schedule: dict) -> None:
    """The public implementation silently recomputes sigma on a resume with another schedule and then
    misreports epsilon. Here the schedule (sigma, eps, delta, T, adjacency, seeds, ...) is stored with the run;
    a resume with anything else refuses."""
    if ledger.has(name):
        stored = next(e for e in ledger.entries() if e["name"] == name)["params"]
        current = json.loads(json.dumps(schedule, sort_keys=True, default=str))
        changed = sorted(k for k in set(stored) | set(current) if stored.get(k) != current.get(k))
        if changed:
            raise LedgerMismatchError(
                f"run {ledger.run_id!r} was started with another schedule ({', '.join(changed)} changed); "
                "resume with the original settings, or start a new run (new --run-id) and spend new budget")


def augpe_schedule(cfg: AugPeConfig) -> dict:
    """sigma, epsilon, delta for the T voting rounds (public: computed from the configuration only)."""
    delta = cfg.delta if cfg.delta is not None else accounting.default_delta(cfg.n_upper_bound)
    if cfg.noise_multiplier is not None:
        sigma = float(cfg.noise_multiplier)
        epsilon = accounting.augpe_epsilon(sigma, delta, cfg.iterations)
    else:
        epsilon = AUGPE_DEFAULT_EPSILON if cfg.epsilon is None else float(cfg.epsilon)
        sigma = accounting.augpe_noise_multiplier(epsilon, delta, cfg.iterations)
    return {"mechanism": "gaussian-nn-histogram", "sigma": sigma, "epsilon": epsilon, "delta": delta,
            "iterations": cfg.iterations, "adjacency": accounting.ADJACENCY, "sensitivity_l2": 1.0,
            "delta_from": "config" if cfg.delta is not None else f"1/(n ln n), n = public bound {cfg.n_upper_bound}",
            "seed": cfg.seed,  # public: LLM call seeds and selection; the noise comes from the mechanism's source
            "per_class": cfg.per_class, "variations": cfg.variations, "selection": cfg.selection,
            "threshold": cfg.threshold, "min_words": cfg.min_words, "accountant": "dp-accounting PLD, add/remove"}


def augpe_round_mechanism(schedule: dict) -> GaussianMechanism:
    """The Gaussian mechanism of every round of the schedule (sensitivity 1, the schedule's sigma)."""
    return ev.vote_mechanism(schedule["sigma"], schedule["epsilon"], schedule["delta"])


def charge_augpe_schedule(ledger: PrivacyLedger, cfg: AugPeConfig) -> dict:
    """Charge the whole schedule up front: T Gaussian rounds composed by the PLD accountant, each drawn later by
    the same mechanism and recorded as accounted in this charge. A resumed run with another schedule is refused.
    Returns the schedule the rounds draw with."""
    schedule = augpe_schedule(cfg)
    check_schedule(ledger, "augpe.schedule", schedule)
    ledger.charge("augpe.schedule", mechanism=augpe_round_mechanism(schedule), noise=cfg.noise("augpe"),
                  params=schedule, releases=cfg.iterations, stage="augpe")
    stage_logger().info("Aug-PE: T=%d rounds, sigma=%.4f, epsilon=%.3f, delta=%.3g", cfg.iterations,
                        schedule["sigma"], schedule["epsilon"], schedule["delta"])
    return schedule


def charge_secpe_schedule(ledger: PrivacyLedger, cfg: SecPeConfig, secret_noise: ev.SecPeNoise
                          ) -> tuple[dict, GaussianMechanism]:
    """Charge the per-document DP epsilon of the T rounds up front and return the schedule and the round
    mechanism. One document moves its round's normalised (sizes, centres) vector by at most sqrt(2): T Gaussian
    rounds. sigma is the public --noise-multiplier, so the epsilon is a function of the configuration only; it
    treats rho (from the private secret incidence) as fixed, and the schedule's ``release_guarantee`` says so: the
    release's guarantee is (p, r)-secret protection, not (epsilon, delta)-DP (docs/baselines.md)."""
    sigma = secret_noise.sigma
    delta = cfg.delta if cfg.delta is not None else accounting.default_delta(cfg.n_upper_bound)
    dp_epsilon = accounting.secpe_dp_epsilon(sigma, delta, cfg.iterations)
    # One Gaussian mechanism per round and class: sizes and centres (in noise units) as one vector.
    mechanism = ev.secpe_round_mechanism(sigma, dp_epsilon, delta)
    schedule = {"mechanism": "secret-clustering", "sigma": sigma, "iterations": cfg.iterations,
                "adjacency": accounting.ADJACENCY, "seed": cfg.seed, "clusters": cfg.clusters, "radius": cfg.radius,
                "centre_noise_scale": "(R + max(R, ||e_k||)) / n_k", "rho_norm": cfg.rho_norm,
                "per_class": cfg.per_class, "variations": cfg.variations, "min_words": cfg.min_words,
                "secret_protection": secret_noise.protection, "dp_epsilon_if_rho_sigma_fixed": dp_epsilon,
                "delta": delta, "release_guarantee": secpe_guarantee(cfg)}
    check_schedule(ledger, "secpe.schedule", schedule)
    ledger.charge("secpe.schedule", mechanism=mechanism, noise=cfg.noise("secpe"), params=schedule,
                  releases=cfg.iterations, stage="secpe")
    # The bound actually reached (SecPeNoise.worst_blow_up) depends on the private secret incidence: not logged.
    stage_logger().info("SecPE: T=%d, sigma=%.4f, p=%g, r=%g (B(p) <= r checked for every detected secret)",
                        cfg.iterations, sigma, cfg.p, secret_noise.protection["r"])
    return schedule, mechanism


def secret_protection(cfg: SecPeConfig) -> ev.SecretProtection:
    """The run's (p, r) target and how it is checked, as the pure SecPE functions take it."""
    return ev.SecretProtection(p=cfg.p, r_over_p=cfg.r_over_p, rounds=cfg.iterations, rho_norm=cfg.rho_norm,
                               value_discretization=cfg.value_discretization)


def secret_noise(cfg: SecPeConfig, incidence: sparse.spmatrix) -> ev.SecPeNoise:
    """SecretNoise of the run: its public ``--noise-multiplier`` checked against (p, r) for the detected secrets
    (:func:`privseed.tasks.pe.evolution.secpe_noise`)."""
    return ev.secpe_noise(secret_protection(cfg), cfg.noise_multiplier, incidence)


def secpe_guarantee(cfg: SecPeConfig) -> dict[str, Any]:
    """What a SecPE release guarantees, in the ledger and the manifest (``privacy.guarantee``): (p, r)-secret
    protection, which is not (epsilon, delta)-DP."""
    r = secret_protection(cfg).r
    return {"kind": "(p, r)-secret protection", "p": cfg.p, "r": r,
            "statement": f"(p, r) = ({cfg.p:g}, {r:g})-secret protection for the detected secrets (SecPE Theorem 2): "
                         "an adversary with prior success p reconstructs a secret with probability at most r. This is "
                         "not (epsilon, delta)-differential privacy: the ledger's epsilon is the per-document DP "
                         "epsilon of the same releases only if the sampling probabilities rho, computed from the "
                         "private secret incidence, are taken as fixed"}


def advise_sigma(cfg: SecPeConfig, incidence: sparse.csr_matrix) -> dict[str, Any]:
    """``--advise-sigma``: what the corpus's detected secrets need, printed for the owner and returned; nothing is
    drawn, charged or written (no ledger is open). The number is a function of the private data."""
    sigma = ev.advise_secpe_sigma(secret_protection(cfg), incidence)
    r = secret_protection(cfg).r
    lines = [f"advice (owner only, computed from the private corpus): --noise-multiplier {sigma:g} meets "
             f"(p, r) = ({cfg.p:g}, {r:g}) over T={cfg.iterations} rounds for every detected secret "
             f"(rounded up to a multiple of {ev.ADVICE_STEP:g})",
             "  this number depends on the private data: a release publishes the --noise-multiplier it is given, so "
             "prefer a value chosen without the data (--dry-run prints the public figure for a secret held by one "
             "document) and keep this one as a check",
             "  nothing was drawn, charged, sent or written"]
    for line in lines:
        stage_logger().info("%s", line)
    return {"advice": True, "sigma": sigma, "lines": lines}


# ---------------------------------------------------------------------------------------------------------
# Each round's noisy statistic, drawn once through the ledger
# ---------------------------------------------------------------------------------------------------------
def draw_augpe_round(ledger: PrivacyLedger, cfg: AugPeConfig, schedule: dict, t: int, candidates: pd.DataFrame,
                     exact: Callable[[], np.ndarray]) -> np.ndarray:
    """Round t's released histogram over ``candidates``: the exact votes (``exact``, called only when the round
    has not been drawn before) plus the schedule's Gaussian noise, drawn once through the ledger and re-read on a
    resume."""
    return ledger.draw_once(
        f"augpe.round-{t:03d}.histogram", mechanism=augpe_round_mechanism(schedule),
        noise=cfg.noise("augpe", f"round-{t}"), stage="augpe", accounted_in="augpe.schedule",
        params={"round": t, "candidates": ev.candidate_digest(candidates)},
        exact=lambda: np.asarray(exact(), dtype=np.float64),
    )["noisy"]


def draw_secpe_round(ledger: PrivacyLedger, cfg: SecPeConfig, mechanism: GaussianMechanism, t: int, ci: int,
                     label: Any, clusters: ev.PublicClusters, scales: np.ndarray,
                     exact: Callable[[], np.ndarray]) -> dict[str, np.ndarray]:
    """Round t's released noisy centres and sizes of class ``ci``: the class's exact joint statistics
    (``exact``, called only when this release has not been drawn before) through the round mechanism, drawn once
    through the ledger. Noise and sub-sampling are secret (OS entropy, cfg.noise);
    --insecure-reproducible-noise (research only, stamped and refused by the gate) is the one way to derive them
    from --seed."""
    return ledger.draw_once(
        f"secpe.round-{t:03d}.class-{ci}", mechanism=mechanism,
        noise=cfg.noise("secpe", f"round-{t}", f"class-{ci}", "noise"), stage="secpe", partition=str(label),
        params={"round": t, "class": str(label), "K": int(clusters.sizes.size), "radius": cfg.radius,
                "joint": "sizes, then centres / c_k row by row"},
        exact=exact,
        postprocess=lambda z: dict(zip(("centres", "sizes"), ev.split_joint_statistics(z, scales))),
        accounted_in="secpe.schedule",
    )


# ---------------------------------------------------------------------------------------------------------
# Dry run and release
# ---------------------------------------------------------------------------------------------------------
def estimate_evolution(cfg: EvolutionConfig, labels: list) -> Any:
    """``--dry-run``: the LLM calls a run would send and what they would cost, from public settings only (the
    label set and the configuration). RANDOM_API prompts are rendered as they will be sent (AugPE+V~'s words by
    placeholders of the same shape: V~ is not drawn); every VARIATION_API prompt is bounded by its template around
    a text of max_tokens tokens. Output tokens are bounded by max_tokens per call. Nothing is sent, drawn or
    charged; calls already in the run's cache are counted as cached."""
    from privseed.tasks.llm.cost import estimate_cost
    from privseed.tasks.stages.generation import spec_from_config
    from privseed.tasks.llm import CallCache

    words = ["placeholder"] * 50 if getattr(cfg, "vocab_words", False) else None
    prompts, _ = ev.random_prompts(labels, cfg.per_class * (cfg.variations + 1), seed=cfg.seed, doc_type=cfg.doc_type,
                                   words=words, words_per_prompt=getattr(cfg, "words_per_prompt", 0))
    longest = pd.DataFrame({"text": [" ".join(["word"] * cfg.max_tokens)] * (len(labels) * cfg.per_class),
                            "label": [label for label in labels for _ in range(cfg.per_class)]})
    for t in range(1, cfg.iterations):
        prompts += ev.variation_prompts(longest, t, **variation_settings(cfg))[0]
    cache = CallCache(storage.join(cfg.state_uri, "llm-cache"), cfg.storage_options)
    return estimate_cost(spec_from_config(cfg), chat_requests(prompts, cfg), cache)


def dry_run_plan(cfg: EvolutionConfig) -> dict[str, Any]:
    """``dry_run``, handled by the flows themselves: the call plan, Aug-PE's schedule and the cost estimate from
    the declared labels and the configuration. The private corpus is not read and no ledger is opened."""
    labels = list(cfg.labels or [])
    list_shards(cfg.data, cfg.storage_options)  # a wrong path fails now, not at the real run
    if isinstance(cfg, SecPeConfig):
        list_shards(cfg.public, cfg.storage_options)  # a missing public corpus fails now, not after planning
    plan = ev.evolution_call_plan(len(labels), cfg.per_class, cfg.variations, cfg.iterations)
    lines = [f"dry run: {len(labels)} classes x population N={cfg.per_class}, K={cfg.variations} variations, "
             f"T={cfg.iterations} rounds -> {plan['random']} RANDOM_API + {plan['variation']} VARIATION_API calls"]
    result: dict[str, Any] = {"dry_run": True, "plan": plan}
    if isinstance(cfg, AugPeConfig):
        sched = augpe_schedule(cfg)
        result["schedule"] = sched
        lines.append(f"  schedule: sigma={sched['sigma']:.4f}, epsilon={sched['epsilon']:g}, delta={sched['delta']:.3g}"
                     + (f" (+ eps_voc={cfg.eps_voc:g} for V~)" if cfg.vocab_words else ""))
    elif isinstance(cfg, SecPeConfig):
        lone = ev.lone_holder_sigma(secret_protection(cfg)) if cfg.rho_norm == "max" else None
        needs = (f"a secret held by one document needs sigma >= {lone:.4f} at this (p, r, T)" if lone is not None
                 else "--rho-norm paper: what a secret needs depends on |D|")
        if cfg.noise_multiplier is not None:
            delta = cfg.delta if cfg.delta is not None else accounting.default_delta(cfg.n_upper_bound)
            eps = accounting.secpe_dp_epsilon(cfg.noise_multiplier, delta, cfg.iterations)
            lines.append(f"  schedule: sigma={cfg.noise_multiplier:g} (public); DP epsilon={eps:.4g} at "
                         f"delta={delta:.3g} only if rho is taken as fixed; {needs}; the run refuses if a detected "
                         "secret needs more")
        else:
            lines.append(f"  schedule: give --noise-multiplier SIGMA for a release; {needs} (public); --advise-sigma "
                         "reads the corpus and prints what its secrets need (owner only)")
    estimate = estimate_evolution(cfg, labels)
    result.update(estimate=estimate.describe(), calls=estimate.calls, usd=estimate.usd, tokens_in=estimate.tokens_in,
                  tokens_out_max=estimate.tokens_out_max)
    lines += [f"  {cfg.llm}: {estimate.describe()}", "  nothing was sent, drawn or charged"]
    result["lines"] = lines
    for line in lines:
        stage_logger().info("%s", line)
    return result


def release_frame(final: pd.DataFrame, calls: dict) -> pd.DataFrame:
    """The released rows: the final population's text and label, no keyphrases (PE seeds none), and the
    generation columns."""
    out = final[["text", "label"]].copy()
    out["keyphrases"] = [[] for _ in range(len(out))]
    for col in ("backend", "model", "prompt_version", "seed", "tokens_in", "tokens_out", "origin"):
        out[col] = final[col].values
    out.attrs["llm_calls"] = calls
    return out


@public_stage("publish-release", retries=2)
def publish_evolution(cfg: EvolutionConfig, final: pd.DataFrame, ledger: PrivacyLedger, labels: list,
                      summary: dict[str, Any]) -> dict:
    """Gate and publish the final population, with ``summary`` (method, schedule, LLM calls, public per-round
    counts) as evolution.json; returns the manifest."""
    gate = gate_from_config(cfg, labels)
    files = {"evolution.json": (json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n").encode()}
    manifest = publish_release(cfg.out, release_frame(final, summary["llm_calls"]), ledger=ledger,
                               config=cfg.public_dict(), gate=gate, extra_files=files,
                               storage_options=cfg.storage_options, allow_insecure=cfg.allow_insecure_release)
    epsilon, delta = ledger.total()
    stage_logger().info("release %s: %d documents, epsilon=%g, delta=%g", manifest["release_id"], manifest["rows"],
                        epsilon, delta)
    return manifest
