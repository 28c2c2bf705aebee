"""The ``--llm`` backend kinds, each described as data with its own behaviour: how --llm names it and parses it,
how its backend is built, its price, which run options it takes, and what it checks before a run reads private data
(``preflight``). Everything that lists the kinds reads this registry: the --llm grammar of errors and --help
(:data:`LLM_GRAMMAR`, :func:`llm_help`), the choices, the preflight (tasks/config/preflight.py), the service
(tasks/llm/service.py). A new backend is one :class:`BackendKind` entry in :data:`KINDS` (and its module).

This module imports nothing heavy (the command line reads it to build --help); a kind's backend module is imported
when the kind builds or prices something."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from privseed.tasks.errors import ConfigError

if TYPE_CHECKING:
    from privseed.tasks.llm.base import LLMBackend


@dataclass(frozen=True)
class LLMSpec:
    """A parsed ``--llm`` value plus backend options (public configuration only: no keys)."""

    kind: str
    model: str | None = None
    url: str | None = None
    options: tuple[tuple[str, object], ...] = field(default=())

    def with_options(self, **options) -> "LLMSpec":
        merged = dict(self.options)
        merged.update({k: v for k, v in options.items() if v is not None})
        return LLMSpec(self.kind, self.model, self.url, tuple(sorted(merged.items())))

    def __str__(self) -> str:
        if self.url:
            return f"{self.kind}:{self.url}" + (f"#{self.model}" if self.model else "")
        return self.kind + (f":{self.model}" if self.model else "")


# -- what each kind is ------------------------------------------------------------------------------------------
def _free(spec: LLMSpec, n_calls: int) -> tuple[float, float] | None:
    return 0.0, 0.0


def _declared_price(spec: LLMSpec, n_calls: int) -> tuple[float, float] | None:
    opts = dict(spec.options)
    if opts.get("price_in_per_mtok") is not None and opts.get("price_out_per_mtok") is not None:
        return float(str(opts["price_in_per_mtok"])), float(str(opts["price_out_per_mtok"]))
    return None


def _anthropic_batches(spec: LLMSpec, n_calls: int) -> bool:
    from privseed.tasks.llm.anthropic_backend import will_batch

    opts = dict(spec.options)
    use = opts.get("use_batches")
    return will_batch(None if use is None else bool(use), int(str(opts.get("batch_threshold", 200))), n_calls)


def _anthropic_price(spec: LLMSpec, n_calls: int) -> tuple[float, float] | None:
    from privseed.tasks.llm.anthropic_backend import BATCH_DISCOUNT, anthropic_price

    p = anthropic_price(spec.model or "")
    if p is None:
        return None
    f = BATCH_DISCOUNT if _anthropic_batches(spec, n_calls) else 1.0
    return p[0] * f, p[1] * f


def _never(spec: LLMSpec, n_calls: int) -> bool:
    return False


def _build_local(spec: LLMSpec) -> LLMBackend:
    from privseed.tasks.llm.local import local_backend

    return local_backend(spec.model, **dict(spec.options))


def _build_local_server(spec: LLMSpec) -> LLMBackend:
    from privseed.tasks.llm.local_server import LocalServerBackend

    return LocalServerBackend(spec.model, **dict(spec.options))  # type: ignore[arg-type]


def _build_anthropic(spec: LLMSpec) -> LLMBackend:
    from privseed.tasks.llm.anthropic_backend import AnthropicBackend

    return AnthropicBackend(spec.model, **dict(spec.options))  # type: ignore[arg-type]


def _build_openai(spec: LLMSpec) -> LLMBackend:
    from privseed.tasks.llm.openai_compat import OpenAICompatibleBackend

    return OpenAICompatibleBackend(spec.url, spec.model, **dict(spec.options))  # type: ignore[arg-type]


def _build_vllm(spec: LLMSpec) -> LLMBackend:
    from privseed.tasks.llm.vllm_backend import VLLMBackend

    return VLLMBackend(spec.url, spec.model, **dict(spec.options))  # type: ignore[arg-type]


def _no_preflight(spec: LLMSpec, secret: str | None, sends: bool) -> None:
    return None


def _local_weights_present(spec: LLMSpec, secret: str | None, sends: bool) -> None:
    """A local model's file exists (a packaged or opt-in one is located and verified)."""
    from privseed.tasks.llm.local import resolve_local_model

    resolve_local_model(spec.model)


def _api_key_present(variable: str) -> Callable[[LLMSpec, str | None, bool], None]:
    """A remote API has a key (the environment's ``variable`` or a Prefect Secret block), unless the run sends
    nothing (a dry run prices the calls)."""
    def check(spec: LLMSpec, secret: str | None, sends: bool) -> None:
        if sends and not secret and not os.environ.get(variable):
            raise ConfigError(f"--llm {spec}: no API key; set {variable} or name a Prefect Secret block with "
                              "--llm-secret BLOCK")
    return check


def _parse_model(kind: str, needs_model: bool, example: str) -> Callable[[str, str], LLMSpec]:
    def parse(value: str, rest: str) -> LLMSpec:
        if needs_model and not rest:
            raise ConfigError(f"--llm {value!r}: {kind} needs a model, {kind}:MODEL (e.g. {example})")
        return LLMSpec(kind, rest or None)
    return parse


def _parse_none(value: str, rest: str) -> LLMSpec:
    if rest:
        raise ConfigError(f"--llm {value!r}: none takes no model")
    return LLMSpec("none")


def _parse_url(kind: str) -> Callable[[str, str], LLMSpec]:
    def parse(value: str, rest: str) -> LLMSpec:
        url, _, model = rest.partition("#")
        if not url:
            raise ConfigError(f"--llm {value!r}: {kind} needs a URL, {kind}:http://HOST:PORT/v1[#MODEL]")
        return LLMSpec(kind, model or None, url)
    return parse


