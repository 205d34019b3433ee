"""Distributed ingestion of landing files with Spark: executors read, route and write.

Pipeline (one call to :func:`ingest_landing_files`)::

    file positions ──mapPartitions(stage)──▶ per task: one staged Arrow file per bucket
        │                                   (good rows of its files, file after file,
        │                                   each file's sorted by _seq) in the run's
        │                                   staging directory; a record per staged file
        │                                   and per rejected row; each file's row counts
        │                                   go to an accumulator
        └─ staged files ──partitionBy(bucket % tasks)──mapPartitions(write)──▶
                  per-shard stats (the only thing collected)
    files with rejections only: stage again, without staged files ──▶ rejected
                                  rows ──▶ quarantine (JSON Lines: file, row, reason, record;
                                  one file per task, written by the task through pyarrow.fs)

Each file is read and validated by one task with the engine's own rules
(:func:`~resources.lsm.write.changes.validate_changes`); the bucket comes from
Lance's hash (:meth:`LsmTable.buckets`). Spark routes and orders references
to staged files; the rows themselves go from the task that read them to the
task that writes their shard through the table's storage
(``_lsm_ingest/staging/``), never through the JVM. Converting every row to
a Spark row made ingestion ~5x slower, and even shuffling them as Arrow
blocks cost more than the writes (see benchmarks/ingest.py). There is one
write task per core; partition ``t`` holds the buckets ``b`` with
``b % tasks == t``, so exactly one task writes each shard. The task writes
its shards in parallel threads, through shard writers it opens (claim +
replay) and closes (flush) itself, each shard's staged files in file order.
Rows arrive in newest-wins order (file, then ``_seq``, then row), so each
chunk is resolved by position (:meth:`LsmTable.write_shard_ordered`).
Only files with bad rows are staged a second time, to quarantine those rows.
The driver records a file in the ledger only after the write job, and the
quarantine of its bad rows, succeeded; it deletes the staging directory when
the call ends, and :func:`~resources.lsm.maintenance.gc.collect_garbage` deletes one a
crash left behind.

Every location (table, landing directory, quarantine) may be a local path or
an object-store URI: all files are read and written through ``pyarrow.fs``
and Lance, never through Spark's own readers and writers (which would need
Hadoop's object-store connectors on the JVM). Tasks re-open the table with the
driver's ``storage_options``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias, cast

import numpy as np
import pyarrow as pa

from ..errors import InvalidChangesError, Rejection, StorageUnavailableError
from ..format.layout import STAGING_DIR
from ..format.schema import CHANGE_COLUMNS, SEQ_COLUMN
from ..format.storage import StorageOptions, TableStorage, join
from ..ingest.landing import (
    IngestLedger,
    LandingFile,
    LandingPolicy,
    LandingRetention,
    LandingRows,
    LedgerEntry,
    UnreadableFileError,
    is_complete,
    landing_dir_exists,
    list_landing_files,
    new_ledger_entry,
    read_landing_file,
    retire_landing_files,
    unsupported_landing_entries,
)
from ..table import LsmTable
from ..write.changes import ValidatedChanges, validate_changes
from ..write.shard_writers import ShardTotals, ShardWriteCount, for_each_shard

if TYPE_CHECKING:  # PySpark is imported where it runs, never at module load
    from pyspark import RDD, Accumulator, AccumulatorParam
    from pyspark.sql import SparkSession

_PerFile: TypeAlias = "dict[int, tuple[int, int, str | None]]"
"""``{file order: (rows, rejected rows, why the whole file was rejected)}``, collected by an accumulator."""
_Staged: TypeAlias = "_StagedFile | RejectedRow"
"""What the stage RDD holds (an RDD's ``filter`` does not narrow it: hence the casts)."""


@dataclass(frozen=True)
class ShardIngestStats:
    shard_id: str
    upserts: int
    deletes: int
    wal_bytes: int
    write_seconds: float


@dataclass(frozen=True)
class LandingScan:
    """What a look at the landing directory found, beyond the files to ingest.

    Attributes
    ----------
    pending
        Files to ingest now, in file-name order.
    changed
        Recorded names landed again with another size: name → what happened.
    incomplete
        Files that look still being written; left for the next run.
    unsupported
        Entries that are no landing file (extension, dangling link...): name → why.
    landing_dir_missing
        The landing directory does not exist.
    """

    pending: list[LandingFile]
    changed: dict[str, str] = field(default_factory=dict)
    incomplete: tuple[str, ...] = ()
    unsupported: dict[str, str] = field(default_factory=dict)
    landing_dir_missing: bool = False


@dataclass(frozen=True)
class IngestReport(ShardTotals):
    """What one ingestion did; ``files`` lists the landing files it recorded.

    ``files_rejected`` maps the recorded files rejected as a whole to why;
    ``scan`` is what else the landing directory held (changed, incomplete,
    unsupported files).
    """

    files: tuple[str, ...] = ()
    rows_read: int = 0
    rows_quarantined: int = 0
    shards: tuple[ShardIngestStats, ...] = ()
    elapsed_seconds: float = 0.0
    quarantine_path: str | None = None
    per_file: dict[str, tuple[int, int]] = field(default_factory=dict)
    files_rejected: dict[str, str] = field(default_factory=dict)
    scan: LandingScan = field(default_factory=lambda: LandingScan([]))
    columns_added: tuple[str, ...] = ()
    """Columns ``auto_evolve`` added to the table for these files."""

    @property
    def rows_written(self) -> int:
        return self.upserts + self.deletes

    @property
    def rows_per_second(self) -> float:
        return self.rows_read / self.elapsed_seconds if self.elapsed_seconds else 0.0


def pending_landing_files(
    table_uri: str,
    landing_dir: str,
    retention: LandingRetention = LandingRetention(),
    storage_options: StorageOptions | None = None,
) -> list[LandingFile]:
    """Landing files not yet recorded in the table's ledger, in file-name order (see :func:`scan_landing`)."""
    return scan_landing(table_uri, landing_dir, retention, storage_options=storage_options).pending


def scan_landing(
    table_uri: str,
    landing_dir: str,
    retention: LandingRetention = LandingRetention(),
    policy: LandingPolicy = LandingPolicy(),
    storage_options: StorageOptions | None = None,
) -> LandingScan:
    """Look at the landing directory: the complete files to ingest, and everything else worth reporting.

    Recorded files still in the landing directory (a crash came between
    recording and retiring them) are retired now, if they are the very file
    recorded (same size). A different file under a recorded name is reported
    in ``changed`` and, per ``policy.changed_files``, left (default) or
    ingested. Files that look still being written (:func:`is_complete`) are
    left for a later run. ``storage_options`` apply to the table (ledger)
    and the landing directory alike.
    """
    ledger = IngestLedger(table_uri, storage_options)
    done = ledger.ingested_names()
    every_file = list_landing_files(landing_dir, storage_options)
    refused = {f.name: reason for f in every_file if (reason := policy.refusal(f.name))}
    listing = [f for f in every_file if f.name not in refused]
    entries = {f.name: ledger.entry(f.name) for f in listing if f.name in done}
    leftovers = [f.name for f in listing if _same_size(entries.get(f.name), f)]
    retire_landing_files(landing_dir, leftovers, retention, storage_options)
    changed = {f.name: _changed_reason(f, entries[f.name], policy) for f in listing if _is_changed(entries, f)}
    new = [f for f in listing if f.name not in done or (f.name in changed and policy.changed_files == "ingest")]
    complete = [f for f in new if is_complete(f, policy.settle_seconds, storage_options=storage_options)]
    return LandingScan(
        pending=complete,
        changed=changed,
        incomplete=tuple(f.name for f in new if f not in complete),
        unsupported={**unsupported_landing_entries(landing_dir, storage_options), **refused},
        landing_dir_missing=not landing_dir_exists(landing_dir, storage_options),
    )


def _same_size(entry: LedgerEntry | None, file: LandingFile) -> bool:
    return entry is not None and entry.size == file.size


def _is_changed(entries: dict[str, LedgerEntry | None], file: LandingFile) -> bool:
    return file.name in entries and not _same_size(entries[file.name], file)


def _changed_reason(file: LandingFile, entry: LedgerEntry | None, policy: LandingPolicy) -> str:
    recorded = "?" if entry is None else entry.size
    action = "ingested again" if policy.changed_files == "ingest" else "skipped, left in place"
    return (
        f"landed again with {file.size} bytes, but a file of this name with {recorded} bytes was already "
        f"ingested: {action} (changed_files={policy.changed_files!r})"
    )


def ingest_landing_files(
    spark: SparkSession,
    table_uri: str,
    landing_dir: str,
    quarantine_dir: str,
    run_id: str | None = None,
    *,
    writers: LsmTable | None = None,
    max_files: int | None = None,
    retention: LandingRetention = LandingRetention(),
    policy: LandingPolicy = LandingPolicy(),
    storage_options: StorageOptions | None = None,
) -> IngestReport:
    """Ingest pending landing files (file-name order) into the table; return what happened.

    Parameters
    ----------
    writers
        ``None`` (batch mode): Spark tasks write, each opening and closing the
        writers of its shards. An :class:`LsmTable` whose writers stay open
        (continuous mode): Spark stages the files, and the rows are written
        here through those writers, so no generation is cut per micro-batch.
    max_files
        Ingest at most this many files (a micro-batch); ``None`` for all.
    retention
        What happens to a file after it was recorded (default: moved to
        ``_archive/`` in the landing directory).
    policy
        CSV null markers, what to do with a changed file landed again under
        a recorded name, when a text file counts as completely written.
    storage_options
        Object-store options (as for :meth:`LsmTable.open`) for the table,
        the landing directory and the quarantine, here and in every task;
        ignored when ``writers`` is given (its own are used). ``None``: the
        environment (``AWS_*``) configures object stores.

    A file's content never fails the call: rows that cannot be parsed or
    validated are quarantined (with file, row, reason and record), a file
    that cannot be read at all is quarantined whole (row -1, the error and
    the file name) and recorded. Only platform faults (storage, Spark,
    memory) raise; then nothing of the call is recorded.

    Re-running after a crash re-applies exactly the files that were not
    recorded, in order, which leaves the merged view as if they had been
    applied once.

    Raises
    ------
    WriterFencedError
        (In batch mode wrapped in Spark's task error.) Another writer claimed a
        shard mid-write; nothing is recorded and the run can be retried.
    """
    started = time.monotonic()
    run_id = run_id or uuid.uuid4().hex[:12]
    table = writers or LsmTable.open(table_uri, storage_options=storage_options)
    options = table.storage_options
    scan = scan_landing(table_uri, landing_dir, retention, policy, options)
    files = scan.pending[:max_files]
    call = uuid.uuid4().hex[:8]
    changed_rows = [RejectedRow(name, -1, reason, None) for name, reason in scan.changed.items()]
    quarantine_path = _quarantine_driver_rows(changed_rows, quarantine_dir, run_id, call, options)
    if not files:
        return IngestReport(elapsed_seconds=time.monotonic() - started, scan=scan, quarantine_path=quarantine_path)

    added = _evolve_for(spark, table, files, policy) if policy.auto_evolve else []
    counts = spark.sparkContext.accumulator({}, cast("AccumulatorParam[_PerFile]", _PerFileCounts()))  # duck-typed
    staging = f"{STAGING_DIR}/run={run_id}-{call}"  # one per call, even in a long run
    try:
        staged = _stage(spark, table, files, counts, staging, policy)
        shard_stats = _write_here(staged, writers) if writers else _write_in_tasks(staged, table)
        per_file: _PerFile = counts.value  # every staged file reported
        rows_quarantined = sum(per_file[f.order][1] for f in files)
        if rows_quarantined:
            quarantine_path = _quarantine_path(quarantine_dir, run_id)
            rejected_files = [f for f in files if per_file[f.order][1]]
            restaged = _stage(spark, table, rejected_files, counts, None, policy)
            _quarantine(restaged, quarantine_path, call, options)
    finally:
        counts.value = {}  # PySpark's driver keeps every accumulator: keep ours small
        table.handle.storage.delete_dir(staging)

    ledger = IngestLedger(table_uri, options)
    for f in files:
        rows, rejected, _ = per_file[f.order]
        ledger.record(new_ledger_entry(f, rows, rejected, run_id))
    retire_landing_files(landing_dir, [f.name for f in files], retention, options)
    return IngestReport(
        files=tuple(f.name for f in files),
        rows_read=sum(per_file[f.order][0] for f in files),
        rows_quarantined=rows_quarantined,
        shards=tuple(shard_stats),
        elapsed_seconds=time.monotonic() - started,
        quarantine_path=quarantine_path,
        per_file={f.name: per_file[f.order][:2] for f in files},
        files_rejected={f.name: reason for f in files if (reason := per_file[f.order][2]) is not None},
        scan=scan,
        columns_added=tuple(added),
    )


def _evolve_for(spark: SparkSession, table: LsmTable, files: list[LandingFile], policy: LandingPolicy) -> list[str]:
    """Add the columns ``files`` hold and the table lacks (``auto_evolve``); return the names added.

    One Spark pass reads every file for its columns (so ``auto_evolve`` reads
    each file twice). A column takes the type of the first file (in file
    order) that has values in it; a later file whose values do not cast to it
    has those rows rejected as usual. Columns only ever null are not added.
    """
    listing = [(f.order, f.name, f.path) for f in files]
    known, options = set(table.schema.names), table.storage_options
    found = (
        spark.sparkContext.parallelize(listing, min(len(listing), spark.sparkContext.defaultParallelism))
        .map(lambda item: (item[0], _new_columns(item[1], item[2], known, policy, options)))
        .collect()
    )
    fields: dict[str, pa.Field] = {}
    for _, columns in sorted(found, key=lambda item: item[0]):
        for column in columns:
            fields.setdefault(column.name, column)
    # Write tasks re-open the table, so they see the new columns.
    return table.add_columns(list(fields.values())) if fields else []


def _new_columns(
    name: str, path: str, known: set[str], policy: LandingPolicy, storage_options: StorageOptions | None
) -> list[pa.Field]:
    """The columns of one landing file that are not in ``known``, with the types read (runs in a Spark task).

    A file that cannot be read has none (it is quarantined when staged).
    """
    try:
        read = read_landing_file(path, policy.csv_null_markers, storage_options, policy.cdc_format(name))
    except UnreadableFileError:
        return []
    return [
        pa.field(column, read.table.schema.field(column).type)
        for column in read.table.column_names
        if column not in known and column not in CHANGE_COLUMNS and not pa.types.is_null(read.table[column].type)
    ]


def _quarantine_path(quarantine_dir: str, run_id: str) -> str:
    return join(quarantine_dir, f"run={run_id}")


def _quarantine_driver_rows(
    rows: list[RejectedRow], quarantine_dir: str, run_id: str, call: str, storage_options: StorageOptions | None
) -> str | None:
    """Quarantine entries the driver found (changed files); return the run's quarantine path if any."""
    if not rows:
        return None
    path = _quarantine_path(quarantine_dir, run_id)
    for _ in write_quarantine_file(rows, path, f"part-{call}-driver.json", storage_options):
        pass
    return path


# --------------------------------------------------------------------- driver side


class _PerFileCounts:
    """Spark accumulator parameter for ``{file order: (rows, rejected rows)}``.

    Merging overwrites, so a task Spark runs again (a retry, a recomputed
    stage) reports the same values instead of adding them twice.
    """

    def zero(self, value: _PerFile) -> _PerFile:
        return {}

    def addInPlace(self, counts: _PerFile, more: _PerFile) -> _PerFile:
        counts.update(more)
        return counts


@dataclass(frozen=True, order=True)
class _StagedFile:
    """One staged file: good rows of ``bucket`` from one task's landing files, the first being ``first_order``."""

    bucket: int
    first_order: int
    path: str
    """Relative to the table root."""


@dataclass(frozen=True)
class RejectedRow:
    file: str
    row: int
    reason: str
    record: str | None


def _stage(
    spark: SparkSession,
    table: LsmTable,
    files: list[LandingFile],
    counts: Accumulator[_PerFile],
    staging: str | None,
    policy: LandingPolicy,
) -> RDD[_Staged]:
    """An RDD of ``files`` staged (:class:`_StagedFile`, :class:`RejectedRow`), computed by the job that reads it.

    Good rows go to staged files under ``staging`` (relative to the table
    root); ``None`` stages the rejected rows only. Each file's (rows,
    rejected rows) is added to the accumulator ``counts``. RDDs, not
    DataFrames: nothing here is a table for Spark, and a Python stage over an
    RDD starts ~50 ms sooner than one over Arrow batches.
    """
    # Tasks get ranges of positions in the file list (shipped with the function).
    listing = [(f.order, f.name, f.path) for f in files]
    positions = spark.sparkContext.parallelize(
        range(len(files)), min(len(files), spark.sparkContext.defaultParallelism)
    )
    uri, options = table.uri, table.storage_options
    return positions.mapPartitions(lambda part: _stage_files(part, listing, uri, options, staging, counts, policy))


def _quarantine(staged: RDD[_Staged], path: str, call: str, storage_options: StorageOptions | None) -> None:
    """Write the rejected rows of ``staged`` below ``path``: one JSON Lines file per task that has any.

    Files are named ``part-<call>-<partition>.json``: unique per ingestion
    call (continuous mode quarantines several calls into one run's
    directory), and a retried task overwrites its own file, atomically.
    """
    rejected = cast("RDD[RejectedRow]", staged.filter(lambda item: isinstance(item, RejectedRow)))
    rejected.mapPartitionsWithIndex(
        lambda partition, rows: write_quarantine_file(
            list(rows), path, f"part-{call}-{partition:05d}.json", storage_options
        )
    ).count()


def _write_here(staged: RDD[_Staged], table: LsmTable) -> list[ShardIngestStats]:
    """Write the good rows through this process's open writers, shards in parallel (continuous mode)."""
    started = time.monotonic()
    files = cast("RDD[_StagedFile]", staged.filter(lambda item: isinstance(item, _StagedFile))).collect()
    written = _write_staged(table, files)
    return _shard_stats(table, written, time.monotonic() - started)


def _write_in_tasks(staged: RDD[_Staged], table: LsmTable) -> list[ShardIngestStats]:
    """Write the good rows from Spark tasks, each shard by exactly one task (batch mode)."""
    # One task per core, each writing its shards in a thread per shard, like
    # the in-process ceiling (with 4 shards on 2 cores, as fast as a task per
    # shard, and the shape continuous mode uses too).
    tasks = min(table.num_shards, staged.context.defaultParallelism)
    files = cast("RDD[_StagedFile]", staged.filter(lambda item: isinstance(item, _StagedFile)))
    by_task = files.map(lambda f: (f.bucket % tasks, f))
    uri, options = table.uri, table.storage_options
    # Partition = task exactly (the task number is the partition function).
    return (
        by_task.partitionBy(tasks, lambda task: task)
        .mapPartitions(lambda part: _write_partition([f for _, f in part], uri, options))
        .collect()
    )


# --------------------------------------------------------------- executor side


def _stage_files(
    positions: Iterable[int],
    listing: list[tuple[int, str, str]],
    uri: str,
    storage_options: StorageOptions | None,
    staging: str | None,
    counts: Accumulator[_PerFile],
    policy: LandingPolicy,
) -> Iterator[_Staged]:
    """Read, validate and route the listed files at ``positions`` (runs in a Spark task).

    Yields each file's rejected rows as it goes, then this task's staged files.
    """
    from pyspark import TaskContext

    table = LsmTable.open(uri, storage_options=storage_options)
    task = cast(TaskContext, TaskContext.get())  # set: this runs in a Spark task
    staged = StagedFiles(table.handle.storage, staging, f"part-{task.partitionId():05d}-{task.attemptNumber()}")
    first_order: int | None = None
    try:
        for position in positions:
            order, name, path = listing[position]
            first_order = order if first_order is None else first_order
            parts, rejected, file_counts = _stage_one_file(table, name, path, policy)
            for bucket, rows in parts:
                staged.append(bucket, rows)
            counts.add({order: file_counts})
            yield from rejected
    finally:
        files = staged.close()
    # A file is staged only after a listed file was read, which set ``first_order``.
    yield from (_StagedFile(bucket, cast(int, first_order), path) for bucket, path in files)


class StagedFiles:
    """One Arrow IPC stream per bucket under ``directory``, written by one stage task attempt.

    ``directory`` ``None`` stages nothing (the quarantine pass needs only the rejected rows).
    """

    def __init__(self, storage: TableStorage, directory: str | None, prefix: str) -> None:
        self._storage, self._directory, self._prefix = storage, directory, prefix
        self._open: dict[int, tuple[str, pa.NativeFile, pa.ipc.RecordBatchStreamWriter]] = {}

    def append(self, bucket: int, rows: pa.Table) -> None:
        if self._directory is None:
            return
        if bucket not in self._open:
            if not self._open:
                self._storage.fs.create_dir(self._storage.path(self._directory), recursive=True)
            path = f"{self._directory}/{self._prefix}-bucket-{bucket:05d}.arrows"
            sink = self._storage.fs.open_output_stream(self._storage.path(path))
            self._open[bucket] = (path, sink, pa.ipc.new_stream(sink, rows.schema))
        self._open[bucket][2].write_table(rows)

    def close(self) -> list[tuple[int, str]]:
        """Close every file; return (bucket, path) of each, in bucket order."""
        for _, sink, writer in self._open.values():
            writer.close()
            sink.close()
        return sorted((bucket, path) for bucket, (path, _, _) in self._open.items())


def read_staged(storage: TableStorage, paths: Iterable[str]) -> Iterator[pa.Table]:
    """The rows of staged files, in order, a batch at a time.

    Each file is read whole, with the store's retries (a transient error
    mid-stream could not be resumed), so memory holds one staged file.
    """
    for path in paths:
        for batch in pa.ipc.open_stream(pa.BufferReader(storage.read_bytes(path))):
            yield pa.Table.from_batches([batch])


def _stage_one_file(
    table: LsmTable, name: str, path: str, policy: LandingPolicy
) -> tuple[list[tuple[int, pa.Table]], list[RejectedRow], tuple[int, int, str | None]]:
    """One file's good rows by bucket, its rejected rows and its (rows, rejected rows, whole-file reason).

    Whatever the file holds, this returns: a file that cannot be read or
    validated at all is rejected whole (one row ``-1`` naming the file and
    the error). Only a platform fault (:func:`_is_platform_fault`) raises.
    """
    try:
        read = read_landing_file(path, policy.csv_null_markers, table.storage_options, policy.cdc_format(name))
        validated = validate_file(table, read)
        rejected = rejected_rows(name, read, validated.rejections)
        rows = read.table.num_rows + len(read.rejections)
        return _rows_by_bucket(table, validated.valid), rejected, (rows, len(rejected), None)
    except Exception as exc:
        if _is_platform_fault(exc):
            raise
        reason = _whole_file_reason(name, exc)
        return [], [RejectedRow(name, -1, reason, None)], (1, 1, reason)


def validate_file(table: LsmTable, read: LandingRows) -> ValidatedChanges:
    """The file's parsed rows validated; a batch-level problem rejects every row with its reason."""
    try:
        return validate_changes(
            read.table,
            table.schema,
            table.primary_key,
            reject_unknown_columns=True,
            optional_columns=table.added_columns,
        )
    except InvalidChangesError as exc:
        if exc.problem is None or not read.table.num_rows:
            raise
        everyone = [Rejection(r, exc.problem) for r in range(read.table.num_rows)]
        return ValidatedChanges(read.table.slice(0, 0), everyone)


def _whole_file_reason(name: str, exc: BaseException) -> str:
    message = str(exc) if isinstance(exc, UnreadableFileError) else f"{type(exc).__name__}: {exc}"
    return message if message.startswith(name) else f"{name}: {message}"


_PLATFORM_FAULTS = (
    MemoryError,
    ConnectionError,
    TimeoutError,
    PermissionError,
    FileNotFoundError,
    StorageUnavailableError,
)


def _is_platform_fault(exc: BaseException) -> bool:
    """Whether reading a file failed for the platform (storage, memory), not its content.

    Operating-system errors with an ``errno`` and object-store errors are the
    platform's; Arrow's own I/O errors (a corrupt Parquet footer) are content.
    """
    for error in (exc, exc.__cause__):
        if isinstance(error, _PLATFORM_FAULTS):
            return True
        if isinstance(error, OSError) and (error.errno is not None or "AWS Error" in str(error)):
            return True
    return False


def _rows_by_bucket(table: LsmTable, good: pa.Table) -> list[tuple[int, pa.Table]]:
    """Good rows (in file order) split by bucket, each part sorted by ``_seq``.

    The sort is stable, so rows with equal ``_seq`` keep their file order:
    the write task lets the later of them win. A part's row order is its
    newest-wins order, so ``_seq`` itself is left out.
    """
    if not good.num_rows:
        return []
    buckets = table.buckets(good.select(table.primary_key))
    order = np.lexsort((good[SEQ_COLUMN].to_numpy(), buckets))  # by bucket, then _seq; stable
    ordered, ordered_buckets = good.drop_columns([SEQ_COLUMN]).take(order), buckets[order]
    values, starts = np.unique(ordered_buckets, return_index=True)
    ends = [*starts[1:], good.num_rows]
    return [(int(b), ordered.slice(start, end - start)) for b, start, end in zip(values, starts, ends, strict=True)]


def rejected_rows(name: str, read: LandingRows, invalid: list[Rejection]) -> list[RejectedRow]:
    """The file's rejected rows in file-row order: lines that did not parse (with their text), then invalid rows.

    An invalid row's record is the row as read, as JSON; its row is its file row.
    """
    rows = [RejectedRow(name, r.row, r.reason, r.text) for r in read.rejections]
    if invalid:
        records = read.table.take(pa.array([r.row for r in invalid], pa.int64())).to_pylist()
        rows += [
            RejectedRow(name, read.file_row(r.row), r.reason, json.dumps(record, default=str))
            for r, record in zip(invalid, records, strict=True)
        ]
    return sorted(rows, key=lambda r: r.row)


def write_quarantine_file(
    rows: list[RejectedRow], directory: str, name: str, storage_options: StorageOptions | None
) -> Iterator[int]:
    """Write ``rows`` as JSON Lines (file, row, reason, record) to ``directory/name``, if any; yield the count.

    Runs in a Spark task. Readers see the whole file or none of it.
    """
    if rows:
        lines = "".join(
            json.dumps({"file": r.file, "row": r.row, "reason": r.reason, "record": r.record}) + "\n" for r in rows
        )
        TableStorage(directory, storage_options).write_bytes_atomic(name, lines.encode())
    yield len(rows)


def _write_partition(
    files: list[_StagedFile], uri: str, storage_options: StorageOptions | None
) -> Iterator[ShardIngestStats]:
    """Write the staged files of one partition's shards through writers this task opens and closes.

    Runs in a Spark task.
    """
    started = time.monotonic()
    table = LsmTable.open(uri, storage_options=storage_options)
    try:
        written = _write_staged(table, files)
        wal_bytes = _wal_bytes(table)
    finally:
        table.close()  # flushes every MemTable, in parallel
    yield from _shard_stats(table, written, time.monotonic() - started, wal_bytes)


def _write_staged(table: LsmTable, files: Iterable[_StagedFile]) -> list[ShardWriteCount]:
    """Write the staged files, one thread per shard, each shard's in file order."""
    paths: dict[str, list[str]] = {}
    for f in sorted(files):  # by bucket, then first landing file
        paths.setdefault(table.shard_ids[f.bucket], []).append(f.path)
    storage = table.handle.storage
    return for_each_shard(lambda shard_id: _write_shard(table, shard_id, read_staged(storage, paths[shard_id])), paths)


def _wal_bytes(table: LsmTable) -> dict[str, int]:
    return {shard_id: stats.get("wal_flush_bytes", 0) for shard_id, stats in table.writer_stats().items()}


def _shard_stats(
    table: LsmTable, written: list[ShardWriteCount], elapsed: float, wal_bytes: dict[str, int] | None = None
) -> list[ShardIngestStats]:
    """Stats of the shards that got rows; ``elapsed`` is the time their writing took, together."""
    wal_bytes = _wal_bytes(table) if wal_bytes is None else wal_bytes
    return [
        ShardIngestStats(w.shard_id, w.upserts, w.deletes, wal_bytes.get(w.shard_id, 0), elapsed)
        for w in sorted(written, key=lambda w: w.shard_id)
        if w.upserts or w.deletes
    ]


def _write_shard(table: LsmTable, shard_id: str, parts: Iterable[pa.Table]) -> ShardWriteCount:
    """Write one shard's rows (tables, in order), in chunks of at most a MemTable's rows; return the totals.

    Each chunk is durable in the shard's WAL before the next one is read.
    """
    upserts = deletes = 0
    for chunk in _chunks(parts, table.max_rows_per_put):
        written = table.write_shard_ordered(shard_id, chunk)
        upserts, deletes = upserts + written.upserts, deletes + written.deletes
    return ShardWriteCount(shard_id, upserts, deletes)


def _chunks(tables: Iterable[pa.Table], rows_per_chunk: int) -> Iterator[pa.Table]:
    """Re-cut consecutive tables into chunks of ``rows_per_chunk`` rows (the last may be smaller), in order."""
    pending: list[pa.Table] = []
    size = 0
    for rows in tables:
        while rows.num_rows:
            taken = min(rows_per_chunk - size, rows.num_rows)
            pending.append(rows.slice(0, taken))
            size += taken
            rows = rows.slice(taken)
            if size == rows_per_chunk:
                yield pa.concat_tables(pending)
                pending, size = [], 0
    if pending:
        yield pa.concat_tables(pending)
