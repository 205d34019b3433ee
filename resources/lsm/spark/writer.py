"""Writing to an LSM table from any Spark job: the ``lance_lsm`` DataFrame writer and streaming sink.

::

    register_spark_source(spark)
    df.write.format("lance_lsm").mode("append").save(uri)
    df.write.format("lance_lsm").mode("append").option("write_id", "orders-2026-11-23").save(uri)
    df.writeStream.format("lance_lsm").option("checkpointLocation", ckpt).start(uri)

Rows are upserts; ``_op`` ('upsert' | 'delete') and ``_seq`` (int64) are
honoured when the DataFrame has them: per key, the highest ``_seq`` of the
write wins (on ties, the row of the higher partition, then the later row).

Options: ``write_id`` (names the write; a job re-run with the same id applies
nothing twice; a job defaults to a new id, a stream to ``stream-<query id>``:
Spark keeps the query id in the checkpoint, so a restart from the checkpoint
continues the same write and a fresh checkpoint starts a new one),
``quarantine`` (where rejected rows go; default ``<table>/_lsm_ingest/quarantine``),
``fail_on_rejects`` (``true``: the job fails when a row was rejected, and
nothing is applied), ``storage.<key>`` (Lance storage options),
``auto_evolve`` (``true``: columns the table lacks are added, nullable,
before any task runs; otherwise rows holding a value in one are rejected)
and ``cdc`` (``debezium`` or ``generic``: rows are CDC records, decoded as
landing files of that format are, with ``cdc.order_by``, ``cdc.op_column``,
``cdc.delete_values``, ``cdc.upsert_values``, ``cdc.order_columns`` and
``cdc.drop_columns``, lists comma-separated; ``_seq`` is the record's
ordering value, which must be one integer such as ``source.lsn`` or
``ts_ms``, as partitions carry no order).

How one write (a job, or one micro-batch) goes, reusing the landing
ingestion's machinery (:mod:`resources.lsm.spark.ingest`)::

    task (partition p, attempt a): each Arrow batch ──changes_of_batch──▶ good rows by bucket,
        staged as _lsm_ingest/staging/<write>/part-<p>-<a>-bucket-<b>.arrows; rejected rows
        as part-<p>-<a>-rejected.json; returns a StagedPartition (its files) as commit message
    driver commit (one message per partition, from the attempt Spark let commit):
        quarantine the rejected rows ──▶ per shard, in parallel: read its staged files (partition
        order), newest per key by _seq, put through one writer (durable WAL), record
        "<write id>: shard done up to batch N" ──▶ close the writers (flush) ──▶ delete staging

Exactly once: only files named in the commit messages are applied, so a
failed, retried or speculative attempt's files are never read; nothing is
applied before every task succeeded. The write ledger
(``_lsm_ingest/writes/<write id>/<shard>.json``) records, per shard, the
last batch applied (``0`` for a batch job, the micro-batch id for a stream),
written right after that shard's rows are durable, so a re-run job or a
replayed micro-batch skips the shards it already applied and applies the
others. Each shard is written by one writer (one thread of the commit), which
claims the shard: a concurrent writer of the shard is fenced, and a commit
fenced by another writer fails (then the re-run finishes the shards left).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from ..errors import InvalidChangesError, Rejection
from ..format.layout import QUARANTINE_DIR, STAGING_DIR, WRITES_DIR
from ..format.schema import CHANGE_COLUMNS
from ..format.storage import StorageOptions, TableStorage
from ..ingest.cdc import CdcFormat
from ..ingest.landing import LandingRows, cdc_rows
from ..ingest.quarantine import Quarantine, quarantine_lines, rejected_rows, validate_rows
from ..table import LsmTable
from ..write.shard_writers import ShardWriteCount, for_each_shard
from .options import storage_options_of
from .staging import StagedFiles, read_staged

STREAM_BATCH_ID = "streaming.sql.batchId"
STREAM_QUERY_ID = "sql.streaming.queryId"
"""Local properties Spark sets on every task of a micro-batch (the query id survives restarts from the checkpoint)."""
_WRITE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=-]{0,127}$")


@dataclass(frozen=True)
class WriteOptions:
    """The writer's options, parsed on the driver (see the module docstring)."""

    uri: str
    write_id: str | None
    """The ``write_id`` option; ``None``: a new id per job, ``stream-<query id>`` per stream."""
    quarantine_dir: str
    fail_on_rejects: bool
    storage_options: StorageOptions | None
    cdc: CdcFormat | None = None
    """The ``cdc`` options: rows are CDC records, decoded like landing files of that format."""


