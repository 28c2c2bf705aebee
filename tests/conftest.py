"""Shared fixtures. Settings that make Prefect, GX and the models work offline are set before any import
of them; every test session gets its own PREFECT_HOME so runs never touch a user's Prefect database."""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

_HOME = tempfile.mkdtemp(prefix="privseed-tests-")
os.environ.setdefault("PREFECT_HOME", os.path.join(_HOME, "prefect"))
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "120"
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_LOGGING_TO_API_ENABLED"] = "false"
os.environ["GX_ANALYTICS_ENABLED"] = "false"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["DO_NOT_TRACK"] = "1"
# A flow's LocalCluster starts its worker processes by fork in the suite, not by spawn as in a run: a forked worker
# has this process's imports (pandas, pyarrow, torch, privseed) already, where a spawned one spends seconds importing
# them again, in every one of the suite's flows (half of test_noise_flows' time). The environment a test set is
# inherited either way. Spawned workers stay covered: test_external_cluster starts `dask worker` processes from the
# command line, and SPAWN_FILES below keep the default.
os.environ.setdefault("DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD", "fork")
# A fork is safe only where the parent holds no lock a child needs. GNU OpenMP (torch's CPU pool) is not fork-safe:
# a child forked after the parent ran a parallel region waits forever in its own first one (a SecPE worker hung so,
# embedding, once in three runs). One OpenMP thread never starts that pool; on 2 cores shared by 3 test processes it
# costs nothing. Test files that run flows in threads of one process (SPAWN_FILES) spawn: a fork there copies
# whatever another flow's thread holds at that instant.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
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


#: The test files that take longest, longest first (a serial run on 2 cores, 2026-11-28: test_audit 238 s ...
#: test_budget_control 31 s). `make test` hands whole files to its workers (--dist loadfile) in collection order, so
#: these go first and the short files fill the gaps at the end (longest-processing-time-first scheduling).
LONGEST_FILES = ("test_audit", "test_evolution_flow", "test_evaluate_flow", "test_release_privacy", "test_noise_flows",
                 "test_config_contract", "test_api", "test_pe_units", "test_dpkps_flow", "test_approval",
                 "test_deployments", "test_llm_privacy", "test_quality", "test_fault_tolerance",
                 "test_histogram_seeds", "test_budget_control")


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
