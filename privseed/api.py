"""privseed's Python API, for notebooks and scripts: run a method on a DataFrame, a file or a Hugging Face dataset,
and open what it released as pandas or as ``datasets``.

    import privseed

    release = privseed.dpkps(frame, labels=[0, 1, 2], out="release", llm="none")
    release.to_pandas()      # the synthetic rows (the manifest's parts, checksums verified)
    release.to_datasets()    # a datasets.Dataset (the release's dataset card names its parts and class names)

Every keyword of :func:`dpkps` beyond ``data``, ``labels`` and ``out`` is a field of ``DpKpsConfig`` (the options
of ``privseed dpkps``, by field name: ``eps_voc=1.0``, ``per_class=20``, ``n_workers=1``), validated before anything
runs, with the same checks of the input as the command line. A run applies privseed's offline settings
(tasks/_runtime.py) only for its duration; importing privseed sets nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import datasets
    import pandas as pd


@dataclass(frozen=True)
class Release:
    """A published release folder (local or ``s3://``) and its manifest."""

    path: str
    manifest: dict[str, Any] = field(repr=False)

    @property
    def rows(self) -> int:
        return int(self.manifest["rows"])

    @property
    def epsilon(self) -> float:
        return float(self.manifest["privacy"]["epsilon"])

    @property
    def delta(self) -> float:
        return float(self.manifest["privacy"]["delta"])

    def to_pandas(self) -> pd.DataFrame:
        """The synthetic rows, read through the manifest (every part's sha256 checked)."""
        from privseed.tasks.data.corpus import read_release

        return read_release(self.path)[1]

    def to_datasets(self, **load_dataset_kwargs: Any) -> datasets.Dataset:
        """The release's one split as a ``datasets.Dataset``: ``datasets.load_dataset(path, split="train")``, which
        reads the dataset card (README.md); ``load_dataset_kwargs`` go to it (``cache_dir=...``)."""
        import datasets

        return datasets.load_dataset(self.path, split="train", **load_dataset_kwargs)


def demo_corpus() -> pd.DataFrame:
    """The bundled demo corpus: 7,000 DBpedia-14 abstracts (CC BY-SA 3.0), columns ``text`` and ``label`` (0-13)."""
    import pandas as pd

    from privseed.flows.demo import demo_corpus_path

    return pd.read_parquet(demo_corpus_path())


def open_release(path: str | os.PathLike[str]) -> Release:
    """The release at ``path`` (its manifest read; a folder without one is refused)."""
    from privseed.tasks.data.corpus import read_manifest

    return Release(str(path), read_manifest(str(path)))


def _is_frame(data: Any) -> bool:
    return type(data).__module__.startswith("pandas") and hasattr(data, "to_parquet")


def _is_hf_dataset(data: Any) -> bool:
    return type(data).__module__.startswith("datasets") and hasattr(data, "features")


def _class_label_range(data: Any, label_column: str) -> list[str] | None:
    """The labels a Hugging Face dataset declares (a ClassLabel's positions 0..n-1): its public metadata, not data."""
    feature = data.features.get(label_column)
    names = getattr(feature, "names", None)
    return [str(i) for i in range(len(names))] if names else None


@contextmanager
def _as_path(data: Any, label_column: str) -> Iterator[str]:
    """``data`` as a path privseed's workers can read: a path as it is; a DataFrame or a Hugging Face dataset written
    to a Parquet file in a private temporary folder (mode 0700), removed when the run ends."""
    if isinstance(data, (str, os.PathLike)):
        yield str(data)
        return
    if not (_is_frame(data) or _is_hf_dataset(data)):
        raise TypeError(f"data must be a pandas DataFrame, a datasets.Dataset or a path, not {type(data).__name__}")
    folder = tempfile.mkdtemp(prefix="privseed-input-")
    try:
        path = os.path.join(folder, "corpus.parquet")
        if _is_frame(data):
            data.to_parquet(path, index=False)
        else:
            data.to_parquet(path)
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def dpkps(data: pd.DataFrame | datasets.Dataset | str | os.PathLike[str], labels: Sequence[Any] | None = None,
          out: str | os.PathLike[str] | None = None, **options: Any) -> Release:
    """Run DP-KPS on ``data`` and publish the release at ``out``; returns the :class:`Release`.

    ``data``: a DataFrame or a ``datasets.Dataset`` with a text and a label column (``text_column``,
    ``label_column``), or a Parquet, CSV or JSON Lines path. ``labels``: the declared label set (public; never read
    from the data), required unless a dataset's label column is a ClassLabel (its positions are then the labels) or
    ``labels_file`` is given. ``options``: fields of DpKpsConfig, e.g. ``llm="none"``, ``eps_voc=1.0``,
    ``per_class=20``. A bad option or input raises a ``privseed.tasks.errors.PrivseedError`` before anything runs.
    """
    from privseed.tasks.config import preflight
    from privseed.tasks._runtime import offline_defaults
    from privseed.tasks.config.commands import DpKpsConfig, validate_config

    if out is None:
        raise TypeError("dpkps() needs out=: the folder the release is written to")
    label_column = options.get("label_column", "label")
    if labels is None and options.get("labels_file") is None and _is_hf_dataset(data):
        labels = _class_label_range(data, label_column)
    with _as_path(data, label_column) as path:
        values = {**options, "data": path, "out": str(out)}
        if labels is not None:
            values["labels"] = [str(label) for label in labels]
        cfg = validate_config(DpKpsConfig, values)
        preflight.check(cfg)
        with offline_defaults():
            from privseed.flows.dpkps import dpkps_flow

            manifest = dpkps_flow(cfg)
    return Release(str(out), json.loads(json.dumps(manifest, default=str)))
