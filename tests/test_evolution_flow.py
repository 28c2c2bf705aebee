"""Aug-PE, AugPE+V~ and SecPE flows end to end: release layout, draw-once noise, refused resumes, cached calls.

Most tests use a deterministic fake backend (same interface as the real ones: a batch of chat requests in, texts
and token counts out); the `slow` tests at the end run the packaged local LLM.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from privseed.tasks.errors import ConfigError, LedgerMismatchError
from tests.noise_checks import assert_noise_is

TOPICS = {
    0: "football club player scored goals league season striker",
    1: "river valley mountain lake forest village glacier",
    2: "album band song released records guitar singer",
}


class FakeBackend:
    """Deterministic stand-in for an LLM: RANDOM_API returns a topic chosen by the call seed; a variation keeps
    the input's topic. Counts every call it really answers (cache hits never reach it)."""

    name = "fake"
    model = "fake-topics"

    def __init__(self, fail_after: int | None = None):
        self.calls = 0
        self.prompts: list[str] = []
        self.fail_after = fail_after
        self.lock = threading.Lock()

    def _answer(self, req) -> str:
        user = req.messages[-1].content
        for words in TOPICS.values():
            if words.split()[0] in user or words.split()[1] in user:
                return f"{words} variant {req.seed % 97}"
        topic = TOPICS[req.seed % 3]
        return f"{topic} number {req.seed % 1000}"

    def complete(self, requests, on_each=None):
        from privseed.tasks.llm import ChatResult

        out = []
        for j, req in enumerate(requests):
            with self.lock:
                if self.fail_after is not None and self.calls >= self.fail_after:
                    raise RuntimeError("simulated crash of the LLM backend")
                self.calls += 1
                self.prompts.append(req.messages[-1].content)
            res = ChatResult(text=self._answer(req), tokens_in=10, tokens_out=8)
            if on_each:
                on_each(j, res)
            out.append(res)
        return out

    def count_tokens(self, text):
        return len(text) // 4

    def close(self):
        pass


@pytest.fixture
def fake_llm():
    from privseed.tasks.llm import register_backend

    backend = FakeBackend()
    register_backend("local:fake-topics", backend)
    yield backend
    register_backend("local:fake-topics", None)


def _cfg(corpus_file, out, **kw):
    base = {"data": corpus_file, "out": str(out), "llm": "local:fake-topics", "per_class": 2, "variations": 1,
            "iterations": 2, "epsilon": 50.0, "delta": 1e-5, "gate": False, "doc_type": "short text", "seed": 3,
            "labels": ["0", "1", "2"], "n_workers": 1}  # one worker embeds the private corpus: one model load
    base.update(kw)
    return base


def _read_release(out: Path) -> tuple[dict, pd.DataFrame, dict]:
    manifest = json.loads((out / "manifest.json").read_text())
    parts = sorted((out / "synthetic").glob("part-*.parquet"))
    frame = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
    ledger = json.loads((out / "ledger.json").read_text())
    return manifest, frame, ledger


