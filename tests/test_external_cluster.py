"""A real external Dask cluster: `dask scheduler` and `dask worker` processes started with the commands and the
environment of infra/compose.yaml (on 127.0.0.1, free ports, one thread per worker), a DP-KPS release run
through them with ``--dask-address``, the refusals of :func:`privseed.tasks.data.cluster.check_cluster` (a worker that
would
spill to disk, a worker with another package version) and mutual TLS with a CA made here."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest
import yaml

from privseed.tasks.data.cluster import NO_SPILL_ENV, dask_client, map_shards, version_mismatches
from privseed.tasks.errors import ConfigError
from tests.conftest import users_environment

REPO = Path(__file__).resolve().parents[1]
DASK = str(Path(sys.executable).with_name("dask"))
COMPOSE_ADDRESS = "tls://dask-scheduler:8786"
#: Where infra/compose.yaml mounts the certificates of infra/make_tls.py.
COMPOSE_TLS = ("/tls/ca.pem", "/tls/cert.pem", "/tls/key.pem")


def compose_dask_services() -> tuple[list[str], list[str], dict[str, str]]:
    """The scheduler's and a worker's command in infra/compose.yaml, and the worker's DASK_* environment."""
    services = yaml.safe_load((REPO / "infra" / "compose.yaml").read_text())["services"]
    scheduler, worker = services["dask-scheduler"]["command"], services["dask-worker"]["command"]
    assert scheduler[:2] == ["dask", "scheduler"] and worker[:2] == ["dask", "worker"], (scheduler, worker)
    assert COMPOSE_ADDRESS in worker
    environment = {k: str(v) for k, v in (services["dask-worker"].get("environment") or {}).items()
                   if k.startswith("DASK_")}
    assert NO_SPILL_ENV.items() <= environment.items(), environment  # the workers below keep data in memory
    return scheduler, worker, environment


class DaskProcesses:
    """Scheduler and worker processes of one test; every one is stopped by :meth:`stop_all`, logs kept."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.processes: list[tuple[subprocess.Popen, Path]] = []
        self.scheduler_command, self.worker_command, self.worker_env = compose_dask_services()
        # the compose stack's mutual TLS, with certificates made here in place of the mounted ones
        self.tls = make_tls_files(folder / "tls")
        self.tls_flags = ["--dask-tls-ca-file", str(self.tls[0]), "--dask-tls-cert", str(self.tls[1]),
                          "--dask-tls-key", str(self.tls[2])]

    @property
    def security(self):
        from distributed.security import Security

        return Security(tls_ca_file=str(self.tls[0]), tls_client_cert=str(self.tls[1]),
                        tls_client_key=str(self.tls[2]), require_encryption=True)

    def _start(self, argv: list[str], name: str, env: dict[str, str]) -> subprocess.Popen:
        log = self.folder / f"{name}.log"
        mounted = dict(zip(COMPOSE_TLS, map(str, self.tls)))
        argv = [mounted.get(token, token) for token in argv]
        # PYTHONPATH: this checkout's code wins over the installed privseed, as in the flow's own process. The
        # suite's fork start method (tests/conftest.py) is left out: these processes start as infra/ starts them.
        process = subprocess.Popen(["nice", "-n", "10", DASK, *argv[1:]], cwd=self.folder, stdout=log.open("wb"),
                                   stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**users_environment(), "PYTHONPATH": str(REPO), **env})
        self.processes.append((process, log))
        return process

    def scheduler(self, *extra: str) -> str:
        """Starts the compose scheduler command on 127.0.0.1 with free ports; returns its address."""
        address_file = self.folder / "scheduler.json"
        # click keeps the last value of a repeated option: these override the compose host and ports.
        argv = [*self.scheduler_command, "--host", "127.0.0.1", "--port", "0", "--dashboard-address", "127.0.0.1:0",
                "--scheduler-file", str(address_file), *extra]
        process = self._start(argv, "scheduler", {})
        deadline = time.monotonic() + 120
        while not address_file.exists():
            assert process.poll() is None, self.logs()
            assert time.monotonic() < deadline, "the scheduler did not start:\n" + self.logs()
            time.sleep(0.5)
        time.sleep(0.2)  # the file is written in one go; let it land
        return json.loads(address_file.read_text())["address"]

    def worker(self, address: str, name: str, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Starts the compose worker command against ``address`` with the compose worker's DASK_* environment
        (or ``env`` instead)."""
        argv = [address if token == COMPOSE_ADDRESS else token for token in self.worker_command]
        argv += ["--host", "127.0.0.1", "--no-dashboard", "--memory-limit", "2GiB", "--name", name, *extra]
        return self._start(argv, name, self.worker_env if env is None else env)

    def logs(self) -> str:
        return "\n".join(f"--- {log.name} ---\n{log.read_text()[-3000:]}" for _, log in self.processes if log.exists())

    def stop_all(self) -> None:
        for process, _ in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process, _ in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


