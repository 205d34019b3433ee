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
(the staging format: :mod:`resources.lsm.spark.staging`), never through
the JVM (benchmarks/results/design-choices.md says what that saves). There is one
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
Hadoop's object-store connectors on the JVM). The driver builds each location
once per call (:class:`~resources.lsm.ingest.landing.LandingLocation`,
:class:`~resources.lsm.ingest.quarantine.Quarantine`, the ledger) and ships
the landing and quarantine locations to the tasks; tasks re-open the table
with the driver's ``storage_options``. Which files a call takes is the scan
policy's (:mod:`resources.lsm.ingest.landing_scan`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, TypeAlias, cast

import pyarrow as pa

from ..errors import Rejection, StorageUnavailableError
from ..format.layout import STAGING_DIR
from ..format.schema import CHANGE_COLUMNS
from ..format.storage import StorageOptions
from ..ingest.landing import (
    IngestLedger,
    LandingFile,
    LandingLocation,
    LandingPolicy,
    LandingRetention,
    UnreadableFileError,
    new_ledger_entry,
)
from ..ingest.landing_scan import LandingScan, scan_landing
from ..ingest.quarantine import Quarantine, rejected_rows, validate_rows, whole_file_rejection
from ..table import LsmTable
from ..write.shard_writers import ShardTotals, ShardWriteCount
from .staging import StagedFile, StagedFiles, rows_by_bucket, write_staged

if TYPE_CHECKING:  # PySpark is imported where it runs, never at module load
    from pyspark import RDD, Accumulator, AccumulatorParam
    from pyspark.sql import SparkSession

_PerFile: TypeAlias = "dict[int, tuple[int, int, str | None]]"
"""``{file order: (rows, rejected rows, why the whole file was rejected)}``, collected by an accumulator."""
_Staged: TypeAlias = "StagedFile | Rejection"
"""What the stage RDD holds (an RDD's ``filter`` does not narrow it: hence the casts)."""


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
    shards: tuple[ShardWriteCount, ...] = ()
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
    ledger = IngestLedger(table.handle.storage)
    landing = LandingLocation(landing_dir, options)
    quarantine = Quarantine(quarantine_dir, options)
    scan = scan_landing(ledger, landing, retention, policy)
    files = scan.pending[:max_files]
    call = uuid.uuid4().hex[:8]
    changed_rows = [whole_file_rejection(name, reason) for name, reason in scan.changed.items()]
    quarantine_path = _quarantine_driver_rows(changed_rows, quarantine, run_id, call)
    if not files:
        return IngestReport(elapsed_seconds=time.monotonic() - started, scan=scan, quarantine_path=quarantine_path)

    added = _evolve_for(spark, table, landing, files, policy) if policy.auto_evolve else []
    counts = spark.sparkContext.accumulator({}, cast("AccumulatorParam[_PerFile]", _PerFileCounts()))  # duck-typed
    staging = f"{STAGING_DIR}/run={run_id}-{call}"  # one per call, even in a long run
    try:
        staged = _stage(spark, table, landing, files, counts, staging, policy)
        shard_stats = _write_here(staged, writers) if writers else _write_in_tasks(staged, table)
        per_file: _PerFile = counts.value  # every staged file reported
        rows_quarantined = sum(per_file[f.order][1] for f in files)
        if rows_quarantined:
            quarantine_path = quarantine.run_dir(run_id)
            rejected_files = [f for f in files if per_file[f.order][1]]
            restaged = _stage(spark, table, landing, rejected_files, counts, None, policy)
            _quarantine(restaged, quarantine, run_id, call)
    finally:
        counts.value = {}  # PySpark's driver keeps every accumulator: keep ours small
        table.handle.storage.delete_dir(staging)

    for f in files:
        rows, rejected, _ = per_file[f.order]
        ledger.record(new_ledger_entry(f, rows, rejected, run_id))
    landing.retire([f.name for f in files], retention)
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


