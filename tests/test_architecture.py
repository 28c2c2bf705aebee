"""The layering rules of flows/__init__.py, read from the source: flows do not import flows (except a composing
flow, which imports other flows' @flow functions only), flows define no Prefect task, and tasks/ never imports
flows/."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: Composing flows and the flows they run as subflows (by their @flow functions).
SUBFLOWS = {
    "flows/experiment.py": {"privseed.flows.dpkps": {"dpkps_flow"},
                            "privseed.flows.evolution": {"augpe_flow", "secpe_flow"}},
    "flows/demo.py": {"privseed.flows.dpkps": {"dpkps_flow"}, "privseed.flows.evaluate": {"evaluate"}},
    "flows/canary.py": {"privseed.flows.dpkps": {"dpkps_flow"}},
}
#: The module that registers every flow's subcommand.
CLI = "flows/cli.py"


#: The flows' package as it is imported (flows/ is installed as privseed.flows).
FLOWS = "privseed.flows"


def _is_flows(module: str) -> bool:
    return module == FLOWS or module.startswith(FLOWS + ".")


def _imports(path: Path) -> list[tuple[str, set[str]]]:
    """(module, names imported from it) for every import of a flows module in ``path``, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and _is_flows(node.module):
            if node.module == FLOWS:  # `from privseed.flows import evaluate`
                for alias in node.names:
                    found.append((f"{FLOWS}.{alias.name}", {"*"}))
            else:
                found.append((node.module, {alias.name for alias in node.names}))
        elif isinstance(node, ast.Import):
            found.extend((alias.name, {"*"}) for alias in node.names if _is_flows(alias.name))
    return found


def _files(folder: str) -> list[Path]:
    return sorted((REPO / folder).rglob("*.py"))


@pytest.mark.parametrize("path", _files("flows"), ids=lambda p: p.name)
def test_flows_import_only_the_subflows_they_compose(path):
    relative = path.relative_to(REPO).as_posix()
    if relative == CLI:
        return  # imports every flow module by name (importlib), to register its subcommand
    allowed = SUBFLOWS.get(relative, {})
    for module, names in _imports(path):
        assert module in allowed, f"{relative} imports {module}: flows do not import flows (flows/__init__.py)"
        assert names <= allowed[module], (f"{relative} imports {sorted(names - allowed[module])} from {module}; "
                                          f"a composing flow imports @flow functions only")


@pytest.mark.parametrize("path", _files("tasks"), ids=lambda p: p.relative_to(REPO / "tasks").as_posix())
def test_tasks_never_import_flows(path):
    relative = path.relative_to(REPO).as_posix()
    modules = {module for module, _ in _imports(path)}
    assert not modules, f"{relative} imports {sorted(modules)}: tasks/ never depends on flows/"


def test_the_subflows_named_above_are_flows():
    import importlib

    from prefect import Flow

    for modules in SUBFLOWS.values():
        for module, names in modules.items():
            for name in names:
                assert isinstance(getattr(importlib.import_module(module), name), Flow), f"{module}.{name}"


TASK_DECORATORS = {"task", "private_stage", "public_stage"}


@pytest.mark.parametrize("path", _files("flows"), ids=lambda p: p.name)
def test_flows_define_no_tasks(path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
                assert name not in TASK_DECORATORS, (f"{path.name}: {node.name} is a Prefect task; tasks live in "
                                                     "tasks/stages/")
