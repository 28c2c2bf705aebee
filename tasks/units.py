"""Work units of the private corpus: where a stage's map step starts, planned from storage, not from workers.

A unit is a shard URI and a run of that shard's Parquet row groups. It is small and picklable: a URI, a few
integers and the column names. Only units enter the Dask graph; each worker opens its unit from storage and
streams it in record batches, so no private row passes through the driver or the scheduler, and the memory
of both stays flat in the corpus size. The same unit is re-read by every pass that needs it (storage is the
source of truth, not worker memory), which is also what makes a retried unit safe.

Planning reads Parquet footers only (row-group sizes), never rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from tasks import storage
from tasks.corpus import list_shards, validate_corpus_frame
from tasks.errors import CorpusError, StorageError

#: Rows per unit the planner aims at: large enough that per-task overhead is negligible, small enough that a
#: retried unit repeats little work and that many workers all get work.
DEFAULT_UNIT_ROWS = 50_000
#: Rows per record batch a unit is streamed in (bounds a worker's memory per unit).
DEFAULT_BATCH_ROWS = 8_192


@dataclass(frozen=True)
class WorkUnit:
    """Row groups ``row_groups`` of the Parquet shard ``uri``. ``rows`` is the footer's row count (public to
    the operator only: it is never logged next to anything released)."""

    uri: str
    row_groups: tuple[int, ...]
    rows: int

    def __repr__(self) -> str:
        first, last = self.row_groups[0], self.row_groups[-1]
        return f"WorkUnit({self.uri!r}, row groups {first}-{last})"


def plan_units(data: str, storage_options: Mapping[str, Any] | None = None, *,
               unit_rows: int = DEFAULT_UNIT_ROWS) -> list[WorkUnit]:
    """The units of the corpus at ``data`` (file, folder or shard prefix): each shard's row groups, grouped in
    order into runs of about ``unit_rows`` rows (a row group is never split). Stable for a given corpus."""
    if unit_rows < 1:
        raise ValueError("unit_rows must be >= 1")
    units: list[WorkUnit] = []
    for uri in list_shards(data, storage_options):
        sizes = row_group_sizes(uri, storage_options)
        start, acc = 0, 0
        for i, n in enumerate(sizes):
            acc += n
            if acc >= unit_rows:
                units.append(WorkUnit(uri, tuple(range(start, i + 1)), acc))
                start, acc = i + 1, 0
        if start < len(sizes):
            units.append(WorkUnit(uri, tuple(range(start, len(sizes))), acc))
    return units


def row_group_sizes(uri: str, storage_options: Mapping[str, Any] | None = None) -> list[int]:
    """Rows per row group of one shard, from its footer."""
    metadata = _metadata(uri, storage_options)
    return [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]


def _metadata(uri: str, storage_options: Mapping[str, Any] | None) -> pq.FileMetaData:
    fs, inner = storage.filesystem(uri, storage_options)

    def read() -> pq.FileMetaData:
        with fs.open(inner, "rb") as handle:
            return pq.ParquetFile(handle).metadata

    return _read(read, uri)


def read_unit(unit: WorkUnit, text_column: str = "text", label_column: str = "label",
              storage_options: Mapping[str, Any] | None = None, *,
              batch_rows: int = DEFAULT_BATCH_ROWS) -> Iterator[pd.DataFrame]:
    """Stream one unit as validated frames with exactly the columns ``text`` and ``label`` (as
    ``tasks.corpus.read_shard`` returns them), ``batch_rows`` rows at a time.

    A transient storage failure (throttling, a dropped connection) raises ``StorageError`` (transient: the unit
    is retried); a deterministic one (missing shard, not Parquet, a missing column) raises ``CorpusError``
    naming the shard."""
    fs, inner = storage.filesystem(unit.uri, storage_options)

    def open_file() -> tuple[Any, pq.ParquetFile]:
        handle = fs.open(inner, "rb")
        return handle, pq.ParquetFile(handle)

    handle, parquet = _read(open_file, unit.uri)
    try:
        missing = [c for c in (text_column, label_column) if c not in parquet.schema_arrow.names]
        if missing:
            raise CorpusError(f"shard {unit.uri} has no column {', '.join(map(repr, missing))}; its columns are "
                              f"{parquet.schema_arrow.names} (set --text-column / --label-column)")
        batches = parquet.iter_batches(batch_size=batch_rows, row_groups=list(unit.row_groups),
                                       columns=[text_column, label_column])
        while True:
            batch = _read(lambda: next(batches, None), unit.uri)
            if batch is None:
                return
            frame = batch.to_pandas()
            yield validate_corpus_frame(frame, unit.uri, text_column, label_column)
    finally:
        handle.close()


def _read(action: Any, uri: str) -> Any:
    """One storage read of a shard, its failure classified: missing or malformed -> CorpusError (deterministic,
    names the shard); anything the network or the store says -> StorageError (transient)."""
    try:
        return action()
    except FileNotFoundError as exc:
        raise CorpusError(f"shard not found: {uri}") from exc
    except PermissionError as exc:
        raise CorpusError(f"shard {uri}: permission denied ({exc})") from exc
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise CorpusError(f"unreadable Parquet shard {uri}: {exc}") from exc
    except CorpusError:
        raise
    except Exception as exc:  # OSError, botocore/aiohttp errors: the store, not the data
        raise StorageError(f"reading shard {uri} failed: {type(exc).__name__}: {exc}") from exc


def units_rows(units: Sequence[WorkUnit]) -> int:
    """Total rows of ``units`` (from footers; for the operator's progress bars only)."""
    return sum(u.rows for u in units)
