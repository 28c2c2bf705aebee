"""Private evolution baselines as Prefect flows: Aug-PE, AugPE+V~ (``--vocab-words``) and SecPE.

    augpe:  load -> [privatize vocabulary] -> embed private -> RANDOM_API -> T x (embed candidates -> DP vote
            histogram (drawn once) -> select -> VARIATION_API) -> gate -> publish
    secpe:  load -> secrets -> SecretNoise (LP, sigma) -> public k-means -> RANDOM_API -> T x (embed candidates
            -> SecretClustering per class (drawn once) -> cluster votes -> top N -> VARIATION_API) -> publish

Class conditioning without naming the class (DP-KPS's setting): every class has its own population. All
populations start from the same unconditional RANDOM_API prompt (Aug-PE, SecPE) or from prompts carrying random
words of the released vocabulary V~ (AugPE+V~), with different call seeds; private documents vote only within
their class, so the classes separate through selection alone. The synthetic documents keep their population's
label.

Privacy boundary: private documents are embedded locally (inside the mechanism) and never persisted; what
crosses the boundary are the noisy histograms / noisy cluster statistics, each drawn once through the ledger, and
text the LLM wrote from public prompts or from earlier synthetic text. Every LLM call is cached in the private
state (``--state``, default ``OUT.private/llm-cache``) so a crash mid-round repeats none that finished.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import tasks._runtime  # noqa: F401  (offline settings before prefect is imported)
import numpy as np
import pandas as pd
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from tasks import accounting, storage
from tasks import evolution as ev
from tasks.evolution import OPERATOR_TIMINGS
from tasks.config import AugPeConfig, EvolutionConfig, SecPeConfig, validate_config
from tasks.corpus import list_shards, publish_release
from tasks.errors import ConfigError, CorpusError, LedgerMismatchError, retry_if_transient
from tasks.ledger import PrivacyLedger, public_rng
from tasks.stages.corpus import load_private_corpus, resolve_labels
from tasks.stages.ledger import log_cumulative_total, open_ledger, warn_if_insecure
from tasks.mechanisms import GaussianMechanism

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------------
# Tasks shared by both flows
# ---------------------------------------------------------------------------------------------------------
@task(name="embed-private", persist_result=False, cache_policy=NO_CACHE)
def embed_private(texts: list[str], model: str, progress: bool = False) -> np.ndarray:
    """Private embeddings stay in memory (here or on the run's own Dask workers), inside the mechanism; they are
    never persisted or logged. No progress bar whatever ``progress`` says: its total would print |D|, and
    logs name no private count (docs/privacy.md)."""
    from tasks.embedding import embed_sharded

    return embed_sharded(texts, model, progress=False, desc="embed private documents")


@task(name="embed-candidates", persist_result=False, cache_policy=NO_CACHE)
def embed_candidates(texts: list[str], model: str, progress: bool = False) -> np.ndarray:
    from tasks.embedding import embed_sharded

    return embed_sharded(texts, model, progress=progress, desc="embed candidates")


def _call_seed(seed: int, *names: str) -> int:
    return int(public_rng(seed, "llm-call", *names).integers(0, 2**31 - 1))


def _complete_chunk(requests: list, llm, cache_root: str, storage_options: dict,
                    on_result=None) -> list[dict]:
    """One shard of calls on whichever process runs it (the backend is loaded once per process)."""
    from tasks.llm import CallCache, cached_complete, get_backend

    backend = get_backend(llm)
    results = cached_complete(backend, requests, CallCache(cache_root, storage_options), on_result=on_result)
    return [{"text": r.text.strip(), "tokens_in": r.tokens_in, "tokens_out": r.tokens_out,
             "backend": backend.name, "model": backend.model} for r in results]


def _chat_requests(prompts: list[tuple[str | None, str, int]], cfg: EvolutionConfig) -> list:
    from tasks.llm import ChatMessage, ChatRequest

    return [ChatRequest(messages=((ChatMessage("system", system),) if system else ()) + (ChatMessage("user", user),),
                        max_tokens=cfg.max_tokens, temperature=cfg.temperature, seed=seed)
            for system, user, seed in prompts]


@task(name="llm-calls", retries=2, retry_condition_fn=retry_if_transient,
      retry_delay_seconds=[5, 30], persist_result=False, cache_policy=NO_CACHE)
def llm_calls(prompts: list[tuple[str | None, str, int]], cfg: EvolutionConfig, desc: str = "llm") -> list[dict]:
    """Send (system, user, seed) prompts through the call cache; a retry or a re-run repeats no finished call.
    Prompts hold public text only (the document type, released words, synthetic documents).

    With a Dask client (``--llm-shards`` > 1 or ``--dask-address``) the calls are split into shards that run on
    the workers, each keeping its backend loaded; the progress bar then advances per finished shard. Without
    one they run here with a per-call bar. Answers come back in prompt order either way."""
    from tasks.cluster import current_client, map_shards
    from tasks.generation import CallProgress, call_prices, spec_from_config

    requests = _chat_requests(prompts, cfg)
    cache_root = storage.join(cfg.state_uri, "llm-cache")
    shards = max(1, min(cfg.llm_shards, len(requests)))
    bounds = np.linspace(0, len(requests), shards + 1).astype(int)
    chunks = [requests[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    spec = spec_from_config(cfg)  # the LLM helper's backend options (batches, concurrency)
    bar = CallProgress(len(requests), call_prices(spec, len(requests)), desc, cfg.progress)
    client = current_client()
    try:
        if client is None or len(chunks) <= 1:
            parts = [_complete_chunk(chunk, spec, cache_root, cfg.storage_options, on_result=bar) for chunk in chunks]
        else:
            parts = map_shards(_complete_chunk, chunks, spec, cache_root, cfg.storage_options,
                               on_done=lambda _, part: bar.add(len(part), sum(a["tokens_in"] for a in part),
                                                               sum(a["tokens_out"] for a in part)))
    finally:
        bar.close()
    out = [answer for part in parts for answer in part]
    log.info("LLM (%s): %d calls answered (%d output tokens)", desc, len(out), sum(r["tokens_out"] for r in out))
    return out


def _maybe_cluster(cfg: EvolutionConfig):
    """A Dask cluster only when LLM calls are sharded (--llm-shards > 1) or a scheduler is given: each worker
    process then loads the backend once and answers its shard of the round's calls in parallel."""
    import contextlib

    from tasks.cluster import cluster_security, dask_client

    security = cluster_security(cfg)  # checked on every run: TLS files that do not exist fail before any call
    if cfg.llm_shards > 1 or cfg.dask_address:
        return dask_client(cfg.dask_address, cfg.n_workers, security)
    return contextlib.nullcontext()


def _check_schedule(ledger: PrivacyLedger, name: str, schedule: dict) -> None:
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


def _candidate_digest(frame: pd.DataFrame) -> str:
    h = hashlib.sha256()
    for text, label in zip(frame["text"], frame["label"]):
        h.update(f"{label!r}\x1f{text}\x1e".encode())
    return h.hexdigest()


def _random_prompts(cfg: EvolutionConfig, labels: list, per_class: int, words: list[str] | None,
                    words_per_prompt: int) -> tuple[list[tuple[str | None, str, int]], pd.DataFrame]:
    template = ev.load_pe_template("pe_random_words" if words else "pe_random")
    prompts, rows = [], []
    for ci, label in enumerate(labels):
        for i in range(per_class):
            seed = _call_seed(cfg.seed, "random", str(ci), str(i))
            values = {"doc_type": cfg.doc_type}
            if words:
                pick = public_rng(cfg.seed, "pe-words", str(ci), str(i)).choice(len(words), size=min(words_per_prompt, len(words)), replace=False)
                values["words"] = ", ".join(words[j] for j in pick)
            system, user = template.render(**values)
            prompts.append((system, user, seed))
            rows.append({"label": label, "seed": seed, "prompt_version": template.version, "origin": "random"})
    return prompts, pd.DataFrame(rows)


def _variation_prompts(cfg: EvolutionConfig, kept: pd.DataFrame, round_index: int
                       ) -> tuple[list[tuple[str | None, str, int]], pd.DataFrame]:
    paraphrase, fill = ev.load_pe_template("pe_paraphrase"), ev.load_pe_template("pe_fill_blanks")
    prompts, rows = [], []
    for slot, (text, label) in enumerate(zip(kept["text"], kept["label"])):
        for k in range(cfg.variations):
            use_fill = cfg.variation == "fill-blanks" or (cfg.variation == "mixed" and k % 2 == 1)
            seed = _call_seed(cfg.seed, "variation", str(round_index), str(slot), str(k))
            if use_fill:
                masked = ev.mask_words(text, cfg.mask_fraction, public_rng(cfg.seed, "mask", str(round_index), str(slot), str(k)))
                system, user = fill.render(doc_type=cfg.doc_type, text=masked)
                version = fill.version
            else:
                system, user = paraphrase.render(doc_type=cfg.doc_type, text=text)
                version = paraphrase.version
            prompts.append((system, user, seed))
            rows.append({"label": label, "seed": seed, "prompt_version": version, "origin": f"variation-{round_index}"})
    return prompts, pd.DataFrame(rows)


def _attach(meta: pd.DataFrame, answers: list[dict]) -> pd.DataFrame:
    out = meta.copy().reset_index(drop=True)
    for key in ("text", "tokens_in", "tokens_out", "backend", "model"):
        out[key] = [a[key] for a in answers]
    return out


def _generate(cfg: EvolutionConfig, prompts, meta: pd.DataFrame, desc: str) -> pd.DataFrame:
    # A retry re-reads every finished call from the cache and sends only the rest.
    calls = llm_calls.with_options(retries=cfg.llm_retries, retry_condition_fn=retry_if_transient)
    return _attach(meta, calls(prompts, cfg, desc))


def _log_plan(logger, method: str, cfg: EvolutionConfig, classes: int) -> None:
    plan = ev.evolution_call_plan(classes, cfg.per_class, cfg.variations, cfg.iterations)
    logger.info("%s plan: %d classes x population N=%d, K=%d variations, T=%d rounds -> %d LLM calls "
                "(%d RANDOM_API + %d VARIATION_API) on %s; calls already in the cache are not sent again",
                method, classes, cfg.per_class, cfg.variations, cfg.iterations, plan["total"], plan["random"],
                plan["variation"], cfg.llm)


def _documents(cfg: EvolutionConfig, candidates: pd.DataFrame) -> np.ndarray:
    """Which candidates are documents (tasks.quality.is_document): a failed or degenerate LLM answer ("Lullaby.",
    a prompt echo) would otherwise collect votes and end up in the release, where the gate rejects it."""
    from tasks.quality import DocumentRules, is_document

    rules = DocumentRules(min_words=cfg.min_words, language=cfg.language)
    return np.array([is_document(t, rules=rules) for t in candidates["text"]], dtype=bool)


def _per_class_index(labels: list, values: pd.Series) -> np.ndarray:
    index = {str(label): i for i, label in enumerate(labels)}
    return np.array([index[str(v)] for v in values], dtype=np.int64)


class _RoundClock:
    """Per-round bookkeeping of a PE run. ``rounds`` (written to evolution.json) holds only public counts: the
    round, its candidates and how many of them were not documents. The wall-clock seconds of each round's parts,
    ``llm_s`` (the calls that made the round's candidates), ``embed_s`` and ``histogram_s`` (votes or
    SecretClustering, noise, selection), show whether a round is bounded by the LLM or by the histogram, but the
    histogram step grows with the private corpus size |D|: they go to the operator's log and to
    OPERATOR_TIMINGS in the private state (``save``), never to a released file."""

    def __init__(self) -> None:
        self.rounds: list[dict[str, int]] = []
        self.timings: list[dict[str, float]] = []
        self._current: dict[str, float] = {}
        self._open: tuple[str, float] | None = None

    def start(self, part: str) -> None:
        self._open = (part, time.perf_counter())

    def stop(self) -> None:
        assert self._open is not None
        part, began = self._open
        self._current[part] = self._current.get(part, 0.0) + time.perf_counter() - began
        self._open = None

    @contextlib.contextmanager
    def __call__(self, part: str):
        self.start(part)
        try:
            yield
        finally:
            self.stop()

    def end_round(self, t: int, candidates: int, non_documents: int = 0) -> None:
        self.rounds.append({"round": t, "candidates": candidates, "non_documents": non_documents})
        self.timings.append({"round": t, **{k: round(self._current.get(k, 0.0), 4)
                                            for k in ("llm_s", "embed_s", "histogram_s")}})
        self._current = {}

    def save(self, cfg: EvolutionConfig, logger, method: str) -> None:
        """Timings to the operator: one log line per round and OPERATOR_TIMINGS under the private state."""
        for row in self.timings:
            logger.info("%s round %d timings: llm %.2f s, embed %.2f s, histogram %.2f s", method, row["round"],
                        row["llm_s"], row["embed_s"], row["histogram_s"])
        storage.write_bytes(storage.join(cfg.state_uri, OPERATOR_TIMINGS),
                            (json.dumps({"method": method, "rounds": self.timings}, indent=2) + "\n").encode(),
                            cfg.storage_options)


def _release_frame(final: pd.DataFrame, calls: dict) -> pd.DataFrame:
    out = final[["text", "label"]].copy()
    out["keyphrases"] = [[] for _ in range(len(out))]  # PE seeds no keyphrases
    for col in ("backend", "model", "prompt_version", "seed", "tokens_in", "tokens_out", "origin"):
        out[col] = final[col].values
    out.attrs["llm_calls"] = calls
    return out


def _publish(cfg: EvolutionConfig, synthetic: pd.DataFrame, ledger: PrivacyLedger, labels: list,
             extra: dict[str, Any]) -> dict:
    gate = None
    if cfg.gate:
        from tasks.quality import DocumentRules, release_gate

        gate = release_gate(labels=labels, llm_used=True, rules=DocumentRules(language=cfg.language))
    files = {"evolution.json": (json.dumps(extra, indent=2, sort_keys=True, default=str) + "\n").encode()}
    return publish_release(cfg.out, synthetic, ledger=ledger, config=cfg.public_dict(), gate=gate,
                           extra_files=files, storage_options=cfg.storage_options,
                           allow_insecure=cfg.allow_insecure_release)


# ---------------------------------------------------------------------------------------------------------
# Aug-PE
# ---------------------------------------------------------------------------------------------------------
def augpe_schedule(cfg: AugPeConfig) -> dict:
    """sigma, epsilon, delta for the T voting rounds (public: computed from the configuration only)."""
    delta = cfg.delta if cfg.delta is not None else accounting.default_delta(cfg.n_upper_bound)
    if cfg.noise_multiplier is not None:
        sigma = float(cfg.noise_multiplier)
        epsilon = accounting.augpe_epsilon(sigma, delta, cfg.iterations)
    else:
        epsilon = 4.0 if cfg.epsilon is None else float(cfg.epsilon)
        sigma = accounting.augpe_noise_multiplier(epsilon, delta, cfg.iterations)
    return {"mechanism": "gaussian-nn-histogram", "sigma": sigma, "epsilon": epsilon, "delta": delta,
            "iterations": cfg.iterations, "adjacency": accounting.ADJACENCY, "sensitivity_l2": 1.0,
            "delta_from": "config" if cfg.delta is not None else f"1/(n ln n), n = public bound {cfg.n_upper_bound}",
            "seed": cfg.seed,  # public: LLM call seeds and selection; the noise comes from the mechanism's source
            "per_class": cfg.per_class, "variations": cfg.variations, "selection": cfg.selection,
            "threshold": cfg.threshold, "min_words": cfg.min_words, "accountant": "dp-accounting PLD, add/remove"}


def charge_augpe_schedule(ledger: PrivacyLedger, cfg: AugPeConfig) -> dict:
    """Charge the whole schedule up front: T Gaussian rounds composed by the PLD accountant, each drawn later by
    the same mechanism and recorded as accounted in this charge. A resumed run with another schedule is refused.
    Returns the schedule the rounds draw with."""
    schedule = augpe_schedule(cfg)
    _check_schedule(ledger, "augpe.schedule", schedule)
    ledger.charge("augpe.schedule", mechanism=augpe_round_mechanism(schedule), noise=cfg.noise("augpe"),
                  params=schedule, releases=cfg.iterations, stage="augpe")
    return schedule


def augpe_round_mechanism(schedule: dict):
    """The Gaussian mechanism of every round of the schedule (sensitivity 1, the schedule's sigma)."""
    return ev.vote_mechanism(schedule["sigma"], schedule["epsilon"], schedule["delta"])


def augpe_round_histogram(ledger: PrivacyLedger, cfg: AugPeConfig, schedule: dict, t: int, candidates: pd.DataFrame,
                          syn_emb: np.ndarray, syn_class: np.ndarray, documents: np.ndarray, private_emb: np.ndarray,
                          private_class: np.ndarray) -> np.ndarray:
    """Round t's released histogram: every private document votes for its nearest candidate of its class
    (non-documents take no votes), then the schedule's Gaussian noise, drawn once through the ledger.
    A function of its own so that `privseed audit` runs exactly the round the flow runs."""
    votes = ev.class_votes(private_emb, private_class, syn_emb, np.where(documents, syn_class, -1))
    return ledger.draw_once(
        f"augpe.round-{t:03d}.histogram", mechanism=augpe_round_mechanism(schedule),
        noise=cfg.noise("augpe", f"round-{t}"), stage="augpe", accounted_in="augpe.schedule",
        params={"round": t, "candidates": _candidate_digest(candidates)},
        exact=lambda: votes.astype(np.float64),
    )["noisy"]


def privatized_vocabulary_words(cfg: AugPeConfig, corpus: pd.DataFrame, ledger: PrivacyLedger) -> list[str]:
    """AugPE+V~: DP-KPS's privatized vocabulary, by DP-KPS's own stages (first-S histogram over the shards, then
    ``flows.dpkps.release_vocabulary``: discrete Laplace, scale S / eps_voc, top N), drawn once as ``vocabulary``."""
    from flows.dpkps import corpus_shards, privatize_vocabulary_stage, vocabulary_histogram

    counts = vocabulary_histogram(corpus_shards(corpus, cfg.n_workers), cfg)
    return privatize_vocabulary_stage(counts, cfg, ledger)


@flow(name="augpe", log_prints=True)
def augpe_flow(config: dict[str, Any]) -> dict:
    """Aug-PE / AugPE+V~ end to end; ``config`` is an AugPeConfig as a dict."""
    cfg = validate_config(AugPeConfig, config)  # ConfigError naming the problem (e.g. how to declare labels)
    if cfg.dry_run:  # before the corpus is read and the ledger opens: nothing drawn, charged or sent
        return dry_run_plan(cfg)
    with _maybe_cluster(cfg):
        return _augpe(cfg)


def _augpe(cfg: AugPeConfig) -> dict:
    logger = get_run_logger()
    warn_if_insecure(cfg, logger)
    corpus = load_private_corpus(cfg)
    labels = resolve_labels(cfg, corpus)
    ledger = open_ledger(cfg, corpus)
    schedule = charge_augpe_schedule(ledger, cfg)
    logger.info("Aug-PE: T=%d rounds, sigma=%.4f, epsilon=%.3f, delta=%.3g", cfg.iterations, schedule["sigma"],
                schedule["epsilon"], schedule["delta"])
    _log_plan(logger, "Aug-PE+V~" if cfg.vocab_words else "Aug-PE", cfg, len(labels))
    words = privatized_vocabulary_words(cfg, corpus, ledger) if cfg.vocab_words else None
    private_emb = embed_private(corpus["text"].tolist(), cfg.embedding_model, cfg.progress)
    private_class = _per_class_index(labels, corpus["label"])
    del corpus

    n, k = cfg.per_class, cfg.variations
    prompts, meta = _random_prompts(cfg, labels, n * (k + 1), words, cfg.words_per_prompt)
    clock = _RoundClock()
    with clock("llm_s"):
        candidates = _generate(cfg, prompts, meta, "augpe RANDOM_API")
    calls = {"random": len(prompts), "variation": 0}
    kept = candidates
    for t in range(1, cfg.iterations + 1):
        with clock("embed_s"):
            syn_emb = embed_candidates(candidates["text"].tolist(), cfg.embedding_model)
        syn_class = _per_class_index(labels, candidates["label"])
        documents = _documents(cfg, candidates)
        clock.start("histogram_s")
        noisy = augpe_round_histogram(ledger, cfg, schedule, t, candidates, syn_emb, syn_class, documents,
                                      private_emb, private_class)
        scores = ev.apply_threshold(noisy, cfg.threshold)
        keep_idx = []
        for ci in range(len(labels)):
            idx = np.flatnonzero(syn_class == ci)
            chosen = ev.select_population(scores[idx], n, cfg.selection,
                                          public_rng(cfg.seed, "augpe", f"round-{t}", "select", str(ci)), documents[idx])
            keep_idx.extend(idx[chosen].tolist())
        clock.stop()
        clock.end_round(t, len(candidates), int((~documents).sum()))
        kept = candidates.iloc[keep_idx].reset_index(drop=True)
        if t == cfg.iterations:
            break
        prompts, meta = _variation_prompts(cfg, kept, t)
        calls["variation"] += len(prompts)
        with clock("llm_s"):
            candidates = pd.concat([kept, _generate(cfg, prompts, meta, f"augpe round {t + 1}/{cfg.iterations} VARIATION_API")],
                                   ignore_index=True)
        logger.info("Aug-PE round %d/%d done", t, cfg.iterations)

    synthetic = _release_frame(kept, calls)
    extra = {"method": "augpe+vocab" if cfg.vocab_words else "augpe", "schedule": schedule, "llm_calls": calls,
             "vocabulary_words": len(words) if words else 0, "rounds": clock.rounds}
    clock.save(cfg, logger, "Aug-PE+V~" if cfg.vocab_words else "Aug-PE")
    manifest = _publish(cfg, synthetic, ledger, labels, extra)
    epsilon, delta = ledger.total()
    logger.info("release %s: %d documents, epsilon=%g, delta=%g", manifest["release_id"], manifest["rows"], epsilon, delta)
    log_cumulative_total(ledger)
    return manifest


# ---------------------------------------------------------------------------------------------------------
# SecPE
# ---------------------------------------------------------------------------------------------------------
@task(name="load-public-corpus", retries=2, retry_condition_fn=retry_if_transient,
      retry_delay_seconds=[2, 10], persist_result=False, cache_policy=NO_CACHE)
def load_public_texts(cfg: SecPeConfig) -> list[str]:
    texts: list[str] = []
    for shard in list_shards(cfg.public, cfg.storage_options):
        fs, inner = storage.filesystem(shard, cfg.storage_options)
        with fs.open(inner, "rb") as handle:
            frame = pd.read_parquet(handle, columns=[cfg.public_text_column])
        texts.extend(frame[cfg.public_text_column].dropna().astype(str).tolist())
    if not texts:
        raise CorpusError(f"the public corpus at {cfg.public!r} has no text")
    return texts


@task(name="detect-secrets", persist_result=False, cache_policy=NO_CACHE)
def detect_secrets(cfg: SecPeConfig, texts: list[str]):
    """(documents x secrets) incidence. The secret *list* is public for words/FILE; PII values are private and
    never leave this task except as the incidence matrix used by the LP."""
    if cfg.secrets == "words":
        import wordfreq

        public_words = wordfreq.top_n_list("en", cfg.secret_vocab_top)  # public, frequency-ranked
        secrets = ev.quantile_secret_words(public_words, cfg.secret_quantile, cfg.secret_count)
        return ev.word_secret_incidence(texts, secrets), "words"
    if cfg.secrets == "pii":
        incidence, _types = ev.pii_secret_incidence(texts)
        return incidence, "pii"
    path = cfg.secrets
    if not storage.exists(path, cfg.storage_options):
        raise ConfigError(f"--secrets {path!r}: expected 'words', 'pii' or an existing file of secret terms")
    terms = storage.read_bytes(path, cfg.storage_options).decode("utf-8").splitlines()
    return ev.file_secret_incidence(texts, [t for t in terms if t.strip()]), "file"


@dataclass(frozen=True)
class SecPeNoise:
    """SecretNoise's outcome. ``rho`` and ``worst_blow_up`` are functions of the private secret incidence: they
    stay in memory (neither is logged or written). ``protection`` holds only values of the public configuration and is
    what the ledger and evolution.json publish. ``sigma`` is public when fixed by --noise-multiplier; calibrated,
    it depends on the incidence too (SecPE's Algorithm 1), and the ledger shows it (docs/baselines.md)."""

    sigma: float
    rho: np.ndarray
    worst_blow_up: float
    protection: dict


def secpe_noise(cfg: SecPeConfig, incidence) -> SecPeNoise:
    """SecretNoise: LP weights -> rho -> sigma, calibrated on the blow-up of the round's joint (sizes, centres)
    mechanism (one Bernoulli draw drives both: a sampled holder shifts it by sqrt(2)) composed T times."""
    r = min(1.0, cfg.p * cfg.r_over_p)
    if r < 1.0:
        eta: float | None = accounting.gdp_mu_for_secret(cfg.p, r)
        weights = ev.secret_weights_lp(incidence, eta)
    else:
        # r = 1 asks for no protection: no capacity constraint, every document weighs 1. (The capacity is not
        # replaced by a number such as |D|: nothing released may depend on the corpus size.)
        eta = None
        weights = np.ones(incidence.shape[0])
    rho = ev.sampling_probabilities(weights, cfg.rho_norm)
    holders = ev.holder_probabilities(incidence, rho)
    if cfg.noise_multiplier is not None:
        sigma = float(cfg.noise_multiplier)
        worst = max((accounting.secret_blow_up(sigma, h, cfg.p, cfg.iterations, cfg.value_discretization)
                     for h in holders), default=cfg.p)
        if worst > r:
            # The exact bound is a function of the private secret incidence: it is not put in the message.
            raise ConfigError(f"--noise-multiplier {sigma:g} gives a reconstruction bound above r = {r:.3g} for at "
                              "least one detected secret; raise it, or leave it out to calibrate sigma")
    else:
        cal = accounting.calibrate_secret_sigma(holders, cfg.p, r, cfg.iterations, cfg.value_discretization)
        sigma, worst = cal.sigma, float(cal.blow_ups.max(initial=cfg.p))
    protection = {
        "p": cfg.p, "r": r, "eta": eta if eta is not None else "none (r = 1: no capacity constraint)",
        "rounds": cfg.iterations, "holder_shift_l2": accounting.SECPE_HOLDER_SHIFT,
        "adjacency": accounting.SECPE_ADJACENCY,
        "calibration": "B(p) <= r for every detected secret, B the blow-up of sum_k P(S=k) N(sqrt(2) k, sigma^2) vs "
                       "N(0, sigma^2) composed T times (dp-accounting PLD, pessimistic, value_discretization_interval "
                       f"{cfg.value_discretization:g})",
        "sigma_source": "config (public)" if cfg.noise_multiplier is not None
        else "calibrated on the private secret incidence"}
    return SecPeNoise(float(sigma), rho, float(worst), protection)


def charge_secpe_schedule(ledger: PrivacyLedger, cfg: SecPeConfig, secret_noise: SecPeNoise
                          ) -> tuple[dict, GaussianMechanism]:
    """Charge the per-document DP epsilon of the T rounds up front and return the schedule and the round
    mechanism. One document moves its round's normalised (sizes, centres) vector by at most sqrt(2): T Gaussian
    rounds. This treats rho and sigma as fixed; a calibrated sigma is computed from the private secret incidence,
    as in the paper (see docs/baselines.md)."""
    sigma = secret_noise.sigma
    delta = cfg.delta if cfg.delta is not None else accounting.default_delta(cfg.n_upper_bound)
    dp_epsilon = accounting.secpe_dp_epsilon(sigma, delta, cfg.iterations)
    # One Gaussian mechanism per round and class: sizes and centres (in noise units) as one vector.
    mechanism = GaussianMechanism(sensitivity=accounting.SECPE_HOLDER_SHIFT, sigma=sigma, epsilon=dp_epsilon,
                                  delta=delta)
    schedule = {"mechanism": "secret-clustering", "sigma": sigma, "iterations": cfg.iterations,
                "adjacency": accounting.ADJACENCY, "seed": cfg.seed, "clusters": cfg.clusters, "radius": cfg.radius,
                "centre_noise_scale": "(R + max(R, ||e_k||)) / n_k", "rho_norm": cfg.rho_norm,
                "per_class": cfg.per_class, "variations": cfg.variations, "min_words": cfg.min_words,
                "secret_protection": secret_noise.protection, "dp_epsilon_if_rho_sigma_fixed": dp_epsilon,
                "delta": delta}
    _check_schedule(ledger, "secpe.schedule", schedule)
    ledger.charge("secpe.schedule", mechanism=mechanism, noise=cfg.noise("secpe"), params=schedule,
                  releases=cfg.iterations, stage="secpe")
    return schedule, mechanism


def secpe_round_release(ledger: PrivacyLedger, cfg: SecPeConfig, mechanism: GaussianMechanism, t: int, ci: int,
                        label: Any, clusters: ev.PublicClusters, scales: np.ndarray, private_emb: np.ndarray,
                        rho: np.ndarray) -> dict[str, np.ndarray]:
    """Round t's released noisy centres and sizes of class ``ci``: the Bernoulli-sampled joint statistics of that
    class's documents through the round mechanism, drawn once through the ledger. Noise and sub-sampling are secret
    (OS entropy, cfg.noise); --insecure-reproducible-noise (research only, stamped and refused by the gate) is the
    one way to derive them from --seed.
    A function of its own so that `privseed audit` runs exactly the flow's round."""
    stream = ("secpe", f"round-{t}", f"class-{ci}")
    return ledger.draw_once(
        f"secpe.round-{t:03d}.class-{ci}", mechanism=mechanism, noise=cfg.noise(*stream, "noise"), stage="secpe",
        partition=str(label),
        params={"round": t, "class": str(label), "K": int(clusters.sizes.size), "radius": cfg.radius,
                "joint": "sizes, then centres / c_k row by row"},
        exact=lambda: ev.sampled_joint_statistics(clusters, private_emb, rho, radius=cfg.radius,
                                                  sampling=cfg.noise(*stream, "sample")),
        postprocess=lambda z: dict(zip(("centres", "sizes"), ev.split_joint_statistics(z, scales))),
        accounted_in="secpe.schedule",
    )


@flow(name="secpe", log_prints=True)
def secpe_flow(config: dict[str, Any]) -> dict:
    """SecPE end to end; ``config`` is a SecPeConfig as a dict."""
    cfg = validate_config(SecPeConfig, config)  # ConfigError naming the problem (e.g. how to declare labels)
    if cfg.dry_run:  # before the corpus is read and the ledger opens: nothing drawn, charged or sent
        return dry_run_plan(cfg)
    with _maybe_cluster(cfg):
        return _secpe(cfg)


def _secpe(cfg: SecPeConfig) -> dict:
    logger = get_run_logger()
    corpus = load_private_corpus(cfg)
    labels = resolve_labels(cfg, corpus)
    ledger = open_ledger(cfg, corpus)
    incidence, _kind = detect_secrets(cfg, corpus["text"].tolist())
    secret_noise = secpe_noise(cfg, incidence)
    sigma, rho = secret_noise.sigma, secret_noise.rho
    if sigma <= 0:
        raise ConfigError("SecPE found no secret to protect (sigma = 0): no noise would be added; "
                          "choose other secrets or fix --noise-multiplier")
    schedule, mechanism = charge_secpe_schedule(ledger, cfg, secret_noise)
    # The bound actually reached (SecPeNoise.worst_blow_up) depends on the private secret incidence: not logged.
    logger.info("SecPE: T=%d, sigma=%.4f, p=%g, r=%g (B(p) <= r checked for every detected secret)",
                cfg.iterations, sigma, cfg.p, secret_noise.protection["r"])
    _log_plan(logger, "SecPE", cfg, len(labels))

    public_emb = embed_candidates(load_public_texts(cfg), cfg.embedding_model, cfg.progress)
    clusters = ev.public_kmeans(public_emb, min(cfg.clusters, public_emb.shape[0]), cfg.seed)
    scales = ev.centre_noise_scales(clusters, cfg.radius)  # public: from the public clusters and R
    private_emb = embed_private(corpus["text"].tolist(), cfg.embedding_model, cfg.progress)
    private_class = _per_class_index(labels, corpus["label"])
    del corpus

    n, k = cfg.per_class, cfg.variations
    prompts, meta = _random_prompts(cfg, labels, n * (k + 1), None, 0)
    clock = _RoundClock()
    with clock("llm_s"):
        candidates = _generate(cfg, prompts, meta, "secpe RANDOM_API")
    calls = {"random": len(prompts), "variation": 0}
    kept = candidates
    for t in range(1, cfg.iterations + 1):
        with clock("embed_s"):
            syn_emb = embed_candidates(candidates["text"].tolist(), cfg.embedding_model)
        syn_class = _per_class_index(labels, candidates["label"])
        documents = _documents(cfg, candidates)
        clock.start("histogram_s")  # SecretClustering + cluster votes + selection: SecPE's histogram step
        keep_idx = []
        for ci, label in enumerate(labels):
            members = private_class == ci
            released = secpe_round_release(ledger, cfg, mechanism, t, ci, label, clusters, scales,
                                           private_emb[members], rho[members])
            idx = np.flatnonzero(syn_class == ci)
            voted = documents[idx] if documents[idx].any() else np.ones(idx.size, dtype=bool)
            hist = np.zeros(idx.size)
            hist[voted] = ev.cluster_votes(released["centres"], released["sizes"], syn_emb[idx[voted]], radius=cfg.radius)
            chosen = ev.select_population(hist, n, "rank", public_rng(cfg.seed, "secpe", f"round-{t}", str(ci)),
                                          documents[idx])
            keep_idx.extend(idx[chosen].tolist())
        clock.stop()
        clock.end_round(t, len(candidates), int((~documents).sum()))
        kept = candidates.iloc[keep_idx].reset_index(drop=True)
        if t == cfg.iterations:
            break
        prompts, meta = _variation_prompts(cfg, kept, t)
        calls["variation"] += len(prompts)
        with clock("llm_s"):
            candidates = pd.concat([kept, _generate(cfg, prompts, meta, f"secpe round {t + 1}/{cfg.iterations} VARIATION_API")],
                                   ignore_index=True)
        logger.info("SecPE round %d/%d done", t, cfg.iterations)

    synthetic = _release_frame(kept, calls)
    extra = {"method": "secpe", "schedule": schedule, "llm_calls": calls, "rounds": clock.rounds,
             "guarantee": "(p, r)-secret protection for the detected secrets (SecPE Theorem 2); the reported DP "
                          "epsilon holds per document if rho and sigma are treated as fixed (docs/baselines.md)"}
    clock.save(cfg, logger, "SecPE")
    manifest = _publish(cfg, synthetic, ledger, labels, extra)
    logger.info("release %s: %d documents", manifest["release_id"], manifest["rows"])
    return manifest


# ---------------------------------------------------------------------------------------------------------
# Entry points for `privseed experiment` and the CLI
# ---------------------------------------------------------------------------------------------------------
def run_augpe(config: dict[str, Any]) -> str:
    """Run Aug-PE (or AugPE+V~ with ``vocab_words=True``) from a config dict; returns the release path."""
    cfg = validate_config(AugPeConfig, config)
    augpe_flow(cfg.model_dump())
    return cfg.out


def run_secpe(config: dict[str, Any]) -> str:
    """Run SecPE from a config dict; returns the release path."""
    cfg = validate_config(SecPeConfig, config)
    secpe_flow(cfg.model_dump())
    return cfg.out


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """``privseed augpe`` and ``privseed secpe``: every flag comes from AugPeConfig / SecPeConfig (tasks/config.py)."""
    from tasks.config import add_config_arguments

    p = subparsers.add_parser("augpe", help="Aug-PE baseline (add --vocab-words for AugPE+V~)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(p, AugPeConfig)
    p.set_defaults(func=lambda args: _run_cli(AugPeConfig, augpe_flow, args))

    s = subparsers.add_parser("secpe", help="SecPE baseline: (p, r)-secret protection with secret clustering",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(s, SecPeConfig)
    s.set_defaults(func=lambda args: _run_cli(SecPeConfig, secpe_flow, args))


def estimate_evolution(cfg: EvolutionConfig, labels: list):
    """``--dry-run``: the LLM calls a run would send and what they would cost, from public settings only (the
    label set and the configuration). RANDOM_API prompts are rendered as they will be sent (AugPE+V~'s words by
    placeholders of the same shape: V~ is not drawn); every VARIATION_API prompt is bounded by its template around
    a text of max_tokens tokens. Output tokens are bounded by max_tokens per call. Nothing is sent, drawn or
    charged; calls already in the run's cache are counted as cached."""
    from tasks.generation import estimate_cost, spec_from_config
    from tasks.llm import CallCache

    words = ["placeholder"] * 50 if getattr(cfg, "vocab_words", False) else None
    prompts, _ = _random_prompts(cfg, labels, cfg.per_class * (cfg.variations + 1), words,
                                 getattr(cfg, "words_per_prompt", 0))
    longest = pd.DataFrame({"text": [" ".join(["word"] * cfg.max_tokens)] * (len(labels) * cfg.per_class),
                            "label": [label for label in labels for _ in range(cfg.per_class)]})
    for t in range(1, cfg.iterations):
        prompts += _variation_prompts(cfg, longest, t)[0]
    cache = CallCache(storage.join(cfg.state_uri, "llm-cache"), cfg.storage_options)
    return estimate_cost(spec_from_config(cfg), _chat_requests(prompts, cfg), cache)


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
    else:
        lines.append("  schedule: sigma is calibrated on the private secret incidence when the run starts")
    estimate = estimate_evolution(cfg, labels)
    result.update(estimate=estimate.describe(), calls=estimate.calls, usd=estimate.usd, tokens_in=estimate.tokens_in,
                  tokens_out_max=estimate.tokens_out_max)
    lines += [f"  {cfg.llm}: {estimate.describe()}", "  nothing was sent, drawn or charged"]
    result["lines"] = lines
    for line in lines:
        log.info("%s", line)
    return result


def _run_cli(model, flow_fn, args: argparse.Namespace) -> int:
    from tasks.config import config_from_args

    cfg = config_from_args(model, args)
    manifest = flow_fn(cfg.model_dump())
    if manifest.get("dry_run"):
        print("\n".join(manifest["lines"]))
        return 0
    print(f"release {manifest['release_id']}: {manifest['rows']} synthetic documents")
    print(f"  synthetic corpus: {storage.join(cfg.out, 'synthetic')}")
    epsilon, delta = manifest["privacy"]["epsilon"], manifest["privacy"]["delta"]
    if isinstance(cfg, SecPeConfig):
        # SecPE's guarantee is (p, r)-secret protection; its DP epsilon is conditional (docs/baselines.md).
        r = min(1.0, cfg.p * cfg.r_over_p)
        guarantee = (f"(p, r) = ({cfg.p:g}, {r:g}) secret protection for the detected secrets; DP epsilon={epsilon:g}, "
                     f"delta={delta:g} only if rho and sigma are taken as fixed")
    else:
        guarantee = f"epsilon={epsilon:g}, delta={delta:g}"
    print(f"  ledger:           {storage.join(cfg.out, 'ledger.json')}  ({guarantee})")
    print(f"  manifest:         {storage.join(cfg.out, 'manifest.json')}")
    return 0
