"""Landing files: the change stream as files, and the ledger of what was ingested.

Landing files are Parquet, JSON Lines or CSV files in a directory, processed in
file-name order. Their columns are the table's columns plus optional ``_op``
and ``_seq``. The ledger (under the table root, ``_lsm_ingest/``) records a
file only after all of its good rows are durable, so a crashed ingestion
re-applies exactly the unrecorded files, in order — which leaves the merged
view unchanged (upserts and deletes by key are idempotent in order).

Once recorded, a file is retired per :class:`LandingRetention`: moved to
``<landing dir>/_archive/`` (the default; archived files are deleted after
``archive_max_age_seconds``, counted from their modification time), deleted,
or kept in place.

Every location (landing directory, landing file, table) is a local path or a
URI (``s3://...``), reached through ``pyarrow.fs``
(:func:`~resources.lsm.format.storage.filesystem`); ``storage_options`` are
the table's (see :class:`~resources.lsm.format.storage.TableStorage`).
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Literal

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ..errors import Rejection
from ..format.storage import StorageOptions, TableStorage, filesystem, join

FORMATS = {".parquet": "parquet", ".jsonl": "json", ".ndjson": "json", ".json": "json", ".csv": "csv"}
LEDGER_DIR = "_lsm_ingest/files"
STAGING_DIR = "_lsm_ingest/staging"
"""Where Spark ingestion stages routed rows between its read and write tasks, one directory per call."""
ARCHIVE_DIR = "_archive"
"""Where recorded landing files go, below the landing directory (``_`` names are never listed)."""


class UnreadableFileError(ValueError):
    """The whole file cannot be parsed (not the format its name says, truncated...)."""


@dataclass(frozen=True)
class LandingFile:
    """One change file; ``order`` is its position in file-name order."""

    order: int
    name: str
    path: str
    size: int


def list_landing_files(landing_dir: str, storage_options: StorageOptions | None = None) -> list[LandingFile]:
    """Supported files directly in ``landing_dir`` (local or a URI), in file-name order.

    Names starting with ``.`` or ``_`` (temporary files, the quarantine) are
    skipped. A missing directory has no files. Each ``path`` is absolute (a
    local path) or a URI.
    """
    files = {
        f.name: f.size
        for f in TableStorage(landing_dir, storage_options).list_files("")
        if f.name[:1] not in "._" and os.path.splitext(f.name)[1].lower() in FORMATS
    }
    return [LandingFile(i, n, join(landing_dir, n), files[n]) for i, n in enumerate(sorted(files))]


def read_landing_file(path: str, storage_options: StorageOptions | None = None) -> tuple[pa.Table, list[Rejection]]:
    """Read a change file as-is (values are cast and validated later).

    CSV values are read as strings so that a bad value rejects its row, not
    the file. JSON Lines are parsed line by line for the same reason: a line
    that is not a JSON object is returned as a rejection with its row number.

    Raises
    ------
    UnreadableFileError
        If the file cannot be parsed at all.
    """
    kind = FORMATS.get(os.path.splitext(path)[1].lower())
    try:
        fs, fs_path = filesystem(path, storage_options)
        with fs.open_input_file(fs_path) as source:
            if kind == "parquet":
                return pq.ParquetFile(source).read(), []
            if kind == "csv":
                return _read_csv(source), []
            if kind == "json":
                return _read_json_lines(source)
    except (pa.ArrowInvalid, OSError, UnicodeDecodeError) as exc:
        raise UnreadableFileError(f"{path}: cannot be read as {kind}: {exc}") from exc
    raise UnreadableFileError(f"{path}: unsupported file type")


def _read_csv(source: pa.NativeFile) -> pa.Table:
    data = source.read_buffer()
    header = next(csv.reader(_text(data, newline="")), [])
    as_strings = {name: pa.string() for name in header}
    return pacsv.read_csv(
        pa.BufferReader(data),
        convert_options=pacsv.ConvertOptions(
            column_types=as_strings, strings_can_be_null=True, quoted_strings_can_be_null=False
        ),
    )


def _read_json_lines(source: pa.NativeFile) -> tuple[pa.Table, list[Rejection]]:
    rows: list[dict[str, object]] = []
    rejections: list[Rejection] = []
    with _text(source.read_buffer(), newline=None) as lines:
        for number, line in enumerate(line for line in lines if line.strip()):
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                rejections.append(Rejection(number, f"not valid JSON: {exc.msg}"))
                rows.append({})
                continue
            if not isinstance(value, dict):
                rejections.append(Rejection(number, "line is not a JSON object"))
                value = {}
            rows.append(value)
    columns = sorted({k for row in rows for k in row})
    table = pa.table({c: _json_column([row.get(c) for row in rows]) for c in columns})
    if not columns:  # every line rejected: keep the row count
        table = pa.table({"_op": pa.nulls(len(rows), pa.string())})
    return table, rejections


def _text(data: pa.Buffer, newline: str | None) -> io.TextIOWrapper:
    """``data`` as UTF-8 text, as ``open(..., encoding="utf-8", newline=newline)`` reads a file."""
    return io.TextIOWrapper(pa.BufferReader(data), encoding="utf-8", newline=newline)


def _json_column(values: list[object]) -> pa.Array:
    """A column as Arrow infers it, or as strings where JSON types clash.

    Strings keep every value, so casting later rejects the offending row
    instead of failing the whole file.
    """
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array(
            [None if v is None else json.dumps(v) if isinstance(v, (dict, list)) else str(v) for v in values],
            pa.string(),
        )


@dataclass(frozen=True)
class LedgerEntry:
    """What ingesting one landing file did."""

    name: str
    size: int
    rows: int
    rejected: int
    run_id: str
    ingested_at: float


class IngestLedger:
    """Which landing files are already in the table (one small JSON file each)."""

    def __init__(self, table_uri: str, storage_options: StorageOptions | None = None) -> None:
        self._storage = TableStorage(table_uri, storage_options)

    def ingested_names(self) -> set[str]:
        return {f.name[: -len(".json")] for f in self._storage.list_dir(LEDGER_DIR) if f.name.endswith(".json")}

    def entry(self, name: str) -> LedgerEntry | None:
        """The record of the landing file ``name``, if it was ingested."""
        try:
            return LedgerEntry(**json.loads(self._storage.read_bytes(f"{LEDGER_DIR}/{name}.json")))
        except FileNotFoundError:
            return None

    def record(self, entry: LedgerEntry) -> None:
        """Record a file as ingested (write-then-rename, so a reader never sees half)."""
        self._storage.write_bytes_atomic(f"{LEDGER_DIR}/{entry.name}.json", json.dumps(asdict(entry)).encode())

    def entries(self) -> list[LedgerEntry]:
        return [
            LedgerEntry(**json.loads(self._storage.read_bytes(f"{LEDGER_DIR}/{f.name}")))
            for f in sorted(self._storage.list_dir(LEDGER_DIR), key=lambda f: f.name)
            if f.name.endswith(".json")
        ]


@dataclass(frozen=True)
class LandingRetention:
    """What happens to a landing file once the ledger recorded it (its good rows are durable).

    Attributes
    ----------
    mode
        ``"archive"``: move it to ``_archive/`` below the landing directory;
        ``"delete"``: delete it; ``"keep"``: leave it (the ledger still keeps
        it from being ingested twice).
    archive_max_age_seconds
        Archived files older than this (by modification time) are deleted.
    """

    mode: Literal["archive", "delete", "keep"] = "archive"
    archive_max_age_seconds: float = 7 * 24 * 3600.0


def retire_landing_files(
    landing_dir: str,
    names: Iterable[str],
    retention: LandingRetention,
    storage_options: StorageOptions | None = None,
) -> int:
    """Archive or delete the recorded landing files ``names``, then archived files past their age.

    Call only for files the ledger recorded. Returns the landing files retired.
    """
    if retention.mode == "keep":
        return 0
    storage = TableStorage(landing_dir, storage_options)
    retired = 0
    for name in names:
        if retention.mode == "archive":
            storage.move(name, f"{ARCHIVE_DIR}/{name}")
        else:
            storage.delete_file(name)
        retired += 1
    expired_ns = time.time_ns() - int(retention.archive_max_age_seconds * 1e9)
    for entry in storage.list_dir(ARCHIVE_DIR):
        if entry.mtime_ns is not None and entry.mtime_ns < expired_ns:
            storage.delete_file(f"{ARCHIVE_DIR}/{entry.name}")
    return retired


def new_ledger_entry(file: LandingFile, rows: int, rejected: int, run_id: str) -> LedgerEntry:
    return LedgerEntry(file.name, file.size, rows, rejected, run_id, time.time())
