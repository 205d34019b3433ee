"""Point lookups of the base through each fragment's stored key index, without Lance's query planner.

Lance answers a point query through the BTREE on each key column in about
2 ms on a 64Mi-row table, most of it planning; taking rows by address costs
0.4 ms. A fragment's key index (:mod:`~resources.lsm.read.key_hash_files`)
holds the 64-bit hash of each of its physical rows' keys, sorted, with the
row's offset. A lookup hashes its keys, searches every fragment's index
(memory-mapped: a few pages each), takes the rows found by address and
keeps those whose key is one asked: a hash two keys share, or a row deleted
since the index was written (Lance's take skips deleted rows), never
answers for the key asked.

Used where memory-mapping is possible (local storage) and while row ids
are row addresses; any other lookup takes Lance's query. A base version
some of whose fragments lack their index (written by a tidy-up or
another writer, not read back yet) has a partial one for the callers that
search the rest on their own (``BaseKeyIndex.of(..., partial=True)``):
a tidy-up rewrites a bounded share of the base, and searching only that
share costs a fraction of searching all of it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import cached_property, partial

import lance
import numpy as np
import pyarrow as pa

from ..format.layout import KEY_INDEX_DIR
from ..format.storage import TableStorage
from ..lru_cache import LruCache
from .key_hash_files import key_hash_file, stored_key_hash_files
from .key_hashes import NUMPY_HASHED_KEYS, key_hashes
from .key_sets import FewKeys, key_mask, spans

log = logging.getLogger(__name__)

_MISSING_FILES_RECHECK_SECONDS = 0.05
"""How often a version's fragments without an index are looked for again (a stat each): a merge writes its new
fragments' files just after its commit, and a lookup per call would stat every such fragment of the base."""

_ROWS_SCANNED_PER_ROW_TAKEN = 256
"""Base rows whose key columns a scan reads and joins in the time a take by address spends on one row.

pylance 14.0.2, 64Mi rows in 64 fragments, 2 cores: taking 100k rows' keys costs 0.2-0.8 s, the search
0.5 s; a scan and join of the key columns 1.1 s of CPU for int64 keys (the cheapest), 3.7 s for strings."""

_FILTERED_SEARCH_HASHES = 65_536
"""Hashes searched at once from which a fragment's presence filter is built (once per process) and used.

64Mi rows in 64 fragments: building every filter takes 0.5-0.8 s (and holds 64 MiB), about what
searching 100k hashes without them costs; searching 500k hashes takes 1.8 s without, 0.6 s with."""

_CACHED_JOIN_KEYS = 65_536
"""Keys up to which a join's hash table of them stays in the CPU's caches (a base row then joins in ~10 ns, not 45)."""

_SCALAR_SEARCH_HASHES = 4
"""Hashes searched for one at a time, up to this many (a point lookup's): 64 fragments, one hash, 0.1 ms
against 0.46 ms for the array operations."""

_FILTER_BITS_PER_ROW = 8
"""A presence filter's size: one bit per hash prefix, at least 8 per row (a hash absent passes 1 time in 8-16)."""


_NOTHING = np.empty(0, dtype=np.int64)