def _evolve_for(
    spark: SparkSession, table: LsmTable, landing: LandingLocation, files: list[LandingFile], policy: LandingPolicy
) -> list[str]:
    """Add the columns ``files`` hold and the table lacks (``auto_evolve``); return the names added.

    One Spark pass reads every file for its columns (so ``auto_evolve`` reads
    each file twice). A column takes the type of the first file (in file
    order) that has values in it; a later file whose values do not cast to it
    has those rows rejected as usual. Columns only ever null are not added.
    """
    listing = [(f.order, f.name) for f in files]
    known = set(table.schema.names)
    found = (
        spark.sparkContext.parallelize(listing, min(len(listing), spark.sparkContext.defaultParallelism))
        .map(lambda item: (item[0], _new_columns(landing, item[1], known, policy)))
        .collect()
    )
    fields: dict[str, pa.Field] = {}
    for _, columns in sorted(found, key=lambda item: item[0]):
        for column in columns:
            fields.setdefault(column.name, column)
    # Write tasks re-open the table, so they see the new columns.
    return table.add_columns(list(fields.values())) if fields else []


def _new_columns(landing: LandingLocation, name: str, known: set[str], policy: LandingPolicy) -> list[pa.Field]:
    """The columns of one landing file that are not in ``known``, with the types read (runs in a Spark task).

    A file that cannot be read has none (it is quarantined when staged).
    """
    try:
        read = landing.read(name, policy.csv_null_markers, policy.cdc_format(name))
    except UnreadableFileError:
        return []
    return [
        pa.field(column, read.table.schema.field(column).type)
        for column in read.table.column_names
        if column not in known and column not in CHANGE_COLUMNS and not pa.types.is_null(read.table[column].type)
    ]


def _quarantine_driver_rows(rows: list[Rejection], quarantine: Quarantine, run_id: str, call: str) -> str | None:
    """Quarantine entries the driver found (changed files); return the run's quarantine path if any."""
    if not rows:
        return None
    quarantine.write(rows, f"run={run_id}/part-{call}-driver.json")
    return quarantine.run_dir(run_id)


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


def _stage(
    spark: SparkSession,
    table: LsmTable,
    landing: LandingLocation,
    files: list[LandingFile],
    counts: Accumulator[_PerFile],
    staging: str | None,
    policy: LandingPolicy,
) -> RDD[_Staged]:
    """An RDD of ``files`` staged (:class:`StagedFile`, rejected rows), computed by the job that reads it.

    Good rows go to staged files under ``staging`` (relative to the table
    root); ``None`` stages the rejected rows only. Each file's (rows,
    rejected rows) is added to the accumulator ``counts``. RDDs, not
    DataFrames: nothing here is a table for Spark, and a Python stage over an
    RDD starts ~50 ms sooner than one over Arrow batches.
    """
    # Tasks get ranges of positions in the file list (shipped with the function).
    listing = [(f.order, f.name) for f in files]
    positions = spark.sparkContext.parallelize(
        range(len(files)), min(len(files), spark.sparkContext.defaultParallelism)
    )
    uri, options = table.uri, table.storage_options
    return positions.mapPartitions(
        lambda part: _stage_files(part, listing, landing, uri, options, staging, counts, policy)
    )


def _quarantine(staged: RDD[_Staged], quarantine: Quarantine, run_id: str, call: str) -> None:
    """Write the rejected rows of ``staged`` to the run's quarantine: one JSON Lines file per task that has any.

    Files are named ``part-<call>-<partition>.json``: unique per ingestion
    call (continuous mode quarantines several calls into one run's
    directory), and a retried task overwrites its own file, atomically.
    """
    rejected = cast("RDD[Rejection]", staged.filter(lambda item: isinstance(item, Rejection)))
    rejected.mapPartitionsWithIndex(
        lambda partition, rows: [quarantine.write(list(rows), f"run={run_id}/part-{call}-{partition:05d}.json")]
    ).count()


