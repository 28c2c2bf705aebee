"""The call cache: no finished call is ever sent twice, across crashes and re-runs."""
import pytest

from tasks.llm import CallCache, PromptTemplate, ReleasedVocabulary, build_request, cached_complete
from tasks.llm.base import ChatResult
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
