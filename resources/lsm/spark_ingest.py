"""Distributed ingestion of landing files with Spark: executors read, route and write.

Pipeline (one Spark job per call to :func:`ingest_landing_files`)::

    file list ──mapInArrow(stage)──▶ rows + bucket + rejection reason   (persisted)
        ├─ rejected rows ──▶ quarantine (JSON Lines: file, row, reason, record)
        └─ good rows ──repartitionByRange(bucket)──sortWithinPartitions(bucket, file, _seq, row)
                     ──mapInArrow(write)──▶ per-shard stats (the only thing collected)

Each file is read and validated by one task with the engine's own rules
(:func:`~resources.lsm.changes.validate_changes`); the bucket comes from
Lance's hash (:meth:`LsmTable.buckets`). All rows of a bucket land in one
partition, so exactly one task writes each shard; that task writes through
shard writers it opens (claim + replay) and closes (flush) itself. The driver
records a file in the ledger only after the write job succeeded.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from .changes import Rejection, validate_changes
from .landing import (IngestLedger, LandingFile, UnreadableFileError, list_landing_files,
                      new_ledger_entry, read_landing_file)
from .schema import OP_COLUMN, SEQ_COLUMN
from .table import LsmTable

_ORDER, _ROW, _BUCKET, _REASON, _RECORD, _FILE = "__order", "__row", "__bucket", "__reason", "__record", "__file"

_STATS_SCHEMA = pa.schema([
    ("shard_id", pa.string()), ("upserts", pa.int64()), ("deletes", pa.int64()),
    ("wal_bytes", pa.int64()), ("write_seconds", pa.float64()),
])


@dataclass(frozen=True)
class ShardIngestStats:
    shard_id: str
    upserts: int
    deletes: int
    wal_bytes: int
    write_seconds: float


@dataclass(frozen=True)
class IngestReport:
    """What one ingestion did; ``files`` lists the landing files it recorded."""

    files: tuple[str, ...] = ()
    rows_read: int = 0
    rows_quarantined: int = 0
    shards: tuple[ShardIngestStats, ...] = ()
    elapsed_seconds: float = 0.0
    quarantine_path: str | None = None
    per_file: dict = field(default_factory=dict)

    @property
    def upserts(self) -> int:
        return sum(s.upserts for s in self.shards)

    @property
    def deletes(self) -> int:
        return sum(s.deletes for s in self.shards)

    @property
    def rows_written(self) -> int:
        return self.upserts + self.deletes

    @property
    def rows_per_second(self) -> float:
        return self.rows_read / self.elapsed_seconds if self.elapsed_seconds else 0.0


def pending_landing_files(table_uri: str, landing_dir: str) -> list[LandingFile]:
    """Landing files not yet recorded in the table's ledger, in file-name order."""
    done = IngestLedger(table_uri).ingested_names()
    return [f for f in list_landing_files(landing_dir) if f.name not in done]


def ingest_landing_files(spark, table_uri: str, landing_dir: str, quarantine_dir: str,
                         run_id: str | None = None, *, writers: LsmTable | None = None,
                         max_files: int | None = None) -> IngestReport:
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
    table = writers or LsmTable.open(table_uri)
    files = pending_landing_files(table_uri, landing_dir)[:max_files]
    if not files:
        return IngestReport(elapsed_seconds=time.monotonic() - started)

    staged = _stage(spark, table, files).persist()
    try:
        per_file = {r[_ORDER]: (r["rows"], r["rejected"]) for r in _count_per_file(staged)}
        rows_quarantined = sum(rejected for _, rejected in per_file.values())
        quarantine_path = None
        if rows_quarantined:
            quarantine_path = os.path.join(os.path.abspath(quarantine_dir), f"run={run_id}")
            _quarantine(staged, quarantine_path)
        shard_stats = _write_here(staged, writers) if writers else _write_in_tasks(staged, table)
    finally:
        staged.unpersist()

    ledger = IngestLedger(table_uri)
    for f in files:
        rows, rejected = per_file.get(f.order, (0, 0))
        ledger.record(new_ledger_entry(f, rows, rejected, run_id))
    return IngestReport(
        files=tuple(f.name for f in files),
        rows_read=sum(rows for rows, _ in per_file.values()),
        rows_quarantined=rows_quarantined,
        shards=tuple(shard_stats),
        elapsed_seconds=time.monotonic() - started,
        quarantine_path=quarantine_path,
        per_file={f.name: per_file.get(f.order, (0, 0)) for f in files},
    )


