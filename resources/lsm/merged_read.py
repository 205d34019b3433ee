"""The merged view: base table + pending generations + WAL tail, newest wins.

Levels, oldest to newest::

    base table  <  generations above each shard's compacted marker  <  WAL tail

A full scan (:func:`scan`) reads the pending levels (small: compaction and
backpressure keep them so) and resolves them to the newest change per key,
while the base is scanned in parallel; base rows whose key has a pending
change are dropped, and the pending upserts are added. Lance's
``LsmScanner`` would do the same in one plan, but with pylance 14.0.2 it
costs a pass over the whole base per pending generation (500k base rows, 4
generations per shard: 5.3 s against 0.06 s here; ``benchmarks/maintenance.py``).

A point lookup (:func:`lookup`) uses ``LsmPointLookupPlanner`` per key over
its shard's generations that may hold the key, then overlays the WAL tail.

The base is trusted to hold each key once (only merge-into-base writes it):
a base broken from outside shows its duplicates in the merged view, where
the primary-key checks catch them.
"""

from __future__ import annotations

import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.mem_wal import LsmPointLookupPlanner, ShardSnapshot

from .dedup import keep_last_per_key
from .generations import generation_rows, open_generation
from .pk_bloom import GenerationFilters
from .schema import TOMBSTONE_COLUMN, without_internal_columns
from .shard_state import ShardState

_ROW = "__lsm_row"
_READERS = 8
"""Threads reading levels at once (opening a generation is mostly waiting on storage)."""
_reader_pool: ThreadPoolExecutor | None = None


@dataclass(frozen=True)
class ReadSnapshot:
    """Everything one read sees, pinned before the read starts.

    ``shards`` are the shards the read covers (all of them, except for a
    lookup, which needs only the shards its keys route to). ``tail`` holds at
    most one row per key of those shards (with ``_tombstone``); empty when the
    read is not fresh or nothing is pending in their WALs.
    """

    dataset: lance.LanceDataset
    shards: tuple[ShardState, ...]
    tail: pa.Table
    primary_key: tuple[str, ...]
    storage_options: dict[str, str] | None = None
    session: lance.Session | None = None
    """Lance session to open generations through (their metadata is cached there)."""

    def shard_snapshots(self) -> list[ShardSnapshot]:
        """Lance snapshots listing only generations above each compacted marker.

        Lance's planners do not skip generations already merged into the
        base table; including one would resurrect values older than the base.
        """
        return [_shard_snapshot(shard, shard.pending_generations) for shard in self.shards]


def _shard_snapshot(shard: ShardState, generations: tuple[tuple[int, str], ...]) -> ShardSnapshot:
    """A Lance snapshot of ``shard`` listing ``generations`` (pending ones only, never merged ones)."""
    snapshot = ShardSnapshot(shard.shard_id).with_current_generation(shard.current_generation)
    for generation, directory in generations:
        snapshot = snapshot.with_sstable(generation, directory)
    return snapshot


def scan(snapshot: ReadSnapshot, columns: list[str], filter: str | None) -> pa.Table:
    """Rows of the merged view matching ``filter`` (Lance SQL), projected to ``columns``.

    The filter applies to each key's newest version only: a base row is
    dropped whenever its key has a pending change, matching or not.
    """
    key = list(snapshot.primary_key)
    wanted = columns + [k for k in key if k not in columns]
    # Both reads spend their time in Lance's native code, which releases the GIL.
    base = _readers().submit(snapshot.dataset.to_table, columns=wanted, filter=filter)
    # The filter may name columns the caller did not ask for: read them all then.
    newer = pending_changes(snapshot, snapshot.dataset.schema.names if filter else wanted)
    older = key_join(base.result(), newer.select(key), key, "left anti")
    live = _live(newer)
    if filter:
        live = _filter_sql(live, filter)
    return pa.concat_tables([older.select(wanted), live.select(wanted).cast(older.select(wanted).schema)]) \
        .select(columns)


def pending_changes(snapshot: ReadSnapshot, columns: list[str]) -> pa.Table:
    """The newest pending change of every key above the base, with ``_tombstone``.

    Levels are the pending generations of each shard (ascending) and then the
    WAL tail; ``columns`` must include the primary key. Generations are read
    in parallel (each is a small Lance dataset).
    """
    shape = snapshot.tail.schema
    shape = pa.schema([shape.field(c) for c in [*columns, TOMBSTONE_COLUMN]])
    generations = [(s.shard_id, d) for s in snapshot.shards for _, d in s.pending_generations]

    def read(generation: tuple[str, str]) -> pa.Table:
        dataset = open_generation(snapshot.dataset.uri, *generation, snapshot.storage_options, snapshot.session)
        return generation_rows(dataset, shape)

    parts = list(_readers().map(read, generations))
    levels = pa.concat_tables([shape.empty_table(), *parts, snapshot.tail.select(shape.names)])
    return keep_last_per_key(levels, list(snapshot.primary_key))


