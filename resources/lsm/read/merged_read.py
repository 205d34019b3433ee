"""The merged view: base table + pending generations + WAL tail, newest wins.

Levels, oldest to newest::

    base table  <  generations above each shard's compacted marker  <  WAL tail

A full scan (:func:`scan`) streams the base batches while it resolves the
pending levels (small: compaction and backpressure keep them so) to the
newest change per key; each base batch then loses the rows whose key has a
pending change, on the reader threads, as it arrives, and the pending
upserts are added. Resolved generations are kept between reads
(:class:`PendingGenerations`): they never change once flushed. Lance's
``LsmScanner`` would do the same in one plan, but with pylance 14.0.2 it
costs a pass over the whole base per pending generation (500k base rows, 4
generations per shard: 5.3 s against ~0.04 s here; ``benchmarks/maintenance.py``).

A point lookup (:func:`lookup`) uses ``LsmPointLookupPlanner`` per key over
its shard's generations that may hold the key, then overlays the WAL tail.

The base is trusted to hold each key once (only merge-into-base writes it):
a base broken from outside shows its duplicates in the merged view, where
the primary-key checks catch them.
"""

from __future__ import annotations

import operator
import os
import queue
import tempfile
import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import reduce

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.mem_wal import LsmPointLookupPlanner, ShardSnapshot

from ..format.schema import TOMBSTONE_COLUMN, live_rows, without_internal_columns
from ..format.shard_state import ShardState
from .generations import generation_rows, newest_per_key, open_generation, read_generations
from .pk_bloom import GenerationFilters

_ROW = "__lsm_row"
_READERS = 8
"""Threads reading levels at once (opening a generation is mostly waiting on storage)."""
_reader_pool: ThreadPoolExecutor | None = None
_BASE_BATCH_ROWS = 65_536
"""Rows per base batch in a full scan: fewer, larger batches scan faster than Lance's default (8k)."""


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
    pending_cache: PendingGenerations | None = None
    """Where resolved pending generations are kept between reads (``None``: read them every time)."""

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


def scan(
    dataset: lance.LanceDataset,
    primary_key: Sequence[str],
    pin_levels: Callable[[], ReadSnapshot],
    columns: list[str],
    filter: str | None,
) -> pa.RecordBatchReader:
    """Batches of the merged view matching ``filter`` (Lance SQL), projected to ``columns``.

    ``dataset`` is the pinned base version; ``pin_levels`` pins the levels
    above it (a :class:`ReadSnapshot` of ``dataset``) and runs while the base
    scan starts. The filter applies to each key's newest version only: a base
    row is dropped whenever its key has a pending change, matching or not.

    Memory is bounded by the pending levels (the change, resolved to one row
    per key) plus a few base batches: the base streams through, its batches
    filtered on the reader threads while the scan goes on, base rows first and
    the pending upserts last. Closing (or dropping) the reader stops the scan.
    """
    key = list(primary_key)
    wanted = columns + [k for k in key if k not in columns]
    base = _BaseBatches(dataset, wanted, filter)
    try:
        snapshot = pin_levels()
        # The filter may name columns the caller did not ask for: read them all then.
        newer = pending_changes(snapshot, dataset.schema.names if filter else wanted)
    except BaseException:
        base.close()
        raise
    live = live_rows(newer)
    if filter:
        live = _filter_sql(live, filter)
    schema = pa.schema([dataset.schema.field(c) for c in columns])
    older = base.without(_KeyFilter(newer.select(key).combine_chunks(), key))
    weakref.finalize(older, base.close)  # a reader dropped unread stops the scan too
    newest = live.select(columns).cast(schema).to_batches()
    return pa.RecordBatchReader.from_batches(schema, _chain((b.select(columns) for b in older), newest))


