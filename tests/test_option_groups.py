"""Each option is declared once, with one default, in one place: the option groups (tasks/config/options.py) and the
command models that compose them (tasks/config/commands.py). Here the command line, the typed deployment schema and
the groups are compared field by field, and the --llm help and choices are checked to come from the backend-kind
registry (tasks/llm/kinds.py), not from text written in tasks/config/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from privseed.tasks.config.commands import (AugPeConfig, AuditConfig, CanaryAuditConfig, DemoConfig, DpKpsConfig,
                                            EvaluateConfig, ExperimentConfig, SecPeConfig, flags_of)
from privseed.tasks.config.options import (OPTION_GROUPS, DocumentOptions, GenerationOptions, LLMOptions,
                                           OptionGroup)
from privseed.tasks.generation.params import GenerationParams
from privseed.tasks.llm.kinds import KINDS

REPO = Path(__file__).resolve().parents[1]

#: Each command and its model.
COMMANDS: dict[str, type[BaseModel]] = {"dpkps": DpKpsConfig, "augpe": AugPeConfig, "secpe": SecPeConfig,
                                        "evaluate": EvaluateConfig, "experiment": ExperimentConfig,
                                        "audit": AuditConfig, "demo": DemoConfig, "audit-release": CanaryAuditConfig}
#: The commands a deployment runs, with the flow whose typed parameter is the model.
DEPLOYED = {"dpkps": "flows/dpkps.py:dpkps_flow", "augpe": "flows/evolution.py:augpe_flow",
            "secpe": "flows/evolution.py:secpe_flow", "evaluate": "flows/evaluate.py:evaluate",
            "experiment": "flows/experiment.py:experiment"}

#: A command class that declares again a field of a class it derives from, with its own default, and why. Nothing
#: else may: a second declaration is a second default that drifts (issue 49: steer 4.0 against 0.0).
OVERRIDES: dict[tuple[str, str], str] = {
    ("EvolutionConfig", "llm"): "private evolution needs an LLM: its default is local, DP-KPS's none",
    ("EvolutionConfig", "temperature"): "Aug-PE's published setting (1.0) against DP-KPS's 0.7",
    ("EvolutionConfig", "max_tokens"): "Aug-PE's published setting (128) against DP-KPS's 256",
    ("EvolutionConfig", "per_class"): "the population N of each round, with its alias --population",
    ("CanaryAuditConfig", "out"): "the canary test's --out holds its verdict, not a release",
}

#: Fields of a command that does not compose the group of the same name, and why they are other options.
SAME_NAME_OTHER_OPTION: dict[tuple[str, str], str] = {
    ("EvaluationOptions", "seed"): "seeds the recipient's classifier training, not a release's randomness",
    ("EvaluationOptions", "embedding_model"): "the recipient's evaluator's embeddings, not the generator's",
    ("ExperimentConfig", "llm"): "a list of --llm values, one grid axis",
    ("ExperimentConfig", "class_names"): "a grid axis (no|yes|both) over the datasets' own names, not a file",
    ("ExperimentConfig", "max_regenerations"): "replaces the experiment file's setting (None: the file's)",
    ("ExperimentConfig", "insecure_reproducible_noise"): "replaces the experiment file's setting (None: the file's)",
    ("ExperimentConfig", "allow_insecure_release"): "replaces the experiment file's setting (None: the file's)",
    ("AuditConfig", "insecure_reproducible_noise"): "audits the reproducible noise rather than producing it",
    ("DemoConfig", "llm"): "the demo writes with the packaged local model by default",
}


def _declarers(model: type[BaseModel], name: str) -> list[type]:
    """The classes of ``model``'s hierarchy that declare field ``name``, most derived first."""
    return [cls for cls in model.__mro__ if name in vars(cls).get("__annotations__", {})]


def _all_groups() -> set[type]:
    found, todo = set(), [OptionGroup]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                todo.append(sub)
    return {cls for cls in found if "OptionGroup" in [b.__name__ for b in cls.__bases__] and
            cls.__module__.endswith("config.options")}


