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
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Literal, TypeAlias, cast

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ..errors import Rejection
from ..format.layout import ARCHIVE_DIR, LEDGER_DIR
from ..format.storage import StorageOptions, TableStorage
from ..write.changes import records_table
from .cdc import CdcFormat, records_to_changes, to_changes

FORMATS = {".parquet": "parquet", ".jsonl": "json", ".ndjson": "json", ".json": "json", ".csv": "csv"}
LANDING_FORMATS = {"parquet": "parquet", "jsonl": "json", "csv": "csv"}
"""The format names a table's landing may accept, and the reader (a value of :data:`FORMATS`) of each."""


class UnreadableFileError(ValueError):
    """The whole file cannot be parsed (not the format its name says, truncated...)."""


NullMarkers: TypeAlias = "tuple[str, ...]"
DEFAULT_CSV_NULL_MARKERS: NullMarkers = ("",)
"""Unquoted CSV fields read as null: the empty field only (``NA``, ``null``, ``nan``... stay text)."""
PARQUET_MAGIC = b"PAR1"


@dataclass(frozen=True)
class LandingPolicy:
    """How ingestion reads landing files and treats the doubtful ones.

    Attributes
    ----------
    csv_null_markers
        Unquoted CSV fields read as null (default: the empty field only).
    changed_files
        A file landed again under a recorded name with another size:
        ``"skip"`` (default) reports it (warning, metadata, quarantine entry)
        and leaves it in place; ``"ingest"`` reports it and ingests it as a
        new file (its rows are applied again, after the files before it).
    settle_seconds
        A CSV or JSON Lines file that does not end with a newline is taken
        only once unmodified this long (it may still be being written).
    cdc_formats
        Landing files holding CDC records instead of rows in the change
        layout: ``(file-name suffix, format)`` pairs; a file takes the format
        of the longest suffix its name ends with (``""`` matches every file:
        the whole directory is in that format). See :mod:`.cdc`.
    auto_evolve
        A column the table lacks, found in a landing file, is added to the
        table (nullable, the type the file gives it) before the file is
        ingested, instead of rejecting the rows that hold a value in it.
    formats
        The file formats taken (``parquet``, ``jsonl``, ``csv``); a landing
        file of another format is reported as unsupported and never read.
    """

    csv_null_markers: NullMarkers = DEFAULT_CSV_NULL_MARKERS
    changed_files: Literal["skip", "ingest"] = "skip"
    settle_seconds: float = 30.0
    cdc_formats: tuple[tuple[str, CdcFormat], ...] = ()
    auto_evolve: bool = False
    formats: tuple[str, ...] = ("parquet", "jsonl", "csv")

    def refusal(self, name: str) -> str | None:
        """Why the landing file ``name`` is not taken under :attr:`formats` (``None``: it is)."""
        kind = FORMATS.get(os.path.splitext(name)[1].lower())
        if kind in {LANDING_FORMATS[f] for f in self.formats}:
            return None
        return f"{kind} files are not among this table's landing formats {list(self.formats)}"

    def cdc_format(self, name: str) -> CdcFormat | None:
        """The CDC format of the landing file ``name`` (longest matching suffix), ``None`` for plain changes."""
        matches = [(len(suffix), fmt) for suffix, fmt in self.cdc_formats if name.endswith(suffix)]
        return max(matches, key=lambda m: m[0])[1] if matches else None


@dataclass(frozen=True)
class LandingFile:
    """One change file; ``order`` is its position in file-name order."""

    order: int
    name: str
    path: str
    size: int
    mtime_ns: int = 0


@dataclass(frozen=True)
class LandingRows:
    """A landing file as read: the rows that parsed, and the lines that did not.

    ``rejections`` are the lines that did not parse: each with its 0-based
    line number (for CSV, counted from the line after the header; blank
    lines count) and the line as it was, as ``record``. ``row_numbers[i]``
    is the file row of ``table`` row ``i``; ``None`` when they are the same.
    """

    table: pa.Table
    rejections: list[Rejection]
    row_numbers: np.ndarray | None = None

    def file_row(self, row: int) -> int:
        """The file row of ``table`` row ``row``."""
        return row if self.row_numbers is None else int(self.row_numbers[row])

    def records(self, rows: Sequence[int]) -> list[str]:
        """``table`` rows ``rows`` as read, as JSON (values JSON lacks, as text): what a quarantine keeps."""
        return [json.dumps(r, default=str) for r in self.table.take(pa.array(rows, pa.int64())).to_pylist()]


@dataclass(frozen=True)
class LandingListing:
    """One look at a landing directory (one LIST on an object store).

    Attributes
    ----------
    files
        Landing files (supported extensions), in file-name order.
    unsupported
        Entries ingestion will not take (extension, not a regular file,
        dangling link): name → why.
    exists
        Whether the directory exists (on an object store: a file is under it).
    """

    files: list[LandingFile]
    unsupported: dict[str, str]
    exists: bool