def test_augpe_release_layout_and_ledger(prefect_harness, corpus_file, tmp_path, fake_llm, tiny_corpus):
    from privseed.flows.evolution import augpe_flow, run_augpe
    from privseed.tasks.dp import accounting

    out = tmp_path / "augpe"
    manifest = augpe_flow(_cfg(corpus_file, out))
    manifest, frame, ledger = _read_release(out)
    assert manifest["rows"] == 3 * 2 and sorted(frame["label"].unique().tolist()) == [0, 1, 2]
    assert all(len(k) == 0 for k in frame["keyphrases"])  # PE seeds no keyphrases
    assert {"text", "label", "keyphrases", "backend", "model", "prompt_version", "seed", "tokens_in",
            "tokens_out"} <= set(frame.columns)
    names = [e["name"] for e in ledger["entries"]]
    assert "augpe.schedule" in names and "augpe.round-001.histogram" in names and "augpe.round-002.histogram" in names
    sigma = accounting.augpe_noise_multiplier(50.0, 1e-5, 2)
    sched = next(e for e in ledger["entries"] if e["name"] == "augpe.schedule")
    assert sched["params"]["sigma"] == pytest.approx(sigma) and sched["params"]["iterations"] == 2
    assert ledger["total"]["epsilon"] == pytest.approx(50.0) and ledger["total"]["delta"] == pytest.approx(1e-5)
    # calls: N(K+1) random per class, then N K variations per class for the T-1 later rounds
    assert fake_llm.calls == 3 * 2 * 2 + 3 * 2 * 1
    # no prompt names a class or carries private text
    private = set(tiny_corpus["text"])
    assert not any(p in private for p in fake_llm.prompts)
    assert not any(str(lbl) in p for p in fake_llm.prompts[:12] for lbl in ("Athlete", "label"))
    # with little noise, selection pulls each class's population towards its private documents
    from privseed.tasks.pe.evolution import call_seed as _call_seed

    topic_of = {0: "football", 1: "river", 2: "album"}
    # precondition: with seed 3 every class's initial candidates include one of its own topic
    assert all(any(_call_seed(3, "random", str(c), str(i)) % 3 == c for i in range(4)) for c in range(3))
    on_topic = {int(lbl) for text, lbl in zip(frame["text"], frame["label"]) if topic_of[int(lbl)] in text}
    assert on_topic == {0, 1, 2}  # every class kept its own topic (random: ~17 %)
    # Timings grow with |D|: the release has per-round candidate counts only, the timings are in the private state
    evolution = json.loads((out / "evolution.json").read_text())
    assert evolution["rounds"] and not any(k.endswith("_s") for r in evolution["rounds"] for k in r)
    timings = json.loads((tmp_path / "augpe.private" / "operator" / "round-timings.json").read_text())["rounds"]
    assert len(timings) == 2 and all(r["histogram_s"] >= 0 for r in timings)
    # resumed run (--run-id): every noisy histogram re-read, no LLM call repeated
    before = fake_llm.calls
    path = run_augpe(_cfg(corpus_file, out, run_id=ledger["run_id"]))
    assert path == str(out) and fake_llm.calls == before
    _, again, _ = _read_release(out)
    assert again["text"].tolist() == frame["text"].tolist()


class TerseBackend(FakeBackend):
    """Answers half the RANDOM_API calls of every class with one word (what a small model sometimes does)."""

    terse = 0

    def _answer(self, req) -> str:
        text = super()._answer(req)
        if "variant" not in text and req.seed % 2:
            self.terse += 1
            return "Lullaby."
        return text


def test_non_documents_are_kept_out_of_the_release(prefect_harness, corpus_file, tmp_path):
    from privseed.flows.evolution import run_augpe
    from privseed.tasks.llm import register_backend

    backend = TerseBackend()
    register_backend("local:fake-topics", backend)
    try:
        out = run_augpe(_cfg(corpus_file, tmp_path / "terse", gate=True))
    finally:
        register_backend("local:fake-topics", None)
    manifest, frame, _ = _read_release(Path(out))
    assert backend.terse > 0
    assert manifest["rows"] == 6 and frame["text"].str.split().str.len().min() >= 5  # the gate passed, too
    rounds = json.loads((Path(out) / "evolution.json").read_text())["rounds"]
    assert rounds[0]["non_documents"] > 0


def test_augpe_resume_with_changed_schedule_refuses(prefect_harness, corpus_file, tmp_path, fake_llm):
    from privseed.flows.evolution import augpe_flow
    from privseed.tasks.config.commands import AugPeConfig
    from privseed.tasks.stages.pe import augpe_schedule, check_schedule
    from privseed.tasks.data.corpus import read_corpus
    from privseed.tasks.dp.identity import data_identity, load_or_create_key
    from privseed.tasks.dp.ledger import PrivacyLedger

    out = tmp_path / "resume"
    augpe_flow(_cfg(corpus_file, out, run_id="fixed-run", iterations=1))
    with pytest.raises(LedgerMismatchError, match="iterations"):
        augpe_flow(_cfg(corpus_file, out, run_id="fixed-run", iterations=2))
    # every other schedule field is refused the same way (checked without running the flow again)
    state = f"{out}.private"
    ledger = PrivacyLedger(state, data_identity(read_corpus(corpus_file), load_or_create_key(state)), "fixed-run")
    same = augpe_schedule(AugPeConfig.model_validate(_cfg(corpus_file, out, iterations=1)))
    check_schedule(ledger, "augpe.schedule", same)  # the original schedule resumes
    sigma = same["sigma"]
    for change, field in [({"epsilon": None, "noise_multiplier": sigma * 0.9}, "sigma"), ({"seed": 8}, "seed"),
                          ({"epsilon": None, "noise_multiplier": sigma, "delta": 1e-6}, "delta"),
                          ({"selection": "sample"}, "selection"), ({"per_class": 3}, "per_class")]:
        other = augpe_schedule(AugPeConfig.model_validate(_cfg(corpus_file, out, iterations=1, **change)))
        with pytest.raises(LedgerMismatchError, match=field):
            check_schedule(ledger, "augpe.schedule", other)


