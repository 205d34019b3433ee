"""The merged view: base table + pending generations + WAL tail, newest wins.

Levels, oldest to newest::

    base table  <  generations above each shard's compacted marker  <  WAL tail

Each shard's pending generations are usually resolved already: a stored
*pending run* (:mod:`resources.lsm.read.pending_run`) holds the newest change
per key over them and a deletion vector of the base rows those keys
supersede. A full scan (:func:`scan`) starts the base scan, then pins the
levels; each base batch loses the rows the vectors list, by position, as the
consumer takes it (Lance decodes the next batches meanwhile, on its own
threads), and the pending upserts come last. Keys no vector covers
(generations newer than a run, a missing run, keys whose row a rewrite of the
base moved, the WAL tail) are dropped from the base by key instead. Generations read
directly are kept between reads (:class:`PendingGenerations`): they never
change once flushed. Lance's ``LsmScanner`` would do the same in one plan, but
with pylance 14.0.2 it costs a pass over the whole base per pending generation.

A point lookup (:func:`lookup`) answers each key from the newest level that
holds it: the WAL tail, generations newer than the shard's run (only those
whose bloom filter may hold the key), the run, and finally the base, all
remaining keys at once: through the fragments' key indexes, or one indexed
Lance query.

The base is trusted to hold each key once (only merge-into-base writes it):
a base broken from outside shows its duplicates in the merged view, where
the primary-key checks catch them.
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.mem_wal import ShardSnapshot

from ..format.schema import ROW_ADDRESS, ROW_ID, TOMBSTONE_COLUMN, live_rows
from ..format.shard_state import ShardState
from ..format.storage import TableStorage
from ..lru_cache import LruCache
from .base_key_index import BaseKeyIndex
from .deletion_vector import DeletionVector, RowsFoundAhead, SupersededRows, count_base_rows, fragment_ids
from .filter_text import keys_filter
from .generation_keys import generation_key_index
from .generations import generation_rows, newest_per_key, open_generation, read_generations
from .key_sets import anti_join_stream, joinable, key_join, key_mask, laid_over, rows_of_keys, same_keys, spans
from .key_spread import key_spread, unique_integer_column
from .level_readers import level_readers
from .pending_run import PendingRun, PendingRuns, followed
from .pk_bloom import GenerationFilters
from .stored_hash_rows import StoredHashRows

BASE_BATCH_ROWS = 65_536
"""Rows per base batch in a full scan: fewer, larger batches scan faster than Lance's default (8k)."""
_MIN_BASE_BATCHES = 16
"""Batches a scan of a small base is cut into at least (down to 8k rows each): a base read in a few large
batches decodes them with little overlap (300k rows of strings: 16k-row batches 17% faster than 64k)."""


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
    storage: TableStorage
    """The table's files: where its generations are opened."""
    session: lance.Session | None = None
    """Lance session to open generations through (their metadata is cached there)."""
    pending_cache: PendingGenerations | None = None
    """Where resolved pending generations are kept between reads (``None``: read them every time)."""
    runs: PendingRuns | None = None
    """Where the shards' stored pending runs are found (``None``: read every pending generation)."""

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
    above it (a :class:`ReadSnapshot` of ``dataset``) and runs once the base
    scan started. The filter applies to each key's newest version only: a
    base row is dropped whenever its key has a pending change, matching or not.

    Memory is bounded by the pending levels (the change, resolved to one row
    per key) plus the batches Lance reads ahead: base batches stream through,
    each filtered as the consumer takes it while Lance decodes the next ones
    on its own threads, base rows first and the pending upserts last. Closing
    (or dropping) the reader stops the scan.
    """
    key = list(primary_key)
    wanted = columns + [k for k in key if k not in columns]
    batch_rows = min(BASE_BATCH_ROWS, max(8192, dataset.count_rows() // _MIN_BASE_BATCHES))
    base = base_batches(dataset, wanted, filter, batch_size=batch_rows)
    try:
        snapshot = pin_levels()
        # The filter may name columns the caller did not ask for: read them all then.
        levels = resolve_levels(snapshot, dataset.schema.names if filter else wanted)
        superseded = BaseRowFilter(snapshot.storage, dataset, [levels], key, base.schema)
    except BaseException:
        base.close()
        raise
    live = live_rows(levels.changes)
    if filter:
        live = _filter_sql(live, filter)
    schema = pa.schema([dataset.schema.field(c) for c in columns])
    older = (batch.select(columns) for batch in superseded.stream(base))
    newest = live.select(columns).cast(schema).to_batches()
    return pa.RecordBatchReader.from_batches(schema, (b for b in itertools.chain(older, newest) if b.num_rows))


def base_batches(
    dataset: lance.LanceDataset,
    columns: list[str],
    filter: str | pc.Expression | None,
    fragments: list[lance.LanceFragment] | None = None,
    batch_size: int | None = None,
) -> pa.RecordBatchReader:
    """The base rows a :class:`BaseRowFilter` takes: ``columns`` and ``_rowaddr``; unfiltered, ``_rowid`` too.

    Without a filter, deleted rows are read too (their ``_rowid`` null) and
    dropped by :class:`BaseRowFilter` with the pending levels' rows, by
    position: pylance 14.0.2 applies a fragment's deletion file at a cost far
    above reading every row, and every merge leaves deletion files behind
    (64Mi rows, 1% / 10% / 30% of every fragment deleted: a scan that drops
    them itself takes 0.79-0.91x / 0.41-0.54x / 0.35-0.36x the wall time of
    Lance's scan, ``benchmarks/deleted_rows.py``). A filtered scan cannot
    return them (Lance refuses deleted rows where a plan takes rows): Lance
    drops them there.
    """
    unfiltered = filter is None
    return dataset.scanner(
        columns=columns,
        filter=filter,
        fragments=fragments,
        batch_size=batch_size,
        with_row_address=True,
        with_row_id=unfiltered,
        include_deleted_rows=unfiltered,
    ).to_reader()


class BaseRowFilter:
    """Drops superseded rows from base batches read with row addresses: by position, then by key.

    The rows of keys a run covers are dropped by position, through its
    deletion vector. The keys no vector covers (generations newer than their
    run, missing runs, rows a rewrite moved, the WAL tail) are tested on each
    batch through a bitmap when they are one integer column of bounded span
    (one lookup per row), or hold one the base holds nearly unique (the rows
    it finds have their other key columns compared: :class:`_KeyBitmap`).
    Any other keys are found ahead of the scan through
    the base's key index and dropped by position (their keys compared) when
    they are few enough for the search to cost less than a join
    (:meth:`~resources.lsm.read.base_key_index.BaseKeyIndex.searched_faster_than_scanned`),
    else dropped by one streaming hash anti-join (:func:`~resources.lsm.read.key_sets.anti_join_stream`): its
    key set is built once for the whole scan, where testing batch by batch
    would build it again for every batch, a cost that follows the base.
    Arrow's join cannot carry nested columns (vectors, lists): for batches
    with such columns the rows of those keys are found ahead of the scan and
    dropped by position too, through the fragments' stored key hashes when
    every fragment read has them
    (:class:`~resources.lsm.read.stored_hash_rows.StoredHashRows`), else by
    reading the base's key columns
    (:class:`~resources.lsm.read.deletion_vector.SupersededRows`).

    ``schema`` is the batches' (:func:`base_batches`: with ``_rowaddr``, and
    ``_rowid``, null for a deleted row, which is dropped too); ``fragments``
    are the base fragments they come from (default: all of ``dataset``'s,
    stored in ``storage``).
    """

    def __init__(
        self,
        storage: TableStorage,
        dataset: lance.LanceDataset,
        levels: Sequence[PendingLevels],
        key: list[str],
        schema: pa.Schema,
        fragments: list[lance.LanceFragment] | None = None,
    ) -> None:
        joined = pa.concat_tables([level.joined_keys for level in levels]).combine_chunks()
        self._vector = DeletionVector.union([level.superseded for level in levels])
        self._schema = pa.schema([field for field in schema if field.name not in (ROW_ADDRESS, ROW_ID)])
        self._key = key
        # A composite key's unique column costs a sample of the base once per process: only for keys to drop.
        unique = unique_integer_column(dataset, key) if joined.num_rows else None
        self._bitmap = _KeyBitmap.of(joined, key, unique)
        by_key = self._bitmap is None and joined.num_rows > 0
        self._rows = self._found_ahead(storage, dataset, joined, key, fragments) if by_key else None
        self._joined = joined if by_key and self._rows is None else None
        self._doomed_key = {name: self._joined.column(name)[0] for name in key} if self._joined is not None else {}
        """A key the join drops: rows the vector drops are given it, so that they go with the join."""

    def _found_ahead(
        self,
        storage: TableStorage,
        dataset: lance.LanceDataset,
        keys: pa.Table,
        key: list[str],
        fragments: list[lance.LanceFragment] | None,
    ) -> RowsFoundAhead | None:
        """The rows of ``keys`` found ahead of the scan, or ``None`` where joining them is the cheaper way."""
        index = BaseKeyIndex.of(storage, dataset)
        if index is not None and index.searched_faster_than_scanned(keys.num_rows):
            return StoredHashRows.indexed(index, keys, key, dataset.get_fragments() if fragments is None else fragments)
        if joinable(self._schema):
            return None
        hashed = StoredHashRows.of(storage, dataset, keys, key, fragments)
        return hashed if hashed is not None else SupersededRows(dataset, keys, key, fragments)

    def stream(self, batches: pa.RecordBatchReader) -> Iterator[pa.RecordBatch]:
        """The surviving rows of every batch (without ``_rowaddr``); in scan order unless keys are joined."""
        if self._joined is None:
            return (self._drop_by_position(batch) for batch in batches)
        marked = (self._mark_by_position(batch) for batch in batches)
        return anti_join_stream(pa.RecordBatchReader.from_batches(self._schema, marked), self._joined)

    def _mark_by_position(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` with the rows the vector drops given a key the join drops (any of its keys is).

        Only the key columns are copied: filtering every column here copied
        each surviving row twice, once more in the join.
        """
        addresses, live = _live_rows(batch)
        keep = _at_rows(self._vector.keep_mask(addresses), live, batch.num_rows)
        batch = _without_row_columns(batch)
        if keep.all():
            return batch
        selection = pa.array(keep)
        columns = [
            pc.if_else(selection, column, self._doomed_key[name]) if name in self._doomed_key else column
            for name, column in zip(batch.schema.names, batch.columns, strict=True)
        ]
        return pa.RecordBatch.from_arrays(columns, schema=batch.schema)

    def _drop_by_position(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        addresses, live = _live_rows(batch)
        keep = self._vector.keep_mask(addresses)
        if self._rows is not None:
            keep &= self._rows.keep_mask(addresses, batch, live)
        keep = _at_rows(keep, live, batch.num_rows)
        batch = _without_row_columns(batch)
        if self._bitmap is not None:
            keep &= ~self._bitmap.found(batch)
        return batch if keep.all() else rows_where(batch, keep)


def _live_rows(batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray | None]:
    """The addresses of ``batch``'s live rows, ascending, and their positions (``None``: every row is live).

    A scan that reads deleted rows (:func:`base_batches`) returns them with a
    null ``_rowid`` (and ``_rowaddr``): they have no address to test.
    """
    marks = [batch.column(c) for c in (ROW_ADDRESS, ROW_ID) if c in batch.schema.names and batch.column(c).null_count]
    addresses = batch.column(ROW_ADDRESS)
    if not marks:
        every: np.ndarray = addresses.to_numpy()
        return every, None
    live = np.flatnonzero(np.logical_and.reduce([_valid(column) for column in marks]))
    return _values(addresses)[live], live


def _valid(column: pa.Array) -> np.ndarray:
    """Whether each value of ``column`` (which has nulls) is set, read off its validity bitmap.

    A sixth of ``is_valid().to_numpy()``'s cost, which a scan beside a
    writer pays on every batch (most hold deleted rows).
    """
    bits = np.unpackbits(np.frombuffer(column.buffers()[0], dtype=np.uint8), bitorder="little")
    valid: np.ndarray = bits[column.offset : column.offset + len(column)].view(bool)
    return valid


def _values(addresses: pa.Array) -> np.ndarray:
    """The ``uint64`` values of ``addresses``, those under nulls included (taken only at live rows)."""
    values: np.ndarray = np.frombuffer(addresses.buffers()[1], dtype=np.uint64)
    return values[addresses.offset : addresses.offset + len(addresses)]


def _at_rows(keep: np.ndarray, live: np.ndarray | None, rows: int) -> np.ndarray:
    """``keep`` (one flag per live row) as one flag per row of the batch: a deleted row is never kept."""
    if live is None:
        return keep
    every = np.zeros(rows, dtype=bool)
    every[live] = keep
    return every


def _without_row_columns(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.drop_columns([name for name in (ROW_ADDRESS, ROW_ID) if name in batch.schema.names])


class _KeyBitmap:
    """An integer key column's pending values as a bitmap over their range: a batch costs one array lookup per row.

    Sequence ids, the usual integer keys, span a bounded range. A composite
    key is tested on such a column when the base holds it nearly unique (an
    id beside a region, say: ``unique``); the few rows it finds have their
    other key columns compared with those of the pending keys of the same
    value, where a join would hash every base row's whole key.
    """

    _MAX_SPAN = 1 << 28
    """Widest value range given a bitmap (32 MiB of bits; 8 MiB for 64Mi dense ids)."""

    @classmethod
    def of(cls, keys: pa.Table, key: list[str], unique: str | None = None) -> _KeyBitmap | None:
        """The bitmap of ``keys`` on their integer key column (``unique``, the base's nearly unique one, for a
        composite key), if it has no null and a bounded span (and they are not empty)."""
        column = key[0] if len(key) == 1 else unique
        if column is None or not pa.types.is_integer(keys.schema.field(column).type):
            return None
        if not keys.num_rows or keys.column(column).null_count:
            return None
        values = keys.column(column)
        low, high = pc.min(values).as_py(), pc.max(values).as_py()
        if high - low >= cls._MAX_SPAN:
            return None
        others = keys.select([c for c in key if c != column]).combine_chunks() if len(key) > 1 else None
        return cls(column, _wide(values.to_numpy()), low, high, others)

    def __init__(self, column: str, values: np.ndarray, low: int, high: int, others: pa.Table | None) -> None:
        present = np.zeros(high - low + 1, dtype=bool)
        present[values - low] = True
        self._column, self._low, self._span = column, low, len(present)
        self._bits = np.packbits(present, bitorder="little")
        self._others = others
        """The composite keys' other columns, in the order of ``values``; ``None`` for a one-column key."""
        self._order = self._sorted = np.empty(0, dtype=np.int64)
        if others is not None:  # the pending values sorted, to pair a row with the keys of its value
            self._order = np.argsort(values, kind="stable")
            self._sorted = values[self._order]

    def found(self, batch: pa.RecordBatch) -> np.ndarray:
        """For each row of ``batch``, whether its key is one of the keys (a null key never is)."""
        column = batch.column(self._column)
        values = _wide((pc.fill_null(column, self._low) if column.null_count else column).to_numpy())
        # Unsigned, a value below the range wraps around far above it: one comparison bounds both sides.
        offsets = (values - self._low).astype(np.uint64, copy=False)
        in_range = offsets < self._span
        if column.null_count:
            in_range &= column.is_valid().to_numpy(zero_copy_only=False)
        at = np.minimum(offsets, self._span - 1)  # any bit will do outside the range: in_range masks it
        bits = np.take(self._bits, at >> 3) >> (at & 7).astype(np.uint8)
        bits &= 1
        found: np.ndarray = bits.view(bool) & in_range
        if self._others is None or not found.any():
            return found
        return self._whole_keys_found(batch, values, np.flatnonzero(found))

    def _whole_keys_found(self, batch: pa.RecordBatch, values: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Of ``batch``'s ``rows``, whose integer column holds a pending value, those whose whole key is pending."""
        assert self._others is not None
        first = np.searchsorted(self._sorted, values[rows])
        counts = np.searchsorted(self._sorted, values[rows], side="right") - first
        # Each row paired with every pending key of its value (one, unless the column repeats across keys).
        paired, pending = np.repeat(rows, counts), self._order[spans(first, counts)]
        others = self._others.column_names
        equal = same_keys(batch.select(others).take(pa.array(paired)), self._others.take(pa.array(pending)), others)
        found = np.zeros(batch.num_rows, dtype=bool)
        found[paired[equal]] = True
        return found


def _wide(values: np.ndarray) -> np.ndarray:
    """64-bit integers: an 8, 16 or 32-bit difference from the lowest key would wrap around inside the range."""
    return values if values.dtype.itemsize == 8 else values.astype(np.int64)


def count(snapshot: ReadSnapshot) -> int:
    """The number of live keys in the snapshot's merged view, from the base's row count and the pending changes.

    Each pending key either supersedes its base row or is new, so the view
    holds the base's rows, less those superseded, plus the live pending
    upserts. A run's deletion vector counts the rows its keys
    supersede; the base rows of the other pending keys (those the vector
    does not hold already) are counted through the key index, or one
    streaming join over the key columns when the keys are many
    (:func:`~resources.lsm.read.deletion_vector.count_base_rows`).
    The count is the scan's, row for row, even for a base broken from outside
    (a key held twice). The cost follows the change, not the base.
    """
    key = list(snapshot.primary_key)
    levels = resolve_levels(snapshot, key)
    vector = levels.superseded
    joined = levels.joined_keys.num_rows
    index = BaseKeyIndex.of(snapshot.storage, snapshot.dataset, partial=True) if joined else None
    found = count_base_rows(snapshot.dataset, levels.joined_keys, key, besides=vector, index=index)
    superseded = len(vector.addresses) + found
    live: int = live_rows(levels.changes).num_rows
    return int(snapshot.dataset.count_rows()) - superseded + live


def rows_where(batch: pa.RecordBatch, mask: np.ndarray) -> pa.RecordBatch:
    """The rows of ``batch`` where ``mask`` is True, in order.

    Filters column by column: with pyarrow 26, ``RecordBatch.filter`` takes
    about twice as long for the same result (``benchmarks/read_keys.py``).
    """
    selection = pa.array(mask)
    return pa.RecordBatch.from_arrays([column.filter(selection) for column in batch.columns], schema=batch.schema)


@dataclass(frozen=True)
class PendingLevels:
    """The levels above the base, resolved for one read."""

    changes: pa.Table
    """The newest pending change of every key, with ``_tombstone``."""
    superseded: DeletionVector
    """Base rows superseded by ``changes``, by position (the runs' deletion vectors, as the pinned base holds them)."""
    joined_keys: pa.Table
    """Keys of ``changes`` no vector covers: their base rows are dropped by key."""


def resolve_levels(snapshot: ReadSnapshot, columns: list[str]) -> PendingLevels:
    """Resolve the snapshot's pending generations and WAL tail; ``columns`` must include the key.

    Each shard contributes its stored run (if one covers a prefix of its
    pending generations) and the generations after it; the WAL tail comes
    last. A run's vector holds where the pinned base still has the fragment
    each row is in (a rewrite moves only the rows of the fragments it
    replaces: :meth:`~resources.lsm.read.pending_run.PendingRun.held_in`);
    the keys whose row it holds are never joined, even when a newer level
    changed them again: beside a writer that keeps changing the same keys, a
    scan joins only the keys no run has seen yet, and those whose row moved.
    """
    key = list(snapshot.primary_key)
    shape = pa.schema([snapshot.tail.schema.field(c) for c in [*columns, TOMBSTONE_COLUMN]])
    runs = [run for run in _usable_runs(snapshot, columns) if run is not None]
    covered = {run.shard_id: len(run.generations) for run in runs}
    direct = tuple(
        (s.shard_id, d) for s in snapshot.shards for _, d in s.pending_generations[covered.get(s.shard_id, 0) :]
    )
    cache = snapshot.pending_cache or PendingGenerations(capacity=0)
    newer = cache.resolved(snapshot, direct, shape)
    if snapshot.tail.num_rows:  # each level holds a key once: laying one over the other is cheaper than a group-by
        newer = laid_over(newer, snapshot.tail.select(shape.names), key)
    held = _held_in_base(snapshot, runs)
    from_runs = pa.concat_tables([shape.empty_table()] + [run.changes.select(shape.names).cast(shape) for run in held])
    changed = key_mask(from_runs, newer, key)  # run rows a newer level changes again
    changes = pa.concat_tables([from_runs.filter(pa.array(~changed)), newer])
    # The vectors drop the base row of every key with one (null: not looked up by a run of an older version, or
    # moved by a rewrite): those keys need no join, even when a newer level changed them again.
    known = np.concatenate(
        [np.ones(0, dtype=bool)] + [run.base_rows.is_valid().to_numpy(zero_copy_only=False) for run in held]
    )
    covered = from_runs.select(key).filter(pa.array(changed & known))
    unknown = from_runs.select(key).filter(pa.array(~changed & ~known))
    joined = pa.concat_tables([key_join(newer.select(key), covered, key, "left anti"), unknown])
    return PendingLevels(changes, DeletionVector.union([run.superseded for run in held]), joined.combine_chunks())


def _usable_runs(snapshot: ReadSnapshot, columns: list[str]) -> list[PendingRun | None]:
    """Each shard's stored run, if there is one with every column the read needs."""
    if snapshot.runs is None:
        return []
    runs = snapshot.runs.find_each([shard for shard in snapshot.shards if shard.pending_generations])
    return [_with_columns(run, columns) for run in runs]


def _usable_run(snapshot: ReadSnapshot, shard: ShardState, columns: list[str]) -> PendingRun | None:
    """The stored run a lookup of the shard reads, if there is one with every column the read needs."""
    if snapshot.runs is None or not shard.pending_generations:
        return None
    return _with_columns(snapshot.runs.for_lookups(shard, list(snapshot.primary_key)), columns)


def _with_columns(run: PendingRun | None, columns: list[str]) -> PendingRun | None:
    return run if run is not None and set(columns) <= set(run.changes.column_names) else None


def _held_in_base(snapshot: ReadSnapshot, runs: list[PendingRun]) -> list[PendingRun]:
    """``runs`` as the pinned base sees them: the rows a recorded rewrite (a tidy-up) moved followed to their
    new address, a read of the row addresses of the fragments they left rather than a join of their keys.

    The cached run keeps what it was followed into for the next read of the
    same base; one with rows that could not be followed is forgotten by the
    cache instead (rebuilt by the next build of runs, which looks up only
    the keys whose row moved)."""
    present = fragment_ids(snapshot.dataset) if runs else set()
    held = [followed(run, snapshot.storage, snapshot.dataset, present) for run in runs]
    for run, seen in zip(runs, held, strict=True):
        if seen.base_rows.null_count > run.base_rows.null_count and snapshot.runs is not None:
            snapshot.runs.forget(run)
    return held


# A PendingGenerations entry: table location, (shard id, directory) generations, the shape's (name, type) columns.
_PendingKey = tuple[str, tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]


class PendingGenerations:
    """The newest change per key over tables' pending generations, kept between reads.

    A flushed generation never changes, so what one set of pending generations
    resolves to stays true until a flush adds a generation or a merge removes
    some, which changes the set (the cache key, with the table's location)
    itself. At most ``capacity`` of these results (different tables, sets or
    projections) and ``max_bytes`` of Arrow data are kept, the least recently
    used dropped first; a result larger than ``max_bytes`` is not kept (wide
    vector columns). Safe to share between threads and tables
    (:data:`SHARED_PENDING_GENERATIONS`).
    """

    def __init__(self, capacity: int = 64, max_bytes: int = 1 << 30) -> None:
        self._entries: LruCache[_PendingKey, pa.Table] = LruCache(capacity, max_bytes, size_of=lambda t: t.nbytes)

    def resolved(self, snapshot: ReadSnapshot, generations: tuple[tuple[str, str], ...], shape: pa.Schema) -> pa.Table:
        """Newest change per key over ``(shard id, directory)`` generations of the snapshot, as ``shape``."""
        if not generations:
            return shape.empty_table()

        def resolve() -> pa.Table:
            # Each generation is a small Lance dataset: read them in parallel.
            levels = read_generations(
                snapshot.storage, generations, shape, session=snapshot.session, map=level_readers().map
            )
            return newest_per_key(levels, shape, snapshot.primary_key).combine_chunks()

        cache_key = (snapshot.storage.location, generations, tuple((f.name, str(f.type)) for f in shape))
        return self._entries.get(cache_key, resolve)


SHARED_PENDING_GENERATIONS = PendingGenerations()
"""The process's resolved pending generations, shared by every table opened in it.

A reader opened anew (every Dagster step opens its tables) then starts with
the generations an earlier reader of the same table resolved: on a 300k-row
table with 4 generations per shard, reading them is most of a new reader's
first scan."""


def lookup(
    snapshot: ReadSnapshot, keys: pa.Table, buckets: np.ndarray, columns: list[str], filters: GenerationFilters
) -> pa.Table:
    """The merged-view row of each key in ``keys`` (absent keys are skipped).

    ``buckets`` holds each key's bucket; ``snapshot`` must cover those shards.
    Each key is answered by the newest level that holds it: the WAL tail,
    then its shard's generations newer than the shard's run (only those that
    ``filters`` says may hold it), the run, and the base, where all remaining
    keys are read in one query (through the BTREE on each key column: the
    cost of Lance's own point lookup).
    """
    key = list(snapshot.primary_key)
    wanted = columns + [k for k in key if k not in columns]
    shape = pa.schema([snapshot.tail.schema.field(c) for c in [*wanted, TOMBSTONE_COLUMN]])
    in_tail = key_mask(keys, snapshot.tail, key)
    answered = [key_join(snapshot.tail, keys, key, "left semi").select(shape.names)] if in_tail.any() else []
    to_base = []
    shards = {s.bucket: s for s in snapshot.shards}
    for bucket in np.unique(buckets[~in_tail]):
        shard = shards[int(bucket)]
        todo = keys.filter(pa.array((buckets == bucket) & ~in_tail)) if len(keys) > 1 else keys
        run = _usable_run(snapshot, shard, wanted)
        for level in _levels_above_base(snapshot, shard, run, todo, shape, filters):
            found = key_join(level, todo, key, "left semi")
            if found.num_rows:
                answered.append(found)
                todo = key_join(todo, found, key, "left anti")
        to_base.append(todo)
    found = _base_rows(snapshot.storage, snapshot.dataset, pa.concat_tables([keys.slice(0, 0), *to_base]), key, wanted)
    if answered:
        newest = live_rows(pa.concat_tables([t.cast(shape) for t in answered]))
        found = pa.concat_tables([found.cast(newest.schema), newest])
    return _in_key_order(found, keys, key).select(columns)


def _in_key_order(rows: pa.Table, keys: pa.Table, key: list[str]) -> pa.Table:
    """``rows`` (one per key, each key in ``keys``) in the order of ``keys``."""
    if rows.num_rows < 2:
        return rows
    return rows.take(rows_of_keys(keys, rows, key).drop_null())


def _levels_above_base(
    snapshot: ReadSnapshot,
    shard: ShardState,
    run: PendingRun | None,
    keys: pa.Table,
    shape: pa.Schema,
    filters: GenerationFilters,
) -> Iterator[pa.Table]:
    """The shard's pending changes that may answer ``keys``, newest level first (as ``shape``)."""
    newer = run.extra_generations(shard) if run else shard.pending_generations
    if newer:
        yield _newest_in_generations(snapshot, shard.shard_id, newer, keys, shape, filters)
    if run is not None:
        yield _run_rows(run, keys, list(snapshot.primary_key), shape)


def _run_rows(run: PendingRun, keys: pa.Table, key: list[str], shape: pa.Schema) -> pa.Table:
    """The changes of ``keys`` in ``run`` (as ``shape``): a scan of its keys, or its key index once it has one."""
    index = run.key_index(key)
    if index is None:
        rows = key_join(run.changes, keys, key, "left semi")
    else:
        positions = index.rows(keys)
        if not len(positions):
            return shape.empty_table()  # the usual answer: most keys have no pending change
        rows = run.changes.take(positions)
    return rows.select(shape.names).cast(shape)


def _newest_in_generations(
    snapshot: ReadSnapshot,
    shard_id: str,
    generations: tuple[tuple[int, str], ...],
    keys: pa.Table,
    shape: pa.Schema,
    filters: GenerationFilters,
) -> pa.Table:
    """The newest change (with ``_tombstone``) of each of ``keys`` over ``generations`` of one shard.

    Only generations whose bloom filter may hold one of the keys are opened,
    each asked for those keys only (a composite key on the column the base
    finds most selective, as for the base query); a generation lookups keep
    opening is first asked its key index
    (:mod:`~resources.lsm.read.generation_keys`).
    """
    key = list(snapshot.primary_key)
    if not generations or not keys.num_rows:
        return shape.empty_table()
    rows = list(zip(*(keys.column(k).to_pylist() for k in key), strict=True))
    asked = filters.candidate_keys(shard_id, generations, rows)
    opened = sorted(g for g in asked if asked[g].size)
    if not opened:
        return shape.empty_table()  # the usual answer: no filter may hold the keys
    levels = []
    # The base's spread: a generation's key columns spread as the base's do (one key ties every column).
    spread = key_spread(snapshot.dataset, key)
    for generation in opened:
        wanted_keys = keys.take(pa.array(asked[generation]))
        opener = partial(open_generation, snapshot.storage, shard_id, generation[1], snapshot.session)
        index = generation_key_index(snapshot.storage, shard_id, generation[1], key, opener)
        if index is not None and not len(index.rows(wanted_keys)):
            continue  # the filter's "maybe" was false
        found = generation_rows(opener(), shape, filter=keys_filter(wanted_keys, key, spread))
        levels.append(key_join(found, wanted_keys, key, "left semi"))
    return newest_per_key(levels, shape, key)


def _base_rows(
    storage: TableStorage, dataset: lance.LanceDataset, keys: pa.Table, key: list[str], columns: list[str]
) -> pa.Table:
    """The base rows of ``keys``, projected to ``columns`` (which include the key), in no particular order.

    Through the fragments' key indexes where the base has them
    (:class:`~resources.lsm.read.base_key_index.BaseKeyIndex`), else Lance's
    query (of the fragments without one, when only some lack theirs).
    """
    if not keys.num_rows:
        return pa.schema([dataset.schema.field(c) for c in columns]).empty_table()
    # Naming every column costs Lance a projection plan; a single-column key's filter is exact.
    projection = None if columns == dataset.schema.names else columns
    index = BaseKeyIndex.of(storage, dataset, partial=True)
    if index is None:
        return _queried_rows(dataset, keys, key, projection)
    return index.rows(dataset, keys, key, projection, partial(_queried_rows, dataset, keys, key, projection))


def _queried_rows(
    dataset: lance.LanceDataset,
    keys: pa.Table,
    key: list[str],
    projection: list[str] | None,
    fragments: list[lance.LanceFragment] | None = None,
) -> pa.Table:
    """The base rows of ``keys`` (in ``fragments``, default all), through Lance's query."""
    filter = keys_filter(keys, key, key_spread(dataset, key))
    found = dataset.scanner(columns=projection, filter=filter, fragments=fragments).to_table()
    return found if len(key) == 1 else key_join(found, keys, key, "left semi")


def _filter_sql(table: pa.Table, filter: str) -> pa.Table:
    """Apply a Lance SQL filter to an in-memory table.

    The tail is small (bounded by the unflushed WAL); evaluating the filter with
    Lance itself keeps its SQL dialect identical for every level.
    """
    with tempfile.TemporaryDirectory(prefix="lsm-tail-") as tmp:
        return lance.write_dataset(table, tmp).to_table(filter=filter)
