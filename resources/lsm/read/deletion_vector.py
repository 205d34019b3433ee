"""Deletion vectors: which base rows a set of pending changes supersedes, by row address.

A base row's address (Lance's ``_rowaddr``) is its fragment id in the high
32 bits and its offset in that fragment in the low 32. Addresses stay valid
while the fragment exists: deletions add a deletion file beside it, and only
a rewrite (``compact_files``) gives its rows new addresses, in new fragments.
A merged scan that drops the rows a vector lists needs no key join, whatever
the key type (:mod:`resources.lsm.read.merged_read`).
"""

from __future__ import annotations

import itertools
from concurrent.futures import Future
from functools import cached_property, partial
from typing import Literal

import lance
import numpy as np
import pyarrow as pa

from ..format.schema import ROW_ADDRESS
from .base_key_index import BaseKeyIndex
from .filter_text import keys_filter
from .key_sets import key_join, rows_of_keys, semi_join_stream, value_of_each_key
from .key_spread import key_spread, unique_integer_column
from .level_readers import level_readers

_SCAN_ROWS_PER_INDEXED_KEY = 5000
"""Base rows a key-column scan (and join) reads in the time a BTREE ``IN`` query spends per key.

pylance 14.0.2, 2 cores, 64Mi string keys: the scan (and semi-join) of the key column takes 0.84 s;
an ``IN`` query of 2,000 keys 0.18 s, of 10,000 keys 0.53-0.63 s, of 50,000 keys 1.0-3.3 s (the key
index pages it touches grow with the keys until they are all of them)."""
_ROWS_PER_KEY_PER_GROUP = 100
"""Base rows per key in a group of fragments looked up ahead of a scan (:class:`SupersededRows`).

Each group builds the key set again (about 100 ns per key) and scans its key columns (about 15 ns
per row): at 100 rows per key the builds cost under a tenth of the scan."""
_MIN_GROUPS, _MAX_GROUPS = 4, 32
_DENSE_SPAN_FACTOR = 4
"""A batch whose address span is at most this many times its length is matched through a dense bitmap."""


class DeletionVector:
    """A sorted set of base row addresses, to drop from base batches.

    Parameters
    ----------
    addresses
        Row addresses (``uint64``), any order, duplicates allowed (ascending
        and unique is fastest).
    """

    def __init__(self, addresses: np.ndarray) -> None:
        addresses = np.asarray(addresses, dtype=np.uint64)
        # Stored vectors come sorted: checking costs one pass, sorting a lot more.
        ascending = len(addresses) < 2 or bool(np.all(addresses[1:] > addresses[:-1]))
        self.addresses = addresses if ascending else np.unique(addresses)

    @classmethod
    def union(cls, vectors: list[DeletionVector]) -> DeletionVector:
        """Every address of ``vectors``, for dropping rows: an address in two of them is kept twice."""
        if len(vectors) == 1:
            return vectors[0]
        union = cls(np.empty(0, np.uint64))
        if vectors:
            # Concatenated sorted runs: a stable sort merges them in about linear time.
            union.addresses = np.sort(np.concatenate([v.addresses for v in vectors]), kind="stable")
        return union

    @cached_property
    def fragment_ids(self) -> frozenset[int]:
        """The base fragments the vector points into."""
        fragments = self.addresses >> np.uint64(32)  # ascending, like the addresses
        return (
            frozenset(int(f) for f in fragments[np.r_[True, fragments[1:] != fragments[:-1]]])
            if len(fragments)
            else frozenset()
        )

    def holds_in(self, fragment_ids: set[int] | frozenset[int]) -> bool:
        """Whether every fragment the vector points into is among ``fragment_ids``.

        A rewritten fragment gives its rows new addresses: a vector pointing
        into a fragment that is gone no longer finds the rows it superseded.
        """
        return self.fragment_ids <= fragment_ids

    def keep_mask(self, addresses: np.ndarray) -> np.ndarray:
        """For each address, whether the vector does *not* hold it (the row stays).

        Scan batches hold addresses ascending within a fragment: the vector's
        slice for the batch's range is cleared from an all-kept mask when
        the batch is one run of consecutive rows (the usual case), or becomes
        a bitmap over that range, one lookup per row; scattered addresses
        fall back to a binary search.
        """
        if not len(self.addresses) or not len(addresses):
            return np.ones(len(addresses), dtype=bool)
        low, high = addresses.min(), addresses.max()
        start = np.searchsorted(self.addresses, low, side="left")
        stop = np.searchsorted(self.addresses, high, side="right")
        inside = self.addresses[start:stop]
        if not len(inside):
            return np.ones(len(addresses), dtype=bool)
        span = int(high - low) + 1
        if span == len(addresses) and (np.diff(addresses) == 1).all():  # a run of rows: positions are offsets
            in_run = np.ones(span, dtype=bool)
            in_run[(inside - low).astype(np.intp)] = False
            return in_run
        if span <= _DENSE_SPAN_FACTOR * len(addresses):
            dropped = np.zeros(span, dtype=bool)
            dropped[(inside - low).astype(np.intp)] = True
            kept: np.ndarray = ~dropped[(addresses - low).astype(np.intp)]
            return kept
        position = np.minimum(np.searchsorted(inside, addresses), len(inside) - 1)
        scattered: np.ndarray = inside[position] != addresses
        return scattered


