"""A vLLM server (``--llm vllm:URL[#MODEL]``): the OpenAI-compatible client, plus what vLLM's chat completions take
beyond the OpenAI schema, so that a served model gets the decoding controls the local kinds get.

- **Openings** (``ChatRequest.answer_prefix``, a document kind's public first words): the request ends with an
  assistant turn holding the opening and asks vLLM to continue it (``continue_final_message`` true and
  ``add_generation_prompt`` false: vLLM refuses the two together, and the second is on unless it is turned off).
  vLLM answers with the continuation alone; ``continued_answer`` puts the opening back.
- **Seed steering** (``SeedSteering``): a static ``logit_bias`` keyed by token id (``token_logit_bias``: each seed
  term's first token pushed, a one-token word of another class taken down), the ids from vLLM's own tokenizer
  endpoint (``POST /tokenize`` beside ``/v1``, ``{"model", "prompt", "add_special_tokens": false}``), and
  ``repetition_penalty``. vLLM has no DRY sampler, so ``no_repeat_ngram`` is not sent; the release gate's
  repetition checks and the class-fit rounds stand behind it.

The server sees the prompts (released seeds and public settings) and nothing else, as any LLM here; whether its
calls leave this machine depends on where it runs, so the kind counts as remote (``BackendKind.local_weights``
false): a run from reproducible, non-private noise is refused with it (docs/privacy.md).
"""
from __future__ import annotations

from typing import Any

from privseed.tasks.llm.base import ChatRequest
from privseed.tasks.llm.openai_compat import OpenAICompatibleBackend, token_logit_bias


class VLLMBackend(OpenAICompatibleBackend):
    """vLLM's OpenAI-compatible server at ``url`` (``http://host:8000`` or ``.../v1``), serving ``model`` (None: the
    first id of ``GET /v1/models``); every other option as ``OpenAICompatibleBackend``'s."""

    name = "vllm"
    continues_openings = True

    def tokenize_body(self, text: str) -> dict[str, Any]:
        return {"model": self.model, "prompt": text, "add_special_tokens": False}

    def request_body(self, req: ChatRequest) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if req.answer_prefix:
            body.update(continue_final_message=True, add_generation_prompt=False)
        steering = req.steering
        if steering is not None:
            bias = token_logit_bias(steering, self.tokens)
            if bias:
                body["logit_bias"] = bias
            if steering.repeat_penalty != 1.0:
                body["repetition_penalty"] = steering.repeat_penalty
        return body
