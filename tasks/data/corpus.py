"""The private corpus in, the synthetic release out.

Input: a Parquet, CSV or JSON Lines file, a folder of them, or a prefix of shards, on local disk or ``s3://``; the
format of each file is its extension's (:data:`INPUT_FORMATS`), and any other extension is refused by name.
Output: a release folder whose ``manifest.json`` is written **last**. The manifest names every file of the
release with its row count and sha256; a release is complete exactly when the manifest names it. Parts
carry the release id in their names, so publishing a new release never overwrites the files of the last
good one before the new manifest is in place.

Parts are written either by ``publish_release`` from a frame, or earlier and in parallel by whoever holds the
rows (generation shards on Dask workers, ``write_part``): then the flow holds a :class:`StagedRelease`, the
parts' small descriptors (path, rows, sha256, rows per label, the release gate's check of the part), and
``publish_release`` combines the checks, writes the documents and commits the manifest without reading a row.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import platform
import secrets
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from privseed.tasks import jsonable, storage
from privseed.tasks.data.dataset_card import dataset_card
from privseed.tasks.dp.mechanisms import INSECURE_STAMP
from privseed.tasks.errors import ConfigError, CorpusError, GateFailedError, StorageError

if TYPE_CHECKING:
    from privseed.tasks.dp.ledger import PrivacyLedger
    from privseed.tasks.quality import PartCheck, ReleaseGate

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "privseed-release/1"
SYNTHETIC_DIR = "synthetic"
RELEASES_DIR = "_releases"
#: A refused candidate goes to ``<state>/quarantine/<release id>/`` (the owner's private state).
QUARANTINE_DIR = "quarantine"
#: Where versions before issue 30 kept it, inside the release folder: refused by ``publish_release``.
LEGACY_QUARANTINE_DIR = "_quarantine"
#: Where the generation shards of a run drawn from reproducible noise write its candidate's parts:
#: ``<state>/staging/<release id>/`` (the owner's private state), never the release folder.
STAGING_DIR = "staging"


#: The input formats, by file extension. A file without an extension is read as Parquet (shards named part-0).
INPUT_FORMATS: dict[str, str] = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".jsonl": "jsonl",
                                 ".ndjson": "jsonl"}
#: What the errors list as readable.
FORMATS_TEXT = "Parquet (.parquet), CSV (.csv with a header row) or JSON Lines (.jsonl, one object per line)"


def input_format(path: str) -> str:
    """The format of one input file, by its extension; a CorpusError names any other extension."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    suffix = "." + name.rsplit(".", 1)[-1].lower() if "." in name else ""
    if not suffix:
        return "parquet"
    if suffix not in INPUT_FORMATS:
        raise CorpusError(f"{path}: privseed cannot read {suffix} files; give {FORMATS_TEXT}")
    return INPUT_FORMATS[suffix]


def sniffed_format(head: bytes) -> str | None:
    """What the first bytes of a file that is not valid Parquet look like, for the error's hint."""
    text = head.lstrip()
    if not text:
        return "an empty file"
    if text[:1] in (b"{", b"["):
        return "JSON text"
    try:
        first_line = text.decode("utf-8").splitlines()[0]
    except (UnicodeDecodeError, IndexError):
        return None
    return "CSV text" if ("," in first_line or ";" in first_line or "\t" in first_line) else "text"


def not_parquet_hint(path: str, head: bytes) -> str:
    """`` (it looks like CSV text: name it .csv)`` for a file that failed to open as Parquet, or ``""``."""
    kind = sniffed_format(head)
    if kind is None or head.startswith(b"PAR1"):
        return ""
    rename = {"CSV text": "; name it .csv", "JSON text": "; name it .jsonl (one object per line)"}.get(kind, "")
    return f" (it looks like {kind}, not Parquet{rename})"


def _known_input(path: str) -> bool:
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return "." in name and "." + name.rsplit(".", 1)[-1].lower() in INPUT_FORMATS