def fragment_ids(dataset: lance.LanceDataset) -> set[int]:
    """The ids of the fragments of one base version."""
    return {fragment.fragment_id for fragment in dataset.get_fragments()}


def base_row_addresses(
    dataset: lance.LanceDataset, keys: pa.Table, primary_key: list[str], index: BaseKeyIndex | None = None
) -> pa.Array:
    """The address of each key's base row, aligned with ``keys``; null where the base lacks the key.

    The base holds each key at most once. Keys few enough are found through
    ``index``, ``dataset``'s key index, if given (the cost follows the keys),
    or else with one ``IN`` query a key column's BTREE serves; otherwise the
    base's key columns are scanned, which is cheaper per key, through one
    streaming join (memory holds the keys and what they find, not the base's
    key column).
    """
    if not keys.num_rows:
        return pa.array([], pa.uint64())
    if _lookup(dataset, keys.num_rows, index) == "scan":
        scan = dataset.scanner(columns=primary_key, with_row_address=True).to_reader()
        return value_of_each_key(scan, keys.select(primary_key), ROW_ADDRESS, on=_join_columns(dataset, primary_key))
    return addresses_by_key(keys, _base_rows_of(dataset, keys, primary_key, index=index), primary_key, ROW_ADDRESS)


def _join_columns(dataset: lance.LanceDataset, primary_key: list[str]) -> list[str]:
    """The key columns a scan pairs base rows with keys on: a composite key's nearly unique integer column, if it
    has one, else the whole key.

    64Mi rows keyed by a region and an id, 2M keys: 4.6 s of CPU against
    6.0 s for the scan and join on the whole key; the few rows it pairs
    with a key of another region are dropped.
    """
    column = unique_integer_column(dataset, primary_key)
    return [column] if column is not None else primary_key


def _lookup(
    dataset: lance.LanceDataset,
    keys: int,
    index: BaseKeyIndex | None,
    fragments: list[lance.LanceFragment] | None = None,
) -> Literal["index", "query", "scan"]:
    """How :func:`_base_rows_of` finds ``keys`` keys in ``fragments`` (default: all) of ``dataset``: through
    ``index``, with a BTREE ``IN`` query, or by a scan of the key columns, whichever costs least for their number."""
    if index is not None and fragments is None and index.taken_faster_than_scanned(keys):
        return "index"
    rows = dataset.count_rows() if fragments is None else sum(f.physical_rows for f in fragments)
    return "query" if keys * _SCAN_ROWS_PER_INDEXED_KEY < rows else "scan"


class RowsFoundAhead:
    """Base rows a scan drops, found ahead of it group of consecutive fragments by group, in scan order.

    A batch waits only for its own fragments' group, so the scan starts
    after a fraction of the lookup. Subclasses look the groups up on the
    level readers' threads.
    """

    def __init__(self, groups: list[list[lance.LanceFragment]]) -> None:
        self._group_of = {fragment.fragment_id: number for number, group in enumerate(groups) for fragment in group}

    def keep_mask(self, addresses: np.ndarray, batch: pa.RecordBatch, live: np.ndarray | None) -> np.ndarray:
        """For each of ``batch``'s rows at positions ``live`` (``None``: every row), at ``addresses``, whether it
        holds none of the keys (waits for its group)."""
        raise NotImplementedError

    def _groups_of(self, addresses: np.ndarray) -> list[int]:
        """The groups of the fragments ``addresses`` lie in (one, but for a batch across fragments)."""
        fragments = addresses >> np.uint64(32)
        first, last = int(fragments[0]), int(fragments[-1])
        ids = [first] if first == last and fragments.min() == fragments.max() else np.unique(fragments).tolist()
        return sorted({self._group_of[int(f)] for f in ids})  # the scan reads only the fragments looked up


