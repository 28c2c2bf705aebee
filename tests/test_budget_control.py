"""The privacy budget is the owner's to control (issue 46, "Privacy, third pass"): an option the chosen method does
not read is refused, not ignored; an unfinished run is resumed or refused, never silently charged again; the release
never goes into the private corpus or among foreign files; and the temporary server a run starts stops with it.

The three refusals of the issue run through the command line, each one line on stderr and exit status 2 before
Prefect or Dask start, with nothing charged and nothing written."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest

from privseed.tasks.config import preflight
from privseed.tasks.config.commands import AugPeConfig, DpKpsConfig, SecPeConfig, build_config, validate_config
from privseed.tasks.errors import ConfigError, UnfinishedRunError
from privseed.tasks.dp.ledger import PrivacyLedger, cumulative_total, unfinished_runs
from privseed.tasks.dp.mechanisms import LaplaceMechanism, secure_noise
from privseed.tasks.seeds.seed_methods import HISTOGRAM_METHODS, METHOD_OPTIONS, SEED_METHODS, method_options
from tests.test_cli import REPO, run_cli

LABELS = ["--labels", "0,1,2"]
#: How a refusal names the methods that read a histogram option ("histogram and histogram-markov"), from the registry.
HISTOGRAM_LISTED = " and ".join([", ".join(HISTOGRAM_METHODS[:-1]), HISTOGRAM_METHODS[-1]])


@pytest.fixture
def corpus(tmp_path) -> Path:
    """A private corpus in a folder of its own: ``tmp_path/private/corpus.parquet``."""
    folder = tmp_path / "private"
    folder.mkdir()
    path = folder / "corpus.parquet"
    pd.DataFrame({"text": ["a football club", "a river valley", "an album"] * 2, "label": [0, 1, 2] * 2}).to_parquet(
        path)
    return path


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def _unfinished_run(state: Path, run_id: str = "run-killed") -> PrivacyLedger:
    """A run of ``state`` that drew one value and did not publish (what a killed run leaves)."""
    ledger = PrivacyLedger(str(state), "some-corpus", run_id)
    ledger.draw_once("vocabulary", mechanism=LaplaceMechanism(sensitivity=1.0, epsilon=1.0), noise=secure_noise(),
                     params={"S": 1}, stage="vocabulary", exact=lambda: np.zeros(3))
    return ledger


def _one_line(result: dict) -> str:
    lines = result["err"].strip().splitlines()
    assert result["code"] == 2, result
    assert len(lines) == 1, result["err"]
    return lines[0]


# ---------------------------------------------------------------------------------------------------------
# The three cases of the issue, through the command line
# ---------------------------------------------------------------------------------------------------------
def test_the_three_budget_cases_are_refused_in_one_line_before_anything_starts(corpus, tmp_path):
    out = tmp_path / "release"
    state = tmp_path / "release.private"
    _unfinished_run(state)
    state_before = _tree(state)
    results, heavy = run_cli(
        # (a) --epsilon with the paper's independent sampler (the default until 2026-11-28), which spends --eps-voc
        # and --eps-kde
        ["dpkps", corpus, "--out", tmp_path / "a", *LABELS, "--method", "independent", "--epsilon", "5"],
        # (b) the same command again after a run that drew values and did not publish
        ["dpkps", corpus, "--out", out, *LABELS],
        # (c) --out the folder that holds the corpus, the corpus itself, a folder inside it
        ["dpkps", corpus, "--out", corpus.parent, *LABELS],
        ["dpkps", corpus.parent, "--out", corpus.parent, *LABELS],
        ["dpkps", corpus.parent, "--out", corpus.parent / "release", *LABELS],
    )
    assert heavy == []
    epsilon, unfinished, *inside = (_one_line(r) for r in results)
    assert epsilon.startswith("privseed dpkps: error: ")
    assert (f"--epsilon applies to --method {HISTOGRAM_LISTED} only; --method independent spends --eps-voc"
            in epsilon and "--eps-kde" in epsilon)
    assert "run-killed" in unfinished and "--run-id run-killed" in unfinished and "--new-run" in unfinished
    for line, relation in zip(inside, ("holds", "is", "lies inside")):
        assert f"{relation} the private corpus" in line, line
    # nothing charged, nothing written
    assert _tree(state) == state_before and unfinished_runs(str(state)) == ["run-killed"]
    assert not (tmp_path / "a").exists() and not (tmp_path / "a.private").exists() and not out.exists()
    assert _tree(corpus.parent) == ["corpus.parquet"] and not (tmp_path / "private.private").exists()


# ---------------------------------------------------------------------------------------------------------
# (a) an option the run does not read is refused
# ---------------------------------------------------------------------------------------------------------
BASE = {"data": "d.parquet", "out": "o", "labels": ["a", "b"]}


def test_every_method_option_is_a_field_and_some_method_reads_it():
    assert METHOD_OPTIONS <= set(DpKpsConfig.model_fields)
    assert all(any(name in m.options for m in SEED_METHODS.values()) for name in METHOD_OPTIONS)
    assert all(m.budget for m in SEED_METHODS.values())


#: A value other than the default of each option whose doubled default is not one (and what it needs besides).
OTHER_VALUES: dict[str, dict[str, object]] = {
    "epsilon": {"epsilon": 5.0}, "hist_denoise": {"hist_denoise": "clip"}, "embedding_model": {"embedding_model": "m"},
    "hist_contribution": {"hist_contribution": "unit-l2", "mechanism": "gaussian", "delta": 1e-6},
    "markov_term_share": {"markov_term_share": 0.5}, "hist_background_cap": {"hist_background_cap": 0.5},
    "hist_top_k": {"hist_top_k": 500}, "hist_seed_pool": {"hist_seed_pool": 800}}  # their defaults are "auto"


def _other_value(name: str) -> dict[str, object]:
    if name in OTHER_VALUES:
        return OTHER_VALUES[name]
    return {name: DpKpsConfig.model_fields[name].get_default(call_default_factory=True) * 2}


@pytest.mark.parametrize("name", sorted(METHOD_OPTIONS))
def test_a_method_option_is_refused_for_a_method_that_does_not_read_it(name):
    for method, spec in SEED_METHODS.items():
        values = {**BASE, "method": method, **_other_value(name)}
        assert values[name] != DpKpsConfig.model_fields[name].get_default(call_default_factory=True)
        if name in spec.options:
            assert getattr(validate_config(DpKpsConfig, values), name) == values[name]
            continue
        with pytest.raises(ConfigError, match=f"applies to --method .*; --method {method} spends") as refused:
            validate_config(DpKpsConfig, values)
        assert str(refused.value).count("\n") == 0


def test_a_default_given_explicitly_is_no_choice_and_a_dict_shared_by_methods_is_filtered():
    """A deployment's form sends every field with its default; an experiment grid's [dpkps] table is shared by every
    method and is filtered by method_options."""
    default_top_k = DpKpsConfig.model_fields["hist_top_k"].get_default()
    assert validate_config(DpKpsConfig, {**BASE, "method": "independent", "hist_top_k": default_top_k,
                                         "epsilon": None}).method == "independent"
    shared = {"vocab_size": 40, "n_features": 32, "hist_top_k": 20, "markov_pair_top": 8, "length": 4}
    assert method_options("histogram", shared) == {"hist_top_k": 20, "length": 4}
    for method in SEED_METHODS:
        validate_config(DpKpsConfig, {**BASE, "method": method, **method_options(method, shared)})


def test_the_environment_and_a_config_file_set_options_too(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIVSEED_EPSILON", "5")
    with pytest.raises(ConfigError, match="--epsilon applies to --method histogram"):
        build_config(DpKpsConfig, {**BASE, "method": "independent"})
    assert build_config(DpKpsConfig, {**BASE, "method": "histogram"}).histogram_epsilon == 5.0
    monkeypatch.delenv("PRIVSEED_EPSILON")
    file = tmp_path / "c.toml"
    file.write_text("hist_top_k = 20\n")
    with pytest.raises(ConfigError, match=f"--hist-top-k applies to --method {HISTOGRAM_LISTED} only"):
        build_config(DpKpsConfig, {**BASE, "method": "independent"}, str(file))


def test_the_other_options_that_only_some_runs_read():
    refusals = {
        "--top-k is a parameter of --selection top-k": {"top_k": 3},
        "--power is a parameter of --selection power, and this run draws with --method histogram's own rule": {
            "method": "histogram", "power": 3.0},
        "--delta applies to --mechanism gaussian and laplace-threshold only": {"method": "independent",
                                                                               "delta": 1e-6},
    }
    for message, values in refusals.items():
        with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
            validate_config(DpKpsConfig, {**BASE, **values})
    assert validate_config(DpKpsConfig, {**BASE, "selection": "top-k", "top_k": 3}).top_k == 3
    assert validate_config(DpKpsConfig, {**BASE, "mechanism": "gaussian", "delta": 1e-6}).delta == 1e-6
    with pytest.raises(ConfigError, match=r"--eps-voc applies to AugPE\+V~ \(--vocab-words\) only"):
        validate_config(AugPeConfig, {**BASE, "eps_voc": 2.0})
    assert validate_config(AugPeConfig, {**BASE, "vocab_words": True, "eps_voc": 2.0}).eps_voc == 2.0
    with pytest.raises(ConfigError, match="--mask-fraction applies to --variation fill-blanks and mixed only"):
        validate_config(AugPeConfig, {**BASE, "variation": "paraphrase", "mask_fraction": 0.5})
    secpe = {**BASE, "public": "p.parquet", "noise_multiplier": 3.0}
    with pytest.raises(ConfigError, match="--secret-count applies to --secrets words only; --secrets pii"):
        validate_config(SecPeConfig, {**secpe, "secrets": "pii", "secret_count": 5})


# ---------------------------------------------------------------------------------------------------------
# (b) an unfinished run is resumed or refused
# ---------------------------------------------------------------------------------------------------------
def test_unfinished_runs_are_those_that_drew_and_did_not_publish(tmp_path):
    state = tmp_path / "state"
    assert unfinished_runs(str(state)) == []
    PrivacyLedger(str(state), "c", "run-opened")  # opened, nothing drawn: nothing to resume, nothing spent
    published = _unfinished_run(state, "run-published")
    published.write_owner_ledger()
    _unfinished_run(state, "run-killed")
    assert unfinished_runs(str(state)) == ["run-killed"]
    total = cumulative_total(str(state))
    assert total["epsilon"] == pytest.approx(2.0) and len(total["runs"]) == 2
    assert published.cumulative_total()["epsilon"] == total["epsilon"]


def test_an_unfinished_run_is_resumed_with_its_id_or_replaced_on_request(corpus, tmp_path):
    out = tmp_path / "release"
    _unfinished_run(tmp_path / "release.private", "run-killed")
    values = {"data": str(corpus), "out": str(out), "labels": ["0", "1", "2"]}
    with pytest.raises(UnfinishedRunError, match="--run-id run-killed"):
        preflight.check_no_unfinished_run(validate_config(DpKpsConfig, values))
    preflight.check_no_unfinished_run(validate_config(DpKpsConfig, {**values, "run_id": "run-killed"}))
    preflight.check_no_unfinished_run(validate_config(DpKpsConfig, {**values, "new_run": True}))
    preflight.check_no_unfinished_run(validate_config(DpKpsConfig, {**values, "dry_run": True}))  # charges nothing
    with pytest.raises(ConfigError, match="not both"):
        validate_config(DpKpsConfig, {**values, "new_run": True, "run_id": "run-killed"})
    # a state of its own (--state) is checked the same way
    with pytest.raises(UnfinishedRunError, match="run-killed"):
        preflight.check_no_unfinished_run(validate_config(DpKpsConfig, {
            **values, "out": str(tmp_path / "other"), "state": str(tmp_path / "release.private")}))


def test_stdout_states_the_cumulative_budget_of_the_state(tmp_path):
    from privseed.tasks.stages.ledger import state_summary

    state = tmp_path / "release.private"
    for run_id in ("run-a", "run-b"):
        _unfinished_run(state, run_id).write_owner_ledger()
    cfg = validate_config(DpKpsConfig, {"data": "d.parquet", "out": str(tmp_path / "release"), "labels": ["a"]})
    line = state_summary(cfg)
    assert str(state) in line and "cumulative epsilon=2, delta=0 over 2 runs" in line


# ---------------------------------------------------------------------------------------------------------
# (c) the release folder
# ---------------------------------------------------------------------------------------------------------
def test_out_is_refused_inside_the_corpus_and_compared_normalised(tmp_path):
    with pytest.raises(ConfigError, match="holds the private corpus"):
        validate_config(DpKpsConfig, {**BASE, "data": "s3://bucket/private/train.parquet",
                                      "out": "s3://bucket//private/"})
    with pytest.raises(ConfigError, match="lies inside the private corpus"):
        validate_config(DpKpsConfig, {**BASE, "data": "s3://bucket/private", "out": "s3://bucket/x/../private/rel"})
    validate_config(DpKpsConfig, {**BASE, "data": "s3://bucket/private", "out": "s3://bucket/private-release"})
    (tmp_path / "data").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "data")
    with pytest.raises(ConfigError, match="--out .* is the private corpus"):
        validate_config(DpKpsConfig, {**BASE, "data": str(tmp_path / "data"), "out": str(tmp_path / "link")})
    with pytest.raises(ConfigError, match="--state .* lies inside the private corpus"):
        validate_config(DpKpsConfig, {**BASE, "data": str(tmp_path / "data"), "out": str(tmp_path / "rel"),
                                      "state": str(tmp_path / "data" / "state")})


def test_out_with_foreign_files_is_refused_a_release_or_an_unfinished_one_is_not(tmp_path):
    def check(out: Path) -> None:
        preflight.check_release_folder(validate_config(DpKpsConfig, {**BASE, "out": str(out)}))

    check(tmp_path / "new")
    (tmp_path / "empty").mkdir()
    check(tmp_path / "empty")
    home = tmp_path / "home"
    home.mkdir()
    for name in ("notes.txt", "train.parquet", "photos", "thesis.tex"):
        (home / name).write_text("mine")
    with pytest.raises(ConfigError, match=r"holds files that are not a privseed release \(notes.txt, photos, "
                                          r"thesis.tex and 1 more\)"):
        check(home)
    assert sorted(p.name for p in home.iterdir()) == ["notes.txt", "photos", "thesis.tex", "train.parquet"]
    unfinished = tmp_path / "unfinished"  # parts written, the manifest not yet
    (unfinished / "synthetic").mkdir(parents=True)
    (unfinished / "synthetic" / "part-00000-x.parquet").write_bytes(b"")
    (unfinished / "ledger.json.tmp-1a2b3c4d").write_text("{}")
    check(unfinished)
    release = tmp_path / "release"
    release.mkdir()
    (release / "manifest.json").write_text(json.dumps({"format": "privseed-release/1"}))
    (release / "report.html").write_text("<html/>")
    check(release)
    (release / "manifest.json").write_text(json.dumps({"format": "someone-else/2"}))
    with pytest.raises(ConfigError, match=r"not a privseed release \(manifest.json\)"):
        check(release)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        check(tmp_path / "file")


# ---------------------------------------------------------------------------------------------------------
# A temporary server stops when its run dies
# ---------------------------------------------------------------------------------------------------------
#: A "run" that starts a "server" (a sleeping child) for itself the way the command line starts Prefect's, prints
#: the server's pid and waits to be ended.
_RUN = textwrap.dedent("""
    import subprocess, sys, time
    from privseed.tasks._runtime import RunEnded, ended_like_ctrl_c, stopped_with_the_run
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        with ended_like_ctrl_c(), stopped_with_the_run(server.pid, server.terminate):
            print(server.pid, flush=True)
            time.sleep(120)
    except RunEnded as ended:
        sys.exit(ended.exit_status)
