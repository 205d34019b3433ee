"""Set operations on primary keys between Arrow tables (membership, semi and anti joins, row of each key)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc

from .key_hashes import NUMPY_HASHED_KEYS, key_hash, key_hashes

_ROW = "__lsm_row"
_FOUND = "__lsm_found_row"


def key_join(left: pa.Table, right: pa.Table, key: list[str], join_type: str) -> pa.Table:
    """Rows of ``left`` whose key is (``"left semi"``) or is not (``"left anti"``) in ``right``.

    Keeps ``left``'s row order.
    """
    if left.num_rows == 0 or right.num_rows == 0:
        return left if join_type == "left anti" else left.slice(0, 0)
    in_right = _key_membership(left, right, key)
    return left.filter(in_right if join_type == "left semi" else pc.invert(in_right))


def laid_over(older: pa.Table, newer: pa.Table, key: list[str]) -> pa.Table:
    """The newest change per key over ``older`` then ``newer``, each holding a key at most once.

    The rows of ``older`` whose key ``newer`` lacks, then ``newer``: what a
    last-per-key pass over both would keep, for one membership test of
    ``older``'s keys (400k rows under 200k: a third of the group-by's time,
    int64 or string keys).
    """
    return pa.concat_tables([key_join(older, newer, key, "left anti"), newer])


def key_mask(left: pa.Table, right: pa.Table, key: list[str]) -> np.ndarray:
    """For each row of ``left``, whether its key occurs in ``right`` (a boolean array)."""
    if not (left.num_rows and right.num_rows):
        return np.zeros(left.num_rows, dtype=bool)
    mask: np.ndarray = _key_membership(left, right, key).to_numpy(zero_copy_only=False)
    return mask


def _key_membership(left: pa.Table, right: pa.Table, key: list[str]) -> pa.ChunkedArray | pa.Array:
    """For each row of ``left``, whether its key occurs in ``right``; both non-empty.

    One key (a point lookup) is compared column by column: no row of
    ``left`` is hashed (500k int64 keys: 0.2 ms against 1.8 ms). Otherwise a
    single-column key is a hash-set membership test, and a composite key goes
    through Acero's join, on the key columns only (the join refuses payload
    columns such as fixed-size-list vectors).
    """
    if right.num_rows == 1 and not any(right.column(c).null_count for c in key):
        return _equals_the_key(left, right, key)
    if len(key) == 1:
        return pc.is_in(left[key[0]], value_set=right[key[0]].combine_chunks())
    mask = np.zeros(left.num_rows, dtype=bool)
    numbered = left.select(key).append_column(_ROW, pa.array(np.arange(left.num_rows, dtype=np.int64)))
    mask[numbered.join(right.select(key), keys=key, join_type="left semi", use_threads=False)[_ROW].to_numpy()] = True
    return pa.array(mask)


def _equals_the_key(left: pa.Table, right: pa.Table, key: list[str]) -> pa.ChunkedArray:
    """For each row of ``left``, whether its key is ``right``'s one (non-null) key (a null never is)."""
    matches = [pc.equal(left.column(c), right.column(c)[0]) for c in key]
    both = matches[0]
    for match in matches[1:]:
        both = pc.and_(both, match)
    return pc.fill_null(both, False)


def rows_of_keys(keys: pa.Table, found: pa.Table, key: list[str]) -> pa.Array:
    """For each row of ``keys``, the row of ``found`` holding its key (``int64``; null where ``found`` lacks it).

    ``found`` holds each key at most once. Acero builds its hash table on the
    right side, which is ``keys`` (the small side in every caller).
    """
    if not (keys.num_rows and found.num_rows):
        return pa.nulls(keys.num_rows, pa.int64())
    numbered = keys.select(key).append_column(_ROW, pa.array(np.arange(keys.num_rows, dtype=np.int64)))
    located = found.select(key).append_column(_FOUND, pa.array(np.arange(found.num_rows, dtype=np.int64)))
    joined = located.join(numbered, keys=key, join_type="inner", use_threads=False)
    positions = np.zeros(keys.num_rows, dtype=np.int64)
    present = np.zeros(keys.num_rows, dtype=bool)
    rows = joined.column(_ROW).to_numpy()
    positions[rows] = joined.column(_FOUND).to_numpy()
    present[rows] = True
    return pa.array(positions, pa.int64(), mask=~present)