def test_augpe_crash_mid_round_repeats_no_finished_call(prefect_harness, corpus_file, tmp_path):
    from privseed.flows.evolution import augpe_flow
    from privseed.tasks.llm import register_backend

    out = tmp_path / "crash"
    crashing = FakeBackend(fail_after=9)  # 12 random calls are needed: dies in the first round
    register_backend("local:fake-topics", crashing)
    try:
        with pytest.raises(RuntimeError, match="simulated crash"):
            augpe_flow(_cfg(corpus_file, out, llm_retries=0))
        assert crashing.calls == 9
        healthy = FakeBackend()
        register_backend("local:fake-topics", healthy)
        augpe_flow(_cfg(corpus_file, out))
        assert healthy.calls == (12 - 9) + 6  # the 3 unfinished random calls, then the variations
    finally:
        register_backend("local:fake-topics", None)


def test_llm_calls_sharded_keep_order_and_use_the_cache(corpus_file, tmp_path, fake_llm):
    from privseed.tasks.config.commands import AugPeConfig
    from privseed.tasks.stages.pe import llm_calls

    cfg = AugPeConfig.model_validate(_cfg(corpus_file, tmp_path / "out", llm_shards=3))
    prompts = [("sys", f"Write a short text. river {i}" if i % 2 else f"Write a short text. {i}", 100 + i)
               for i in range(7)]
    first = llm_calls.fn(prompts, cfg)  # no Dask client: the 3 shards run in this process, in order
    requests = [type("R", (), {"messages": [type("M", (), {"content": p[1]})()], "seed": p[2]})() for p in prompts]
    assert [a["text"] for a in first] == [fake_llm._answer(r) for r in requests]
    assert fake_llm.calls == 7
    again = llm_calls.fn(prompts, cfg)
    assert again == first and fake_llm.calls == 7  # all 7 answered from the cache


def test_augpe_config_validation(corpus_file, tmp_path):
    from privseed.tasks.config.commands import AugPeConfig
    from privseed.tasks.config.commands import validate_config

    with pytest.raises(ConfigError, match="not both"):
        validate_config(AugPeConfig, _cfg(corpus_file, tmp_path / "out", noise_multiplier=3.0))
    with pytest.raises(ConfigError, match="needs an LLM"):
        validate_config(AugPeConfig, _cfg(corpus_file, tmp_path / "out", llm="none"))


def test_augpe_default_delta_uses_public_bound(corpus_file, tmp_path):
    from privseed.tasks.config.commands import AugPeConfig
    from privseed.tasks.stages.pe import augpe_schedule
    from privseed.tasks.dp import accounting

    cfg = AugPeConfig.model_validate(_cfg(corpus_file, tmp_path / "out", delta=None, n_upper_bound=10_000,
                                          epsilon=2.0))
    sched = augpe_schedule(cfg)
    assert sched["delta"] == pytest.approx(accounting.default_delta(10_000))
    cfg2 = AugPeConfig.model_validate(_cfg(corpus_file, tmp_path / "out", epsilon=None, noise_multiplier=5.0))
    assert augpe_schedule(cfg2)["epsilon"] == pytest.approx(accounting.augpe_epsilon(5.0, 1e-5, 2))


