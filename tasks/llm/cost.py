"""What a run of LLM calls will cost, before it sends anything: calls, tokens and dollars of the first round and an
upper bound over every later round (``estimate_cost``, ``CostEstimate``), and, for a local model, the time on this
machine from a calibration (``LocalSpeed``). DP-KPS's dry run (``privseed.tasks.stages.generation``) and private
evolution's (``privseed.tasks.stages.pe``) both estimate with it. Public settings and cache keys only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from privseed.tasks.errors import ConfigError
from privseed.tasks.llm.base import ChatRequest, LLMBackend
from privseed.tasks.llm.cache import CallCache
from privseed.tasks.llm.service import LLMSpec, call_prices


def worst_case_candidates(best_of: int, max_regenerations: int, max_rewrites: int) -> int:
    """The most candidates (calls) one seed can cost (pure): its ``best_of`` first candidates, then one per round of
    ``privseed.tasks.generation.rounds.candidate_rounds``, and every later round spends either a regeneration (no
    document yet) or a rewrite (its documents all repetitive), so at most ``max_regenerations + max_rewrites``
    rounds. Reached by a seed whose candidates are rejected until its regenerations run out, then repetitive until
    its rewrites do."""
    return best_of + max_regenerations + max_rewrites


@dataclass(frozen=True)
class LocalSpeed:
    """Decoding time of a local model on this machine, from a short calibration
    (``privseed.tasks.generation.drivers.calibrate_local_speed``): a call
    costs ``seconds_per_call`` (prompt evaluation, decoding set-up) plus ``seconds_per_token`` per answer token, and
    a call of the run's shape (its seed length and max_tokens) took ``seconds_typical_call``. One process decoding
    one call at a time; ``source`` says what was timed."""

    seconds_per_call: float
    seconds_per_token: float
    seconds_typical_call: float
    source: str

    def seconds(self, calls: int, tokens_out: int) -> float:
        """Time of ``calls`` calls writing ``tokens_out`` tokens in all (every answer at max_tokens: the bound)."""
        return calls * self.seconds_per_call + tokens_out * self.seconds_per_token

    @property
    def tokens_per_second(self) -> float:
        return 1.0 / self.seconds_per_token if self.seconds_per_token > 0 else float("inf")


@dataclass(frozen=True)
class CostEstimate:
    """What a generation sends, before it sends anything. The first round (``calls`` ... ``usd``): every seed's
    ``best_of`` candidates, answers at ``max_tokens``, what a model that always writes plain documents sends. The
    upper bound (``*_bound``), which holds however the answers turn out::

        calls_bound      = first-round calls to send + seeds x (max_regenerations + max_rewrites)
                           (<= seeds x (best_of + max_regenerations + max_rewrites), ``worst_case_candidates``)
        tokens_out_bound = calls_bound x max_tokens
        tokens_in_bound  = first-round input tokens + seeds x (max_regenerations + max_rewrites) x the seed's longest
                           first-round prompt (a later candidate's prompt is the same seed's, or shorter:
                           ``privseed.tasks.generation.rounds.prompt_seed`` only leaves terms out)
        usd_bound        = first round at its price + later rounds at the dearer of the batch and the single-call
                           price (a small later round may not be batched)

    Input tokens come from the local tokenizer, else ~4 characters per token, so they are estimates; the output
    tokens are bounds. ``speed``: a local model's calibrated decoding time (None: remote, or not calibrated)."""

    calls: int
    cached_calls: int
    tokens_in: int
    tokens_out_max: int
    usd: float | None  # None: price unknown for this backend/model
    calls_bound: int | None = None  # None: the same as the first round's calls to send (no later rounds)
    tokens_in_bound: int | None = None
    tokens_out_bound: int | None = None
    usd_bound: float | None = None
    later_rounds: int = 0  # max_regenerations + max_rewrites: the most extra candidates a seed can get
    speed: LocalSpeed | None = None

    @property
    def calls_to_send(self) -> int:
        return self.calls - self.cached_calls

    def seconds_first_round(self) -> float | None:
        """Typical case: the first round's calls, each as long as the calibration's call of the run's shape."""
        return None if self.speed is None else self.calls_to_send * self.speed.seconds_typical_call

    def seconds_bound(self) -> float | None:
        if self.speed is None:
            return None
        return self.speed.seconds(self.calls_bound if self.calls_bound is not None else self.calls_to_send,
                                  self.tokens_out_bound if self.tokens_out_bound is not None else self.tokens_out_max)

    def describe(self) -> str:
        cost = "unknown (no price for this model)" if self.usd is None else f"at most ${self.usd:,.4f}"
        text = (f"{self.calls} LLM calls ({self.cached_calls} already cached, {self.calls_to_send} to "
                f"send), ~{self.tokens_in:,} input tokens, at most {self.tokens_out_max:,} output tokens, cost {cost}")
        if self.later_rounds and self.calls_bound is not None:
            bound_cost = "unknown" if self.usd_bound is None else f"${self.usd_bound:,.4f}"
            text += (f"\n  upper bound with every regeneration and rewrite ({self.later_rounds} more candidates per "
                     f"seed): at most {self.calls_bound:,} calls, ~{self.tokens_in_bound or 0:,} input tokens, "
                     f"{self.tokens_out_bound or 0:,} output tokens, cost at most {bound_cost}")
        if self.speed is not None:
            text += (f"\n  time estimate on this machine, one process (calibrated: {self.speed.source}; "
                     f"{self.speed.seconds_per_call:.2f} s per call + {self.speed.tokens_per_second:,.1f} tokens/s): "
                     f"first round ~{_duration(self.seconds_first_round())} at that call's length, at most "
                     f"~{_duration(self.seconds_bound())} (the bound's calls, every answer at max_tokens); an "
                     f"estimate: it moves with the machine's load")
        return text


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def estimate_cost(spec: LLMSpec, requests: Sequence[ChatRequest], cache: CallCache | None = None,
                  backend: LLMBackend | None = None, later_rounds: int = 0, per_owner: int = 1) -> CostEstimate:
    """Estimate before sending anything (``CostEstimate`` states the bound's formula): ``requests`` are the first
    round, ``per_owner`` consecutive ones per seed (``best_of``), and each seed can get at most ``later_rounds``
    (max_regenerations + max_rewrites) more candidates. Output tokens at max_tokens for every uncached call; input
    tokens from the local tokenizer when a backend is given, else ~4 characters per token."""
    def n_in(r: ChatRequest) -> int:
        text = "\n".join(m.content for m in r.messages)
        return backend.count_tokens(text) if backend is not None else max(1, len(text) // 4)

    if per_owner < 1 or len(requests) % per_owner:
        raise ConfigError(f"{len(requests)} first-round requests do not split into seeds of {per_owner}")
    model_id = backend.model if backend is not None else (spec.model or "")
    kind = backend.name if backend is not None else spec.kind
    found = cache.get_many([r.cache_key(kind, model_id) for r in requests]) if cache is not None else []
    cached = [cache is not None and found[i] is not None for i in range(len(requests))]
    tokens = [n_in(r) for r in requests]
    t_in = sum(t for t, c in zip(tokens, cached) if not c)
    t_out = sum(r.max_tokens for r, c in zip(requests, cached) if not c)
    n_todo = len(requests) - sum(cached)
    p = call_prices(spec, n_todo)
    usd = None if p is None else (t_in * p[0] + t_out * p[1]) / 1e6
    owners = len(requests) // per_owner
    later_in = later_rounds * sum(max(tokens[i * per_owner:(i + 1) * per_owner]) for i in range(owners))
    later_out = later_rounds * sum(max(r.max_tokens for r in requests[i * per_owner:(i + 1) * per_owner])
                                   for i in range(owners))
    later_calls = later_rounds * owners
    single, batched = call_prices(spec, 1), call_prices(spec, max(1, owners))
    usd_later = (None if single is None or batched is None else
                 (later_in * max(single[0], batched[0]) + later_out * max(single[1], batched[1])) / 1e6)
    return CostEstimate(len(requests), sum(cached), t_in, t_out, usd,
                        calls_bound=n_todo + later_calls, tokens_in_bound=t_in + later_in,
                        tokens_out_bound=t_out + later_out,
                        usd_bound=None if usd is None or usd_later is None else usd + usd_later,
                        later_rounds=later_rounds)