@pytest.fixture
def dask_processes(tmp_path) -> Iterator[DaskProcesses]:
    processes = DaskProcesses(tmp_path)
    try:
        yield processes
    finally:
        processes.stop_all()


def wait_for_workers(address: str, count: int, processes: DaskProcesses, security=None) -> None:
    from distributed import Client

    with Client(address, security=security, timeout="60s") as client:
        try:
            client.wait_for_workers(count, timeout=120)
        except TimeoutError:
            pytest.fail(f"{count} worker(s) did not join {address}:\n{processes.logs()}")


def executed_on_worker(dask_worker) -> dict:
    """Run on a worker: how many tasks it executed, and the names of the functions they ran."""
    from dask.utils import key_split

    names = sorted({key_split(entry[0]) for entry in dask_worker.state.log
                    if len(entry) > 3 and entry[1:3] == ("executing", "memory")})
    return {"executed": dask_worker.state.executed_count, "functions": names}


def write_shards(corpus, folder: Path, n_shards: int = 4) -> None:
    """The corpus as ``n_shards`` Parquet files of two row groups each: several work units for the workers."""
    folder.mkdir()
    shuffled = corpus.sample(frac=1.0, random_state=3).reset_index(drop=True)
    for index, rows in enumerate(np.array_split(np.arange(len(shuffled)), n_shards)):
        part = shuffled.iloc[rows]
        part.to_parquet(folder / f"part-{index:05d}.parquet", index=False, row_group_size=(len(part) + 1) // 2)


@pytest.mark.slow
def test_release_runs_on_an_external_cluster_started_like_infra(prefect_harness, dask_processes, tmp_path,
                                                                tiny_corpus):
    from distributed import Client
    from prefect.settings import get_current_settings

    from privseed.tasks.data.corpus import read_release

    address = dask_processes.scheduler()
    assert address.startswith("tls://127.0.0.1:")  # the compose stack talks mutual TLS only
    dask_processes.worker(address, "worker-a")
    dask_processes.worker(address, "worker-b")
    wait_for_workers(address, 2, dask_processes, dask_processes.security)

    corpus = tmp_path / "corpus"
    write_shards(tiny_corpus, corpus)
    out = tmp_path / "release"
    settings = tmp_path / "small.toml"  # field names, not flags: the run's sizes, kept small
    settings.write_text('labels = ["0", "1", "2"]\nper_class = 4\nlength = 8\nvocab_top = 20000\nvocab_size = 40\n'
                        'n_features = 64\nseed = 7\nmethod = "independent"\n')  # both passes run on the workers
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_API_URL": str(get_current_settings().api.url)}
    run = subprocess.run(["nice", "-n", "10", sys.executable, "-m", "privseed.flows.cli", "dpkps", str(corpus), "--out",
                          str(out), "--config", str(settings), "--llm", "none", "--dask-address", address,
                          *dask_processes.tls_flags],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:] + dask_processes.logs()

    manifest, synthetic = read_release(str(out))
    assert manifest["rows"] == len(synthetic) == 12  # 3 declared classes x per_class 4
    assert sorted(map(str, synthetic["label"].unique())) == ["0", "1", "2"]
    assert manifest["config"]["dask_address"] is None  # the owner's scheduler is not the recipient's business
    ledger = json.loads((out / "ledger.json").read_text())
    assert ledger["entries"] and ledger["total"]["epsilon"] > 0

    with Client(address, security=dask_processes.security, timeout="60s") as client:
        ran = client.run(executed_on_worker)
    assert len(ran) == 2, ran
    # Both workers executed tasks of the run (client.run and version checks are not tasks: only the flow's
    # own work counts here).
    assert all(worker["executed"] > 0 for worker in ran.values()), (ran, dask_processes.logs())
    print("tasks per worker:", json.dumps(ran))


@pytest.mark.slow
@pytest.mark.parametrize("problem", ["spill", "version"])
def test_an_external_cluster_that_would_leak_or_mismatch_is_refused(dask_processes, tmp_path, problem):
    address = dask_processes.scheduler()
    if problem == "spill":
        # The compose worker command without the compose environment: distributed's defaults spill at 60 %.
        dask_processes.worker(address, "spilling", env={})
        expected = r"would spill task data to local disk.*DASK_DISTRIBUTED__WORKER__MEMORY__SPILL=False"
    else:
        fake = tmp_path / "site" / "opendp-0.0.1.dist-info"  # found before the real opendp on the worker's path
        fake.mkdir(parents=True)
        (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: opendp\nVersion: 0.0.1\n")
        (fake / "RECORD").write_text("")
        dask_processes.worker(address, "old-opendp", env={**dask_processes.worker_env,
                                                          "PYTHONPATH": f"{fake.parent}{os.pathsep}{REPO}"})
        expected = re.escape(f"opendp {version('opendp')} here, 0.0.1 on tls://127.0.0.1:")
    wait_for_workers(address, 1, dask_processes, dask_processes.security)
    with pytest.raises(ConfigError, match=expected):
        with dask_client(address, security=dask_processes.security):
            pytest.fail("the cluster was accepted")


def test_version_mismatches_name_the_package_and_where():
    here = {"python": "3.11", "privseed": "0.1.0 (source abc)", "numpy": "2.4.0", "torch": "2.13.0"}
    workers = {"tcp://a:1": dict(here), "tcp://b:2": {**here, "numpy": "1.26.4", "torch": None}}
    scheduler = {"python": "3.12", "numpy": "9.9"}  # numpy is not compared on the scheduler
    problems = version_mismatches(here, scheduler, workers)
    assert "python 3.11 here, 3.12 on the scheduler" in problems
    assert "numpy 2.4.0 here, 1.26.4 on tcp://b:2" in problems
    assert "torch 2.13.0 here, missing on tcp://b:2" in problems
    assert not any(p.startswith("privseed") for p in problems)
    assert version_mismatches(here, {"python": "3.11"}, {"tcp://a:1": dict(here)}) == []


# ------------------------------------------------------------------------------------------------------------
# TLS
# ------------------------------------------------------------------------------------------------------------
def make_tls_files(folder: Path) -> tuple[Path, Path, Path]:
    """A CA and one certificate it signed for 127.0.0.1 (server and client use): infra/make_tls.py's."""
    sys.path.insert(0, str(REPO / "infra"))
    import make_tls

    return make_tls.make_tls_files(folder, ("127.0.0.1", "localhost"), days=1)


def _square(x: float) -> float:
    return x * x


def _release_config(**fields):
    from privseed.tasks.config.commands import DpKpsConfig, validate_config

    return validate_config(DpKpsConfig, dict(data="corpus.parquet", out="release", labels=["0", "1"], **fields))


@pytest.mark.slow
def test_mutual_tls_to_an_external_scheduler(dask_processes, tmp_path):
    from privseed.tasks.data.cluster import cluster_security

    ca, cert, key = make_tls_files(tmp_path)
    tls = ["--tls-ca-file", str(ca), "--tls-cert", str(cert), "--tls-key", str(key)]
    address = dask_processes.scheduler("--protocol", "tls", *tls)
    assert address.startswith("tls://127.0.0.1:")
    dask_processes.worker(address, "tls-a", *tls)
    dask_processes.worker(address, "tls-b", *tls)
    cfg = _release_config(dask_address=address, dask_tls_ca_file=str(ca), dask_tls_cert=str(cert),
                          dask_tls_key=str(key))
    security = cluster_security(cfg)
    assert security.require_encryption and security.tls_ca_file == str(ca)
    wait_for_workers(address, 2, dask_processes, security)
    with dask_client(cfg.dask_address, security=security) as client:
        assert map_shards(_square, [1.0, 2.0, 3.0, 4.0]) == [1.0, 4.0, 9.0, 16.0]
        assert all(w.startswith("tls://") for w in client.scheduler_info()["workers"])
    # Without the TLS settings, the tls:// address is refused with the flags to set, before any connection.
    with pytest.raises(ConfigError, match="--dask-tls-ca-file"):
        with dask_client(address):
            pass


@pytest.mark.parametrize("fields, expected", [
    ({"dask_address": "tls://10.0.0.1:8786", "dask_tls_ca_file": "ca.pem"},
     "missing --dask-tls-cert and --dask-tls-key"),
    ({"dask_address": "tcp://10.0.0.1:8786", "dask_tls_ca_file": "a", "dask_tls_cert": "b", "dask_tls_key": "c"},
     "need a tls:// --dask-address"),
    ({"dask_tls_ca_file": "a", "dask_tls_cert": "b", "dask_tls_key": "c"}, "need a tls:// --dask-address"),
    ({"dask_address": "tls://10.0.0.1:8786", "dask_tls_ca_file": "nope.pem", "dask_tls_cert": "b",
      "dask_tls_key": "c"}, "--dask-tls-ca-file nope.pem is not a readable file"),
])
def test_tls_settings_are_checked_before_connecting(fields, expected, tmp_path, monkeypatch):
    """Incomplete TLS settings are refused when the configuration is validated, files that do not exist when
    the client is built: both before any connection, naming the flags."""
    from privseed.tasks.data.cluster import cluster_security

    monkeypatch.chdir(tmp_path)
    assert cluster_security(_release_config()) is None  # no TLS settings: a plain tcp:// scheduler or a LocalCluster
    with pytest.raises(ConfigError, match=expected):
        cluster_security(_release_config(**fields))
