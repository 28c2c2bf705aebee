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

import ast
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from privseed.tasks.errors import ConfigError

if TYPE_CHECKING:
    import datasets
    import pandas as pd

#: What both refusals of an unguarded script say: the fix, and why it is needed.
MAIN_GUARD_FIX = ('put the call under `if __name__ == "__main__":` (Dask starts its workers with the spawn method, '
                  'which re-imports the main module in each of them)')


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


def _importing_main_in_a_spawned_child() -> bool:
    """Whether this process is a spawned (or forkserver) child that is re-running its parent's main module.

    ``multiprocessing.parent_process()`` cannot tell: it is set only after the child's bootstrap, and the bootstrap
    is what re-runs the main module. Two marks of that moment are checked instead: ``_inheriting``, the flag
    multiprocessing sets on the child for its bootstrap and tests itself (``spawn._check_not_importing_main``), and,
    should that private name change, the module runpy executes the script in: registered as ``__mp_main__`` while
    ``sys.modules["__main__"]`` is still the child's own bootstrap module (once the bootstrap is done, both names
    are one module again, so a worker that calls the API later is not refused)."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        return True
    rerun = sys.modules.get("__mp_main__")
    return (rerun is not None and rerun is not sys.modules.get("__main__")
            and getattr(rerun, "__name__", None) == "__mp_main__")


def _is_main_guard(test: ast.expr) -> bool:
    """Whether an ``if`` test reads ``__name__ == "__main__"`` (either way round, possibly inside ``and``)."""
    for node in ast.walk(test):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq):
            sides = {ast.dump(node.left), ast.dump(node.comparators[0])}
            if sides == {ast.dump(ast.Name("__name__", ast.Load())), ast.dump(ast.Constant("__main__"))}:
                return True
    return False


def _unguarded_main_script_line() -> int | None:
    """The line of the main script's top level that leads to this call when a spawned child would re-run that line,
    i.e. it is not under an ``if __name__ == "__main__":`` guard; None when the call is guarded, comes from a
    notebook, ``python -c`` or a package's ``__main__`` (which spawn does not re-run), or the source cannot be read
    (then the child's own check, :func:`_importing_main_in_a_spawned_child`, still refuses)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    spec_name = getattr(getattr(main, "__spec__", None), "name", None)
    # the cases spawn.get_preparation_data / _fixup_main_* leave alone
    if main is None or path is None or not str(path).endswith(".py") or \
            (spec_name is not None and (spec_name == "__main__" or spec_name.endswith(".__main__"))):
        return None
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and not (frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:
        return None
    line = frame.f_lineno
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_guard(node.test) and node.body and \
                node.body[0].lineno <= line <= (node.body[-1].end_lineno or node.body[-1].lineno):
            return None
    return line


def _refuse_in_a_spawned_child() -> None:
    """Refuse at once in a worker that is re-running the user's script: starting anything there (a Prefect server,
    a LocalCluster) ends in multiprocessing's "bootstrapping phase" error and hundreds of lines."""
    if _importing_main_in_a_spawned_child():
        raise ConfigError(f"privseed.dpkps was called while a worker process re-imported your script: "
                          f"{MAIN_GUARD_FIX}")


def _refuse_unguarded_main(dask_address: str | None) -> None:
    """Refuse, before anything starts, a run whose LocalCluster workers would run the call again: each spawned
    worker re-runs the main script's unguarded top level (:func:`_refuse_in_a_spawned_child` would stop it there,
    but only after this process had started its Prefect server and cluster)."""
    if dask_address:
        return  # the workers are another machine's processes: nothing re-runs this script
    line = _unguarded_main_script_line()
    if line is None:
        return
    import dask

    if dask.config.get("distributed.worker.multiprocessing-method", "spawn") == "fork":
        return  # forked workers inherit this process; they do not re-run the script
    script = os.path.basename(str(getattr(sys.modules["__main__"], "__file__", "")))
    raise ConfigError(f"privseed.dpkps is called at line {line} of {script}, which every Dask worker would run "
                      f"again: {MAIN_GUARD_FIX}")


def dpkps(data: pd.DataFrame | datasets.Dataset | str | os.PathLike[str], labels: Sequence[Any] | None = None,
          out: str | os.PathLike[str] | None = None, **options: Any) -> Release:
    """Run DP-KPS on ``data`` and publish the release at ``out``; returns the :class:`Release`.

    ``data``: a DataFrame or a ``datasets.Dataset`` with a text and a label column (``text_column``,
    ``label_column``), or a Parquet, CSV or JSON Lines path. ``labels``: the declared label set (public; never read
    from the data), required unless a dataset's label column is a ClassLabel (its positions are then the labels) or
    ``labels_file`` is given. ``options``: fields of DpKpsConfig, e.g. ``llm="none"``, ``eps_voc=1.0``,
    ``per_class=20``. A bad option or input raises a ``privseed.tasks.errors.PrivseedError`` before anything runs;
    so does a call from a script's top level outside ``if __name__ == "__main__":``, which the LocalCluster's
    spawned workers would run again (a ``ConfigError`` naming the line).
    """
    _refuse_in_a_spawned_child()  # first, before any import: nothing may start in such a child
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
        _refuse_unguarded_main(cfg.dask_address)
        preflight.check(cfg)
        with offline_defaults():
            from privseed.flows.dpkps import dpkps_flow

            manifest = dpkps_flow(cfg)
    return Release(str(out), json.loads(json.dumps(manifest, default=str)))