# --------------------------------------------------------------------- driver side

def _stage(spark, table: LsmTable, files: list[LandingFile]):
    from pyspark.sql.pandas.types import from_arrow_schema

    listing = spark.createDataFrame([(f.order, f.name, f.path) for f in files],
                                    f"{_ORDER} int, {_FILE} string, path string")
    listing = listing.repartition(min(len(files), spark.sparkContext.defaultParallelism))
    uri = table.uri
    staged_schema = _staged_schema(table.schema)
    return listing.mapInArrow(lambda batches: _stage_files(batches, uri), from_arrow_schema(staged_schema))


def _count_per_file(staged) -> list:
    from pyspark.sql import functions as F

    return staged.groupBy(_ORDER).agg(
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.col(_REASON).isNotNull().cast("long")).alias("rejected"),
    ).collect()


def _quarantine(staged, path: str) -> None:
    from pyspark.sql import functions as F

    rejected = staged.filter(F.col(_REASON).isNotNull())
    rejected.select(F.col(_FILE).alias("file"), F.col(_ROW).alias("row"),
                    F.col(_REASON).alias("reason"), F.col(_RECORD).alias("record")) \
        .coalesce(1).write.mode("append").json(path)


def _write_here(staged, table: LsmTable) -> list[ShardIngestStats]:
    """Write the good rows through this process's open writers (continuous mode)."""
    from pyspark.sql import functions as F

    started = time.monotonic()
    good = staged.filter(F.col(_REASON).isNull()).orderBy(_ORDER, SEQ_COLUMN, _ROW)
    rows = _renumber_seq(good.toArrow().select([*table.schema.names, OP_COLUMN, SEQ_COLUMN]), 0)
    written = table.write(rows).shards if rows.num_rows else ()
    wal_bytes = {s: stats.get("wal_flush_bytes", 0) for s, stats in table.writer_stats().items()}
    elapsed = time.monotonic() - started
    return [ShardIngestStats(s.shard_id, s.upserts, s.deletes, wal_bytes.get(s.shard_id, 0), elapsed)
            for s in written]


