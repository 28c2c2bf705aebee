"""Call cache: every finished LLM call is stored under its key, so a crashed or re-run flow repeats none.

Key = sha256(backend, model, messages, params, seed) (``ChatRequest.cache_key``). One small JSON object per
call at ``{root}/{key[:2]}/{key}.json`` through fsspec (local folder, file://, s3://). A write is a single
object put (S3) or write-to-temp + rename (local), so a crash never leaves a half-written entry that a later
run would trust. Entries hold synthetic text and token counts only: prompts are not stored (they are
recomputable from released values, and keeping the cache free of prompt text keeps it small).
"""
from __future__ import annotations

import json
import os
import threading
import uuid
from typing import Callable, Sequence

import fsspec

from tasks.errors import StorageError
from tasks.llm.base import ChatRequest, ChatResult, LLMBackend


class CallCache:
    def __init__(self, root: str, storage_options: dict | None = None):
        self.root = root.rstrip("/")
        self.storage_options = storage_options or {}
        self.fs, self._path = fsspec.core.url_to_fs(self.root, **self.storage_options)
        self._local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))

    def _entry(self, key: str) -> str:
        return f"{self._path}/{key[:2]}/{key}.json"

    def get(self, key: str) -> ChatResult | None:
        path = self._entry(key)
        try:
            with self.fs.open(path, "rb") as f:
                return ChatResult.from_dict(json.loads(f.read().decode("utf-8")), cached=True)
        except FileNotFoundError:
            return None
        except (ValueError, KeyError):
            return None  # a corrupt entry (should not happen: writes are atomic) is recomputed
        except OSError as e:
            raise StorageError(f"LLM cache at {self.root} is unreadable: {type(e).__name__}") from e

    def put(self, key: str, result: ChatResult) -> None:
        path = self._entry(key)
        data = json.dumps(result.to_dict(), ensure_ascii=False).encode("utf-8")
        try:
            if self._local:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                tmp = f"{path}.{uuid.uuid4().hex}.tmp"
                with open(tmp, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
            else:
                self.fs.pipe_file(path, data)
        except OSError as e:
            raise StorageError(f"LLM cache at {self.root} is not writable: {type(e).__name__}") from e

    def __len__(self) -> int:
        try:
            return len(self.fs.glob(f"{self._path}/*/*.json"))
        except FileNotFoundError:
            return 0


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
