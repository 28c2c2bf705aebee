"""One typed configuration model per command, validated up front with messages that name the problem.

Values come from, in increasing precedence: defaults, a TOML/YAML file (``--config``; ``privseed experiment``
keeps that flag for its experiment file), environment variables ``PRIVSEED_<FIELD>`` and command-line flags.
Everything here is public (docs/privacy.md, "What is released and what stays private"): the configuration is
written into the manifest, so it must never hold private data or secrets. The label set is part of it, declared
by the operator, never read from the data.

The models are also the command line: every field knows its flag (its name with dashes, or ``flag`` in its
metadata, :func:`cli`), its help and its default, and :func:`add_config_arguments` turns a model into argparse
arguments whose help shows the model's real default. A bad value is reported under the flag a user types
(:func:`flag_of`), whether it came from the command line, a config file or a deployment's dict.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import tomllib
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

from privseed.tasks.dp.accounting import default_delta
from privseed.tasks.dp.mechanisms import DELTA_MECHANISMS, MECHANISM_KINDS, mechanism_kind
from privseed.tasks.errors import ConfigError
from privseed.tasks.config.fields import POSITIVE, cli, positive_epsilon
from privseed.tasks.config.options import (DEFAULT_N_UPPER_BOUND, ApprovalOptions, ClusterOptions,
                                           DocumentOptions, EmbeddingOptions, GenerationOptions, LLMOptions,
                                           NoiseOptions, StorageOptions, VocabularyOptions, llm_spec_text)
from privseed.tasks.llm.kinds import llm_help
from privseed.tasks.seeds.seed_methods import (CONTRIBUTIONS, DPKPS_SAMPLERS, HISTOGRAM_METHODS, METHOD_OPTIONS,
                                               PAPER_LENGTH, SEED_METHOD_NAMES, SEED_METHODS, methods_reading)

# Imported by the command line to build --help: this module imports pydantic and nothing heavy (numpy, fsspec and
# YAML are imported where they are used), so `privseed --help` answers at once.

#: Aug-PE's budget of the voting rounds when neither --epsilon nor --noise-multiplier is given (docs/baselines.md)
AUGPE_DEFAULT_EPSILON = 4.0

LABELS_HELP = (
    "declare the public label set with --labels a,b,c, --labels-file FILE (one label per line, # comments), or "
    "`labels = [\"a\", \"b\"]` in the --config file (PRIVSEED_LABELS='[\"a\",\"b\"]' also works). privseed never "
    "reads it from the private data: a label only one document carries would become a released class")


def read_labels_file(path: str, storage_options: dict[str, Any] | None = None) -> list[str]:
    """One label per line; blank lines and ``#`` comments are skipped."""
    from privseed.tasks import storage

    if not storage.exists(path, storage_options):
        raise ValueError(f"--labels-file {path} does not exist")
    text = storage.read_bytes(path, storage_options).decode("utf-8")
    return [line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip()]


# ---------------------------------------------------------------------------------------------------------
# Command-line metadata of a field
# ---------------------------------------------------------------------------------------------------------
def _meta(field: FieldInfo) -> dict[str, Any]:
    return field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}


def _dashed(name: str) -> str:
    return name.replace("_", "-")


def flag_of(model: type[BaseModel], name: str) -> str:
    """The flag a user types for field ``name`` (``--features`` for ``n_features``, ``DATA`` for the positional
    corpus); a name that is no field (an unknown key of a config dict) is shown as the flag it would be."""
    field = model.model_fields.get(name)
    meta = _meta(field) if field is not None else {}
    if meta.get("positional"):
        return name.upper()
    return "--" + meta.get("flag", _dashed(name))


def _named_flags(model: type[BaseModel], name: str) -> list[str]:
    meta = _meta(model.model_fields[name])
    return [] if meta.get("positional") else [flag_of(model, name), *("--" + a for a in meta.get("aliases", ()))]


def flags_of(model: type[BaseModel], name: str) -> list[str]:
    """Every flag of field ``name`` as --help lists them: the flag, its aliases, and ``--no-x`` for a boolean ``--x``
    (a positional field has none)."""
    flags = _named_flags(model, name)
    if value_type(model.model_fields[name].annotation) is bool:
        return [variant for flag in flags for variant in (flag, "--no-" + flag[2:])]
    return flags


def render_value(value: Any) -> str:
    """A value as --help shows it: on/off, 0.0001, a,b, none."""
    if value is None or value == {} or value == []:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def default_text(model: type[BaseModel], name: str) -> str:
    """The default of field ``name`` as --help shows it: the model's own default (``default_note`` appended), or,
    for an unset field, what unset means (``default_text``); "required" when there is none."""
    field = model.model_fields[name]
    if field.is_required():
        return "required"
    default = field.get_default(call_default_factory=True)
    meta = _meta(field)
    if default is None:
        return meta.get("default_text", "none")
    return render_value(default) + (f"; {meta['default_note']}" if "default_note" in meta else "")


def requirement(model: type[BaseModel], name: str) -> str | None:
    """How a run needs field ``name``, as --help says it: "required" (no default, or a None default that a run
    refuses: ``default_text="required"``), "required: --a or --b" for alternatives (``either``), None when
    the field is optional."""
    meta = _meta(model.model_fields[name])
    if "either" in meta:
        alternatives = [flag_of(model, other) for other, field in model.model_fields.items()
                        if _meta(field).get("either") == meta["either"]]
        return "required: " + " or ".join(alternatives)
    return "required" if default_text(model, name) == "required" else None


def help_of(model: type[BaseModel], name: str) -> str:
    """The --help line of field ``name``: its description, then its true default (or how it is required)."""
    need = requirement(model, name)
    suffix = f"({need})" if need else f"(default: {default_text(model, name)})"
    description = model.model_fields[name].description
    return f"{description} {suffix}" if description else suffix


# ---------------------------------------------------------------------------------------------------------
# The command line, generated from a model
# ---------------------------------------------------------------------------------------------------------
def value_type(annotation: Any) -> Any:
    """``X`` of ``X | None``; anything else as it is."""
    if get_origin(annotation) in (Union, types.UnionType):
        kinds = [a for a in get_args(annotation) if a is not type(None)]
        if len(kinds) == 1:
            return kinds[0]
    return annotation


def _lenient(kind: type) -> Any:
    """argparse type: ``kind(raw)``, or the raw text when that fails, so the model refuses it with a message that
    names the flag (one error path for the command line, config files and deployments alike)."""
    def convert(raw: str) -> Any:
        try:
            return kind(raw)
        except ValueError:
            return raw

    convert.__name__ = kind.__name__
    return convert


def comma_list(raw: str) -> list[str]:
    """``--labels a,b,c`` -> ["a", "b", "c"] (blank items dropped)."""
    return [item.strip() for item in raw.split(",") if item.strip()]


#: The --help section of what a run needs (listed first; the usage line shows these alone, without brackets)
REQUIRED_GROUP = "required"


def _group_title(model: type[BaseModel], name: str) -> str:
    """The --help section of a field: "required" for what a run needs, else its ``group``, else the ``cli_group``
    of the first class of the hierarchy that declares it; a field of an option group without a ``cli_group``
    (tasks/config/options.py) is listed with the first command class that composes the group."""
    if requirement(model, name):
        return REQUIRED_GROUP
    if "group" in _meta(model.model_fields[name]):
        return _meta(model.model_fields[name])["group"]
    classes = list(reversed(model.__mro__))
    for cls in classes:
        if name in vars(cls).get("__annotations__", {}):
            composers = [c for c in classes if issubclass(c, cls) and "cli_group" in vars(c)]
            if composers:
                return vars(composers[0])["cli_group"]
    return "options"


def usage_of(parts: Iterable[tuple[str, str | None]]) -> str:
    """The usage line of a command from its required arguments, each ``(text, either)`` in field order: the
    alternatives that share an ``either`` key become one ``(--a A | --b B)``; every other option is ``[options]``."""
    words: list[str] = []
    alternatives: dict[str, list[str]] = {}
    for text, either in parts:
        if either is None:
            words.append(text)
        elif either in alternatives:
            alternatives[either].append(text)
        else:
            alternatives[either] = [text]
            words.append(either)
    shown = [f"({' | '.join(alternatives[w])})" if w in alternatives else w for w in words]
    return " ".join(["%(prog)s", *shown, "[options]"])


