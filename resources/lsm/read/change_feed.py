"""The change feed: every key written between two table versions, once, with its state at the later one.

Where the changes are: every change goes to its shard's WAL before anything
else sees it, and WAL positions only grow. A version pins each shard's
newest WAL position, so what was written from ``since`` to ``until`` is
exactly the WAL entries after ``since``'s position up to ``until``'s, in
every shard; their newest change per key is that key's state at ``until``
(no level can hold a newer change of it). The feed reads those entries and
nothing else: the change, never the base. Entries a fenced writer appended
are skipped, as a replay skips them.

A delete is reported only for a key that was live at ``since`` (looked up
there; the base through its key index), so a key inserted and deleted in
between does not appear. A key written again with the values it had is
reported as an upsert: telling it apart would cost a base lookup per
written key.

Garbage collection keeps consumed WAL entries for at least the base-version
retention (:mod:`resources.lsm.maintenance.gc`), so the entries after a
retained version are there; if some are gone, the version is not retained.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import VersionNotRetainedError
from ..format.schema import OP_COLUMN, TOMBSTONE_COLUMN
from ..format.shard_manifest import WalEntryFile, list_wal_entries, wal_entries_complete
from ..format.shard_state import ShardState
from ..format.version import TableVersion
from ..handle import TableHandle
from .merged_read import ReadSnapshot, lookup
from .wal_tail import read_wal_tail

ROWS_PER_BATCH = 65_536
"""Rows per batch of the feed."""


def changes(handle: TableHandle, since: TableVersion, until: TableVersion) -> pa.RecordBatchReader:
    """The keys written from ``since`` to ``until``: the table's columns (at ``until``) plus ``_op``.

    Both versions are pinned, and checked to be retained, before this
    returns. The feed is produced a shard at a time: memory holds one
    shard's changes (one row per written key), not the table's.

    Raises
    ------
    ValueError
        If ``until`` is older than ``since``.
    VersionNotRetainedError
        If either version is older than garbage collection keeps.
    """
    if until < since:
        raise ValueError(f"until ({until}) is older than since ({since})")
    before = handle.snapshot(True, as_of=since)
    after = handle.snapshot(True, as_of=until)
    pairs = zip(before.shards, after.shards, strict=True)
    shards = [(old, new, _written_entries(handle, since, old, new)) for old, new in pairs]
    schema = change_schema(after.dataset.schema, list(handle.primary_key))

    def batches() -> Iterator[pa.RecordBatch]:
        for old, new, entries in shards:
            changes = _shard_changes(handle, before, new, entries, old.wal_position, schema)
            yield from changes.to_batches(max_chunksize=ROWS_PER_BATCH)

    return pa.RecordBatchReader.from_batches(schema, (b for b in batches() if b.num_rows))


def change_schema(columns: pa.Schema, primary_key: list[str]) -> pa.Schema:
    """The feed's columns: the table's (nullable but the key: a delete carries its key only) plus ``_op``."""
    fields = [f if f.name in primary_key else f.with_nullable(True) for f in columns]
    return pa.schema([*fields, pa.field(OP_COLUMN, pa.string(), nullable=False)])


def _written_entries(handle: TableHandle, since: TableVersion, old: ShardState, new: ShardState) -> list[WalEntryFile]:
    """The shard's WAL entries from ``old``'s replay position (fences are read from there, as a replay does)
    up to ``new``'s position, listed once.

    Raises :class:`VersionNotRetainedError` unless the entries written from ``old`` to ``new`` are all there.
    """
    listed = list_wal_entries(handle.storage, new.shard_id, after=old.replay_after_wal_position)
    entries = [e for e in listed if e.position <= new.wal_position]
    if not wal_entries_complete(entries, old.wal_position, new.wal_position):
        raise VersionNotRetainedError(since, f"WAL entries of shard {new.bucket} were removed")
    return entries


def _shard_changes(
    handle: TableHandle,
    before: ReadSnapshot,
    new: ShardState,
    entries: list[WalEntryFile],
    written_after: int,
    schema: pa.Schema,
) -> pa.Table:
    """One shard's part of the feed: its keys written in ``entries`` after position ``written_after``."""
    key = list(handle.primary_key)
    columns = pa.schema([f for f in schema if f.name != OP_COLUMN])
    written = read_wal_tail(handle.storage, new.shard_id, entries, columns, key, written_after=written_after)
    deleted = written[TOMBSTONE_COLUMN]
    upserts = written.filter(pc.invert(deleted)).drop_columns([TOMBSTONE_COLUMN])
    gone = written.filter(deleted).select(key)
    if gone.num_rows:  # only keys live at `since` were deleted
        gone = lookup(before, gone, np.full(gone.num_rows, new.bucket), key, handle.generation_filters)
    return pa.concat_tables([_with_op(upserts, "upsert", schema), _with_op(gone, "delete", schema)])


def _with_op(rows: pa.Table, op: str, schema: pa.Schema) -> pa.Table:
    """``rows`` in ``schema``: its columns (missing ones null) and ``_op`` = ``op``."""
    arrays = [
        rows[f.name] if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
        for f in schema
        if f.name != OP_COLUMN
    ]
    return pa.Table.from_arrays([*arrays, pa.array([op] * rows.num_rows, pa.string())], schema=schema)