def list_shards(path: str, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The input files that make up ``path``, in a stable order.

    ``path`` may be one file (its extension names its format, :func:`input_format`), a folder (searched
    recursively for files of a known extension) or a prefix such as ``s3://b/data/part-``."""
    fs, inner = storage.filesystem(path, storage_options)
    try:
        if fs.isfile(inner):
            input_format(path)  # an unknown extension is refused here, naming it
            found = [inner]
        elif fs.isdir(inner):
            found = [p for p in fs.find(inner) if _known_input(p)]
        else:
            matches = [p for p in fs.glob(inner + "*") if fs.isfile(p)]
            if not matches:
                raise CorpusError(f"{path} does not exist (nor does any file whose name starts with it)")
            found = [p for p in matches if _known_input(p)]
    except PermissionError as exc:
        raise CorpusError(f"cannot list the corpus at {path!r}: permission denied ({exc})") from exc
    except CorpusError:
        raise
    except Exception as exc:  # OSError, botocore's EndpointConnectionError: the store, not the data
        raise storage.classified(exc, f"cannot reach the corpus at {path!r}") from exc
    if not found:
        raise CorpusError(f"no input files found at {path!r}: it does not exist, or it holds no {FORMATS_TEXT}")
    return [storage._unstrip(path, inner, p) if "://" in path else p for p in sorted(found)]


def read_shard(
    path: str,
    text_column: str = "text",
    label_column: str = "label",
    storage_options: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """One shard as a DataFrame with exactly the columns ``text`` and ``label``."""
    table = _read_table(path, [text_column, label_column], storage_options,
                        hint=" (set --text-column / --label-column)")
    return validate_corpus_frame(table.to_pandas(), path, text_column, label_column)


def _read_table(path: str, columns: list[str] | None, storage_options: Mapping[str, Any] | None,
                hint: str = "") -> pa.Table:
    """``columns`` (all when None) of one whole input file, or a CorpusError naming the file."""
    fmt = input_format(path)
    if fmt != "parquet":
        table = read_text_table(path, fmt, storage_options)
        names = table.column_names
    else:
        parquet = _parquet_file(path, storage_options)
        names = parquet.schema_arrow.names
    missing = [c for c in columns or () if c not in names]
    if missing:
        raise CorpusError(f"shard {path} has no column {', '.join(map(repr, missing))}; "
                          f"its columns are {names}{hint}")
    if fmt != "parquet":
        return table.select(columns) if columns else table
    try:
        return parquet.read(columns=columns)
    except (pa.ArrowInvalid, OSError) as exc:
        raise CorpusError(f"unreadable Parquet shard {path}: {exc}") from exc


def read_text_table(path: str, fmt: str, storage_options: Mapping[str, Any] | None = None) -> pa.Table:
    """A whole CSV or JSON Lines file as an Arrow table (its types inferred), or a CorpusError naming it."""
    import pyarrow.csv as pa_csv
    import pyarrow.json as pa_json

    try:
        data = storage.read_bytes(path, storage_options)
    except (FileNotFoundError, IsADirectoryError) as exc:
        raise CorpusError(f"shard not found: {path}") from exc
    if not data.strip():
        return pa.table({})
    try:
        if fmt == "csv":
            return pa_csv.read_csv(io.BytesIO(data))
        return pa_json.read_json(io.BytesIO(data))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise CorpusError(f"unreadable {TEXT_FORMAT_NAMES[fmt]} file {path}: {exc}") from exc


#: How errors name the text formats
TEXT_FORMAT_NAMES = {"csv": "CSV", "jsonl": "JSON Lines"}


def column_names(path: str, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The columns of the first shard of ``path``."""
    first = list_shards(path, storage_options)[0]
    if input_format(first) != "parquet":
        return list(read_text_table(first, input_format(first), storage_options).column_names)
    return list(_parquet_file(first, storage_options).schema_arrow.names)


def _parquet_file(path: str, storage_options: Mapping[str, Any] | None) -> pq.ParquetFile:
    """One whole shard, fetched through ``privseed.tasks.storage`` (a dropped connection or a throttled read is retried,
    then a transient StorageError) and opened as Parquet; a missing or malformed shard is a CorpusError naming it."""
    try:
        data = storage.read_bytes(path, storage_options)
    except (FileNotFoundError, IsADirectoryError) as exc:
        raise CorpusError(f"shard not found: {path}") from exc
    except PermissionError as exc:
        raise CorpusError(f"shard {path}: permission denied ({exc})") from exc
    try:
        return pq.ParquetFile(io.BytesIO(data))
    except (pa.ArrowInvalid, OSError) as exc:
        raise CorpusError(f"unreadable Parquet shard {path}: {exc}{not_parquet_hint(path, data[:4096])}") from exc


def read_columns(path: str, columns: list[str] | None = None,
                 storage_options: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Every shard of a small public file (a test split, a client's unlabelled documents, a benchmark file an
    experiment splits), ``columns`` only (all when None), as one DataFrame. Nothing is validated beyond the
    columns' presence; the private corpus is read through ``read_shard`` / ``privseed.tasks.data.units.read_unit``."""
    frames = [_read_table(uri, columns, storage_options).to_pandas() for uri in list_shards(path, storage_options)]
    return pd.concat(frames, ignore_index=True)


def write_parquet(uri: str, frame: pd.DataFrame, storage_options: Mapping[str, Any] | None = None) -> str:
    """Write ``frame`` as one Parquet file, atomically (``privseed.tasks.storage.write_bytes``); returns ``uri``."""
    storage.write_bytes(uri, _parquet_bytes(frame), storage_options)
    return uri


def validate_corpus_frame(frame: pd.DataFrame, path: str, text_column: str, label_column: str) -> pd.DataFrame:
    """Rows of shard ``path`` (columns text_column, label_column in that order) as columns ``text`` (str) and
    ``label``, or a CorpusError naming the shard and the column. No error names a count or a row.

    A null text is the empty document ``""`` (a blank one stays as it is): it passes through every pass like any
    other document (no term, no phrase; in PE, the embedding of an empty text), within the same per-document
    sensitivity. Stopping the run instead would make whether a release exists a function of one private row."""
    frame.columns = ["text", "label"]
    frame["text"] = frame["text"].where(frame["text"].notna(), "")
    if frame["label"].isna().any():
        raise CorpusError(f"shard {path}: some rows have a null label in column {label_column!r}; drop them or give "
                          "them a declared label (or check --label-column)")
    if not pd.api.types.is_string_dtype(frame["text"]) and not frame["text"].map(lambda v: isinstance(v, str)).all():
        raise CorpusError(f"shard {path}: column {text_column!r} does not hold text")
    frame["text"] = frame["text"].astype(str)
    return frame


def declared_positions(labels: pd.Series, declared: Sequence[Any], label_column: str = "label") -> np.ndarray:
    """Each row's class: the position of its label among the ``declared`` labels (compared as text, so an
    integer column matches integer labels). A row whose label is not declared stops the run before anything is
    drawn; the error is for the operator and names neither the labels nor how many rows carry them (it is never
    written to a release)."""
    where = {str(label): i for i, label in enumerate(declared)}
    positions = labels.astype(str).map(where)
    if positions.isna().any():
        raise ConfigError(
            f"the corpus has rows whose label (column {label_column!r}) is not in the declared label set; "
            "privseed never turns an undeclared label into a class. Declare every label the corpus may carry "
            "(--labels / --labels-file / `labels` in the config file), drop those rows from the input, or check "
            "--label-column. (Which labels and how many rows are deliberately not shown.)")
    return positions.to_numpy(dtype=np.int64)


def read_corpus(
    path: str,
    text_column: str = "text",
    label_column: str = "label",
    storage_options: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """A whole labelled corpus as one DataFrame (columns ``text``, ``label``), validated: a small one (a test
    split); a private corpus of any size is streamed by work units (tasks/data/units.py)."""
    shards = list_shards(path, storage_options)
    frames = [read_shard(s, text_column, label_column, storage_options) for s in shards]
    corpus = pd.concat(frames, ignore_index=True)
    if corpus.empty:
        raise CorpusError(f"the corpus at {path!r} is empty (no rows in {len(shards)} shard(s))")
    return corpus


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("privseed", "numpy", "torch", "prefect", "dask", "pyarrow", "sentence-transformers",
                 "great-expectations", "llama-cpp-python", "anthropic", "dp-accounting"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


def _without_null_types(table: pa.Table) -> pa.Table:
    """``table`` with every all-null column typed as text: a column of nulls (or of empty lists) is ``null`` (or
    ``list<null>``) to Arrow, while another part of the same release has ``string`` (``list<string>``) there, and a
    reader of the whole folder (``pd.read_parquet(OUT/synthetic)``, ``datasets``) cannot cast one into the other.
    Every such column of a release holds text (rejection reasons, model names), so text is the type they share:
    large_string for a column (pandas' text columns), list<string> for a list (pandas' lists of text)."""
    fields = []
    for field in table.schema:
        if pa.types.is_null(field.type):
            field = field.with_type(pa.large_string())  # what pandas' text columns become
        elif pa.types.is_list(field.type) and pa.types.is_null(field.type.value_type):
            field = field.with_type(pa.list_(pa.string()))
        fields.append(field)
    schema = pa.schema(fields, metadata=table.schema.metadata)
    return table if schema.equals(table.schema) else table.cast(schema)


def _parquet_bytes(df: pd.DataFrame) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(_without_null_types(pa.Table.from_pandas(df, preserve_index=False)), buffer)
    return buffer.getvalue()


def _json_bytes(obj: Any) -> bytes:
    return (jsonable.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def new_release_id() -> str:
    """A random release id (16 hex digits of OS entropy). No time: the id is minted after the private passes, so
    a timestamp in it, set against the run's start, would time them, and their duration grows with |D|."""
    return secrets.token_hex(8)


def quarantine_uri(state_uri: str, release_id: str) -> str:
    """Where a refused candidate goes: the owner's private state (``quarantine/<release id>``), never the release
    folder, whose every file is meant for the recipient (a candidate drawn from reproducible noise is a
    deterministic function of the data)."""
    return storage.join(state_uri, QUARANTINE_DIR, release_id)


def staging_uri(state_uri: str, release_id: str) -> str:
    """Where a candidate drawn from reproducible noise is written while it is generated: the private state
    (``staging/<release id>``), so that a run that dies before its gate leaves nothing under OUT."""
    return storage.join(state_uri, STAGING_DIR, release_id)


def candidate_folder(out: str, state_uri: str, release_id: str, reproducible_noise: bool) -> str:
    """The folder the generation shards write a candidate's parts into. A secure candidate's parts go under ``out``
    at once (DP post-processing, named by no manifest until the commit). A candidate drawn from reproducible noise
    (``--insecure-reproducible-noise``) is a deterministic function of the private data: its parts go to the
    private state (:func:`staging_uri`) and reach ``out`` only when ``--allow-insecure-release`` publishes them,
    after the stamped ledger."""
    return staging_uri(state_uri, release_id) if reproducible_noise else out


def insecure_ledgers(out: str, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The ledgers under ``out`` that say a release was drawn from reproducible noise (``secure`` false): the
    current ``ledger.json``, every ``_releases/<id>/ledger.json`` and any ``_quarantine/<id>/ledger.json`` an
    earlier version left in the release folder."""
    found = []
    candidates = [storage.join(out, "ledger.json")]
    for folder in (RELEASES_DIR, LEGACY_QUARANTINE_DIR):
        try:
            candidates += [storage.join(uri.rstrip("/"), "ledger.json")
                           for uri in storage.listdir(storage.join(out, folder), storage_options)]
        except (FileNotFoundError, StorageError):
            continue
    for uri in candidates:
        try:
            document = json.loads(storage.read_bytes(uri, storage_options))
        except (FileNotFoundError, IsADirectoryError, StorageError):
            continue
        except ValueError:  # not JSON: not ours to judge, and not a secure ledger either
            found.append(uri)
            continue
        total = document.get("total") if isinstance(document, dict) else None
        if not isinstance(total, dict) or total.get("secure") is False or "stamp" in document:
            found.append(uri)
    return found


@dataclass(frozen=True, eq=False)
class ReleasePart:
    """One written part of a candidate release: its path relative to the release folder, rows, sha256, rows per
    label (synthetic counts: the per-class sizes come from the configuration), columns, and the release gate's
    check of its rows (None without a gate)."""

    path: str
    rows: int
    sha256: str
    rows_per_label: dict[str, int]
    columns: tuple[str, ...]
    check: PartCheck | None = None
    #: the part's Arrow schema (column types, for the dataset card's features)
    schema: pa.Schema | None = None


@dataclass(frozen=True, eq=False)
class StagedRelease:
    """A candidate release whose parts are written under ``out`` and named by no manifest yet: what a flow holds
    between generation and ``publish_release`` instead of the synthetic rows. ``gate`` is the gate that checked
    the parts (publish_release refuses to combine them under another); ``generation_report`` the counts for
    quality.json (privseed.tasks.generation.rows.split_documents, summed over parts)."""

    out: str
    release_id: str
    parts: tuple[ReleasePart, ...]
    gate: ReleaseGate | None
    generation_report: dict | None = None

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.parts)


def part_path(release_id: str, index: int) -> str:
    """A part's path relative to the release folder: the release id in the name keeps it apart from the parts
    of every other release until a manifest names it."""
    return f"{SYNTHETIC_DIR}/part-{index:05d}-{release_id}.parquet"


def _rows_per_label(labels: Sequence[Any]) -> dict[str, int]:
    return {str(k): int(v) for k, v in pd.Series(list(labels), dtype=object).value_counts().sort_index().items()}


def write_part(out: str, release_id: str, index: int, rows: pd.DataFrame,
               storage_options: Mapping[str, Any] | None = None, gate: ReleaseGate | None = None) -> ReleasePart:
    """Write part ``index`` of release ``release_id`` under ``out`` and describe it; ``gate`` checks its rows
    here, where they are (a Dask worker), so nobody has to gather them. Nothing names the part until the
    release's manifest does; ``publish_release`` moves it to quarantine if the gate fails, and a later commit
    removes it if the run dies first."""
    data = _parquet_bytes(rows)
    relative = part_path(release_id, index)
    storage.write_bytes(storage.join(out, relative), data, storage_options)
    schema = _without_null_types(pa.Table.from_pandas(rows, preserve_index=False)).schema.remove_metadata()
    return ReleasePart(relative, len(rows), hashlib.sha256(data).hexdigest(), _rows_per_label(rows["label"]),
                       tuple(str(c) for c in rows.columns), gate.check_part(rows) if gate is not None else None,
                       schema)


def release_schema(parts: Sequence[ReleasePart]) -> pa.Schema | None:
    """One schema for all parts (a part whose lists were all empty has list<null> where others have list<string>),
    or None when a part's schema is unknown or the parts disagree."""
    if any(p.schema is None for p in parts):
        return None
    try:
        return pa.unify_schemas([p.schema for p in parts if p.schema is not None])
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None


def release_card(release_id: str, parts: Sequence[ReleasePart], rows: int, rows_per_label: Mapping[str, int],
                 config: Mapping[str, Any], class_names: Mapping[str, str] | None,
                 privacy: Mapping[str, Any]) -> bytes:
    """The release's README.md (privseed.tasks.data.dataset_card), from what the manifest publishes anyway: ``privacy``
    is the manifest's own ``privacy`` section, so the card and the manifest state one guarantee."""
    schema = release_schema(parts)
    labels: list[Any] = list(config.get("labels") or sorted(rows_per_label))
    if schema is not None and "label" in schema.names and pa.types.is_integer(schema.field("label").type):
        try:
            labels = [int(label) for label in labels]
        except ValueError:
            pass
    return dataset_card(release_id=release_id, part_paths=[p.path for p in parts], schema=schema, rows=rows,
                        rows_per_label=rows_per_label, labels=labels, class_names=class_names, privacy=privacy,
                        config=config).encode()


def _move_parts(source: str, target_folder: str, parts: Sequence[ReleasePart],
                storage_options: Mapping[str, Any] | None) -> None:
    """Move staged parts from ``source`` to ``target_folder`` (same relative paths): a refused candidate out of the
    release folder into quarantine, so it leaves nothing beside the last good release; a candidate staged in the
    private state into the release folder when it is published. A part already moved by an earlier attempt of
    the same publish is skipped."""
    def move(part: ReleasePart) -> None:
        target = storage.join(target_folder, part.path)
        try:
            storage.move(storage.join(source, part.path), target, storage_options)
        except FileNotFoundError:
            if not storage.exists(target, storage_options):  # not moved by an earlier attempt of this publish
                raise

    with ThreadPoolExecutor(max_workers=16, thread_name_prefix="move-parts") as pool:
        list(pool.map(move, parts))


@dataclass(frozen=True, eq=False)
class Candidate:
    """The release ``publish_release`` is about to commit: its id, its rows as a frame or as parts the generation
    shards already wrote (``staged``), how many rows, and where it goes if it is refused (``quarantine``, in the
    owner's private state, never under OUT: everything under OUT is the recipient's, docs/privacy.md)."""

    release_id: str
    frame: pd.DataFrame | None
    staged: StagedRelease | None
    rows: int
    quarantine: str

    def refuse(self, documents: Mapping[str, bytes], storage_options: Mapping[str, Any] | None) -> None:
        """Put the candidate (its parts, or its frame as one part) and ``documents`` into quarantine."""
        if self.staged is not None:
            _move_parts(self.staged.out, self.quarantine, self.staged.parts, storage_options)
        elif self.frame is not None:
            storage.write_bytes(storage.join(self.quarantine, SYNTHETIC_DIR, "part-00000.parquet"),
                                _parquet_bytes(self.frame), storage_options)
        for name, data in documents.items():
            storage.write_bytes(storage.join(self.quarantine, name), data, storage_options)


def publish_release(
    out: str,
    synthetic: pd.DataFrame | StagedRelease,
    *,
    ledger: PrivacyLedger,
    config: Mapping[str, Any],
    extra_files: Mapping[str, bytes] | None = None,
    gate: Callable[[pd.DataFrame], dict] | ReleaseGate | None = None,
    quality_extra: Mapping[str, Any] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    rows_per_shard: int = 5000,
    release_id: str | None = None,
    allow_insecure: bool = False,
    class_names: Mapping[str, str] | None = None,
) -> dict:
    """Gate, then publish ``synthetic`` under ``out`` atomically; return the manifest.

    ``synthetic`` is the candidate frame, or a :class:`StagedRelease` whose parts the generation shards already
    wrote (and the gate, a :class:`privseed.tasks.quality.ReleaseGate`, already checked part by part: here the checks
    are combined, no row is read), under ``out`` or, for a candidate drawn from reproducible noise, in the private
    state (``candidate_folder``; moved into ``out`` just before the manifest when it is published).

    The steps, in order, each a function below: ``candidate`` (which release, how many rows); ``refuse_insecure``
    (a ledger with any release drawn from reproducible noise, ``--insecure-reproducible-noise``, is refused unless
    ``allow_insecure``, and then manifest.json and ledger.json carry the NOT DIFFERENTIALLY PRIVATE stamp; a secure
    candidate is refused while ``out`` holds such a stamped release, ``insecure_ledgers``: the recipient of the
    folder would get both); ``gate_result`` and ``refuse_failed_gate``; ``stage_parts`` (a frame's parts under new
    names); ``release_documents`` (the release's ledger, the recipient's view; quality.json, with ``quality_extra``
    such as the generation report, or ``"gate": "off"`` beside it; the extra files; README.md, the dataset card,
    ``privseed.tasks.data.dataset_card``, whose ClassLabel ``class_names`` names) and ``write_documents`` (under
    ``_releases/<id>/`` and as top-level copies); parts staged in the private state moved in; the owner's full ledger
    into the private state; then ``commit_manifest``: ``manifest.json`` (the commit point), after which the parts of
    older releases (and of runs that died before their commit) are removed.

    Everything under ``out`` is meant for the recipient; nothing of the private state (identity key, drawn values,
    data identity, LLM cache) is written there. A crash or a storage failure before the manifest leaves the previous
    manifest, and every file it names, untouched. A refused candidate goes under ``quarantine/<id>/`` in the private
    state (``ledger.state_uri``; staged parts are moved there, out of ``out``) and GateFailedError is raised."""
    chosen = candidate(out, synthetic, ledger, release_id)
    noise = ledger.noise_report()
    refuse_insecure(out, chosen, ledger, noise, allow_insecure, storage_options)
    result = gate_result(chosen, gate, quality_extra)
    refuse_failed_gate(chosen, result, storage_options)
    parts = stage_parts(out, chosen, rows_per_shard, storage_options)
    privacy = privacy_section(ledger, noise)
    documents = release_documents(chosen, parts, ledger, result, quality_extra, extra_files, config, class_names,
                                  privacy)
    files = write_documents(out, chosen.release_id, parts, documents, storage_options)
    if chosen.staged is not None and chosen.staged.out.rstrip("/") != out.rstrip("/"):
        # Parts staged in the private state (drawn from reproducible noise, published with --allow-insecure-release)
        # enter OUT only now: after the stamped ledger.json, before the manifest that commits them.
        _move_parts(chosen.staged.out, out, parts, storage_options)
    ledger.write_owner_ledger()
    manifest = commit_manifest(out, chosen, parts, files, privacy, result, config, storage_options)
    log.info("published release %s: %d synthetic rows in %d part(s) at %s", chosen.release_id, chosen.rows,
             len(parts), out)
    return manifest


def candidate(out: str, synthetic: pd.DataFrame | StagedRelease, ledger: PrivacyLedger,
              release_id: str | None) -> Candidate:
    """The candidate release: a staged one keeps its own id (it must have been written under ``out`` or the private
    state's staging folder); a frame gets ``release_id`` or a new one. An empty candidate is refused."""
    staged = synthetic if isinstance(synthetic, StagedRelease) else None
    frame = synthetic if isinstance(synthetic, pd.DataFrame) else None
    if staged is not None:
        if release_id is not None and release_id != staged.release_id:
            raise ConfigError(f"the staged parts belong to release {staged.release_id}, not {release_id}")
        release_id = staged.release_id
        private_staging = staging_uri(ledger.state_uri, release_id)
        if staged.out.rstrip("/") not in (out.rstrip("/"), private_staging.rstrip("/")):
            raise ConfigError(f"the staged parts were written under {staged.out}, not under {out} or the private "
                              f"state's {private_staging}")
    release_id = release_id or new_release_id()
    rows = staged.rows if staged is not None else len(frame) if frame is not None else 0
    if rows == 0:
        raise GateFailedError("the synthetic corpus is empty; nothing to publish")
    return Candidate(release_id, frame, staged, rows, quarantine_uri(ledger.state_uri, release_id))


def refuse_insecure(out: str, chosen: Candidate, ledger: PrivacyLedger, noise: Mapping[str, Any],
                    allow_insecure: bool, storage_options: Mapping[str, Any] | None) -> None:
    """Quarantine and refuse a candidate drawn from reproducible noise (unless ``allow_insecure``), and a secure
    candidate while ``out`` holds a stamped release."""
    if not noise["secure"] and not allow_insecure:
        chosen.refuse({"ledger.json": ledger.to_json().encode()}, storage_options)
        raise GateFailedError(
            f"{INSECURE_STAMP}: {len(noise['insecure_entries'])} release(s) of this run were drawn from reproducible "
            f"noise (--insecure-reproducible-noise), so the release is refused; candidate kept in the private state "
            f"at {chosen.quarantine}. Pass --allow-insecure-release to publish it anyway, stamped",
            quarantine=chosen.quarantine,
        )
    if noise["secure"]:
        # A secure release is never committed beside a stamped one: the recipient of OUT would get both, and the
        # stamped one's values are a deterministic function of its data.
        stamped = insecure_ledgers(out, storage_options)
        if stamped:
            chosen.refuse({"ledger.json": ledger.to_json().encode()}, storage_options)
            raise GateFailedError(
                f"the release folder {out} holds a release drawn from reproducible noise ({stamped[0]}"
                f"{f' and {len(stamped) - 1} more' if len(stamped) > 1 else ''}; {INSECURE_STAMP}); a secure release "
                "is not committed beside it. Publish into a fresh --out, or delete that folder's contents first; "
                f"candidate kept in the private state at {chosen.quarantine}",
                quarantine=chosen.quarantine,
            )


def gate_result(chosen: Candidate, gate: Callable[[pd.DataFrame], dict] | ReleaseGate | None,
                quality_extra: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The release gate's verdict with ``quality_extra`` beside it (None without a gate): a frame is checked here, a
    staged release's part checks are combined, which only the gate that made them may do."""
    result: dict[str, Any] | None
    staged = chosen.staged
    if staged is not None and gate is not None:
        checks = [p.check for p in staged.parts]
        if staged.gate is None or staged.gate != gate or any(c is None for c in checks):
            raise ConfigError("the staged parts were checked by another release gate (labels, language or bounds "
                              "differ), or not at all; check and publish with the same gate")
        result = staged.gate.combine([c for c in checks if c is not None])
    elif staged is not None and staged.gate is not None:
        raise ConfigError("the staged parts were checked by a release gate; publish them with that gate")
    else:
        result = gate(chosen.frame) if gate is not None and chosen.frame is not None else None
    if result is not None and quality_extra:
        result = {**result, **quality_extra}
    return result


def refuse_failed_gate(chosen: Candidate, result: Mapping[str, Any] | None,
                       storage_options: Mapping[str, Any] | None) -> None:
    """Quarantine and refuse the candidate when the gate failed, naming the failed expectations."""
    if result is None or result.get("success", False):
        return
    chosen.refuse({"quality.json": _json_bytes(result)}, storage_options)
    failed = [e.get("name", "?") for e in result.get("expectations", []) if not e.get("success", True)]
    raise GateFailedError(
        f"release gate failed ({', '.join(failed) or 'see quality.json'}); candidate kept at {chosen.quarantine}",
        result=dict(result),
        quarantine=chosen.quarantine,
    )


def stage_parts(out: str, chosen: Candidate, rows_per_shard: int,
                storage_options: Mapping[str, Any] | None) -> list[ReleasePart]:
    """The release's parts: a staged release's as written, a frame's written now under ``out`` in parts of
    ``rows_per_shard`` rows, under names no manifest knows yet."""
    if chosen.staged is not None:
        return list(chosen.staged.parts)
    assert chosen.frame is not None  # a candidate is a frame or staged parts (``candidate``)
    frame = chosen.frame
    n_parts = max(1, int(np.ceil(chosen.rows / rows_per_shard)))
    return [write_part(out, chosen.release_id, index, frame.iloc[index * rows_per_shard:(index + 1) * rows_per_shard],
                       storage_options) for index in range(n_parts)]


def privacy_section(ledger: PrivacyLedger, noise: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest's ``privacy`` section, which the dataset card states too: the run's total (epsilon, delta), its
    random run id (or the operator's --run-id; the data identity stays in the private state), whether its noise was
    secure, and which guarantee epsilon belongs to ((epsilon, delta)-DP, or SecPE's (p, r)-secret protection)."""
    epsilon, delta = ledger.total()
    return {"epsilon": epsilon, "delta": delta, "run_id": ledger.run_id, "secure": noise["secure"],
            "guarantee": ledger.guarantee(), "noise": dict(noise)}


def rows_per_label_of(parts: Sequence[ReleasePart]) -> dict[str, int]:
    """Rows per label over all parts (synthetic counts: the per-class sizes come from the configuration)."""
    counts: dict[str, int] = {}
    for part in parts:
        for label, count in part.rows_per_label.items():
            counts[label] = counts.get(label, 0) + count
    return counts


def release_documents(chosen: Candidate, parts: Sequence[ReleasePart], ledger: PrivacyLedger,
                      result: Mapping[str, Any] | None, quality_extra: Mapping[str, Any] | None,
                      extra_files: Mapping[str, bytes] | None, config: Mapping[str, Any],
                      class_names: Mapping[str, str] | None, privacy: Mapping[str, Any]) -> dict[str, bytes]:
    """The documents a release holds beside its parts, by file name: ledger.json, quality.json, the extra files
    and README.md (the dataset card, from what the manifest publishes anyway)."""
    documents: dict[str, bytes] = {"ledger.json": ledger.to_json().encode()}
    if result is not None:
        documents["quality.json"] = _json_bytes(result)
    elif quality_extra:
        documents["quality.json"] = _json_bytes({"gate": "off", **quality_extra})
    documents.update(extra_files or {})
    documents["README.md"] = release_card(chosen.release_id, parts, chosen.rows, rows_per_label_of(parts), config,
                                          class_names, privacy)
    return documents


def write_documents(out: str, release_id: str, parts: Sequence[ReleasePart], documents: Mapping[str, bytes],
                    storage_options: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Write each document under ``_releases/<id>/`` and as its top-level copy; return the manifest's file list
    (the parts first, then the documents, each with its sha256)."""
    files: list[dict[str, Any]] = [{"path": p.path, "rows": p.rows, "sha256": p.sha256, "kind": "synthetic"}
                                   for p in parts]
    for name, data in documents.items():
        relative = f"{RELEASES_DIR}/{release_id}/{name}"
        storage.write_bytes(storage.join(out, relative), data, storage_options)
        storage.write_bytes(storage.join(out, name), data, storage_options)
        files.append({"path": relative, "copy": name, "sha256": hashlib.sha256(data).hexdigest(), "kind": name})
    return files


def commit_manifest(out: str, chosen: Candidate, parts: Sequence[ReleasePart], files: list[dict[str, Any]],
                    privacy: Mapping[str, Any], result: Mapping[str, Any] | None, config: Mapping[str, Any],
                    storage_options: Mapping[str, Any] | None) -> dict:
    """Write ``manifest.json``, the commit point (last: every file it names is in place), then remove the parts of
    superseded releases; return the manifest."""
    manifest = {
        "format": MANIFEST_FORMAT,
        "release_id": chosen.release_id,
        # No creation time: publishing happens after every private pass, so a clock reading here (or anywhere
        # after pass 1 starts), set against the run's start, would time the private stages, whose duration grows
        # with |D|. A time taken before pass 1 would be harmless but says nothing the recipient needs; the
        # recipient knows when they received the release.
        "rows": chosen.rows,
        # Synthetic per-class counts come from the configuration, so they are public.
        "rows_per_label": dict(sorted(rows_per_label_of(parts).items())),
        "columns": list(parts[0].columns),
        "files": files,
        "privacy": dict(privacy),
        "gate": None if result is None else {"success": result.get("success")},
        "config": dict(config),
        "versions": _versions(),
    }
    if not privacy["secure"]:
        manifest["stamp"] = INSECURE_STAMP
        log.warning("publishing a release stamped %s (--allow-insecure-release)", INSECURE_STAMP)
    storage.write_bytes(storage.join(out, MANIFEST), _json_bytes(manifest), storage_options)
    _remove_stale_parts(out, {f["path"] for f in files}, storage_options)
    return manifest


def _remove_stale_parts(out: str, keep: set[str], storage_options: Mapping[str, Any] | None) -> None:
    """Parts of superseded releases go once the new manifest is in place; a failure here is harmless."""
    try:
        for uri in storage.listdir(storage.join(out, SYNTHETIC_DIR), storage_options):
            relative = f"{SYNTHETIC_DIR}/{uri.rstrip('/').rsplit('/', 1)[-1]}"
            if relative not in keep:
                storage.remove(uri, storage_options)
    except StorageError as exc:
        log.warning("could not remove parts of older releases: %s", exc)


def read_manifest(out: str, storage_options: Mapping[str, Any] | None = None) -> dict:
    uri = storage.join(out, MANIFEST)
    try:
        manifest = json.loads(storage.read_bytes(uri, storage_options))
    except FileNotFoundError as exc:
        raise CorpusError(f"no release at {out!r}: {MANIFEST} is missing "
                          "(an unfinished run publishes nothing)") from exc
    if manifest.get("format") != MANIFEST_FORMAT:
        raise CorpusError(f"{uri} is not a privseed release manifest (format {manifest.get('format')!r})")
    return manifest


def read_release(out: str, storage_options: Mapping[str, Any] | None = None,
                 verify: bool = True) -> tuple[dict, pd.DataFrame]:
    """The manifest and the synthetic corpus it names (checksums verified)."""
    manifest = read_manifest(out, storage_options)
    frames = []
    for entry in manifest["files"]:
        if entry["kind"] != "synthetic":
            continue
        data = storage.read_bytes(storage.join(out, entry["path"]), storage_options)
        if verify and hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise CorpusError(f"{entry['path']} does not match the checksum in the manifest of {out}")
        frames.append(pq.read_table(io.BytesIO(data)).to_pandas())
    return manifest, pd.concat(frames, ignore_index=True)