class LandingLocation:
    """A landing directory and its archive: root, filesystem and retry policy, built once per ingestion.

    Names starting with ``.`` or ``_`` (temporary files, the archive, a
    quarantine inside) are never listed.
    """

    def __init__(self, directory: str, storage_options: StorageOptions | None = None) -> None:
        self.storage = TableStorage(directory, storage_options)

    @property
    def uri(self) -> str:
        return self.storage.location

    def listing(self) -> LandingListing:
        """The directory's landing files and what else it holds, from one listing."""
        entries = [e for e in self.storage.list_dir("") if e.name[:1] not in "._"]
        unsupported: dict[str, str] = dict.fromkeys(self._dangling_links(), "dangling symbolic link")
        files = []
        for entry in entries:
            if not entry.is_file:
                unsupported[entry.name] = "not a regular file"
            elif os.path.splitext(entry.name)[1].lower() not in FORMATS:
                unsupported[entry.name] = f"unsupported file type; landing files end in one of {sorted(FORMATS)}"
            else:
                files.append(entry)
        files.sort(key=lambda e: e.name)
        landing = [
            LandingFile(i, e.name, self.storage.uri(e.name), e.size, e.mtime_ns or 0) for i, e in enumerate(files)
        ]
        exists = bool(entries) or (self.storage.is_local and os.path.isdir(self.storage.root))
        return LandingListing(landing, dict(sorted(unsupported.items())), exists)

    def files(self) -> list[LandingFile]:
        """The landing files, in file-name order (none if the directory does not exist)."""
        return self.listing().files

    def _dangling_links(self) -> list[str]:
        """Symbolic links to nothing in a local landing directory (``pyarrow.fs`` does not list them)."""
        root = self.storage.root
        if not self.storage.is_local or not os.path.isdir(root):
            return []
        return [
            entry.name
            for entry in os.scandir(root)
            if entry.name[:1] not in "._" and entry.is_symlink() and not os.path.exists(entry.path)
        ]

    def is_complete(self, file: LandingFile, settle_seconds: float, now_ns: int | None = None) -> bool:
        """Whether ``file`` looks completely written, so it may be ingested.

        A Parquet file is complete once its footer's magic bytes are there (a
        file that does not start with them is no Parquet file at all:
        complete, and rejected when read). A text file is complete once it
        ends with a newline or has not been modified for ``settle_seconds``.
        An empty file is not complete. These are heuristics: writing under a
        ``.``/``_`` name and renaming once written makes a file safe to take at once.
        """
        if file.size == 0:
            return False
        head, tail = self.storage.read_ends(file.name, len(PARQUET_MAGIC), file.size)
        if FORMATS.get(os.path.splitext(file.name)[1].lower()) == "parquet":
            return head != PARQUET_MAGIC or tail == PARQUET_MAGIC
        age_seconds = ((now_ns or time.time_ns()) - file.mtime_ns) / 1e9
        return tail.endswith(b"\n") or age_seconds >= settle_seconds

    def read(
        self,
        name: str,
        csv_null_markers: NullMarkers = DEFAULT_CSV_NULL_MARKERS,
        cdc: CdcFormat | None = None,
        *,
        unset_absent: bool = False,
    ) -> LandingRows:
        """Read the landing file ``name`` as-is (values are cast and validated later).

        CSV values are read as text, so that a bad value rejects its row, not
        the file; only ``csv_null_markers`` (unquoted) are null. A CSV or
        JSON Lines line that cannot be parsed (wrong field count, not UTF-8,
        not a JSON object) is returned as a :class:`~resources.lsm.errors.Rejection`
        with its text. With ``cdc``, the file holds CDC records, returned
        mapped to the change layout (:func:`.cdc.records_to_changes`); a
        malformed record is a rejection too, and in JSON Lines a ``null``
        line is a tombstone, not a bad line. With ``unset_absent`` (a
        partial-update table), a field a JSON record (or a CDC record's
        ``after``) lacks is listed in the row's ``_unset``, not read as null.

        Raises
        ------
        UnreadableFileError
            If the file cannot be parsed at all (its cause is kept: a storage
            fault is the platform's, not the file's).
        """
        kind = FORMATS.get(os.path.splitext(name)[1].lower())
        if kind is None:
            raise UnreadableFileError(f"{name}: unsupported file type")
        try:
            data = self.storage.read_buffer(name)
            if kind == "json":
                return _read_json_lines(data, name, cdc, unset_absent)
            if kind == "parquet":
                read = LandingRows(pq.ParquetFile(pa.BufferReader(data)).read(), [])
            else:
                read = _read_csv(data, csv_null_markers)
            return read if cdc is None else cdc_rows(read, cdc, unset_absent)
        except (pa.ArrowInvalid, OSError, UnicodeDecodeError, csv.Error) as exc:
            raise UnreadableFileError(f"{name}: cannot be read as {kind}: {exc}") from exc

    def retire(self, names: Iterable[str], retention: LandingRetention) -> int:
        """Archive or delete the recorded landing files ``names``; return how many were retired.

        Call only for files the ledger recorded. When files are archived, the
        archive is listed and archived files past their age are deleted (so
        an idle landing directory costs no archive listing per poll).
        """
        names = list(names)
        if retention.mode == "keep" or not names:
            return 0
        for name in names:
            if retention.mode == "archive":
                self.storage.move(name, f"{ARCHIVE_DIR}/{name}")
            else:
                self.storage.delete_file(name)
        if retention.mode == "archive":
            expired_ns = time.time_ns() - int(retention.archive_max_age_seconds * 1e9)
            for entry in self.storage.list_dir(ARCHIVE_DIR):
                if entry.mtime_ns is not None and entry.mtime_ns < expired_ns:
                    self.storage.delete_file(f"{ARCHIVE_DIR}/{entry.name}")
        return len(names)


