"""privseed: differentially private seeds for LLM-written synthetic text corpora.

The installed package is ``privseed``; the repository keeps the pipeline's two halves as top-level folders, linked
here so that one copy of the source serves both the repository layout and the import path:

- ``privseed.tasks`` (``tasks/``): the stages, each a pure function (the math) and a thin Prefect task (I/O);
- ``privseed.flows`` (``flows/``): the Prefect flows that wire those tasks, and the command line.

and a small Python API for notebooks and scripts (``privseed/api.py``), imported when first used:

- ``privseed.dpkps(data, labels=..., out=..., **options) -> Release``: DP-KPS on a pandas DataFrame, a
  ``datasets.Dataset`` or a Parquet / CSV / JSON Lines path; ``options`` are the fields of ``privseed dpkps``;
- ``privseed.open_release(path) -> Release``: a published release folder; ``privseed.demo_corpus()``: the bundled
  DBpedia-14 sample as a DataFrame;
- ``Release.to_pandas()`` (the synthetic rows, checksums verified) and ``Release.to_datasets()`` (a
  ``datasets.Dataset``, through the release's dataset card); ``.rows``, ``.epsilon``, ``.delta``, ``.manifest``.

Importing ``privseed`` imports nothing heavy and changes no process-wide setting.
"""

import re as _re
from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version
from pathlib import Path as _Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from privseed.api import Release, demo_corpus, dpkps, open_release


def _source_version() -> str:
    """The version of the installed distribution, or, in a bare checkout that was never installed (``PYTHONPATH=.``),
    the one pyproject.toml declares: pyproject.toml stays the one source either way."""
    try:
        return _version("privseed")
    except _PackageNotFoundError:
        pyproject = _Path(__file__).resolve().parents[1] / "pyproject.toml"
        found = _re.search(r'(?m)^version\s*=\s*"([^"]+)"', pyproject.read_text()) if pyproject.is_file() else None
        return f"{found.group(1)}+source" if found else "0+unknown"


#: The installed distribution's version (pyproject.toml is its one source).
__version__: str = _source_version()

__all__ = ["Release", "demo_corpus", "dpkps", "open_release", "__version__"]


def __getattr__(name: str) -> Any:
    """The API's names, imported on first use (``import privseed`` stays light)."""
    if name in ("Release", "demo_corpus", "dpkps", "open_release"):
        from privseed import api

        return getattr(api, name)
    raise AttributeError(f"module 'privseed' has no attribute {name!r}")
