"""Call cache: every finished LLM call is stored under its key, so a crashed or re-run flow repeats none.

Key = sha256(backend, model, messages, params, seed) (``ChatRequest.cache_key``). One small JSON object per
call at ``{root}/{key[:2]}/{key}.json`` on any storage :mod:`privseed.tasks.storage` opens (local folder, file://,
s3://), with its option resolution (``prefect-secret:NAME`` references, the endpoint from AWS_ENDPOINT_URL,
capped botocore retries) and its retry-with-backoff on transient I/O errors. A write is a single object put
(S3) or write-to-temp + rename (local), so a crash never leaves a half-written entry that a later run would
trust. Entries hold synthetic text and token counts only: prompts are not stored (they are recomputable from
released values, and keeping the cache free of prompt text keeps it small).

Lookups at scale: probing one object per call costs one GET per call (1M serial GETs before a 1M-document
generation sends anything). Instead the cache is listed once (:meth:`CallCache.load_index`: the 256 two-hex
folders listed in parallel, about one LIST request per thousand entries on S3) into a :class:`CacheIndex`; then
only the hits are read, concurrently, and misses are not probed. A generation lists once and hands the index to
its shards; every entry written through the index joins it.
"""
from __future__ import annotations

import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, Literal, Sequence, overload

import numpy as np

from privseed.tasks import storage
from privseed.tasks.errors import StorageError
from privseed.tasks.llm.base import ChatRequest, ChatResult, LLMBackend, OnEach

#: Listing costs at least one request per two-hex folder; below this many lookups probing each key is cheaper.
LIST_MIN_LOOKUPS = 256
#: Concurrent object reads (hits) and folder listings.
READ_THREADS = 16
# Hits are read and handed on in chunks of this many, so a caller that does not keep the results never holds
# more than one chunk of them.
_READ_CHUNK = 1024
_ENTRY = re.compile(r"^[0-9a-f]{64}\.json$")


class CacheIndex:
    """The keys present in a call cache: the first 64 bits of every key found by one listing (a sorted uint64
    array, 8 bytes per entry, cheap to ship to Dask workers) plus the keys written through it since.

    ``key in index`` is False only for a key that was neither listed nor written through the index; it can be
    True for an absent key only when a listed key shares its first 64 bits (then the read finds nothing and the
    call is a miss), so a lookup never trusts the index for content, only for whether to read."""

    def __init__(self, prefixes: np.ndarray | None = None):
        self._setup(prefixes)

    def _setup(self, prefixes: np.ndarray | None) -> None:
        self._listed = np.unique(np.asarray(prefixes if prefixes is not None else [], dtype=np.uint64))
        self._added: set[int] = set()
        self._lock = threading.Lock()

    @staticmethod
    def prefix(key: str) -> int:
        return int(key[:16], 16)

    def __contains__(self, key: str) -> bool:
        p = self.prefix(key)
        if p in self._added:
            return True
        i = int(np.searchsorted(self._listed, np.uint64(p)))
        return i < len(self._listed) and int(self._listed[i]) == p

    def contains_many(self, keys: Sequence[str]) -> np.ndarray:
        """``[k in self for k in keys]`` as a boolean array, in one vectorised search."""
        wanted = np.fromiter((self.prefix(k) for k in keys), dtype=np.uint64, count=len(keys))
        known = self.prefixes()
        at = np.minimum(np.searchsorted(known, wanted), max(0, len(known) - 1))
        return (known[at] == wanted) if len(known) else np.zeros(len(keys), dtype=bool)

    def add(self, key: str) -> None:
        with self._lock:
            self._added.add(self.prefix(key))

    def prefixes(self) -> np.ndarray:
        with self._lock:
            added = np.fromiter(self._added, dtype=np.uint64, count=len(self._added))
        return np.union1d(self._listed, added)

    def __len__(self) -> int:
        return len(self.prefixes())

    @property
    def nbytes(self) -> int:  # privseed.tasks.data.cluster.map_shards scatters large arguments once instead of per task
        return int(self._listed.nbytes) + 8 * len(self._added)

    def __getstate__(self) -> dict:
        return {"prefixes": self.prefixes()}

    def __setstate__(self, state: dict) -> None:
        self._setup(state["prefixes"])


