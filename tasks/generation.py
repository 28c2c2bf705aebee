"""DP-KPS step 7: one LLM prompt per released keyphrase sequence (post-processing, no privacy cost).

Pure parts (no I/O): ``candidate_seed``, ``build_generation_requests``, ``select_best``, ``assemble_rows``,
``no_llm_rows``, ``estimate_cost``. I/O part: ``generate_shard`` (backend + call cache + progress bar) and its
Prefect task ``generate_shard_task``, mapped over shards of seeds by ``generate_documents`` (Dask workers when
the flow runs on a DaskTaskRunner; each worker process loads the local model once, see tasks.llm.get_backend).

Privacy: the inputs are ``ReleasedSeed`` objects (terms of the released vocabulary V~, sampled from released
DP-KDEs), recipient few-shot examples and public configuration. Nothing here reads the private corpus, and
logs carry counts only.

Best-of-k (``best_of``): k candidates per seed, each a separate call with its own derived seed; the one that
covers the most seed terms is kept (ties: the lowest candidate index). Ranking uses only the released seed and
the synthetic candidates, so it costs no privacy. Token counts in a row are the sum over all k candidates
(what the run actually spent).
"""
from __future__ import annotations

import hashlib
import logging
import math
import threading
from dataclasses import dataclass, field
from typing import Sequence

import pandas as pd

from tasks.errors import ConfigError
from tasks.llm import LLMSpec, get_backend, parse_llm_spec
from tasks.llm.base import ChatRequest, ChatResult, LLMBackend
from tasks.llm.cache import CallCache, cached_complete
from tasks.llm.prompting import PromptTemplate, build_request, term_coverage
from tasks.llm.released import RecipientExample, ReleasedSeed

log = logging.getLogger("privseed.generation")

ROW_COLUMNS = ["text", "label", "keyphrases", "backend", "model", "prompt_version", "seed", "tokens_in",
               "tokens_out", "coverage", "candidates"]


