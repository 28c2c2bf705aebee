"""The house's floors, read from the source: each concept folder of tasks/ imports only the folders named for it
below, and no module imports itself back through others. Every import counts -- at a module's top and inside a
function (an import deferred for start-up time is still an arrow) -- except those under ``if TYPE_CHECKING:``,
which never run. docs/architecture.md draws the same map."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TASKS = REPO / "tasks"
#: The ground floor: tasks/'s own modules (errors, jsonable, storage, _runtime), below every folder.
GROUND = "ground"

#: Each folder and the folders it may import, lowest floor first. A folder not listed here fails the test: say
#: where a new one sits before it gets code.
ALLOWED: dict[str, set[str]] = {
    GROUND: set(),
    "quality": {GROUND},
    "dp": {GROUND},
    "data": {GROUND, "quality", "dp"},
    "llm": {GROUND, "quality", "data"},
    "seeds": {GROUND, "dp", "data"},
    "pe": {GROUND, "quality", "dp", "data"},
    "generation": {GROUND, "quality", "dp", "data", "llm"},
    "config": {GROUND, "quality", "dp", "data", "llm", "seeds", "generation"},
    "evaluation": {GROUND, "quality", "dp", "data", "llm", "seeds", "pe", "generation", "config"},
    "stages": {GROUND, "quality", "dp", "data", "llm", "seeds", "pe", "generation", "config", "evaluation"},
    "audit": {GROUND, "dp", "data", "seeds", "pe", "config", "stages"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["privseed", *parts])


MODULES = {module_name(path): path for path in sorted(TASKS.rglob("*.py"))}


def folder(module: str) -> str:
    """The folder of a tasks module: its first part under privseed.tasks, or the ground floor for tasks/'s own."""
    parts = module.split(".")
    if len(parts) < 3:
        return GROUND
    return parts[2] if f"privseed.tasks.{parts[2]}" in MODULES and (TASKS / parts[2]).is_dir() else GROUND


def _type_checking_only(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    return skipped


def imported_modules(path: Path) -> set[str]:
    """The tasks modules ``path`` imports, at any depth (``from privseed.tasks.x import y`` is privseed.tasks.x.y
    when that is a module, else privseed.tasks.x)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = _type_checking_only(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("privseed.tasks"):
            targets = [f"{node.module}.{alias.name}" for alias in node.names]
            targets = [t if t in MODULES else node.module for t in targets]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names if alias.name.startswith("privseed.tasks")]
        for target in targets:
            while target not in MODULES and target.count(".") > 1:
                target = target.rsplit(".", 1)[0]
            if target in MODULES and target != "privseed.tasks":
                found.add(target)
    return found


GRAPH = {module: imported_modules(path) - {module} for module, path in MODULES.items()}


@pytest.mark.parametrize("module", sorted(MODULES), ids=lambda m: m.removeprefix("privseed.tasks."))
def test_a_module_imports_only_the_floors_below_its_folder(module):
    own = folder(module)
    assert own in ALLOWED, f"{module}: folder {own!r} has no floor in ALLOWED (tests/test_layering.py)"
    for target in sorted(GRAPH[module]):
        other = folder(target)
        assert other == own or other in ALLOWED[own], (
            f"{module} imports {target}: {own}/ may import {sorted(ALLOWED[own])} (docs/architecture.md); move "
            "the shared piece down a floor instead of reaching up")


def test_no_import_cycle_between_modules():
    """Tarjan's strongly connected components over every import, deferred ones included."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in GRAPH[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in GRAPH:
        if node not in index:
            visit(node)
    assert not cycles, f"import cycles: {cycles}"


def test_the_floors_themselves_have_no_cycle():
    for name, allowed in ALLOWED.items():
        for other in allowed:
            assert name not in ALLOWED[other], f"{name} and {other} may import each other"


def test_every_folder_of_tasks_has_a_floor():
    folders = {path.name for path in TASKS.iterdir() if (path / "__init__.py").is_file()}
    assert folders <= set(ALLOWED), f"folders without a floor: {sorted(folders - set(ALLOWED))}"
