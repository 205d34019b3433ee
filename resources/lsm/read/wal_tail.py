"""Read a shard's WAL tail: rows durable in the WAL but not yet flushed.

Every WAL entry is an Arrow IPC stream holding the table's columns plus
``_tombstone``; its schema metadata names the ``writer_epoch``. A writer that
claims a shard first appends an empty *fence sentinel* entry with its epoch;
entries from an older epoch that follow a sentinel come from a fenced writer
and were never acknowledged, so they are skipped (as replay does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from ..format.schema import conform, empty_tail
from ..format.shard_manifest import WalEntryFile
from ..format.storage import TableStorage
from ..format.wal import read_wal_entry, sentinel_epoch
from ..lru_cache import LruCache
from .dedup import keep_last_per_key
from .generation_keys import READS_BEFORE_KEY_INDEX
from .key_sets import FewKeys, KeyIndex, key_join, laid_over


class CachedEntry:
    """One WAL entry the process read: its metadata and rows, and its key index once lookups keep asking it.

    A lookup asks each entry of the tail for its keys: about 0.1 ms an entry
    of 12.5k string keys compared one by one. An entry asked
    ``READS_BEFORE_KEY_INDEX`` times (as a generation is) gets an index of
    its keys (a KeyIndex), and is then asked through it. Two threads may build the
    index at once: each builds the same one.
    """

    def __init__(self, metadata: dict[str, str], rows: pa.Table, primary_key: list[str]) -> None:
        self.metadata, self.rows = metadata, rows
        # A fence sentinel is an empty entry, without the table's columns.
        self.nbytes = int(rows.nbytes) + (KeyIndex.size_of(rows, primary_key) if rows.num_rows else 0)
        """The rows' bytes and their key index's, counted from the start (the cache sizes an entry once;
        an entry holding a key twice, which is rare, indexes a copy of its newest rows that is not counted)."""
        self._key = primary_key
        self._asked = 0
        self._index: KeyIndex | None = None
        self._indexed = rows

    def rows_of(self, keys: pa.Table, few: FewKeys | None = None) -> pa.Table:
        """The entry's rows holding one of ``keys``: all of them, or once indexed each key's last one (a later
        row of a key in one entry is newer, so the newest change per key over the tail is the same).
        ``few``: the same keys, as the lookup prepared them for every entry (:class:`FewKeys`)."""
        if self._index is None:
            self._asked += 1
            if self._asked <= READS_BEFORE_KEY_INDEX:
                return key_join(self.rows, keys, self._key, "left semi")
            # A writer may buffer several puts into one entry: the index holds each key's last row only.
            self._indexed = keep_last_per_key(self.rows, self._key)
            self._index = KeyIndex(self._indexed, self._key)
        rows = self._index.rows(keys, few)
        # The usual answer is none: an empty take still costs 16 us an entry (pyarrow's dispatch), a slice 1 us.
        return self._indexed.take(rows) if len(rows) else self._indexed.slice(0, 0)


WalEntries = LruCache[tuple[str, str, str, int, int | None], CachedEntry]
"""WAL entries read, by table (location and id), shard and file (name, size, modification time)."""

SHARED_WAL_ENTRIES: WalEntries = LruCache(max_entries=8192, max_bytes=256 << 20, size_of=lambda entry: entry.nbytes)
"""The WAL entries this process read, shared by every table object opened in it (as :func:`read_wal_tail`'s
``cache``): an entry never changes once written, and beside a busy writer every fresh read reads the whole
tail again, entries read a moment ago included, by this table object or one opened before it (most of a point
lookup's cost). 256 MiB: rows and the key indexes lookups build over them (each entry counts its own)."""


@dataclass(frozen=True)
class ResolvedTail:
    """The newest change per key over the first ``entries`` of a shard's WAL tail, to extend with later ones."""

    entries: tuple[WalEntryFile, ...]
    rows: pa.Table
    fence_epoch: int
    """The highest writer epoch fenced by a sentinel among ``entries``: later entries of older epochs are skipped."""


ResolvedTails = LruCache[tuple[str, str], ResolvedTail]
"""Each shard's whole WAL tail as last resolved, by table (location and id) and shard."""

SHARED_RESOLVED_TAILS: ResolvedTails = LruCache(max_entries=1024, max_bytes=128 << 20, size_of=lambda t: t.rows.nbytes)
"""The tails this process resolved (as :func:`read_wal_tail`'s ``resolved``), shared by every table object
opened in it: a reader opened anew (every Dagster step opens its tables) resolves only the entries written
since another one read the tail."""


def read_wal_tail(
    storage: TableStorage,
    shard_id: str,
    entries: Sequence[WalEntryFile],
    schema: pa.Schema,
    primary_key: list[str],
    written_after: int | None = None,
    keys: pa.Table | None = None,
    cache: WalEntries | None = None,
    resolved: ResolvedTails | None = None,
    scope: str | None = None,
) -> pa.Table:
    """The newest change per key among a shard's WAL ``entries`` (ascending, as listed).

    Returns the table's columns plus ``_tombstone`` (True = deleted), one row
    per key, or an empty table when the tail is empty. ``entries`` are those
    after the shard's replay position up to the position a reader planned
    with (a state's :attr:`~resources.lsm.format.shard_state.ShardState.wal_entries`),
    so parallel readers of one snapshot see the same tail. ``written_after``
    keeps only the changes of entries after that position (fences are still
    read from the first entry on): what was written after a table version.
    ``keys`` (a table of the key columns) keeps only the changes of those
    keys, taken from each entry before the newest per key is resolved: a
    point lookup beside a busy writer then costs what its keys cost, not
    what the whole tail does. ``cache`` (:data:`SHARED_WAL_ENTRIES`) keeps
    the entries read, so each is read once. ``resolved``
    (:data:`SHARED_RESOLVED_TAILS`) keeps the whole tail (neither ``keys`` nor ``written_after``) each shard
    resolved to, and a later read whose entries extend it resolves only the
    entries after it: beside a busy writer, a scan then pays for the
    entries written since the last read, not for the whole tail again.
    Both are keyed by ``scope`` (default: the table's location; a handle's
    :attr:`~resources.lsm.handle.TableHandle.cache_scope` adds the table's id).
    """
    scope = storage.location if scope is None else scope
    tail_schema = empty_tail(schema).schema
    kept = resolved if keys is None and written_after is None else None  # only the whole tail is kept
    earlier = _earlier_tail(kept.find((scope, shard_id)), entries) if kept is not None else None
    fence_epoch, parts = earlier.fence_epoch if earlier else 0, []
    few = FewKeys(keys, primary_key) if keys is not None else None
    for entry in entries[len(earlier.entries) if earlier else 0 :]:
        if written_after is not None and entry.position <= written_after:  # only its fence counts
            fence_epoch = max(fence_epoch, sentinel_epoch(storage, shard_id, entry) or 0)
            continue
        read = _read_entry(storage, scope, shard_id, entry, primary_key, cache)
        metadata, rows = read.metadata, read.rows
        epoch = int(metadata.get("writer_epoch", 0))
        if metadata.get("fence_sentinel") == "true":
            fence_epoch = max(fence_epoch, epoch)
            continue
        if epoch < fence_epoch or rows.num_rows == 0:
            continue
        if keys is not None and not (rows := read.rows_of(keys, few)).num_rows:
            continue  # the usual answer for a lookup: no conform (55 us an entry)
        parts.append(conform(rows, tail_schema))  # an entry written before columns were added lacks them
    newer = keep_last_per_key(pa.concat_tables(parts), primary_key) if parts else empty_tail(schema)
    tail = newer if earlier is None else _extended(conform(earlier.rows, tail_schema), newer, primary_key)
    if kept is not None:
        kept.put((scope, shard_id), ResolvedTail(tuple(entries), tail, fence_epoch))
    return tail


def _extended(older: pa.Table, newer: pa.Table, primary_key: list[str]) -> pa.Table:
    """``newer`` laid over ``older`` (:func:`~resources.lsm.read.key_sets.laid_over`), in one chunk: a tail
    extended read after read would otherwise gather a chunk per entry."""
    if not newer.num_rows:
        return older
    return laid_over(older, newer, primary_key).combine_chunks()


def _earlier_tail(earlier: ResolvedTail | None, entries: Sequence[WalEntryFile]) -> ResolvedTail | None:
    """``earlier`` if ``entries`` extend its entries (newest per key is then the same over both)."""
    if earlier is None or tuple(entries[: len(earlier.entries)]) != earlier.entries:
        return None
    return earlier


def _read_entry(
    storage: TableStorage,
    scope: str,
    shard_id: str,
    entry: WalEntryFile,
    primary_key: list[str],
    cache: WalEntries | None,
) -> CachedEntry:
    def read() -> CachedEntry:
        return CachedEntry(*read_wal_entry(storage, shard_id, entry), primary_key)

    if cache is None:
        return read()
    return cache.get((scope, shard_id, entry.name, entry.size, entry.mtime_ns), read)
