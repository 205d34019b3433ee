"""Partial updates: an upsert sets the columns it gives and keeps the row's other values.

In a ``partial-update`` table every validated change carries ``_unset``: the
non-key columns the row does not set (a column the batch lacks, a JSON field
that is absent, or names the writer listed). An explicit null is a value. Two
steps turn such changes into the full rows MemWAL stores, so that every level
(WAL, generations, pending runs, base) holds whole rows and every reader stays
as it is:

1. :func:`fold_changes`: one write's changes, in newest-wins order, become one
   change per key. Per column the newest row that sets it wins; a delete
   clears the row, so a later upsert starts from nulls.
2. :func:`complete_upserts`: each folded upsert's unset columns are read from
   the key's current row in the merged view (null for a key that is not
   live). The shard writer calls it after claiming the shard and before the
   put, every attempt again, so the row it reads is the newest acknowledged one.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..format.schema import DELETE, OP_COLUMN, UNSET_COLUMN
from ..handle import TableHandle
from ..read import merged_read
from ..read.key_sets import rows_of_keys

_ROW = "__lsm_row"


def unset_masks(unset: pa.ChunkedArray | pa.Array, columns: list[str]) -> dict[str, np.ndarray]:
    """For each of ``columns``, which rows leave it unset (``unset``: lists of names per row, null = none).

    The lists are flattened once for all columns.
    """
    unset = unset.combine_chunks() if isinstance(unset, pa.ChunkedArray) else unset
    names = pc.list_flatten(unset)
    rows = pc.list_parent_indices(unset).to_numpy()
    masks = {}
    for column in columns:
        mask = np.zeros(len(unset), dtype=bool)
        if len(names):
            mask[rows[pc.fill_null(pc.equal(names, column), False).to_numpy(zero_copy_only=False)]] = True
        masks[column] = mask
    return masks


def fold_changes(ordered: pa.Table, schema: pa.Schema, primary_key: list[str]) -> tuple[pa.Table, pa.Table]:
    """One change per key from ``ordered`` (table columns, ``_op``, ``_unset``; later rows newer).

    Returns ``(upserts, deletes)``: upserts with the table's columns plus
    ``_unset`` (what stays to be read from the current row), deletes with the
    key columns. A key whose newest change is a delete is deleted; otherwise
    each column takes the value of the newest upsert that sets it after the
    key's last delete, null if none does but a delete came first, and stays
    unset if neither happened.
    """
    unset_type = pa.field(UNSET_COLUMN, pa.list_(pa.string()))
    if ordered.num_rows == 0:
        return schema.append(unset_type).empty_table(), ordered.select(primary_key)
    order, starts = _grouped_order(ordered, primary_key)
    rows = ordered.take(order)
    n = rows.num_rows
    group = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, n)))
    position = np.arange(n)
    is_delete = pc.fill_null(pc.equal(rows[OP_COLUMN], DELETE), False).to_numpy(zero_copy_only=False)
    last_delete = np.maximum.reduceat(np.where(is_delete, position, -1), starts)
    after_delete = position > last_delete[group]
    newest = np.append(starts[1:], n) - 1
    upserted = ~is_delete[newest]

    columns: dict[str, pa.Array] = {}
    unset_names: list[list[str]] = [[] for _ in range(int(upserted.sum()))]
    unset = unset_masks(rows[UNSET_COLUMN], [f.name for f in schema if f.name not in primary_key])
    for field in schema:
        if field.name in primary_key:
            columns[field.name] = rows[field.name].take(pa.array(newest[upserted]))
            continue
        sets = ~is_delete & after_delete & ~unset[field.name]
        source = np.maximum.reduceat(np.where(sets, position, -1), starts)[upserted]
        columns[field.name] = rows[field.name].take(pa.array(source, mask=source < 0))
        for i in np.flatnonzero((source < 0) & (last_delete[upserted] < 0)):
            unset_names[i].append(field.name)
    columns[UNSET_COLUMN] = pa.array(unset_names, pa.list_(pa.string()))
    upserts = pa.table(columns).cast(schema.append(unset_type))
    deletes = rows.select(primary_key).take(pa.array(newest[~upserted]))
    return upserts, deletes


def _grouped_order(ordered: pa.Table, primary_key: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """A permutation that groups rows by key (rows of a key keep their order), and each group's first position."""
    numbered = ordered.select(primary_key).append_column(_ROW, pa.array(np.arange(ordered.num_rows, dtype=np.int64)))
    groups = numbered.group_by(primary_key, use_threads=False).aggregate([(_ROW, "list")])[f"{_ROW}_list"]
    groups = groups.combine_chunks()
    group_of_row = np.empty(ordered.num_rows, dtype=np.int64)
    group_of_row[pc.list_flatten(groups).to_numpy()] = pc.list_parent_indices(groups).to_numpy()
    order = np.lexsort((np.arange(ordered.num_rows), group_of_row))
    starts = np.flatnonzero(np.diff(group_of_row[order], prepend=-1))
    return order, starts


def complete_upserts(handle: TableHandle, shard_id: str, upserts: pa.Table) -> pa.Table:
    """``upserts`` (folded, with ``_unset``) as full rows: unset columns taken from the current rows.

    The current rows are the merged view of the shard now (base, pending
    generations, WAL tail); a key that is not live gives nulls. Only the keys
    of rows that leave a column unset are looked up.
    """
    unset = upserts[UNSET_COLUMN]
    full = upserts.drop_columns([UNSET_COLUMN])
    masks = unset_masks(unset, full.column_names)
    wanted = [name for name, mask in masks.items() if mask.any()]
    if not wanted:
        return full
    key = list(handle.primary_key)
    keys = full.select(key).filter(pa.array(np.logical_or.reduce([masks[name] for name in wanted])))
    buckets = np.full(keys.num_rows, handle.shard_ids.index(shard_id))
    snapshot = handle.snapshot(True, {shard_id}, keys=keys)
    current = merged_read.lookup(snapshot, keys, buckets, [*key, *wanted], handle.generation_filters)
    at = rows_of_keys(full.select(key), current, key)
    columns = [
        pc.if_else(pa.array(masks[name]), current[name].take(at).cast(full[name].type), full[name])
        if name in wanted
        else full[name]
        for name in full.column_names
    ]
    return pa.Table.from_arrays(columns, schema=full.schema)