def test_secpe_flow_with_file_secrets(prefect_harness, corpus_file, tmp_path, fake_llm, tiny_corpus):
    from privseed.flows.evolution import secpe_flow

    public = tmp_path / "public.parquet"
    pd.DataFrame({"text": [f"{TOPICS[i % 3]} public {i}" for i in range(30)]}).to_parquet(public)
    secrets = tmp_path / "secrets.txt"
    secrets.write_text("goals\nglacier\nguitar\n")
    out = tmp_path / "secpe"
    cfg = _cfg(corpus_file, out, public=str(public), secrets=str(secrets), clusters=6, p=1e-4, r_over_p=10.0,
               noise_multiplier=8.0)
    cfg.pop("epsilon")
    secpe_flow(cfg)
    manifest, frame, ledger = _read_release(out)
    assert manifest["rows"] == 6
    schedule = next(e for e in ledger["entries"] if e["name"] == "secpe.schedule")
    sched = schedule["params"]
    assert sched["sigma"] == 8.0 and sched["secret_protection"]["rounds"] == 2  # the public --noise-multiplier
    # the release says which guarantee it has: (p, r)-secret protection, which is not (epsilon, delta)-DP
    for guarantee in (manifest["privacy"]["guarantee"], ledger["total"]["guarantee"]):
        assert guarantee["kind"] == "(p, r)-secret protection" and (guarantee["p"], guarantee["r"]) == (1e-4, 1e-3)
        assert "not (epsilon, delta)-differential privacy" in guarantee["statement"]
    assert sched["secret_protection"]["holder_shift_l2"] == pytest.approx(2 ** 0.5)
    # the blow-up reached depends on the private secret incidence: it is not released
    assert "worst_blow_up" not in json.dumps(ledger) and "compositions" not in sched["secret_protection"]
    # one Gaussian mechanism per round on (sizes, centres), sensitivity sqrt(2), charged once for T rounds
    assert schedule["sensitivity"] == pytest.approx(2 ** 0.5) and schedule["releases"] == 2
    assert schedule["scale"] == pytest.approx(sched["sigma"]) and schedule["secure"] is True
    rounds = [e for e in ledger["entries"] if e["name"].startswith("secpe.round-")]
    assert {e["name"] for e in rounds} == {f"secpe.round-00{t}.class-{c}" for t in (1, 2) for c in range(3)}
    assert all(e["secure"] is True and e["accounted_in"] == "secpe.schedule" and not e["charged"] for e in rounds)
    evolution = json.loads((out / "evolution.json").read_text())
    assert evolution["llm_calls"] == {"random": 12, "variation": 6}
    # per-round timings grow with |D|: operator state and log only, never in a released file
    assert all(set(r) == {"round", "candidates", "non_documents"} for r in evolution["rounds"])
    for path in out.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".html", ".md"):
            text = path.read_text()
            assert not any(f'"{key}"' in text for key in ("histogram_s", "llm_s", "embed_s")), path
    timings = json.loads((tmp_path / "secpe.private" / "operator" / "round-timings.json").read_text())
    assert [r["round"] for r in timings["rounds"]] == [1, 2] and timings["rounds"][0]["histogram_s"] >= 0


def test_secpe_insecure_reproducible_noise_repeats_and_is_stamped(prefect_harness, corpus_file, tmp_path, fake_llm):
    """The sub-sampling and the noise go through the config's noise source: only the explicit opt-in makes two
    runs bit-identical, and that release is stamped NOT DIFFERENTIALLY PRIVATE."""
    from privseed.flows.evolution import secpe_flow
    from privseed.tasks.dp.mechanisms import INSECURE_STAMP

    public = tmp_path / "public.parquet"
    pd.DataFrame({"text": [f"{TOPICS[i % 3]} public {i}" for i in range(30)]}).to_parquet(public)
    secrets = tmp_path / "secrets.txt"
    secrets.write_text("goals\nglacier\nguitar\n")
    stored = []
    for name in ("a", "b"):
        cfg = _cfg(corpus_file, tmp_path / name, public=str(public), secrets=str(secrets), clusters=6, iterations=1,
                   insecure_reproducible_noise=True, allow_insecure_release=True, noise_multiplier=8.0)
        cfg.pop("epsilon")
        secpe_flow(cfg)
        stored.append(sorted((tmp_path / f"{name}.private").rglob("secpe.round-001.class-*.npz")))
    assert len(stored[0]) == len(stored[1]) == 3
    for first, second in zip(*stored):
        with np.load(first) as a, np.load(second) as b:
            np.testing.assert_array_equal(a["noisy"], b["noisy"])
    ledger = json.loads((tmp_path / "a" / "ledger.json").read_text())
    assert ledger["stamp"] == INSECURE_STAMP
    assert all(e["secure"] is False for e in ledger["entries"] if e["name"].startswith("secpe."))