def read_landing_file(
    path: str,
    csv_null_markers: NullMarkers = DEFAULT_CSV_NULL_MARKERS,
    storage_options: StorageOptions | None = None,
    cdc: CdcFormat | None = None,
) -> LandingRows:
    """Read one landing file given by its path or URI (see :meth:`LandingLocation.read`)."""
    directory, name = path.rstrip("/").rsplit("/", 1)
    return LandingLocation(directory, storage_options).read(name, csv_null_markers, cdc)


_CSV_MIN_BLOCK_BYTES = 1 << 20


def _read_csv(data: pa.Buffer, null_markers: NullMarkers) -> LandingRows:
    header = next(csv.reader([io.BytesIO(data).readline().decode("utf-8")]), [])
    bad_lines: list[tuple[int, str]] = []

    def reject(row: pacsv.InvalidRow) -> str:
        bad_lines.append((row.number or 0, row.text))
        return "skip"

    table = pacsv.read_csv(
        pa.BufferReader(data),
        # One thread, so that a bad line's number is known; a block holds the largest record.
        read_options=pacsv.ReadOptions(use_threads=False, block_size=max(_CSV_MIN_BLOCK_BYTES, data.size + 1)),
        parse_options=pacsv.ParseOptions(invalid_row_handler=reject),
        convert_options=pacsv.ConvertOptions(
            column_types={name: pa.binary() for name in header},
            null_values=list(null_markers),
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
        ),
    )
    filled, blank = _csv_lines(data)
    # pyarrow numbers the lines it parses (1-based, the header first), not the empty ones it skips.
    rejections = [
        Rejection(int(filled[n - 1]), f"line has {_field_count(text)} fields, the header {len(header)}", text)
        for n, text in bad_lines
    ]
    table, utf8_rejections = _decode_utf8(table)
    row_numbers = _csv_row_numbers(table.num_rows + len(utf8_rejections), {r.row for r in rejections}, blank)
    rejections += [Rejection(int(row_numbers[i]), reason, text) for i, reason, text in utf8_rejections]
    keep = np.ones(len(row_numbers), dtype=bool)
    keep[[i for i, _, _ in utf8_rejections]] = False
    return LandingRows(table, sorted(rejections, key=lambda r: r.row), row_numbers[keep])


def _field_count(text: str) -> int:
    return len(next(csv.reader([text]), []))


def _csv_lines(data: pa.Buffer) -> tuple[np.ndarray, set[int]]:
    """File rows (0-based after the header; the header is -1) of a CSV file's non-empty lines, and of its empty ones."""
    empty = np.array([not line.rstrip(b"\r\n") for line in io.BytesIO(data)], dtype=bool)
    rows = np.arange(len(empty), dtype=np.int64) - 1
    return rows[~empty], set(rows[empty].tolist())


def _csv_row_numbers(rows: int, rejected: set[int], blank: set[int]) -> np.ndarray:
    """The file row of each parsed row: file rows in order, less blank and rejected lines."""
    candidates = np.arange(rows + len(rejected | blank), dtype=np.int64)
    if not rejected and not blank:
        return candidates
    return candidates[~np.isin(candidates, np.fromiter(rejected | blank, np.int64))][:rows]


