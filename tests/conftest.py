"""Shared fixtures. Settings that make Prefect, GX and the models work offline are set before any import
of them; every test session gets its own PREFECT_HOME so runs never touch a user's Prefect database."""

from __future__ import annotations

import atexit
import importlib.util
import multiprocessing
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if "PREFECT_HOME" not in os.environ:
    # Made by the first process only: pytest-xdist's workers and the processes tests start inherit it, and one made
    # in each of them stayed behind empty (they end without running atexit). Registered first, so it runs last at
    # exit, after Prefect's own handlers stopped the test servers that wrote there (a 6 MB database otherwise left).
    _HOME = tempfile.mkdtemp(prefix="privseed-tests-")
    atexit.register(shutil.rmtree, _HOME, ignore_errors=True)
    os.environ["PREFECT_HOME"] = os.path.join(_HOME, "prefect")
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "120"
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_LOGGING_TO_API_ENABLED"] = "false"
os.environ["GX_ANALYTICS_ENABLED"] = "false"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["DO_NOT_TRACK"] = "1"
# make test runs three test processes on two cores, each with its flows' workers: one math thread a process (torch,
# OpenBLAS), or their OpenMP threads spin-wait for cores the others hold (a fine-tune under that load took 33 s with
# two threads and 19 s with one). A value the caller sets wins. The local LLM already runs one thread a model.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# A flow's LocalCluster starts its worker processes from a fork server in the suite, not by spawn as in a run: the
# server (one clean, single-threaded process per test process) imports pandas, pyarrow, torch and privseed once
# (WORKER_PRELOAD below), and each worker forks from it with them loaded, where a spawned worker spends seconds
# importing them again in every one of the suite's flows (make test: 10 min instead of 16). A plain fork of the
# test process was as fast and hung a flow now and then: it copies locks other threads hold at that instant. The
# environment a test sets after the server started reaches the workers through the Nanny (_LocalClusterWithEnv).
# Spawned workers stay covered: SPAWN_FILES below, test_external_cluster's `dask worker` processes and the README
# script (tests/test_api.py) start as users start them.
os.environ.setdefault("DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD", "forkserver")


def users_environment() -> dict[str, str]:
    """This process's environment without the suite's fork server setting: for a process that must start its
    workers as a user's does (spawn)."""
    return {key: value for key, value in os.environ.items()
            if key != "DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD"}


# pytest-xdist's workers (make test) ignore SIGINT, and an ignored signal stays ignored in every process they start:
# a test that sends its child Ctrl-C would wait for nothing. The worker takes SIGINT as Python does by default.
if os.environ.get("PYTEST_XDIST_WORKER") and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Prefect sets up its console log handlers once per process, on the stream sys.stderr is at that moment. The CLI
# imports Prefect only to run a command, so without this the first test that runs the CLI under capsys would bind
# them to that test's capture, which is closed when it ends, and every later log line of the session would fail.
import prefect.main  # noqa: E402,F401
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

import distributed  # noqa: E402
from distributed.utils import get_mp_context  # noqa: E402
from distributed.versions import optional_packages, required_packages  # noqa: E402

#: What the fork server imports before it forks a worker, beside distributed's own list (distributed and the
#: installed packages it reports): the modules a privseed worker runs (the flows import every stage).
WORKER_PRELOAD = ("torch", "sentence_transformers", "privseed.flows.dpkps", "privseed.flows.evolution")
get_mp_context()  # distributed sets its list once, at its first call: the list below replaces it
multiprocessing.get_context("forkserver").set_forkserver_preload(
    ["distributed", *(name for name in (*required_packages, *optional_packages) if importlib.util.find_spec(name)),
     *WORKER_PRELOAD])