class KeyIndex:
    """The row of each key of a table, for many lookups of a few keys each: built once, asked many times.

    A key of one integer column is sorted once and searched by bisection;
    any other key by its 64-bit hash (:mod:`~resources.lsm.read.key_hashes`),
    sorted the same way, and each hash found is confirmed by comparing the
    keys. Every step of a build but the smallest runs without Python's GIL,
    so an index built on a background thread never stalls the lookups of
    other threads for long (a Python dict of 500k composite keys held it
    for up to 140 ms). Built over 500k keys: 33 ms (int64), 85 ms (16-byte
    strings), 46 ms (a string and an integer); a key is then answered in
    about 10 µs.
    """

    def __init__(self, table: pa.Table, key: list[str]) -> None:
        self._key = key
        self.nbytes = self.size_of(table, key)
        """About what the index holds in memory."""
        column = table.column(key[0])
        self._by_value = len(key) == 1 and pa.types.is_integer(column.type)
        """Whether keys are searched by their value (one integer column) rather than by their hash."""
        self._keys = table.select(key)
        searched = column.to_numpy() if self._by_value else key_hashes(self._keys, key)
        self._order = np.argsort(searched)
        self._sorted = searched[self._order]

    @staticmethod
    def size_of(table: pa.Table, key: list[str]) -> int:
        """About what an index of ``table`` holds in memory: its keys, a sorted word and a row per key."""
        return int(table.select(key).nbytes + 16 * table.num_rows)

    def rows(self, keys: pa.Table, few: FewKeys | None = None) -> np.ndarray:
        """The rows holding ``keys`` (of the indexed table's key types): each once, ascending; absent keys left out.

        ``few``: the same keys as :class:`FewKeys`, for a caller asking many indexes for them.
        """
        if self._by_value:
            return np.unique(self._order[self._matches(keys.column(self._key[0]).to_numpy())])
        if keys.num_rows < NUMPY_HASHED_KEYS:
            return self._rows_of_few(few if few is not None else FewKeys(keys, self._key))
        hashes = key_hashes(keys, self._key)
        first = np.searchsorted(self._sorted, hashes)
        counts = np.searchsorted(self._sorted, hashes, side="right") - first
        # Pair each asked key with every held key of its hash (one, but for a collision or a key held twice).
        asked = np.repeat(np.arange(keys.num_rows), counts)
        held = self._order[spans(first, counts)]
        return np.unique(held[self._same_keys(keys.take(pa.array(asked)), held)])

    def _matches(self, values: np.ndarray) -> np.ndarray:
        """Where ``values`` sit in :attr:`_sorted`, for those it holds."""
        at = np.searchsorted(self._sorted, values)
        held = at < len(self._sorted)
        held[held] = self._sorted[at[held]] == values[held]
        found: np.ndarray = at[held]
        return found

    def _rows_of_few(self, few: FewKeys) -> np.ndarray:
        """:meth:`rows` of a few keys, hashed and compared as Python values (numpy's cost per call would dominate)."""
        found = []
        for asked, hashed in zip(few.values, few.hashes, strict=True):
            at = int(np.searchsorted(self._sorted, hashed))
            while at < len(self._sorted) and self._sorted[at] == hashed:
                row = int(self._order[at])
                if all(self._keys.column(c)[row].as_py() == v for c, v in zip(self._key, asked, strict=True)):
                    found.append(row)
                at += 1
        return np.array(sorted(set(found)), dtype=np.int64)

    def _same_keys(self, asked: pa.Table, held: np.ndarray) -> np.ndarray:
        """Whether each row of ``asked`` holds the same key as the indexed row paired with it in ``held``."""
        return same_keys(asked, self._keys.take(pa.array(held)), self._key)


class FewKeys:
    """A point lookup's few keys as Python values, and their hashes: computed once, however many indexes ask.

    A lookup asks each WAL entry of its shard's tail (a dozen beside a busy
    writer) for its keys; converting and hashing them took a fifth of each ask.
    """

    def __init__(self, keys: pa.Table, key: list[str]) -> None:
        self._keys, self._key = keys, key

    @cached_property
    def values(self) -> list[tuple[int | str, ...]]:
        """Each non-null key's column values (a null is no key)."""
        return [k for k in zip(*(self._keys.column(c).to_pylist() for c in self._key), strict=True) if None not in k]

    @cached_property
    def hashes(self) -> list[np.uint64]:
        """Each of :attr:`values`' hashes (:func:`~resources.lsm.read.key_hashes.key_hash`)."""
        return [np.uint64(key_hash(k)) for k in self.values]