def _chain(*parts: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for part in parts:
        yield from (batch for batch in part if batch.num_rows)


class _BaseBatches:
    """The base scan, started on a reader thread at once and drained by :meth:`without`.

    At most ``_IN_FLIGHT`` batches are read ahead of the consumer, so a slow
    consumer holds the scan back instead of buffering the table. The scan runs
    on a thread of its own: a pool thread blocked on a slow consumer could
    starve the filtering that consumer waits for.
    """

    _END = object()
    _IN_FLIGHT = 2 * _READERS

    def __init__(self, dataset: lance.LanceDataset, columns: list[str], filter: str | None) -> None:
        # Record batches, then ``_END`` or the exception that stopped the scan.
        self._batches: queue.Queue[pa.RecordBatch | BaseException | object] = queue.Queue(self._IN_FLIGHT)
        self._closed = threading.Event()
        threading.Thread(target=self._pump, args=(dataset, columns, filter), name="lsm-base-scan", daemon=True).start()

    def _pump(self, dataset: lance.LanceDataset, columns: list[str], filter: str | None) -> None:
        try:
            for batch in dataset.to_batches(columns=columns, filter=filter, batch_size=_BASE_BATCH_ROWS):
                if not self._put(batch):
                    return
            self._put(self._END)
        except BaseException as exc:  # handed to the reading thread, which raises it
            self._put(exc)

    def _put(self, item: pa.RecordBatch | BaseException | object) -> bool:
        """Queue ``item`` once there is room; ``False`` if the reader was closed meanwhile."""
        while not self._closed.is_set():
            try:
                self._batches.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def close(self) -> None:
        """Stop the scan (the pump thread returns at its next batch)."""
        self._closed.set()

    def without(self, keys: _KeyFilter) -> Iterator[pa.RecordBatch]:
        """Every base row whose key is not in ``keys``, in scan order.

        Batches are filtered on the reader threads while the scan goes on
        (numpy and Arrow kernels release the GIL), ``_IN_FLIGHT`` at a time.
        """
        pending: deque[Future[pa.Table]] = deque()
        try:
            while (item := self._batches.get()) is not self._END:
                if isinstance(item, BaseException):
                    raise item
                pending.append(_readers().submit(keys.drop_from, item))
                if len(pending) >= self._IN_FLIGHT:
                    yield from pending.popleft().result().to_batches()
            while pending:
                yield from pending.popleft().result().to_batches()
        finally:
            self.close()


class _KeyFilter:
    """A fixed set of keys, prepared once to drop its keys from many base batches.

    A single integer key whose values span a small range (sequence ids, the
    usual case) becomes a bitmap indexed by value, so a batch costs one array
    lookup per row; Arrow's hash-set test would rebuild its set for every
    batch. Other keys go through :func:`key_join`.
    """

    _MAX_SPAN = 1 << 24
    """Widest value range given a bitmap (16 MB)."""

    def __init__(self, keys: pa.Table, key: list[str]) -> None:
        self._keys, self._key = keys, key
        self._bitmap: np.ndarray | None = None
        values = keys.column(0) if len(key) == 1 else None
        if values is not None and keys.num_rows and pa.types.is_integer(values.type) and not values.null_count:
            self._low, high = pc.min(values).as_py(), pc.max(values).as_py()
            if high - self._low < self._MAX_SPAN:
                self._bitmap = np.zeros(high - self._low + 1, dtype=bool)
                self._bitmap[values.to_numpy() - self._low] = True

    def drop_from(self, batch: pa.RecordBatch) -> pa.Table:
        """``batch``'s rows whose key is not in the set, in order."""
        if not self._keys.num_rows:
            return pa.Table.from_batches([batch])
        column = batch.column(self._key[0])
        if self._bitmap is None or column.null_count:
            return key_join(pa.Table.from_batches([batch]), self._keys, self._key, "left anti")
        values = column.to_numpy()
        offsets = values - self._low  # may wrap around far from the range: the bounds test catches it
        in_range = (values >= self._low) & (offsets >= 0) & (offsets < len(self._bitmap))
        found = np.zeros(len(values), dtype=bool)
        found[in_range] = self._bitmap[offsets[in_range]]
        return pa.Table.from_batches([batch.filter(pa.array(~found))])


def pending_changes(snapshot: ReadSnapshot, columns: list[str]) -> pa.Table:
    """The newest pending change of every key above the base, with ``_tombstone``.

    Levels are the pending generations of each shard (ascending) and then the
    WAL tail; ``columns`` must include the primary key.
    """
    shape = snapshot.tail.schema
    shape = pa.schema([shape.field(c) for c in [*columns, TOMBSTONE_COLUMN]])
    cache = snapshot.pending_cache or PendingGenerations(capacity=0)
    generations = cache.resolved(snapshot, shape)
    if not snapshot.tail.num_rows:
        return generations
    return newest_per_key([generations, snapshot.tail.select(shape.names)], shape, snapshot.primary_key)


# A PendingGenerations entry: the (shard id, directory) generations and the (name, type) columns of the shape.
_PendingKey = tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]


