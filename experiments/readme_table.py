"""Write the README's table of measured figures from experiments/results/headline.toml.

    python experiments/readme_table.py            # rewrite the table in README.md
    python experiments/readme_table.py --check    # exit 1 if README.md's table is not what this writes

The rows are data (`[[figure]]` tables with `what`, `figure` and `where`); the table is everything between the
README's `<!-- figures:start -->` and `<!-- figures:end -->` markers, and nothing else of the README is touched.
`where` lists the files a figure comes from: a Markdown file becomes a link (with its `#anchor`, if given), any
other path is shown as code. tests/test_docs.py fails when the README's table differs from what this writes.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
HEADLINE = REPO / "experiments" / "results" / "headline.toml"
START, END = "<!-- figures:start -->", "<!-- figures:end -->"


def load_rows(path: Path = HEADLINE) -> list[dict]:
    """The `[[figure]]` rows of the headline file, each with its three fields checked."""
    rows = tomllib.loads(path.read_text()).get("figure", [])
    for number, row in enumerate(rows, 1):
        missing = {"what", "figure", "where"} - set(row)
        if missing:
            raise ValueError(f"{path.name}: figure {number} lacks {', '.join(sorted(missing))}")
        if not isinstance(row["where"], list) or not row["where"]:
            raise ValueError(f"{path.name}: figure {number}: `where` must be a non-empty list of paths")
    return rows


def _cell(text: str) -> str:
    """One table cell: a pipe would end the cell early, so it is escaped; whitespace is one line."""
    return " ".join(text.split()).replace("|", "\\|")


def _source(path: str) -> str:
    """A source as the table shows it: a Markdown file as a link from the README, anything else as code."""
    file = path.split("#", 1)[0]
    return f"[{file}]({path})" if file.endswith(".md") else f"`{file}`"


def render_table(rows: list[dict]) -> str:
    lines = ["| what | figure | where |", "|---|---|---|"]
    lines += [f"| {_cell(row['what'])} | {_cell(row['figure'])} | {', '.join(_source(p) for p in row['where'])} |"
              for row in rows]
    return "\n".join(lines)


def rewrite(readme: str, table: str) -> str:
    """``readme`` with the text between the markers replaced by ``table`` (the markers stay)."""
    if readme.count(START) != 1 or readme.count(END) != 1 or readme.index(START) > readme.index(END):
        raise ValueError(f"README.md needs one {START} and one {END} after it")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if README.md's table is stale")
    args = parser.parse_args(argv)
    readme = README.read_text()
    wanted = rewrite(readme, render_table(load_rows()))
    if wanted == readme:
        return 0
    if args.check:
        print("README.md's table of figures differs from experiments/results/headline.toml: "
              "run python experiments/readme_table.py", file=sys.stderr)
        return 1
    README.write_text(wanted)
    print(f"README.md: table of {len(load_rows())} figures rewritten from {HEADLINE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
