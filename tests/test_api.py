"""The Python API (privseed/api.py): the README's notebook example runs as it is, `import privseed` works in a project
with its own tasks/ and flows/ packages, and a bad input is refused before anything runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import privseed
from privseed.tasks.errors import CorpusError

REPO = Path(__file__).resolve().parents[1]


def readme_example() -> str:
    """The python block that follows the README's marker comment."""
    text = (REPO / "README.md").read_text()
    after = text.split("<!-- the README example: tests/test_api.py runs this block as it is -->", 1)[1]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_DATASETS_CACHE": str(tmp_path / "hf")}


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
def test_the_readme_example_runs_and_opens_with_datasets(tmp_path):
    pytest.importorskip("datasets")
    done = subprocess.run([sys.executable, "-c", readme_example()], cwd=tmp_path, env=_env(tmp_path),
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