class PendingGenerations:
    """The newest change per key over a table's pending generations, kept between reads.

    A flushed generation never changes, so what one set of pending generations
    resolves to stays true until a flush adds a generation or a merge removes
    some, which changes the set (the cache key) itself. At most ``capacity``
    of these results (different sets or projections) and ``max_bytes`` of
    Arrow data are kept, the least recently used dropped first; a result
    larger than ``max_bytes`` is not kept (wide vector columns). Safe to share
    between threads.
    """

    def __init__(self, capacity: int = 4, max_bytes: int = 1 << 30) -> None:
        self._capacity, self._max_bytes = capacity, max_bytes
        self._entries: OrderedDict[_PendingKey, pa.Table] = OrderedDict()
        self._lock = threading.Lock()

    def resolved(self, snapshot: ReadSnapshot, shape: pa.Schema) -> pa.Table:
        """Newest change per key over the snapshot's pending generations, as ``shape`` (with ``_tombstone``)."""
        generations = tuple((s.shard_id, d) for s in snapshot.shards for _, d in s.pending_generations)
        cache_key = (generations, tuple((f.name, str(f.type)) for f in shape))
        with self._lock:
            if (hit := self._entries.get(cache_key)) is not None:
                self._entries.move_to_end(cache_key)
                return hit

        # Each generation is a small Lance dataset: read them in parallel.
        levels = read_generations(
            snapshot.dataset.uri,
            generations,
            shape,
            storage_options=snapshot.storage_options,
            session=snapshot.session,
            map=_readers().map,
        )
        resolved = newest_per_key(levels, shape, snapshot.primary_key).combine_chunks()
        if resolved.nbytes > self._max_bytes:
            return resolved  # not kept: it would evict every other entry and then itself
        with self._lock:
            self._entries[cache_key] = resolved
            while self._entries and (
                len(self._entries) > self._capacity or sum(t.nbytes for t in self._entries.values()) > self._max_bytes
            ):
                self._entries.popitem(last=False)
        return resolved


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


def lookup(
    snapshot: ReadSnapshot, keys: pa.Table, buckets: np.ndarray, columns: list[str], filters: GenerationFilters
) -> pa.Table:
    """The merged-view row of each key in ``keys`` (absent keys are skipped).

    ``buckets`` holds each key's bucket; ``snapshot`` must cover those shards.
    A key's lookup plans over its own shard only, and only over the pending
    generations that ``filters`` says may hold it. Single-column keys that no
    pending generation may hold are read from the base in one indexed query
    (Lance's BTREE on the key), the cost of Lance's own point lookup. With
    ``storage_options`` the generations are searched here instead of by
    Lance's planner, which (pylance 14.0.2) opens them without the table's
    storage options.
    """
    key = list(snapshot.primary_key)
    wanted = columns + [k for k in key if k not in columns]
    shards = {s.bucket: s for s in snapshot.shards}
    planners = _Planners(snapshot)
    found, base_only = [], []
    for i in np.flatnonzero(~key_mask(keys, snapshot.tail, key)):
        one_key = keys.slice(int(i), 1)
        shard = shards[int(buckets[i])]
        generations = filters.candidates(shard, [one_key[k][0].as_py() for k in key])
        if not generations and len(key) == 1:
            base_only.append(int(i))
            continue
        if snapshot.storage_options:
            found.append(_lookup_without_planner(snapshot, shard.shard_id, generations, one_key, wanted))
        else:
            plan = planners.get(shard, generations).plan_lookup(_lookup_value(one_key), wanted)
            found.append(without_internal_columns(plan.to_table()))
    if base_only:
        values = keys.column(key[0]).take(base_only)
        found.append(snapshot.dataset.to_table(columns=wanted, filter=pc.field(key[0]).isin(values)))
    live_tail = live_rows(key_join(snapshot.tail, keys, key, "left semi"))
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
        self._planners: dict[tuple[str, tuple[tuple[int, str], ...]], LsmPointLookupPlanner] = {}

    def get(self, shard: ShardState, generations: tuple[tuple[int, str], ...]) -> LsmPointLookupPlanner:
        cache_key = (shard.shard_id, generations)
        if cache_key not in self._planners:
            self._planners[cache_key] = LsmPointLookupPlanner(
                self._snapshot.dataset, [_shard_snapshot(shard, generations)], list(self._snapshot.primary_key)
            )
        return self._planners[cache_key]


