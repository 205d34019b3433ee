"""Distributed ingestion of landing files with Spark: executors read, route and write.

Pipeline (one call to :func:`ingest_landing_files`)::

    file positions ──mapInArrow(stage)──▶ per file: one block per bucket (Arrow
        │                                 IPC of its good rows, sorted by _seq),
        │                                 one row per rejection; its row counts
        │                                 go to an accumulator
        └─ blocks ──repartitionById(bucket)──sortWithinPartitions(file)
                  ──mapInArrow(write)──▶ per-shard stats (the only thing collected)
    files with rejections only: stage again ──▶ rejected rows ──▶ quarantine
                                  (JSON Lines: file, row, reason, record)

Each file is read and validated by one task with the engine's own rules
(:func:`~resources.lsm.changes.validate_changes`); the bucket comes from
Lance's hash (:meth:`LsmTable.buckets`). Spark moves and orders whole blocks,
not rows: converting every row to a Spark row, caching, shuffling, sorting
and converting it back made ingestion ~5x slower (see benchmarks/ingest.py).
Partition ``b`` holds exactly bucket ``b``, so one task writes each shard;
that task writes through the shard writer it opens (claim + replay) and
closes (flush) itself. Its rows arrive in newest-wins order (file, then
``_seq``, then row), so it resolves each chunk by position
(:meth:`LsmTable.write_shard_ordered`). Staging runs inside the write job,
nothing is cached: the counts per file come back in a Spark accumulator, and
only files with bad rows are staged a second time, to quarantine those rows
(caching every staged block for that cost more than it saved). The driver
records a file in the ledger only after the write job, and the quarantine of
its bad rows, succeeded.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .changes import Rejection, validate_changes
from .landing import (IngestLedger, LandingFile, UnreadableFileError, list_landing_files,
                      new_ledger_entry, read_landing_file)
from .schema import SEQ_COLUMN
from .table import LsmTable, ShardTotals, ShardWriteCount

_ORDER, _FILE = "__order", "__file"
_BUCKET, _BLOCK, _ROW, _REASON, _RECORD = "__bucket", "__block", "__row", "__reason", "__record"

# One staged row is one of: a block of the file's good rows for one bucket
# (_BUCKET, _BLOCK), or a rejected row (_ROW, _REASON, _RECORD). Columns of
# the other kind are null.
_STAGED_SCHEMA = pa.schema([
    (_ORDER, pa.int32()), (_FILE, pa.string()),
    (_BUCKET, pa.int32()), (_BLOCK, pa.binary()),
    (_ROW, pa.int64()), (_REASON, pa.string()), (_RECORD, pa.string()),
])

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
class IngestReport(ShardTotals):
    """What one ingestion did; ``files`` lists the landing files it recorded."""

    files: tuple[str, ...] = ()
    rows_read: int = 0
    rows_quarantined: int = 0
    shards: tuple[ShardIngestStats, ...] = ()
    elapsed_seconds: float = 0.0
    quarantine_path: str | None = None
    per_file: dict = field(default_factory=dict)

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

    counts = spark.sparkContext.accumulator({}, _PerFileCounts())
    staged = _stage(spark, table, files, counts)
    shard_stats = _write_here(staged, writers) if writers else _write_in_tasks(staged, table)
    per_file: dict[int, tuple[int, int]] = counts.value  # every staged file reported
    rows_quarantined = sum(per_file[f.order][1] for f in files)
    quarantine_path = None
    if rows_quarantined:
        quarantine_path = os.path.join(os.path.abspath(quarantine_dir), f"run={run_id}")
        _quarantine(_stage(spark, table, [f for f in files if per_file[f.order][1]], counts), quarantine_path)
    counts.value = {}  # PySpark's driver keeps every accumulator: keep ours small

    ledger = IngestLedger(table_uri)
    for f in files:
        rows, rejected = per_file[f.order]
        ledger.record(new_ledger_entry(f, rows, rejected, run_id))
    return IngestReport(
        files=tuple(f.name for f in files),
        rows_read=sum(per_file[f.order][0] for f in files),
        rows_quarantined=rows_quarantined,
        shards=tuple(shard_stats),
        elapsed_seconds=time.monotonic() - started,
        quarantine_path=quarantine_path,
        per_file={f.name: per_file[f.order] for f in files},
    )


# --------------------------------------------------------------------- driver side

class _PerFileCounts:
    """Spark accumulator parameter for ``{file order: (rows, rejected rows)}``.

    Merging overwrites, so a task Spark runs again (a retry, a recomputed
    stage) reports the same values instead of adding them twice.
    """

    def zero(self, value: dict) -> dict:
        return {}

    def addInPlace(self, counts: dict, more: dict) -> dict:  # noqa: N802 (PySpark's name)
        counts.update(more)
        return counts


def _stage(spark, table: LsmTable, files: list[LandingFile], counts):
    """Staged rows of ``files`` (blocks, rejected rows), computed by the job that reads them.

    Each file's (rows, rejected rows) is added to the accumulator ``counts``.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    # Tasks get ranges of positions in the file list (shipped with the
    # function): unlike a DataFrame of the list, that needs no shuffle stage.
    listing = [(f.order, f.name, f.path) for f in files]
    positions = spark.range(len(files), numPartitions=min(len(files), spark.sparkContext.defaultParallelism))
    uri = table.uri
    return positions.mapInArrow(lambda batches: _stage_files(batches, listing, uri, counts),
                                from_arrow_schema(_STAGED_SCHEMA))


