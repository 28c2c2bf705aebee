"""The drivers of a generation: the rounds (``rounds.py``) sent to a backend through the call cache, with a progress
bar, on Dask workers over shards of seeds (each worker process loads a local model once, see
``privseed.tasks.llm.get_backend``), and their rows (``rows.py``) returned or written.

- ``generate_shard``: one shard's documents, in this process (the unit every driver runs).
- ``generate_seeds``: one document per seed, as a frame (callers that keep the documents in memory: evaluation
  baselines, benchmarks, the dry run's test).
- ``generate_release_parts``: a release written by the shards themselves (``generate_part``: each shard writes and
  gate-checks one part; the driver gathers descriptors only, for ``privseed.tasks.data.corpus.publish_release``).
  A batching Anthropic run first submits all its Message Batches at once (``fill_cache``).
- ``generate_unseeded``: the only-LLM baseline's prompts, with the same predicate and regeneration policy.
- ``seeds_from_sequences``: the prompt seeds minted from the sampler's output; ``calibrate_local_speed``: a local
  model's decoding time for the dry run.

Either way the call cache is listed once per generation. The Prefect tasks that run these from a command's
configuration are in ``privseed.tasks.stages.generation``.

Privacy: the inputs are ``ReleasedSeed`` objects (terms of the released vocabulary V~, sampled from released
DP-KDEs or histograms), recipient few-shot examples and public configuration. Nothing here reads the private
corpus, and logs carry counts only.

Seed steering (``steer``, local llama.cpp only): see tasks/llm/steering.py. Unseeded prompts take the same path to
the backend (``llm_spec``: concurrency, the API key's Secret block, batch state; the call cache; the progress bar),
from a template without seed terms, and their answers meet the same predicate and regeneration policy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import pandas as pd

from privseed.tasks.data.cluster import current_client, map_shards, shard_events
from privseed.tasks.data.corpus import ReleasePart, StagedRelease, new_release_id, write_part
from privseed.tasks.dp.ledger import public_rng
from privseed.tasks.errors import ConfigError
from privseed.tasks.generation.class_fit import SeedClasses, seed_classes
from privseed.tasks.generation.params import GenerationParams, document_rules
from privseed.tasks.generation.rounds import (OnSettled, candidate_request, candidate_rounds, candidate_seed, cleaned,
                                              seeded_rounds)
from privseed.tasks.generation.rows import (ROW_COLUMNS, assemble_rows, merge_generation_reports, no_llm_rows,
                                            split_documents, unseeded_rows)
from privseed.tasks.llm.base import ChatRequest, ChatResult, LLMBackend, OnEach
from privseed.tasks.llm.cache import CacheIndex, CallCache
from privseed.tasks.llm.cost import LocalSpeed
from privseed.tasks.llm.progress import CallProgress, ShardProgress, call_messages, settle_messages
from privseed.tasks.llm.prompting import PromptTemplate, build_unseeded_request
from privseed.tasks.llm.released import ReleasedSeed, ReleasedVocabulary
from privseed.tasks.llm.service import (LLMSpec, as_spec, call_prices, close_backend, complete, get_backend, kind_of,
                                        serving)
from privseed.tasks.quality import ReleaseGate, document_rejection, rewrite_score

log = logging.getLogger("privseed.generation")


def generate_shard(seeds: Sequence[ReleasedSeed], spec: LLMSpec | str, params: GenerationParams,
                   cache_uri: str | None, storage_options: dict | None = None, progress: bool = True,
                   shard: int = 0, cache_index: CacheIndex | None = None,
                   on_call: Callable[[ChatResult], None] | None = None,
                   on_settled: OnSettled | None = None, classes: SeedClasses | None = None) -> pd.DataFrame:
    """Write one document per seed. Every call goes through the call cache, so re-running a crashed shard
    sends only the calls that never finished. ``classes``: the generation's judge of class fit, built by the
    driver from all its seeds (``seed_classes``); None builds it from this shard's seeds when
    ``params.rewrite_off_class`` is on. ``cache_index``: the generation's listing of the cache (then
    only its hits are read); None lists the cache here when that is cheaper than probing. ``on_call``: told of
    every finished call, ``on_settled`` of every seed settled (a driver's progress bar, :func:`call_messages`,
    :func:`settle_messages`)."""
    spec = as_spec(spec)
    if not kind_of(spec).writes_text:
        return no_llm_rows(seeds)
    template = PromptTemplate.load(params.template)
    backend = get_backend(spec)
    cache = CallCache(cache_uri, storage_options, index=cache_index) if cache_uri else None
    n_first = len(seeds) * params.best_of
    bar = CallProgress(len(seeds), call_prices(spec, n_first), f"generate[{shard}] {spec.kind}", progress, unit="doc")
    k = params.best_of
    rules = document_rules(params)
    if classes is None:
        classes = seed_classes(seeds, params.rewrite_off_class)
    per_seed: list[list[ChatResult]] = [[] for _ in seeds]

    def on_result(result: ChatResult) -> None:
        bar(result)
        if on_call is not None:
            on_call(result)

    def settled(i: int, kept: bool) -> None:
        bar.on_settled(i, kept)
        if on_settled is not None:
            on_settled(i, kept)

    def send(requests: list[ChatRequest], owners: list[int], on_each: OnEach) -> None:
        for i, result in zip(owners, complete(spec, requests, cache, on_result=on_result, on_each=on_each)):
            per_seed[i].append(result)

    try:
        seeded_rounds(seeds, template, params, spec.kind, send, rules, settled, classes)
    finally:
        bar.close()
    df = assemble_rows(seeds, per_seed, backend=backend.name, model=backend.model,
                       prompt_version=template.version_for(params.class_names is not None), first_round=k,
                       rules=rules, unnamed_version=template.version, classes=classes)
    log.info("shard %d: %d documents, %d calls (%d cached), %d input / %d output tokens", shard, len(df),
             sum(len(c) for c in per_seed), bar.cached, bar.tokens_in, bar.tokens_out)
    return df


def shard_seeds(seeds: Sequence[ReleasedSeed], shard_size: int) -> list[list[ReleasedSeed]]:
    size = max(1, int(shard_size))
    return [list(seeds[i:i + size]) for i in range(0, len(seeds), size)]


def _batched(spec: LLMSpec, n_calls: int) -> bool:
    """Whether a run of ``n_calls`` goes through a batch API (the kind's own rule)."""
    return kind_of(spec).batches(spec, n_calls)


def _listed_cache(cache_uri: str | None, storage_options: dict | None) -> CacheIndex | None:
    """The generation's one listing of the call cache (None without a cache)."""
    return CallCache(cache_uri, storage_options).list_index() if cache_uri else None


def generate_seeds(seeds: Sequence[ReleasedSeed], spec: LLMSpec | str, params: GenerationParams,
                   cache_uri: str | None, storage_options: dict | None = None, shard_size: int = 16,
                   progress: bool = True, pool: SeedClasses | None = None) -> pd.DataFrame:
    """One document per seed, as a frame (callers that keep the documents in memory: evaluation baselines,
    benchmarks; a release is written by :func:`generate_release_parts`). With a Dask client (the flow's),
    shards of ``shard_size`` seeds run on the workers, each worker process keeping its model loaded, and one
    progress bar here over the documents moves as each seed is settled (``ShardProgress``); without one,
    everything runs in this process with the same bar. Rows come back in seed order. The call cache is listed
    once, here, and every shard reads only its hits. A batching Anthropic run is one shard: Message Batches want
    one big submission. ``pool``: the judge of class fit from the pool the seeds were kept from (``seed_classes``)."""
    spec = as_spec(spec)
    if not kind_of(spec).writes_text:
        return no_llm_rows(seeds)
    if not seeds:
        return pd.DataFrame(columns=ROW_COLUMNS)
    with serving(spec) as served:
        return _generate_seeds(seeds, served, params, cache_uri, storage_options, shard_size, progress, pool)


def _generate_seeds(seeds: Sequence[ReleasedSeed], spec: LLMSpec, params: GenerationParams, cache_uri: str | None,
                    storage_options: dict | None, shard_size: int, progress: bool,
                    pool: SeedClasses | None) -> pd.DataFrame:
    n_calls = len(seeds) * params.best_of
    if _batched(spec, n_calls):
        shard_size = len(seeds)
    client = current_client()
    shards = shard_seeds(seeds, shard_size)
    index = _listed_cache(cache_uri, storage_options)
    classes = seed_classes(seeds, params.rewrite_off_class, pool)
    if client is None or len(shards) == 1:
        try:
            frames = [generate_shard(sh, spec, params, cache_uri, storage_options, progress, i, index,
                                     classes=classes)
                      for i, sh in enumerate(shards)]
        finally:
            # Generation is over in this process: free a local model now rather than at interpreter
            # teardown (workers keep theirs for their next shard and free them when they exit).
            close_backend(spec)
        return pd.concat(frames, ignore_index=True)
    bar = CallProgress(len(seeds), call_prices(spec, n_calls), f"generate {spec.kind}", progress, unit="doc")
    calls = ShardProgress(bar, [len(shard) for shard in shards])

    def advance(i: int, df: pd.DataFrame) -> None:
        calls.finished(i, int(df["candidates"].sum()), int(df["tokens_in"].sum()), int(df["tokens_out"].sum()),
                       int(df["document_reason"].notna().sum()))

    try:
        with _call_topic(calls, progress) as topic:
            frames = map_shards(_numbered_shard, list(enumerate(shards)), spec, params, cache_uri, storage_options,
                                index, classes, topic, on_done=advance)
    finally:
        bar.close()
    return pd.concat(frames, ignore_index=True)


def _call_topic(calls: ShardProgress, progress: bool) -> Any:
    """The topic shards report their calls on (``privseed.tasks.data.cluster.shard_events``), or none without a bar."""
    return shard_events(calls.on_call) if progress else contextlib.nullcontext(None)


def _numbered_shard(shard: tuple[int, Sequence[ReleasedSeed]], spec: LLMSpec, params: GenerationParams,
                    cache_uri: str | None, storage_options: dict | None,
                    cache_index: CacheIndex | None, classes: SeedClasses | None,
                    topic: str | None = None) -> pd.DataFrame:
    number, seeds = shard
    return generate_shard(seeds, spec, params, cache_uri, storage_options, False, number, cache_index,
                          on_call=call_messages(topic, number), on_settled=settle_messages(topic, number),
                          classes=classes)


#: Most rows in one part of a release written by generation shards.
MAX_PART_ROWS = 5000


def part_size(n_seeds: int, n_threads: int, shard_size: int = 16) -> int:
    """Seeds per generation shard when each shard writes one part: about four shards per worker thread (load
    balance and a moving progress bar), at least ``shard_size`` seeds, at most :data:`MAX_PART_ROWS`."""
    return max(1, min(MAX_PART_ROWS, max(shard_size, -(-n_seeds // (4 * max(1, n_threads))))))


@dataclass(frozen=True, eq=False)
class GeneratedPart:
    """What a generation shard sends back instead of its rows: the part it wrote (None when every row was
    dropped), its generation report (counts of synthetic rows and candidates) and what its calls spent."""

    part: ReleasePart | None
    report: dict
    calls: int
    tokens_in: int
    tokens_out: int


def generate_part(shard: tuple[int, Sequence[ReleasedSeed]], spec: LLMSpec, params: GenerationParams,
                  cache_uri: str | None, storage_options: dict | None, cache_index: CacheIndex | None, out: str,
                  release_id: str, gate: ReleaseGate | None, classes: SeedClasses | None = None,
                  topic: str | None = None) -> GeneratedPart:
    """One generation shard, on a Dask worker: its documents (``generate_shard``), the non-documents dropped
    (``split_documents``), the rest written as part ``shard[0]`` of the release and checked by the gate there
    (``privseed.tasks.data.corpus.write_part``). Only the small descriptor leaves the worker; each call is reported on
    ``topic`` as it finishes (the driver's progress bar). ``classes``: the generation's judge of class fit, built
    from all its seeds (``seed_classes``)."""
    number, seeds = shard
    rows = generate_shard(seeds, spec, params, cache_uri, storage_options, False, number, cache_index,
                          on_call=call_messages(topic, number), on_settled=settle_messages(topic, number),
                          classes=classes)
    kept, report = split_documents(rows, params.max_regenerations, classes)
    part = write_part(out, release_id, number, kept, storage_options, gate) if len(kept) else None
    return GeneratedPart(part, report, int(rows["candidates"].sum()), int(rows["tokens_in"].sum()),
                         int(rows["tokens_out"].sum()))


def fill_cache(seeds: Sequence[ReleasedSeed], spec: LLMSpec | str, params: GenerationParams, cache_uri: str,
               storage_options: dict | None, cache_index: CacheIndex | None, progress: bool = False,
               classes: SeedClasses | None = None) -> CacheIndex:
    """Every call of a batching run, sent at once (the backend submits all Message Batches together) with the
    regeneration rounds of ``seeded_rounds``; answers go to the call cache only (and are judged as they
    arrive), so the shards that write the parts afterwards find every call there. Returns the cache index with
    the new entries (the shards read it instead of listing the cache again). ``classes``: the judge of class fit
    the shards will use (None: built here from ``seeds``, as ``generate_shard`` does)."""
    spec = as_spec(spec)
    template = PromptTemplate.load(params.template)
    cache = CallCache(cache_uri, storage_options, index=cache_index)
    cache.load_index()
    n_first = len(seeds) * params.best_of
    bar = CallProgress(len(seeds), call_prices(spec, n_first), f"generate {spec.kind} (batches)", progress,
                       unit="doc")
    sent: list[int] = []

    def send(requests: list[ChatRequest], owners: list[int], on_each: OnEach) -> None:
        sent.append(len(requests))
        complete(spec, requests, cache, on_result=bar, on_each=on_each, keep=False)

    try:
        seeded_rounds(seeds, template, params, spec.kind, send, document_rules(params), bar.on_settled,
                      classes or seed_classes(seeds, params.rewrite_off_class))
    finally:
        bar.close()
    log.info("batched calls: %d requests in %d round(s), %d served from the cache", sum(sent), len(sent), bar.cached)
    return cache.index  # type: ignore[return-value]


def generate_release_parts(seeds: Sequence[ReleasedSeed], spec: LLMSpec | str, params: GenerationParams,
                           cache_uri: str | None, storage_options: dict | None, *, out: str,
                           gate: ReleaseGate | None, release_id: str | None = None, shard_size: int | None = None,
                           progress: bool = True, pool: SeedClasses | None = None) -> StagedRelease:
    """One document per seed, written straight into a release: each generation shard (a Dask task, or a loop
    here without a cluster) writes its documents as one part of release ``release_id`` under ``out`` and checks
    it with ``gate``; this process gathers the parts' descriptors only, never the rows, and hands them to
    ``privseed.tasks.data.corpus.publish_release``, which combines the checks and commits the manifest. Until then no
    manifest names the parts, so the last good release is untouched whatever happens here.

    The call cache is listed once, here; a batching Anthropic run first sends all its calls at once
    (``fill_cache``, on a worker when there is a cluster), then the shards read their answers from the cache.
    ``pool``: the judge of class fit from the pool the seeds were kept from (``seed_classes``)."""
    spec = as_spec(spec)
    if not kind_of(spec).writes_text:
        raise ConfigError("--llm none writes no documents; its release is the keyphrase sequences themselves")
    with serving(spec) as served:
        return _generate_release_parts(seeds, served, params, cache_uri, storage_options, out=out, gate=gate,
                                       release_id=release_id, shard_size=shard_size, progress=progress, pool=pool)


def _generate_release_parts(seeds: Sequence[ReleasedSeed], spec: LLMSpec, params: GenerationParams,
                            cache_uri: str | None, storage_options: dict | None, *, out: str,
                            gate: ReleaseGate | None, release_id: str | None, shard_size: int | None,
                            progress: bool, pool: SeedClasses | None) -> StagedRelease:
    release_id = release_id or new_release_id()
    client = current_client()
    threads = sum(client.nthreads().values()) if client is not None else 1
    shards = shard_seeds(seeds, shard_size or part_size(len(seeds), threads))
    index = _listed_cache(cache_uri, storage_options)
    classes = seed_classes(seeds, params.rewrite_off_class, pool)  # one judge for the batches and every shard
    n_calls = len(seeds) * params.best_of
    try:
        if cache_uri and _batched(spec, n_calls):
            if client is None:
                index = fill_cache(seeds, spec, params, cache_uri, storage_options, index, progress, classes)
            else:
                index = client.submit(fill_cache, list(seeds), spec, params, cache_uri, storage_options, index,
                                      False, classes, pure=False).result()
        bar = CallProgress(len(seeds), call_prices(spec, n_calls), f"generate {spec.kind}", progress, unit="doc")
        calls = ShardProgress(bar, [len(shard) for shard in shards])

        def advance(i: int, done: GeneratedPart) -> None:
            calls.finished(i, done.calls, done.tokens_in, done.tokens_out, int(done.report.get("rows_dropped", 0)))

        try:
            with _call_topic(calls, progress) as topic:
                generated = map_shards(generate_part, list(enumerate(shards)), spec, params, cache_uri,
                                       storage_options, index, out, release_id, gate, classes, topic,
                                       on_done=advance)
        finally:
            bar.close()
    finally:
        if client is None or len(shards) <= 1:
            close_backend(spec)  # generation ran in this process: free a local model now (see generate_seeds)
    report = merge_generation_reports([g.report for g in generated])
    parts = tuple(g.part for g in generated if g.part is not None)
    log.info("generation wrote %d part(s) of release %s: %d rows kept of %d", len(parts), release_id,
             report.get("rows_kept", 0), report.get("rows_generated", 0))
    return StagedRelease(out, release_id, parts, gate, report)


def generate_unseeded(labels: Sequence, per_class: int, spec: LLMSpec | str, params: GenerationParams,
                      cache_uri: str | None, call_seeds: Sequence[int], storage_options: dict | None = None,
                      progress: bool = True) -> pd.DataFrame:
    """``per_class`` documents per label from an unseeded template (``params.template``, e.g. ``only_llm``): the
    prompt holds the document type and, with ``params.class_names``, the class's public name; nothing of any
    private corpus. One call per document, ``call_seeds[i]`` for row i (labels in order, ``per_class`` each),
    through the same backends, call cache and progress bar as seeded generation: a re-run sends only the calls
    that never finished.

    The answers go through the same cleaning and the same document predicate as a DP-KPS release, with the same
    regeneration policy (``params.max_regenerations`` rounds, one new call seed per round, ``candidate_seed``;
    ``params.max_rewrites`` for repetitive documents),
    and a row with no document after them is dropped. A baseline that kept its loops and meta-talk would be
    scored on other texts than the method it is compared with. There are no seed terms, so the seed-echo tests
    do not apply. The frame's ``attrs["quality"]`` is the same quality report a release writes
    (``split_documents``)."""
    spec = as_spec(spec)
    if not kind_of(spec).writes_text:
        raise ConfigError("unseeded prompts need an LLM (--llm local or anthropic:MODEL)")
    with serving(spec) as served:
        return _generate_unseeded(labels, per_class, served, params, cache_uri, call_seeds, storage_options, progress)


def _generate_unseeded(labels: Sequence, per_class: int, spec: LLMSpec, params: GenerationParams,
                       cache_uri: str | None, call_seeds: Sequence[int], storage_options: dict | None,
                       progress: bool) -> pd.DataFrame:
    template = PromptTemplate.load(params.template)
    row_labels = [label for label in labels for _ in range(per_class)]
    if len(call_seeds) != len(row_labels):
        raise ConfigError(f"{len(row_labels)} documents but {len(call_seeds)} call seeds")
    rules = document_rules(params)

    def request(row: int, j: int, earlier: Sequence[ChatResult]) -> ChatRequest:
        return build_unseeded_request(template, row_labels[row], params.doc_type, max_tokens=params.max_tokens,
                                      temperature=params.temperature, top_p=params.top_p,
                                      call_seed=candidate_seed(call_seeds[row], j), class_names=params.class_names)

    def unseeded_document(i: int, answer: ChatResult) -> bool:
        return document_rejection(cleaned(answer).text, (), answer.finish_reason, rules,
                                  mean_logprob=answer.mean_logprob, label=row_labels[i]) is None

    def unseeded_plain(i: int, answer: ChatResult) -> bool:
        return rewrite_score(cleaned(answer).text, (), rules) < 1.0

    backend = get_backend(spec)
    cache = CallCache(cache_uri, storage_options) if cache_uri else None
    bar = CallProgress(len(row_labels), call_prices(spec, len(row_labels)), f"generate {spec.kind}", progress,
                       unit="doc")
    answers: list[list[ChatResult]] = [[] for _ in row_labels]

    def send(requests: list[ChatRequest], owners: list[int], on_each: OnEach) -> None:
        for i, answer in zip(owners, complete(spec, requests, cache, on_result=bar, on_each=on_each)):
            answers[i].append(answer)

    try:
        candidate_rounds(len(row_labels), 1, params.max_regenerations, request, unseeded_document, send,
                         bar.on_settled, unseeded_plain, params.max_rewrites)
    finally:
        bar.close()
        close_backend(spec)
    rows = unseeded_rows(row_labels, call_seeds, answers, backend=backend.name, model=backend.model,
                         prompt_version=template.version_for(params.class_names is not None), rules=rules)
    kept, report = split_documents(rows, params.max_regenerations)
    kept.attrs["quality"] = report
    log.info("unseeded generation: %d rows kept of %d", report["rows_kept"], report["rows_generated"])
    return kept


def seeds_from_sequences(sequences: pd.DataFrame, vocabulary: Sequence[str] | None, run_seed: int,
                         source: str = "released vocabulary") -> list[ReleasedSeed]:
    """Mint prompt seeds from the sampler's output (columns ``label``, ``keyphrases``). ``vocabulary`` is the
    released V~ (default: ``sequences.attrs["released_vocabulary"]``): every keyphrase must belong to it.
    Call seeds come from ``public_rng(run_seed, "generate")``, one per row, so a re-run repeats every call."""
    if vocabulary is None:
        vocabulary = sequences.attrs.get("released_vocabulary")
    if vocabulary is None:
        raise ConfigError("generation needs the released vocabulary V~ (pass it, or set "
                          "sequences.attrs['released_vocabulary']) to check that prompts carry released terms only")
    released = ReleasedVocabulary(list(vocabulary), sequences.attrs.get("released_vocabulary_source", source))
    call_seeds = public_rng(run_seed, "generate").integers(0, 2**31 - 1, size=len(sequences))
    return [released.seed(list(k), lab, int(sd))
            for k, lab, sd in zip(sequences["keyphrases"], sequences["label"], call_seeds)]


def refuse_remote_llm_for_reproducible_noise(llm: LLMSpec | str, reproducible_noise: bool) -> None:
    """A run drawn from reproducible noise (``--insecure-reproducible-noise``, research grids only) is refused with an
    LLM whose calls may leave this machine (``anthropic:``, ``vllm:``, ``openai-compatible:``). Its seeds are a
    deterministic function of the private corpus (anyone who reads --seed can subtract the noise), and the provider
    would receive them before the release gate refuses the run; docs/privacy.md lets a provider see released DP
    seeds only. Local weights (``local``, ``local-server``) and ``none`` are allowed."""
    kind = kind_of(llm)
    if reproducible_noise and kind.writes_text and not kind.local_weights:
        raise ConfigError(f"--insecure-reproducible-noise with --llm {as_spec(llm)}: the seeds of such a run are not "
                          "differentially private and would be sent to the LLM provider; use --llm local or "
                          "local-server for a reproducible research run, or drop --insecure-reproducible-noise")


#: The calibration's prompt seed: common English words, no data behind them (the first L of them).
CALIBRATION_TERMS = ("river", "village", "church", "market", "harbour", "school", "railway", "mountain", "album",
                     "football", "island", "company", "painter", "species", "novel", "station", "bridge", "film",
                     "league", "castle")


def calibrate_local_speed(backend: LLMBackend, template: PromptTemplate, params: GenerationParams, label: Any,
                          backend_kind: str, length: int = 10, short_tokens: int = 8) -> LocalSpeed:
    """Time a generation of a public seed (the first ``length`` of ``CALIBRATION_TERMS``) in the run's shape (its
    template, decoding and max_tokens) and one of ``short_tokens`` tokens, after an untimed one-token warm-up, and
    fit time = per call + per token x answer tokens. One answer's time for a small model; nothing private is read
    and nothing is cached."""
    terms = [CALIBRATION_TERMS[i % len(CALIBRATION_TERMS)] for i in range(max(1, min(length, len(CALIBRATION_TERMS))))]
    seed = ReleasedVocabulary(terms, "calibration: public words").seed(list(range(len(terms))), label, 12345)

    def timed_call(max_tokens: int) -> tuple[float, int]:
        request = candidate_request(template, seed, dataclasses.replace(params, max_tokens=max_tokens), 0, backend_kind)
        start = time.perf_counter()
        answer = backend.complete([request])[0]
        return time.perf_counter() - start, max(1, answer.tokens_out)

    # The warm-up, untimed: the model loads and the decoding controls build their per-model tables (llama.cpp's
    # steering scans the vocabulary once) there, not inside the timed calls.
    timed_call(1)
    t_short, n_short = timed_call(min(short_tokens, params.max_tokens))
    t_full, n_full = timed_call(params.max_tokens)
    per_token = (t_full - t_short) / (n_full - n_short) if n_full > n_short else 0.0
    if per_token <= 0:  # the model stopped early or the clock jittered: all of the longer call's time per token
        per_token, per_call = t_full / n_full, 0.0
    else:
        per_call = max(0.0, t_short - per_token * n_short)
    return LocalSpeed(per_call, per_token, t_full,
                      f"a public seed of {len(terms)} terms, {n_short} answer tokens in {t_short:.1f} s and "
                      f"{n_full} in {t_full:.1f} s")
