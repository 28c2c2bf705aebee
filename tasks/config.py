"""One typed configuration per flow, validated up front with messages that name the problem.

Values come from, in increasing precedence: defaults, a TOML/YAML file (``--config``), environment
variables ``PRIVSEED_<FIELD>`` and command-line flags. Everything here is public (DESIGN.md): the
configuration is written into the manifest, so it must never hold private data or secrets.
"""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tasks import storage
from tasks.errors import ConfigError

LLM_BACKENDS = ("none", "local", "anthropic", "openai-compatible")
#: Seed-steering strength by default for local models (chosen on public DBPedia-14 test-split seeds,
#: docs/generation.md "Seed steering"): 4 raised seed-term coverage from 37 % to 86 % with no degenerate answer.
STEER_DEFAULT = 4.0


class ReleaseConfig(BaseModel):
    """What every method that writes a synthetic release shares."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    #: fields that change the privatized values; the run id is a hash of them (plus data and seed)
    privacy_fields: ClassVar[tuple[str, ...]] = ()

    data: str = Field(description="private corpus: Parquet file, folder or shard prefix (local, file://, s3://)")
    out: str = Field(description="release folder (local or s3://)")
    text_column: str = "text"
    label_column: str = "label"
    labels: list[str] | None = Field(
        default=None,
        description="the public label set; when omitted it is read from the data (label names are treated as public)",
    )
    per_class: int = Field(default=100, ge=1, le=1_000_000, description="synthetic documents per class (public)")
    llm: str = Field(default="none", description="none | local[:PATH] | anthropic[:MODEL] | openai-compatible:URL")
    doc_type: str = Field(default="document", min_length=1, max_length=200)
    seed: int = Field(default=0, ge=0)
    run_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.=-]+$")
    state: str | None = Field(default=None, description="where drawn values and caches live (default OUT/_state)")
    storage_options: dict[str, Any] = Field(default_factory=dict)
    dask_address: str | None = Field(default=None, description="scheduler address; None starts a LocalCluster")
    n_workers: int = Field(default=2, ge=1, le=256)
    gate: bool = Field(default=True, description="run the Great Expectations release gate before publishing")
    # LLM generation (tasks/generation.py, docs/generation.md); public settings only, never a key.
    prompt_template: str = Field(default="generic", description="packaged prompt template name or a YAML path")
    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    max_tokens: int = Field(default=256, ge=1, le=32_768, description="output tokens per LLM call")
    best_of: int = Field(default=1, ge=1, le=16, description="candidates per seed, best by seed-term coverage")
    max_regenerations: int = Field(default=3, ge=0, le=20, description="rounds of regeneration (a new call seed) for "
                                   "a seed with no document among its candidates; still none: the row is dropped")
    steer: float = Field(default=STEER_DEFAULT, ge=0.0, le=50.0,
                         description="seed steering strength for local llama.cpp models (0: off; tasks/llm/steering.py)")
    repeat_penalty: float = Field(default=1.0, gt=0.0, le=5.0, description="llama.cpp repeat penalty (1: off)")
    no_repeat_ngram: int = Field(default=4, ge=0, le=64, description="ban repeating a token n-gram (local; 0: off)")
    language: str | None = Field(default="en", description="the corpus's declared language for the document test "
                                 "(en, de, fr, es, it, pt, nl; none: no language test)")
    llm_concurrency: int = Field(default=4, ge=1, le=256, description="calls in flight for remote APIs")
    llm_secret: str | None = Field(default=None, description="Prefect Secret block holding the API key")

    @field_validator("language", mode="before")
    @classmethod
    def _known_language(cls, value: Any) -> str | None:
        from tasks.quality import FUNCTION_WORDS

        if value is None or str(value).lower() in ("none", ""):
            return None
        if str(value) not in FUNCTION_WORDS:
            raise ValueError(f"unknown language {value!r}; known: {', '.join(sorted(FUNCTION_WORDS))} or none")
        return str(value)

    @field_validator("llm")
    @classmethod
    def _known_llm(cls, value: str) -> str:
        backend = value.split(":", 1)[0]
        if backend not in LLM_BACKENDS:
            raise ValueError(f"unknown LLM backend {backend!r}; choose one of {', '.join(LLM_BACKENDS)}")
        if backend == "openai-compatible" and ":" not in value:
            raise ValueError("openai-compatible needs a URL: openai-compatible:http://host:port/v1")
        return value

    @property
    def state_uri(self) -> str:
        return self.state or storage.join(self.out, "_state")

    def privacy_key(self, dataset_fingerprint: str) -> str:
        """The default run id: same data + same privacy-relevant config + same seed -> same released values."""
        relevant = {f: getattr(self, f) for f in self.privacy_fields}
        relevant.update(method=type(self).__name__, seed=self.seed, data=dataset_fingerprint)
        return hashlib.sha256(json.dumps(relevant, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def public_dict(self) -> dict[str, Any]:
        """The configuration as written to manifests: storage secrets redacted."""
        values = self.model_dump()
        values["storage_options"] = storage.redact_options(self.storage_options)
        return values


class DpKpsConfig(ReleaseConfig):
    """DP-KPS (DESIGN.md, "DP-KPS, step by step"). Defaults chosen on public data; see docs/dpkps.md."""

    privacy_fields: ClassVar[tuple[str, ...]] = (
        "labels", "vocab", "vocab_top", "eps_voc", "eps_kde", "delta", "mechanism", "first_terms", "vocab_size",
        "method", "length", "n_features", "bandwidth", "embedding_model", "text_column", "label_column",
    )

    vocab: str = Field(default="english", description="'english' (wordfreq) or a file of terms, one per line")
    vocab_top: int | None = Field(default=50_000, ge=1, description="public frequency cut of the English list")
    eps_voc: float = Field(default=1.0, description="budget of the vocabulary histogram (Laplace)")
    eps_kde: float = Field(default=10.0, description="budget of the DP-KDE sketches")
    delta: float = Field(default=0.0, ge=0.0, lt=1.0, description="only for the Gaussian mechanism")
    mechanism: Literal["laplace", "gaussian"] = "laplace"
    first_terms: int = Field(default=10, ge=1, le=1000, description="S: terms per document counted in the histogram")
    vocab_size: int = Field(default=1000, ge=1, description="N: size of the privatized vocabulary")
    method: Literal["independent", "iterative-linear", "iterative-log"] = "independent"
    length: int = Field(default=10, ge=1, le=100, description="L: keyphrases per sequence")
    n_features: int = Field(default=300, ge=1, le=100_000, description="I: random Fourier features per sketch")
    bandwidth: float = Field(default=0.5, gt=0.0, description="h: kernel exp(-||x-y||^2 / h^2)")
    selection: Literal["proportional", "greedy", "top-k", "power"] | None = Field(
        default=None, description="how the next phrase is drawn from clipped scores (default depends on the method)"
    )
    top_k: int = Field(default=10, ge=1)
    power: float = Field(default=2.0, gt=0.0, description="G of the power rule: draw proportional to score^G")
    embedding_model: str = Field(default="minilm", description="'minilm' (offline package) or a local model folder")
    few_shot: str | None = Field(default=None, description="the recipient's few-shot examples (Parquet/JSONL)")
    dry_run: bool = False

    @field_validator("eps_voc", "eps_kde")
    @classmethod
    def _positive_epsilon(cls, value: float) -> float:
        if not value > 0:
            raise ValueError(f"epsilon must be > 0 (got {value}); epsilon = 0 would release nothing useful")
        if value != value or value == float("inf"):
            raise ValueError("epsilon must be a finite number")
        return value

    @model_validator(mode="after")
    def _gaussian_needs_delta(self) -> DpKpsConfig:
        if self.mechanism == "gaussian" and not self.delta > 0:
            raise ValueError("the Gaussian mechanism needs --delta > 0")
        return self


def _load_file(path: str) -> dict[str, Any]:
    file = Path(path)
    if not file.exists():
        raise ConfigError(f"config file {path} does not exist")
    text = file.read_text()
    try:
        if file.suffix == ".toml":
            return tomllib.loads(text)
        if file.suffix in (".yaml", ".yml"):
            return yaml.safe_load(text) or {}
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot parse config file {path}: {exc}") from exc
    raise ConfigError(f"config file {path} must be .toml, .yaml or .yml")


def _from_env(model: type[BaseModel]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        raw = os.environ.get(f"PRIVSEED_{name.upper()}")
        if raw is None:
            continue
        if field.annotation in (str, str | None) or name in ("data", "out"):
            values[name] = raw
        else:
            try:
                values[name] = json.loads(raw)
            except json.JSONDecodeError:
                values[name] = raw
    return values


def build_config(model: type[ReleaseConfig], flags: dict[str, Any], config_file: str | None = None) -> ReleaseConfig:
    """Merge file < environment < flags and validate. Raises ConfigError naming every bad field."""
    merged: dict[str, Any] = {}
    if config_file:
        merged.update(_load_file(config_file))
    merged.update(_from_env(model))
    merged.update({k: v for k, v in flags.items() if v is not None})
    return validate_config(model, merged)


def validate_config(model: type[ReleaseConfig], values: dict[str, Any]) -> ReleaseConfig:
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            where = ".".join(str(p) for p in error["loc"]) or "config"
            message = error["msg"].removeprefix("Value error, ")
            problems.append(f"--{where.replace('_', '-')}: {message}")
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None
