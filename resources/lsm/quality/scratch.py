"""Scratch copies of a table and synthetic change batches for it.

Quality probes (row-count reconciliation, the recovery drill) write to a copy
of the table, never to the table itself, with changes generated for the
table's own schema: some touch keys the table holds, some insert new keys.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from ..format.schema import DELETE, OP_COLUMN, UPSERT
from ..format.storage import filesystem
from ..table import LsmTable


def scratch_copy(table: LsmTable, destination: str) -> LsmTable:
    """Copy the table's files (base, manifests, WAL, generations) and open the copy.

    Consistent when no writer, flush or merge runs on the source meanwhile;
    the copy's shards have the source's epochs, so writing to it fences nobody.
    """
    source_fs, source = filesystem(table.uri, table.storage_options)
    destination_fs, copy = filesystem(destination)
    pafs.copy_files(source, copy, source_filesystem=source_fs, destination_filesystem=destination_fs)
    return LsmTable.open(destination)


def live_keys(table: LsmTable) -> pa.Table:
    """The key columns of every row of the merged view."""
    return table.read(columns=list(table.primary_key))


def key_pool(
    table: LsmTable, existing: pa.Table, new_keys: int, rng: np.random.Generator, max_existing: int
) -> pa.Table:
    """Keys to write: up to ``max_existing`` of ``existing`` plus ``new_keys`` keys no row has.

    New keys are numbered far above the keys small tables use (integer key
    columns) or carry a ``probe-`` prefix (string key columns).
    """
    picked = existing.take(rng.choice(existing.num_rows, min(max_existing, existing.num_rows), replace=False))
    numbers = np.arange(new_keys, dtype=np.int64) + int(rng.integers(1 << 20)) * new_keys
    fresh = pa.table({name: _key_values(table.schema.field(name).type, numbers) for name in table.primary_key})
    fresh = fresh.join(existing, keys=list(table.primary_key), join_type="left anti") if existing.num_rows else fresh
    return pa.concat_tables([picked, fresh.cast(picked.schema)])


def synthetic_changes(
    table: LsmTable, keys: pa.Table, delete_ratio: float, rng: np.random.Generator, label: str
) -> pa.Table:
    """One change batch: every key in ``keys`` once, deleted with ``delete_ratio``, else upserted.

    Each key appears once, so no ``_seq`` is needed to order the batch.
    """
    n = keys.num_rows
    columns = {
        f.name: keys[f.name] if f.name in table.primary_key else _values(f.type, n, rng, label) for f in table.schema
    }
    ops = np.where(rng.random(n) < delete_ratio, DELETE, UPSERT)
    return pa.table({**columns, OP_COLUMN: pa.array(ops)})


def _key_values(key_type: pa.DataType, numbers: np.ndarray) -> pa.Array:
    if pa.types.is_integer(key_type):
        top = np.iinfo(key_type.to_pandas_dtype()).max // 2
        return pa.array(top - numbers, key_type)
    return pa.array([f"probe-{n}" for n in numbers], key_type)


def _values(value_type: pa.DataType, n: int, rng: np.random.Generator, label: str) -> pa.Array:
    """Random values of a column's type; columns of other types stay null."""
    if pa.types.is_integer(value_type):
        return pa.array(rng.integers(0, 100, n), value_type)
    if pa.types.is_floating(value_type):
        return pa.array(np.round(rng.random(n) * 1000, 2), value_type)
    if pa.types.is_boolean(value_type):
        return pa.array(rng.random(n) < 0.5)
    if pa.types.is_string(value_type) or pa.types.is_large_string(value_type):
        return pa.array([f"{label}-{i}" for i in rng.integers(0, 1 << 30, n)], value_type)
    return pa.nulls(n, value_type)
