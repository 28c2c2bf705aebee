"""One typed configuration per flow, validated up front with messages that name the problem.

Values come from, in increasing precedence: defaults, a TOML/YAML file (``--config``), environment
variables ``PRIVSEED_<FIELD>`` and command-line flags. Everything here is public (docs/privacy.md, "What is
released and what stays private"): the configuration is written into the manifest, so it must never hold
private data or secrets. The label set is part of it, declared by the operator, never read from the data.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tasks import storage
from tasks.errors import ConfigError
from tasks.mechanisms import NoiseSource, noise_source

LLM_BACKENDS = ("none", "local", "anthropic", "openai-compatible")
#: English frequency cut of the histogram methods when --vocab-top is not given (docs/dpkps.md)
HISTOGRAM_VOCAB_TOP = 20_000

LABELS_HELP = (
    "declare the public label set with --labels a,b,c, --labels-file FILE (one label per line, # comments), or "
    "`labels = [\"a\", \"b\"]` in the --config file (PRIVSEED_LABELS='[\"a\",\"b\"]' also works). privseed never "
    "reads it from the private data: a label only one document carries would become a released class")


def read_labels_file(path: str, storage_options: dict[str, Any] | None = None) -> list[str]:
    """One label per line; blank lines and ``#`` comments are skipped."""
    if not storage.exists(path, storage_options):
        raise ValueError(f"--labels-file {path} does not exist")
    text = storage.read_bytes(path, storage_options).decode("utf-8")
    return [line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip()]
#: Seed-steering strength by default for local models (chosen on public DBPedia-14 test-split seeds,
#: docs/generation.md "Seed steering"): 4 raised seed-term coverage from 37 % to 86 % with no degenerate answer.
STEER_DEFAULT = 4.0


class ReleaseConfig(BaseModel):
    """What every method that writes a synthetic release shares."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    #: fields that change the privatized values (documentation of what a resumed run must keep; run ids are random)
    privacy_fields: ClassVar[tuple[str, ...]] = ()

    data: str = Field(description="private corpus: Parquet file, folder or shard prefix (local, file://, s3://)")
    out: str = Field(description="release folder (local or s3://)")
    text_column: str = "text"
    label_column: str = "label"
    labels: list[str] | None = Field(
        default=None,
        description="the public label set, declared (required): --labels a,b,c, --labels-file FILE or `labels` in "
                    "the config file; never read from the private data",
    )
    labels_file: str | None = Field(default=None, description="a file with the label set, one label per line")
    per_class: int = Field(default=100, ge=1, le=1_000_000, description="synthetic documents per class (public)")
    llm: str = Field(default="none", description="none | local[:PATH] | anthropic[:MODEL] | openai-compatible:URL")
    doc_type: str = Field(default="document", min_length=1, max_length=200)
    seed: int = Field(default=0, ge=0)
    run_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.=-]+$",
                               description="resume this run (re-read its drawn values); default: a new random run id")
    state: str | None = Field(default=None, description="the owner's private state: identity key, drawn values, LLM "
                                                         "cache (default OUT.private beside OUT; never inside OUT)")
    storage_options: dict[str, Any] = Field(default_factory=dict)
    dask_address: str | None = Field(default=None, description="scheduler address; None starts a LocalCluster")
    n_workers: int = Field(default=2, ge=1, le=256)
    gate: bool = Field(default=True, description="run the Great Expectations release gate before publishing")
    insecure_reproducible_noise: bool = Field(
        default=False,
        description="research grids only: draw the noise from --seed so reruns are bit-identical; the release is "
                    "NOT differentially private (stamped so, and refused by the release gate unless "
                    "--allow-insecure-release)",
    )
    allow_insecure_release: bool = Field(
        default=False, description="publish a release made with --insecure-reproducible-noise anyway (stamped)")
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

    @model_validator(mode="before")
    @classmethod
    def _labels_from_file(cls, values: Any) -> Any:
        """``labels_file`` is read here, once, into ``labels``; the manifest then shows the labels themselves."""
        if not isinstance(values, dict):
            return values
        if not values.get("labels_file") and values.get("labels") is None and values.get("class_names"):
            # The owner's public class names file is configuration too: its labels are the declared set.
            from tasks.llm.released import load_class_names

            values = dict(values)
            values["labels"] = list(load_class_names(values["class_names"], values.get("storage_options")).labels)
            return values
        if not values.get("labels_file"):
            return values
        if values.get("labels") is not None:
            raise ValueError("give the label set once: --labels or --labels-file (or `labels` in the config file), "
                             "not both")
        values = dict(values)
        values["labels"] = read_labels_file(values.pop("labels_file"), values.get("storage_options"))
        values["labels_file"] = None
        return values

    @field_validator("labels", mode="before")
    @classmethod
    def _labels_as_text(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",")]
        if not isinstance(value, (list, tuple)):
            raise ValueError("labels must be a list, e.g. --labels a,b,c or labels = [\"a\", \"b\"] in the config file")
        labels = [str(v).strip() for v in value if str(v).strip()]
        if not labels:
            raise ValueError("the declared label set is empty; " + LABELS_HELP)
        duplicated = sorted({v for v in labels if labels.count(v) > 1})
        if duplicated:
            raise ValueError(f"the declared label set repeats {', '.join(duplicated)}; list every label once")
        return labels

    @model_validator(mode="after")
    def _declared(self) -> "ReleaseConfig":
        if self.labels is None:
            raise ValueError("no label set declared; " + LABELS_HELP)
        from tasks.identity import check_state_outside_release

        if self.state is not None:
            check_state_outside_release(self.out, self.state)
        return self
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

    def noise(self, *stream: str) -> NoiseSource:
        """The noise source of one stage: OpenDP's secure sampler, or (opted in with
        ``insecure_reproducible_noise``) a stream seeded by the public ``seed`` and the stage's name."""
        return noise_source(self.seed if self.insecure_reproducible_noise else None, *stream)

    @property
    def state_uri(self) -> str:
        """The owner's private state (tasks/identity.py): ``--state``, or ``OUT.private`` beside the release."""
        from tasks.identity import default_state_uri

        return self.state or default_state_uri(self.out)

    def public_dict(self) -> dict[str, Any]:
        """The configuration as written to manifests: storage secrets redacted."""
        values = self.model_dump()
        values["storage_options"] = storage.redact_options(self.storage_options)
        return values