def test_secpe_cli_states_its_guarantee(prefect_harness, corpus_file, tmp_path, fake_llm, capsys):
    """The CLI reports SecPE's (p, r) protection, and its DP epsilon only as conditional."""
    from privseed.flows.cli import main

    public = tmp_path / "public.parquet"
    pd.DataFrame({"text": [f"{TOPICS[i % 3]} public {i}" for i in range(30)]}).to_parquet(public)
    secrets = tmp_path / "secrets.txt"
    secrets.write_text("goals\nglacier\nguitar\n")
    argv = ["secpe", corpus_file, "--public", str(public), "--out", str(tmp_path / "cli"), "--llm", "local:fake-topics",
            "--secrets", str(secrets), "--clusters", "6", "--iterations", "2", "--population", "2", "--variations", "1",
            "--no-gate", "--no-progress", "--doc-type", "short text", "--labels", "0,1,2", "--noise-multiplier", "8"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "(p, r) = (0.0001, 0.001) secret protection for the detected secrets, not DP" in printed
    assert "only if rho is taken as fixed" in printed


@pytest.mark.parametrize("llm", ["local:fake-topics", "anthropic:claude-haiku-4-5"])
def test_dry_run_plans_and_prices_without_sending(prefect_harness, corpus_file, tmp_path, fake_llm, capsys, llm):
    from privseed.flows.cli import main
    from privseed.tasks.pe.evolution import evolution_call_plan

    out = tmp_path / "dry"
    argv = ["augpe", corpus_file, "--out", str(out), "--llm", llm, "--epsilon", "4", "--delta", "1e-5",
            "--iterations", "3", "--population", "2", "--variations", "2", "--vocab-words", "--max-tokens", "50",
            "--dry-run", "--labels", "0,1,2"]
    status = main(argv)
    captured = capsys.readouterr()
    assert status == 0, captured.err
    printed = captured.out
    plan = evolution_call_plan(3, 2, 2, 3)
    assert f"{plan['random']} RANDOM_API + {plan['variation']} VARIATION_API" in printed
    assert f"{plan['total']} LLM calls (0 already cached" in printed
    assert f"at most {plan['total'] * 50:,} output tokens" in printed
    assert "sigma=" in printed and "eps_voc=1" in printed
    assert ("$" in printed) if llm.startswith("anthropic") else "cost at most $0.0000" in printed
    assert fake_llm.calls == 0 and not out.exists() and not (tmp_path / "dry.private" / "runs").exists()


def test_flows_handle_dry_run_themselves_before_the_ledger_opens(prefect_harness, corpus_file, tmp_path, fake_llm):
    """A deployment that passes dry_run: true (no CLI involved) draws, charges and sends nothing."""
    from privseed.flows.evolution import augpe_flow, secpe_flow

    public = tmp_path / "public.parquet"
    pd.DataFrame({"text": [f"{TOPICS[i % 3]} public {i}" for i in range(30)]}).to_parquet(public)
    result = augpe_flow(_cfg(corpus_file, tmp_path / "a", dry_run=True))
    assert result["dry_run"] and result["plan"]["total"] == 3 * 2 * 2 + 3 * 2 * 1
    cfg = _cfg(corpus_file, tmp_path / "s", dry_run=True, public=str(public), clusters=6)
    cfg.pop("epsilon")
    assert secpe_flow(cfg)["dry_run"]  # without --noise-multiplier: the plan says a release needs one
    assert fake_llm.calls == 0
    assert not any(tmp_path.glob("*/runs")) and not (tmp_path / "a").exists() and not (tmp_path / "s").exists()


@pytest.mark.parametrize("method", ["augpe", "secpe"])
def test_pe_methods_refuse_undeclared_labels(prefect_harness, corpus_file, tmp_path, fake_llm, method):
    from privseed.flows.evolution import augpe_flow, secpe_flow
    from privseed.tasks.errors import ConfigError

    public = tmp_path / "public.parquet"
    pd.DataFrame({"text": [f"{TOPICS[i % 3]} public {i}" for i in range(30)]}).to_parquet(public)
    cfg = _cfg(corpus_file, tmp_path / method, labels=["0", "1"])
    if method == "secpe":
        cfg.pop("epsilon")
        cfg.update(public=str(public), clusters=6, noise_multiplier=8.0)
    with pytest.raises(ConfigError, match="not in the declared label set"):
        (augpe_flow if method == "augpe" else secpe_flow)(cfg)
    assert fake_llm.calls == 0 and not (tmp_path / f"{method}.private" / "runs").exists()
    cfg.pop("labels")
    with pytest.raises(ConfigError, match="--labels-file"):
        (augpe_flow if method == "augpe" else secpe_flow)(cfg)


def test_secpe_fixed_sigma_is_checked_against_budget(tmp_path):
    from scipy import sparse

    from privseed.tasks.pe.evolution import SecretProtection, advise_secpe_sigma, secpe_noise

    incidence = sparse.csr_matrix(np.array([[1, 0], [1, 1], [0, 0], [0, 1]], dtype=float))
    protection = SecretProtection(p=1e-4, r_over_p=10.0, rounds=2)
    advised = advise_secpe_sigma(protection, incidence)
    assert advised > 0 and advised % 0.5 == 0  # rounded up to a multiple of 0.5
    fixed = secpe_noise(protection, advised, incidence)
    assert fixed.sigma == advised and fixed.worst_blow_up <= 1e-3 and fixed.rho[2] == 1.0  # no secret: always
    assert fixed.protection["sigma_source"] == "config (public --noise-multiplier)"
    with pytest.raises(ConfigError, match="reconstruction bound above r") as refused:
        secpe_noise(protection, advised * 0.4, incidence)
    assert "e-0" not in str(refused.value).split("r = ")[0]  # the private bound itself is not in the message


@pytest.mark.parametrize("r_over_p,noise_multiplier", [(1e4, 2.0), (10.0, 50.0)])
def test_secpe_published_protection_does_not_depend_on_corpus_size(tmp_path, r_over_p, noise_multiplier):
    """What the ledger and evolution.json publish about the secret noise is a function of the configuration: the
    same for a corpus and for one with 1,000 more documents (with r >= 1 the capacity was |D| before)."""
    from scipy import sparse

    from privseed.tasks.config.commands import SecPeConfig
    from privseed.tasks.stages.pe import secret_noise as secpe_noise

    cfg = SecPeConfig.model_validate({"data": "d", "out": str(tmp_path), "public": "p", "llm": "local",
                                      "iterations": 2, "p": 1e-4, "r_over_p": r_over_p,
                                      "noise_multiplier": noise_multiplier, "labels": ["0", "1"]})
    small = sparse.csr_matrix(np.array([[1, 0], [1, 1], [0, 0], [0, 1]], dtype=float))
    large = sparse.vstack([small, sparse.csr_matrix((1000, 2))]).tocsr()
    a, b = secpe_noise(cfg, small), secpe_noise(cfg, large)
    assert a.protection == b.protection
    assert not any(v in (4, 1004, 4.0, 1004.0) for v in a.protection.values() if not isinstance(v, bool))
    if r_over_p * 1e-4 >= 1:
        assert a.protection["r"] == 1.0 and a.protection["eta"].startswith("none")


def test_secpe_flow_releases_the_stated_gaussian(prefect_harness, corpus_file, tmp_path, fake_llm, tiny_corpus):
    """Flow level: (released - exact) of every noisy cluster size follows N(0, sigma^2) (KS), and of every centre,
    in its noise unit c_k, too; two runs with the same flags release different values. r = 1 and a public
    --noise-multiplier (the issue's case) make every rho 1, so the test computes the exact statistics itself from
    the corpus, with no sampling mask to store anywhere."""
    from privseed.tasks.pe import evolution as ev
    from privseed.tasks.data.embedding import embed_texts

    sigma, clusters_k = 3.0, 40
    public = tmp_path / "public.parquet"
    public_texts = [f"{TOPICS[i % 3]} public {i} {'extra ' * (i % 5)}" for i in range(80)]
    pd.DataFrame({"text": public_texts}).to_parquet(public)
    secrets = tmp_path / "secrets.txt"
    secrets.write_text("goals\nglacier\nguitar\n")
    cfg = _cfg(corpus_file, tmp_path / "ks", public=str(public), secrets=str(secrets), clusters=clusters_k, p=1e-4,
               r_over_p=1e4, noise_multiplier=sigma, radius=0.5, state=str(tmp_path / "ks-state"))
    cfg.pop("epsilon")
    from privseed.flows.evolution import secpe_flow

    secpe_flow(cfg)
    # the same flags again, into another folder: --seed is public, so the noise must not come from it
    secpe_flow({**cfg, "out": str(tmp_path / "ks-again"), "state": str(tmp_path / "ks-again-state")})
    clusters = ev.public_kmeans(embed_texts(public_texts), clusters_k, cfg["seed"])
    scales = ev.centre_noise_scales(clusters, 0.5)
    private = embed_texts(tiny_corpus["text"].tolist())
    size_noise, centre_noise = [], []
    values = sorted((tmp_path / "ks-state").rglob("secpe.round-*.npz"))
    again = sorted((tmp_path / "ks-again-state").rglob("secpe.round-*.npz"))
    assert len(values) == len(again) == 2 * 3
    for first, second in zip(values, again):
        with np.load(first) as a, np.load(second) as b:
            assert first.name == second.name and not np.allclose(a["noisy"], b["noisy"])
    for path in values + again:  # both runs: 480 noisy sizes, so that half sigma is rejected by a wide margin
        label = int(path.stem.rsplit("class-", 1)[1])
        members = (tiny_corpus["label"] == label).to_numpy()
        centres, sizes = ev.secret_clustering_exact(clusters, private[members], np.ones(members.sum(), bool),
                                                    radius=0.5)
        with np.load(path) as released:
            size_noise.append(released["sizes"] - sizes)
            centre_noise.append(((released["centres"] - centres) / scales[:, None]).ravel())
            assert released["noisy"][:sizes.size] == pytest.approx(released["sizes"])
    size_noise, centre_noise = np.concatenate(size_noise), np.concatenate(centre_noise)
    assert size_noise.size == 2 * 2 * 3 * clusters.sizes.size >= 400
    for sample in (size_noise, centre_noise):
        # the check can fail: the same draws refute half and twice the stated scale, and no noise at all
        assert_noise_is(sample, "gaussian", sigma)


def test_cli_registers_both_commands():
    from privseed.flows.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["augpe", "d.parquet", "--out", "o", "--epsilon", "2", "--iterations", "3",
                              "--population", "4", "--variations", "2", "--threshold", "1.5", "--selection",
                              "sample", "--vocab-words", "--llm", "local", "--doc-type", "article", "--seed", "1"])
    assert args.per_class == 4 and args.vocab_words and args.selection == "sample"
    args = parser.parse_args(["secpe", "d.parquet", "--public", "p.parquet", "--out", "o", "--p", "1e-4",
                              "--r-over-p", "10", "--clusters", "8", "--secrets", "pii", "--iterations", "2"])
    assert args.public == "p.parquet" and args.r_over_p == 10 and args.secrets == "pii"