class CallCache:
    """``storage_options`` are the release's, unresolved (as the config holds them); they are resolved
    once here, on the process that uses the cache, so a secret never travels in a task's arguments.
    ``index``: the generation's :class:`CacheIndex` (keys not in it are misses without a read); None until
    :meth:`load_index` lists the cache, and a lookup of many keys lists it first (:data:`LIST_MIN_LOOKUPS`)."""

    def __init__(self, root: str, storage_options: dict | None = None, index: CacheIndex | None = None):
        self.root = root.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.fs, self._path = storage.filesystem(self.root, self.storage_options)
        self.index = index

    def _entry(self, key: str) -> str:
        return f"{self._path}/{key[:2]}/{key}.json"

    # -- listing ---------------------------------------------------------------------------------------------
    def _list_folder(self, folder: str) -> np.ndarray:
        path = f"{self._path}/{folder}"
        try:
            names = storage.with_retries(lambda: self.fs.ls(path, detail=False, refresh=True),
                                         what=f"listing the LLM cache at {self.root}")
        except FileNotFoundError:
            return np.empty(0, dtype=np.uint64)
        except (StorageError, OSError) as e:
            raise StorageError(f"LLM cache at {self.root} cannot be listed: {_cause_name(e)}") from e
        finally:
            self.fs.invalidate_cache(path)  # s3fs keeps every listing it made; this one is not needed again
        keys = [n.rsplit("/", 1)[-1] for n in names]
        return np.fromiter((CacheIndex.prefix(k) for k in keys if _ENTRY.match(k) and k.startswith(folder)),
                           dtype=np.uint64)

    def list_index(self) -> CacheIndex:
        """One listing of the cache (the 256 folders in parallel) as a :class:`CacheIndex`. A leftover temporary
        file of a crashed write is not an entry."""
        with ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="llm-cache-ls") as pool:
            found = list(pool.map(self._list_folder, [f"{i:02x}" for i in range(256)]))
        self.fs.invalidate_cache(self._path)
        return CacheIndex(np.concatenate(found))

    def load_index(self) -> CacheIndex:
        """List the cache now unless an index is already held; return it."""
        if self.index is None:
            self.index = self.list_index()
        return self.index

    # -- reads -----------------------------------------------------------------------------------------------
    def _read(self, key: str) -> ChatResult | None:
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

    def get(self, key: str) -> ChatResult | None:
        """The stored result, or None for a miss (no entry, or a corrupt one, which is then recomputed).
        Errors name the cache root only: never a key, a path inside it or a storage option."""
        if self.index is not None and key not in self.index:
            return None
        return self._read(key)

    def read_hits(self, keys: Sequence[str]) -> Iterator[tuple[int, ChatResult]]:
        """``(i, result)`` for every ``keys[i]`` with a stored result, in key order: the cache is listed first
        when that is cheaper than probing (and no index is held), then only the keys it holds are read
        (:data:`READ_THREADS` at a time from an object store)."""
        if self.index is None and len(keys) >= LIST_MIN_LOOKUPS:
            self.load_index()
        todo = (np.flatnonzero(self.index.contains_many(keys)) if self.index is not None
                else np.arange(len(keys))).tolist()
        if not todo:
            return
        if storage.is_local_fs(self.fs):  # a local read is a page-cache copy: threads would only add overhead
            for i in todo:
                result = self._read(keys[i])
                if result is not None:
                    yield i, result
            return
        with ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="llm-cache") as pool:
            for start in range(0, len(todo), _READ_CHUNK):
                chunk = todo[start:start + _READ_CHUNK]
                for i, result in zip(chunk, pool.map(lambda i: self._read(keys[i]), chunk)):
                    if result is not None:
                        yield i, result

    def get_many(self, keys: Sequence[str]) -> list[ChatResult | None]:
        """:meth:`get` for many keys at once (see :meth:`read_hits`)."""
        out: list[ChatResult | None] = [None] * len(keys)
        for i, result in self.read_hits(keys):
            out[i] = result
        return out

    def put(self, key: str, result: ChatResult) -> None:
        data = json.dumps(result.to_dict(), ensure_ascii=False).encode("utf-8")
        try:
            storage.write_atomic(self.fs, self._entry(key), data, what=f"writing the LLM cache at {self.root}")
        except (StorageError, OSError) as e:
            raise StorageError(f"LLM cache at {self.root} is not writable: {_cause_name(e)}") from e
        if self.index is not None:
            self.index.add(key)

    def __len__(self) -> int:
        return len(self.list_index())


