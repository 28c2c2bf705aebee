"""The lint and type checks are part of the suite: ruff over the repository and mypy over tasks/ and flows/, with
the configuration in pyproject.toml ([tool.ruff], [tool.mypy]). A finding fails the test with the tool's own
report. Both tools are pinned in the `test` extra; `make lint` runs the same two commands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, check=False)


def test_ruff_finds_nothing():
    result = _run("ruff", "check", "--no-cache", "--output-format", "concise", ".")
    assert result.returncode == 0, f"ruff check . failed:\n{result.stdout}{result.stderr}"


# Slow tier: a first (cold-cache) run of mypy over tasks/ and flows/ takes about 30 s of CPU (70 s before
# pyproject.toml's follow_imports = "skip" for torch, transformers and the other thousand-module packages; a warm
# run about 8 s). `make lint` runs it directly.
@pytest.mark.slow
def test_mypy_finds_nothing():
    result = _run("mypy")
    assert result.returncode == 0, f"mypy (tasks, flows) failed:\n{result.stdout}{result.stderr}"