# ------------------------------------------------------------------------------------------------------------
# The real local LLM (packaged SmolLM2), tiny: 2 classes, N = 1, K = 1, T = 2, 32 tokens
# ------------------------------------------------------------------------------------------------------------
@pytest.fixture
def two_class_corpus(tmp_path, tiny_corpus) -> str:
    path = tmp_path / "two.parquet"
    tiny_corpus[tiny_corpus["label"] < 2].to_parquet(path, index=False)
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("vocab_words", [False, True])
def test_augpe_end_to_end_with_local_llm(prefect_harness, two_class_corpus, tmp_path, vocab_words):
    from privseed.flows.evolution import run_augpe

    extra = {"vocab_words": True, "vocab_size": 20, "vocab_top": 5000, "words_per_prompt": 3} if vocab_words else {}
    out = run_augpe(_cfg(two_class_corpus, tmp_path / "local", llm="local", per_class=1, max_tokens=32,
                         labels=["0", "1"], epsilon=4.0, **extra))
    manifest, frame, ledger = _read_release(Path(out))
    assert manifest["rows"] == 2 and frame["backend"].eq("local").all()
    assert frame["text"].str.len().gt(0).all() and frame["tokens_out"].gt(0).all()
    expected = 4.0 + (1.0 if vocab_words else 0.0)
    assert ledger["total"]["epsilon"] == pytest.approx(expected)


