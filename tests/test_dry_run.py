"""``privseed dpkps --dry-run`` as a plan (issue 47): an upper bound on calls, tokens and cost that holds in the
worst case, the privacy spend per stage, a time estimate for local models; nothing sent to a remote backend."""
from __future__ import annotations

import time
from typing import Sequence

import pytest

from privseed.tasks.config.commands import DpKpsConfig, validate_config
from privseed.tasks.generation.drivers import CALIBRATION_TERMS, calibrate_local_speed, seeds_from_sequences
from privseed.tasks.generation.params import GenerationParams
from privseed.tasks.generation.rounds import build_generation_requests, candidate_seed
from privseed.tasks.llm.cost import LocalSpeed, estimate_cost, worst_case_candidates
from privseed.tasks.stages.generation import documents_from_config as generate_documents
from privseed.tasks.stages.generation import estimate_generation
from privseed.tasks.llm import LLMSpec, PromptTemplate, ReleasedVocabulary, register_backend
from privseed.tasks.llm.base import ChatRequest, ChatResult, LLMBackend, OnEach
from privseed.tasks.stages.generation import dry_run, placeholder_sequences, planned_privacy_spend
from tests.fakes.recording import RecordingBackend

META_TALK = "I'm an AI assistant designed to help with Wikipedia articles about many topics."
REPETITIVE = ("The keyphrase was first written down in the old harbour town, where the keyphrase became a keyphrase of "
              "the market, and every keyphrase of the keyphrase list was a keyphrase again. Later the town kept the "
              "keyphrase in its records for many years after the flood.")


def config(tmp_path, corpus_file, **values) -> DpKpsConfig:
    return validate_config(DpKpsConfig, {"data": corpus_file, "out": str(tmp_path / "out"), "labels": ["0", "1", "2"],
                                         "per_class": 3, "length": 5, "dry_run": True, **values})


def worst_case_answers(cfg: DpKpsConfig, seeds: Sequence[int]):
    """Every candidate before the last regeneration's is rejected (meta-talk), that one and every later one is a
    repetitive document: each seed spends all its regenerations, then all its rewrites."""
    rejected = {candidate_seed(s, j) for s in seeds for j in range(cfg.best_of + cfg.max_regenerations - 1)}
    return lambda request: META_TALK if request.seed in rejected else REPETITIVE


@pytest.mark.parametrize("best_of,regenerations,rewrites", [(1, 3, 2), (2, 1, 1), (1, 0, 0)])
def test_the_bound_holds_for_a_run_whose_every_candidate_is_rejected_then_repetitive(
        tmp_path, corpus_file, best_of, regenerations, rewrites):
    cfg = config(tmp_path, corpus_file, llm="local:always-worst", best_of=best_of, max_regenerations=regenerations,
                 max_rewrites=rewrites, max_tokens=64, steer=0.0)
    sequences = placeholder_sequences(cfg)
    run_seeds = [s.seed for s in seeds_from_sequences(sequences, None, cfg.seed)]
    backend = RecordingBackend(answer=worst_case_answers(cfg, run_seeds))
    register_backend(cfg.llm, backend)
    try:
        estimate = estimate_generation(sequences, cfg, calibrate=False)
        assert backend.requests == []
        rows = generate_documents(sequences, cfg.model_copy(update={"dry_run": False}))
    finally:
        register_backend(cfg.llm, None)
    sent = len(backend.requests)
    assert sent == len(run_seeds) * worst_case_candidates(best_of, regenerations, rewrites)  # the worst case happened
    assert estimate.calls_bound is not None and estimate.tokens_out_bound is not None
    assert sent <= estimate.calls_bound  # ... and the bound holds (here it is reached)
    assert sum(r.max_tokens for r in backend.requests) <= estimate.tokens_out_bound
    assert estimate.calls == len(run_seeds) * best_of  # the first round beside it
    assert int(rows["candidates"].sum()) == sent


def test_the_bound_prices_later_rounds_at_the_single_call_price():
    vocabulary = ReleasedVocabulary(["river", "village", "church"], "test")
    seeds = [vocabulary.seed([0, 1, 2], label=0, seed=i) for i in range(300)]
    params = GenerationParams(doc_type="memo", max_tokens=100, best_of=1)
    flat = [r for per in build_generation_requests(seeds, PromptTemplate.load("generic"), params) for r in per]
    spec = LLMSpec("anthropic", "claude-haiku-4-5")
    estimate = estimate_cost(spec, flat, later_rounds=3)
    assert estimate.calls_bound == 300 * 4 and estimate.tokens_out_bound == 300 * 4 * 100
    assert estimate.tokens_in_bound == 4 * estimate.tokens_in  # every later prompt as long as the seed's first
    # the first round is batched (300 calls: half price), a later round of a few seeds may not be: full price
    first = (estimate.tokens_in * 0.5 + 30_000 * 2.5) / 1e6
    later = (3 * estimate.tokens_in * 1.0 + 3 * 30_000 * 5.0) / 1e6
    assert estimate.usd == pytest.approx(first) and estimate.usd_bound == pytest.approx(first + later)
    assert "upper bound" in estimate.describe() and "1,200 calls" in estimate.describe()