def spans(first: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The positions ``first[i]``, ..., ``first[i] + counts[i] - 1`` of every ``i``, in order."""
    positions: np.ndarray = np.repeat(first - (np.cumsum(counts) - counts), counts) + np.arange(counts.sum())
    return positions


def same_keys(left: pa.Table | pa.RecordBatch, right: pa.Table | pa.RecordBatch, key: list[str]) -> np.ndarray:
    """Whether each row of ``left`` holds the key of the row of ``right`` at the same position (a null never)."""
    same = np.ones(left.num_rows, dtype=bool)
    for name in key:
        equal = pc.equal(left.column(name), right.column(name).cast(left.column(name).type))
        same &= pc.fill_null(equal, False).to_numpy(zero_copy_only=False)
    return same


def joinable(schema: pa.Schema) -> bool:
    """Whether Arrow's hash join can carry every column of ``schema`` (it refuses nested and dictionary columns)."""
    return not any(pa.types.is_nested(f.type) or pa.types.is_dictionary(f.type) for f in schema)


def anti_join_stream(batches: pa.RecordBatchReader, keys: pa.Table) -> Iterator[pa.RecordBatch]:
    """The rows of ``batches`` whose key (the columns of ``keys``) is not in ``keys``, streamed.

    One Acero hash join: the key set is built once, then every batch is
    probed as it arrives, on Acero's threads; output order is not kept,
    the schema is ``batches``'. ``batches`` must be :func:`joinable`.
    """
    return _join_stream(batches, keys, "left anti")


def semi_join_stream(batches: pa.RecordBatchReader, keys: pa.Table) -> Iterator[pa.RecordBatch]:
    """The rows of ``batches`` whose key is in ``keys``, streamed (as :func:`anti_join_stream`)."""
    return _join_stream(batches, keys, "left semi")


def value_of_each_key(
    batches: pa.RecordBatchReader, keys: pa.Table, column: str, on: list[str] | None = None
) -> pa.Array:
    """For each row of ``keys``, ``column`` of the row of ``batches`` holding its key (null where none does).

    One streaming Acero join built on ``keys``, numbered: memory holds the
    keys and what they find, never ``batches``, and no second join pairs
    the rows found with the keys. Each key is held by at most one row of
    ``batches``, which must be :func:`joinable` on the key columns. ``on``,
    some of the key columns, joins on those alone (an integer column
    ``batches`` hold nearly unique hashes faster than the whole key): the
    rows it pairs are kept where the other key columns are equal too.
    """
    on = on or keys.column_names
    others = [name for name in keys.column_names if name not in on]
    numbered = keys.select(on).append_column(_ROW, pa.array(np.arange(keys.num_rows, dtype=np.int64)))
    options = acero.HashJoinNodeOptions(
        "inner", left_keys=on, right_keys=on, left_output=[column, *others], right_output=[_ROW]
    )
    found = _hash_join(batches, numbered, options).to_table()
    rows = found.column(_ROW).to_numpy()
    if others:
        same = same_keys(found.select(others), keys.select(others).take(pa.array(rows)), others)
        found, rows = found.filter(pa.array(same)), rows[same]
    found_at = np.full(keys.num_rows, -1, dtype=np.int64)
    found_at[rows] = np.arange(found.num_rows)
    return found.column(column).take(pa.array(found_at, mask=found_at < 0)).combine_chunks()


def _hash_join(batches: pa.RecordBatchReader, build: pa.Table, options: acero.HashJoinNodeOptions) -> acero.Declaration:
    """Acero's hash join of ``batches``, streamed through, with ``build``, which its hash table holds."""
    source = acero.Declaration("record_batch_reader_source", acero.RecordBatchReaderSourceNodeOptions(batches))
    built = acero.Declaration("table_source", acero.TableSourceNodeOptions(build))
    return acero.Declaration("hashjoin", options, inputs=[source, built])


def _join_stream(batches: pa.RecordBatchReader, keys: pa.Table, join_type: str) -> Iterator[pa.RecordBatch]:
    key = keys.column_names
    join = _hash_join(batches, keys, acero.HashJoinNodeOptions(join_type, left_keys=key, right_keys=key))
    schema = batches.schema
    with join.to_reader() as reader:
        for batch in reader:
            if batch.num_rows:  # the join's output forgets which columns are not nullable
                yield pa.RecordBatch.from_arrays(batch.select(schema.names).columns, schema=schema)
