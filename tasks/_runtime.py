"""The settings that make Prefect, GX and the models work offline (see docs/install.md), applied by whoever starts a
run, never by an import: importing privseed changes no process-wide setting.

- the ``privseed`` command applies them for its process (``privseed.flows.cli.main``), before Prefect is imported;
- the Python API (``privseed.dpkps(...)``) applies them for the duration of a call (:func:`offline_defaults`);
- ``deployments/serve.py`` applies them before it serves.

Each is a default: a variable the caller has set is left as it is.

And what a command-line run starts for itself stops when the run ends, however it ends (issue 46: a killed run's
temporary Prefect server kept running): :func:`ended_like_ctrl_c` turns SIGTERM and SIGHUP into an exception that
unwinds the run as Ctrl-C does, :func:`temporary_prefect_server` starts Prefect's temporary API for the run and
stops it on the way out, and a watchdog process (:func:`stop_when_this_process_dies`) stops it if this process is
killed outright (SIGKILL, the kernel's out-of-memory killer), which no handler sees.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType

#: Environment defaults, each with why.
DEFAULTS: dict[str, str] = {
    # The ephemeral Prefect API needs ~18 s to start on a 2-core machine; the default 20 s times out.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "GX_ANALYTICS_ENABLED": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

#: Third-party loggers that would print request bodies at DEBUG; privseed never logs private text and these must
#: not either.
QUIET_LOGGERS = ("httpx", "httpcore", "anthropic", "openai", "urllib3", "botocore", "s3fs", "aiobotocore")


def apply_offline_defaults() -> None:
    """Set every unset variable of :data:`DEFAULTS` and quieten :data:`QUIET_LOGGERS`, for the rest of the process
    (the command line's entry point; a library caller uses :func:`offline_defaults`)."""
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


@contextlib.contextmanager
def offline_defaults() -> Iterator[None]:
    """:func:`apply_offline_defaults` for the duration of a block; the environment and the loggers' levels are
    restored afterwards. Prefect reads its settings when it is first imported, so a block that imports it for the
    first time leaves Prefect configured with these values (and nothing else)."""
    saved_env = {key: os.environ.get(key) for key in DEFAULTS}
    saved_levels = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    apply_offline_defaults()
    try:
        yield
    finally:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        for name, level in saved_levels.items():
            logging.getLogger(name).setLevel(level)


# ---------------------------------------------------------------------------------------------------------
# What a run starts for itself stops with it
# ---------------------------------------------------------------------------------------------------------
#: Signals that end a command-line run as Ctrl-C does (``kill``, a scheduler's time limit, a closed terminal).
#: Python's default for them ends the process at once, skipping every ``finally`` and ``atexit``.
ENDING_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGHUP)


class RunEnded(KeyboardInterrupt):
    """A run ended by a signal of :data:`ENDING_SIGNALS`. A KeyboardInterrupt, so it unwinds the run as Ctrl-C does:
    every ``finally`` and context manager runs (the Dask cluster closes, the temporary server stops), and what the
    ledger and the LLM call cache already hold stays for a resumed run."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        """The shell's convention for a process ended by a signal: 128 + its number."""
        return 128 + self.signum


#: The :class:`RunEnded` the last ``ended_like_ctrl_c`` block raised, for ``run_ended``.
_RAISED: list[RunEnded] = []


def run_ended() -> RunEnded | None:
    """The :class:`RunEnded` a signal raised in the last ``ended_like_ctrl_c`` block, if one did. A library that
    calls Python code from its own native frame may hand it on wrapped in its own error (pydantic-core's serializer
    raised ``PydanticSerializationError: ... RunEnded: SIGTERM`` when the signal came while it serialized a model),
    so the command line asks here before it calls an error a bug."""
    return _RAISED[-1] if _RAISED else None


@contextlib.contextmanager
def ended_like_ctrl_c() -> Iterator[None]:
    """Within the block, a signal of :data:`ENDING_SIGNALS` raises :class:`RunEnded` in the main thread; later ones
    are ignored while the run unwinds, so its clean-up is not cut short. Outside the main thread (where Python
    allows no handler) the block runs as it is. The previous handlers come back afterwards.

    Prefect swaps its own SIGTERM handler in while a flow runs and, after its own clean-up, re-sends the signal to
    the handler it found: this one."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def end(signum: int, frame: FrameType | None) -> None:
        for ending in ENDING_SIGNALS:
            signal.signal(ending, signal.SIG_IGN)
        _RAISED.append(RunEnded(signum))
        raise _RAISED[-1]

    _RAISED.clear()  # a record of this block only
    previous = {ending: signal.signal(ending, end) for ending in ENDING_SIGNALS}
    try:
        yield
    finally:
        for ending, handler in previous.items():
            signal.signal(ending, handler)


#: The watchdog's program: wait for its parent (the run) to go, then stop the process it guards (SIGTERM, SIGKILL
#: after five seconds). It polls ``getppid`` (portable; a Linux parent-death signal would also fire when the thread
#: that started it ends) and imports nothing heavy.
_WATCHDOG = """
import os, signal, sys, time
parent, guarded = int(sys.argv[1]), int(sys.argv[2])
while os.getppid() == parent:
    time.sleep(0.25)
try:
    os.kill(guarded, signal.SIGTERM)
    for _ in range(50):
        time.sleep(0.1)
        os.kill(guarded, 0)
    os.kill(guarded, signal.SIGKILL)
except ProcessLookupError:
    pass
"""


def stop_when_this_process_dies(pid: int) -> subprocess.Popen:
    """A watchdog process that stops process ``pid`` once this process is gone, however it ended, and exits. In a
    session of its own, so a Ctrl-C at the terminal (which reaches the whole foreground group) leaves it to do
    its work. The caller kills it once it has stopped ``pid`` itself."""
    return subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(pid)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


@contextlib.contextmanager
def stopped_with_the_run(pid: int, stop: Callable[[], None]) -> Iterator[None]:
    """Process ``pid``, a server the run started for itself, is stopped by ``stop`` when the block ends (a return,
    an exception, Ctrl-C, :class:`RunEnded`) and by a watchdog when this process is killed outright."""
    watchdog = stop_when_this_process_dies(pid)
    try:
        yield
    finally:
        try:
            stop()
        finally:
            watchdog.kill()
            watchdog.wait()


#: How long the temporary server's last logs and events may take to reach it before it stops.
DRAIN_SECONDS = 5.0


@contextlib.contextmanager
def temporary_prefect_server() -> Iterator[None]:
    """Prefect's temporary API server for this process, when no Prefect server is configured (PREFECT_API_URL):
    started here, before the flow that would start it, so that it is :func:`stopped_with_the_run`. It is the
    instance Prefect's own clients use (one per process), so the flow finds it running. With a configured server,
    or one already running in this process (a test harness's), nothing is started or stopped."""
    # Imported here, not at the top: this module is imported by `privseed --help`, which must not load Prefect.
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        yield
        return
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    if server.running:
        yield
        return
    server.start()
    assert server.server_process is not None  # start() raises when the server did not come up

    def drain_then_stop() -> None:
        # The run's last logs and events go to the server before it stops (Prefect's own test harness does the
        # same), else their workers report connection errors at exit; a server that does not answer costs 5 s.
        from prefect.events.worker import EventsWorker
        from prefect.logging.handlers import APILogWorker

        for service in (APILogWorker, EventsWorker):
            service.drain_all(timeout=DRAIN_SECONDS)
        server.stop()

    with stopped_with_the_run(server.server_process.pid, drain_then_stop):
        yield
