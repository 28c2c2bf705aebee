"""The option groups: each public setting that more than one command, or the code below the stages, reads is
declared here once, with one default, in the group of the concept it configures. The command models
(commands.py) compose these groups; the functions below ``tasks/stages/`` take a group (or plain numbers), never a
whole command configuration, so a setting's meaning and default live in one place.

A group is a pydantic mixin (:class:`OptionGroup`): its fields, validators and methods become the command's. Its
fields are listed in --help under the section of the command that composes it (``commands._group_title``), unless
the group names its own (``cli_group``: :class:`GenerationOptions`). tests/test_option_groups.py checks that every
command field comes from exactly one group or is the command's own, and that the command line, the deployment
schema and the groups agree. Everything here is public configuration (docs/privacy.md): no data, no secrets."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from privseed.tasks.config.fields import POSITIVE, cli, positive_epsilon
from privseed.tasks.generation.defaults import (NO_REPEAT_NGRAM_DEFAULT, REPEAT_PENALTY_DEFAULT, STEER_DEFAULT,
                                                STEER_END_COVERAGE_DEFAULT)
from privseed.tasks.llm.kinds import llm_help

if TYPE_CHECKING:
    from privseed.tasks.dp.mechanisms import NoiseSource

#: The public upper bound on the private corpus size behind the default delta 1/(n ln n) (7.2e-8)
DEFAULT_N_UPPER_BOUND = 1_000_000
#: The --help section of DP-KPS's generation options
GENERATION = "LLM generation from the released seeds"
#: --approval-timeout: a day by default; at least two polls of the paused run (tasks/stages/approval.py polls every
#: 5 s), at most 30 days.
APPROVAL_TIMEOUT_DEFAULT_S = 24 * 3600
APPROVAL_TIMEOUT_MIN_S = 10
APPROVAL_TIMEOUT_MAX_S = 30 * 24 * 3600


class OptionGroup(BaseModel):
    """A group of options declared once; composed by the command models, read by the code below the stages."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LLMOptions(OptionGroup):
    """Which LLM writes and how it is called (tasks/llm/, docs/generation.md); public settings only, never a key."""

    llm: str = Field(default="none", description="the LLM that writes documents from the seeds: " + llm_help(),
                     json_schema_extra=cli(metavar="SPEC"))
    temperature: float = Field(default=0.7, ge=0.0, le=2.0, description="LLM sampling temperature; when not given, "
                               "a histogram-method run whose corpus profile is released writes at 0.4 where its "
                               "classes' released terms are alike (docs/dpkps.md)")
    max_tokens: int = Field(default=256, ge=1, le=32_768, description="output tokens per LLM call at most; when not "
                            "given, a histogram-method run whose corpus profile is released writes answers as long "
                            "as the profile's median document (docs/dpkps.md), up to this")
    llm_concurrency: int = Field(default=4, ge=1, le=256, description="LLM calls in flight for remote APIs")
    llm_secret: str | None = Field(default=None, description="Prefect Secret block holding the API key",
                                   json_schema_extra=cli(metavar="BLOCK", default_text="the environment "
                                                         "(ANTHROPIC_API_KEY / OPENAI_API_KEY)"))

    @field_validator("llm")
    @classmethod
    def _known_llm(cls, value: str) -> str:
        """The one --llm grammar: privseed.tasks.llm.parse_llm_spec's (its ConfigError is this field's error)."""
        return llm_spec_text(value)


def llm_spec_text(value: str) -> str:
    """The one --llm grammar (privseed.tasks.llm.parse_llm_spec), normalised; its ConfigError is the field's error."""
    from privseed.tasks.llm import parse_llm_spec

    return str(parse_llm_spec(value))


