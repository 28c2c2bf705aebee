"""A real S3-compatible server for tests: ``moto_server`` (from ``moto[server]``) on 127.0.0.1.

Loaded as a pytest plugin (``pytest_plugins = ["tests.s3server"]`` in conftest.py). Fixtures:

- ``moto_server``: one server for the whole session (starts in ~2 s), stopped at the end.
- ``s3_bucket``: a fresh bucket on it for one test, with ``AWS_ENDPOINT_URL`` / ``AWS_ACCESS_KEY_ID`` /
  ``AWS_SECRET_ACCESS_KEY`` / ``AWS_DEFAULT_REGION`` set for the test (so code under test finds the
  endpoint the way it would in production: from the standard variables).
- ``private_s3_server``: a server of the test's own, for tests that stop it (a dead endpoint).
- ``proxied_s3_bucket``: a bucket reached through a ``TcpProxy`` (the environment points at the proxy);
  ``bucket.proxy.stop()`` kills the endpoint while the objects stay readable through ``bucket.server``.

The server is a subprocess speaking real HTTP, so s3fs, pyarrow and Dask workers in other processes
reach it exactly as they would reach MinIO or AWS.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# Credentials moto accepts; recognisable so secret-scanning tests can look for them in outputs.
TEST_ACCESS_KEY = "privseedtestaccesskey"
TEST_SECRET_KEY = "privseed-test-secret-DO-NOT-LOG-7f3a9c"
TEST_REGION = "us-east-1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _moto_server_command() -> list[str]:
    """``moto_server`` next to the running interpreter (the venv), else on PATH."""
    beside = Path(sys.executable).with_name("moto_server")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("moto_server")
    if found:
        return [found]
    return [sys.executable, "-m", "moto.server"]


class MotoServer:
    """One ``moto_server -H 127.0.0.1 -p PORT`` subprocess."""

    def __init__(self, port: int | None = None, log_path: Path | None = None) -> None:
        self.port = port or free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> MotoServer:
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        env = {**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true"}
        self.process = subprocess.Popen(
            [*_moto_server_command(), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"moto_server exited with code {self.process.returncode} on port {self.port}")
            try:
                with urllib.request.urlopen(f"{self.endpoint_url}/moto-api/", timeout=1):
                    return self
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"moto_server did not answer on {self.endpoint_url} within {timeout:.0f} s")

    def stop(self) -> None:
        """Stop the server; afterwards the endpoint refuses connections (a dead S3 endpoint)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def env(self) -> dict[str, str]:
        """The standard AWS variables that point a client at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": TEST_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": TEST_SECRET_KEY,
            "AWS_DEFAULT_REGION": TEST_REGION,
        }

    def client(self):
        import boto3

        return boto3.client(
            "s3", endpoint_url=self.endpoint_url, aws_access_key_id=TEST_ACCESS_KEY,
            aws_secret_access_key=TEST_SECRET_KEY, region_name=TEST_REGION,
        )

    def create_bucket(self, name: str | None = None) -> str:
        name = name or f"privseed-{uuid.uuid4().hex[:10]}"
        self.client().create_bucket(Bucket=name)
        return name


class TcpProxy:
    """A TCP forwarder on 127.0.0.1 in front of a server, which a test can stop and start again.

    moto keeps its objects in memory, so stopping moto itself would also destroy the release a test
    wants to check afterwards; stopping this proxy makes the endpoint dead (connections refused) while
    the objects stay readable on the server behind it."""

    def __init__(self, target_port: int, port: int | None = None) -> None:
        self.target_port = target_port
        self.port = port or free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self._listener: socket.socket | None = None
        self._connections: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> TcpProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # the listener was closed: the proxy is stopped
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._connections += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self) -> None:
        """Refuse new connections and cut the open ones (a dead endpoint, as a crashed server looks)."""
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
            except OSError:
                pass
            self._listener.close()
            self._listener = None
        with self._lock:
            for sock in self._connections:
                try:
                    sock.close()
                except OSError:
                    pass
            self._connections.clear()


@dataclasses.dataclass(frozen=True)
class S3Bucket:
    """A bucket on a running server; ``url`` is ``s3://name``."""

    server: MotoServer
    name: str
    proxy: TcpProxy | None = None

    @property
    def url(self) -> str:
        return f"s3://{self.name}"

    @property
    def endpoint_url(self) -> str:
        """The endpoint code under test uses (the proxy's, when there is one)."""
        return self.proxy.endpoint_url if self.proxy else self.server.endpoint_url

    def keys(self, prefix: str = "") -> list[str]:
        """Every object key under ``prefix`` (paginated)."""
        paginator = self.server.client().get_paginator("list_objects_v2")
        return sorted(obj["Key"] for page in paginator.paginate(Bucket=self.name, Prefix=prefix)
                      for obj in page.get("Contents", []))

    def get(self, key: str) -> bytes:
        return self.server.client().get_object(Bucket=self.name, Key=key)["Body"].read()


def clear_s3fs_cache() -> None:
    """s3fs caches filesystem instances by their arguments, not by the endpoint in the environment;
    a cached instance from another test would talk to another (or a stopped) server."""
    try:
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
    except ImportError:
        pass


def _point_env_at(server: MotoServer, monkeypatch: pytest.MonkeyPatch, endpoint_url: str | None = None) -> None:
    for key, value in server.env().items():
        monkeypatch.setenv(key, value)
    if endpoint_url:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint_url)
    for key in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    clear_s3fs_cache()


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = MotoServer(log_path=tmp_path_factory.mktemp("moto") / "moto_server.log").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Bucket]:
    _point_env_at(moto_server, monkeypatch)
    bucket = S3Bucket(moto_server, moto_server.create_bucket())
    yield bucket
    clear_s3fs_cache()


@pytest.fixture
def private_s3_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MotoServer]:
    """A server only this test uses, with the environment pointed at it; the test may stop it."""
    server = MotoServer(log_path=tmp_path / "moto_server.log").start()
    _point_env_at(server, monkeypatch)
    try:
        yield server
    finally:
        server.stop()
        clear_s3fs_cache()


@pytest.fixture
def proxied_s3_bucket(moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Bucket]:
    """A fresh bucket on the session server, reached through a proxy the test may stop."""
    proxy = TcpProxy(moto_server.port).start()
    _point_env_at(moto_server, monkeypatch, proxy.endpoint_url)
    bucket = S3Bucket(moto_server, moto_server.create_bucket(), proxy)
    try:
        yield bucket
    finally:
        proxy.stop()
        clear_s3fs_cache()