""")


def _gone(pid: int, within: float) -> bool:
    """Whether process ``pid`` has exited (a zombie waiting for whoever adopted it counts as exited)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("ending", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGKILL])
def test_the_server_a_run_started_stops_however_the_run_ends(ending):
    run = subprocess.Popen([sys.executable, "-c", _RUN], stdout=subprocess.PIPE, text=True, cwd=REPO,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        server = int(run.stdout.readline())
        assert not _gone(server, within=0.2)
        run.send_signal(ending)
        code = run.wait(timeout=30)
        # SIGKILL: no handler runs; the watchdog stops the server once the run is gone
        assert _gone(server, within=10), f"the server outlived its run ({ending.name})"
    finally:
        run.kill()
    # an uncaught KeyboardInterrupt ends Python by SIGINT, as the shell expects
    expected = {signal.SIGKILL: -signal.SIGKILL, signal.SIGINT: -signal.SIGINT}.get(ending, 128 + ending)
    assert code == expected


def _prefect_server_of(run: subprocess.Popen, within: float) -> psutil.Process:
    """The temporary Prefect server a `privseed` process started, once it answers."""
    import httpx

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        assert run.poll() is None, run.stderr.read() if run.stderr else run.returncode
        for child in psutil.Process(run.pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                command = child.cmdline()
                if "prefect.server.api.server:create_app" in command:
                    port = command[command.index("--port") + 1]
                    with contextlib.suppress(httpx.HTTPError):
                        if httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=1).status_code == 200:
                            return child
        time.sleep(0.2)
    raise AssertionError("no temporary Prefect server answered")


@pytest.mark.slow
@pytest.mark.parametrize("ending", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_dpkps_run_leaves_no_prefect_server_behind(corpus, tmp_path, ending):
    """Issue 46: a run killed mid-way kept its temporary Prefect server running. The real command line, the real
    temporary server (no PREFECT_API_URL): ended by SIGTERM it stops the server itself, killed outright its
    watchdog does."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(PYTHONPATH=str(REPO), PREFECT_HOME=str(tmp_path / "prefect-home"))
    run = subprocess.Popen([sys.executable, "-m", "privseed.flows.cli", "dpkps", str(corpus), "--out",
                            str(tmp_path / "release"), *LABELS, "--llm", "none", "--workers", "1"],
                           cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    server = None
    try:
        server = _prefect_server_of(run, within=240)
        time.sleep(1.0)  # the run goes on into its flow
        run.send_signal(ending)
        code = run.wait(timeout=60)
        assert _gone(server.pid, within=15), f"the Prefect server outlived the run ({ending.name})"
    finally:
        run.kill()
        if server is not None:  # a failed check leaves no server behind (psutil refuses a reused pid)
            with contextlib.suppress(psutil.NoSuchProcess):
                server.kill()
    assert code == (128 + ending if ending != signal.SIGKILL else -signal.SIGKILL), run.stderr.read()


def test_a_signal_a_library_wraps_in_its_own_error_still_ends_the_run_with_its_status(monkeypatch, capsys):
    """A SIGTERM that lands while pydantic-core serializes a model reaches the command as
    ``PydanticSerializationError: ... RunEnded: SIGTERM`` (a killed-run test on a loaded machine, 2026-11-30): the
    command ends as for any SIGTERM (143, the resume hint), not as an internal error (1)."""
    from pydantic import BaseModel, model_serializer

    from privseed.flows import cli
    from privseed.tasks import _runtime

    class Serialized(BaseModel):
        x: int = 0

        @model_serializer
        def _ser_model(self) -> dict:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises RunEnded here, inside pydantic-core's call
            return {}

    raised: list[str] = []

    def run(args) -> int:
        with _runtime.ended_like_ctrl_c():
            try:
                Serialized().model_dump()
            except Exception as exc:
                raised.append(f"{type(exc).__name__}: {exc}")
                raise
        return 0

    monkeypatch.setattr(_runtime, "_RAISED", [])
    monkeypatch.setitem(cli.COMMANDS_BY_NAME, "audit", types.SimpleNamespace(run=run))
    assert cli.main(["audit"]) == 128 + signal.SIGTERM
    assert raised and raised[0].startswith("PydanticSerializationError") and "RunEnded: SIGTERM" in raised[0]
    assert "ended by SIGTERM" in capsys.readouterr().err