#: The decoding controls a kind applies: token by token in this process (the seed-steering logits processor),
#: per request as a static logit bias and samplers on a server (llama.cpp's, vLLM), or none (remote APIs).
STEERING_MODES = ("logits-processor", "logit-bias", "none")


@dataclass(frozen=True)
class BackendKind:
    """One ``--llm`` kind, described as data.

    ``form``: how --llm names it. ``parse(value, rest)``: the spec of ``KIND:rest``. ``build(spec)``: its backend
    (None: it makes no calls). ``steering``: one of STEERING_MODES. ``run_options``: the run-wide settings it takes
    from the flow's configuration (``llm_spec``). ``local_weights``: its weights are resolved on this machine
    before any private data is read, and its tokenizer counts prompts for the dry run. ``prefill``: it continues an
    answer whose first words are given (``ChatRequest.answer_prefix``: a document kind's public openings, which only
    such kinds get). ``shows_examples``: its prompts show the example library's documents of the doc type's kind when
    the owner gives no ``--few-shot`` (kinds not paid per input token: local weights and a self-hosted vLLM; a remote
    API would pay for them on every call). ``shared_server``: it runs one server for the machine (``serving``).
    ``price(spec, n_calls)``: USD per million (input, output) tokens for a run of n calls (None: unknown).
    ``batches(spec, n_calls)``: whether such a run goes through a batch API."""

    name: str
    form: str
    summary: str
    parse: Callable[[str, str], LLMSpec]
    build: Callable[[LLMSpec], LLMBackend] | None
    steering: str = "none"
    run_options: tuple[str, ...] = ()
    local_weights: bool = False
    prefill: bool = False
    shows_examples: bool = False
    shared_server: bool = False
    price: Callable[[LLMSpec, int], tuple[float, float] | None] = _declared_price
    batches: Callable[[LLMSpec, int], bool] = _never
    #: (spec, secret block, whether the run sends calls) -> None, or a ConfigError naming what is missing; run before
    #: any private data is read (tasks/config/preflight.py)
    preflight: Callable[[LLMSpec, str | None, bool], None] = _no_preflight

    @property
    def writes_text(self) -> bool:
        return self.build is not None

    def check(self, spec: LLMSpec, secret: str | None = None, *, sends: bool = True) -> None:
        """What this kind needs on this machine before a run reads private data (its ``preflight``)."""
        self.preflight(spec, secret, sends)


KINDS: dict[str, BackendKind] = {kind.name: kind for kind in (
    BackendKind("none", "none", "no LLM, the keyphrase sequence is the document", _parse_none, None, price=_free),
    BackendKind("local", "local[:MODEL_OR_PATH]", "llama-cpp-python in each process, one call at a time",
                _parse_model("local", False, "local:qwen2.5-coder-0.5b"), _build_local, steering="logits-processor",
                local_weights=True, prefill=True, shows_examples=True, price=_free,
                preflight=_local_weights_present),
    BackendKind("local-server", "local-server[:MODEL_OR_PATH]",
                "one llama.cpp server per machine (xllamacpp): continuous batching, prompt cache",
                _parse_model("local-server", False, "local-server:qwen2.5-coder-0.5b"), _build_local_server,
                steering="logit-bias", local_weights=True, prefill=True, shows_examples=True, shared_server=True,
                price=_free),
    BackendKind("anthropic", "anthropic:MODEL", "Messages API; Message Batches for large runs",
                _parse_model("anthropic", True, "anthropic:claude-haiku-4-5"), _build_anthropic,
                run_options=("batch_state", "storage_options", "max_concurrency", "secret_block"),
                price=_anthropic_price, batches=_anthropic_batches,
                preflight=_api_key_present("ANTHROPIC_API_KEY")),
    BackendKind("vllm", "vllm:URL[#MODEL]",
                "a vLLM server: the example library, openings continued, seed steering as a logit bias",
                _parse_url("vllm"), _build_vllm, steering="logit-bias", prefill=True, shows_examples=True,
                run_options=("max_concurrency", "secret_block")),
    BackendKind("openai-compatible", "openai-compatible:URL[#MODEL]",
                "any OpenAI-compatible server (TGI, llama.cpp's server, ...) through the openai SDK, "
                "with no openings or steering", _parse_url("openai-compatible"), _build_openai,
                run_options=("max_concurrency", "secret_block")),
)}

#: The --llm grammar, as errors and --help state it.
LLM_GRAMMAR = " | ".join(kind.form for kind in KINDS.values())


def llm_help(writers_only: bool = False) -> str:
    """The --llm values as --help lists them, from the registry: each kind's form and what it is
    (``writers_only``: the kinds that write text, for commands that need an LLM)."""
    return "; ".join(f"{kind.form}: {kind.summary}" for kind in KINDS.values()
                     if kind.writes_text or not writers_only)


def kind_of(spec: LLMSpec | str) -> BackendKind:
    return KINDS[as_spec(spec).kind]


def parse_llm_spec(value: str) -> LLMSpec:
    """The one parser of ``--llm`` values (the configuration models validate ``llm`` with it)."""
    value = (value or "").strip()
    name, _, rest = value.partition(":")
    kind = KINDS.get(name)
    if kind is None:
        raise ConfigError(f"--llm {value!r}: unknown LLM backend {name!r}; expected {LLM_GRAMMAR}")
    return kind.parse(value, rest)


def as_spec(spec: LLMSpec | str) -> LLMSpec:
    return parse_llm_spec(spec) if isinstance(spec, str) else spec
