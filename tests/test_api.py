"""The Python API (privseed/api.py): the README's example runs as a script (`python example.py`), the same script
without its `if __name__ == "__main__":` guard is refused in one line before anything starts, `import privseed` works
in a project with its own tasks/ and flows/ packages, and a bad input is refused before anything runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

import privseed
from privseed.tasks.errors import CorpusError
from tests.conftest import users_environment

REPO = Path(__file__).resolve().parents[1]


def readme_example() -> str:
    """The python block that follows the README's marker comment."""
    text = (REPO / "README.md").read_text()
    after = text.split("<!-- the README example: tests/test_api.py runs this block", 1)[1]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


def unguarded(script: str) -> str:
    """``script`` as most people first write it: its ``if __name__ == "__main__":`` block at the top level."""
    guard = re.compile(r'^if __name__ == "__main__":.*\n', re.M)
    assert guard.search(script), "the README example lost its __main__ guard"
    head, body = guard.split(script, 1)
    return head + re.sub(r"^    ", "", body, flags=re.M)


def _env(tmp_path: Path) -> dict[str, str]:
    # A user's script starts its Dask workers by spawn, which re-imports the script: the suite's fork (conftest.py)
    # would hide a missing `if __name__ == "__main__":` guard.
    return {**users_environment(), "PYTHONPATH": str(REPO), "HF_DATASETS_CACHE": str(tmp_path / "hf")}


def test_import_privseed_in_a_project_with_its_own_tasks_and_flows(tmp_path):
    for name in ("tasks", "flows"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"WHO = 'the project {name}'\n")
    code = ("import tasks, flows, privseed\n"
            "from privseed.flows.cli import main\n"
            "print(tasks.WHO, '|', flows.WHO, '|', privseed.__version__, callable(privseed.dpkps))")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(tmp_path), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"the project tasks | the project flows | {privseed.__version__} True"


def test_bad_input_is_refused_before_anything_runs(tmp_path, monkeypatch):
    import tempfile

    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    frame = pd.DataFrame({"text": ["a football club", "a river"], "y": [0, 1]})
    with pytest.raises(CorpusError, match="no column 'label'"):
        privseed.dpkps(frame, labels=[0, 1], out=tmp_path / "out")
    with pytest.raises(TypeError, match="DataFrame, a datasets.Dataset or a path"):
        privseed.dpkps([("a", 0)], labels=[0], out=tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.private").exists()
    assert list((tmp_path / "tmp").iterdir()) == []  # the DataFrame's private copy is gone


@pytest.mark.slow
def test_the_readme_example_runs_as_a_script_and_opens_with_datasets(tmp_path):
    """Saved to a file and run with `python example.py`, as most people run it: the Dask workers (spawned) re-import
    it, which its __main__ guard makes harmless."""
    pytest.importorskip("datasets")
    (tmp_path / "example.py").write_text(readme_example())
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = done.stdout.strip().splitlines()[-2:]
    assert first == "280 documents, epsilon 11.0"
    assert second.startswith("14 ")
    release = privseed.open_release(tmp_path / "demo-release")
    rows = release.to_pandas()
    assert len(rows) == 280 and sorted(rows["label"].unique()) == list(range(14))
    dataset = release.to_datasets(cache_dir=str(tmp_path / "hf"))
    assert dataset.num_rows == 280 and dataset.features["label"].num_classes == 14


def test_a_hugging_face_dataset_declares_its_class_labels(tmp_path):
    """A datasets.Dataset whose label is a ClassLabel declares the labels 0..n-1 (public metadata); the run then gets
    as far as the checks of the input (here: a model file that does not exist)."""
    from privseed.tasks.errors import ConfigError

    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"text": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["sport", "nature", "music"])})
    dataset = datasets.Dataset.from_dict({"text": ["a football club", "a river", "an album"], "label": [0, 1, 2]},
                                         features=features)
    with pytest.raises(ConfigError, match="the model file /nonexistent.gguf does not exist"):
        privseed.dpkps(dataset, out=tmp_path / "out", llm="local:/nonexistent.gguf")
    with pytest.raises(ConfigError, match="no label set declared"):
        privseed.dpkps(dataset.cast_column("label", datasets.Value("int64")), out=tmp_path / "out")


def test_the_readme_example_without_its_guard_is_refused_in_one_line(tmp_path):
    """Without the guard each spawned Dask worker would re-run the script (before: exit 1 after 91 s, 847 lines,
    three Prefect servers): now the call is refused before anything starts, naming the line and the fix."""
    script = unguarded(readme_example())
    (tmp_path / "example.py").write_text(script)
    line = next(number for number, text in enumerate(script.splitlines(), 1) if "privseed.dpkps(" in text)
    started = time.monotonic()
    run = subprocess.Popen([sys.executable, "example.py"], cwd=tmp_path, env=_env(tmp_path), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = run.communicate(timeout=300)
    finally:
        run.kill()
    elapsed = time.monotonic() - started
    assert run.returncode == 1, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == (
        f"privseed.tasks.errors.ConfigError: privseed.dpkps is called at line {line} of example.py, which every Dask "
        f'worker would run again: put the call under `if __name__ == "__main__":` (Dask starts its workers with the '
        "spawn method, which re-imports the main module in each of them)")
    assert len(stderr.splitlines()) < 15 and "bootstrapping phase" not in stderr and "prefect" not in stderr.lower()
    assert stdout == "" and elapsed < 60  # the demo corpus and pandas load; no Prefect server, no cluster
    with pytest.raises(ProcessLookupError):  # nothing the script started outlives it
        os.killpg(run.pid, 0)
    assert not (tmp_path / "demo-release").exists() and not (tmp_path / "demo-release.private").exists()


SPAWN_PROBE = """
import multiprocessing
import privseed
from privseed.api import _importing_main_in_a_spawned_child

process = multiprocessing.current_process()
inheriting = getattr(process, "_inheriting", False)
process._inheriting = False  # hidden: the second mark (__mp_main__ beside the bootstrap's __main__) must suffice
fallback = _importing_main_in_a_spawned_child()
process._inheriting = inheriting
print(__name__, _importing_main_in_a_spawned_child(), fallback, flush=True)
if __name__ == "__mp_main__":
    try:
        privseed.dpkps("corpus.parquet", labels=[0, 1], out="out")
    except Exception as error:
        print(type(error).__name__, error, flush=True)


def work():
    print("after the bootstrap", _importing_main_in_a_spawned_child(), flush=True)


if __name__ == "__main__":
    child = multiprocessing.get_context("spawn").Process(target=work)
    child.start()
    child.join()
"""


def test_a_spawned_child_re_running_the_script_is_refused_there(tmp_path):
    """The child's own check (for a script the parent's check cannot read): true exactly while a spawned child
    re-runs the parent's main module as __mp_main__, false in the parent and in the same child after its bootstrap
    (multiprocessing.parent_process() is still None at that moment, so it cannot tell)."""
    (tmp_path / "probe.py").write_text(SPAWN_PROBE)
    done = subprocess.run([sys.executable, "probe.py"], cwd=tmp_path, env=_env(tmp_path), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "__main__ False False",
        "__mp_main__ True True",
        "ConfigError privseed.dpkps was called while a worker process re-imported your script: put the call under "
        '`if __name__ == "__main__":` (Dask starts its workers with the spawn method, which re-imports the main '
        "module in each of them)",
        "after the bootstrap False"]
    assert not (tmp_path / "out").exists()
