"""The staging format: routed rows between Spark's read tasks and the shard writers.

A read task validates its landing files (or DataFrame rows), splits the good
rows by bucket (Lance's hash of the key) and writes each bucket's rows, in
newest-wins order, as one Arrow IPC stream per bucket under the table's
staging directory (:data:`~resources.lsm.format.layout.STAGING_DIR`). A write
task (or the driver, in continuous mode) then reads each shard's streams in
order and writes them through that shard's writer. Staging goes through
files, never through the JVM: converting every row to Spark rows and back
costs more than the write itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..format.schema import SEQ_COLUMN
from ..format.storage import TableStorage
from ..table import LsmTable
from ..write.shard_writers import ShardWriteCount, for_each_shard


@dataclass(frozen=True, order=True)
class StagedFile:
    """One staged file: good rows of ``bucket`` from one task's landing files, the first being ``first_order``."""

    bucket: int
    first_order: int
    path: str
    """Relative to the table root."""


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


def rows_by_bucket(table: LsmTable, good: pa.Table) -> list[tuple[int, pa.Table]]:
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


def write_staged(table: LsmTable, files: Iterable[StagedFile]) -> list[ShardWriteCount]:
    """Write the staged files, one thread per shard, each shard's in file order."""
    paths: dict[str, list[str]] = {}
    for f in sorted(files):  # by bucket, then first landing file
        paths.setdefault(table.shard_ids[f.bucket], []).append(f.path)
    storage = table.handle.storage
    return for_each_shard(lambda shard_id: write_shard(table, shard_id, read_staged(storage, paths[shard_id])), paths)


def write_shard(table: LsmTable, shard_id: str, parts: Iterable[pa.Table]) -> ShardWriteCount:
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