def _decode_utf8(table: pa.Table) -> tuple[pa.Table, list[tuple[int, str, str]]]:
    """Binary CSV columns as strings; rows with bytes that are not UTF-8 are dropped and returned.

    Returns the decoded table and (table row, reason, row text) per dropped row.
    """
    bad: dict[int, str] = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        try:
            column.cast(pa.string())
        except pa.ArrowInvalid:
            for row, value in enumerate(column.to_pylist()):
                if value is not None and not _is_utf8(value):
                    bad.setdefault(row, f"column {name!r} is not valid UTF-8")
    dropped = [
        (row, reason, ",".join(_as_text(column[row].as_py()) for column in table.columns))
        for row, reason in sorted(bad.items())
    ]
    keep = np.ones(table.num_rows, dtype=bool)
    keep[list(bad)] = False
    good = table.filter(pa.array(keep)) if bad else table
    return pa.Table.from_arrays([c.cast(pa.string()) for c in good.columns], names=good.column_names), dropped


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _as_text(value: bytes | None) -> str:
    return "" if value is None else value.decode("utf-8", errors="backslashreplace")


def _read_json_lines(data: pa.Buffer, name: str, cdc: CdcFormat | None, unset_absent: bool) -> LandingRows:
    records: list[object] = []
    numbers: list[int] = []
    texts: list[bytes] = []
    rejections: list[Rejection] = []
    with io.BytesIO(data) as lines:
        for number, raw in enumerate(lines):
            if not raw.strip():
                continue
            value, reason = _parse_json_line(raw, allow_null=cdc is not None)
            if reason is not None:
                rejections.append(Rejection(number, reason, _as_text(raw).rstrip("\r\n")))
            else:
                records.append(value)
                numbers.append(number)
                texts.append(raw)
    if not records and rejections:
        _refuse_single_document(data, name)
    if cdc is not None:
        return _cdc_records(records, np.array(numbers, dtype=np.int64), texts, rejections, cdc, unset_absent)
    rows = cast("list[dict[str, object]]", records)
    table = records_table(rows, sorted({k for row in rows for k in row}), unset_absent)
    return LandingRows(table, rejections, np.array(numbers, dtype=np.int64))


def _cdc_records(
    records: list[object],
    numbers: np.ndarray,
    texts: list[bytes],
    rejections: list[Rejection],
    cdc: CdcFormat,
    unset_absent: bool,
) -> LandingRows:
    """Parsed JSON Lines records (file rows ``numbers``, raw ``texts``) as changes, bad envelopes rejected."""
    mapped = records_to_changes(records, cdc, unset_absent)
    bad = [Rejection(int(numbers[r.row]), r.reason, _as_text(texts[r.row]).rstrip("\r\n")) for r in mapped.rejections]
    return LandingRows(mapped.changes, sorted(rejections + bad, key=lambda r: r.row), numbers[mapped.record_numbers])


def cdc_rows(read: LandingRows, cdc: CdcFormat, unset_absent: bool = False) -> LandingRows:
    """Rows of a Parquet or CSV file of CDC records as changes, bad records rejected with their values.

    With ``unset_absent``, a field a record lacks (a Debezium ``after`` held as
    JSON text with only some fields) is listed in its row's ``_unset``.
    """
    mapped = to_changes(read.table, cdc, unset_absent)
    records = read.records([r.row for r in mapped.rejections])
    bad = [
        Rejection(read.file_row(r.row), r.reason, record) for r, record in zip(mapped.rejections, records, strict=True)
    ]
    rows = np.array([read.file_row(int(i)) for i in mapped.record_numbers], dtype=np.int64)
    return LandingRows(mapped.changes, sorted(read.rejections + bad, key=lambda r: r.row), rows)


def _parse_json_line(raw: bytes, allow_null: bool = False) -> tuple[object, str | None]:
    """A JSON Lines line as an object (or ``None`` for ``null``, when allowed), or why it is none."""
    try:
        value = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return None, "line is not valid UTF-8"
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON: {exc.msg}"
    except RecursionError:
        return None, "JSON nested too deeply"
    if not isinstance(value, dict) and not (allow_null and value is None):
        return None, "line is not a JSON object"
    return value, None


def _refuse_single_document(data: pa.Buffer, name: str) -> None:
    """Raise when a file none of whose lines is an object holds one JSON document (an array, pretty-printed)."""
    try:
        json.loads(data.to_pybytes().decode("utf-8"))
    except (ValueError, RecursionError):
        return
    raise UnreadableFileError(
        f"{name}: holds one JSON document (an array or pretty-printed JSON), not JSON Lines (one object per line)"
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

    def __init__(self, table_storage: TableStorage) -> None:
        """The ledger of the table whose files are ``table_storage``."""
        self._storage = table_storage

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


def new_ledger_entry(file: LandingFile, rows: int, rejected: int, run_id: str) -> LedgerEntry:
    return LedgerEntry(file.name, file.size, rows, rejected, run_id, time.time())
