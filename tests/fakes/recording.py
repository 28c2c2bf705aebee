"""A backend that records every request it is sent and answers deterministically (no model)."""
from __future__ import annotations

import re
import threading
from typing import Sequence

from privseed.tasks.llm.base import ChatRequest, ChatResult, LLMBackend, OnEach


class RecordingBackend(LLMBackend):
    name = "recording"

    def __init__(self, model: str = "echo", fail_at: int | None = None, answer=None):
        self.model = model
        self.requests: list[ChatRequest] = []
        self.fail_at = fail_at  # raise on the fail_at-th request ever sent (0-based), to simulate a crash
        self.answer = answer or self.echo_terms
        self.lock = threading.Lock()
        self.closes = 0  # how often close() was called (generation frees its backend when it finishes)

    @staticmethod
    def echo_terms(req: ChatRequest) -> str:
        m = re.search(r"terms: (.*?)\.", req.messages[-1].content)
        return f"[seed {req.seed}] A text with {m.group(1) if m else req.messages[-1].content}."

    def close(self) -> None:
        self.closes += 1

    def sent_strings(self) -> list[str]:
        return [m.content for r in self.requests for m in r.messages]

    def complete(self, requests: Sequence[ChatRequest], on_each: OnEach | None = None) -> list[ChatResult]:
        out = []
        for i, req in enumerate(requests):
            with self.lock:
                if self.fail_at is not None and len(self.requests) == self.fail_at:
                    raise RuntimeError("simulated crash")
                self.requests.append(req)
            text = self.answer(req)
            if req.answer_prefix:  # the answer continues the words it was given, as a model's does
                text = f"{req.answer_prefix} {text}"
            res = ChatResult(text, sum(len(m.content.split()) for m in req.messages), len(text.split()))
            out.append(res)
            if on_each:
                on_each(i, res)
        return out
