"""A local fake of the Anthropic HTTP API on 127.0.0.1, for tests (never the internet).

Serves POST /v1/messages, and the Message Batches API: POST /v1/messages/batches, GET
/v1/messages/batches/{id}, GET /v1/messages/batches/{id}/results (the batch's results_url, JSONL).
Every request body is recorded (``requests``) so tests can assert what a backend sent. Failure injection:
``fail_next`` (HTTP statuses to answer the next /v1/messages calls with: 429, 500, 529 ...),
``batch_errored`` (custom_ids to report as errored in batch results), ``polls_until_end`` (retrieve calls
before a batch ends), ``never_end`` (ordinals of batches, in creation order, that stay in progress),
``refuse_creates_after`` (batch creations beyond this many are refused with HTTP 400, as a crash mid-submission),
``hold_creates`` (each batch creation waits until this many are in progress at once, up to 10 s: a backend
that submits one batch after another cannot get past it). ``peak_creates`` (most batch creations in progress
at once) and ``peak_open_batches`` (most batches created and not yet collected) say what a backend did.
The answer text is deterministic: it repeats the terms after "terms:" in the last user message, so coverage
is 100 %. With ``seeded_answers`` an OpenAI-compatible request's ``seed`` is part of the answer too, as a real
model's sampling seed makes two calls on the same seed terms write different documents (without it, two equal
DP seed sequences, which secure noise on a tiny corpus sometimes draws, give duplicate rows the release gate
rejects).

Also usable as an OpenAI-compatible fake (POST /v1/chat/completions, GET /v1/models).
"""
from __future__ import annotations

import json
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               429: "rate_limit_error", 500: "api_error", 529: "overloaded_error", 503: "api_error"}


def fake_text(messages: list[dict]) -> str:
    last = next((m for m in reversed(messages) if m.get("role") == "user"), {"content": ""})
    content = last["content"]
    if isinstance(content, list):
        content = " ".join(c.get("text", "") for c in content if isinstance(c, dict))
    m = re.search(r"terms:\s*(.*?)(?:\.\s*Use every|\.?$)", content, flags=re.S)
    terms = m.group(1).strip() if m else content
    # At most two terms per sentence: a comma list of five seed terms is what the document predicate calls a
    # seed echo, and of three one it asks to rewrite (privseed.tasks.quality.longest_seed_run, rewrite_score); the
    # fake stands for a model that writes documents.
    parts = [t for t in terms.split(", ")]
    text = f"A fake document that mentions {', '.join(parts[:2])}."
    for i in range(2, len(parts), 2):
        text += f" It also covers {', '.join(parts[i:i + 2])}."
    return text


