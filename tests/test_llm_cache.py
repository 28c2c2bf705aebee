"""The call cache: no finished call is ever sent twice, across crashes and re-runs."""
import numpy as np
import pytest

from privseed.tasks.llm import CallCache, PromptTemplate, ReleasedVocabulary, build_request, cached_complete
from privseed.tasks.llm.base import ChatResult
from tests.fakes.recording import RecordingBackend

VOCAB = ReleasedVocabulary(["river", "village", "church", "album", "band"], "test")


def requests(n, seed0=0):
    t = PromptTemplate.load("generic")
    return [build_request(t, VOCAB.seed([i % 5, (i + 1) % 5], 0, i), "document", max_tokens=20, temperature=0.7,
                          call_seed=seed0 + i) for i in range(n)]


@pytest.mark.parametrize("scheme", ["local", "file", "memory"])
def test_cache_round_trip(tmp_path, scheme):
    root = {"local": str(tmp_path / "c"), "file": f"file://{tmp_path}/c", "memory": f"memory://cache-{tmp_path.name}"}[scheme]
    cache = CallCache(root)
    assert cache.get("ab" * 32) is None
    cache.put("ab" * 32, ChatResult("hello", 3, 1))
    got = CallCache(root).get("ab" * 32)
    assert got == ChatResult("hello", 3, 1, cached=True) and got.cached
    assert len(CallCache(root)) == 1


def test_rerun_sends_nothing(tmp_path):
    cache = CallCache(str(tmp_path))
    b = RecordingBackend()
    first = cached_complete(b, requests(6), cache)
    assert len(b.requests) == 6
    b2 = RecordingBackend()
    again = cached_complete(b2, requests(6), cache)
    assert b2.requests == [] and [r.text for r in again] == [r.text for r in first]
    assert all(r.cached for r in again)
    # a new seed is a new call
    cached_complete(b2, requests(1, seed0=100), cache)
    assert len(b2.requests) == 1


def test_crash_mid_batch_keeps_finished_calls(tmp_path):
    cache = CallCache(str(tmp_path))
    crashing = RecordingBackend(fail_at=4)
    with pytest.raises(RuntimeError, match="simulated crash"):
        cached_complete(crashing, requests(10), cache)
    assert len(cache) == 4
    resumed = RecordingBackend()
    out = cached_complete(resumed, requests(10), cache)
    assert len(resumed.requests) == 6 and len(out) == 10
    assert [r.seed for r in resumed.requests] == list(range(4, 10))


def test_identical_requests_are_sent_once(tmp_path):
    b = RecordingBackend()
    reqs = requests(3) + requests(3)
    progress = []
    out = cached_complete(b, reqs, CallCache(str(tmp_path)), on_result=progress.append)
    assert len(b.requests) == 3 and len(out) == 6 and out[0] == out[3]
    assert len(progress) == 6


def test_without_cache_everything_is_sent():
    b = RecordingBackend()
    cached_complete(b, requests(3), None)
    cached_complete(b, requests(3), None)
    assert len(b.requests) == 6


def test_corrupt_entry_is_a_miss_and_a_leftover_temp_file_is_not_an_entry(tmp_path):
    cache = CallCache(str(tmp_path))
    key = "cd" * 32
    (tmp_path / "cd").mkdir()
    (tmp_path / "cd" / f"{key}.json").write_text('{"text": "half')
    (tmp_path / "cd" / f"{key}.json.tmp-0badf00d").write_text("a crashed write")
    assert cache.get(key) is None and len(cache) == 1
    cache.put(key, ChatResult("whole", 2, 1))
    assert cache.get(key) == ChatResult("whole", 2, 1, cached=True)
    assert sorted(p.name for p in (tmp_path / "cd").iterdir()) == [f"{key}.json", f"{key}.json.tmp-0badf00d"]


def _count_calls(monkeypatch, fs, method: str) -> list:
    original, calls = getattr(fs, method), []

    def counted(*args, **kwargs):
        calls.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(fs, method, counted)
    return calls


def test_one_listing_then_only_the_hits_are_read(tmp_path, monkeypatch):
    """300 of 600 calls are cached: the cache is listed once (one ls per two-hex folder), exactly the 300 hits
    are read, and no miss is probed before the 300 misses are sent."""
    cached_complete(RecordingBackend(), requests(300), CallCache(str(tmp_path)))
    cache = CallCache(str(tmp_path))
    listed, read = _count_calls(monkeypatch, cache.fs, "ls"), _count_calls(monkeypatch, cache.fs, "cat_file")
    backend = RecordingBackend()
    out = cached_complete(backend, requests(600), cache)
    assert len(listed) == 256 and len(read) == 300 and len(backend.requests) == 300
    assert [r.cached for r in out] == [True] * 300 + [False] * 300
    assert len(cache.index) == 600  # the new entries joined the index: the next lookup needs no listing
    again = cached_complete(RecordingBackend(), requests(600), cache)
    assert len(listed) == 256 and len(read) == 900 and all(r.cached for r in again)


def test_few_lookups_probe_instead_of_listing(tmp_path, monkeypatch):
    cached_complete(RecordingBackend(), requests(3), CallCache(str(tmp_path)))
    cache = CallCache(str(tmp_path))
    listed, read = _count_calls(monkeypatch, cache.fs, "ls"), _count_calls(monkeypatch, cache.fs, "cat_file")
    out = cached_complete(RecordingBackend(), requests(5), cache)
    assert listed == [] and len(read) == 5 and [r.cached for r in out] == [True] * 3 + [False] * 2


