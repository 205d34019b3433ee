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

Used where memory-mapping is possible (local storage), for base versions
whose every fragment has its index, and while row ids are row addresses;
any other lookup takes Lance's query.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from functools import partial

import lance
import numpy as np
import pyarrow as pa

from ..format.layout import KEY_INDEX_DIR
from ..format.storage import TableStorage
from ..lru_cache import LruCache
from .key_hash_files import key_hash_file, stored_key_hash_files
from .key_hashes import key_hashes
from .key_sets import key_mask

log = logging.getLogger(__name__)

_RECHECK_SECONDS = 5.0
"""How long a base version found without a complete index is read through Lance's query before looking again
(the index of a table that had none is written by the next build of pending runs, without a new version)."""

# A fragment's index: its id, its sorted hashes and each one's row offset (both memory-mapped).
_FragmentIndex = tuple[int, np.ndarray, np.ndarray]

_MAPPED: LruCache[str, _FragmentIndex | None] = LruCache(4096)
"""The process's memory-mapped fragment indexes, by path (files never change; mapping one costs ~30 µs)."""


class BaseKeyIndex:
    """The key indexes of one base version's fragments."""

    def __init__(self, fragments: list[_FragmentIndex]) -> None:
        self._fragments = fragments

    @classmethod
    def of(cls, storage: TableStorage, dataset: lance.LanceDataset) -> BaseKeyIndex | None:
        """The index of ``dataset``'s base version, if it can be used (module docstring); kept per dataset object."""
        if not storage.is_local or dataset.has_stable_row_ids:
            return None
        with _LOCK:
            known = _BY_DATASET.get(dataset)
        if known is not None and (known[0] is not None or time.monotonic() < known[1]):
            return known[0]
        index = _opened(storage, dataset)
        with _LOCK:
            _BY_DATASET[dataset] = (index, time.monotonic() + _RECHECK_SECONDS)
        return index

    def addresses(self, hashes: np.ndarray) -> np.ndarray:
        """The row addresses (``uint64``) of the physical rows whose key hash is one of ``hashes``."""
        found = [np.empty(0, dtype=np.uint64)]
        hashes = np.sort(hashes)  # sorted needles search a fragment 2-7x faster (fewer pages, warmer caches)
        for fragment_id, sorted_hashes, offsets in self._fragments:
            first = np.searchsorted(sorted_hashes, hashes)
            hit = sorted_hashes[np.minimum(first, len(sorted_hashes) - 1)] == hashes
            if not hit.any():
                continue
            last = np.searchsorted(sorted_hashes, hashes[hit], side="right")
            rows = np.concatenate([offsets[a:b] for a, b in zip(first[hit], last, strict=True)])
            found.append((np.uint64(fragment_id) << np.uint64(32)) | rows.astype(np.uint64))
        return np.concatenate(found)

    def rows(self, dataset: lance.LanceDataset, keys: pa.Table, key: list[str], columns: list[str] | None) -> pa.Table:
        """The live base rows of ``keys`` in ``dataset`` (``columns``, default all, must hold the key)."""
        addresses = self.addresses(key_hashes(keys, key)) if keys.num_rows else np.empty(0, dtype=np.uint64)
        taken = dataset._take_rows(pa.array(addresses), columns=columns)
        return taken.filter(key_mask(taken, keys, key)) if taken.num_rows else taken


_LOCK = threading.Lock()
_BY_DATASET: weakref.WeakKeyDictionary[lance.LanceDataset, tuple[BaseKeyIndex | None, float]] = (
    weakref.WeakKeyDictionary()
)
"""Each dataset object's index (or ``None``, and when to look again): listing its fragments costs ~1 ms."""


def _opened(storage: TableStorage, dataset: lance.LanceDataset) -> BaseKeyIndex | None:
    """``dataset``'s index, memory-mapped, or ``None`` if a fragment lacks its file (or holds a damaged one)."""
    stored = stored_key_hash_files(storage, KEY_INDEX_DIR)
    fragments = []
    for fragment in dataset.get_fragments():
        path = key_hash_file(fragment, KEY_INDEX_DIR)
        if path not in stored:
            return None
        local = storage.path(path)
        index = _MAPPED.get(local, partial(_mapped, local, fragment.fragment_id))
        if index is None or len(index[1]) != fragment.physical_rows:
            log.warning("%s does not index its fragment's rows; lookups take Lance's query", path)
            return None
        fragments.append(index)
    return BaseKeyIndex(fragments)


def _mapped(path: str, fragment_id: int) -> _FragmentIndex | None:
    """The fragment index stored at local ``path`` (``n`` hashes, then ``n`` offsets), or ``None`` if not one."""
    size = os.path.getsize(path)
    if not size or size % 12:
        return None
    rows = size // 12
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    hashes = np.ndarray((rows,), dtype="<u8", buffer=mapped)
    return fragment_id, hashes, np.ndarray((rows,), dtype="<u4", buffer=mapped, offset=8 * rows)
