"""Anthropic backend against the local fake server: retries, Message Batches (submit, poll, collect,
resume after a crash), key handling. Never the internet."""
import json
import logging

import pytest

from privseed.tasks.errors import ConfigError, PrivseedError
from privseed.tasks.llm import CallCache, PromptTemplate, ReleasedVocabulary, build_request, cached_complete
from privseed.tasks.llm.anthropic_backend import AnthropicBackend, anthropic_price, resolve_api_key
from privseed.tasks.llm.retry import RetryPolicy
from tests.fakes.anthropic_server import FakeAnthropic

KEY = "sk-ant-test-0123456789-do-not-log"
VOCAB = ReleasedVocabulary(["river", "village", "church", "album", "band", "football"], "test")
FAST = RetryPolicy(max_retries=4, base_delay=0.01, max_delay=0.05)


@pytest.fixture
def fake():
    with FakeAnthropic(api_key=KEY) as f:
        yield f


def reqs(n, template="coverage"):
    t = PromptTemplate.load(template)
    return [build_request(t, VOCAB.seed([i % 6, (i + 2) % 6], 0, i), "news article", max_tokens=64,
                          temperature=0.5, call_seed=i) for i in range(n)]


def backend(fake, sleeps=None, **kw):
    kw.setdefault("retry", FAST)
    return AnthropicBackend("claude-haiku-4-5", api_key=KEY, base_url=fake.base_url,
                            sleep=(sleeps.append if sleeps is not None else (lambda s: None)), **kw)


def test_messages_request_shape_and_answer(fake):
    out = backend(fake, use_batches=False).complete(reqs(2))
    body = fake.requests[0]["body"]
    assert body["model"] == "claude-haiku-4-5" and body["max_tokens"] == 64
    assert "every one of the given terms" in body["system"]  # system prompt goes in its own field
    assert [m["role"] for m in body["messages"]] == ["user"]
    assert "temperature" not in body  # the current API takes no sampling parameters by default
    assert out[0].text == "A fake document that mentions river, church." and out[0].tokens_out == 7


def test_retries_429_529_500_with_growing_backoff(fake, caplog):
    fake.fail_next = [429, 529, 500]
    caplog.set_level(logging.DEBUG)
    out = backend(fake, use_batches=False, max_concurrency=1).complete(reqs(1))
    assert out[0].text.startswith("A fake document") and fake.message_calls == 4
    waits = [r for r in caplog.records if "transient failure" in r.getMessage()]
    assert len(waits) == 3 and "429" in waits[0].getMessage() and "529" in waits[1].getMessage()
    assert KEY not in caplog.text


def test_backoff_doubles_and_honours_retry_after():
    import random

    p = RetryPolicy(base_delay=1.0, max_delay=60.0)
    rng = random.Random(0)
    ds = [p.delay(a, None, rng) for a in range(6)]
    assert all(0.5 * min(60, 2 ** a) <= d <= min(60, 2 ** a) for a, d in enumerate(ds))
    assert p.delay(0, 30.0, rng) == 30.0


def test_gives_up_after_max_retries_and_does_not_retry_400(fake):
    fake.fail_next = [529] * 10
    with pytest.raises(PrivseedError, match="still failing"):
        backend(fake, use_batches=False).complete(reqs(1))
    assert fake.message_calls == 5  # 1 + 4 retries
    fake.fail_next = [400]
    calls = fake.message_calls
    with pytest.raises(PrivseedError, match="HTTP 400"):
        backend(fake, use_batches=False).complete(reqs(1))
    assert fake.message_calls == calls + 1


def test_concurrent_calls_keep_request_order(fake):
    out = backend(fake, use_batches=False, max_concurrency=4).complete(reqs(12))
    assert [o.text for o in out] == [f"A fake document that mentions {VOCAB.terms[i % 6]}, {VOCAB.terms[(i + 2) % 6]}."
                                     for i in range(12)]


def test_batch_submit_poll_collect(fake, tmp_path):
    fake.polls_until_end = 3
    sleeps = []
    b = backend(fake, sleeps, use_batches=True, poll_interval=7.0, batch_state=str(tmp_path))
    rs = reqs(5)
    fake.batch_errored = {rs[2].cache_key("anthropic", "claude-haiku-4-5")[:64]}
    out = b.complete(rs)
    assert len(fake.batches) == 1 and sleeps == [7.0, 7.0]
    batch = next(iter(fake.batches.values()))
    expected_ids = [r.cache_key("anthropic", "claude-haiku-4-5")[:64] for r in rs]
    assert [r["custom_id"] for r in batch["requests"]] == expected_ids
    assert fake.message_calls == 1  # the errored entry was re-sent through the Messages API
    assert all(o.text.startswith("A fake document") for o in out)
    paths = [r["path"] for r in fake.requests]
    assert any(p.endswith("/results") for p in paths)
    state = json.loads(next((tmp_path / "anthropic-batches").iterdir()).read_text())
    assert state["collected"] and state["batch_id"] == batch["id"]