def test_an_index_entry_without_an_object_is_a_miss(tmp_path):
    """The index keeps 64 bits per key: a listed key that shares them with a requested one (or an entry deleted
    since the listing) costs one read that finds nothing, and the call is made."""
    from privseed.tasks.llm.cache import CacheIndex

    key = "ab" * 32
    cache = CallCache(str(tmp_path), index=CacheIndex(np.array([CacheIndex.prefix(key)], dtype=np.uint64)))
    assert key in cache.index and cache.get(key) is None
    assert cache.get("cd" * 32) is None


# --- on S3 (a real S3-compatible server), through privseed.tasks.storage ---------------------------------------------

def _flaky(monkeypatch, fs, method: str, failures: int) -> list[int]:
    """Make ``fs.method`` raise a transient OSError ``failures`` times, then behave normally."""
    original, calls = getattr(fs, method), []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) <= failures:
            raise ConnectionResetError(f"simulated reset on {args[0]}")
        return original(*args, **kwargs)

    monkeypatch.setattr(fs, method, flaky)
    return calls


@pytest.mark.slow
def test_cache_round_trip_on_s3(s3_bucket):
    root = f"{s3_bucket.url}/runs/llm-cache"
    cache = CallCache(root)  # the endpoint comes from AWS_ENDPOINT_URL, as privseed.tasks.storage resolves it
    b = RecordingBackend()
    first = cached_complete(b, requests(4), cache)
    keys = s3_bucket.keys("runs/llm-cache/")
    assert len(keys) == 4 and all(k.endswith(".json") and k.split("/")[2] == k.split("/")[3][:2] for k in keys)
    again = cached_complete(RecordingBackend(), requests(4), CallCache(root + "/"))
    assert [r.text for r in again] == [r.text for r in first] and all(r.cached for r in again)
    assert len(CallCache(root)) == 4


@pytest.mark.slow
def test_transient_s3_errors_are_retried(s3_bucket, monkeypatch):
    cache = CallCache(f"{s3_bucket.url}/llm-cache")
    key = "ef" * 32
    puts = _flaky(monkeypatch, cache.fs, "pipe_file", failures=1)
    cache.put(key, ChatResult("kept", 5, 2))
    assert len(puts) == 2 and s3_bucket.keys("llm-cache/") == [f"llm-cache/ef/{key}.json"]
    reads = _flaky(monkeypatch, cache.fs, "cat_file", failures=2)
    assert cache.get(key) == ChatResult("kept", 5, 2, cached=True) and len(reads) == 3
    assert cache.get("00" * 32) is None  # a missing entry is a miss, not an error to retry


@pytest.mark.slow
def test_persistent_s3_error_names_the_cache_not_the_key(s3_bucket, monkeypatch):
    from privseed.tasks.errors import StorageError

    root = f"{s3_bucket.url}/llm-cache"
    cache = CallCache(root)
    key = "9a" * 32
    calls = _flaky(monkeypatch, cache.fs, "pipe_file", failures=10**6)
    with pytest.raises(StorageError) as caught:
        cache.put(key, ChatResult("lost", 1, 1))
    assert len(calls) == 3  # privseed.tasks.storage.with_retries' attempts
    message = str(caught.value)
    assert root in message and "ConnectionResetError" in message and key not in message


@pytest.mark.slow
def test_prefect_secret_storage_option_is_resolved(prefect_harness, s3_bucket, monkeypatch):
    from prefect.blocks.system import Secret

    from tests.s3server import TEST_ACCESS_KEY, TEST_SECRET_KEY

    Secret(value=TEST_SECRET_KEY).save("privseed-test-cache-secret", overwrite=True)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")  # the block is the only place the secret comes from
    options = {"key": TEST_ACCESS_KEY, "secret": "prefect-secret:privseed-test-cache-secret"}
    cache = CallCache(f"{s3_bucket.url}/llm-cache", options)
    assert cache.fs.secret == TEST_SECRET_KEY and cache.storage_options == options  # the reference is kept
    cache.put("12" * 32, ChatResult("via the block", 4, 3))
    assert CallCache(f"{s3_bucket.url}/llm-cache", options).get("12" * 32).text == "via the block"


@pytest.mark.slow
def test_listing_on_s3_reads_only_the_hits_and_errors_name_the_root(s3_bucket, monkeypatch):
    from privseed.tasks.errors import StorageError

    root = f"{s3_bucket.url}/runs/llm-cache"
    cached_complete(RecordingBackend(), requests(40), CallCache(root))
    corrupt = requests(300)[50].cache_key("recording", "echo")
    s3_bucket.server.client().put_object(Bucket=s3_bucket.name, Key=f"runs/llm-cache/{corrupt[:2]}/{corrupt}.json",
                                         Body=b'{"text": "half')
    cache = CallCache(root)
    assert len(cache.list_index()) == 41
    read = _count_calls(monkeypatch, cache.fs, "cat_file")
    backend = RecordingBackend()
    out = cached_complete(backend, requests(300), cache)
    assert len(read) == 41 and len(backend.requests) == 260 and sum(r.cached for r in out) == 40
    assert not out[50].cached and len(s3_bucket.keys("runs/llm-cache/")) == 300  # the corrupt entry recomputed

    broken = CallCache(root)
    _flaky(monkeypatch, broken.fs, "ls", failures=10**6)
    with pytest.raises(StorageError) as caught:
        broken.list_index()
    message = str(caught.value)
    assert root in message and "ConnectionResetError" in message and "/runs/llm-cache/" not in message.replace(root, "")