def key_join(left: pa.Table, right: pa.Table, key: list[str], join_type: str) -> pa.Table:
    """Rows of ``left`` whose key is (``"left semi"``) or is not (``"left anti"``) in ``right``.

    Keeps ``left``'s row order.
    """
    if left.num_rows == 0 or right.num_rows == 0:
        return left if join_type == "left anti" else left.slice(0, 0)
    in_right = _key_membership(left, right, key)
    return left.filter(in_right if join_type == "left semi" else pc.invert(in_right))


def key_mask(left: pa.Table, right: pa.Table, key: list[str]) -> np.ndarray:
    """For each row of ``left``, whether its key occurs in ``right`` (a boolean array)."""
    if not (left.num_rows and right.num_rows):
        return np.zeros(left.num_rows, dtype=bool)
    mask: np.ndarray = _key_membership(left, right, key).to_numpy(zero_copy_only=False)
    return mask


def _key_membership(left: pa.Table, right: pa.Table, key: list[str]) -> pa.ChunkedArray | pa.Array:
    """For each row of ``left``, whether its key occurs in ``right``; both non-empty.

    A single-column key is a hash-set membership test; a composite key goes
    through Acero's join, on the key columns only (the join refuses payload
    columns such as fixed-size-list vectors).
    """
    if len(key) == 1:
        return pc.is_in(left[key[0]], value_set=right[key[0]].combine_chunks())
    mask = np.zeros(left.num_rows, dtype=bool)
    numbered = left.select(key).append_column(_ROW, pa.array(np.arange(left.num_rows, dtype=np.int64)))
    mask[numbered.join(right.select(key), keys=key, join_type="left semi", use_threads=False)[_ROW].to_numpy()] = True
    return pa.array(mask)


def _filter_sql(table: pa.Table, filter: str) -> pa.Table:
    """Apply a Lance SQL filter to an in-memory table.

    The tail is small (bounded by the unflushed WAL); evaluating the filter with
    Lance itself keeps its SQL dialect identical for every level.
    """
    with tempfile.TemporaryDirectory(prefix="lsm-tail-") as tmp:
        return lance.write_dataset(table, tmp).to_table(filter=filter)


def _lookup_without_planner(
    snapshot: ReadSnapshot,
    shard_id: str,
    generations: tuple[tuple[int, str], ...],
    one_key: pa.Table,
    wanted: list[str],
) -> pa.Table:
    """``one_key``'s row from the newest of ``generations`` that holds it (none if deleted there), else the base.

    Each generation holds at most one live row per key (a flush hides older
    versions), so the newest generation with the key decides.
    """
    where = reduce(operator.and_, [pc.field(k) == one_key[k][0] for k in one_key.column_names])
    for _, directory in reversed(generations):
        generation = open_generation(snapshot.dataset.uri, shard_id, directory, snapshot.storage_options)
        shape = pa.schema(
            [*(snapshot.dataset.schema.field(c) for c in wanted), snapshot.tail.schema.field(TOMBSTONE_COLUMN)]
        )
        rows = generation_rows(generation, shape, filter=where)
        if rows.num_rows:
            return live_rows(rows.slice(rows.num_rows - 1))
    return snapshot.dataset.to_table(columns=wanted, filter=where)


def _lookup_value(one_key: pa.Table) -> pa.Array:
    """The planner's key form: a 1-element array, or a 1-row struct for composite keys."""
    if one_key.num_columns == 1:
        return one_key.column(0).combine_chunks()
    return pa.StructArray.from_arrays([c.combine_chunks() for c in one_key.columns], names=one_key.column_names)