class FakeAnthropic:
    def __init__(self, api_key: str = "test-key", polls_until_end: int = 1,
                 model_ids: tuple[str, ...] = ("fake-model",), seeded_answers: bool = False):
        self.api_key = api_key
        self.seeded_answers = seeded_answers
        self.polls_until_end = polls_until_end
        self.model_ids = model_ids
        self.requests: list[dict] = []  # {"path", "body", "headers"} for every request
        self.fail_next: list[int] = []
        self.batch_errored: set[str] = set()
        self.batches: dict[str, dict] = {}
        self.message_calls = 0
        self.never_end: set[int] = set()
        self.refuse_creates_after: int | None = None
        self.hold_creates = 0
        self.creates_in_progress = self.peak_creates = self.peak_open_batches = 0
        self.lock = threading.Lock()
        self.creates_changed = threading.Condition(self.lock)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "FakeAnthropic":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def sent_texts(self) -> list[str]:
        """Every string the clients sent in request bodies (for privacy assertions)."""
        return [json.dumps(r["body"]) for r in self.requests]

    # -- response builders -----------------------------------------------------------------------------------
    def _message(self, body: dict) -> dict:
        text = fake_text(body.get("messages", []))
        n_in = (sum(len(str(m.get("content", ""))) for m in body.get("messages", [])) // 4
                + len(body.get("system", "")) // 4)
        return {"id": f"msg_{uuid.uuid4().hex[:20]}", "type": "message", "role": "assistant",
                "model": body.get("model", "fake"), "content": [{"type": "text", "text": text}],
                "stop_reason": "end_turn", "stop_sequence": None,
                "usage": {"input_tokens": max(1, n_in), "output_tokens": len(text.split())}}

    def _batch_json(self, b: dict) -> dict:
        ended = b["polls"] >= self.polls_until_end and b["ordinal"] not in self.never_end
        n = len(b["requests"])
        errored = sum(r["custom_id"] in self.batch_errored for r in b["requests"]) if ended else 0
        return {"id": b["id"], "type": "message_batch", "processing_status": "ended" if ended else "in_progress",
                "request_counts": {"processing": 0 if ended else n, "succeeded": n - errored if ended else 0,
                                   "errored": errored, "canceled": 0, "expired": 0},
                "created_at": "2026-11-22T00:00:00Z", "expires_at": "2026-11-23T00:00:00Z",
                "ended_at": "2026-11-22T00:01:00Z" if ended else None, "archived_at": None,
                "cancel_initiated_at": None,
                "results_url": f"{self.base_url}/v1/messages/batches/{b['id']}/results" if ended else None}

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def _send(self, status: int, payload, content_type: str = "application/json", headers=None):
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _error(self, status: int, headers=None):
                self._send(status, {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"),
                                                              "message": f"fake {status}"}}, headers=headers)

            def _authorized(self) -> bool:
                key = self.headers.get("x-api-key") or (self.headers.get("authorization") or "").removeprefix("Bearer ")
                if fake.api_key and key != fake.api_key:
                    self._error(401)
                    return False
                return True

            def _record(self, body):
                with fake.lock:
                    fake.requests.append({"path": self.path, "body": body,
                                          "headers": {k.lower(): v for k, v in self.headers.items()
                                                      if k.lower() not in ("x-api-key", "authorization")}})

            def do_POST(self):
                n = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                self._record(body)
                if not self._authorized():
                    return
                path = self.path.split("?")[0]
                if path == "/v1/messages":
                    with fake.lock:
                        fake.message_calls += 1
                        status = fake.fail_next.pop(0) if fake.fail_next else None
                    if status:
                        return self._error(status, headers={"retry-after": "0"})
                    return self._send(200, fake._message(body))
                if path == "/v1/messages/batches":
                    bid = f"msgbatch_{uuid.uuid4().hex[:20]}"
                    with fake.creates_changed:
                        fake.creates_in_progress += 1
                        fake.peak_creates = max(fake.peak_creates, fake.creates_in_progress)
                        fake.creates_changed.notify_all()
                        fake.creates_changed.wait_for(lambda: fake.creates_in_progress >= fake.hold_creates, timeout=10)
                        limit = fake.refuse_creates_after
                        refused = limit is not None and len(fake.batches) >= limit
                        if not refused:
                            fake.batches[bid] = {"id": bid, "requests": body["requests"], "polls": 0,
                                                 "ordinal": len(fake.batches), "collected": False}
                            fake.peak_open_batches = max(fake.peak_open_batches,
                                                         sum(not b["collected"] for b in fake.batches.values()))
                    try:
                        if refused:
                            return self._error(400)
                        return self._send(200, fake._batch_json(fake.batches[bid]))
                    finally:
                        with fake.creates_changed:
                            fake.creates_in_progress -= 1
                if path == "/v1/chat/completions":
                    with fake.lock:
                        fake.message_calls += 1
                        status = fake.fail_next.pop(0) if fake.fail_next else None
                    if status:
                        return self._error(status, headers={"retry-after": "0"})
                    text = fake_text(body.get("messages", []))
                    if fake.seeded_answers and body.get("seed") is not None:
                        text += f" Its draft number is {int(body['seed'])}."
                    return self._send(200, {"id": "chatcmpl-1", "object": "chat.completion", "model": body.get("model"),
                                            "choices": [{"index": 0, "finish_reason": "stop",
                                                         "message": {"role": "assistant", "content": text}}],
                                            "usage": {"prompt_tokens": 10, "completion_tokens": len(text.split())}})
                self._error(404)

            def do_GET(self):
                self._record(None)
                if not self._authorized():
                    return
                path = self.path.split("?")[0]
                if path == "/v1/models":
                    return self._send(200, {"object": "list",
                                            "data": [{"id": m, "object": "model"} for m in fake.model_ids]})
                m = re.fullmatch(r"/v1/messages/batches/([^/]+)(/results)?", path)
                if not m or m.group(1) not in fake.batches:
                    return self._error(404)
                b = fake.batches[m.group(1)]
                if m.group(2) is None:
                    with fake.lock:
                        b["polls"] += 1
                        payload = fake._batch_json(b)
                    return self._send(200, payload)
                if b["polls"] < fake.polls_until_end or b["ordinal"] in fake.never_end:
                    return self._error(400)
                with fake.lock:
                    b["collected"] = True
                lines = []
                for r in b["requests"]:
                    if r["custom_id"] in fake.batch_errored:
                        res = {"type": "errored",
                               "error": {"type": "error", "error": {"type": "api_error", "message": "fake"}}}
                    else:
                        res = {"type": "succeeded", "message": fake._message(r["params"])}
                    lines.append(json.dumps({"custom_id": r["custom_id"], "result": res}))
                return self._send(200, ("\n".join(lines) + "\n").encode(), content_type="application/binary")

        return Handler
