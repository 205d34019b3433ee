"""The change feed: the net change per key between two table versions.

Which keys can have changed: every change goes to its shard's WAL first, and
WAL positions only grow. A change made after version ``since`` is, at
``until``, either in a generation the shard's manifest lists at ``until``
but did not list at ``since`` (flushed in between), or in ``until``'s WAL
tail. The keys of those levels (a superset: ``since``'s own WAL tail is
flushed later too) are looked up at both versions, a chunk at a time; a key
whose row differs is an upsert with its row at ``until``, a key live only at
``since`` a delete. Reading the keys costs the change, the lookups probe the
base through its key index: the base is never scanned.

The generations flushed after ``since`` outlive its base version: garbage
collection deletes a generation only once every retained base version has
merged it (:mod:`resources.lsm.maintenance.gc`), so a feed from a retained
version always finds them, merged into the base or not.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..format.schema import OP_COLUMN, conform
from ..format.version import TableVersion
from ..handle import TableHandle
from .generations import open_generation
from .key_sets import rows_of_keys
from .merged_read import ReadSnapshot, lookup

KEYS_PER_CHUNK = 65_536
"""Changed keys looked up together: the feed's memory follows this, not the number of changes."""


def changes(handle: TableHandle, since: TableVersion, until: TableVersion) -> pa.RecordBatchReader:
    """The net change per key from ``since`` to ``until``: the table's columns (at ``until``) plus ``_op``.

    Both versions are pinned (and checked to be retained) before this returns.

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
    key = list(handle.primary_key)
    touched = _written_keys(handle, before, after)
    columns = after.dataset.schema
    schema = change_schema(columns, key)

    def batches() -> Iterator[pa.RecordBatch]:
        for offset in range(0, touched.num_rows, KEYS_PER_CHUNK):
            keys = touched.slice(offset, KEYS_PER_CHUNK)
            buckets = handle.router.buckets(keys)
            old = lookup(before, keys, buckets, before.dataset.schema.names, handle.generation_filters)
            new = lookup(after, keys, buckets, columns.names, handle.generation_filters)
            # Columns added in between read as null at `since`, as every reader of older rows sees them.
            yield from _net_change(conform(old, columns), new, key, schema).to_batches()

    return pa.RecordBatchReader.from_batches(schema, (b for b in batches() if b.num_rows))


def change_schema(columns: pa.Schema, primary_key: list[str]) -> pa.Schema:
    """The feed's columns: the table's (nullable but the key: a delete carries its key only) plus ``_op``."""
    fields = [f if f.name in primary_key else f.with_nullable(True) for f in columns]
    return pa.schema([*fields, pa.field(OP_COLUMN, pa.string(), nullable=False)])


def _written_keys(handle: TableHandle, before: ReadSnapshot, after: ReadSnapshot) -> pa.Table:
    """Every key written after ``before`` and by ``after`` (once each): new generations and ``after``'s WAL tail."""
    key = list(handle.primary_key)
    parts = [after.tail.select(key)]
    for old, new in zip(before.shards, after.shards, strict=True):
        listed_before = set(old.flushed_generations)
        for _, directory in (g for g in new.flushed_generations if g not in listed_before):
            generation = open_generation(handle.storage, new.shard_id, directory, handle.session)
            parts.append(generation.to_table(columns=key))
    written = pa.concat_tables([p.cast(parts[0].schema) for p in parts])
    return written.group_by(key, use_threads=False).aggregate([]).select(key)


def _net_change(old: pa.Table, new: pa.Table, key: list[str], schema: pa.Schema) -> pa.Table:
    """Upserts: rows of ``new`` that ``old`` lacks or holds otherwise; deletes: keys only ``old`` holds."""
    in_old = rows_of_keys(new, old, key)
    present = pc.is_valid(in_old).to_numpy(zero_copy_only=False)
    same = np.zeros(new.num_rows, dtype=bool)
    if present.any():
        same[present] = _same_rows(new.filter(pa.array(present)), old.take(in_old.drop_null()))
    upserts = new.filter(pa.array(~same))
    gone = pc.is_null(rows_of_keys(old, new, key)).to_numpy(zero_copy_only=False)
    deletes = old.filter(pa.array(gone)).select(key)
    return pa.concat_tables([_with_op(upserts, "upsert", schema), _with_op(deletes, "delete", schema)])


def _same_rows(left: pa.Table, right: pa.Table) -> np.ndarray:
    """For aligned rows of ``left`` and ``right``, whether every column holds the same value (nulls alike)."""
    same = np.ones(left.num_rows, dtype=bool)
    for name in left.column_names:
        a, b = left[name].combine_chunks(), right[name].combine_chunks()
        if pa.types.is_nested(a.type):  # compute kernels do not compare lists: compare as Python values
            equal = np.array([x == y for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True)], dtype=bool)
        else:
            both_null = pc.and_(pc.is_null(a), pc.is_null(b))
            equal = pc.fill_null(pc.or_(pc.equal(a, b), both_null), False).to_numpy(zero_copy_only=False)
        same &= equal
    return same


def _with_op(rows: pa.Table, op: str, schema: pa.Schema) -> pa.Table:
    """``rows`` in ``schema``: its columns (missing ones null) and ``_op`` = ``op``."""
    arrays = [
        rows[f.name] if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
        for f in schema
        if f.name != OP_COLUMN
    ]
    return pa.Table.from_arrays([*arrays, pa.array([op] * rows.num_rows, pa.string())], schema=schema)