@pytest.mark.slow
def test_secpe_end_to_end_with_local_llm(prefect_harness, two_class_corpus, tmp_path):
    from privseed.flows.evolution import run_secpe

    public = tmp_path / "public.parquet"
    pd.DataFrame({"text": [f"{TOPICS[i % 3]} public {i}" for i in range(12)]}).to_parquet(public)
    cfg = _cfg(two_class_corpus, tmp_path / "local-secpe", llm="local", per_class=1, max_tokens=32, labels=["0", "1"],
               public=str(public), clusters=4, secrets="words", secret_quantile=0.02, secret_count=400,
               noise_multiplier=20.0)
    cfg.pop("epsilon")
    out = run_secpe(cfg)
    manifest, frame, _ = _read_release(Path(out))
    assert manifest["rows"] == 2 and frame["text"].str.len().gt(0).all()


def test_secpe_releases_no_sigma_or_epsilon_computed_from_the_private_data(tmp_path):
    """Issue 30, item 2: sigma was calibrated on the secret incidence and released with the epsilon it implies
    (3 documents each holding one secret: sigma 5.03; one more document holding none: 3.48). A release now needs
    the public --noise-multiplier, and what it publishes (sigma, the conditional DP epsilon, the protection) is the
    same for adjacent corpora, including under --rho-norm paper (where the calibrated sigma encoded |D|)."""
    from scipy import sparse

    from privseed.tasks.config.commands import SecPeConfig, validate_config
    from privseed.tasks.pe.evolution import advise_secpe_sigma
    from privseed.tasks.stages.pe import secret_noise as secpe_noise, secret_protection

    base = {"data": "d", "out": str(tmp_path), "public": "p", "llm": "local", "labels": ["0"]}
    with pytest.raises(ConfigError, match="--noise-multiplier"):
        validate_config(SecPeConfig, base)
    holders = sparse.csr_matrix(np.eye(3))
    plus_one = sparse.vstack([holders, sparse.csr_matrix((1, 3))]).tocsr()
    for rho_norm in ("max", "paper"):
        cfg = SecPeConfig.model_validate({**base, "noise_multiplier": 40.0, "rho_norm": rho_norm})
        a, b = secpe_noise(cfg, holders), secpe_noise(cfg, plus_one)
        assert (a.sigma, a.protection) == (b.sigma, b.protection) and a.sigma == 40.0
        advice = SecPeConfig.model_validate({**base, "advise_sigma": True, "rho_norm": rho_norm})
        # the data-calibrated number is advice for the owner only
        assert advise_secpe_sigma(secret_protection(advice), holders) > 0


def test_secpe_advice_reads_the_corpus_and_writes_nothing(prefect_harness, corpus_file, tmp_path, fake_llm):
    from privseed.flows.evolution import secpe_flow

    public = tmp_path / "public.parquet"
    pd.DataFrame({"text": [f"{TOPICS[i % 3]} public {i}" for i in range(30)]}).to_parquet(public)
    secrets = tmp_path / "secrets.txt"
    secrets.write_text("goals\nglacier\nguitar\n")
    cfg = _cfg(corpus_file, tmp_path / "advice", public=str(public), secrets=str(secrets), clusters=6,
               advise_sigma=True)
    cfg.pop("epsilon")
    result = secpe_flow(cfg)
    assert result["advice"] and result["sigma"] > 0 and "--noise-multiplier" in result["lines"][0]
    assert fake_llm.calls == 0 and not (tmp_path / "advice").exists()
    assert not (tmp_path / "advice.private" / "runs").exists()  # no ledger opened, nothing drawn or charged