def write_options(options: Mapping[str, str], schema: StructType, overwrite: bool) -> WriteOptions:
    """Parse and check the writer's options against the table, before any task runs.

    Raises
    ------
    ValueError
        For ``mode("overwrite")``, a missing table URI or a bad ``write_id``.
    InvalidChangesError
        If the DataFrame lacks a key column or repeats a column name: no row
        of it could be written (rows are checked one by one in the tasks).
    """
    lowered = {key.lower(): value for key, value in options.items()}
    if overwrite:
        raise ValueError('lance_lsm rows are upserts into the table: use mode("append"), not overwrite')
    if not lowered.get("path"):
        raise ValueError('lance_lsm needs a table URI: df.write.format("lance_lsm").save(uri)')
    table = LsmTable.open(lowered["path"], storage_options=storage_options_of(options))
    cdc = _cdc_format(lowered)
    if cdc is None:  # CDC records carry their keys inside envelopes: checked per record
        frame = to_arrow_schema(schema).empty_table()
        if lowered.get("auto_evolve", "false").strip().lower() == "true":
            _add_unknown_columns(table, frame.schema)
        table.change_rules.validate(frame, reject_unknown_columns=True)
    write_id = lowered.get("write_id")
    if write_id is not None and not _WRITE_ID.match(write_id):
        raise ValueError(f"write_id {write_id!r} must match {_WRITE_ID.pattern}")
    return WriteOptions(
        uri=table.uri,
        write_id=write_id,
        quarantine_dir=lowered.get("quarantine") or table.handle.storage.uri(QUARANTINE_DIR),
        fail_on_rejects=lowered.get("fail_on_rejects", "false").strip().lower() == "true",
        storage_options=table.storage_options,
        cdc=cdc,
    )


def _cdc_format(options: Mapping[str, str]) -> CdcFormat | None:
    """The ``cdc`` option (``debezium`` or ``generic``) and its ``cdc.<field>`` settings, if given.

    ``_seq`` is the ordering value itself (``sequence="value"``): Spark's
    partitions and micro-batches carry no order of their own.
    """
    kind = options.get("cdc")
    if not kind:
        return None
    lists = {"delete_values", "upsert_values", "order_columns", "drop_columns"}
    fields: dict[str, Any] = {"kind": kind.strip().lower(), "sequence": "value"}
    for name in ("order_by", "op_column", *sorted(lists)):
        if (value := options.get(f"cdc.{name}")) is not None:
            fields[name] = tuple(v.strip() for v in value.split(",") if v.strip()) if name in lists else value
    return CdcFormat(**fields)


def _add_unknown_columns(table: LsmTable, frame: pa.Schema) -> None:
    """``auto_evolve``: add the DataFrame's columns the table lacks (nullable), before any task runs."""
    new = [f.with_nullable(True) for f in frame if f.name not in table.schema.names and f.name not in CHANGE_COLUMNS]
    if new:
        table.add_columns(new)


@dataclass(frozen=True)
class StagedPartition(WriterCommitMessage):
    """What one task attempt staged: its commit message.

    ``files`` are ``(bucket, path)`` with paths relative to the table root,
    in bucket order; ``rejected_path`` holds the rejected rows (JSON Lines,
    as the quarantine), if any.
    """

    write_id: str
    partition: int
    attempt: int
    files: tuple[tuple[int, str], ...]
    rows: int
    rejected: int
    rejected_path: str | None