def _readers() -> ThreadPoolExecutor:
    """The process's level-reading threads, started on first use (starting threads per read costs ms)."""
    global _reader_pool
    if _reader_pool is None:
        _reader_pool = ThreadPoolExecutor(max_workers=_READERS, thread_name_prefix="lsm-level-read")
    return _reader_pool


def _forget_readers() -> None:
    # A forked child inherits the pool but not its threads: it starts its own.
    global _reader_pool
    _reader_pool = None


os.register_at_fork(after_in_child=_forget_readers)


def lookup(snapshot: ReadSnapshot, keys: pa.Table, buckets: np.ndarray, columns: list[str],
           filters: GenerationFilters) -> pa.Table:
    """The merged-view row of each key in ``keys`` (absent keys are skipped).

    ``buckets`` holds each key's bucket; ``snapshot`` must cover those shards.
    A key's lookup plans over its own shard only, and only over the pending
    generations that ``filters`` says may hold it.
    """
    key = list(snapshot.primary_key)
    wanted = columns + [k for k in key if k not in columns]
    shards = {s.bucket: s for s in snapshot.shards}
    planners = _Planners(snapshot)
    found = []
    for i in np.flatnonzero(~key_mask(keys, snapshot.tail, key)):
        one_key = keys.slice(int(i), 1)
        shard = shards[int(buckets[i])]
        generations = filters.candidates(shard, [one_key[k][0].as_py() for k in key])
        plan = planners.get(shard, generations).plan_lookup(_lookup_value(one_key), wanted)
        found.append(without_internal_columns(plan.to_table()))
    live_tail = _live(key_join(snapshot.tail, keys, key, "left semi"))
    parts = [t.select(wanted) for t in found if t.num_rows] + [live_tail.select(wanted)]
    schema = pa.schema([snapshot.dataset.schema.field(c) for c in wanted])
    return pa.concat_tables([p.cast(schema) for p in parts]).select(columns)


class _Planners:
    """Point-lookup planners, each over one shard and a subset of its pending generations.

    A key lives in exactly one shard, and a planner opens every generation it
    is given on every lookup: the fewer it holds, the faster it answers.
    """

    def __init__(self, snapshot: ReadSnapshot) -> None:
        self._snapshot = snapshot
        self._planners: dict[tuple[str, tuple], LsmPointLookupPlanner] = {}

    def get(self, shard: ShardState, generations: tuple[tuple[int, str], ...]) -> LsmPointLookupPlanner:
        cache_key = (shard.shard_id, generations)
        if cache_key not in self._planners:
            self._planners[cache_key] = LsmPointLookupPlanner(
                self._snapshot.dataset, [_shard_snapshot(shard, generations)], list(self._snapshot.primary_key))
        return self._planners[cache_key]


def _live(tail: pa.Table) -> pa.Table:
    """Tail rows that are upserts, without the tombstone column."""
    return tail.filter(pc.invert(tail[TOMBSTONE_COLUMN])).drop_columns([TOMBSTONE_COLUMN])


def key_join(left: pa.Table, right: pa.Table, key: list[str], join_type: str) -> pa.Table:
    """Rows of ``left`` whose key is (``"left semi"``) or is not (``"left anti"``) in ``right``.

    Keeps ``left``'s row order.
    """
    if left.num_rows == 0 or right.num_rows == 0:
        return left if join_type == "left anti" else left.slice(0, 0)
    in_right = key_mask(left, right, key)
    return left.filter(in_right if join_type == "left semi" else ~in_right)


def key_mask(left: pa.Table, right: pa.Table, key: list[str]) -> np.ndarray:
    """For each row of ``left``, whether its key occurs in ``right`` (a boolean array).

    A single-column key is a hash-set membership test; a composite key goes
    through Acero's join, on the key columns only (the join refuses payload
    columns such as fixed-size-list vectors).
    """
    if not (left.num_rows and right.num_rows):
        return np.zeros(left.num_rows, dtype=bool)
    if len(key) == 1:
        found = pc.is_in(left[key[0]], value_set=right[key[0]].combine_chunks())
        return found.to_numpy(zero_copy_only=False)
    mask = np.zeros(left.num_rows, dtype=bool)
    numbered = left.select(key).append_column(_ROW, pa.array(np.arange(left.num_rows, dtype=np.int64)))
    mask[numbered.join(right.select(key), keys=key, join_type="left semi", use_threads=False)[_ROW].to_numpy()] = True
    return mask


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
