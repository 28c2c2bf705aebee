"""Every benchmark script imports: a benchmark is run by hand, rarely, so a renamed function would otherwise break
it unnoticed (generation_release_summary.py imported two names from modules that no longer defined them)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.name)
def test_the_benchmark_script_imports(script: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(script.parent))  # as `python benchmarks/x.py` runs it: siblings importable
    spec = importlib.util.spec_from_file_location(f"benchmark_{script.stem}", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # runs its imports and definitions; main() is behind __name__ == "__main__"
