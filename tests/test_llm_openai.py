"""OpenAI-compatible backend against a tiny local fake server (httpx, 127.0.0.1 only)."""
import pytest

from privseed.tasks.errors import ConfigError, PrivseedError
from privseed.tasks.llm import PromptTemplate, ReleasedVocabulary, build_request, make_backend
from privseed.tasks.llm.openai_compat import OpenAICompatibleBackend, _base_v1
from privseed.tasks.llm.retry import RetryPolicy
from tests.fakes.anthropic_server import FakeAnthropic

VOCAB = ReleasedVocabulary(["river", "village", "church"], "test")
FAST = RetryPolicy(max_retries=3, base_delay=0.01, max_delay=0.02)


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "oa-test-key")
    with FakeAnthropic(api_key="oa-test-key", model_ids=("qwen-test", "other")) as f:
        yield f


def test_base_url_forms():
    assert _base_v1("http://h:8000") == "http://h:8000/v1"
    assert _base_v1("http://h:8000/v1/") == "http://h:8000/v1"
    assert _base_v1("http://h:8000/v1/chat/completions") == "http://h:8000/v1"


def test_chat_completion_with_model_discovery_and_seed(fake):
    b = make_backend(f"openai-compatible:{fake.base_url}")
    assert b.model == "qwen-test"
    t = PromptTemplate.load("coverage")
    r = build_request(t, VOCAB.seed(["river", "church"], 0, 1), "memo", max_tokens=30, temperature=0.2, call_seed=42)
    out = b.complete([r])
    body = fake.requests[-1]["body"]
    assert fake.requests[-1]["path"] == "/v1/chat/completions"
    assert body["seed"] == 42 and body["temperature"] == 0.2 and body["model"] == "qwen-test"
    assert body["messages"][0]["role"] == "system"
    assert out[0].text == "A fake document that mentions river, church." and out[0].tokens_in == 10


def test_explicit_model_retries_and_errors(fake):
    b = OpenAICompatibleBackend(fake.base_url + "/v1", "other", retry=FAST, max_concurrency=2)
    t = PromptTemplate.load("generic")
    rs = [build_request(t, VOCAB.seed([i % 3], 0, i), "memo", max_tokens=5, temperature=0.0, call_seed=i)
          for i in range(4)]
    fake.fail_next = [503, 429]
    out = b.complete(rs)
    assert len(out) == 4 and fake.requests[-1]["body"]["model"] == "other"
    fake.fail_next = [404]
    with pytest.raises(PrivseedError, match="HTTP 404"):
        b.complete(rs[:1])
    with pytest.raises(ConfigError):
        OpenAICompatibleBackend("ftp://x")