@dataclass(frozen=True)
class GenerationParams:
    """Public generation settings. ``template`` is a packaged template name or a YAML path."""

    doc_type: str = "document"
    template: str = "generic"
    max_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 1.0
    best_of: int = 1
    few_shot: tuple[RecipientExample, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.best_of < 1:
            raise ConfigError(f"best_of must be >= 1, got {self.best_of}")
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")


def candidate_seed(seed: int, j: int) -> int:
    """Call seed of candidate j of a prompt seed: candidate 0 uses the seed itself, others a hash of (seed, j),
    kept in [0, 2^31) for llama.cpp and OpenAI-compatible servers."""
    if j == 0:
        return int(seed) & 0x7FFFFFFF
    return int.from_bytes(hashlib.sha256(f"{int(seed)}:{j}".encode()).digest()[:4], "big") & 0x7FFFFFFF


def build_generation_requests(seeds: Sequence[ReleasedSeed], template: PromptTemplate,
                              params: GenerationParams) -> list[list[ChatRequest]]:
    """k requests per seed (pure)."""
    return [[build_request(template, s, params.doc_type, max_tokens=params.max_tokens,
                           temperature=params.temperature, top_p=params.top_p, call_seed=candidate_seed(s.seed, j),
                           few_shot=params.few_shot) for j in range(params.best_of)] for s in seeds]


def select_best(seed: ReleasedSeed, candidates: Sequence[ChatResult]) -> tuple[int, float]:
    """Index and coverage of the candidate covering the most seed terms (ties: lowest index)."""
    covs = [term_coverage(c.text, seed.keyphrases) for c in candidates]
    best = max(range(len(covs)), key=lambda i: (covs[i], -i))
    return best, covs[best]


def assemble_rows(seeds: Sequence[ReleasedSeed], candidates: Sequence[Sequence[ChatResult]], *, backend: str,
                  model: str, prompt_version: str) -> pd.DataFrame:
    rows = []
    for s, cands in zip(seeds, candidates):
        best, cov = select_best(s, cands)
        rows.append({"text": cands[best].text, "label": s.label, "keyphrases": list(s.keyphrases),
                     "backend": backend, "model": model, "prompt_version": prompt_version, "seed": s.seed,
                     "tokens_in": sum(c.tokens_in for c in cands), "tokens_out": sum(c.tokens_out for c in cands),
                     "coverage": cov, "candidates": len(cands)})
    return pd.DataFrame(rows, columns=ROW_COLUMNS)


def no_llm_rows(seeds: Sequence[ReleasedSeed]) -> pd.DataFrame:
    """``--llm none`` (the paper's no-LLM ablation): the keyphrase sequence itself is the document."""
    return assemble_rows(seeds, [[ChatResult(" ".join(s.keyphrases), 0, 0)] for s in seeds], backend="none",
                         model="", prompt_version="none")


# -- cost ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CostEstimate:
    calls: int
    cached_calls: int
    tokens_in: int
    tokens_out_max: int
    usd: float | None  # None: price unknown for this backend/model

    def describe(self) -> str:
        cost = "unknown (no price for this model)" if self.usd is None else f"at most ${self.usd:,.4f}"
        return (f"{self.calls} LLM calls ({self.cached_calls} already cached, {self.calls - self.cached_calls} to "
                f"send), ~{self.tokens_in:,} input tokens, at most {self.tokens_out_max:,} output tokens, cost {cost}")


def _prices(spec: LLMSpec, n_calls: int) -> tuple[float, float] | None:
    if spec.kind == "local":
        return 0.0, 0.0
    opts = dict(spec.options)
    if spec.kind == "anthropic":
        from tasks.llm.anthropic_backend import BATCH_DISCOUNT, anthropic_price

        p = anthropic_price(spec.model or "")
        if p is None:
            return None
        batched = opts.get("use_batches")
        if batched is None:
            batched = n_calls >= int(opts.get("batch_threshold", 200))
        f = BATCH_DISCOUNT if batched else 1.0
        return p[0] * f, p[1] * f
    if opts.get("price_in_per_mtok") is not None and opts.get("price_out_per_mtok") is not None:
        return float(opts["price_in_per_mtok"]), float(opts["price_out_per_mtok"])
    return None


def estimate_cost(spec: LLMSpec, requests: Sequence[ChatRequest], cache: CallCache | None = None,
                  backend: LLMBackend | None = None) -> CostEstimate:
    """Upper-bound estimate before sending anything: output tokens at max_tokens for every uncached call;
    input tokens from the local tokenizer when a backend is given, else ~4 characters per token."""
    def n_in(r: ChatRequest) -> int:
        text = "\n".join(m.content for m in r.messages)
        return backend.count_tokens(text) if backend is not None else max(1, len(text) // 4)

    model_id = backend.model if backend is not None else (spec.model or "")
    kind = backend.name if backend is not None else spec.kind
    cached = [cache is not None and cache.get(r.cache_key(kind, model_id)) is not None for r in requests]
    todo = [r for r, c in zip(requests, cached) if not c]
    t_in = sum(n_in(r) for r in todo)
    t_out = sum(r.max_tokens for r in todo)
    p = _prices(spec, len(todo))
    usd = None if p is None else (t_in * p[0] + t_out * p[1]) / 1e6
    return CostEstimate(len(requests), sum(cached), t_in, t_out, usd)


# -- I/O -------------------------------------------------------------------------------------------------------
class _Progress:
    """tqdm bar: calls done, tokens in/out, cost so far (thread-safe)."""

    def __init__(self, total: int, prices: tuple[float, float] | None, desc: str, enabled: bool):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc=desc, unit="call", disable=not enabled, leave=False)
        self.prices = prices
        self.tokens_in = self.tokens_out = self.cached = 0
        self.lock = threading.Lock()

    def __call__(self, r: ChatResult) -> None:
        with self.lock:
            self.tokens_in += r.tokens_in
            self.tokens_out += r.tokens_out
            self.cached += int(r.cached)
            post = {"in": self.tokens_in, "out": self.tokens_out, "cached": self.cached}
            if self.prices is not None:
                post["usd"] = f"{(self.tokens_in * self.prices[0] + self.tokens_out * self.prices[1]) / 1e6:.4f}"
            self.bar.set_postfix(post, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def generate_shard(seeds: Sequence[ReleasedSeed], spec: LLMSpec | str, params: GenerationParams,
                   cache_uri: str | None, storage_options: dict | None = None, progress: bool = True,
                   shard: int = 0) -> pd.DataFrame:
    """Write one document per seed. Every call goes through the call cache, so re-running a crashed shard
    sends only the calls that never finished."""
    spec = parse_llm_spec(spec) if isinstance(spec, str) else spec
    if spec.kind == "none":
        return no_llm_rows(seeds)
    template = PromptTemplate.load(params.template)
    requests = build_generation_requests(seeds, template, params)
    flat = [r for per_seed in requests for r in per_seed]
    backend = get_backend(spec)
    cache = CallCache(cache_uri, storage_options) if cache_uri else None
    bar = _Progress(len(flat), _prices(spec, len(flat)), f"generate[{shard}] {spec.kind}", progress)
    try:
        results = cached_complete(backend, flat, cache, on_result=bar)
    finally:
        bar.close()
    k = params.best_of
    per_seed = [results[i * k:(i + 1) * k] for i in range(len(seeds))]
    df = assemble_rows(seeds, per_seed, backend=backend.name, model=backend.model,
                       prompt_version=template.version)
    log.info("shard %d: %d documents, %d calls (%d cached), %d input / %d output tokens", shard, len(df),
             len(flat), bar.cached, bar.tokens_in, bar.tokens_out)
    return df


def shard_seeds(seeds: Sequence[ReleasedSeed], n_shards: int) -> list[list[ReleasedSeed]]:
    n_shards = max(1, min(int(n_shards), len(seeds))) if seeds else 1
    size = math.ceil(len(seeds) / n_shards) if seeds else 0
    return [list(seeds[i:i + size]) for i in range(0, len(seeds), size)] if seeds else [[]]


def _shard_task():
    from prefect import task
    from prefect.cache_policies import NO_CACHE

    # Our own call cache makes the task idempotent; Prefect's input hashing is not needed (and the seeds are
    # large). Retries re-run the shard, which re-sends only the calls missing from the cache.
    return task(generate_shard, name="generate-shard", retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE)


generate_shard_task = _shard_task()


def generate_documents(seeds: Sequence[ReleasedSeed], spec: LLMSpec | str, params: GenerationParams,
                       cache_uri: str | None, storage_options: dict | None = None, n_shards: int = 2,
                       progress: bool = True) -> pd.DataFrame:
    """Inside a flow: map ``generate_shard_task`` over shards (the flow's task runner decides where they run,
    e.g. Dask workers). Message Batches want one big submission, so a batching Anthropic run is one shard."""
    spec = parse_llm_spec(spec) if isinstance(spec, str) else spec
    if spec.kind == "none":
        return no_llm_rows(seeds)
    n_calls = len(seeds) * params.best_of
    if spec.kind == "anthropic":
        opts = dict(spec.options)
        batched = opts.get("use_batches")
        if batched or (batched is None and n_calls >= int(opts.get("batch_threshold", 200))):
            n_shards = 1
    shards = shard_seeds(seeds, n_shards)
    futures = [generate_shard_task.submit(sh, spec, params, cache_uri, storage_options, progress, i)
               for i, sh in enumerate(shards)]
    frames = [f.result() for f in futures]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=ROW_COLUMNS)