def add_config_arguments(parser: argparse.ArgumentParser, model: type[BaseModel],
                         exclude: Iterable[str] = ()) -> None:
    """One argument per field of ``model`` (and ``--config FILE``): types from the annotations, choices from a
    Literal, booleans as ``--x/--no-x``, lists as ``a,b,c``, a dict as repeatable ``KEY=VALUE``, the help ending in
    the model's true default. Every argparse default is None: an absent flag leaves the config file, the
    environment and the model's default in charge (:func:`build_config`); values are checked by the model.
    ``--config`` is left to a field that claims it (the experiment file of ``privseed experiment``).

    What a run needs (:func:`requirement`) is listed first, in a "required" section, and the usage line names
    only those (``privseed dpkps DATA --out OUT (--labels A,B,... | --labels-file FILE) [options]``). argparse
    itself does not enforce them (``required=True``), since a --config file or a PRIVSEED_<FIELD> variable may
    give them; the model refuses a run without them, naming the flag."""
    if not any(flag_of(model, name) == "--config" for name in model.model_fields):
        parser.add_argument("--config", dest="config_file", metavar="FILE",
                            help="TOML or YAML file with values for these options, by field name (PRIVSEED_<FIELD> "
                                 "environment variables override it, flags override both)")
    names = [name for name in model.model_fields if name not in exclude]
    needed = [name for name in names if requirement(model, name)]
    groups: dict[str, Any] = {REQUIRED_GROUP: parser.add_argument_group(REQUIRED_GROUP)} if needed else {}
    usage: list[tuple[str, str | None]] = []
    for name in [*needed, *(name for name in names if name not in needed)]:
        field = model.model_fields[name]
        meta = _meta(field)
        kind = value_type(field.annotation)
        help_text = help_of(model, name).replace("%", "%%")
        title = _group_title(model, name)
        group = groups.get(title) or groups.setdefault(title, parser.add_argument_group(title))
        if meta.get("positional"):
            group.add_argument(name, metavar=flag_of(model, name), help=help_text)
            usage.append((flag_of(model, name), None))
            continue
        kwargs: dict[str, Any] = {"dest": name, "default": None, "help": help_text}
        metavar = meta.get("metavar", {int: "N", float: "X"}.get(kind, flag_of(model, name).lstrip("-").upper()))
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif get_origin(kind) is Literal:
            kwargs["metavar"] = "{" + ",".join(map(str, get_args(kind))) + "}"
        elif kind in (int, float):
            kwargs.update(type=_lenient(kind), metavar=metavar)
        elif get_origin(kind) is list:
            kwargs.update(type=comma_list, metavar=meta.get("metavar", "A,B,..."))
        elif get_origin(kind) is dict:
            kwargs.update(action="append", metavar=meta.get("metavar", "KEY=VALUE"))
        else:
            kwargs["metavar"] = metavar
        group.add_argument(*_named_flags(model, name), **kwargs)
        if name in needed:
            usage.append((" ".join(filter(None, (flag_of(model, name), kwargs.get("metavar")))), meta.get("either")))
    parser.usage = usage_of(usage)


def flags_from_args(model: type[BaseModel], args: argparse.Namespace) -> dict[str, Any]:
    """The fields of ``model`` the user gave on the command line. ``KEY=VALUE`` pairs become a dict; storage
    options holding a literal credential are refused (flow parameters are stored by the Prefect server)."""
    from privseed.tasks import storage

    values: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        value = getattr(args, name, None)
        if value is None:
            continue
        if get_origin(value_type(field.annotation)) is dict:
            value = storage.parse_storage_options(value, flag_of(model, name))
            if name == "storage_options":
                storage.refuse_literal_secrets(value)
        values[name] = value
    return values


#: A configuration model (a command's)
Config = TypeVar("Config", bound=BaseModel)


def config_from_args(model: type[Config], args: argparse.Namespace) -> Config:
    """flags > PRIVSEED_* environment > ``--config FILE`` > defaults, validated (:func:`build_config`)."""
    return build_config(model, flags_from_args(model, args), getattr(args, "config_file", None))


# ---------------------------------------------------------------------------------------------------------
# Options that only some runs read
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OptionScope:
    """Options of a command that only some of its runs read (``--epsilon``: the histogram methods; ``--top-k``:
    ``--selection top-k``), as data on the model (``option_scopes``). ``reads(cfg, field)`` says whether the run
    ``cfg`` reads the field; when it does not and the user set it, the configuration is refused with
    ``refusal(cfg, field)``, one line naming what the run reads instead: an option that changes nothing is a
    mistake the owner must hear of, above all a budget (an ignored ``--epsilon 5`` published at epsilon 11)."""

    fields: frozenset[str]
    #: (configuration, field name) -> whether the run reads the field
    reads: Callable[[Any, str], bool]
    #: (configuration, field name) -> the one line that refuses it
    refusal: Callable[[Any, str], str]


def unread_option(cfg: BaseModel) -> str | None:
    """The refusal of the first option ``cfg``'s run does not read although the user set it (a flag, the
    --config file, a PRIVSEED_* variable, a deployment's or a caller's dict), or None. A value equal to the
    default is no choice (a deployment's form sends every field; a default is never "set")."""
    model = type(cfg)
    order = list(model.model_fields)
    for scope in getattr(model, "option_scopes", ()):
        for name in sorted(scope.fields & cfg.model_fields_set, key=order.index):
            if getattr(cfg, name) == model.model_fields[name].get_default(call_default_factory=True):
                continue
            if not scope.reads(cfg, name):
                return scope.refusal(cfg, name)
    return None


def _method_reads(cfg: Any, name: str) -> bool:
    return name in SEED_METHODS[cfg.method].options


