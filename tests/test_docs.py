"""The docs tell the truth about themselves: the README's table of figures is what experiments/readme_table.py
writes from experiments/results/headline.toml, every relative link of the README, docs/ and experiments/results/
reaches a file and, with an #anchor, a heading of it, and no file of the repository cites a data folder outside it
(the public corpora are `$PRIVSEED_DATA_ROOT/<corpus>/...`, docs/datasets.md)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MARKDOWN = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
            *sorted((REPO / "experiments" / "results").glob("*.md"))]
# Spelled in pieces so that this file does not cite them itself.
OUTSIDE_PATHS = ("../" + "shared", "/work/" + "shared", "shared" + "/data")
SCANNED = ("README.md", "Makefile", "pyproject.toml", "docs", "tasks", "flows", "benchmarks", "experiments", "tests",
           "deployments", "infra")
TEXT_SUFFIXES = {".md", ".py", ".toml", ".yaml", ".yml", ".txt", ".html", ".csv", ".json", ".cfg", ".sh", ""}


def _readme_table():
    spec = importlib.util.spec_from_file_location("readme_table", REPO / "experiments" / "readme_table.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_table_is_what_the_script_writes():
    table = _readme_table()
    readme = (REPO / "README.md").read_text()
    assert table.rewrite(readme, table.render_table(table.load_rows())) == readme, (
        "README.md's table of figures is stale: run python experiments/readme_table.py")
    assert "python experiments/readme_table.py" in readme  # the README names the command


def test_the_table_script_escapes_cells_and_refuses_a_readme_without_markers(tmp_path):
    table = _readme_table()
    rows = [{"what": "a | b", "figure": "1\n  2", "where": ["benchmarks/x.py", "docs/x.md#y"]}]
    assert table.render_table(rows).splitlines()[2] == "| a \\| b | 1 2 | `benchmarks/x.py`, [docs/x.md](docs/x.md#y) |"
    with pytest.raises(ValueError, match="figures:start"):
        table.rewrite("no markers here", "| t |")
    bad = tmp_path / "headline.toml"
    bad.write_text('[[figure]]\nwhat = "w"\nfigure = "f"\n')
    with pytest.raises(ValueError, match="lacks where"):
        table.load_rows(bad)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text without markup, lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def _outside_fences(text: str) -> list[str]:
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in _outside_fences(path.read_text()):
        match = re.match(r"#{1,6} +(.*?) *#*$", line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def test_slug_follows_github():
    assert slug("Speed (benchmarks/bench_dp_stage.py)") == "speed-benchmarksbench_dp_stagepy"
    assert slug("`--max-tokens 128`: the first bar met with Qwen 0.5B (2026-11-25)") == (
        "--max-tokens-128-the-first-bar-met-with-qwen-05b-2026-11-25")
    assert slug("Baselines: Aug-PE, AugPE+Ṽ and SecPE") == "baselines-aug-pe-augpeṽ-and-secpe"


@pytest.mark.parametrize("page", MARKDOWN, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_reaches_its_file_and_heading(page):
    broken = []
    for line in _outside_fences(page.read_text()):
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            if not path.exists():
                broken.append(f"{target}: no such file")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{target}: no heading with that anchor in {path.name}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_no_file_cites_a_data_folder_outside_the_repository():
    citing = []
    for name in SCANNED:
        root = REPO / name
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        for path in files:
            if path.suffix not in TEXT_SUFFIXES or "__pycache__" in path.parts:
                continue
            try:
                text = path.read_text()
            except UnicodeDecodeError:
                continue
            citing += [f"{path.relative_to(REPO)}: {needle}" for needle in OUTSIDE_PATHS if needle in text]
    assert not citing, "cite $PRIVSEED_DATA_ROOT/<corpus>/... (docs/datasets.md) instead: " + "; ".join(citing)