class DpKpsConfig(ReleaseConfig):
    """DP-KPS (docs/dpkps.md, step by step). Defaults chosen on public data; see docs/dpkps.md."""

    privacy_fields: ClassVar[tuple[str, ...]] = (
        "labels", "vocab", "vocab_top", "eps_voc", "eps_kde", "delta", "mechanism", "first_terms", "vocab_size",
        "method", "length", "n_features", "bandwidth", "embedding_model", "text_column", "label_column",
        "epsilon", "hist_top_k", "markov_term_share", "hist_denoise", "hist_candidates", "markov_pair_top",
        "markov_pair_terms",
    )

    vocab: str = Field(default="english", description="'english' (wordfreq) or a file of terms, one per line")
    vocab_top: int | None = Field(default=50_000, ge=1, description="public frequency cut of the English list")
    eps_voc: float = Field(default=1.0, description="budget of the vocabulary histogram (Laplace)")
    eps_kde: float = Field(default=10.0, description="budget of the DP-KDE sketches")
    delta: float = Field(default=0.0, ge=0.0, lt=1.0, description="only for the Gaussian mechanism")
    mechanism: Literal["laplace", "gaussian"] = "laplace"
    first_terms: int = Field(default=10, ge=1, le=1000, description="S: terms per document counted in the histogram")
    vocab_size: int = Field(default=1000, ge=1, description="N: size of the privatized vocabulary")
    method: Literal["independent", "iterative-linear", "iterative-log", "histogram", "histogram-markov"] = "independent"
    # The histogram methods (tasks/histogram_seeds.py, privseed's own comparator; docs/dpkps.md) spend one budget.
    epsilon: float | None = Field(
        default=None, description="total budget of --method histogram / histogram-markov (default eps_voc + eps_kde)"
    )
    hist_top_k: int = Field(default=300, ge=1, le=1_000_000, description="K: noisy terms kept per class (histogram)")
    hist_denoise: Literal["clip", "fdr"] = Field(
        default="fdr",
        description="histogram methods: how released counts become term weights. fdr: q-values against pure noise "
                    "(candidate group / rest), weight = count x (1 - q), the noise share drawn from the pooled "
                    "classes; clip: the K largest clipped counts (docs/dpkps.md)",
    )
    hist_candidates: int = Field(
        default=1000, ge=1, le=10_000_000,
        description="M: terms with the largest noisy counts summed over classes form the candidate group (fdr)",
    )
    markov_pair_floor: float = Field(
        default=1.0, ge=0.0,
        description="histogram-markov: pair counts that pure noise reaches in about this many of a class's "
                    "P (P - 1) / 2 entries are sampled as 0 (0 = no floor)",
    )
    markov_term_share: float = Field(
        default=0.8, gt=0.0, lt=1.0, description="histogram-markov: share of epsilon for the term histogram stage"
    )
    markov_pair_top: int = Field(
        default=30, ge=2, le=2000,
        description="histogram-markov: P, each class's heaviest stage-1 terms among which pairs are counted",
    )
    markov_pair_terms: int = Field(
        default=2, ge=2, le=100,
        description="histogram-markov: S_2, a document's first distinct candidate terms whose pairs it adds "
                    "(sensitivity S_2 (S_2 - 1) / 2)",
    )
    markov_pair_weight: float = Field(
        default=0.5, ge=0.0, le=1.0,
        description="histogram-markov: probability that a step follows the released pairs of the current term",
    )
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
    class_names: str | None = Field(
        default=None,
        description="the owner's public class names: a JSON/TOML/CSV file mapping each declared label to a name; "
                    "the name goes into the prompt (without it no prompt names a class)")
    dry_run: bool = False

    @field_validator("eps_voc", "eps_kde", "epsilon")
    @classmethod
    def _positive_epsilon(cls, value: float | None) -> float | None:
        if value is None:
            return value
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

    @model_validator(mode="after")
    def _histogram_vocabulary_cut(self) -> DpKpsConfig:
        # The histogram methods noise every term of V for every class, so their default frequency cut is smaller
        # (chosen on public data, docs/dpkps.md); an explicit --vocab-top always wins.
        if self.method in ("histogram", "histogram-markov") and "vocab_top" not in self.model_fields_set:
            self.__dict__["vocab_top"] = HISTOGRAM_VOCAB_TOP  # no re-validation loop (validate_assignment)
        return self

    @property
    def histogram_epsilon(self) -> float:
        """The total budget of the histogram methods: --epsilon, else the DP-KPS total eps_voc + eps_kde."""
        return self.epsilon if self.epsilon is not None else self.eps_voc + self.eps_kde