class DocumentOptions(OptionGroup):
    """What a document is: the kind the prompts ask for, and the document test every written text passes
    (tasks/quality/, docs/generation.md)."""

    doc_type: str = Field(default="document", min_length=1, max_length=200,
                          description="what to write, e.g. 'Wikipedia article' (never a class name)",
                          json_schema_extra=cli(metavar="TEXT"))
    language: str | None = Field(default="en", description="the corpus's declared language for the document test: "
                                 "an ISO 639 code the language identifier knows (en, de, fr, es, ...), or none "
                                 "(no language test)")
    document_rules: dict[str, Any] = Field(
        default_factory=dict,
        description="set a threshold of the document test by name (docs/generation.md lists them), e.g. "
                    "max_seed_line_labels=4 for a corpus whose documents are forms (repeatable)",
        json_schema_extra=cli(flag="document-rule", metavar="NAME=VALUE"))

    @field_validator("language", mode="before")
    @classmethod
    def _known_language(cls, value: Any) -> str | None:
        from privseed.tasks.quality import LANGUAGES

        if value is None or str(value).lower() in ("none", ""):
            return None
        if str(value) not in LANGUAGES:
            raise ValueError(f"unknown language {value!r}; known: ISO 639 codes of the language identifier "
                             f"({', '.join(sorted(LANGUAGES))}) or none")
        return str(value)

    @field_validator("document_rules")
    @classmethod
    def _known_document_rules(cls, value: dict[str, Any]) -> dict[str, Any]:
        """Checked here, before any data is read: an unknown name or a bad value is a ConfigError that names it."""
        from privseed.tasks.quality import DEFAULT_RULES

        DEFAULT_RULES.with_settings(value)
        return value


class NoiseOptions(OptionGroup):
    """Where a release's randomness comes from (tasks/dp/mechanisms.py): the public seed, the opt-in reproducible
    noise of research grids, and the public bound on the corpus size behind a default delta."""

    seed: int = Field(default=0, ge=0, description="public randomness (features, sampling, LLM call seeds); the "
                      "noise never comes from it unless --insecure-reproducible-noise")
    insecure_reproducible_noise: bool = Field(
        default=False,
        description="research grids only: draw the noise from --seed so reruns are bit-identical; the release is "
                    "NOT differentially private (stamped so, and refused by the release gate unless "
                    "--allow-insecure-release)",
    )
    allow_insecure_release: bool = Field(
        default=False, description="publish a release made with --insecure-reproducible-noise anyway (stamped)")
    n_upper_bound: int = Field(default=DEFAULT_N_UPPER_BOUND, ge=3, description="a public upper bound on the "
                               "private corpus size, for the default delta 1/(n ln n)",
                               json_schema_extra=cli(metavar="NMAX"))

    def noise(self, *stream: str) -> NoiseSource:
        """The noise source of one stage: OpenDP's secure sampler, or (opted in with
        ``insecure_reproducible_noise``) a stream seeded by the public ``seed`` and the stage's name."""
        from privseed.tasks.dp.mechanisms import noise_source

        return noise_source(self.seed if self.insecure_reproducible_noise else None, *stream)


class StorageOptions(OptionGroup):
    """How the owner's stores are reached (fsspec; tasks/storage.py)."""

    storage_options: dict[str, Any] = Field(
        default_factory=dict,
        description="fsspec/s3fs option, e.g. endpoint_url=http://127.0.0.1:9000 (repeatable); a credential only "
                    "as KEY=prefect-secret:BLOCK (a literal key or secret is refused)",
        json_schema_extra=cli(flag="storage-option"))