def _write_in_tasks(staged, table: LsmTable) -> list[ShardIngestStats]:
    """Write the good rows from Spark tasks, one task per shard range (batch mode)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    good = staged.filter(F.col(_REASON).isNull()).drop(_REASON, _RECORD, _FILE)
    ordered = good.repartitionByRange(table.num_shards, _BUCKET) \
        .sortWithinPartitions(_BUCKET, _ORDER, SEQ_COLUMN, _ROW)
    uri = table.uri
    rows = ordered.mapInArrow(lambda batches: _write_partition(batches, uri),
                              from_arrow_schema(_STATS_SCHEMA)).collect()
    return [ShardIngestStats(**row.asDict()) for row in rows]


def _staged_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([
        *[pa.field(f.name, f.type) for f in schema],
        (OP_COLUMN, pa.string()), (SEQ_COLUMN, pa.int64()),
        (_ORDER, pa.int32()), (_FILE, pa.string()), (_ROW, pa.int64()), (_BUCKET, pa.int32()),
        (_REASON, pa.string()), (_RECORD, pa.string()),
    ])


# --------------------------------------------------------------- executor side

def _stage_files(batches, uri: str):
    """Read, validate and route each listed file (runs in a Spark task)."""
    table = LsmTable.open(uri)
    schema = _staged_schema(table.schema)
    for batch in batches:
        for order, name, path in zip(*(batch.column(i).to_pylist() for i in range(3))):
            yield from _stage_one_file(table, schema, order, name, path)


def _stage_one_file(table: LsmTable, schema: pa.Schema, order: int, name: str, path: str):
    try:
        raw, rejections = read_landing_file(path)
    except UnreadableFileError as exc:
        yield _rejected_batch(schema, order, name, [Rejection(-1, str(exc))], None)
        return
    try:
        validated = validate_changes(raw, table.schema, table.primary_key, reject_unknown_columns=True)
    except ValueError as exc:  # e.g. a key column missing from the whole file
        yield _rejected_batch(schema, order, name, [Rejection(r, str(exc)) for r in range(raw.num_rows)], raw)
        return
    # A JSON line that failed to parse was read as an empty row, which
    # validation rejects for its null key; the parse error explains it better.
    rejected = {r.row: r for r in validated.rejections}
    rejected.update({r.row: r for r in rejections})
    kept_rows = np.setdiff1d(np.arange(raw.num_rows), np.fromiter(rejected, dtype=np.int64, count=len(rejected)))
    good = validated.valid  # exactly the kept rows, in file order
    if good.num_rows:
        columns = {c: good[c] for c in [*table.schema.names, OP_COLUMN, SEQ_COLUMN]}
        columns.update({
            _ORDER: pa.array(np.full(good.num_rows, order, np.int32)),
            _FILE: pa.array([name] * good.num_rows, pa.string()),
            _ROW: pa.array(kept_rows, pa.int64()),
            _BUCKET: pa.array(table.buckets(good.select(table.primary_key)), pa.int32()),
            _REASON: pa.nulls(good.num_rows, pa.string()),
            _RECORD: pa.nulls(good.num_rows, pa.string()),
        })
        yield from pa.Table.from_pydict(columns, schema=schema).combine_chunks().to_batches()
    if rejected:
        yield _rejected_batch(schema, order, name, sorted(rejected.values(), key=lambda r: r.row), raw)


def _rejected_batch(schema: pa.Schema, order: int, name: str, rejections: list[Rejection],
                    raw: pa.Table | None) -> pa.RecordBatch:
    n = len(rejections)
    records = [
        json.dumps(raw.slice(r.row, 1).to_pylist()[0], default=str) if raw is not None and r.row >= 0 else None
        for r in rejections
    ]
    columns = {f.name: pa.nulls(n, f.type) for f in schema}
    columns.update({
        _ORDER: pa.array(np.full(n, order, np.int32)),
        _FILE: pa.array([name] * n, pa.string()),
        _ROW: pa.array([r.row for r in rejections], pa.int64()),
        _REASON: pa.array([r.reason for r in rejections], pa.string()),
        _RECORD: pa.array(records, pa.string()),
    })
    return pa.RecordBatch.from_pydict(columns, schema=schema)


def _write_partition(batches, uri: str):
    """Write one partition's rows (whole shards, in order) through shard writers."""
    table = LsmTable.open(uri)
    columns = [*table.schema.names, OP_COLUMN, SEQ_COLUMN]
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    started = time.monotonic()
    next_seq = 0
    try:
        for batch in batches:
            rows = _renumber_seq(pa.Table.from_batches([batch]).select(columns), next_seq)
            next_seq += rows.num_rows
            for shard in table.write(rows).shards:
                counts[shard.shard_id][0] += shard.upserts
                counts[shard.shard_id][1] += shard.deletes
        wal_bytes = {s: stats.get("wal_flush_bytes", 0) for s, stats in table.writer_stats().items()}
    finally:
        table.close()
    elapsed = time.monotonic() - started
    yield pa.RecordBatch.from_pylist([
        {"shard_id": s, "upserts": u, "deletes": d, "wal_bytes": wal_bytes.get(s, 0), "write_seconds": elapsed}
        for s, (u, d) in sorted(counts.items())
    ], schema=_STATS_SCHEMA)


def _renumber_seq(rows: pa.Table, start: int) -> pa.Table:
    """Rows arrive sorted by (file, _seq, row); renumbering ``_seq`` in that
    order makes it the newest-wins order of a ``write`` call."""
    seq = pa.array(np.arange(start, start + rows.num_rows, dtype=np.int64))
    return rows.set_column(rows.schema.get_field_index(SEQ_COLUMN), SEQ_COLUMN, seq)