class EvolutionConfig(ReleaseConfig):
    """What Aug-PE and SecPE share. ``per_class`` is the population size N kept per class each round."""

    llm: str = Field(default="local", description="PE needs an LLM: local[:PATH] | anthropic:MODEL | openai-compatible:URL")
    iterations: int = Field(default=5, ge=1, le=1000, description="T: voting rounds")
    variations: int = Field(default=2, ge=1, le=100, description="K: LLM variations of each kept sample per round")
    variation: Literal["paraphrase", "fill-blanks", "mixed"] = Field(
        default="mixed", description="VARIATION_API prompt; mixed alternates paraphrase and fill-in-the-blanks")
    mask_fraction: float = Field(default=0.3, ge=0.0, lt=1.0, description="fill-in-the-blanks: share of words blanked")
    max_tokens: int = Field(default=128, ge=8, le=8192)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    embedding_model: str = "minilm"
    llm_shards: int = Field(default=1, ge=1, le=1024,
                            description="split each round's LLM calls into this many Dask tasks (1: in-process)")
    llm_retries: int = Field(default=2, ge=0, le=10, description="Prefect retries of a failed batch of LLM calls")
    progress: bool = Field(default=True, description="progress bars of the LLM calls on stderr")
    dry_run: bool = Field(default=False, description="print the call plan and cost estimate; send and draw nothing")
    min_words: int = Field(default=5, ge=0, le=10_000,
                           description="candidates with fewer words (or with prompt residue) are not documents: they "
                                       "get no votes and are kept only when a class has too few others")

    @model_validator(mode="after")
    def _needs_llm(self) -> "EvolutionConfig":
        if self.llm.split(":", 1)[0] == "none":
            raise ValueError("private evolution needs an LLM (RANDOM_API / VARIATION_API); --llm none is DP-KPS only")
        return self