def _quarantine(staged, path: str) -> None:
    from pyspark.sql import functions as F

    rejected = staged.filter(F.col(_REASON).isNotNull())
    rejected.select(F.col(_FILE).alias("file"), F.col(_ROW).alias("row"),
                    F.col(_REASON).alias("reason"), F.col(_RECORD).alias("record")) \
        .coalesce(1).write.mode("append").json(path)


def _write_here(staged, table: LsmTable) -> list[ShardIngestStats]:
    """Write the good rows through this process's open writers, shards in parallel (continuous mode)."""
    from pyspark.sql import functions as F

    started = time.monotonic()
    # Blocks are few (files x buckets): fetch them and order by shard, then file, here.
    blocks = staged.filter(F.col(_BLOCK).isNotNull()).select(_ORDER, _BUCKET, _BLOCK).toArrow() \
        .sort_by([(_BUCKET, "ascending"), (_ORDER, "ascending")])
    by_shard = {table.shard_ids[b]: blocks.filter(pc.equal(blocks[_BUCKET], b))
                for b in pc.unique(blocks[_BUCKET]).to_pylist()}
    with ThreadPoolExecutor(max_workers=max(1, len(by_shard)), thread_name_prefix="lsm-ingest") as pool:
        written = list(pool.map(
            lambda shard_id: _write_shard(table, shard_id, _decode_blocks(by_shard[shard_id].to_batches())),
            by_shard))
    wal_bytes = {s: stats.get("wal_flush_bytes", 0) for s, stats in table.writer_stats().items()}
    elapsed = time.monotonic() - started
    return [ShardIngestStats(w.shard_id, w.upserts, w.deletes, wal_bytes.get(w.shard_id, 0), elapsed)
            for w in sorted(written, key=lambda w: w.shard_id)]


def _write_in_tasks(staged, table: LsmTable) -> list[ShardIngestStats]:
    """Write the good rows from Spark tasks, one task per shard (batch mode)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    blocks = staged.filter(F.col(_BLOCK).isNotNull()).select(_ORDER, _BUCKET, _BLOCK)
    # Partition = bucket exactly: one shard per task, and no sampling job (a
    # range partitioner sampled the data first and could pair two shards).
    ordered = blocks.repartitionById(table.num_shards, _BUCKET).sortWithinPartitions(_ORDER)
    uri = table.uri
    rows = ordered.mapInArrow(lambda batches: _write_partition(batches, uri),
                              from_arrow_schema(_STATS_SCHEMA)).collect()
    return [ShardIngestStats(**row.asDict()) for row in rows]


# --------------------------------------------------------------- executor side

def _stage_files(batches, listing: list[tuple[int, str, str]], uri: str, counts):
    """Read, validate and route the listed files at the batches' positions (runs in a Spark task)."""
    table = LsmTable.open(uri)
    for batch in batches:
        for position in batch.column(0).to_pylist():
            order = listing[position][0]
            staged, rows_and_rejected = _stage_one_file(table, *listing[position])
            counts.add({order: rows_and_rejected})
            yield staged


def _stage_one_file(table: LsmTable, order: int, name: str, path: str) -> tuple[pa.RecordBatch, tuple[int, int]]:
    try:
        raw, rejections = read_landing_file(path)
    except UnreadableFileError as exc:
        return _staged_file(order, name, 0, [], [Rejection(-1, str(exc))], None)
    try:
        validated = validate_changes(raw, table.schema, table.primary_key, reject_unknown_columns=True)
    except ValueError as exc:  # e.g. a key column missing from the whole file
        return _staged_file(order, name, 0, [], [Rejection(r, str(exc)) for r in range(raw.num_rows)], raw)
    # A JSON line that failed to parse was read as an empty row, which
    # validation rejects for its null key; the parse error explains it better.
    rejected = {r.row: r for r in validated.rejections}
    rejected.update({r.row: r for r in rejections})
    good = validated.valid
    return _staged_file(order, name, good.num_rows, _blocks_by_bucket(table, good),
                         sorted(rejected.values(), key=lambda r: r.row), raw)


