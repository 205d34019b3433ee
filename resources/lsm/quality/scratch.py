"""Scratch samples of a table and synthetic change batches for it.

Quality probes (row-count reconciliation, the recovery drill) write to a
scratch table, never to the table itself: a new table with the source's
schema, key, shard count and writer settings whose base holds a bounded
sample of the source's merged view. What they prove (acknowledged writes
survive a kill exactly once; the view changes by exactly what was applied)
is a property of the write path, not of the base's size, so the probes cost
the same at any table size. Changes are generated for the table's own
schema: some touch keys the sample holds, some insert new keys.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..format.schema import DELETE, OP_COLUMN, UPSERT
from ..table import LsmTable

DEFAULT_SAMPLE_ROWS = 10_000
"""Rows of the merged view a scratch table starts from (the probes' memory and time follow it)."""


def scratch_sample(table: LsmTable, destination: str, rows: int = DEFAULT_SAMPLE_ROWS) -> LsmTable:
    """A new table at ``destination`` like ``table``, its base holding the first ``rows`` rows of its merged view.

    The rows are streamed (``table.scanner()``), so neither memory nor time
    depend on the source's size beyond its pending changes. They go through
    the write path (write, flush, merge), so the scratch table has a base,
    generations above an advanced marker and a key index like a real one.
    The source is only read; the bucket column is the first key column.
    """
    reader = table.scanner()
    try:
        head = pa.Table.from_batches(list(_first_rows(reader, rows)), schema=reader.schema)
    finally:
        reader.close()
    copy = LsmTable.create(
        destination, table.schema, list(table.primary_key), table.num_shards, **table.handle.writer_settings()
    )
    if head.num_rows:
        copy.write(head)
        copy.close()
        copy.compact()
    return copy


def _first_rows(batches: pa.RecordBatchReader, rows: int) -> list[pa.RecordBatch]:
    """The leading batches of ``batches`` holding ``rows`` rows (the last one cut)."""
    kept: list[pa.RecordBatch] = []
    taken = 0
    for batch in batches:
        if taken >= rows:
            break
        kept.append(batch.slice(0, rows - taken))
        taken += kept[-1].num_rows
    return kept


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
