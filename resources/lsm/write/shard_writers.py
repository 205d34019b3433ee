"""The MemWAL shard writers one table object holds open, and how a put survives a flaky store.

A :class:`ShardWriters` claims a shard on its first write (epoch + 1, fencing
any other writer, replaying the WAL) and keeps the writer until it is closed,
which flushes its MemTable into a new generation. Lance's fencing error
becomes :class:`~resources.lsm.errors.WriterFencedError`; a transient store
error drops the writer and puts everything again through a fresh one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import lance
import pyarrow as pa
from lance.mem_wal import ShardWriter

from ..errors import StorageUnavailableError, WriterFencedError
from ..format.retry import bounded, is_transient
from ..format.schema import UNSET_COLUMN, conform
from ..handle import TableHandle
from .partial import complete_upserts

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_S = TypeVar("_S")

LANCE_MAX_MEMTABLE_ROWS = 100_000  # Lance's default for ``max_memtable_rows``
_REPLAY_OVERFLOW = "past what the memtable replaying it can hold"
_ROOMY_MEMTABLE_ROWS = 1 << 30
_ROOMY_MEMTABLE_BATCHES = 1 << 20


@dataclass(frozen=True)
class ShardWriteCount:
    """What one shard made durable: upserts and deletes, one change per key.

    An ingestion also reports the WAL bytes its writers logged and the
    seconds the shards' writing took (together).
    """

    shard_id: str
    upserts: int
    deletes: int
    wal_bytes: int = 0
    write_seconds: float = 0.0


class ShardCounts(Protocol):
    """Per-shard upsert/delete counts (:class:`ShardWriteCount` and the like)."""

    @property
    def upserts(self) -> int: ...

    @property
    def deletes(self) -> int: ...


class ShardTotals:
    """Totals over a ``shards`` tuple of per-shard upsert/delete counts."""

    shards: tuple[ShardCounts, ...]

    @property
    def upserts(self) -> int:
        return sum(s.upserts for s in self.shards)

    @property
    def deletes(self) -> int:
        return sum(s.deletes for s in self.shards)


@dataclass(frozen=True)
class WriteResult(ShardTotals):
    """What one ``write`` made durable, per shard, after newest-wins resolution."""

    shards: tuple[ShardWriteCount, ...]

    @property
    def rows(self) -> int:
        return self.upserts + self.deletes


def for_each_shard(work: Callable[[_S], _T], shards: Iterable[_S]) -> list[_T]:
    """``work`` on each shard (id, state or batch of work) in parallel threads, results in order.

    Shard work mostly waits on storage, and shards never share a key, so each
    gets a thread of its own; a single shard runs on the calling thread.
    """
    shards = list(shards)
    if len(shards) <= 1:
        return [work(s) for s in shards]
    with ThreadPoolExecutor(max_workers=len(shards), thread_name_prefix="lsm-shard") as pool:
        return list(pool.map(work, shards))


class ShardWriters:
    """The writers of one table object, by shard; each opened on first use and kept until closed."""

    def __init__(self, handle: TableHandle) -> None:
        self._handle = handle
        self._writers: dict[str, ShardWriter] = {}
        # The base schema each writer was opened on: Lance binds a writer to it.
        self._schemas: dict[str, pa.Schema] = {}
        # One put at a time per shard in this process: a partial update reads the current row, then puts.
        self._put_locks = {shard_id: threading.Lock() for shard_id in handle.shard_ids}

    @property
    def open_shards(self) -> list[str]:
        """The shards this object holds a writer for."""
        return list(self._writers)

    @property
    def max_rows_per_put(self) -> int:
        """Most rows one ``put`` or ``delete`` may carry: a MemTable's row cap (Lance refuses, never splits, more)."""
        return int(self._handle.writer_config.get("max_memtable_rows", LANCE_MAX_MEMTABLE_ROWS))

    def claim(self, shard_ids: Iterable[str]) -> None:
        """Open writers now (claim epoch, replay the WAL tail), fencing any other writer of those shards."""
        for_each_shard(self._writer, shard_ids)

    def stats(self) -> dict[str, dict[str, Any]]:
        """``ShardWriter.stats()`` of every open writer, by shard."""
        return {shard_id: writer.stats() for shard_id, writer in self._writers.items()}

    def detach(self) -> None:
        """Forget the writers without closing them, as a crashed process would (their rows stay in the WAL)."""
        self._writers.clear()

    def put(self, shard_id: str, upserts: pa.Table | None, deletes: pa.Table | None) -> ShardWriteCount:
        """Put upserts, then delete keys (at most one change per key), in slices a MemTable accepts.

        Upserts of a partial-update table (with ``_unset``) are completed from
        the shard's current rows once its writer is open (a claim replays
        every acknowledged write first), on every attempt again.

        After a transient store error the writer is dropped, whatever the
        failed attempt may have logged is flushed (a new writer replays the
        WAL, then closes), and everything is put again through a fresh writer:
        re-putting one change per key is idempotent, and nothing is
        acknowledged before every put returned.
        """

        def put(abandoned: threading.Event) -> None:
            writer = self._writers.get(shard_id) or self._open(shard_id)
            if abandoned.is_set():
                return  # given up on while opening: never registered, so it cannot fence a later attempt's
            self._writers[shard_id] = writer
            rows = upserts
            if rows is not None and UNSET_COLUMN in rows.column_names:
                rows = complete_upserts(self._handle, shard_id, rows)
            if rows is not None and rows.schema.names != self._schemas[shard_id].names:
                # Columns were added since these rows were validated: the writer wants them (null).
                rows = conform(rows, self._schemas[shard_id])
            with self._fencing_as_error(shard_id):
                for chunk in _slices(rows, self.max_rows_per_put):
                    writer.put(chunk)
                for chunk in _slices(deletes, self.max_rows_per_put):
                    writer.delete(chunk)

        def start_afresh() -> None:
            # The failed attempt may have logged part of the change. Flushing it (a new writer replays
            # the WAL, then closes) lets the retry's writer start a new generation: replayed and re-put
            # rows together in one generation could outgrow what a later replay accepts.
            self._writers.pop(shard_id, None)
            self._close(shard_id, None)

        operation = f"write shard {shard_id}"
        try:
            with self._put_locks[shard_id], self._handle.write_activity.writing():
                self._handle.retrying(lambda: self._bounded(put, operation), operation, before_retry=start_afresh)
        except StorageUnavailableError:
            self._writers.pop(shard_id, None)  # possibly stuck in the outage: the next write claims anew
            raise
        return ShardWriteCount(
            shard_id, upserts.num_rows if upserts is not None else 0, deletes.num_rows if deletes is not None else 0
        )

    def flush(self, shard_id: str) -> None:
        """Flush the shard's MemTable (or, with no writer here, its WAL tail) into a new generation.

        Raises
        ------
        WriterFencedError
            If another writer claimed the shard.
        """
        self._close(shard_id, self._writers.pop(shard_id, None))

    def close(self) -> list[str]:
        """Close every writer, flushing its MemTable; return the shards whose writer was fenced.

        A fenced writer cannot flush; its acknowledged rows are in the WAL,
        which the new owner replays.
        """
        writers, self._writers = self._writers, {}

        def close(shard_id: str) -> bool:
            try:
                self._close(shard_id, writers[shard_id])
                return False
            except WriterFencedError:
                return True

        # In parallel: a close is mostly waiting on storage.
        return [shard_id for shard_id, fenced in zip(writers, for_each_shard(close, writers), strict=True) if fenced]

    def _writer(self, shard_id: str) -> ShardWriter:
        if shard_id not in self._writers:
            self._writers[shard_id] = self._open(shard_id)
        return self._writers[shard_id]

    def _open(self, shard_id: str) -> ShardWriter:
        """Claim the shard (epoch + 1, fencing any other writer) and replay its WAL.

        The writer gets the settings recorded at creation: Lance stores them
        but its writers fall back to built-in defaults unless passed in.

        Raises
        ------
        WriterFencedError
            If another writer claimed the shard while this one was opening.
        """
        dataset = self._handle.dataset()
        settings = self._handle.writer_settings()
        with self._fencing_as_error(shard_id):
            try:
                writer = dataset.mem_wal_writer(shard_id, **settings)
            except OSError as exc:
                if _REPLAY_OVERFLOW not in str(exc):
                    raise
                _flush_oversized_generation(dataset, shard_id, settings, exc)
                writer = dataset.mem_wal_writer(shard_id, **settings)
        self._schemas[shard_id] = dataset.schema
        return writer

    def _close(self, shard_id: str, writer: ShardWriter | None) -> None:
        """Close ``writer`` (``None``: claim the shard with a new one), flushing its MemTable.

        A close that fails on a transient store error is retried with a new
        writer: the MemTable's rows are in the WAL, which that writer replays.
        """
        writers = iter([writer] if writer is not None else [])

        def close(_: threading.Event) -> None:
            current = next(writers, None) or self._open(shard_id)
            with self._fencing_as_error(shard_id):
                current.close()

        operation = f"flush shard {shard_id}"
        self._handle.retrying(lambda: self._bounded(close, operation), operation)

    def _bounded(self, call: Callable[[threading.Event], _T], operation: str) -> _T:
        """``call`` waited for at most ``client_retry_timeout`` on an object store (:func:`bounded`).

        On a local path it runs on the caller's thread: there is no store
        outage to wait out, and a thread per put costs about 0.5 ms.
        """
        if self._handle.is_local:
            return call(threading.Event())
        return bounded(call, operation, self._handle.uri, self._handle.storage.retry_policy.timeout)

    @contextmanager
    def _fencing_as_error(self, shard_id: str) -> Iterator[None]:
        """Turn Lance's fencing ``OSError`` into :class:`WriterFencedError`.

        Lance says "Writer fenced" when a live writer's call is fenced, and
        "another writer claimed epoch" or "fenced during open" when the claim
        or WAL replay of a writer being opened loses to another writer. A
        fenced writer is dead: it is forgotten so the next write claims anew.
        A "fence" after this writer's own PUT failed ("persistence failure":
        the WAL position may hold its own entry) is a transient store error,
        left as it is for the caller's retry.
        """
        try:
            yield
        except OSError as exc:
            message = str(exc).lower()
            fenced = "fenced" in message or "another writer claimed" in message
            if not fenced or is_transient(exc):
                raise
            self._writers.pop(shard_id, None)
            raise WriterFencedError(
                f"shard {shard_id} was claimed by another writer; this call was not acknowledged "
                f"(rows acknowledged earlier are safe in the WAL): {exc}"
            ) from exc


def _flush_oversized_generation(
    dataset: lance.LanceDataset, shard_id: str, settings: dict[str, Any], exc: OSError
) -> None:
    """Flush a WAL generation larger than the recorded MemTable limits, through a writer with room for it.

    pylance 14.0.2 can leave more rows logged for one generation than a
    replaying writer of the same settings accepts (seen in the storage-fault
    soak, where writers are replaced after failed puts and flushes); every
    later writer then refuses to open the shard. The generation's rows are
    all in the WAL: a writer with larger limits replays and flushes them.
    """
    log.warning("shard %s: %s; flushing it with larger MemTable limits", shard_id, exc)
    roomy = {**settings, "max_memtable_rows": _ROOMY_MEMTABLE_ROWS, "max_memtable_batches": _ROOMY_MEMTABLE_BATCHES}
    dataset.mem_wal_writer(shard_id, **roomy).close()


def _slices(rows: pa.Table | None, size: int) -> Iterator[pa.Table]:
    """``rows`` in consecutive slices of at most ``size`` rows (nothing for ``None``)."""
    if rows is None:
        return
    for offset in range(0, rows.num_rows, size):
        yield rows.slice(offset, size)
