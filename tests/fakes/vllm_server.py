"""A local fake of vLLM's OpenAI-compatible server on 127.0.0.1, for tests (never the internet).

It answers what ``--llm vllm:URL`` uses, and refuses what vLLM refuses (vllm/entrypoints/openai/protocol.py, the
chat-completion request's own checks), so a client that sends vLLM a request it would reject fails here too:

- ``GET /v1/models``; ``POST /tokenize`` (``{"model", "prompt", "add_special_tokens"}`` -> ``{"tokens", "count",
  "max_model_len"}``; a BOS id first unless ``add_special_tokens`` is false);
- ``POST /v1/chat/completions``: HTTP 400 when ``continue_final_message`` and ``add_generation_prompt`` are both
  true (the latter is true unless sent false), when ``continue_final_message`` is set and the last message is not
  the assistant's, when a ``logit_bias`` key is not a token id of the vocabulary, or for an unknown model. The
  answer repeats the seed terms after "terms:" (``fake_text``); a continued message is answered with the
  continuation alone, as vLLM does without ``echo``.

The tokenizer is a word-level toy: " word" (with its space) is one token when the word is in ``WORDS``, and any
other text splits into pieces of three characters, so a test knows which forms are one token and which are not.
Every request body is recorded (``requests``).
"""
from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.fakes.anthropic_server import fake_text

#: Words the toy tokenizer holds whole, with and without a leading space and capitalized.
WORDS = ("river", "church", "village", "food", "menu", "delicious", "I", "went", "the", "a")
BOS = 1
VOCAB_SIZE = 50_000


class FakeVLLM:
    def __init__(self, model: str = "Qwen/Qwen2.5-7B-Instruct", api_key: str = ""):
        self.model = model
        self.api_key = api_key
        self.requests: list[dict] = []
        self.vocab: dict[str, int] = {}
        self.lock = threading.Lock()
        for word in WORDS:
            for form in (word, " " + word, word.capitalize(), " " + word.capitalize()):
                self._id(form)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "FakeVLLM":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _id(self, piece: str) -> int:
        with self.lock:
            return self.vocab.setdefault(piece, 100 + len(self.vocab))

    def tokenize(self, text: str) -> list[int]:
        """The toy tokenizer: known words whole (with their leading space), anything else in 3-character pieces."""
        ids = []
        for piece in re.findall(r" ?[^ ]+| +", text):
            if piece.strip() in WORDS or piece.strip().lower() in WORDS:
                ids.append(self._id(piece))
            else:
                ids.extend(self._id(piece[i:i + 3]) for i in range(0, len(piece), 3))
        return ids

    def chat_error(self, body: dict) -> str | None:
        """Why vLLM would refuse this chat completion (None: it would not)."""
        if body.get("model") != self.model:
            return f"The model `{body.get('model')}` does not exist."
        if body.get("continue_final_message") and body.get("add_generation_prompt", True):
            return "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
        messages = body.get("messages") or []
        if body.get("continue_final_message") and (not messages or messages[-1].get("role") != "assistant"):
            return "continue_final_message is set but the final message is not an assistant message"
        for key in body.get("logit_bias") or {}:
            if not str(key).lstrip("-").isdigit() or not 0 <= int(key) < VOCAB_SIZE:
                return f"token_id(s) [{key}] in logit_bias contain out-of-vocab token ids"
        return None

    def answer(self, body: dict) -> str:
        messages = body["messages"]
        if body.get("continue_final_message"):
            text = fake_text(messages[:-1])
            return " and then " + text[0].lower() + text[1:]
        return fake_text(messages)

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                if fake.api_key and self.headers.get("authorization") != f"Bearer {fake.api_key}":
                    self._send(401, {"error": "Unauthorized"})
                    return False
                return True

            def do_GET(self):
                if not self._authorized():
                    return
                if self.path.split("?")[0] == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": fake.model, "object": "model"}]})
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
                path = self.path.split("?")[0]
                with fake.lock:
                    fake.requests.append({"path": path, "body": body})
                if not self._authorized():
                    return
                if path == "/tokenize":
                    ids = fake.tokenize(str(body.get("prompt", "")))
                    if body.get("add_special_tokens", True):
                        ids = [BOS, *ids]
                    self._send(200, {"tokens": ids, "count": len(ids), "max_model_len": 32768})
                elif path == "/v1/chat/completions":
                    error = fake.chat_error(body)
                    if error:
                        self._send(400, {"object": "error", "message": error, "type": "BadRequestError",
                                         "code": 400})
                        return
                    text = fake.answer(body)
                    self._send(200, {
                        "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": fake.model,
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                     "finish_reason": "stop", "logprobs": None}],
                        "usage": {"prompt_tokens": 40, "completion_tokens": len(text.split()),
                                  "total_tokens": 40 + len(text.split())}})
                else:
                    self._send(404, {"detail": "Not Found"})

        return Handler