class AugPeConfig(EvolutionConfig):
    """Aug-PE (Xie et al. 2024) and AugPE+V~. See docs/baselines.md."""

    privacy_fields: ClassVar[tuple[str, ...]] = (
        "labels", "epsilon", "delta", "noise_multiplier", "n_upper_bound", "iterations", "per_class", "variations",
        "variation", "threshold", "selection", "vocab_words", "vocab", "vocab_top", "eps_voc", "first_terms",
        "vocab_size", "words_per_prompt", "embedding_model", "text_column", "label_column", "llm", "max_tokens",
        "temperature", "mask_fraction", "doc_type", "min_words",
    )

    epsilon: float | None = Field(default=None, description="DP budget of the T voting rounds (default 4.0)")
    delta: float | None = Field(default=None, description="default 1/(n ln n) with n = --n-upper-bound (public)")
    noise_multiplier: float | None = Field(default=None, gt=0.0, description="sigma; instead of --epsilon")
    n_upper_bound: int = Field(default=1_000_000, ge=3,
                               description="a public upper bound on the private corpus size, for the default delta")
    threshold: float = Field(default=0.0, description="H: noisy counts below H are dropped")
    selection: Literal["rank", "sample"] = "rank"
    vocab_words: bool = Field(default=False, description="AugPE+V~: random words of DP-KPS's released vocabulary")
    words_per_prompt: int = Field(default=5, ge=1, le=100)
    vocab: str = "english"
    vocab_top: int | None = 50_000
    eps_voc: float = Field(default=1.0, gt=0.0)
    first_terms: int = Field(default=10, ge=1)
    vocab_size: int = Field(default=1000, ge=1)

    @model_validator(mode="after")
    def _budget(self) -> "AugPeConfig":
        if self.epsilon is not None and self.noise_multiplier is not None:
            raise ValueError("give --epsilon or --noise-multiplier, not both")
        if self.epsilon is not None and not (self.epsilon > 0 and self.epsilon < float("inf")):
            raise ValueError(f"epsilon must be a positive finite number, got {self.epsilon}")
        if self.delta is not None and not 0.0 < self.delta < 1.0:
            raise ValueError(f"delta must lie in (0, 1), got {self.delta}")
        return self


class SecPeConfig(EvolutionConfig):
    """SecPE (Wang et al.): (p, r)-secret protection with secret clustering. See docs/baselines.md."""

    privacy_fields: ClassVar[tuple[str, ...]] = (
        "labels", "public", "p", "r_over_p", "clusters", "secrets", "secret_quantile", "secret_count", "radius",
        "secret_vocab_top",
        "rho_norm", "noise_multiplier", "delta", "n_upper_bound", "iterations", "per_class", "variations",
        "variation", "embedding_model", "text_column", "label_column", "public_text_column", "llm", "max_tokens",
        "temperature", "mask_fraction", "doc_type", "value_discretization", "min_words",
    )

    public: str = Field(description="a public corpus of the same domain (Parquet; only its text column is read)")
    public_text_column: str = "text"
    p: float = Field(default=1e-4, gt=0.0, lt=1.0, description="the adversary's prior success probability")
    r_over_p: float = Field(default=10.0, gt=1.0, description="r / p; r is the bound on reconstruction success")
    clusters: int = Field(default=50, ge=1, description="K: public k-means clusters")
    secrets: str = Field(default="words", description="words | pii | FILE (one secret term per line)")
    secret_quantile: float = Field(default=0.5, ge=0.0, le=1.0,
                                   description="words: secrets sit around this rank quantile of the public word list")
    secret_count: int = Field(default=200, ge=1, description="words: how many secret words")
    secret_vocab_top: int = Field(default=50_000, ge=10, description="words: size of the public word list (wordfreq)")
    radius: float = Field(default=1.0, gt=0.0, description="R: clipping radius of embeddings (unit vectors: 1)")
    rho_norm: Literal["max", "paper"] = "max"
    noise_multiplier: float | None = Field(default=None, gt=0.0,
                                           description="fix sigma publicly instead of calibrating it on the secrets")
    delta: float | None = Field(default=None, description="delta of the reported DP epsilon (default 1/(n ln n))")
    n_upper_bound: int = Field(default=1_000_000, ge=3)
    value_discretization: float = Field(default=1e-2, gt=0.0, le=0.1)


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
            where = ".".join(str(p) for p in error["loc"])
            message = error["msg"].removeprefix("Value error, ")
            problems.append(f"--{where.replace('_', '-')}: {message}" if where else message)
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None
