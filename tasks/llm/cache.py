"""Call cache: every finished LLM call is stored under its key, so a crashed or re-run flow repeats none.

Key = sha256(backend, model, messages, params, seed) (``ChatRequest.cache_key``). One small JSON object per
call at ``{root}/{key[:2]}/{key}.json`` on any storage :mod:`tasks.storage` opens (local folder, file://,
s3://), with its option resolution (``prefect-secret:NAME`` references, the endpoint from AWS_ENDPOINT_URL,
capped botocore retries) and its retry-with-backoff on transient I/O errors. A write is a single object put
(S3) or write-to-temp + rename (local), so a crash never leaves a half-written entry that a later run would
trust. Entries hold synthetic text and token counts only: prompts are not stored (they are recomputable from
released values, and keeping the cache free of prompt text keeps it small).
"""
from __future__ import annotations

import json
import threading
from typing import Callable, Sequence

from tasks import storage
from tasks.errors import StorageError
from tasks.llm.base import ChatRequest, ChatResult, LLMBackend


class CallCache:
    """``storage_options`` are the release's, unresolved (as the config holds them); they are resolved
    once here, on the process that uses the cache, so a secret never travels in a task's arguments."""

    def __init__(self, root: str, storage_options: dict | None = None):
        self.root = root.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.fs, self._path = storage.filesystem(self.root, self.storage_options)

    def _entry(self, key: str) -> str:
        return f"{self._path}/{key[:2]}/{key}.json"

    def get(self, key: str) -> ChatResult | None:
        """The stored result, or None for a miss (no entry, or a corrupt one, which is then recomputed).
        Errors name the cache root only: never a key, a path inside it or a storage option."""
        path = self._entry(key)
        try:
            raw = storage.with_retries(lambda: self.fs.cat_file(path), what=f"reading the LLM cache at {self.root}")
        except FileNotFoundError:
            return None
        except (StorageError, OSError) as e:
            raise StorageError(f"LLM cache at {self.root} is unreadable: {_cause_name(e)}") from e
        try:
            return ChatResult.from_dict(json.loads(raw.decode("utf-8")), cached=True)
        except (ValueError, KeyError, TypeError):
            return None  # a corrupt entry (should not happen: writes are atomic) is recomputed

    def put(self, key: str, result: ChatResult) -> None:
        data = json.dumps(result.to_dict(), ensure_ascii=False).encode("utf-8")
        try:
            storage.write_atomic(self.fs, self._entry(key), data, what=f"writing the LLM cache at {self.root}")
        except (StorageError, OSError) as e:
            raise StorageError(f"LLM cache at {self.root} is not writable: {_cause_name(e)}") from e

    def __len__(self) -> int:
        try:
            return len(storage.with_retries(lambda: self.fs.glob(f"{self._path}/*/*.json"),
                                            what=f"listing the LLM cache at {self.root}"))
        except FileNotFoundError:
            return 0
        except (StorageError, OSError) as e:
            raise StorageError(f"LLM cache at {self.root} cannot be listed: {_cause_name(e)}") from e


def _cause_name(exc: BaseException) -> str:
    """The underlying error's type (with_retries wraps it in a StorageError whose text may hold a path)."""
    inner = exc.__cause__ if isinstance(exc, StorageError) and exc.__cause__ is not None else exc
    return type(inner).__name__


def cached_complete(backend: LLMBackend, requests: Sequence[ChatRequest], cache: CallCache | None,
                    on_result: Callable[[ChatResult], None] | None = None) -> list[ChatResult]:
    """Answer ``requests`` through ``cache``: look every key up first, send only the misses (as one batch, so
    a backend can parallelise or use a batch API) and store each answer the moment it arrives.
    ``on_result(result)`` is called once per request, cached or fresh, for progress reporting."""
    keys = [r.cache_key(backend.name, backend.model) for r in requests]
    results: list[ChatResult | None] = [cache.get(k) if cache is not None else None for k in keys]
    for r in results:
        if r is not None and on_result:
            on_result(r)
    # Identical requests in one batch share a key and are sent once.
    missing: dict[str, list[int]] = {}
    for i, (k, r) in enumerate(zip(keys, results)):
        if r is None:
            missing.setdefault(k, []).append(i)
    if not missing:
        return results  # type: ignore[return-value]
    miss_keys = list(missing)
    lock = threading.Lock()

    def on_each(j: int, res: ChatResult) -> None:
        key = miss_keys[j]
        if cache is not None:
            cache.put(key, res)
        with lock:
            for i in missing[key]:
                results[i] = res
                if on_result:
                    on_result(res)

    fresh = backend.complete([requests[missing[k][0]] for k in miss_keys], on_each=on_each)
    for k, res in zip(miss_keys, fresh):  # backends call on_each; this covers any that finished silently
        for i in missing[k]:
            if results[i] is None:
                results[i] = res
                if cache is not None:
                    cache.put(k, res)
    return results  # type: ignore[return-value]