class ClusterOptions(OptionGroup):
    """The Dask cluster a run computes on (tasks/data/cluster.py): a LocalCluster, or an external scheduler, with
    mutual TLS given as file paths (never the certificates themselves)."""

    dask_address: str | None = Field(default=None, description="an existing Dask scheduler, e.g. tcp://host:8786",
                                     json_schema_extra=cli(metavar="ADDRESS", default_text="a LocalCluster"))
    n_workers: int = Field(default=2, ge=1, le=256, description="workers of the LocalCluster",
                           json_schema_extra=cli(flag="workers"))
    dask_tls_ca_file: str | None = Field(default=None, description="CA certificate (PEM) that signed the Dask "
                                         "scheduler's and workers' certificates; with the two below, for a tls:// "
                                         "--dask-address", json_schema_extra=cli(metavar="FILE", default_text="no TLS"))
    dask_tls_cert: str | None = Field(default=None, description="this client's certificate (PEM) for the Dask "
                                      "scheduler, signed by --dask-tls-ca-file",
                                      json_schema_extra=cli(metavar="FILE", default_text="no TLS"))
    dask_tls_key: str | None = Field(default=None, description="the private key (PEM file) of --dask-tls-cert",
                                     json_schema_extra=cli(metavar="FILE", default_text="no TLS"))

    @model_validator(mode="after")
    def _tls_together(self) -> "ClusterOptions":
        # Checked here so a half-configured TLS setup fails before any data is read; that the files exist is
        # checked when the client connects (privseed.tasks.data.cluster.cluster_security), where they are read.
        paths = {"--dask-tls-ca-file": self.dask_tls_ca_file, "--dask-tls-cert": self.dask_tls_cert,
                 "--dask-tls-key": self.dask_tls_key}
        if any(paths.values()):
            missing = [flag for flag, path in paths.items() if not path]
            if missing:
                raise ValueError(f"TLS to the Dask scheduler needs {' and '.join(paths)} together; missing "
                                 f"{' and '.join(missing)}")
            if not (self.dask_address or "").startswith("tls://"):
                raise ValueError(f"{' and '.join(paths)} need a tls:// --dask-address (got {self.dask_address!r}); "
                                 "the LocalCluster privseed starts on 127.0.0.1 runs without TLS")
        return self


class ApprovalOptions(OptionGroup):
    """What a candidate release passes before it is published: the automatic release gate and, when asked, a
    person's approval (tasks/stages/approval.py, docs/operations.md)."""

    gate: bool = Field(default=True, description="run the release gate (Great Expectations) before publishing")
    require_approval: bool = Field(
        default=False, description="after the release gate, pause the run and publish only when a person approves in "
        "the Prefect UI (the report, the ledger and 20 sample rows are its artifacts); a rejection, or no answer "
        "within --approval-timeout, publishes nothing and keeps the candidate in the private state. Needs a Prefect "
        "server (PREFECT_API_URL)")
    approval_timeout: int = Field(
        default=APPROVAL_TIMEOUT_DEFAULT_S, ge=APPROVAL_TIMEOUT_MIN_S, le=APPROVAL_TIMEOUT_MAX_S,
        description="--require-approval: seconds the paused run waits for an answer; then nothing is published, the "
                    "candidate is kept in the private state and the run fails naming the --run-id that asks again "
                    "without charging again", json_schema_extra=cli(metavar="SECONDS", default_note="24 h"))


class VocabularyOptions(OptionGroup):
    """The privatized vocabulary V~ (tasks/seeds/vocabulary.py): the public list V it is drawn from, the
    histogram's budget and its size. DP-KPS's first stage; AugPE+V~'s prompt words."""

    vocab: str = Field(default="english", description="public vocabulary V: english (wordfreq) or a file of terms, "
                       "one per line", json_schema_extra=cli(metavar="english|FILE"))
    vocab_top: int | None = Field(default=50_000, ge=1, description="public frequency cut of the English list",
                                  json_schema_extra=cli(metavar="N"))
    eps_voc: float = Field(default=1.0, description="epsilon of the vocabulary histogram (Laplace)",
                           json_schema_extra={**cli(metavar="EPS"), **POSITIVE})
    first_terms: int = Field(default=10, ge=1, le=1000, description="S: terms per document counted in the histogram",
                             json_schema_extra=cli(metavar="S"))
    vocab_size: int = Field(default=1000, ge=1, description="N: size of the privatized vocabulary",
                            json_schema_extra=cli(metavar="N"))

    @field_validator("eps_voc")
    @classmethod
    def _positive_eps_voc(cls, value: float) -> float | None:
        return positive_epsilon(value)


class EmbeddingOptions(OptionGroup):
    """The sentence embeddings of the private documents (tasks/data/embedding.py)."""

    embedding_model: str = Field(default="minilm", description="minilm (offline package) or a local "
                                 "sentence-transformers folder", json_schema_extra=cli(metavar="MODEL"))