def _cause_name(exc: BaseException) -> str:
    """The underlying error's type (with_retries wraps it in a StorageError whose text may hold a path)."""
    inner = exc.__cause__ if isinstance(exc, StorageError) and exc.__cause__ is not None else exc
    return type(inner).__name__


@overload
def cached_complete(backend: LLMBackend, requests: Sequence[ChatRequest], cache: CallCache | None,
                    on_result: Callable[[ChatResult], None] | None = None, *, on_each: OnEach | None = None,
                    keep: Literal[True] = True) -> list[ChatResult]: ...


@overload
def cached_complete(backend: LLMBackend, requests: Sequence[ChatRequest], cache: CallCache | None,
                    on_result: Callable[[ChatResult], None] | None = None, *, on_each: OnEach | None = None,
                    keep: Literal[False]) -> None: ...


def cached_complete(backend: LLMBackend, requests: Sequence[ChatRequest], cache: CallCache | None,
                    on_result: Callable[[ChatResult], None] | None = None, *, on_each: OnEach | None = None,
                    keep: bool = True) -> list[ChatResult] | None:
    """Answer ``requests`` through ``cache``: read the stored answers first (one listing, then the hits only),
    send only the misses (as one batch, so a backend can parallelise or use a batch API) and store each answer
    the moment it arrives. ``on_result(result)`` and ``on_each(i, result)`` are called once per request, cached
    or fresh (progress bars; callers that judge answers as they come). ``keep=False`` returns None and holds no
    cached answer beyond one read chunk (a caller that only needs the callbacks and the cache filled)."""
    keys = [r.cache_key(backend.name, backend.model) for r in requests]
    results: list[ChatResult | None] | None = [None] * len(requests) if keep else None
    answered = np.zeros(len(requests), dtype=bool)
    lock = threading.Lock()

    def deliver(i: int, res: ChatResult) -> None:
        answered[i] = True
        if results is not None:
            results[i] = res
        if on_result:  # first: a bar counts the call before on_each may settle its seed
            on_result(res)
        if on_each:
            on_each(i, res)

    if cache is not None:
        for i, res in cache.read_hits(keys):
            deliver(i, res)
    # Identical requests in one batch share a key and are sent once.
    missing: dict[str, list[int]] = {}
    for i in np.flatnonzero(~answered).tolist():
        missing.setdefault(keys[i], []).append(i)
    if not missing:
        return results  # type: ignore[return-value]
    miss_keys = list(missing)

    def on_fresh(j: int, res: ChatResult) -> None:
        key = miss_keys[j]
        if cache is not None:
            cache.put(key, res)
        with lock:
            for i in missing[key]:
                if not answered[i]:
                    deliver(i, res)

    fresh = backend.complete([requests[missing[k][0]] for k in miss_keys], on_each=on_fresh)
    for j, res in enumerate(fresh):  # backends call on_each; this covers any that finished silently
        if any(not answered[i] for i in missing[miss_keys[j]]):
            on_fresh(j, res)
    return results  # type: ignore[return-value]
