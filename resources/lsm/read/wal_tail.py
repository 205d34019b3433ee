"""Read a shard's WAL tail: rows durable in the WAL but not yet flushed.

Every WAL entry is an Arrow IPC stream holding the table's columns plus
``_tombstone``; its schema metadata names the ``writer_epoch``. A writer that
claims a shard first appends an empty *fence sentinel* entry with its epoch;
entries from an older epoch that follow a sentinel come from a fenced writer
and were never acknowledged, so they are skipped (as replay does).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from ..format.schema import conform, empty_tail
from ..format.shard_manifest import WalEntryFile
from ..format.storage import TableStorage
from ..format.wal import read_wal_entry, sentinel_epoch
from ..lru_cache import LruCache
from .dedup import keep_last_per_key
from .key_sets import key_join

WalEntries = LruCache[tuple[str, str, int, int | None], tuple[dict[str, str], pa.Table]]
"""WAL entries one table handle read, by shard and file (name, size, modification time)."""


def wal_entry_cache() -> WalEntries:
    """A cache for :func:`read_wal_tail`: an entry never changes once written, and beside a busy writer every
    fresh read reads the whole tail again, entries it read a moment ago included (most of a point lookup's cost)."""
    return LruCache(max_entries=4096, max_bytes=64 << 20, size_of=lambda entry: entry[1].nbytes)


def read_wal_tail(
    storage: TableStorage,
    shard_id: str,
    entries: Sequence[WalEntryFile],
    schema: pa.Schema,
    primary_key: list[str],
    written_after: int | None = None,
    keys: pa.Table | None = None,
    cache: WalEntries | None = None,
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
    what the whole tail does. ``cache`` (one per table handle:
    :func:`wal_entry_cache`) keeps the entries read, so each is read once.
    """
    tail_schema = empty_tail(schema).schema
    fence_epoch = 0
    parts = []
    for entry in entries:
        if written_after is not None and entry.position <= written_after:  # only its fence counts
            fence_epoch = max(fence_epoch, sentinel_epoch(storage, shard_id, entry) or 0)
            continue
        metadata, rows = _read_entry(storage, shard_id, entry, cache)
        epoch = int(metadata.get("writer_epoch", 0))
        if metadata.get("fence_sentinel") == "true":
            fence_epoch = max(fence_epoch, epoch)
            continue
        if epoch < fence_epoch or rows.num_rows == 0:
            continue
        if keys is not None:
            rows = key_join(rows, keys, primary_key, "left semi")
        parts.append(conform(rows, tail_schema))  # an entry written before columns were added lacks them
    if not parts:
        return empty_tail(schema)
    return keep_last_per_key(pa.concat_tables(parts), primary_key)


def _read_entry(
    storage: TableStorage, shard_id: str, entry: WalEntryFile, cache: WalEntries | None
) -> tuple[dict[str, str], pa.Table]:
    if cache is None:
        return read_wal_entry(storage, shard_id, entry)
    file = (shard_id, entry.name, entry.size, entry.mtime_ns)
    return cache.get(file, lambda: read_wal_entry(storage, shard_id, entry))
