"""Work units of the private corpus: where a stage's map step starts, planned from storage, not from workers.

A unit is a shard URI and a run of that shard's Parquet row groups. It is small and picklable: a URI, a few
integers and the column names. Only units enter the Dask graph; each worker opens its unit from storage and
streams it in record batches, so no private row passes through the driver or the scheduler, and the memory
of both stays flat in the corpus size. The same unit is re-read by every pass that needs it (storage is the
source of truth, not worker memory), which is also what makes a retried unit safe.

Planning reads Parquet footers only (row-group sizes and the schema), never rows.

A pass over the corpus is ``map_reduce_units``: one task per unit on the workers, each streaming its unit into a
small partial result (a histogram, a sketch sum), the partials combined in a fixed tree on the cluster, and
only the final combination brought to the caller. A unit that fails with a transient error (a throttled or
dropped storage read) is read again from the start, up to ``UNIT_ATTEMPTS`` times; a deterministic error fails
the pass at once, naming the shard.
"""

from __future__ import annotations

import functools
import logging
import operator
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, TypeVar

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from privseed.tasks import storage
from privseed.tasks.data.corpus import (TEXT_FORMAT_NAMES, input_format, list_shards, not_parquet_hint,
                                        validate_corpus_frame)
from privseed.tasks.errors import CorpusError, StorageError, is_transient

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Rows per unit the planner aims at: large enough that per-task overhead is negligible, small enough that a
#: retried unit repeats little work and that many workers all get work.
DEFAULT_UNIT_ROWS = 50_000
#: Rows per record batch a unit is streamed in (bounds a worker's memory per unit).
DEFAULT_BATCH_ROWS = 8_192
#: Reads of a unit before a transient failure fails the pass (the first read and two retries), and the pauses
#: between them.
UNIT_ATTEMPTS = 3
UNIT_RETRY_DELAYS_S = (1.0, 4.0)
#: Partials combined by one task of the reduction tree.
REDUCE_FAN_IN = 8


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
    order into runs of about ``unit_rows`` rows (a row group is never split; row groups without rows make no
    unit). Stable for a given corpus."""
    if unit_rows < 1:
        raise ValueError("unit_rows must be >= 1")
    units: list[WorkUnit] = []
    for uri in list_shards(data, storage_options):
        if input_format(uri) != "parquet":
            units += _text_units(uri, None, storage_options)
            continue
        units += _shard_units(uri, row_group_sizes(uri, storage_options), unit_rows)
    return units


@dataclass(frozen=True)
class CorpusPlan:
    """The work units of a corpus and what its footers say about it: whether every shard stores the label
    column as integers (the declared labels are then integers too, as the recipient's test split is); None for
    CSV and JSON Lines, which declare no types: the declared labels decide (all integers: integers)."""

    data: str
    units: tuple[WorkUnit, ...]
    integer_labels: bool | None

    def __repr__(self) -> str:
        return f"CorpusPlan({self.data!r}, {len(self.units)} unit(s))"


def plan_corpus(data: str, text_column: str = "text", label_column: str = "label",
                storage_options: Mapping[str, Any] | None = None, *,
                unit_rows: int | None = None) -> CorpusPlan:
    """``plan_units``, with the columns checked in every footer: a shard without the text or label column, an
    unreadable shard and an empty corpus fail here, before any row is read, naming the shard (or the corpus).
    ``unit_rows``: ``DEFAULT_UNIT_ROWS`` unless given."""
    unit_rows = DEFAULT_UNIT_ROWS if unit_rows is None else unit_rows
    if unit_rows < 1:
        raise ValueError("unit_rows must be >= 1")
    shards = list_shards(data, storage_options)
    units: list[WorkUnit] = []
    integer: bool | None = True
    for uri in shards:
        if input_format(uri) != "parquet":
            units += _text_units(uri, (text_column, label_column), storage_options)
            integer = None
            continue
        metadata = _metadata(uri, storage_options)
        schema = _read(metadata.schema.to_arrow_schema, uri)
        missing = [c for c in (text_column, label_column) if c not in schema.names]
        if missing:
            raise CorpusError(f"shard {uri} has no column {', '.join(map(repr, missing))}; its columns are "
                              f"{schema.names} (set --text-column / --label-column)")
        integer = None if integer is None else integer and pa.types.is_integer(schema.field(label_column).type)
        units += _shard_units(uri, [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)],
                              unit_rows)
    if not units:
        raise CorpusError(f"the corpus at {data!r} is empty (no rows in {len(shards)} shard(s))")
    return CorpusPlan(data, tuple(units), integer)


def _shard_units(uri: str, sizes: Sequence[int], unit_rows: int) -> list[WorkUnit]:
    """One shard's row groups grouped in order into runs of about ``unit_rows`` rows; empty runs are dropped."""
    units: list[WorkUnit] = []
    start, acc = 0, 0
    for i, n in enumerate(sizes):
        acc += n
        if acc >= unit_rows:
            units.append(WorkUnit(uri, tuple(range(start, i + 1)), acc))
            start, acc = i + 1, 0
    if start < len(sizes) and acc > 0:
        units.append(WorkUnit(uri, tuple(range(start, len(sizes))), acc))
    return units


def _text_units(uri: str, columns: Sequence[str] | None,
                storage_options: Mapping[str, Any] | None) -> list[WorkUnit]:
    """A CSV or JSON Lines file as one work unit. Such a file has no footer: it is read once here, on the planning
    side, to check its columns and count its rows (nothing is kept); a large corpus plans faster as Parquet."""
    rows = 0
    for batch in _text_batches(uri, columns, storage_options):
        rows += batch.num_rows
    return [WorkUnit(uri, (0,), rows)] if rows else []


def _text_batches(uri: str, columns: Sequence[str] | None, storage_options: Mapping[str, Any] | None,
                  batch_rows: int = DEFAULT_BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """A CSV or JSON Lines file's ``columns`` (all when None), streamed in record batches; a missing column or an
    unparsable file is a CorpusError naming the file, the columns read as text (CSV declares no types)."""
    import pyarrow.csv as pa_csv
    import pyarrow.json as pa_json

    fmt = input_format(uri)
    fs, inner = storage.filesystem(uri, storage_options)
    handle = _read(lambda: fs.open(inner, "rb"), uri)
    try:
        if not _read(lambda: handle.read(4096), uri).strip():
            return  # an empty file: no rows
        handle.seek(0)
        try:
            if fmt == "csv":
                reader = pa_csv.open_csv(handle, convert_options=pa_csv.ConvertOptions(
                    column_types={column: pa.string() for column in columns or ()}))
            else:
                reader = pa_json.open_json(handle)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            if "Empty CSV file" in str(exc):
                return
            raise CorpusError(f"unreadable {TEXT_FORMAT_NAMES[fmt]} file {uri}: {exc}") from exc
        names = reader.schema.names
        missing = [c for c in columns or () if c not in names]
        if missing:
            raise CorpusError(f"shard {uri} has no column {', '.join(map(repr, missing))}; its columns are "
                              f"{names} (set --text-column / --label-column)")
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                return
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise CorpusError(f"unreadable {TEXT_FORMAT_NAMES[fmt]} file {uri}: {exc}") from exc
            if columns:
                batch = batch.select(list(columns))
            for start in range(0, batch.num_rows, batch_rows):
                yield batch.slice(start, batch_rows)
    finally:
        handle.close()


def row_group_sizes(uri: str, storage_options: Mapping[str, Any] | None = None) -> list[int]:
    """Rows per row group of one shard, from its footer."""
    metadata = _metadata(uri, storage_options)
    return [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]


def _metadata(uri: str, storage_options: Mapping[str, Any] | None) -> pq.FileMetaData:
    fs, inner = storage.filesystem(uri, storage_options)

    def read() -> pq.FileMetaData:
        with fs.open(inner, "rb") as handle:
            try:
                return pq.ParquetFile(handle).metadata
            except pa.ArrowInvalid as exc:
                handle.seek(0)
                raise CorpusError(f"unreadable Parquet shard {uri}: {exc}"
                                  f"{not_parquet_hint(uri, handle.read(4096))}") from exc

    return _read(read, uri)


def read_unit(unit: WorkUnit, text_column: str = "text", label_column: str = "label",
              storage_options: Mapping[str, Any] | None = None, *,
              batch_rows: int = DEFAULT_BATCH_ROWS) -> Iterator[pd.DataFrame]:
    """Stream one unit as validated frames with exactly the columns ``text`` and ``label`` (as
    ``privseed.tasks.data.corpus.read_shard`` returns them), ``batch_rows`` rows at a time.

    A transient storage failure (throttling, a dropped connection) raises ``StorageError`` (transient: the unit
    is retried); a deterministic one (missing shard, not Parquet, a missing column) raises ``CorpusError``
    naming the shard."""
    if input_format(unit.uri) != "parquet":
        for batch in _text_batches(unit.uri, (text_column, label_column), storage_options, batch_rows):
            yield validate_corpus_frame(batch.to_pandas(), unit.uri, text_column, label_column)
        return
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
    except OSError as exc:
        if _raised_by_arrow(exc):  # Arrow's decoder on bytes it did read: a corrupt page, the same every time
            raise CorpusError(f"unreadable Parquet shard {uri}: {exc}") from exc
        raise StorageError(f"reading shard {uri} failed: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:  # botocore/aiohttp errors: the store, not the data
        raise storage.classified(exc, f"reading shard {uri} failed") from exc


def _raised_by_arrow(exc: OSError) -> bool:
    """Whether Arrow itself raised ``exc`` (a plain OSError from its status check, e.g. "Couldn't deserialize
    thrift"), rather than passing on an error the file object raised while reading from storage (which keeps its
    own class and has the file object's frame innermost in its traceback)."""
    if type(exc) is not OSError or exc.__traceback__ is None:
        return False
    innermost = exc.__traceback__
    while innermost.tb_next is not None:
        innermost = innermost.tb_next
    return "pyarrow" in PurePath(innermost.tb_frame.f_code.co_filename).parts

def units_rows(units: Sequence[WorkUnit]) -> int:
    """Total rows of ``units`` (from footers; for the operator's progress bars only)."""
    return sum(u.rows for u in units)


# ---------------------------------------------------------------------------------------------------
# A pass over the units: map on the workers, reduce in a tree on the cluster
# ---------------------------------------------------------------------------------------------------

def run_unit(fn: Callable[..., T], unit: WorkUnit, *args: Any) -> T:
    """``fn(unit, *args)``, read again from the start after a transient failure, up to ``UNIT_ATTEMPTS`` reads
    (``fn`` keeps nothing between attempts: a unit's partial result is built from scratch by each read)."""
    for attempt in range(1, UNIT_ATTEMPTS + 1):
        try:
            return fn(unit, *args)
        except Exception as exc:
            if attempt == UNIT_ATTEMPTS or not is_transient(exc):
                raise
            # The unit (a shard URI and row groups) and the error's class are public; the message may be long.
            log.warning("%r: %s, reading the unit again (attempt %d of %d)", unit, type(exc).__name__, attempt + 1,
                        UNIT_ATTEMPTS)
            time.sleep(UNIT_RETRY_DELAYS_S[min(attempt, len(UNIT_RETRY_DELAYS_S)) - 1])
    raise AssertionError("unreachable")


def tree_reduce(items: Iterable[T], combine: Callable[[list[T]], T], fan_in: int = REDUCE_FAN_IN) -> T:
    """Combine ``items`` in a tree fixed by their order: groups of ``fan_in`` consecutive items, then groups of
    those results, and so on. Items are consumed as they come (at most ``fan_in`` per level are held), and the
    same items always meet in the same groups, so a float sum comes out bit for bit the same whether the tree
    runs in-process or as futures on a cluster."""
    if fan_in < 2:
        raise ValueError("fan_in must be >= 2")
    levels: list[list[T]] = []

    def push(depth: int, item: T) -> None:
        while len(levels) <= depth:
            levels.append([])
        levels[depth].append(item)
        if len(levels[depth]) == fan_in:
            group, levels[depth] = levels[depth], []
            push(depth + 1, combine(group))

    for item in items:
        push(0, item)
    depth = 0
    while depth < len(levels):
        group, levels[depth] = levels[depth], []
        if group:
            if depth == len(levels) - 1 and len(group) == 1:
                return group[0]
            push(depth + 1, group[0] if len(group) == 1 else combine(group))
        depth += 1
    raise ValueError("nothing to reduce: no work units")


def add_parts(parts: list[T]) -> T:
    """``combine`` for parts that add up (arrays, counts, ``+``-able statistics; lists concatenate in unit order)."""
    return functools.reduce(operator.add, parts)


def map_reduce_units(fn: Callable[..., T], units: Sequence[Any], combine: Callable[[list[T]], T], *args: Any,
                     on_done: Callable[[int, int], None] | None = None, affinity: bool = False) -> T:
    """``combine`` over ``fn(unit, *args)`` for every unit (``tree_reduce``), each unit run by ``run_unit``.
    A unit is a ``WorkUnit`` or an item that carries one (its repr names the shard, never data).

    On the cluster of the running flow (``privseed.tasks.data.cluster.current_client``): the arguments are scattered
    once to
    every worker (the graph holds the units and a reference to them, never data), one task per unit, the
    reduction tree as tasks on the partials where they lie, and only the root comes back. Without a cluster,
    in-process in the same tree. ``on_done(done, total)`` is called as units finish (for the operator's
    progress: unit counts only). ``affinity`` runs unit i on the same worker at every call (the i-th of the
    sorted workers, another one if it is gone), so what a worker keeps in memory for a unit between calls (Aug-PE
    and SecPE keep its embeddings for the rounds) is found again."""
    from privseed.tasks.data.cluster import current_client

    if not units:
        raise ValueError("nothing to reduce: no work units")
    client = current_client()
    if client is None:
        def mapped() -> Iterator[T]:
            for done, unit in enumerate(units, start=1):
                part = run_unit(fn, unit, *args)
                if on_done is not None:
                    on_done(done, len(units))
                yield part

        return tree_reduce(mapped(), combine)

    from distributed import as_completed

    shared = [client.scatter(a, broadcast=True, hash=False) for a in args]
    if affinity:
        workers = sorted(client.scheduler_info()["workers"])
        leaves = [client.submit(run_unit, fn, unit, *shared, workers=[workers[i % len(workers)]],
                                allow_other_workers=True, pure=False) for i, unit in enumerate(units)]
    else:
        leaves = client.map(run_unit, [fn] * len(units), list(units), *[[a] * len(units) for a in shared],
                            pure=False)
    root = tree_reduce(leaves, lambda group: client.submit(combine, group, pure=False))
    try:
        for done, future in enumerate(as_completed(leaves), start=1):
            if future.status == "error":
                future.result()  # raises the unit's own error (a CorpusError naming its shard, ...)
            if on_done is not None:
                on_done(done, len(units))
        return root.result()
    finally:
        client.cancel([*leaves, root])
        del leaves, root, shared