def test_every_option_group_is_listed_and_declares_its_fields_alone():
    assert _all_groups() == set(OPTION_GROUPS)
    owner: dict[str, str] = {}
    for group in OPTION_GROUPS:
        for name in group.model_fields:
            assert name not in owner, f"{name} is declared by {owner[name]} and {group.__name__}"
            owner[name] = group.__name__


@pytest.mark.parametrize("command", COMMANDS)
def test_every_field_comes_from_one_group_or_is_the_commands_own(command):
    model = COMMANDS[command]
    for name in model.model_fields:
        declarers = _declarers(model, name)
        groups = [cls for cls in declarers if issubclass(cls, OptionGroup) and cls in OPTION_GROUPS]
        assert len(groups) <= 1, f"{command}: {name} comes from {groups}"
        for cls in declarers[:-1]:  # each declaration above the first is an override, which must give its reason
            assert (cls.__name__, name) in OVERRIDES, (
                f"{command}: {cls.__name__} declares {name} again (first in {declarers[-1].__name__}); declare it "
                "once, in its option group, or list the override in OVERRIDES with its reason")


def test_no_command_redeclares_a_group_option_under_the_same_name():
    group_fields = {name: group for group in OPTION_GROUPS for name in group.model_fields}
    seen: set[tuple[str, str]] = set()
    for model in COMMANDS.values():
        for cls in model.__mro__:
            if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or issubclass(cls, OptionGroup) and \
                    cls in OPTION_GROUPS:
                continue
            for name in vars(cls).get("__annotations__", {}):
                if name in group_fields and not issubclass(cls, group_fields[name]):
                    assert (cls.__name__, name) in SAME_NAME_OTHER_OPTION, (
                        f"{cls.__name__}.{name} repeats {group_fields[name].__name__}.{name}: compose the group, or "
                        "say in SAME_NAME_OTHER_OPTION why it is another option")
                    seen.add((cls.__name__, name))
    assert seen == set(SAME_NAME_OTHER_OPTION), f"stale entries: {set(SAME_NAME_OTHER_OPTION) - seen}"
    assert {cls for cls, _ in OVERRIDES} <= {c.__name__ for m in COMMANDS.values() for c in m.__mro__}


def test_a_group_option_has_the_groups_default_in_every_command():
    for command, model in COMMANDS.items():
        for group in OPTION_GROUPS:
            if not issubclass(model, group):
                continue
            for name, field in group.model_fields.items():
                if any((cls.__name__, name) in OVERRIDES for cls in _declarers(model, name)):
                    continue
                assert model.model_fields[name].get_default(call_default_factory=True) == \
                    field.get_default(call_default_factory=True), f"{command}: {name}"


def test_generation_params_decode_with_the_options_defaults():
    """The only-LLM baseline and DP-KPS decode alike: GenerationParams' defaults are GenerationOptions'."""
    params = GenerationParams()
    for group, names in ((GenerationOptions, ("steer", "steer_schedule", "steer_end_coverage", "repeat_penalty",
                                              "no_repeat_ngram", "best_of", "max_regenerations", "max_rewrites")),
                         (LLMOptions, ("max_tokens", "temperature")), (DocumentOptions, ("doc_type", "language"))):
        for name in names:
            assert getattr(params, name) == group.model_fields[name].default, name


def _subparser(command: str):
    from privseed.flows.cli import build_parser

    action = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return action.choices[command]


@pytest.mark.parametrize("command", COMMANDS)
def test_the_command_line_is_the_models_fields(command):
    model = COMMANDS[command]
    actions = {a.dest: a for a in _subparser(command)._actions}
    config_field = any(flags_of(model, name) == ["--config"] for name in model.model_fields)
    assert set(actions) - {"help", "config_file"} == set(model.model_fields) or config_field
    for name in model.model_fields:
        assert list(actions[name].option_strings) == flags_of(model, name), name


