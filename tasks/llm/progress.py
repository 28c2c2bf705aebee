"""Progress of a run of LLM calls: a tqdm bar whose postfix holds tokens, cache hits and the cost so far
(``CallProgress``), and the same bar fed by shards on other processes (``ShardProgress``, ``call_messages``,
``settle_messages``). DP-KPS generation (``privseed.tasks.generation.drivers``) and the PE rounds
(``privseed.tasks.stages.pe``) both show their calls with it. Counts only: no text reaches a bar or a message."""

from __future__ import annotations

import threading
from typing import Callable, Sequence

from tqdm.auto import tqdm

from privseed.tasks.data.cluster import publish_event
from privseed.tasks.llm.base import ChatResult


class CallProgress:
    """tqdm bar of a generation (thread-safe), over a total fixed when it is made. ``unit="call"``: every call is
    planned (private evolution's rounds), the bar moves with each call. ``unit="doc"``: the total is the documents
    to write, one per seed; the bar moves when a seed is settled (the ``on_settled`` of
    ``privseed.tasks.generation.rounds.candidate_rounds``: a document kept, or the seed dropped after its last
    regeneration), and the calls, regenerations included, are a count beside it (``calls=``, ``dropped=``), so the
    percentage and the ETA mean what they say.

    Either way the postfix holds tokens in/out, answers served from the call cache and the cost so far. Pass the
    bar as ``on_result`` to :func:`privseed.tasks.llm.cached_complete` for per-call steps; shards on other processes
    go through :class:`ShardProgress`."""

    def __init__(self, total: int, prices: tuple[float, float] | None, desc: str, enabled: bool,
                 unit: str = "call"):
        self.bar = tqdm(total=total, desc=desc, unit=unit, disable=not enabled, leave=False)
        self.per_call = unit == "call"
        self.prices = prices
        self.calls = self.tokens_in = self.tokens_out = self.cached = self.dropped = 0
        self.lock = threading.Lock()

    def __call__(self, r: ChatResult) -> None:
        self.add(1, r.tokens_in, r.tokens_out, int(r.cached))

    def add(self, calls: int, tokens_in: int, tokens_out: int, cached: int = 0) -> None:
        """Calls answered (the bar moves with them when its unit is the call)."""
        with self.lock:
            self.calls += calls
            self.tokens_in += tokens_in
            self.tokens_out += tokens_out
            self.cached += cached
            self._show(calls if self.per_call else 0)

    def settle(self, documents: int = 1, dropped: int = 0) -> None:
        """Seeds settled, ``dropped`` of them without a document (the bar moves with them when its unit is the
        document)."""
        with self.lock:
            self.dropped += dropped
            self._show(0 if self.per_call else documents)

    def on_settled(self, i: int, kept: bool) -> None:
        """``privseed.tasks.generation.rounds.candidate_rounds``' ``on_settled``."""
        self.settle(1, int(not kept))

    def _show(self, steps: int) -> None:
        post: dict[str, int | str] = {} if self.per_call else {"calls": self.calls, "dropped": self.dropped}
        post.update({"in": self.tokens_in, "out": self.tokens_out, "cached": self.cached})
        if self.prices is not None:
            post["usd"] = f"{(self.tokens_in * self.prices[0] + self.tokens_out * self.prices[1]) / 1e6:.4f}"
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(steps)  # 0 redraws the postfix, as often as tqdm's own interval allows

    def close(self) -> None:
        self.bar.close()


class ShardProgress:
    """Per-call progress of a generation split into shards that finish long after their first call (a local
    model writes a few documents a minute): each call of shard i, and each of its seeds as it is settled, arrives
    as a message (``on_call``, from :func:`privseed.tasks.data.cluster.publish_event` on whichever process runs the
    shard) and moves the bar at once; when shard i finishes, ``finished`` adds whatever its messages did not carry
    yet (messages are best-effort), and later messages of that shard are ignored, so the bar counts each call and
    each seed once. ``planned[i]``: shard i's share of the bar's total (its seeds for a bar over documents, its
    calls for a bar over calls)."""

    def __init__(self, bar: CallProgress, planned: Sequence[int]):
        self.bar = bar
        self.planned = [int(p) for p in planned]
        self.seen = [[0, 0, 0, 0, 0] for _ in self.planned]  # calls, tokens in, tokens out, settled, dropped
        self.done: set[int] = set()
        self.lock = threading.Lock()

    def on_call(self, message: dict) -> None:
        i = int(message["shard"])
        with self.lock:
            if i in self.done:
                return
            seen = self.seen[i]
            if "settled" in message:
                if seen[3] < self.planned[i]:
                    seen[3] += 1
                    seen[4] += int(not message["kept"])
                    self.bar.settle(1, int(not message["kept"]))
                return
            seen[0] += 1
            seen[1] += int(message["in"])
            seen[2] += int(message["out"])
            self.bar.add(1, int(message["in"]), int(message["out"]), int(message["cached"]))

    def finished(self, i: int, calls: int, tokens_in: int, tokens_out: int, dropped: int = 0) -> None:
        """Shard i is done: ``calls`` answered (``tokens_in``, ``tokens_out``), ``dropped`` of its seeds without a
        document."""
        with self.lock:
            self.done.add(i)
            seen_calls, seen_in, seen_out, settled, seen_dropped = self.seen[i]
            self.bar.add(max(0, calls - seen_calls), max(0, tokens_in - seen_in), max(0, tokens_out - seen_out))
            if not self.bar.per_call:
                self.bar.settle(max(0, self.planned[i] - settled), max(0, dropped - seen_dropped))


def call_messages(topic: str | None, shard: int) -> Callable[[ChatResult], None] | None:
    """What a shard's calls report to ``ShardProgress.on_call`` through ``topic`` (None: no progress wanted)."""
    if topic is None:
        return None
    def report(result: ChatResult) -> None:
        publish_event(topic, {"shard": shard, "in": result.tokens_in, "out": result.tokens_out,
                              "cached": int(result.cached)})
    return report


def settle_messages(topic: str | None, shard: int) -> Callable[[int, bool], None] | None:
    """What a shard's settled seeds report to ``ShardProgress.on_call`` through ``topic`` (None: no progress
    wanted)."""
    if topic is None:
        return None
    def report(i: int, kept: bool) -> None:
        publish_event(topic, {"shard": shard, "settled": 1, "kept": int(kept)})
    return report