def test_the_dry_run_sends_nothing_to_a_remote_backend(tmp_path, corpus_file):
    cfg = config(tmp_path, corpus_file, llm="anthropic:claude-haiku-4-5")
    remote = RecordingBackend()
    register_backend(cfg.llm, remote)  # anything the dry run sent would land here
    try:
        result = dry_run(cfg)
    finally:
        register_backend(cfg.llm, None)
    assert remote.requests == []
    assert result["calls_bound"] == 9 * worst_case_candidates(cfg.best_of, cfg.max_regenerations, cfg.max_rewrites)
    assert result["usd_bound"] > result["usd"] > 0 and result["seconds_bound"] is None  # no time for a remote API
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.private").exists()


class TimedBackend(LLMBackend):
    """A local model that takes 50 ms per call plus 2 ms per answer token and always writes max_tokens tokens."""

    name = "local"
    model = "timed"

    def __init__(self) -> None:
        self.requests: list[ChatRequest] = []

    def complete(self, requests: Sequence[ChatRequest], on_each: OnEach | None = None) -> list[ChatResult]:
        out = []
        for i, request in enumerate(requests):
            self.requests.append(request)
            time.sleep(0.05 + 0.002 * request.max_tokens)
            out.append(ChatResult("word " * request.max_tokens, 10, request.max_tokens))
            if on_each:
                on_each(i, out[-1])
        return out


def test_the_calibration_times_a_public_seed_and_fits_call_and_token_time():
    backend = TimedBackend()
    speed = calibrate_local_speed(backend, PromptTemplate.load("generic"), GenerationParams(doc_type="memo"), 0,
                                  "local")
    assert [r.max_tokens for r in backend.requests] == [1, 8, 256]  # an untimed warm-up, a short and a full call
    assert all(term in backend.requests[0].messages[-1].content for term in CALIBRATION_TERMS[:10])
    assert speed.seconds_per_token == pytest.approx(0.002, rel=0.5)
    assert speed.seconds_per_call == pytest.approx(0.05, rel=0.5)
    assert LocalSpeed(1.0, 0.01, 2.0, "x").seconds(calls=10, tokens_out=1000) == pytest.approx(20.0)


def test_a_local_dry_run_estimates_the_time_of_the_first_round_and_of_the_bound(tmp_path, corpus_file):
    cfg = config(tmp_path, corpus_file, llm="local:timed", max_tokens=100, max_regenerations=2, max_rewrites=1)
    backend = TimedBackend()
    register_backend(cfg.llm, backend)
    try:
        result = dry_run(cfg)
    finally:
        register_backend(cfg.llm, None)
    assert len(backend.requests) == 3  # the calibration only, of public words
    # 9 calls of ~0.25 s in the first round; 9 x 4 calls of max_tokens in the bound
    assert result["seconds_first_round"] == pytest.approx(9 * 0.25, rel=0.5)
    assert result["seconds_bound"] == pytest.approx(4 * result["seconds_first_round"], rel=0.01)
    assert "time estimate on this machine" in result["estimate"] and "calibrated: a public seed" in result["estimate"]


@pytest.mark.parametrize("values", [
    {},  # histogram, Gaussian, the default delta
    {"method": "histogram-markov", "epsilon": 3.0},
    {"method": "histogram", "mechanism": "laplace"},
    {"method": "histogram-markov", "mechanism": "laplace-threshold", "delta": 1e-6, "markov_term_share": 0.7},
    {"method": "independent", "eps_voc": 2.0, "eps_kde": 5.0},
    {"method": "iterative-log", "mechanism": "gaussian", "delta": 1e-6},
])
def test_the_privacy_lines_sum_to_the_total(tmp_path, corpus_file, values):
    cfg = config(tmp_path, corpus_file, llm="none", **values)
    result = dry_run(cfg)
    stages = result["privacy"]["stages"]
    assert sum(s["epsilon"] for s in stages) == pytest.approx(result["privacy"]["epsilon"])
    assert sum(s["delta"] for s in stages) == pytest.approx(result["privacy"]["delta"])
    expected = cfg.histogram_epsilon if cfg.method.startswith("histogram") else cfg.eps_voc + cfg.eps_kde
    assert result["privacy"]["epsilon"] == pytest.approx(expected)
    assert result["privacy"]["delta"] == pytest.approx(cfg.delta if cfg.mechanism != "laplace" else 0.0)
    lines = result["privacy_plan"].splitlines()
    assert len(lines) == len(stages) + 2 and lines[-1].strip().startswith("total: epsilon=")
    # the corpus profile while K, L or the contribution is left auto (the histogram methods' default)
    profiled = cfg.method.startswith("histogram")
    assert len(stages) == (2 if cfg.method != "histogram" else 1) + profiled
    assert (stages[0]["stage"] == "corpus profile") == profiled


@pytest.mark.slow
def test_the_planned_spend_is_what_a_real_run_charges(prefect_harness, tmp_path, corpus_file):
    """The plan against the ledger of a real run (histogram-markov: two stages, the default delta)."""
    from privseed.flows.dpkps import dpkps_flow

    cfg = config(tmp_path, corpus_file, llm="none", method="histogram-markov", epsilon=2.0, gate=False,
                 n_workers=1, dry_run=False)
    planned = planned_privacy_spend(cfg)
    manifest = dpkps_flow(cfg)
    assert sum(s.epsilon for s in planned) == pytest.approx(manifest["privacy"]["epsilon"])
    assert sum(s.delta for s in planned) == pytest.approx(manifest["privacy"]["delta"])