@dataclass(frozen=True)
class SparkWriteReport:
    """What one commit (a job, or a micro-batch) did, as recorded in ``<write id>/last-commit.json``.

    ``shards`` maps each shard written to ``(upserts, deletes)``; ``skipped``
    lists the shards whose rows an earlier commit of the same write id and
    batch had applied already.
    """

    write_id: str
    batch_id: int
    rows: int
    rejected: int
    quarantine_path: str | None
    shards: dict[str, tuple[int, int]] = field(default_factory=dict)
    skipped: tuple[str, ...] = ()
    committed_at: float = 0.0


class LsmBatchWriter(DataSourceArrowWriter):
    """``df.write.format("lance_lsm")``: tasks stage, the driver's :meth:`commit` applies."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        # Chosen on the driver, shipped to every task and to the commit: one directory per job.
        self.write_id = options.write_id or f"job-{uuid.uuid4().hex[:12]}"
        self.staging = f"{STAGING_DIR}/write={self.write_id}-{uuid.uuid4().hex[:8]}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedPartition:
        return stage_partition(self.options, self.write_id, self.staging, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_staged(self.options, self.write_id, self.staging, 0, _staged(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        TableStorage(self.options.uri, self.options.storage_options).delete_dir(self.staging)


class LsmStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("lance_lsm")``: as :class:`LsmBatchWriter`, once per micro-batch.

    Spark builds a new writer for each micro-batch, in the planning and in
    the committing process alike, so nothing is chosen here: tasks read the
    query id and the batch id from their local properties, the commit gets
    the write id from their messages. The staging directory is named after both.
    """

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedPartition:
        from pyspark import TaskContext

        task = cast(TaskContext, TaskContext.get())
        batch_id, query_id = task.getLocalProperty(STREAM_BATCH_ID), task.getLocalProperty(STREAM_QUERY_ID)
        if batch_id is None or query_id is None:
            raise RuntimeError(f"a lance_lsm stream task lacks the {STREAM_BATCH_ID} or {STREAM_QUERY_ID} property")
        write_id = self.options.write_id or f"stream-{query_id}"
        return stage_partition(self.options, write_id, _stream_staging(write_id, int(batch_id)), iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        parts = _staged(messages)
        if parts:  # no partition, no rows
            write_id = parts[0].write_id
            commit_staged(self.options, write_id, _stream_staging(write_id, batchId), batchId, parts)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        for write_id in {p.write_id for p in _staged(messages)}:  # else garbage collection deletes it
            TableStorage(self.options.uri, self.options.storage_options).delete_dir(_stream_staging(write_id, batchId))


def _stream_staging(write_id: str, batch_id: int) -> str:
    return f"{STAGING_DIR}/write={write_id}-batch={batch_id}"


def _staged(messages: list[WriterCommitMessage | None]) -> list[StagedPartition]:
    """The commit messages (Spark calls ``commit`` only once every task succeeded, so none is missing)."""
    return [cast(StagedPartition, m) for m in messages if m is not None]


# --------------------------------------------------------------- executor side


def changes_of_batch(
    table: LsmTable, rows: pa.Table, source: str, first_row: int, cdc: CdcFormat | None = None
) -> tuple[pa.Table, list[Rejection]]:
    """Turn one incoming Arrow batch into changes: the valid rows and the rejected ones.

    The valid rows are :attr:`ValidatedChanges.valid`-shaped (the table's
    columns and types, ``_op``, ``_seq``), in input order. Rejected rows are
    judged exactly as landing-file rows are (a column the table lacks
    rejects the rows holding a value in it); each carries ``source`` and its
    row number, counted from ``first_row``. With ``cdc`` the rows are CDC
    records, decoded first (malformed ones rejected with their reason).
    """
    rules = table.change_rules
    read = LandingRows(rows, [], np.arange(first_row, first_row + rows.num_rows, dtype=np.int64))
    if cdc is not None:
        read = cdc_rows(read, cdc, rules.partial_update)
    validated = validate_rows(read, rules)
    return validated.valid, rejected_rows(source, read, validated.rejections)


def stage_partition(
    options: WriteOptions, write_id: str, staging: str, batches: Iterable[pa.RecordBatch]
) -> StagedPartition:
    """Validate and route one task's rows into staged files under ``staging``; runs in a Spark task.

    Returns the commit message naming the files this attempt wrote. Bad rows
    never fail the task; storage faults do.
    """
    from pyspark import TaskContext

    task = cast(TaskContext, TaskContext.get())
    table = LsmTable.open(options.uri, storage_options=options.storage_options)
    prefix = f"part-{task.partitionId():05d}-{task.attemptNumber()}"
    source = f"{staging.rsplit('/', 1)[1]}/part-{task.partitionId():05d}"  # write=<id>-..., partition
    staged = StagedFiles(table.handle.storage, staging, prefix)
    rejected: list[Rejection] = []
    rows = 0
    try:
        for batch in batches:
            valid, bad = changes_of_batch(table, pa.Table.from_batches([batch]), source, rows, options.cdc)
            rows, rejected = rows + batch.num_rows, rejected + bad
            for bucket, part in _by_bucket(table, valid):
                staged.append(bucket, part)
    finally:
        files = staged.close()
    rejected_path = f"{staging}/{prefix}-rejected.json" if rejected else None
    if rejected_path is not None:  # the commit copies a committed attempt's to the quarantine
        table.handle.storage.write_bytes_atomic(rejected_path, quarantine_lines(rejected))
    return StagedPartition(
        write_id, task.partitionId(), task.attemptNumber(), tuple(files), rows, len(rejected), rejected_path
    )


def _by_bucket(table: LsmTable, valid: pa.Table) -> Iterator[tuple[int, pa.Table]]:
    """The valid rows of each bucket, in input order (``_seq`` kept: the commit orders across partitions)."""
    if not valid.num_rows:
        return
    buckets = table.buckets(valid.select(table.primary_key))
    for bucket in np.unique(buckets):
        yield int(bucket), valid.filter(pa.array(buckets == bucket))


# --------------------------------------------------------------- driver side


def commit_staged(
    options: WriteOptions, write_id: str, staging: str, batch_id: int, parts: list[StagedPartition]
) -> SparkWriteReport:
    """Apply the staged files of the committed attempts, shard by shard; return what was done.

    Rejected rows are quarantined first (``<quarantine>/run=<write id>/part-<batch>-<partition>.json``,
    rewritten identically by a re-run). With ``fail_on_rejects`` and a
    rejected row, raises before anything is applied. Shards already applied
    for this write id and batch are skipped. Returns once every row is
    durable in its shard's WAL and the writers are closed (flushed); the
    staging directory is deleted whatever happens.

    Raises
    ------
    InvalidChangesError
        With ``fail_on_rejects``, if any row was rejected.
    WriterFencedError
        If another writer claimed a shard mid-commit; the shards recorded
        before stay applied, a re-run with the same ``write_id`` applies the rest.
    """
    table = LsmTable.open(options.uri, storage_options=options.storage_options)
    try:
        return _apply(table, options, write_id, batch_id, sorted(parts, key=lambda p: p.partition))
    finally:
        table.close()
        table.handle.storage.delete_dir(staging)


def _apply(
    table: LsmTable, options: WriteOptions, write_id: str, batch_id: int, parts: list[StagedPartition]
) -> SparkWriteReport:
    rows, rejected = sum(p.rows for p in parts), sum(p.rejected for p in parts)
    quarantine_path = _quarantine(table.handle.storage, options, write_id, batch_id, parts) if rejected else None
    if rejected and options.fail_on_rejects:
        raise InvalidChangesError.whole_batch(
            f"{rejected} of {rows} rows were rejected (quarantined in {quarantine_path}) and fail_on_rejects is set",
            rows,
        )
    paths: dict[str, list[str]] = {}
    for part in parts:  # partition order: the later partition wins a _seq tie
        for bucket, path in part.files:
            paths.setdefault(table.shard_ids[bucket], []).append(path)
    ledger = WriteLedger(table.handle.storage, write_id)
    skipped = tuple(s for s in sorted(paths) if ledger.applied_batch(s) >= batch_id)
    todo = [s for s in sorted(paths) if s not in skipped]
    written = for_each_shard(lambda s: _apply_shard(table, ledger, s, paths[s], batch_id), todo)
    report = SparkWriteReport(
        write_id,
        batch_id,
        rows,
        rejected,
        quarantine_path,
        {w.shard_id: (w.upserts, w.deletes) for w in written},
        skipped,
        time.time(),
    )
    ledger.record_report(report)
    return report


def _apply_shard(
    table: LsmTable, ledger: WriteLedger, shard_id: str, paths: list[str], batch_id: int
) -> ShardWriteCount:
    """Write one shard's staged rows (newest per key by ``_seq``), then record the shard as applied."""
    changes = pa.concat_tables(read_staged(table.handle.storage, paths))
    written = table.write_validated(changes).shards
    ledger.record_applied(shard_id, batch_id)
    return written[0] if written else ShardWriteCount(shard_id, 0, 0)


def _quarantine(
    storage: TableStorage, options: WriteOptions, write_id: str, batch_id: int, parts: list[StagedPartition]
) -> str:
    """Copy the committed attempts' rejected rows to the quarantine; return its directory for this write."""
    quarantine = Quarantine(options.quarantine_dir, options.storage_options)
    for part in parts:
        if part.rejected_path is not None:
            name = f"run={write_id}/part-{batch_id}-{part.partition:05d}.json"
            quarantine.copy_in(name, storage.read_bytes(part.rejected_path))
    return quarantine.run_dir(write_id)


class WriteLedger:
    """Per write id: the last batch applied to each shard, and the last commit's report."""

    def __init__(self, storage: TableStorage, write_id: str) -> None:
        self._storage, self._dir = storage, f"{WRITES_DIR}/{write_id}"

    def applied_batch(self, shard_id: str) -> int:
        """The last batch of this write applied to the shard; -1 if none."""
        try:
            return int(json.loads(self._storage.read_bytes(f"{self._dir}/{shard_id}.json"))["batch"])
        except FileNotFoundError:
            return -1

    def record_applied(self, shard_id: str, batch_id: int) -> None:
        record = {"batch": batch_id, "applied_at": time.time()}
        self._storage.write_bytes_atomic(f"{self._dir}/{shard_id}.json", json.dumps(record).encode())

    def record_report(self, report: SparkWriteReport) -> None:
        self._storage.write_bytes_atomic(f"{self._dir}/last-commit.json", json.dumps(asdict(report)).encode())

    def last_report(self) -> SparkWriteReport | None:
        try:
            data = json.loads(self._storage.read_bytes(f"{self._dir}/last-commit.json"))
        except FileNotFoundError:
            return None
        shards = {s: (int(u), int(d)) for s, (u, d) in data.pop("shards").items()}
        return SparkWriteReport(**{**data, "shards": shards, "skipped": tuple(data["skipped"])})


def last_write_report(
    uri: str, write_id: str, storage_options: StorageOptions | None = None
) -> SparkWriteReport | None:
    """The report of the last commit of ``write_id`` on the table at ``uri`` (``None`` if it never committed)."""
    return WriteLedger(TableStorage(uri, storage_options), write_id).last_report()
