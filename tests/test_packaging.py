"""What a user installs: the wheel holds every module and data file of the source tree, and ``privseed`` imports
with a version from a bare checkout that was never installed."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The installed package is privseed; its tasks/ and flows/ are the repository's top-level folders (privseed/'s links).
PACKAGE_FOLDERS = {"tasks": "privseed/tasks", "flows": "privseed/flows", "privseed": "privseed"}
# Files that are the repository's, not the package's.
NOT_SHIPPED_SUFFIXES = (".pyc",)


def source_files() -> set[str]:
    """Every tracked file under the package's folders, as its path inside the wheel."""
    tracked = subprocess.run(["git", "ls-files", *PACKAGE_FOLDERS], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    inside = set()
    for path in tracked:
        top, _, rest = path.partition("/")
        if rest and not path.endswith(NOT_SHIPPED_SUFFIXES) and not (REPO / path).is_symlink():
            inside.add(f"{PACKAGE_FOLDERS[top]}/{rest}")
    return inside


@pytest.mark.slow
def test_the_wheel_holds_every_module_and_data_file(tmp_path):
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs the git checkout to list the source files")
    # setuptools builds in the source tree (build/, gitignored): leave it as the test found it
    build_existed = (REPO / "build").exists()
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                               "-w", str(tmp_path), str(REPO)], capture_output=True, text=True, timeout=600)
    finally:
        if not build_existed:
            shutil.rmtree(REPO / "build", ignore_errors=True)
    assert done.returncode == 0, done.stderr[-2000:]
    wheel = next(tmp_path.glob("privseed-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        shipped = set(archive.namelist())
    missing = sorted(source_files() - shipped)
    assert not missing, f"the wheel lacks {len(missing)} source files, e.g. {missing[:5]}: widen " \
                        "[tool.setuptools.package-data] or packages.find in pyproject.toml"
    assert any(name.endswith(".dist-info/entry_points.txt") for name in shipped)


def test_import_from_a_bare_checkout_has_a_version(tmp_path):
    """``PYTHONPATH=checkout python -c 'import privseed'`` with no installed metadata: the version is the one
    pyproject.toml declares, marked as from source."""
    checkout = tmp_path / "checkout"
    (checkout / "privseed").mkdir(parents=True)
    shutil.copy(REPO / "privseed" / "__init__.py", checkout / "privseed" / "__init__.py")
    shutil.copy(REPO / "pyproject.toml", checkout / "pyproject.toml")
    # -S: no site-packages, so the editable install's metadata is not found; -I would drop PYTHONPATH too.
    done = subprocess.run([sys.executable, "-S", "-c", "import privseed; print(privseed.__version__)"],
                          cwd=tmp_path, env={"PYTHONPATH": str(checkout)}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    declared = next(line.split('"')[1] for line in (REPO / "pyproject.toml").read_text().splitlines()
                    if line.startswith("version ="))
    assert done.stdout.strip() == f"{declared}+source"