@pytest.mark.parametrize("command", DEPLOYED)
def test_the_deployment_schema_is_the_groups_and_the_commands_own(command):
    from prefect.flows import load_flow_from_entrypoint
    from prefect.utilities.callables import parameter_schema

    model = COMMANDS[command]
    schema = parameter_schema(load_flow_from_entrypoint(DEPLOYED[command]).fn).model_dump()
    typed = schema["definitions"][model.__name__]
    composed = {name for group in OPTION_GROUPS if issubclass(model, group) for name in group.model_fields}
    own = {name for cls in model.__mro__ if not (isinstance(cls, type) and issubclass(cls, OptionGroup) and
                                                 cls in OPTION_GROUPS)
           for name in vars(cls).get("__annotations__", {}) if name in model.model_fields}
    assert set(typed["properties"]) == set(model.model_fields) == composed | own
    for name in composed:  # a group's option reaches the deployment's form with its one default
        default = model.model_fields[name].get_default(call_default_factory=True)
        assert typed["properties"][name].get("default", default) == json.loads(json.dumps(default)), name


def test_llm_help_and_choices_come_from_the_backend_registry():
    for model in (DpKpsConfig, AugPeConfig, ExperimentConfig, DemoConfig):
        text = model.model_fields["llm"].description or ""
        writers = [kind for kind in KINDS.values() if kind.writes_text or model is not AugPeConfig]
        assert all(kind.form in text for kind in writers), model.__name__
    # no kind's name is written by hand in the configuration's source
    for path in (REPO / "tasks" / "config").glob("*.py"):
        source = path.read_text(encoding="utf-8")
        for kind in KINDS.values():
            if kind.form != kind.name:  # a grammar (local[:MODEL_OR_PATH]), not a word of the prose (none, local)
                assert kind.form not in source, f"{path.name} spells --llm {kind.form} by hand"
        assert "local-server" not in source, path.name


def test_a_new_backend_kind_appears_in_the_help_and_the_preflight_without_touching_config():
    """A kind registered in tasks/llm/kinds.py is listed by --help, parsed by --llm and checked by its own
    preflight; nothing in tasks/config/ names it."""
    code = """
import contextlib, io, json, sys
from privseed.tasks.errors import ConfigError
from privseed.tasks.llm import kinds

def preflight(spec, secret, sends):
    if sends and not secret:
        raise ConfigError(f"--llm {spec}: echo needs --llm-secret")

kinds.KINDS["echo"] = kinds.BackendKind("echo", "echo:MODEL", "a test kind that repeats its prompt",
                                        kinds._parse_model("echo", True, "echo:x"), None, preflight=preflight)
from privseed.flows.cli import build_parser, main
from privseed.tasks.config.preflight import check_llm

out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        main(["dpkps", "--help"])
    except SystemExit:
        pass
found = {"help": "echo:MODEL" in out.getvalue().replace("\\n", "")}
try:
    check_llm("echo:x")
    found["preflight"] = "passed"
except ConfigError as error:
    found["preflight"] = str(error)
check_llm("echo:x", "block")
print(json.dumps(found))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "400"})
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"help": True, "preflight": "--llm echo:x: echo needs --llm-secret"}


#: Where a command config may be a parameter: the flows and the stages wire it; the config package defines it.
CONFIG_TAKERS = ("flows/", "tasks/stages/", "tasks/config/")


def test_no_function_below_the_stages_takes_a_command_config():
    """Below the stages a function takes its option group (tasks/config/options.py) or numbers: a parameter typed
    as a command model, or a ``cfg``/``config`` typed ``Any`` or left untyped (the same thing unnamed), is refused."""
    import ast
    import re

    commands = sorted({model.__name__ for model in COMMANDS.values()} | {"EvolutionConfig", "ReleaseConfig"})
    command = re.compile(rf"\b({'|'.join(commands)})\b")
    found = []
    for path in sorted((REPO / "tasks").rglob("*.py")):
        relative = path.relative_to(REPO).as_posix()
        if relative.startswith(CONFIG_TAKERS):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                annotation = ast.unparse(arg.annotation) if arg.annotation is not None else ""
                if command.search(annotation) or (arg.arg in ("cfg", "config") and annotation in ("", "Any")):
                    found.append(f"{relative}:{node.lineno} {node.name}({arg.arg}: {annotation or 'untyped'})")
    assert not found, "take the option group or the numbers instead:\n" + "\n".join(found)