def _write_here(staged: RDD[_Staged], table: LsmTable) -> list[ShardWriteCount]:
    """Write the good rows through this process's open writers, shards in parallel (continuous mode)."""
    started = time.monotonic()
    files = cast("RDD[StagedFile]", staged.filter(lambda item: isinstance(item, StagedFile))).collect()
    written = write_staged(table, files)
    return _shard_stats(table, written, time.monotonic() - started)


def _write_in_tasks(staged: RDD[_Staged], table: LsmTable) -> list[ShardWriteCount]:
    """Write the good rows from Spark tasks, each shard by exactly one task (batch mode)."""
    # One task per core, each writing its shards in a thread per shard, like
    # the in-process ceiling (with 4 shards on 2 cores, as fast as a task per
    # shard, and the shape continuous mode uses too).
    tasks = min(table.num_shards, staged.context.defaultParallelism)
    files = cast("RDD[StagedFile]", staged.filter(lambda item: isinstance(item, StagedFile)))
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
    listing: list[tuple[int, str]],
    landing: LandingLocation,
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
            order, name = listing[position]
            first_order = order if first_order is None else first_order
            parts, rejected, file_counts = _stage_one_file(table, landing, name, policy)
            for bucket, rows in parts:
                staged.append(bucket, rows)
            counts.add({order: file_counts})
            yield from rejected
    finally:
        files = staged.close()
    # A file is staged only after a listed file was read, which set ``first_order``.
    yield from (StagedFile(bucket, cast(int, first_order), path) for bucket, path in files)


def _stage_one_file(
    table: LsmTable, landing: LandingLocation, name: str, policy: LandingPolicy
) -> tuple[list[tuple[int, pa.Table]], list[Rejection], tuple[int, int, str | None]]:
    """One file's good rows by bucket, its rejected rows and its (rows, rejected rows, whole-file reason).

    Whatever the file holds, this returns: a file that cannot be read or
    validated at all is rejected whole (one row ``-1`` naming the file and
    the error). Only a platform fault (:func:`_is_platform_fault`) raises.
    """
    try:
        rules = table.change_rules
        read = landing.read(name, policy.csv_null_markers, policy.cdc_format(name), unset_absent=rules.partial_update)
        validated = validate_rows(read, rules)
        rejected = rejected_rows(name, read, validated.rejections)
        rows = read.table.num_rows + len(read.rejections)
        return rows_by_bucket(table, validated.valid), rejected, (rows, len(rejected), None)
    except Exception as exc:
        if _is_platform_fault(exc):
            raise
        reason = _whole_file_reason(name, exc)
        return [], [whole_file_rejection(name, reason)], (1, 1, reason)


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


def _write_partition(
    files: list[StagedFile], uri: str, storage_options: StorageOptions | None
) -> Iterator[ShardWriteCount]:
    """Write the staged files of one partition's shards through writers this task opens and closes.

    Runs in a Spark task.
    """
    started = time.monotonic()
    table = LsmTable.open(uri, storage_options=storage_options)
    try:
        written = write_staged(table, files)
        wal_bytes = _wal_bytes(table)
    finally:
        table.close()  # flushes every MemTable, in parallel
    yield from _shard_stats(table, written, time.monotonic() - started, wal_bytes)


def _wal_bytes(table: LsmTable) -> dict[str, int]:
    return {shard_id: stats.get("wal_flush_bytes", 0) for shard_id, stats in table.writer_stats().items()}


def _shard_stats(
    table: LsmTable, written: list[ShardWriteCount], elapsed: float, wal_bytes: dict[str, int] | None = None
) -> list[ShardWriteCount]:
    """The counts of the shards that got rows, with WAL bytes and ``elapsed``, the time their writing took, together."""
    wal_bytes = _wal_bytes(table) if wal_bytes is None else wal_bytes
    return [
        replace(w, wal_bytes=wal_bytes.get(w.shard_id, 0), write_seconds=elapsed)
        for w in sorted(written, key=lambda w: w.shard_id)
        if w.upserts or w.deletes
    ]
