"""Deletion vectors: which base rows a set of pending changes supersedes, by row address.

A base row's address (Lance's ``_rowaddr``) is its fragment id in the high
32 bits and its offset in that fragment in the low 32. Addresses stay valid
while the fragment exists: deletions add a deletion file beside it, and only
a rewrite (``compact_files``) gives its rows new addresses, in new fragments.
A merged scan that drops the rows a vector lists needs no key join, whatever
the key type (:mod:`resources.lsm.read.merged_read`).
"""

from __future__ import annotations

from functools import cached_property

import lance
import numpy as np
import pyarrow as pa

from ..format.schema import ROW_ADDRESS
from .filter_text import keys_filter
from .key_sets import key_join, rows_of_keys, semi_join_stream

_SCAN_ROWS_PER_INDEXED_KEY = 500
"""Base rows a key-column scan (and join) reads in the time a BTREE ``IN`` query spends per key.

pylance 14.0.2, 2 cores: the scan costs 15-18 ns per base row, the query 4-13 us per key (more on
larger bases): even at 300k and 16M rows at about 500 rows per key."""
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
        """Every address of ``vectors``, which must be disjoint (one per shard: keys never share a row)."""
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
        slice for the batch's range becomes a bitmap over that range, one
        lookup per row; scattered addresses fall back to a binary search.
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


def base_row_addresses(dataset: lance.LanceDataset, keys: pa.Table, primary_key: list[str]) -> pa.Array:
    """The address of each key's base row, aligned with ``keys``; null where the base lacks the key.

    The base holds each key at most once. Few keys against a large base are
    found with one ``IN`` query, which a key column's BTREE serves
    (the cost follows the number of keys); otherwise the base's key columns
    are scanned, which is cheaper per key, through one streaming join
    (memory holds the keys and what they find, not the base's key column).
    """
    if not keys.num_rows:
        return pa.array([], pa.uint64())
    return addresses_by_key(keys, _base_rows_of(dataset, keys, primary_key), primary_key, ROW_ADDRESS)


def count_base_rows(
    dataset: lance.LanceDataset, keys: pa.Table, primary_key: list[str], besides: DeletionVector
) -> int:
    """How many base rows hold one of ``keys`` and are not in ``besides``.

    Every such row, as a scan dropping those keys drops them all; a row that
    ``besides`` drops already (a run's key changed again in a newer level) is
    not counted twice.
    """
    if not keys.num_rows:
        return 0
    addresses = _base_rows_of(dataset, keys, primary_key).column(ROW_ADDRESS).to_numpy()
    return int(besides.keep_mask(addresses).sum())


def _base_rows_of(dataset: lance.LanceDataset, keys: pa.Table, primary_key: list[str]) -> pa.Table:
    """The key columns and row address of every base row holding one of ``keys`` (through the index when few)."""
    if keys.num_rows * _SCAN_ROWS_PER_INDEXED_KEY < dataset.count_rows():
        found = dataset.to_table(columns=primary_key, with_row_address=True, filter=keys_filter(keys, primary_key))
        # A key of several columns is filtered on one of them: other keys' rows come too.
        return found if len(primary_key) == 1 else key_join(found, keys, primary_key, "left semi")
    scan = dataset.scanner(columns=primary_key, with_row_address=True).to_reader()
    return pa.Table.from_batches(semi_join_stream(scan, keys.select(primary_key)), scan.schema)


def addresses_by_key(keys: pa.Table, found: pa.Table, primary_key: list[str], column: str) -> pa.Array:
    """``found``'s ``column`` for each row of ``keys``, by key (null where ``found`` lacks it).

    ``found`` holds each key at most once.
    """
    return found.column(column).take(rows_of_keys(keys, found, primary_key)).combine_chunks()
