"""The merged view: base table + pending generations + WAL tail, newest wins.

Levels, oldest to newest::

    base table  <  generations above each shard's compacted marker  <  WAL tail

``LsmScanner`` / ``LsmPointLookupPlanner`` merge the first two (they resolve
newest-wins and drop tombstones). The WAL tail is overlaid here: every key it
mentions hides the older levels' row, and its live rows are added.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass

import lance
import pyarrow as pa
import pyarrow.compute as pc
from lance.mem_wal import LsmPointLookupPlanner, LsmScanner, ShardSnapshot

from .schema import TOMBSTONE_COLUMN, without_internal_columns
from .shard_state import ShardState


@dataclass(frozen=True)
class ReadSnapshot:
    """Everything one read sees, pinned before the read starts.

    ``tail`` holds at most one row per key (with ``_tombstone``); empty when
    the read is not fresh or nothing is pending in any WAL.
    """

    dataset: lance.LanceDataset
    shards: tuple[ShardState, ...]
    tail: pa.Table
    primary_key: tuple[str, ...]

    def shard_snapshots(self) -> list[ShardSnapshot]:
        """Lance snapshots listing only generations above each compacted marker.

        ``LsmScanner`` does not skip generations already merged into the
        base table; including one would resurrect values older than the base.
        """
        snapshots = []
        for shard in self.shards:
            snapshot = ShardSnapshot(shard.shard_id).with_current_generation(shard.current_generation)
            for generation, directory in shard.pending_generations:
                snapshot = snapshot.with_sstable(generation, directory)
            snapshots.append(snapshot)
        return snapshots


def scan(snapshot: ReadSnapshot, columns: list[str], filter: str | None) -> pa.Table:
    """Rows of the merged view matching ``filter`` (Lance SQL), projected to ``columns``."""
    key = list(snapshot.primary_key)
    wanted = columns + [k for k in key if k not in columns]
    scanner = LsmScanner.from_snapshots(snapshot.dataset, snapshot.shard_snapshots()).project(wanted)
    if filter:
        scanner = scanner.filter(filter)
    older = without_internal_columns(scanner.to_table())
    return _overlay_tail(older, snapshot.tail, key, wanted, filter).select(columns)


def lookup(snapshot: ReadSnapshot, keys: pa.Table, columns: list[str]) -> pa.Table:
    """The merged-view row of each key in ``keys`` (absent keys are skipped)."""
    key = list(snapshot.primary_key)
    wanted = columns + [k for k in key if k not in columns]
    in_tail = _key_join(keys, snapshot.tail.select(key), key, "left semi")
    remaining = _key_join(keys, in_tail, key, "left anti")
    planner = LsmPointLookupPlanner(snapshot.dataset, snapshot.shard_snapshots(), key)
    found = [
        without_internal_columns(planner.plan_lookup(_lookup_value(remaining.slice(i, 1)), wanted).to_table())
        for i in range(remaining.num_rows)
    ]
    live_tail = _live(_key_join(snapshot.tail, in_tail, key, "left semi"))
    parts = [t.select(wanted) for t in found if t.num_rows] + [live_tail.select(wanted)]
    schema = pa.schema([snapshot.dataset.schema.field(c) for c in wanted])
    return pa.concat_tables([p.cast(schema) for p in parts]).select(columns)


def _overlay_tail(older: pa.Table, tail: pa.Table, key: list[str], wanted: list[str],
                  filter: str | None) -> pa.Table:
    if tail.num_rows == 0:
        return older
    older = _key_join(older, tail.select(key), key, "left anti")
    newer = _live(tail).select(wanted)
    if filter:
        newer = _filter_sql(newer, filter)
    return pa.concat_tables([older.select(wanted), newer.cast(older.select(wanted).schema)])


def _live(tail: pa.Table) -> pa.Table:
    """Tail rows that are upserts, without the tombstone column."""
    return tail.filter(pc.invert(tail[TOMBSTONE_COLUMN])).drop_columns([TOMBSTONE_COLUMN])


def _key_join(left: pa.Table, right: pa.Table, key: list[str], join_type: str) -> pa.Table:
    if left.num_rows == 0 or right.num_rows == 0:
        return left if join_type == "left anti" else left.slice(0, 0)
    return left.join(right.select(key), keys=key, join_type=join_type, use_threads=False)


def _filter_sql(table: pa.Table, filter: str) -> pa.Table:
    """Apply a Lance SQL filter to an in-memory table.

    The tail is small (bounded by the unflushed WAL); evaluating the filter with
    Lance itself keeps its SQL dialect identical for every level.
    """
    with tempfile.TemporaryDirectory(prefix="lsm-tail-") as tmp:
        return lance.write_dataset(table, tmp).to_table(filter=filter)


def _lookup_value(one_key: pa.Table) -> pa.Array:
    """The planner's key form: a 1-element array, or a 1-row struct for composite keys."""
    if one_key.num_columns == 1:
        return one_key.column(0).combine_chunks()
    return pa.StructArray.from_arrays([c.combine_chunks() for c in one_key.columns],
                                      names=one_key.column_names)