def test_batch_resumes_after_a_crash_without_resubmitting(fake, tmp_path):
    fake.polls_until_end = 2

    def crash(_):
        raise KeyboardInterrupt("process killed while polling")

    rs = reqs(4)
    crashing = AnthropicBackend("claude-haiku-4-5", api_key=KEY, base_url=fake.base_url, use_batches=True,
                                batch_state=str(tmp_path), retry=FAST, sleep=crash)
    with pytest.raises(KeyboardInterrupt):
        crashing.complete(rs)
    assert len(fake.batches) == 1
    resumed = backend(fake, use_batches=True, batch_state=str(tmp_path), poll_interval=0)
    out = resumed.complete(rs)
    assert len(fake.batches) == 1 and len(out) == 4  # same batch collected, nothing paid twice
    assert fake.message_calls == 0


def _batch_ids(fake) -> list[list[str]]:
    return [[r["custom_id"] for r in b["requests"]] for b in fake.batches.values()]


def test_all_batches_of_a_run_are_in_flight_at_once(fake, tmp_path):
    """12 requests in batches of 3: the four creations overlap (the fake holds each until four are in progress),
    all four are open before any is collected, and every answer lands in the call cache."""
    fake.polls_until_end, fake.hold_creates = 2, 4
    cache = CallCache(str(tmp_path / "cache"))
    b = backend(fake, use_batches=True, max_batch_size=3, max_concurrency=4, poll_interval=0,
                batch_state=str(tmp_path))
    out = cached_complete(b, reqs(12), cache)
    assert fake.peak_creates == 4 and fake.peak_open_batches == 4 and len(fake.batches) == 4
    paths = [r["path"] for r in fake.requests]
    first_results = next(i for i, p in enumerate(paths) if p.endswith("/results"))
    assert [i for i, p in enumerate(paths) if p == "/v1/messages/batches"] == [0, 1, 2, 3] < [first_results]
    assert len(out) == 12 and all(o.text.startswith("A fake document") for o in out) and len(cache) == 12
    assert sorted(c for ids in _batch_ids(fake) for c in ids) == sorted(
        r.cache_key("anthropic", "claude-haiku-4-5") for r in reqs(12))
    states = sorted(p.name for p in (tmp_path / "anthropic-batches").iterdir())
    assert len(states) == 4 and not any(name.endswith(".open.json") for name in states)


def test_a_crash_mid_submission_resumes_the_submitted_batches_and_submits_the_rest(fake, tmp_path):
    """Two of four batches were submitted when the run died: the restart polls those two and submits only the
    other two; no request is in two batches and nothing goes through the (full-price) Messages API."""
    fake.polls_until_end, fake.refuse_creates_after = 1, 2
    cache = CallCache(str(tmp_path / "cache"))
    kw = dict(use_batches=True, max_batch_size=3, max_concurrency=4, poll_interval=0, batch_state=str(tmp_path))
    with pytest.raises(PrivseedError, match="HTTP 400"):
        cached_complete(backend(fake, **kw), reqs(12), cache)
    assert len(fake.batches) == 2 and len(cache) == 0
    open_states = list((tmp_path / "anthropic-batches").glob("*.open.json"))
    assert len(open_states) == 2
    fake.refuse_creates_after = None
    out = cached_complete(backend(fake, **kw), reqs(12), cache)
    ids = [c for batch in _batch_ids(fake) for c in batch]
    assert len(fake.batches) == 4 and len(ids) == len(set(ids)) == 12
    assert len(out) == 12 and len(cache) == 12 and fake.message_calls == 0
    assert not list((tmp_path / "anthropic-batches").glob("*.open.json"))