class SupersededRows(RowsFoundAhead):
    """The base rows holding one of ``keys``, looked up ahead of a scan that drops them.

    The scan reads the base fragment by fragment. The lookup reads only the
    key columns of the same ``fragments`` (default: all of ``dataset``'s), on
    the level readers' threads, one task per group of consecutive fragments
    (:func:`_base_rows_of`: one semi-join over the group's key columns, or
    one indexed ``IN`` query when the keys are few against the base).
    Each group builds the key set again, so a group holds at least
    ``_ROWS_PER_KEY_PER_GROUP`` base rows per key; at least
    ``_MIN_GROUPS`` let the scan start after a fraction of the lookup.
    """

    def __init__(
        self,
        dataset: lance.LanceDataset,
        keys: pa.Table,
        primary_key: list[str],
        fragments: list[lance.LanceFragment] | None = None,
    ) -> None:
        groups = _fragment_groups(dataset.get_fragments() if fragments is None else fragments, keys.num_rows)
        super().__init__(groups)
        self._found: list[Future[DeletionVector]] = [Future() for _ in groups]
        level_readers().submit(self._look_up, dataset, keys, primary_key, groups)

    def keep_mask(self, addresses: np.ndarray, batch: pa.RecordBatch, live: np.ndarray | None) -> np.ndarray:
        if not len(addresses):
            return np.ones(0, dtype=bool)
        return DeletionVector.union([self._found[g].result() for g in self._groups_of(addresses)]).keep_mask(addresses)

    def _look_up(
        self,
        dataset: lance.LanceDataset,
        keys: pa.Table,
        primary_key: list[str],
        groups: list[list[lance.LanceFragment]],
    ) -> None:
        """Each group in turn, in scan order: one lookup at a time keeps the cores for the scan it runs ahead of."""
        for group, found in zip(groups, self._found, strict=True):
            try:
                rows = _base_rows_of(dataset, keys, primary_key, group)
            except BaseException as exc:  # the scan raises it when it needs the group
                found.set_exception(exc)
                continue
            found.set_result(DeletionVector(rows.column(ROW_ADDRESS).to_numpy()))


def _fragment_groups(fragments: list[lance.LanceFragment], keys: int) -> list[list[lance.LanceFragment]]:
    """Consecutive groups of ``fragments`` to look ``keys`` keys up in (one group when an indexed query serves)."""
    rows = sum(fragment.physical_rows for fragment in fragments)
    if keys * _SCAN_ROWS_PER_INDEXED_KEY < rows or len(fragments) < 2:
        return [fragments] if fragments else []
    return consecutive_groups(fragments, min(_MAX_GROUPS, max(_MIN_GROUPS, rows // (keys * _ROWS_PER_KEY_PER_GROUP))))


def consecutive_groups(fragments: list[lance.LanceFragment], count: int) -> list[list[lance.LanceFragment]]:
    """``fragments`` cut into ``count`` consecutive groups of about as many fragments (fewer if they are fewer)."""
    edges = np.linspace(0, len(fragments), min(count, len(fragments)) + 1).round().astype(int).tolist()
    return [fragments[start:stop] for start, stop in itertools.pairwise(edges)]


def count_base_rows(
    dataset: lance.LanceDataset,
    keys: pa.Table,
    primary_key: list[str],
    besides: DeletionVector,
    index: BaseKeyIndex | None = None,
) -> int:
    """How many base rows hold one of ``keys`` and are not in ``besides``.

    Every such row, as a scan dropping those keys drops them all; a row that
    ``besides`` drops already (a run's key changed again in a newer level) is
    not counted twice.
    """
    if not keys.num_rows:
        return 0
    addresses = _base_rows_of(dataset, keys, primary_key, index=index).column(ROW_ADDRESS).to_numpy()
    return int(besides.keep_mask(addresses).sum())


def _base_rows_of(
    dataset: lance.LanceDataset,
    keys: pa.Table,
    primary_key: list[str],
    fragments: list[lance.LanceFragment] | None = None,
    index: BaseKeyIndex | None = None,
) -> pa.Table:
    """The key columns and row address of every base row holding one of ``keys`` (through an index when few).

    ``fragments`` limits the search to those fragments of ``dataset``;
    ``index``, the key index of all of them, serves when searching it and
    taking the rows found costs less than a scan (64Mi rows, 100k string
    keys: 1.7 s of CPU against 3.7 s for the scan and join; 5,000 keys:
    0.25 s against 2.5 s for the ``IN`` query). A partial index (fragments
    a tidy-up just wrote lack theirs) serves for the fragments it holds;
    the others are searched as ``fragments`` are.
    """
    lookup = _lookup(dataset, keys.num_rows, index, fragments)
    if lookup == "index":
        assert index is not None
        columns = [*primary_key, ROW_ADDRESS]
        return index.rows(dataset, keys, primary_key, columns, partial(_base_rows_of, dataset, keys, primary_key))
    indexed = lookup == "query"
    where = keys_filter(keys, primary_key, key_spread(dataset, primary_key)) if indexed else None
    scanner = dataset.scanner(columns=primary_key, with_row_address=True, filter=where, fragments=fragments)
    if indexed:
        found = scanner.to_table()
        # A key of several columns is filtered on one of them: other keys' rows come too.
        return found if len(primary_key) == 1 else key_join(found, keys, primary_key, "left semi")
    scan = scanner.to_reader()
    return pa.Table.from_batches(semi_join_stream(scan, keys.select(primary_key)), scan.schema)


def addresses_by_key(keys: pa.Table, found: pa.Table, primary_key: list[str], column: str) -> pa.Array:
    """``found``'s ``column`` for each row of ``keys``, by key (null where ``found`` lacks it).

    ``found`` holds each key at most once.
    """
    return found.column(column).take(rows_of_keys(keys, found, primary_key)).combine_chunks()