def _blocks_by_bucket(table: LsmTable, good: pa.Table) -> list[tuple[int, bytes]]:
    """Good rows (in file order) as one Arrow IPC stream per bucket, each sorted by ``_seq``.

    The sort is stable, so rows with equal ``_seq`` keep their file order:
    the write task lets the later of them win. A block's row order is its
    newest-wins order, so ``_seq`` itself is left out.
    """
    if not good.num_rows:
        return []
    buckets = table.buckets(good.select(table.primary_key))
    keys = pa.table({_BUCKET: buckets, SEQ_COLUMN: good[SEQ_COLUMN]})
    order = pc.sort_indices(keys, sort_keys=[(_BUCKET, "ascending"), (SEQ_COLUMN, "ascending")])
    ordered, ordered_buckets = good.drop_columns([SEQ_COLUMN]).take(order), buckets[order.to_numpy()]
    values, starts = np.unique(ordered_buckets, return_index=True)
    ends = [*starts[1:], good.num_rows]
    return [(int(b), _to_ipc(ordered.slice(start, end - start))) for b, start, end in zip(values, starts, ends)]


def _staged_file(order: int, name: str, good_rows: int, blocks: list[tuple[int, bytes]],
                 rejections: list[Rejection], raw: pa.Table | None) -> tuple[pa.RecordBatch, tuple[int, int]]:
    """One file's staged rows (its blocks, its rejected rows) and its (rows, rejected rows)."""
    kinds = [
        (len(blocks), {_BUCKET: [b for b, _ in blocks], _BLOCK: [block for _, block in blocks]}),
        (len(rejections), {_FILE: [name] * len(rejections), _ROW: [r.row for r in rejections],
                           _REASON: [r.reason for r in rejections], _RECORD: _records(raw, rejections)}),
    ]
    columns = {f.name: [v for n, kind in kinds for v in kind.get(f.name, [None] * n)] for f in _STAGED_SCHEMA}
    columns[_ORDER] = [order] * len(columns[_ORDER])
    staged = pa.RecordBatch.from_pydict(columns, schema=_STAGED_SCHEMA)
    return staged, (good_rows + len(rejections), len(rejections))


def _records(raw: pa.Table | None, rejections: list[Rejection]) -> list[str | None]:
    """Each rejected row as JSON; ``None`` when the whole file was unreadable."""
    if raw is None or not rejections:
        return [None] * len(rejections)
    rows = raw.take(pa.array([r.row for r in rejections], pa.int64())).to_pylist()
    return [json.dumps(row, default=str) for row in rows]


def _to_ipc(rows: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema) as writer:
        writer.write_table(rows)
    return sink.getvalue().to_pybytes()


def _decode_blocks(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.Table]:
    """The blocks of staged batches (a ``_BLOCK`` column), decoded, in order."""
    for batch in batches:
        for block in batch.column(_BLOCK):
            yield pa.ipc.open_stream(block.as_buffer()).read_all()


def _write_partition(batches, uri: str):
    """Write one partition's blocks (bucket = partition, in file order) through its shard writer (runs in a Spark task)."""
    from pyspark import TaskContext

    table = LsmTable.open(uri)
    shard_id = table.shard_ids[TaskContext.get().partitionId()]
    started = time.monotonic()
    try:
        written = _write_shard(table, shard_id, _decode_blocks(batches))
        wal_bytes = table.writer_stats().get(shard_id, {}).get("wal_flush_bytes", 0)
    finally:
        table.close()
    elapsed = time.monotonic() - started
    yield pa.RecordBatch.from_pylist([
        {"shard_id": shard_id, "upserts": written.upserts, "deletes": written.deletes, "wal_bytes": wal_bytes,
         "write_seconds": elapsed}
    ] if written.upserts or written.deletes else [], schema=_STATS_SCHEMA)


def _write_shard(table: LsmTable, shard_id: str, blocks: Iterable[pa.Table]) -> ShardWriteCount:
    """Write one shard's blocks, in order, in chunks of at most a MemTable's rows; return the totals.

    Each chunk is durable in the shard's WAL before the next one is read.
    """
    upserts = deletes = 0
    for chunk in _chunks(blocks, table.max_rows_per_put):
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
