"""Deterministic errors are never retried: every Prefect task privseed defines that retries at all retries only what
``is_transient`` calls transient, and storage failures that a repeat cannot fix (missing credentials) are not
transient."""

from __future__ import annotations

import importlib
import pkgutil
import time

import pytest

from privseed.tasks.errors import StorageAccessError, is_transient, retry_if_transient


def _tasks():
    from prefect import Task

    import privseed.tasks

    found = {}
    for info in pkgutil.walk_packages(privseed.tasks.__path__, "privseed.tasks."):
        if info.name.startswith(("privseed.tasks.llm.", "privseed.tasks.audit.trials")):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if isinstance(value, Task):
                found[f"{info.name}.{name}"] = value
    return found


def test_every_task_that_retries_retries_only_transient_errors():
    tasks = _tasks()
    assert "privseed.tasks.stages.generation.generate_release" in tasks  # retried twice, once for any error
    for name, task in tasks.items():
        if task.retries:
            assert task.retry_condition_fn is retry_if_transient, f"{name} retries deterministic errors too"


def test_missing_s3_credentials_fail_once_not_after_retries(monkeypatch):
    from privseed.tasks.data.corpus import list_shards

    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    started = time.perf_counter()
    with pytest.raises(StorageAccessError, match="NoCredentialsError.*AWS_ACCESS_KEY_ID") as refused:
        list_shards("s3://bucket/corpus.parquet", {"endpoint_url": "http://127.0.0.1:9"})
    assert not is_transient(refused.value) and time.perf_counter() - started < 30