class _LocalClusterWithEnv(distributed.LocalCluster):
    """The suite's LocalCluster: its Nanny sets the test process's environment of now in each worker (a forked
    server's child has the server's, from when it started; a test may have set AWS_ENDPOINT_URL or a fake API's
    address since)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("processes", True):  # threads of this process (processes=False) have its environment
            kwargs.setdefault("env", dict(os.environ))
        super().__init__(*args, **kwargs)


distributed.LocalCluster = _LocalClusterWithEnv  # type: ignore[misc]

# Real S3-compatible server (moto_server on 127.0.0.1) fixtures: moto_server, s3_bucket, ...
pytest_plugins = ["tests.s3server"]

REPO = Path(__file__).resolve().parents[1]
# The public corpora (docs/datasets.md) are found through $PRIVSEED_DATA_ROOT, as experiment files find them. When
# it is unset, the development checkout's sibling data folder is the default, so tests that read real documents
# run there and skip elsewhere; the variable is set for the session, so `{data}` in experiments/*.toml resolves too.
_SIBLING_DATA = REPO.parent / "shared" / "data"
if not os.environ.get("PRIVSEED_DATA_ROOT") and _SIBLING_DATA.is_dir():
    os.environ["PRIVSEED_DATA_ROOT"] = str(_SIBLING_DATA)
DATA_ROOT = Path(os.environ.get("PRIVSEED_DATA_ROOT") or _SIBLING_DATA)


@pytest.fixture(scope="session")
def prefect_harness():
    """One ephemeral Prefect API for the whole session (it takes 15-36 s to start on two cores)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def tiny_corpus() -> pd.DataFrame:
    """A small labelled corpus with real words, three classes, in the shape of the private input."""
    topics = {
        0: ["football club player scored goals league season", "striker signed contract club league",
            "goalkeeper saved penalty match season", "coach team won championship league title"],
        1: ["river valley mountain lake forest village", "mountain peak glacier valley river",
            "lake shore forest island river", "forest national park mountain trail lake"],
        2: ["album band song released records guitar", "singer recorded album single records",
            "band tour guitar drums album", "song chart single album music video"],
    }
    rows = [(text, label) for label, texts in topics.items() for text in texts for _ in range(3)]
    return pd.DataFrame(rows, columns=["text", "label"])


@pytest.fixture
def corpus_file(tmp_path, tiny_corpus) -> str:
    path = tmp_path / "corpus.parquet"
    tiny_corpus.to_parquet(path, index=False)
    return str(path)


def write_shards(frame: pd.DataFrame, folder: Path, n_shards: int = 2, row_group_rows: int = 4) -> str:
    """``frame`` as ``n_shards`` Parquet shards of row groups of ``row_group_rows`` rows under ``folder``: a corpus
    that plans into several work units (tasks/data/units.py) even when it is tiny."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    for index, rows in enumerate(np.array_split(np.arange(len(frame)), n_shards)):
        table = pa.Table.from_pandas(frame.iloc[rows], preserve_index=False)
        pq.write_table(table, folder / f"part-{index:05d}.parquet", row_group_size=row_group_rows)
    return str(folder)


def corpus_plan(frame: pd.DataFrame, folder: Path, n_shards: int = 2, row_group_rows: int = 4, unit_rows: int = 8):
    """The work units of ``frame`` written by ``write_shards`` (several units per shard)."""
    from privseed.tasks.data.units import plan_corpus

    return plan_corpus(write_shards(frame, folder, n_shards, row_group_rows), unit_rows=unit_rows)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)


#: The test files that take longest, longest first: each file's summed test time in `make test --durations=0` on
#: 2 cores, 3 workers, 2026-12-01 (test_audit 273 s, test_evolution_flow 123 s ... test_accounting 30 s; the suite
#: is CPU-bound there: 1,578 s of test time in 557 s, the same 560 s on 4 workers). test_lint is placed at its
#: fresh clone's time, mypy's cold cache (about 30 s; 4 s with the cache).
#: `make test` hands whole files to its workers (--dist loadfile) in collection order, so these go first and the
#: short files fill the gaps at the end (longest-processing-time-first scheduling).
LONGEST_FILES = ("test_audit", "test_evolution_flow", "test_evaluate_flow", "test_config_contract", "test_quality",
                 "test_external_cluster", "test_deployments", "test_api", "test_generation_parts",
                 "test_release_privacy", "test_budget_control", "test_llm_generation", "test_fault_tolerance",
                 "test_noise_flows", "test_approval", "test_s3_pipeline", "test_lint", "test_canary", "test_accounting",
                 "test_llm_cache", "test_llm_privacy", "test_llm_anthropic", "test_pe_units", "test_classify",
                 "test_dpkps_flow", "test_cli", "test_streaming_flow", "test_llm_server")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: index for index, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: tests keep their order in a file


#: Test files whose flows start their LocalCluster's workers by spawn, as a run does (the suite forks them: above):
#: the pipeline on object storage as users run it, and the files that run several flows at once in threads.
SPAWN_FILES = ("test_s3_pipeline", "test_approval", "test_deployments")


@pytest.fixture(autouse=True)
def _spawned_workers_in_spawn_files(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.path.stem not in SPAWN_FILES:
        yield
        return
    import dask

    with dask.config.set({"distributed.worker.multiprocessing-method": "spawn"}):
        yield