def _listed(items: Iterable[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    items = list(items)
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def _method_refusal(cfg: Any, name: str) -> str:
    flag, users = flag_of(type(cfg), name), methods_reading(name)
    choice = "that method" if len(users) == 1 else "one of those"
    return (f"{flag} applies to --method {_listed(users)} only; --method {cfg.method} spends "
            f"{SEED_METHODS[cfg.method].budget}: drop {flag}, or choose {choice}")


#: The parameters of a --selection rule, by field, with the rule they belong to.
SELECTION_PARAMETERS: dict[str, str] = {"top_k": "top-k", "power": "power"}


def _selection_reads(cfg: Any, name: str) -> bool:
    return cfg.selection == SELECTION_PARAMETERS[name]


def _selection_refusal(cfg: Any, name: str) -> str:
    flag, rule = flag_of(type(cfg), name), SELECTION_PARAMETERS[name]
    chosen = (f"--selection {cfg.selection}" if cfg.selection is not None
              else f"--method {cfg.method}'s own rule, {SEED_METHODS[cfg.method].default_selection}")
    return (f"{flag} is a parameter of --selection {rule}, and this run draws with {chosen}: add --selection {rule} "
            f"or drop {flag}")


def _delta_reads(cfg: Any, name: str) -> bool:
    return cfg.mechanism in DELTA_MECHANISMS or cfg.delta == 0.0  # a zero delta spends nothing to refuse


def _delta_refusal(cfg: Any, name: str) -> str:
    flag = flag_of(type(cfg), name)
    return (f"{flag} applies to --mechanism {_listed(DELTA_MECHANISMS)} only; --mechanism {cfg.mechanism} is "
            f"pure epsilon-DP: drop {flag}, or choose one of those mechanisms")


# ---------------------------------------------------------------------------------------------------------
# The models
# ---------------------------------------------------------------------------------------------------------
#: Fields that locate the owner's data and machines: never written to a manifest (``public_dict``).
OWNER_PATH_FIELDS = frozenset({"data", "out", "state", "labels_file", "public", "dask_address", "dask_tls_ca_file",
                               "dask_tls_cert", "dask_tls_key"})


def _is_owner_path(value: str) -> bool:
    """An absolute local path or a URI of a store (not an LLM spec such as ``openai-compatible:http://...``)."""
    return value.startswith(("/", "~", "file://", "s3://", "gs://", "az://", "abfs://"))


def evaluation_folder(release: str) -> str:
    """Where ``privseed evaluate`` writes by default: ``OUT.evaluation`` beside the release, never inside it."""
    from privseed.tasks import storage

    base = release.rstrip("/")
    if storage.is_remote(base) and "/" not in base.split("://", 1)[1]:
        raise ConfigError(f"the release {release} is a bucket root: give --report (and --json) outside it")
    return base + ".evaluation"


APPROVAL_SCOPE = OptionScope(
    frozenset({"approval_timeout"}), lambda cfg, _: cfg.require_approval,
    lambda cfg, _: "--approval-timeout applies to a run that waits for a person only: add --require-approval, or "
                   "drop --approval-timeout")


#: Seed sequences per class of a release no LLM writes (an unset --per-class with --llm none, dpkps's default).
#: They are post-processing of the released histograms, so more cost nothing: a classifier trained on them gains
#: 1.1-6.8 points from 100 to 500 a class and changes by -1.6 to +1.2 from 500 to 1,000 or 2,000 (seven public
#: validation sets at epsilon 11, three seeds; experiments/results/dpkps.md, "Sequences a class when no LLM writes").
SEEDS_ONLY_PER_CLASS = 500
#: Documents per class when an LLM writes them (an unset --per-class with any other --llm): each is a call.
DOCUMENTS_PER_CLASS = 100


class ReleaseConfig(ApprovalOptions, ClusterOptions, StorageOptions, NoiseOptions, DocumentOptions, LLMOptions):
    """What every method that writes a synthetic release shares: the corpus, the release folder, the run and the
    option groups (tasks/config/options.py; fields come in the reverse order of the bases)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    cli_group: ClassVar[str] = "options of every release"
    #: fields that change the privatized values (documentation of what a resumed run must keep; run ids are random)
    privacy_fields: ClassVar[tuple[str, ...]] = ()
    #: options only some runs read (:class:`OptionScope`); one set for a run that does not read it is refused
    option_scopes: ClassVar[tuple[OptionScope, ...]] = (APPROVAL_SCOPE,)
    #: whether --out is a release folder for a recipient (refused inside the private corpus and when it holds
    #: foreign files) and the run spends budget in a private state (refused beside an unfinished run)
    writes_release: ClassVar[bool] = True

    data: str = Field(description="private corpus: a Parquet, CSV or JSON Lines file, a folder or a shard prefix "
                      "(local, file://, s3://)",
                      json_schema_extra=cli(positional=True))
    out: str = Field(description="release folder (local or s3://)", json_schema_extra=cli(metavar="OUT"))
    text_column: str = Field(default="text", description="column of the private corpus that holds the text",
                             json_schema_extra=cli(metavar="COLUMN"))
    label_column: str = Field(default="label", description="column of the private corpus that holds the label",
                              json_schema_extra=cli(metavar="COLUMN"))
    labels: list[str] | None = Field(
        default=None,
        description="the public label set, comma separated (or `labels` in the --config file); never read from the "
                    "private data",
        json_schema_extra=cli(metavar="A,B,...", either="labels"),
    )
    labels_file: str | None = Field(default=None, description="a file with the label set, one label per line "
                                    "(# comments)", json_schema_extra=cli(metavar="FILE", either="labels"))
    per_class: int = Field(default=SEEDS_ONLY_PER_CLASS, ge=1, le=1_000_000,
                           description="synthetic documents per class (public)",
                           json_schema_extra=cli(default_note=f"{DOCUMENTS_PER_CLASS} when an LLM writes them"))
    run_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.=-]+$",
                               description="resume this run: re-read its drawn values, charge nothing again",
                               json_schema_extra=cli(metavar="ID", default_text="a new random run id"))
    new_run: bool = Field(default=False, description="start a new run, which charges the budget again, although "
                          "the private state holds a run that drew values and did not publish (without it such a "
                          "state is refused, naming the run to resume with --run-id)")
    state: str | None = Field(default=None, description="the owner's private state: identity key, drawn values, "
                              "LLM cache (never inside OUT, never shared)",
                              json_schema_extra=cli(metavar="DIR", default_text="OUT.private beside OUT"))

    @model_validator(mode="before")
    @classmethod
    def _labels_from_file(cls, values: Any) -> Any:
        """``labels_file`` is read here, once, into ``labels``; the manifest then shows the labels themselves."""
        if not isinstance(values, dict):
            return values
        if not values.get("labels_file") and values.get("labels") is None and values.get("class_names"):
            # The owner's public class names file is configuration too: its labels are the declared set.
            from privseed.tasks.llm.released import load_class_names

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
            value = comma_list(value) or [""]
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
        from privseed.tasks.dp.identity import check_outside_private_corpus, check_state_outside_release

        if self.state is not None:
            check_state_outside_release(self.out, self.state)
        if self.writes_release:
            check_outside_private_corpus(self.data, self.out, self.state)
        return self

    @model_validator(mode="after")
    def _only_options_the_run_reads(self) -> "ReleaseConfig":
        refusal = unread_option(self)
        if refusal is not None:
            raise ValueError(refusal)
        if self.new_run and self.run_id is not None:
            raise ValueError(f"give --run-id {self.run_id} to resume that run or --new-run to start one, not both")
        return self

    @property
    def charges(self) -> bool:
        """Whether the run may draw and charge (a dry run, SecPE's --advise-sigma do not)."""
        return True

    @property
    def state_uri(self) -> str:
        """The owner's private state (tasks/dp/identity.py): ``--state``, or ``OUT.private`` beside the release."""
        from privseed.tasks.dp.identity import default_state_uri

        return self.state or default_state_uri(self.out)

    def public_dict(self) -> dict[str, Any]:
        """The configuration as written to manifests: storage secrets redacted, and no paths of the owner's (the
        corpus, the release folder, the private state, the Dask scheduler and its TLS files; any other value
        that is an absolute path or a URI keeps its last component only, e.g. a vocabulary or secrets file).
        Where the owner keeps things says nothing the recipient needs, and may say more than the owner means to
        (a user name, a bucket, a host)."""
        from privseed.tasks import storage

        values = self.model_dump()
        values["storage_options"] = storage.redact_options(self.storage_options)
        for name in OWNER_PATH_FIELDS & set(values):
            values[name] = None
        for name, value in values.items():
            if isinstance(value, str) and _is_owner_path(value):
                values[name] = value.rstrip("/").rsplit("/", 1)[-1]
        return values


class DpKpsConfig(GenerationOptions, EmbeddingOptions, VocabularyOptions, ReleaseConfig):
    """DP-KPS (docs/dpkps.md, step by step). Defaults chosen on public data; see docs/dpkps.md."""

    cli_group: ClassVar[str] = "DP-KPS and the histogram methods"
    option_scopes: ClassVar[tuple[OptionScope, ...]] = (
        *ReleaseConfig.option_scopes,
        OptionScope(METHOD_OPTIONS, _method_reads, _method_refusal),  # the seed-method registry says who reads what
        OptionScope(frozenset(SELECTION_PARAMETERS), _selection_reads, _selection_refusal),
        OptionScope(frozenset({"delta"}), _delta_reads, _delta_refusal),
    )
    privacy_fields: ClassVar[tuple[str, ...]] = (
        "labels", "vocab", "vocab_top", "eps_voc", "eps_kde", "delta", "mechanism", "first_terms", "vocab_size",
        "method", "length", "n_features", "bandwidth", "embedding_model", "text_column", "label_column",
        "epsilon", "hist_top_k", "markov_term_share", "hist_denoise", "hist_candidates", "markov_pair_top",
        "markov_pair_terms", "hist_contribution", "n_upper_bound",
    )

    eps_kde: float = Field(default=10.0, description="epsilon of the DP-KDE sketches",
                           json_schema_extra={**cli(metavar="EPS"), **POSITIVE})
    delta: float = Field(default=default_delta(DEFAULT_N_UPPER_BOUND), ge=0.0, lt=1.0,
                         description=f"delta, for --mechanism {' and '.join(DELTA_MECHANISMS)} only",
                         json_schema_extra=cli(default_note="1/(n ln n) with n = --n-upper-bound"))
    mechanism: Literal[tuple(MECHANISM_KINDS)] = Field(  # type: ignore[valid-type]
        default="gaussian", description="noise of the sketches and of the histogram methods; laplace-threshold "
        "(histogram methods only, needs a delta): noise only on the terms that occur, released above a threshold",
        json_schema_extra=cli(default_note=f"laplace for the paper's samplers (--method {', '.join(DPKPS_SAMPLERS)})"))
    # The choices are the seed-method registry's names (tasks/seeds/seed_methods.py); a Literal of a tuple is dynamic.
    method: Literal[SEED_METHOD_NAMES] = Field(  # type: ignore[valid-type]
        default="histogram",
        description="privseed's per-class DP term histograms (68-95 % on two corpora nobody tuned on, where the "
        "paper's independent sampler reached 28-87 %), or one of the paper's DP-KPS samplers (docs/dpkps.md)")
    # The histogram methods (tasks/seeds/histogram_seeds.py, privseed's own comparator; docs/dpkps.md) spend one budget.
    epsilon: float | None = Field(default=None, description=f"total budget of --method {' / '.join(HISTOGRAM_METHODS)}",
                                  json_schema_extra={**cli(metavar="EPS", default_text="--eps-voc + --eps-kde"),
                                                     **POSITIVE})
    hist_top_k: Annotated[int, Field(ge=1, le=1_000_000)] | Literal["auto"] = Field(
        default="auto", description="K: noisy terms kept per class by the histogram methods; auto: from the corpus "
        "profile (300 for short documents, 1,000 for long ones; docs/dpkps.md, 'Defaults that adapt to the corpus')",
        json_schema_extra=cli(metavar="K|auto"))
    hist_denoise: Literal["clip", "fdr"] = Field(
        default="fdr",
        description="histogram methods: how released counts become term weights. fdr: q-values against pure noise "
                    "(candidate group / rest), weight = count x (1 - q), the noise share drawn from the pooled "
                    "classes; clip: the K largest clipped counts (docs/dpkps.md)",
        json_schema_extra=cli(metavar="RULE"))
    # The choices are the contribution registry's names (tasks/seeds/seed_methods.py CONTRIBUTIONS), as for --method.
    hist_contribution: Literal[(*CONTRIBUTIONS, "auto")] = Field(  # type: ignore[valid-type]
        default="auto",
        description="histogram methods: how a document enters its class's term histogram. "
                    + "; ".join(f"{kind.name}: {kind.help_text}" for kind in CONTRIBUTIONS.values())
                    + f" (a whole-document kind, {', '.join(n for n, k in CONTRIBUTIONS.items() if k.whole_document)}, "
                    "needs --mechanism gaussian and a delta); auto: the kind the corpus profile's rule picks from the "
                    "released median length (unit-l2 for a few terms, slow-rank-l2 for short documents, rank-l2 "
                    "for long ones: docs/dpkps.md)",
        json_schema_extra=cli(metavar="HOW", default_note="first-terms with --mechanism laplace or laplace-threshold"))
    hist_candidates: int = Field(
        default=500, ge=1, le=10_000_000,
        description="M: terms with the largest noisy counts summed over classes form the candidate group of "
                    "--hist-denoise fdr", json_schema_extra=cli(metavar="M"))
    hist_background_cap: float = Field(
        default=0.3, ge=0.0, le=1.0,
        description="histogram methods (--hist-denoise fdr): at most this share of a class's draws comes from the "
                    "weights pooled over the classes (the share its q-values give to noise); lower: a class whose "
                    "list is mostly noise keeps more of its own terms and pulls fewer generic documents, more "
                    "accuracy, less recall on small classes (0.3 against 1, no cap: +2.9 points on OHSUMED-23, "
                    "balanced accuracy -1.2, and no set lower by more than 0.2; docs/dpkps.md)",
        json_schema_extra=cli(metavar="SHARE"))
    hist_seed_pool: Annotated[int, Field(ge=1, le=1_000_000)] | Literal["auto"] = Field(
        default="auto",
        description="histogram methods: sequences sampled a class from the released histograms, of which the "
                    "--per-class that read most as their class (the pool's own naive Bayes) are kept; "
                    "post-processing, no budget; a pool no larger than --per-class keeps every sequence as drawn. "
                    "auto: 500 (docs/dpkps.md, 'Seeds kept from a larger pool': 20 a class kept of 500, the seeds "
                    "+1.6 to +9.4 points and the documents +0.8 to +9.2 on four kinds of corpus, -1.1 on "
                    "DBPedia-14)",
        json_schema_extra=cli(metavar="N|auto"))
    markov_pair_floor: float = Field(
        default=1.0, ge=0.0,
        description="histogram-markov: pair counts that pure noise reaches in about this many of a class's "
                    "P (P - 1) / 2 entries are sampled as 0 (0: no floor)",
    )
    markov_term_share: float = Field(
        default=0.8, gt=0.0, lt=1.0,
        description="histogram-markov: share of --epsilon for the term histogram (the rest: the pairs)")
    markov_pair_top: int = Field(
        default=30, ge=2, le=2000,
        description="histogram-markov: P, each class's heaviest stage-1 terms among which pairs are counted",
        json_schema_extra=cli(metavar="P"))
    markov_pair_terms: int = Field(
        default=2, ge=2, le=100,
        description="histogram-markov: S_2, a document's first distinct candidate terms whose pairs it adds "
                    "(sensitivity S_2 (S_2 - 1) / 2)", json_schema_extra=cli(metavar="S_2"))
    markov_pair_weight: float = Field(
        default=0.5, ge=0.0, le=1.0,
        description="histogram-markov: probability that a step follows the released pairs of the current term",
        json_schema_extra=cli(metavar="MU"))
    length: Annotated[int, Field(ge=1, le=100)] | Literal["auto"] = Field(
        default="auto", description="L: keyphrases per sequence; auto: from the corpus profile for the histogram "
        "methods (10 for short documents, 30 for long ones), the paper's 10 for its samplers",
        json_schema_extra=cli(metavar="L|auto"))
    n_features: int = Field(default=300, ge=1, le=100_000, description="I: random Fourier features per sketch",
                            json_schema_extra=cli(flag="features", metavar="I"))
    bandwidth: float = Field(default=0.5, gt=0.0, description="h: kernel exp(-||x-y||^2 / h^2)",
                             json_schema_extra=cli(metavar="H"))
    selection: Literal["proportional", "greedy", "top-k", "power"] | None = Field(
        default=None, description="how the next phrase is drawn from the clipped scores",
        json_schema_extra=cli(default_text=", ".join(f"{m.default_selection} for {name}"
                                                     for name, m in SEED_METHODS.items())))
    top_k: int = Field(default=10, ge=1, description="k of --selection top-k", json_schema_extra=cli(metavar="K"))
    power: float = Field(default=2.0, gt=0.0, description="G of --selection power: draw proportional to score^G",
                         json_schema_extra=cli(metavar="G"))
    dry_run: bool = Field(default=False, description="print the plan: LLM calls, tokens and cost (first round and a "
                          "worst-case bound), the privacy spend per stage, a local model's time estimate; read no "
                          "data, draw, charge and send nothing")
    @field_validator("eps_kde", "epsilon")
    @classmethod
    def _positive_epsilon(cls, value: float | None) -> float | None:
        return positive_epsilon(value)

    @model_validator(mode="before")
    @classmethod
    def _documents_per_class(cls, values: Any) -> Any:
        """An unset --per-class is ``SEEDS_ONLY_PER_CLASS`` when the release is the seed sequences (--llm none),
        where a classifier trained on them stops gaining, and ``DOCUMENTS_PER_CLASS`` when an LLM writes documents,
        each one a call."""
        if not isinstance(values, dict) or values.get("per_class") is not None:
            return values
        llm = values.get("llm") or cls.model_fields["llm"].get_default()
        if str(llm).strip() == "none":
            return values
        return {**values, "per_class": DOCUMENTS_PER_CLASS}

    @model_validator(mode="before")
    @classmethod
    def _histogram_defaults(cls, values: Any) -> Any:
        """The histogram methods' defaults, chosen once on validation splits of the public corpora and of a
        long-document set (docs/dpkps.md, "Defaults of the histogram methods"): every document counts whole (its
        distinct terms weighted by reading order and scaled to L2 norm 1, so L2 sensitivity 1 under add/remove of one
        document; the corpus profile picks how fast the weights fall, "Defaults that adapt to the corpus") under the
        Gaussian mechanism, calibrated by dp-accounting's PLD to (epsilon, delta). Only values the user did not give
        are filled in; an explicit ``--mechanism laplace`` keeps the first-S histogram (pure DP).
        delta defaults to Aug-PE's 1/(n ln n) with n the public bound ``--n-upper-bound`` (never the corpus size;
        7.2e-8 at 10^6); the ledger, the manifest and the report state it with the epsilon."""
        if not isinstance(values, dict):
            return values
        method = values.get("method") or cls.model_fields["method"].get_default()  # histogram is the default
        values = dict(values)
        if method not in HISTOGRAM_METHODS:
            # The paper's samplers: Laplace noise unless a mechanism is named (the fields' defaults are the
            # default method's); they read no contribution kind, and release no corpus profile: L is the paper's.
            if values.get("length") in (None, "auto"):
                values["length"] = PAPER_LENGTH
            if values.get("mechanism") is None:
                values["mechanism"] = "laplace"
            if values.get("delta") is None:
                values["delta"] = 0.0  # a Gaussian sketch needs an explicit --delta
            return values
        if values.get("mechanism") not in (None, "gaussian"):
            # An explicit --mechanism laplace (or laplace-threshold) keeps the first-S histogram: the
            # whole-document kinds bound only a document's L2 norm.
            if values.get("hist_contribution") in (None, "auto"):
                values["hist_contribution"] = "first-terms"
        mechanism = values.get("mechanism") or cls.model_fields["mechanism"].get_default()
        if mechanism not in DELTA_MECHANISMS:
            if values.get("delta") is None:
                values["delta"] = 0.0  # pure epsilon-DP
        elif values.get("delta") is None:
            try:
                bound = int(values.get("n_upper_bound") or DEFAULT_N_UPPER_BOUND)
            except (TypeError, ValueError):
                return values  # the field's own validation names --n-upper-bound
            if bound < 3:
                return values  # as above
            values["delta"] = default_delta(bound)
        return values

    @model_validator(mode="after")
    def _delta_mechanism_needs_delta(self) -> DpKpsConfig:
        if mechanism_kind(self.mechanism).spends_delta and not self.delta > 0:
            raise ValueError(f"--mechanism {self.mechanism} spends a delta: declare --delta > 0 (e.g. 1e-6)")
        return self

    @model_validator(mode="after")
    def _threshold_is_for_histograms(self) -> DpKpsConfig:
        if self.mechanism == "laplace-threshold":
            if self.method not in HISTOGRAM_METHODS:
                raise ValueError("--mechanism laplace-threshold releases term histograms: use it with --method "
                                 f"{' or '.join(HISTOGRAM_METHODS)}")
        return self

    @model_validator(mode="after")
    def _unit_l2_needs_gaussian(self) -> DpKpsConfig:
        from privseed.tasks.seeds.seed_methods import contribution_kind

        if self.method in HISTOGRAM_METHODS and self.hist_contribution != "auto" \
                and contribution_kind(self.hist_contribution).whole_document \
                and self.mechanism != "gaussian":
            raise ValueError(f"--hist-contribution {self.hist_contribution} bounds a document's L2 norm only: add "
                             "--mechanism gaussian --delta D (e.g. 1e-6)")
        return self

    @property
    def charges(self) -> bool:
        return not self.dry_run

    @property
    def histogram_epsilon(self) -> float:
        """The total budget of the histogram methods: --epsilon, else the DP-KPS total eps_voc + eps_kde."""
        return self.epsilon if self.epsilon is not None else self.eps_voc + self.eps_kde


class EvolutionConfig(EmbeddingOptions, ReleaseConfig):
    """What Aug-PE and SecPE share. ``per_class`` is the population size N kept per class each round."""

    cli_group: ClassVar[str] = "private evolution (Aug-PE and SecPE)"
    option_scopes: ClassVar[tuple[OptionScope, ...]] = (
        *ReleaseConfig.option_scopes,
        OptionScope(frozenset({"mask_fraction"}), lambda cfg, _: cfg.variation != "paraphrase",
                    lambda cfg, _: "--mask-fraction applies to --variation fill-blanks and mixed only; --variation "
                                   "paraphrase blanks no word: drop --mask-fraction, or choose one of those"),
    )

    per_class: int = Field(default=100, ge=1, le=1_000_000, description="N: population kept per class each round, "
                           "the synthetic documents per class", json_schema_extra=cli(aliases=("population",),
                                                                                     metavar="N"))
    llm: str = Field(default="local", description="the LLM that writes the first candidates and their variations: "
                     + llm_help(writers_only=True),
                     json_schema_extra=cli(metavar="SPEC"))
    iterations: int = Field(default=5, ge=1, le=1000, description="T: voting rounds",
                            json_schema_extra=cli(metavar="T"))
    variations: int = Field(default=2, ge=1, le=100, description="K: LLM variations of each kept sample per round",
                            json_schema_extra=cli(metavar="K"))
    variation: Literal["paraphrase", "fill-blanks", "mixed"] = Field(
        default="mixed", description="how the LLM varies a kept sample: paraphrase, fill-blanks (fill in blanked "
                                     "words), or mixed (the two alternate)")
    mask_fraction: float = Field(default=0.3, ge=0.0, lt=1.0, description="fill-in-the-blanks: share of words blanked")
    max_tokens: int = Field(default=128, ge=8, le=8192, description="output tokens per LLM call")
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, description="LLM sampling temperature")
    llm_shards: int = Field(default=1, ge=1, le=1024,
                            description="split each round's LLM calls into this many Dask tasks (1: in-process)")
    llm_retries: int = Field(default=2, ge=0, le=10, description="Prefect retries of a failed batch of LLM calls")
    progress: bool = Field(default=True, description="progress bars of the LLM calls on stderr")
    dry_run: bool = Field(default=False, description="print the LLM-call plan and cost estimate; send, draw and "
                          "charge nothing")
    min_words: int = Field(default=5, ge=0, le=10_000,
                           description="candidates with fewer words (or with prompt residue) are not documents: they "
                                       "get no votes and are kept only when a class has too few others")

    @property
    def charges(self) -> bool:
        return not self.dry_run

    @model_validator(mode="after")
    def _needs_llm(self) -> "EvolutionConfig":
        if self.llm == "none":
            raise ValueError("private evolution needs an LLM (RANDOM_API / VARIATION_API); --llm none is DP-KPS only")
        return self


#: AugPE+V~'s options (--vocab-words): the vocabulary release it spends --eps-voc on, and the words of its prompts.
VOCAB_WORDS_OPTIONS = frozenset({"words_per_prompt", "vocab", "vocab_top", "eps_voc", "first_terms", "vocab_size"})


class AugPeConfig(VocabularyOptions, EvolutionConfig):
    """Aug-PE (Xie et al. 2024) and AugPE+V~. See docs/baselines.md."""

    cli_group: ClassVar[str] = "Aug-PE and AugPE+V~"
    option_scopes: ClassVar[tuple[OptionScope, ...]] = (
        *EvolutionConfig.option_scopes,
        OptionScope(VOCAB_WORDS_OPTIONS, lambda cfg, _: cfg.vocab_words,
                    lambda cfg, name: f"{flag_of(AugPeConfig, name)} applies to AugPE+V~ (--vocab-words) only; "
                                      "Aug-PE spends --epsilon on its voting rounds and draws no vocabulary: add "
                                      f"--vocab-words, or drop {flag_of(AugPeConfig, name)}"),
    )
    privacy_fields: ClassVar[tuple[str, ...]] = (
        "labels", "epsilon", "delta", "noise_multiplier", "n_upper_bound", "iterations", "per_class", "variations",
        "variation", "threshold", "selection", "vocab_words", "vocab", "vocab_top", "eps_voc", "first_terms",
        "vocab_size", "words_per_prompt", "embedding_model", "text_column", "label_column", "llm", "max_tokens",
        "temperature", "mask_fraction", "doc_type", "min_words",
    )

    epsilon: float | None = Field(default=None, gt=0.0, allow_inf_nan=False, description="DP budget of the T voting "
                                  "rounds",
                                  json_schema_extra=cli(metavar="EPS", default_text=f"{AUGPE_DEFAULT_EPSILON:g} "
                                                        "unless --noise-multiplier"))
    delta: float | None = Field(default=None, gt=0.0, lt=1.0, description="delta of the voting rounds",
                                json_schema_extra=cli(default_text="1/(n ln n) with n = --n-upper-bound"))
    noise_multiplier: float | None = Field(default=None, gt=0.0, description="sigma, instead of --epsilon",
                                           json_schema_extra=cli(metavar="SIGMA", default_text="from --epsilon"))
    threshold: float = Field(default=0.0, description="H: noisy counts below H are dropped",
                             json_schema_extra=cli(metavar="H"))
    selection: Literal["rank", "sample"] = Field(default="rank", description="keep the N highest noisy counts, or "
                                                 "sample N proportional to them")
    vocab_words: bool = Field(default=False, description="AugPE+V~: the prompts of the first candidates carry "
                              "random words of DP-KPS's released vocabulary V~ (costs --eps-voc)")
    words_per_prompt: int = Field(default=5, ge=1, le=100, description="AugPE+V~: words of V~ per prompt")

    @model_validator(mode="after")
    def _budget(self) -> "AugPeConfig":
        if self.epsilon is not None and self.noise_multiplier is not None:
            raise ValueError("give --epsilon or --noise-multiplier, not both")
        return self


#: The options of SecPE's word secrets (--secrets words), which a list of PII types or a file of terms replaces.
WORD_SECRET_OPTIONS = frozenset({"secret_quantile", "secret_count", "secret_vocab_top"})


class SecPeConfig(EvolutionConfig):
    """SecPE (Wang et al.): (p, r)-secret protection with secret clustering. See docs/baselines.md."""

    cli_group: ClassVar[str] = "SecPE"
    option_scopes: ClassVar[tuple[OptionScope, ...]] = (
        *EvolutionConfig.option_scopes,
        OptionScope(WORD_SECRET_OPTIONS, lambda cfg, _: cfg.secrets == "words",
                    lambda cfg, name: f"{flag_of(SecPeConfig, name)} applies to --secrets words only; --secrets "
                                      f"{'pii' if cfg.secrets == 'pii' else 'FILE'} names its own secrets: drop "
                                      f"{flag_of(SecPeConfig, name)}, or use --secrets words"),
    )
    privacy_fields: ClassVar[tuple[str, ...]] = (
        "labels", "public", "p", "r_over_p", "clusters", "secrets", "secret_quantile", "secret_count", "radius",
        "secret_vocab_top",
        "rho_norm", "noise_multiplier", "delta", "n_upper_bound", "iterations", "per_class", "variations",
        "variation", "embedding_model", "text_column", "label_column", "public_text_column", "llm", "max_tokens",
        "temperature", "mask_fraction", "doc_type", "value_discretization", "min_words",
    )

    public: str = Field(description="a public corpus of the same domain (Parquet, CSV or JSON Lines; only its text "
                        "column is read)",
                        json_schema_extra=cli(metavar="PUB"))
    public_text_column: str = Field(default="text", description="text column of --public",
                                    json_schema_extra=cli(metavar="COLUMN"))
    p: float = Field(default=1e-4, gt=0.0, lt=1.0, description="the adversary's prior success probability")
    r_over_p: float = Field(default=10.0, gt=1.0, description="r / p; r bounds the reconstruction success")
    clusters: int = Field(default=50, ge=1, description="K: public k-means clusters",
                          json_schema_extra=cli(metavar="K"))
    secrets: str = Field(default="words", description="what the secrets are: words | pii | FILE (one secret term per "
                         "line)", json_schema_extra=cli(metavar="words|pii|FILE"))
    secret_quantile: float = Field(default=0.5, ge=0.0, le=1.0,
                                   description="words: secrets sit around this rank quantile of the public word list")
    secret_count: int = Field(default=200, ge=1, description="words: how many secret words")
    secret_vocab_top: int = Field(default=50_000, ge=10, description="words: size of the public word list (wordfreq)")
    radius: float = Field(default=1.0, gt=0.0, description="R: clipping radius of embeddings (unit vectors: 1)")
    rho_norm: Literal["max", "paper"] = Field(default="max", description="how the LP weights become sampling "
                                              "probabilities rho: max (w / max w) or paper (Algorithm 1 as printed)")
    noise_multiplier: float | None = Field(default=None, gt=0.0, description="sigma, the public noise level of "
                                           "the votes (not needed with --dry-run or --advise-sigma): the run refuses "
                                           "if a detected secret needs more for (p, r); --dry-run prints what a "
                                           "secret held by one document needs",
                                           json_schema_extra=cli(metavar="SIGMA", default_text="required"))
    advise_sigma: bool = Field(default=False, description="read the corpus, print the smallest sigma (rounded up to "
                               "0.5) that meets (p, r) for its detected secrets, and stop: nothing drawn, charged or "
                               "written; the number depends on the private data and is for the owner only")
    delta: float | None = Field(default=None, description="delta of the reported DP epsilon",
                                json_schema_extra=cli(default_text="1/(n ln n) with n = --n-upper-bound"))
    value_discretization: float = Field(default=1e-2, gt=0.0, le=0.1, description="value discretization interval "
                                        "of the PLD accountant that calibrates sigma")

    @property
    def charges(self) -> bool:
        return not (self.dry_run or self.advise_sigma)

    @model_validator(mode="after")
    def _public_sigma(self) -> "SecPeConfig":
        # A sigma calibrated on the private secret incidence would be released with the ledger (issue 30, item 2):
        # the release's noise level is the owner's public choice, and the data-calibrated one only advice.
        if self.noise_multiplier is None and not (self.dry_run or self.advise_sigma):
            raise ValueError("SecPE releases need a public noise level: give --noise-multiplier SIGMA (--dry-run "
                             "prints what a secret held by one document needs; --advise-sigma reads the corpus and "
                             "prints what its secrets need, for the owner only)")
        return self


def _load_file(path: str) -> dict[str, Any]:
    file = Path(path)
    if not file.exists():
        raise ConfigError(f"config file {path} does not exist")
    text = file.read_text()
    import yaml

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


def build_config(model: type[Config], flags: dict[str, Any], config_file: str | None = None) -> Config:
    """Merge file < environment < flags and validate. Raises ConfigError naming every bad field."""
    merged: dict[str, Any] = {}
    if config_file:
        merged.update(_load_file(config_file))
    merged.update(_from_env(model))
    merged.update({k: v for k, v in flags.items() if v is not None})
    return validate_config(model, merged)


#: The options of every flow whose parameter is a configuration model: the server of a deployment checks a
#: submitted run against the model's JSON schema (from the typed signature), and the flow validates the value
#: itself (:func:`flow_config`), so a Python caller's error names the flag, as on the command line, rather than
#: Prefect's generic ParameterTypeError.
TYPED_FLOW: dict[str, Any] = {"validate_parameters": False}


def flow_config(model: type[Config], config: BaseModel | Mapping[str, Any]) -> Config:
    """A flow's typed parameter as the configuration it runs: what the caller set (a deployment's form, a
    ``--params`` JSON, the CLI's validated model) over the PRIVSEED_* environment, over the defaults.

    Prefect has already validated the parameter against ``model`` (and a deployment's server refused a value
    its JSON schema rules out before the run was created); the environment is merged under the fields the caller
    set, so a deployment honours PRIVSEED_* variables as the command line does."""
    values = config.model_dump(exclude_unset=True) if isinstance(config, BaseModel) else dict(config)
    return build_config(model, values)


def validate_config(model: type[Config], values: dict[str, Any]) -> Config:
    """``values`` (flags, a config file, a deployment's dict) as a ``model``; ConfigError names every bad field by
    the flag a user types (:func:`describe_error`)."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        problems = [describe_error(model, error) for error in exc.errors()]
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None


def describe_error(model: type[BaseModel], error: Any) -> str:
    """One pydantic error as ``--flag: problem``; the field's key follows in parentheses when it is spelled
    otherwise (``--features (n_features)``), for config files and deployments."""
    message = str(error["msg"]).removeprefix("Value error, ")
    if not error["loc"]:
        return message
    name = str(error["loc"][0])
    flag = flag_of(model, name)
    if error["type"] == "extra_forbidden":
        message = f"unknown option ({model.__name__} has no field {name!r})"
        close = difflib.get_close_matches(name, list(model.model_fields), n=1, cutoff=0.6)
        if close:
            message += f"; did you mean {flag_of(model, close[0])} ({close[0]})?"
    if error["type"] == "missing" and name in model.model_fields:
        message = (f"a value is required (on the command line, as `{name}` in the --config file or as "
                   f"PRIVSEED_{name.upper()})")
    if error["type"] == "literal_error" and isinstance(error.get("input"), str):
        choices = re.findall(r"'([^']*)'", str((error.get("ctx") or {}).get("expected", "")))
        close = difflib.get_close_matches(error["input"], choices, n=1, cutoff=0.6)
        if close:
            message += f"; did you mean {close[0]!r}?"
    if message.startswith((flag + " ", flag + ":")):  # the message names its flag already (privseed.tasks.llm)
        return message
    spelled_otherwise = name in model.model_fields and flag != "--" + _dashed(name) and flag != name.upper()
    return f"{flag} ({name}): {message}" if spelled_otherwise else f"{flag}: {message}"


# ---------------------------------------------------------------------------------------------------------
# The commands around the releases: the recipient's evaluation, the experiment grid, the audit and the demo
# ---------------------------------------------------------------------------------------------------------
#: The neural classifiers of the recipient's evaluation; TF-IDF + LR is reported beside either
NeuralClassifier = Literal["mlp", "finetune"]
#: How the recipient's test documents reach the classifiers (phrases: the no-LLM ablation, docs/evaluation.md)
TestView = Literal["auto", "text", "phrases"]
#: A setting an experiment grid runs without, with, or both without and with
Switch = Literal["no", "yes", "both"]
#: What each Switch runs
SWITCH_VALUES: dict[str, list[bool]] = {"no": [False], "yes": [True], "both": [False, True]}
#: The experiment grid's methods besides DP-KPS's samplers (DpKpsConfig.method): the two baselines (real
#: documents, only-LLM texts) and private evolution (Aug-PE, AugPE+V~, SecPE); tasks/evaluation/experiment.py runs them.
BASELINE_METHODS = ("real", "only-llm")
PE_METHODS = ("augpe", "augpe+v", "secpe")
EXPERIMENT_METHODS: tuple[str, ...] = (*get_args(DpKpsConfig.model_fields["method"].annotation), *BASELINE_METHODS,
                                       *PE_METHODS)
#: Where an experiment writes its results when neither its file nor --out says
EXPERIMENT_OUT = "experiments/results"
#: The mechanisms `privseed audit` can audit (tasks/audit/trials.py)
AUDIT_MECHANISMS = ("vocabulary", "kde", "histogram", "markov", "augpe", "secpe", "histogram-unit-l2",
                    "histogram-rank-l2", "histogram-slow-rank-l2", "histogram-rank-rare-l2", "histogram-threshold",
                    "corpus-profile")
#: Trials per corpus of each audit profile, (calibration, evaluation): quick runs in the test suite; full makes the
#: figures of experiments/results/privacy-audit.md (500 evaluation trials per side bound epsilon by about 4.9)
AUDIT_PROFILES: dict[str, tuple[int, int]] = {"quick": (40, 100), "full": (250, 500)}


class EvaluationOptions(BaseModel):
    """What the data recipient trains on a synthetic corpus and how (docs/evaluation.md): the options of
    `privseed evaluate`, and of every cell of an experiment grid (which sets them from its file)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    cli_group: ClassVar[str] = "what to train and how"

    classifier: NeuralClassifier = Field(default="mlp", description="mlp: a 3-layer MLP over frozen MiniLM "
                                         "embeddings (CPU); finetune: MiniLM fine-tuned end to end (GPU)")
    tfidf: bool = Field(default=True, description="also train TF-IDF + logistic regression (scikit-learn), an "
                        "evaluator that is not privseed's")
    coral: bool = Field(default=False, description="Deep CORAL domain adaptation against unlabelled client "
                        "documents")
    test_view: TestView = Field(default="auto", description="phrases: test documents become phrase sequences of "
                                "the release's vocabulary (the no-LLM ablation); auto: phrases for a release "
                                "written with --llm none, else text")
    seed: int = Field(default=0, ge=0, description="seeds the classifiers' training and the sample of client "
                      "documents")
    max_epochs: int = Field(default=60, ge=1, le=10_000, description="maximum epochs (early stopping on a split of "
                            "the synthetic data)", json_schema_extra=cli(flag="epochs"))
    device: str | None = Field(default=None, pattern=r"^(cpu|cuda(:\d+)?|mps)$", description="torch device: cpu, "
                               "cuda, cuda:N or mps",
                               json_schema_extra=cli(metavar="DEVICE", default_text="cuda when available, else cpu"))
    embedding_model: str = Field(default="minilm", description="the evaluator's sentence embeddings: minilm "
                                 "(offline package) or a local sentence-transformers folder",
                                 json_schema_extra=cli(metavar="MODEL"))
    map_method: Literal["tsne", "pca"] = Field(default="tsne", description="the report's 2-D map of real and "
                                               "synthetic embeddings", json_schema_extra=cli(flag="map"))
    progress: bool = Field(default=True, description="progress bars of the training on stderr")


class EvaluateConfig(EvaluationOptions):
    """`privseed evaluate`: train on a release only, score on the recipient's real test set (docs/evaluation.md)."""

    cli_group: ClassVar[str] = "the release and the recipient's documents"

    synthetic: str = Field(description="the release folder (local or s3://), read through its manifest.json",
                           json_schema_extra=cli(metavar="OUT"))
    test: str = Field(description="the recipient's real labelled test set (Parquet, CSV or JSON Lines)",
                      json_schema_extra=cli(metavar="PATH"))
    client: str | None = Field(default=None, description="unlabelled client documents for --coral (Parquet, CSV or "
                               "JSON Lines; only the text column is read; texts also in --test are dropped)",
                               json_schema_extra=cli(metavar="PATH"))
    real_train: str | None = Field(default=None, description="real labelled documents (Parquet, CSV or JSON Lines, "
                                   "the columns of --test; texts also in --test are dropped): the report adds "
                                   "TF-IDF + LR trained on them as a reference line beside the synthetic corpus's",
                                   json_schema_extra=cli(metavar="PATH", default_text="no real-documents line"))
    json_path: str | None = Field(default=None, description="write the scores and metrics as JSON here",
                                  json_schema_extra=cli(flag="json", metavar="FILE", default_text="no JSON"))
    report_path: str | None = Field(default=None, description="where report.html goes",
                                    json_schema_extra=cli(flag="report", metavar="FILE",
                                                          default_text="OUT.evaluation/report.html"))
    report_in_release: bool = Field(default=False, description="write report.html into the release folder OUT "
                                    "(it holds a per-document t-SNE of the test set, which then travels with the "
                                    "release)")
    text_column: str = Field(default="text", description="column of --test and --client that holds the text",
                             json_schema_extra=cli(metavar="COLUMN"))
    label_column: str = Field(default="label", description="column of --test that holds the label",
                              json_schema_extra=cli(metavar="COLUMN"))

    @model_validator(mode="after")
    def _coral_needs_client(self) -> "EvaluateConfig":
        if self.coral and not self.client:
            raise ValueError("--coral needs --client PATH (unlabelled client documents, disjoint from the test set)")
        if self.report_in_release and self.report_path:
            raise ValueError("give --report FILE or --report-in-release, not both")
        return self

    @property
    def report_uri(self) -> str:
        """Where report.html goes: --report; else OUT.evaluation/ beside the release, outside it, since the report
        draws every test document (t-SNE) and OUT is what gets passed on; inside OUT only when asked."""
        from privseed.tasks import storage

        if self.report_in_release:  # never together with --report (refused above)
            return storage.join(self.synthetic, "report.html")
        return self.report_path or storage.join(evaluation_folder(self.synthetic), "report.html")


def _eps_pair(item: Any) -> Any:
    """``1+5`` -> (1.0, 5.0); anything but text is left to the field's type."""
    if not isinstance(item, str):
        return item
    parts = item.split("+")
    try:
        if len(parts) == 2:
            return float(parts[0]), float(parts[1])
    except ValueError:
        pass
    raise ValueError(f"wants eps_voc+eps_kde pairs like 1+5,5+10, got {item!r}")


class ExperimentConfig(BaseModel):
    """`privseed experiment`: the experiment file and what the command line overrides in it. The file's own
    schema (datasets, [dpkps], [pe], [generation], ...) is tasks/evaluation/experiment.py's; each field here replaces
    the
    file's setting of the same name."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    cli_group: ClassVar[str] = "the grid (each option replaces the experiment file's setting)"

    config_path: str | None = Field(default=None, description="the experiment file, experiments/*.toml: datasets, "
                                    "methods, budgets, seeds and each method's settings",
                                    json_schema_extra=cli(flag="config", metavar="FILE",
                                                          default_text="none (the grid inline, from Python)"))
    name: str | None = Field(default=None, description="the grid's name; its results go to OUT/NAME (give another "
                             "name when an option changes what a cell computes)",
                             json_schema_extra=cli(metavar="NAME", default_text="the file's, else its stem"))
    methods: list[Literal[EXPERIMENT_METHODS]] | None = Field(  # type: ignore[valid-type]
        default=None, min_length=1, description="comma separated, of: " + ",".join(EXPERIMENT_METHODS),
        json_schema_extra=cli(metavar="M,...", default_text="the file's"))
    eps: list[tuple[float, float]] | None = Field(
        default=None, min_length=1, description="eps_voc+eps_kde pairs, comma separated, e.g. 1+5,5+5,1+10,5+10",
        json_schema_extra=cli(metavar="V+K,...", default_text="the file's"))
    seeds: list[Annotated[int, Field(ge=0)]] | None = Field(default=None, min_length=1, description="comma "
                                                            "separated, e.g. 0,1,2",
                                                            json_schema_extra=cli(metavar="S,...",
                                                                                  default_text="the file's"))
    llm: list[str] | None = Field(default=None, min_length=1, description="one LLM or several, comma separated; the "
                                  "grid runs every method with each. Each one of " + llm_help(),
                                  json_schema_extra=cli(metavar="SPEC,...", default_text="the file's, else none"))
    class_names: Switch | None = Field(default=None, description="DP-KPS prompts without, with, or both without "
                                       "and with the dataset's public class names",
                                       json_schema_extra=cli(default_text="the file's, else no"))
    classifier: NeuralClassifier | None = Field(
        default=None, description="the neural classifier of every cell (TF-IDF + LR beside it)",
        json_schema_extra=cli(default_text=f"the file's, else {EvaluationOptions.model_fields['classifier'].default}"))
    coral: Switch | None = Field(default=None, description="Deep CORAL: without, with, or both (the paper's "
                                 "Table 4)", json_schema_extra=cli(default_text="the file's, else no"))
    synthetic_per_class: int | None = Field(default=None, ge=1, le=1_000_000, description="texts per class of "
                                            "every release, in every dataset (give the grid another --name)",
                                            json_schema_extra=cli(metavar="N", default_text="each dataset's"))
    max_regenerations: int | None = Field(default=None, ge=0, le=20, description="regeneration rounds of DP-KPS "
                                          "releases and of only-LLM texts alike ([dpkps] max_regenerations)",
                                          json_schema_extra=cli(metavar="N", default_text="the file's, else 8"))
    out: str | None = Field(default=None, description="results folder",
                            json_schema_extra=cli(metavar="DIR", default_text=f"the file's, else {EXPERIMENT_OUT}"))
    cell_reports: bool = Field(default=True, description="a report.html beside every run's release")
    insecure_reproducible_noise: bool | None = Field(
        default=None, description="research grids only: every method's noise from the cell's seed (bit-identical "
                                  "reruns); the releases are NOT differentially private and refused unless "
                                  "--allow-insecure-release",
        json_schema_extra=cli(default_text="the file's, else off"))
    allow_insecure_release: bool | None = Field(
        default=None, description="publish the cells' releases made with --insecure-reproducible-noise anyway "
                                  "(stamped)", json_schema_extra=cli(default_text="the file's, else off"))
    report_only: bool = Field(default=False, description="only tabulate the runs already finished (start none); "
                              "missing runs show fewer seeds")
    progress: bool = Field(default=True, description="a progress bar over the runs on stderr")

    @field_validator("methods", "seeds", "llm", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        return comma_list(value) if isinstance(value, str) else value

    @field_validator("eps", mode="before")
    @classmethod
    def _eps_pairs(cls, value: Any) -> Any:
        """``1+5,5+10`` (the command line) or [[1, 5], [5, 10]] (a file, a deployment)."""
        items = comma_list(value) if isinstance(value, str) else value
        return [_eps_pair(item) for item in items] if isinstance(items, (list, tuple)) else items

    @field_validator("eps")
    @classmethod
    def _positive_budgets(cls, value: list[tuple[float, float]] | None) -> list[tuple[float, float]] | None:
        for pair in value or []:
            if not all(0 < eps < float("inf") for eps in pair):
                raise ValueError(f"every epsilon must be a finite number > 0, got {pair[0]:g}+{pair[1]:g}")
        return value

    @field_validator("llm")
    @classmethod
    def _known_llms(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else [llm_spec_text(spec) for spec in value]


class AuditConfig(BaseModel):
    """`privseed audit`: an empirical privacy audit of each mechanism (docs/privacy.md)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    cli_group: ClassVar[str] = "the audit"

    profile: Literal[tuple(AUDIT_PROFILES)] = Field(  # type: ignore[valid-type]
        default="quick", description="; ".join(f"{name}: {counts[1]} evaluation trials per corpus"
                                                for name, counts in AUDIT_PROFILES.items()))
    mechanisms: list[Literal[AUDIT_MECHANISMS]] = Field(  # type: ignore[valid-type]
        default_factory=lambda: list(AUDIT_MECHANISMS), min_length=1,
        description="comma separated subset of " + ",".join(AUDIT_MECHANISMS), json_schema_extra=cli(metavar="M,..."))
    trials: int | None = Field(default=None, ge=10, le=1_000_000, description="evaluation trials per corpus "
                               "(calibration: half as many, at least 10)",
                               json_schema_extra=cli(default_text="the profile's"))
    insecure_reproducible_noise: bool = Field(default=False, description="audit the opt-in reproducible noise (the "
                                              "same seed every trial): every claim must come out VIOLATED")
    # A bound at 95 % confidence says VIOLATED of a tight, correct mechanism in up to 1 run of 40; an auditor who
    # wants that rarer (a CI gate) raises the level and pays with looser bounds.
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0, description="confidence level of each epsilon lower "
                              "bound; higher makes a chance VIOLATED of a correct mechanism rarer",
                              json_schema_extra=cli(metavar="P"))
    out: str = Field(default="audit-out", description="folder for audit.json and audit.png",
                     json_schema_extra=cli(metavar="DIR"))
    progress: bool = Field(default=True, description="progress bars of the trials on stderr")

    @field_validator("mechanisms", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        return comma_list(value) if isinstance(value, str) else value

    def trial_counts(self) -> tuple[int, int]:
        """Trials per corpus, (calibration, evaluation): the profile's, or --trials and half as many."""
        if self.trials is None:
            return AUDIT_PROFILES[self.profile]
        return max(10, self.trials // 2), self.trials


class DemoConfig(BaseModel):
    """`privseed demo`: histogram seeds made into documents on the bundled DBpedia-14 sample, then the
    recipient's evaluation. The demo's settings are fixed (flows/demo.py); these are the two a user chooses."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    cli_group: ClassVar[str] = "the demo"

    out: str = Field(default="demo-out", description="release folder (local or s3://)",
                     json_schema_extra=cli(metavar="DIR"))
    llm: str = Field(default="local", description="the LLM that writes the documents (local: the packaged offline "
                     "model; none: the DP seeds alone): " + llm_help(),
                     json_schema_extra=cli(metavar="SPEC"))

    @field_validator("llm")
    @classmethod
    def _known_llm(cls, value: str) -> str:
        return llm_spec_text(value)


class CanaryAuditConfig(DpKpsConfig):
    """`privseed audit-release`: the whole-pipeline canary test (docs/privacy.md, "Canary test"): DP-KPS (or a
    histogram method) with these settings on a copy of the corpus with canaries inserted, then their exposure in
    the released text. The audit's own release is written to a temporary folder and deleted; only the verdict is
    kept."""

    cli_group: ClassVar[str] = "the canary test"
    #: --out holds the audit's verdict, not a release; its run's private state is a fresh temporary folder
    writes_release: ClassVar[bool] = False

    out: str = Field(description="folder for canary-audit.png (scores only); canary-audit.json, which holds the "
                     "canaries, goes to the private state OUT.private beside it (the owner's; not a release)",
                     json_schema_extra=cli(metavar="DIR"))
    canary_pairs: int = Field(default=2, ge=1, le=1000, description="canary pairs per class: of each pair one is "
                              "inserted, one held out (public randomness decides which)",
                              json_schema_extra=cli(metavar="N"))
    repetitions: int = Field(default=10, ge=1, le=10_000, description="copies of each inserted canary in the corpus",
                             json_schema_extra=cli(metavar="R"))
    secret_words: int = Field(default=3, ge=1, le=20, description="rare public-vocabulary words in each canary's "
                              "secret", json_schema_extra=cli(metavar="K"))
    prefix_words: int = Field(default=4, ge=1, le=50, description="words of a real document of the class that start "
                              "each canary (in-distribution prefix)", json_schema_extra=cli(metavar="W"))
    sample_per_class: int | None = Field(default=50, ge=1, description="real documents per class kept in the "
                                         "audited corpus (drawn with --seed); a smaller corpus exposes a canary more, "
                                         "so the audit is conservative and fast; 0 or none: every document",
                                         json_schema_extra=cli(metavar="N"))
    alpha: float = Field(default=0.01, gt=0.0, lt=0.5, description="EXPOSED when the permutation p-value of "
                         "inserted vs held-out canaries is at most this", json_schema_extra=cli(metavar="P"))

    @field_validator("sample_per_class", mode="before")
    @classmethod
    def _all_documents(cls, value: Any) -> Any:
        return None if value in (0, "0", "none", "None", "all") else value

    @model_validator(mode="after")
    def _audit_settings(self) -> "CanaryAuditConfig":
        if self.run_id is not None or self.new_run:
            raise ValueError(f"{'--run-id' if self.run_id is not None else '--new-run'} does not apply: every canary "
                             "test is a fresh run in a temporary folder")
        if self.dry_run:
            raise ValueError("--dry-run does not apply: the canary test reads the corpus and runs the method")
        if self.state is not None:
            raise ValueError("--state does not apply: the canary test keeps its run's private state in a temporary "
                             "folder and deletes it")
        return self

    def release_config(self, data: str, out: str, state: str) -> DpKpsConfig:
        """The DpKpsConfig of the audit's own run: these settings on the corpus with canaries, into ``out``."""
        values = self.model_dump(exclude=set(CanaryAuditConfig.model_fields) - set(DpKpsConfig.model_fields))
        # The copy is a local Parquet file of two columns; the owner's storage options are for the owner's data.
        # No release gate: this release is scored and deleted, never shared, and a gate refusal (a class whose few
        # seeds all failed the document test) would lose the measurement.
        values.update(data=data, out=out, state=state, run_id=None, text_column="text", label_column="label",
                      storage_options={}, gate=False)
        return validate_config(DpKpsConfig, values)
