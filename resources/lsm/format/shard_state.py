"""``ShardState``: what an operator (or a sensor) needs to know about one shard."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .layout import VERSIONS_DIR, generation_dir
from .shard_manifest import KnownShardFiles, WalEntryFile, list_generation_dirs, list_wal_entries, read_shard_manifest
from .storage import TableStorage
from .version import ShardPosition
from .wal import sentinel_epoch


@dataclass(frozen=True)
class ShardState:
    """One shard's state, read from its manifest, WAL directory and the base table.

    Attributes
    ----------
    shard_id, bucket
        The shard's UUID and the bucket number routed to it.
    writer_epoch
        Epoch of the latest writer that claimed the shard (0: never written).
    manifest_version
        Version of the shard manifest this state was read from.
    replay_after_wal_position
        WAL entries at or below this position are contained in flushed generations.
    current_generation
        Generation the active MemTable will flush to.
    flushed_generations
        ``(generation, directory)`` pairs listed in the manifest, ascending.
    compacted_generation
        Highest generation merged into the base table (0: none).
    unflushed_wal_entries, unflushed_wal_bytes
        WAL entries after the replay position that hold changes: durable, not
        yet in a generation. (Fence sentinels, which a writer appends when it
        claims the shard and which stay behind when it closes with nothing to
        flush, do not count: flushing them would only append another.)
    unflushed_wal_first_mtime_ns, unflushed_wal_last_mtime_ns
        When the oldest and newest of those entries were written (``None``
        without entries, or on stores that keep no modification times).
    oldest_pending_mtime_ns
        When the oldest generation above the compacted marker was flushed
        (``None`` in a state loaded for reading only).
    pending_rows
        Rows written to the generations above the compacted marker, as their
        manifest entries count them (superseded duplicates included; a
        generation whose count the writer left out adds 0).
    orphan_directories
        Generation directories on storage that the manifest does not list;
        never read, removed by garbage collection (empty in a state loaded
        for reading only).
    wal_position
        The newest WAL entry position durable when the state was read (the
        replay position if no entry follows it): with ``manifest_version``,
        where the shard stood (:class:`~resources.lsm.format.version.ShardPosition`).
    wal_entries
        The WAL entry files after the replay position up to ``wal_position``
        (fence sentinels included), ascending: what a fresh read reads as the
        tail, without listing the directory again.
    """

    shard_id: str
    bucket: int
    writer_epoch: int
    manifest_version: int
    replay_after_wal_position: int
    current_generation: int
    flushed_generations: tuple[tuple[int, str], ...]
    compacted_generation: int
    unflushed_wal_entries: int
    unflushed_wal_bytes: int
    unflushed_wal_first_mtime_ns: int | None
    unflushed_wal_last_mtime_ns: int | None
    oldest_pending_mtime_ns: int | None
    orphan_directories: tuple[str, ...]
    pending_rows: int = 0
    wal_position: int = 0
    wal_entries: tuple[WalEntryFile, ...] = ()

    @cached_property
    def pending_generations(self) -> tuple[tuple[int, str], ...]:
        """Flushed generations not yet merged into the base table: what readers scan (a read asks often)."""
        return tuple(g for g in self.flushed_generations if g[0] > self.compacted_generation)


def load_shard_state(
    storage: TableStorage,
    shard_id: str,
    bucket: int,
    compacted_generation: int,
    *,
    for_read: bool = False,
    at: ShardPosition | None = None,
    known: KnownShardFiles | None = None,
) -> ShardState:
    """Read one shard's state; a shard that never had a writer reads as empty.

    ``for_read`` skips what only maintenance needs (orphan directories, the
    oldest pending flush time): two listings fewer, which on an object store
    are most of a point lookup's requests. ``at`` reads the state the shard
    had at an earlier position (its manifest version then, and the WAL
    entries up to its WAL position then) instead of the latest. ``known``
    (the handle's) spares reading manifests read before and, for the latest
    state, listing the WAL directory again (a state ``at`` an earlier
    position lists it: its entries may have been collected since).
    """
    manifest = read_shard_manifest(storage, shard_id, None if at is None else at.manifest_version, known)
    listed = manifest.flushed_generations if manifest else ()
    replay_after = manifest.replay_after_wal_position if manifest else 0
    entries = list_wal_entries(storage, shard_id, after=replay_after, known=known if at is None else None)
    if at is not None:
        entries = [e for e in entries if e.position <= at.wal_position]
    unflushed = [e for e in entries if sentinel_epoch(storage, shard_id, e) is None]
    wal_mtimes = [e.mtime_ns for e in unflushed if e.mtime_ns is not None]
    listed_dirs = {directory for _, directory in listed}
    present = () if for_read else list_generation_dirs(storage, shard_id)
    orphans = tuple(d for _, d in present if d not in listed_dirs)
    pending = [d for g, d in listed if g > compacted_generation]
    oldest_flush_ns = generation_flush_time_ns(storage, shard_id, pending[0]) if pending and not for_read else None
    return ShardState(
        shard_id=shard_id,
        bucket=bucket,
        writer_epoch=manifest.writer_epoch if manifest else 0,
        manifest_version=manifest.version if manifest else 0,
        replay_after_wal_position=replay_after,
        current_generation=manifest.current_generation if manifest else 1,
        flushed_generations=listed,
        compacted_generation=compacted_generation,
        unflushed_wal_entries=len(unflushed),
        unflushed_wal_bytes=sum(e.size for e in unflushed),
        unflushed_wal_first_mtime_ns=min(wal_mtimes, default=None),
        unflushed_wal_last_mtime_ns=max(wal_mtimes, default=None),
        oldest_pending_mtime_ns=oldest_flush_ns,
        orphan_directories=orphans,
        pending_rows=sum(s.physical_rows or 0 for s in manifest.sstables if s.generation > compacted_generation)
        if manifest
        else 0,
        wal_position=max((e.position for e in entries), default=replay_after) if at is None else at.wal_position,
        wal_entries=tuple(entries),
    )


def generation_flush_time_ns(storage: TableStorage, shard_id: str, directory: str) -> int | None:
    """When a generation was committed: the mtime of its dataset manifest."""
    versions = storage.list_dir(f"{generation_dir(shard_id, directory)}/{VERSIONS_DIR}")
    mtimes = [f.mtime_ns for f in versions if f.mtime_ns is not None]
    return min(mtimes, default=None)
