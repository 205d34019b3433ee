"""Primary-key schema conventions shared by every layer of the engine.

Lance declares a primary key through field metadata
(``lance-schema:unenforced-primary-key: "true"``) on one or more non-null
fields. MemWAL writers use it to deduplicate (newest wins) and to turn deletes
into ``_tombstone`` rows.
"""

from __future__ import annotations

from functools import lru_cache

import pyarrow as pa
import pyarrow.compute as pc

PRIMARY_KEY_METADATA = b"lance-schema:unenforced-primary-key"
ADDED_COLUMN_METADATA = b"lsm:added-column"
"""Field metadata (``"true"``) of a column added to a live table: upserts may leave it out."""

OP_COLUMN = "_op"
"""Optional change column: ``'upsert'`` (default) or ``'delete'``."""
SEQ_COLUMN = "_seq"
"""Optional change column (int64): within one write the highest value per key wins."""
UNSET_COLUMN = "_unset"
"""Optional change column of a partial-update table: the columns a row does not set (list of names)."""
TOMBSTONE_COLUMN = "_tombstone"
"""Column MemWAL adds to WAL entries and SSTables; ``True`` marks a delete."""

ROW_ADDRESS = "_rowaddr"
"""Column Lance adds for ``with_row_address=True``: fragment id << 32 | offset."""

ROW_ID = "_rowid"
"""Column Lance adds for ``with_row_id=True``; null for a deleted row a scan returns (``include_deleted_rows``)."""

INTERNAL_COLUMNS = frozenset({TOMBSTONE_COLUMN, "_memtable_gen", ROW_ADDRESS, ROW_ID})
"""Columns Lance adds to scans; never part of a user schema."""

UPSERT, DELETE = "upsert", "delete"
CHANGE_OPS = (UPSERT, DELETE)
CHANGE_COLUMNS = (OP_COLUMN, SEQ_COLUMN, UNSET_COLUMN)
CHANGE_COLUMN_TYPES = {OP_COLUMN: pa.string(), SEQ_COLUMN: pa.int64(), UNSET_COLUMN: pa.list_(pa.string())}
"""The change columns' types once validated."""

LAST_WRITE_WINS, PARTIAL_UPDATE = "last-write-wins", "partial-update"
MERGE_ENGINES = (LAST_WRITE_WINS, PARTIAL_UPDATE)
"""How an upsert meets the row it replaces: whole (every column given) or column by column."""


def with_primary_key(schema: pa.Schema, primary_key: list[str]) -> pa.Schema:
    """Return ``schema`` with ``primary_key`` declared the Lance way.

    Key fields become non-nullable and carry the primary-key metadata; every
    other field loses it, so the declared key is exactly ``primary_key``.

    Raises
    ------
    ValueError
        If the key is empty, repeats a column, names a missing column, or uses
        a column name reserved for change streams.
    """
    if not primary_key:
        raise ValueError("primary_key must name at least one column")
    if len(set(primary_key)) != len(primary_key):
        raise ValueError(f"primary_key repeats a column: {primary_key}")
    missing = [name for name in primary_key if name not in schema.names]
    if missing:
        raise ValueError(f"primary_key columns {missing} are not in the schema {schema.names}")
    reserved = [name for name in schema.names if name in CHANGE_COLUMNS or name in INTERNAL_COLUMNS]
    if reserved:
        raise ValueError(f"column names {reserved} are reserved for change streams")
    for name in primary_key:
        key_type = schema.field(name).type
        if not (pa.types.is_integer(key_type) or pa.types.is_string(key_type) or pa.types.is_large_string(key_type)):
            raise ValueError(f"primary-key column {name!r} has type {key_type}; use an integer or string")

    fields = []
    for f in schema:
        metadata = {k: v for k, v in (f.metadata or {}).items() if k != PRIMARY_KEY_METADATA}
        if f.name in primary_key:
            metadata[PRIMARY_KEY_METADATA] = b"true"
            f = f.with_nullable(False)
        fields.append(f.with_metadata(metadata or None))
    return pa.schema(fields, metadata=schema.metadata)


def primary_key_of(schema: pa.Schema) -> list[str]:
    """Names of the fields carrying primary-key metadata, in schema order."""
    return [f.name for f in schema if (f.metadata or {}).get(PRIMARY_KEY_METADATA) == b"true"]


def without_internal_columns(table: pa.Table) -> pa.Table:
    """Drop MemWAL's bookkeeping columns (``_tombstone`` and friends)."""
    internal = [name for name in table.column_names if name in INTERNAL_COLUMNS]
    return table.drop_columns(internal) if internal else table


def live_rows(changes: pa.Table) -> pa.Table:
    """The upserts of a change table with ``_tombstone`` (deletes dropped), without that column."""
    dead = changes[TOMBSTONE_COLUMN]
    upserts = changes.filter(pc.invert(dead)) if pc.any(dead).as_py() else changes  # no copy without deletes
    return upserts.drop_columns([TOMBSTONE_COLUMN])


@lru_cache(maxsize=8)
def empty_tail(schema: pa.Schema) -> pa.Table:
    """An empty table of ``schema`` plus ``_tombstone``: the shape of a WAL tail (tables are immutable: shared)."""
    return schema.append(pa.field(TOMBSTONE_COLUMN, pa.bool_(), nullable=False)).empty_table()


def conform(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """``rows`` with exactly the columns of ``schema``, in its order and types.

    Columns ``schema`` has and ``rows`` lacks are filled with nulls: they
    were added to the table (:meth:`LsmTable.add_columns`) after the rows
    were written, so every reader returns null for older rows. Columns
    ``rows`` has and ``schema`` lacks are dropped (a reader of an older
    schema).

    Raises
    ------
    ValueError
        If a missing column is not nullable (only nullable columns are ever added).
    """
    missing = [f for f in schema if f.name not in rows.column_names]
    refused = [f.name for f in missing if not f.nullable]
    if refused:
        raise ValueError(f"rows lack the non-nullable columns {refused}")
    for f in missing:
        rows = rows.append_column(f.name, pa.nulls(rows.num_rows, f.type))
    return rows.select(schema.names).cast(schema)