@dataclass(frozen=True, eq=False)
class _FragmentIndex:
    """A fragment's index: its id, its sorted hashes and each one's row offset (both memory-mapped)."""

    fragment_id: int
    hashes: np.ndarray
    offsets: np.ndarray

    def rows_of(self, needles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The rows whose hash is one of ``needles`` (sorted): their offsets and, for each, its needle's position.

        Many needles are first passed through the presence filter: most
        are in no fragment, or another one, and a filter test costs a
        fraction of a binary search through pages the search must touch.
        """
        candidates = np.flatnonzero(self._may_hold(needles)) if len(needles) >= _FILTERED_SEARCH_HASHES else None
        sought = needles if candidates is None else needles[candidates]
        first = np.searchsorted(self.hashes, sought)
        hit = self.hashes[np.minimum(first, len(self.hashes) - 1)] == sought
        if not hit.any():  # the fragment holds none of them
            return _NOTHING, _NOTHING
        first, found = first[hit], np.flatnonzero(hit) if candidates is None else candidates[hit]
        # Every row of each hash found: one, but for two keys sharing a hash.
        counts = np.searchsorted(self.hashes, needles[found], side="right") - first
        return self.offsets[spans(first, counts)], np.repeat(found, counts)

    def _may_hold(self, hashes: np.ndarray) -> np.ndarray:
        """For each hash, whether the fragment may hold it (``False``: it does not)."""
        bits, shift = self._presence
        prefix = hashes >> shift
        held: np.ndarray = (
            bits[(prefix >> np.uint64(3)).astype(np.intp)] >> (prefix & np.uint64(7)).astype(np.uint8)
        ) & 1
        return held.astype(bool)

    @cached_property
    def _presence(self) -> tuple[np.ndarray, np.uint64]:
        """A bitmap of the prefixes of the fragment's hashes (packed, little-endian bits) and the prefix shift."""
        width = max(6, (len(self.hashes) * _FILTER_BITS_PER_ROW - 1).bit_length())  # 2**width bits
        shift = np.uint64(64 - width)
        present = np.zeros(1 << width, dtype=bool)
        present[(self.hashes >> shift).astype(np.intp)] = True
        return np.packbits(present, bitorder="little"), shift


_MAPPED: LruCache[str, _FragmentIndex | None] = LruCache(4096)
"""The process's memory-mapped fragment indexes, by path (files never change; mapping one costs ~30 µs)."""


class BaseKeyIndex:
    """The key indexes of one base version's fragments."""

    def __init__(self, fragments: list[_FragmentIndex], missing: dict[int, str] | None = None) -> None:
        self._fragments = fragments
        self._rows = sum(len(fragment.hashes) for fragment in fragments)
        self._missing_files = missing or {}
        self._missing_looked_for = time.monotonic()
        self.missing = tuple(self._missing_files)
        """Ids of the version's fragments without an index (searches skip them)."""

    def _missing_file_written(self) -> bool:
        """Whether the index of a fragment this one lacks has been written since (a stat per such fragment,
        at most every ``_MISSING_FILES_RECHECK_SECONDS``).

        A merge stores its new fragments' files just after its commit, a
        tidy-up once it read their keys back: readers of the new version
        take the files up within that delay, without a new version.
        """
        now = time.monotonic()
        if not self._missing_files or now - self._missing_looked_for < _MISSING_FILES_RECHECK_SECONDS:
            return False
        self._missing_looked_for = now
        return any(os.path.exists(path) for path in self._missing_files.values())

    @classmethod
    def of(cls, storage: TableStorage, dataset: lance.LanceDataset, *, partial: bool = False) -> BaseKeyIndex | None:
        """The index of ``dataset``'s base version, if it can be used (module docstring); kept per dataset object.

        ``None`` when a fragment lacks its index, unless ``partial``: then the
        index of the others, which names the fragments it lacks (:attr:`missing`).
        """
        if not storage.is_local or dataset.has_stable_row_ids:
            return None
        with _LOCK:
            seen, index = dataset in _BY_DATASET, _BY_DATASET.get(dataset)
        if not seen or (index is not None and index._missing_file_written()):
            index = _opened(storage, dataset)
            with _LOCK:
                _BY_DATASET[dataset] = index
        if index is None or (index.missing and not (partial and index._fragments)):
            return None  # a base with no fragment indexed is Lance's to query, as a whole
        return index

    def search(self, hashes: np.ndarray) -> HashSearch:
        """A search for ``hashes`` in this version's fragments (sorted once, then asked per group of fragments)."""
        return HashSearch(self._fragments, hashes)

    def searched_faster_than_scanned(self, keys: int) -> bool:
        """Whether searching ``keys`` hashes costs less than scanning (and joining) every base row.

        A search costs 50-70 ns per key and fragment, or about 20 through
        the presence filters many keys are first tested against (64Mi rows
        in 64 fragments, 500k keys: 1.8 s, or 0.6 s), plus about 550 ns per
        key to hash, sort, pair and compare it (a 300k-row table in one
        fragment: 48k string keys cost a scan 26 ms searched, 8 ms joined).
        A join costs about 45 ns per base row (64Mi string keys: ~3 s of
        CPU), 10 while the keys' hash table fits the CPU's caches. A scan of
        64Mi rows with 800k pending keys: 7.5-9.6 s of CPU searching,
        9.7-11.3 s joining.
        """
        filtered = keys >= _FILTERED_SEARCH_HASHES
        searched_ns = keys * (550 + len(self._fragments) * (20 if filtered else 60))  # the figures above
        joined_ns = self._rows * (10 if keys < _CACHED_JOIN_KEYS else 45)
        return searched_ns < joined_ns

    def taken_faster_than_scanned(self, keys: int) -> bool:
        """Whether finding the rows of ``keys`` (a search, then a take by address) costs less than a key scan.

        A take costs about what a scan of ``_ROWS_SCANNED_PER_ROW_TAKEN`` rows'
        keys does, so the search bound applies too.
        """
        return keys * _ROWS_SCANNED_PER_ROW_TAKEN < self._rows and self.searched_faster_than_scanned(keys)

    def rows(
        self,
        dataset: lance.LanceDataset,
        keys: pa.Table,
        key: list[str],
        columns: list[str] | None,
        search_unindexed: Callable[[list[lance.LanceFragment]], pa.Table],
    ) -> pa.Table:
        """The live base rows of ``keys`` in ``dataset`` (``columns``, default all, must hold the key).

        The fragments without an index (:attr:`missing`) are searched by
        ``search_unindexed``, which must return the same columns.
        """
        addresses, _ = self.search(_hashes(keys, key)).pairs()
        taken = dataset._take_rows(pa.array(addresses), columns=columns)
        found = taken.filter(key_mask(taken, keys, key)) if taken.num_rows else taken
        if not self.missing:
            return found
        unindexed = [fragment for i in self.missing if (fragment := dataset.get_fragment(i)) is not None]
        return pa.concat_tables([found, search_unindexed(unindexed).cast(found.schema)])


class HashSearch:
    """Key hashes sorted once and searched for in fragment after fragment (sorted needles search a fragment
    2-7x faster: fewer pages, warmer caches)."""

    def __init__(self, fragments: list[_FragmentIndex], hashes: np.ndarray) -> None:
        self._fragments = fragments
        self._order = np.argsort(hashes, kind="stable")
        self._needles = hashes[self._order]

    def pairs(self, fragment_ids: Collection[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The physical rows whose key hash is one searched for, in ``fragment_ids`` (default: every fragment).

        Their addresses (``uint64``, ascending) and, for each, the position
        among the hashes searched of its hash (a row twice when two of them are equal).
        """
        fragments = [f for f in self._fragments if fragment_ids is None or f.fragment_id in fragment_ids]
        found, of = (
            self._few_pairs(fragments) if len(self._needles) <= _SCALAR_SEARCH_HASHES else self._pairs(fragments)
        )
        ascending = np.argsort(found, kind="stable")
        return found[ascending], of[ascending]

    def _pairs(self, fragments: list[_FragmentIndex]) -> tuple[np.ndarray, np.ndarray]:
        addresses, asked = [np.empty(0, dtype=np.uint64)], [np.empty(0, dtype=np.int64)]
        for fragment in fragments:
            rows, needles = fragment.rows_of(self._needles)
            if len(rows):
                addresses.append((np.uint64(fragment.fragment_id) << np.uint64(32)) | rows.astype(np.uint64))
                asked.append(self._order[needles])
        return np.concatenate(addresses), np.concatenate(asked)

    def _few_pairs(self, fragments: list[_FragmentIndex]) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_pairs`, a hash at a time: a scalar search costs a fifth of the array operations' overhead."""
        addresses, asked = [], []
        needles = list(zip(self._order.tolist(), self._needles, strict=True))
        for fragment in fragments:
            hashes = fragment.hashes
            for position, needle in needles:
                row = int(hashes.searchsorted(needle))
                while row < len(hashes) and hashes[row] == needle:  # every row of the hash: two keys may share it
                    addresses.append(fragment.fragment_id << 32 | int(fragment.offsets[row]))
                    asked.append(position)
                    row += 1
        return np.array(addresses, dtype=np.uint64), np.array(asked, dtype=np.int64)


def _hashes(keys: pa.Table, key: list[str]) -> np.ndarray:
    """The hash of each key of ``keys`` but null ones (a few hashed one by one, on Python ints)."""
    if keys.num_rows >= NUMPY_HASHED_KEYS:
        return key_hashes(keys, key)
    return np.array(FewKeys(keys, key).hashes, dtype=np.uint64)


_LOCK = threading.Lock()
_BY_DATASET: weakref.WeakKeyDictionary[lance.LanceDataset, BaseKeyIndex | None] = weakref.WeakKeyDictionary()
"""Each dataset object's index (``None``: a file is damaged): listing its fragments costs ~1 ms."""


def _opened(storage: TableStorage, dataset: lance.LanceDataset) -> BaseKeyIndex | None:
    """``dataset``'s index, memory-mapped (naming the fragments without a file), or ``None`` if a file is damaged."""
    stored = stored_key_hash_files(storage, KEY_INDEX_DIR)
    fragments, missing = [], {}
    for fragment in dataset.get_fragments():
        path = key_hash_file(fragment, KEY_INDEX_DIR)
        local = storage.path(path)
        if path not in stored:
            missing[fragment.fragment_id] = local
            continue
        index = _MAPPED.get(local, partial(_mapped, local, fragment.fragment_id))
        if index is None or len(index.hashes) != fragment.physical_rows:
            log.warning("%s does not index its fragment's rows; lookups take Lance's query", path)
            return None
        fragments.append(index)
    return BaseKeyIndex(fragments, missing)


def _mapped(path: str, fragment_id: int) -> _FragmentIndex | None:
    """The fragment index stored at local ``path`` (``n`` hashes, then ``n`` offsets), or ``None`` if not one."""
    size = os.path.getsize(path)
    if not size or size % 12:
        return None
    rows = size // 12
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    hashes = np.ndarray((rows,), dtype="<u8", buffer=mapped)
    return _FragmentIndex(fragment_id, hashes, np.ndarray((rows,), dtype="<u4", buffer=mapped, offset=8 * rows))


def _unlock_after_fork() -> None:
    # A thread of the parent may have held the lock: a forked child gets one of its own.
    global _LOCK
    _LOCK = threading.Lock()


os.register_at_fork(after_in_child=_unlock_after_fork)
