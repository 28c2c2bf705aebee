"""One shared llama.cpp server per machine, with continuous batching (``--llm local-server[:MODEL]``).

``xllamacpp`` (MIT, a prebuilt CPU wheel: no compile) embeds llama.cpp's own server: one copy of the weights,
``slots`` sequences decoded together (continuous batching), the KV cache of a slot's last prompt reused for the
next request with the same prefix (``cache_prompt``: the system prompt and few-shot turns are most of each
prompt), a logit bias and a grammar per request, token log-probabilities. It listens on 127.0.0.1 only, on a free
port, and speaks the OpenAI chat-completions API, so every client (the flow process, each Dask worker) reaches it
through the same ``openai`` SDK client a GPU server (vLLM, llama.cpp's server) gets
(``OpenAICompatibleBackend``).

Lifecycle: ``privseed.tasks.llm.service.serving(spec)`` starts it in the flow process before generation and stops
it after (workers get its URL in the spec); a backend used without ``serving`` (a notebook, a test) starts its own
in its process and stops it on ``close()`` or at exit. ``OMP_WAIT_POLICY=passive`` is set (unless set) before
llama.cpp's OpenMP runtime starts: spinning threads on a machine whose cores are shared crawl (STACK notes).

Privacy: the server sees the prompts (released seeds, public settings) and nothing else; it listens on loopback.
"""
from __future__ import annotations

import atexit
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privseed.tasks.errors import ConfigError
from privseed.tasks.llm.base import ChatRequest
from privseed.tasks.llm.openai_compat import OpenAICompatibleBackend, token_logit_bias
from privseed.tasks.llm.retry import RetryPolicy

log = logging.getLogger("privseed.llm")

#: Context tokens per slot (the longest prompt + answer a request may use).
SLOT_CONTEXT = 2048
DEFAULT_SLOTS = 4

#: A GBNF grammar for prose: the answer opens with a letter, digit or quote (no markdown heading, bullet, bold
#: label or table) and no later line opens with '#', '-', '*', '|' or '>' or a numbered-list marker.
PROSE_GRAMMAR = r'''
root  ::= first rest
first ::= [A-Za-z0-9"(] [^\n]*
rest  ::= ("\n" line)*
line  ::= "" | [^\n#*|>\-0-9 \t] [^\n]*
'''


def server_threads() -> int:
    """Every core: one server decodes for the whole machine."""
    return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class ServerSettings:
    path: Path
    slots: int = DEFAULT_SLOTS
    threads: int = 0  # 0: server_threads()

    def resolved_threads(self) -> int:
        return int(self.threads) or server_threads()


class LocalServer:
    """llama.cpp's server (xllamacpp) in this process, on 127.0.0.1 and a free port; ``stop()`` ends it."""

    def __init__(self, settings: ServerSettings):
        os.environ.setdefault("OMP_WAIT_POLICY", "passive")
        try:
            import xllamacpp
        except ImportError as e:
            raise ConfigError("--llm local-server needs the xllamacpp package: pip install xllamacpp") from e
        if settings.slots < 1:
            raise ConfigError(f"local-server needs at least one slot, got {settings.slots}")
        params = xllamacpp.CommonParams()
        params.model.path = str(settings.path)
        params.n_parallel = int(settings.slots)
        params.n_ctx = SLOT_CONTEXT * int(settings.slots)
        params.cpuparams.n_threads = settings.resolved_threads()
        params.cpuparams_batch.n_threads = settings.resolved_threads()
        params.port = 0  # a free port
        params.verbosity = -1
        self.settings = settings
        self._server: Any = xllamacpp.Server(params)
        address = str(self._server.listening_address or "")
        if not address.startswith("http://127.0.0.1:"):
            self._server = None
            raise ConfigError(f"the local llama.cpp server did not listen on loopback (got {address!r})")
        self.url = address + "/v1"
        log.info("local llama.cpp server: %d slot(s), %d thread(s) at %s", settings.slots,
                 settings.resolved_threads(), self.url)

    @property
    def running(self) -> bool:
        return self._server is not None

    def stop(self) -> None:
        """Stop the server and free the weights (llama.cpp's destructor ends its main loop)."""
        self._server = None


_SERVERS: dict[ServerSettings, LocalServer] = {}
_LOCK = threading.Lock()


def shared_server(settings: ServerSettings) -> LocalServer:
    """This process's server for ``settings`` (started on first use)."""
    with _LOCK:
        server = _SERVERS.get(settings)
        if server is None or not server.running:
            server = _SERVERS[settings] = LocalServer(settings)
        return server


def stop_server(settings: ServerSettings) -> None:
    with _LOCK:
        server = _SERVERS.pop(settings, None)
    if server is not None:
        server.stop()


@atexit.register
def _stop_all() -> None:
    with _LOCK:
        servers = list(_SERVERS.values())
        _SERVERS.clear()
    for server in servers:
        server.stop()


def model_id(path: Path) -> str:
    """The weights' id in cache keys and rows (the same form as the in-process llama.cpp backend's)."""
    from privseed.tasks.llm.models import file_sha256

    return f"{path.stem}@{file_sha256(path)[:12]}"


class LocalServerBackend(OpenAICompatibleBackend):
    """The shared local server through the OpenAI-compatible client. ``url``: a running server's (``serving``
    passes it to the workers); without one this process starts its own on first use. ``slots``: parallel
    sequences (and the calls this client keeps in flight); ``grammar``: "prose" (PROSE_GRAMMAR) or none."""

    name = "local-server"
    price_in_per_mtok = 0.0
    price_out_per_mtok = 0.0

    def __init__(self, model: str | None = None, *, url: str | None = None, slots: int = DEFAULT_SLOTS,
                 threads: int = 0, grammar: str | None = None, max_concurrency: int | None = None,
                 retry: RetryPolicy = RetryPolicy(max_retries=2)):
        from privseed.tasks.llm.local import resolve_local_model

        kind, path = resolve_local_model(model)
        if kind != "gguf":
            raise ConfigError(f"--llm local-server serves GGUF files; {path} is a Hugging Face folder")
        if grammar not in (None, "prose"):
            raise ConfigError(f"local-server grammar must be 'prose' or unset, got {grammar!r}")
        self.settings = ServerSettings(path, int(slots), int(threads))
        self._owned = url is None
        self._url = url
        self.path = path
        self._model_id = model_id(path)
        super().__init__(url or "http://127.0.0.1:0/v1", self._model_id,
                         max_concurrency=int(max_concurrency or slots), retry=retry, llama_cpp=True, logprobs=True,
                         grammar=PROSE_GRAMMAR if grammar == "prose" else None)

    @property
    def client(self) -> Any:
        if self._owned and self._client is None:
            self.base = shared_server(self.settings).url
        return super().client

    def tokenize_body(self, text: str) -> dict[str, Any]:
        return {"content": text, "add_special": False}

    def request_body(self, req: ChatRequest) -> dict[str, Any]:
        """As the OpenAI-compatible client's, with the seed steering as token ids (``token_logit_bias``: a seed
        term's first token pushed, a one-token word to avoid taken down) instead of llama.cpp's string form, which
        biases every token of a form."""
        body = super().request_body(req)
        body.pop("logit_bias", None)
        bias = token_logit_bias(req.steering, self.tokens)
        if bias:
            body["logit_bias"] = bias
        return body

    def close(self) -> None:
        super().close()
        if self._owned:
            stop_server(self.settings)