class GenerationOptions(OptionGroup):
    """How DP-KPS's seeds become documents (tasks/generation/, docs/generation.md): prompts, candidates, rounds
    and the local models' decoding. ``tasks.generation.params.GenerationParams`` is built from these (its
    defaults are the same constants, tasks/generation/defaults.py)."""

    cli_group: ClassVar[str] = GENERATION

    prompt_template: str = Field(default="generic", description="prompt template: generic (the paper's prompt), "
                                 "coverage, or a YAML file", json_schema_extra=cli(metavar="NAME"))
    best_of: int = Field(default=1, ge=1, le=16, description="candidates per seed, best by seed-term coverage")
    max_regenerations: int = Field(default=8, ge=0, le=20, description="rounds of regeneration (a new call seed) for "
                                   "a seed with no document among its candidates; still none: the row is dropped "
                                   "and counted in quality.json")
    max_rewrites: int = Field(default=2, ge=0, le=8, description="rounds of one more candidate for a seed whose "
                              "documents are all repetitive (a word crowding the text, a type-token ratio of 0.55 or "
                              "less) or gloss a seed as a label; the lowest-scoring is kept")
    rewrite_off_class: bool = Field(
        default=True, description="a document that reads as another class than its seed's (a naive Bayes of the "
        "released seeds) is worth a rewrite too (--max-rewrites), and documents that read as their class are kept "
        "first; --no-rewrite-off-class: judge the documents without the classes")
    avoid_other_classes: bool = Field(
        default=True, description="local models: decoding takes down the words that read as another class than the "
        "seed's (words another class's released seeds hold at least 3 times and 3 times as often; needs "
        "--rewrite-off-class's classes); --no-avoid-other-classes: off")
    prefer_own_class: bool = Field(
        default=True, description="local in-process models: decoding pushes, by half of --steer from the end of the "
        "answer's first sentence while the answer lacks them, the one-token words that read as the seed's own class "
        "(words its released seeds hold at least 3 times and twice as often as any other class's; needs "
        "--rewrite-off-class's classes); --no-prefer-own-class: off")
    steer: float = Field(default=STEER_DEFAULT, ge=0.0, le=50.0,
                         description="seed steering strength for local llama.cpp models (0: off)")
    steer_schedule: Literal["budget", "flat"] = Field(
        default="budget", description="seed steering schedule (local models): 'budget' pushes missing terms harder "
        "as the token budget runs out and holds the end while terms are missing; 'flat': a constant push")
    steer_end_coverage: float = Field(
        default=STEER_END_COVERAGE_DEFAULT, ge=0.0, le=1.0,
        description="'budget' schedule: the share of the seed terms written before the answer may end (1: all)",
        json_schema_extra=cli(metavar="SHARE"))
    repeat_penalty: float = Field(default=REPEAT_PENALTY_DEFAULT, gt=0.0, le=5.0,
                                  description="local models: llama.cpp repeat penalty (1: off)")
    no_repeat_ngram: int = Field(default=NO_REPEAT_NGRAM_DEFAULT, ge=0, le=64,
                                 description="local models: ban repeating a token n-gram of this length (0: off)")
    few_shot: str | None = Field(default=None, description="the recipient's few-shot examples (Parquet/JSONL: "
                                 "document + keyphrases)", json_schema_extra=cli(metavar="FILE"))
    examples: Literal["library", "none"] = Field(
        default="library", description="local models without --few-shot: each prompt shows the package's example "
        "documents of the kind --doc-type names (encyclopedia article, abstract, review, forum post, clinical note, "
        "support ticket, email, news article; tasks/demo_data/example_library.toml), and answers open with one of "
        "the kind's public openings where it has some (reviews, abstracts); none: no examples, no openings")
    class_names: str | None = Field(
        default=None,
        description="the owner's public class names: a JSON/TOML/CSV file mapping each declared label to a name; "
                    "each prompt then names its class (only when the names are public)",
        json_schema_extra=cli(metavar="FILE", default_text="none: no prompt names a class"))


#: Every option group, in the order --help and the docs list them
OPTION_GROUPS: tuple[type[OptionGroup], ...] = (LLMOptions, DocumentOptions, NoiseOptions, StorageOptions,
                                                ClusterOptions, ApprovalOptions, VocabularyOptions, EmbeddingOptions,
                                                GenerationOptions)