def test_answers_land_in_the_cache_as_each_batch_ends(fake, tmp_path):
    """Three batches, the second still in progress when the run is killed while waiting: the answers of the two
    that ended are already cached; the restart submits nothing, collects the third and sends no Messages call."""
    fake.polls_until_end, fake.never_end = 1, {1}
    cache = CallCache(str(tmp_path / "cache"))
    sleeps = []

    def killed_on_second_wait(seconds):
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt("process killed while polling")

    crashing = AnthropicBackend("claude-haiku-4-5", api_key=KEY, base_url=fake.base_url, use_batches=True,
                                max_batch_size=3, max_concurrency=3, batch_state=str(tmp_path), retry=FAST,
                                sleep=killed_on_second_wait)
    with pytest.raises(KeyboardInterrupt):
        cached_complete(crashing, reqs(9), cache)
    still_open = _batch_ids(fake)[1]
    keys = [r.cache_key("anthropic", "claude-haiku-4-5") for r in reqs(9)]
    assert sorted(k for k in keys if cache.get(k) is not None) == sorted(k for k in keys if k not in still_open)
    assert len(list((tmp_path / "anthropic-batches").glob("*.open.json"))) == 1
    fake.never_end = set()
    out = cached_complete(backend(fake, use_batches=True, max_batch_size=3, poll_interval=0,
                                  batch_state=str(tmp_path)), reqs(9), CallCache(str(tmp_path / "cache")))
    assert len(fake.batches) == 3 and fake.message_calls == 0 and len(out) == 9 and len(cache) == 9
    assert [o.cached for o in out] == [k not in still_open for k in keys]


def test_an_open_batch_the_api_no_longer_knows_is_submitted_again(fake, tmp_path):
    rs = reqs(3)
    ids = [r.cache_key("anthropic", "claude-haiku-4-5") for r in rs]
    folder = tmp_path / "anthropic-batches"
    folder.mkdir()
    (folder / "0123.open.json").write_text(json.dumps({"batch_id": "msgbatch_expired", "model": "claude-haiku-4-5",
                                                       "n": 3, "custom_ids": ids}))
    out = backend(fake, use_batches=True, poll_interval=0, batch_state=str(tmp_path)).complete(rs)
    assert len(out) == 3 and len(fake.batches) == 1 and _batch_ids(fake) == [ids]
    assert not (folder / "0123.open.json").exists()


@pytest.mark.slow
def test_batch_state_on_s3_goes_through_storage_retries(fake, s3_bucket, monkeypatch):
    """The batch id is written to s3:// through privseed.tasks.storage: a dropped connection is retried, and the
    resumed run finds the state and collects the same batch."""
    import s3fs

    fake.polls_until_end = 2
    original, writes = s3fs.S3FileSystem.pipe_file, []

    def flaky_pipe_file(self, path, *args, **kwargs):
        writes.append(path)
        if len(writes) == 1:
            raise ConnectionResetError("simulated reset")
        return original(self, path, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "pipe_file", flaky_pipe_file)

    def crash(_):
        raise KeyboardInterrupt("process killed while polling")

    rs, state = reqs(3), f"{s3_bucket.url}/state"
    crashing = AnthropicBackend("claude-haiku-4-5", api_key=KEY, base_url=fake.base_url, use_batches=True,
                                batch_state=state, retry=FAST, sleep=crash)
    with pytest.raises(KeyboardInterrupt):
        crashing.complete(rs)
    assert len(writes) == 2 and len(s3_bucket.keys("state/anthropic-batches/")) == 1
    out = backend(fake, use_batches=True, batch_state=state, poll_interval=0).complete(rs)
    assert len(fake.batches) == 1 and len(out) == 3 and fake.message_calls == 0


def test_batches_through_the_cache_are_not_resent(fake, tmp_path):
    cache = CallCache(str(tmp_path / "cache"))
    b = backend(fake, use_batches=None, batch_threshold=3, poll_interval=0, batch_state=str(tmp_path))
    cached_complete(b, reqs(4), cache)
    assert len(fake.batches) == 1
    cached_complete(b, reqs(4) + reqs(1, template="generic"), cache)
    assert len(fake.batches) == 1 and fake.message_calls == 1  # below the threshold: one Messages call


def test_key_never_in_repr_or_errors(fake, monkeypatch):
    b = backend(fake)
    assert KEY not in repr(b) and KEY not in str(vars(b).get("model"))
    wrong = AnthropicBackend("claude-haiku-4-5", api_key="wrong", base_url=fake.base_url, retry=FAST,
                             use_batches=False)
    with pytest.raises(PrivseedError) as e:
        wrong.complete(reqs(1))
    assert "401" in str(e.value) and "wrong" not in str(e.value)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        resolve_api_key("ANTHROPIC_API_KEY")
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    assert resolve_api_key("ANTHROPIC_API_KEY") == KEY


def test_prices():
    assert anthropic_price("claude-haiku-4-5-20251001") == (1.0, 5.0)
    assert anthropic_price("claude-opus-4-5") == (5.0, 25.0)
    assert anthropic_price("claude-opus-4-1") == (15.0, 75.0)
    assert anthropic_price("not-a-claude") is None
