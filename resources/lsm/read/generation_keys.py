"""Which keys a flushed generation holds, for lookups that keep asking it: its key index, kept per process.

A lookup opens a generation newer than its shard's run when the
generation's bloom filter may hold the key. Lance's filters are 32 KiB
whatever the generation's size: a 100k-row generation (a full MemTable
beside a busy writer) answers "maybe" for most keys, and each maybe costs
a filtered read of the whole generation (about 1 ms at 100k rows). A
generation asked ``READS_BEFORE_KEY_INDEX`` times gets an index of its keys
(:class:`~resources.lsm.read.key_sets.KeyIndex`), built on the level
readers' threads (no lookup waits for it: 100k string keys take about 11 ms),
and is then read only for keys it holds. A flushed generation never changes,
so the index is kept for the process, shared by every table object, until
evicted.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import lance

from ..format.storage import TableStorage
from ..lru_cache import LruCache
from .key_sets import KeyIndex
from .level_readers import build_in_background

READS_BEFORE_KEY_INDEX = 16
"""Filtered reads of a generation by lookups before its keys are indexed.

About what one index costs in reads (100k keys: 6 ms int64, 11 ms strings,
against ~1-2 ms a read): a generation read that often is likely read more,
and one read less often never pays for an index (at worst twice the cost of
the better choice, as in renting skis until their price is spent)."""

_Generation = tuple[str, str, str, tuple[str, ...]]
"""Table location, shard, generation directory and key columns."""

_READS: LruCache[_Generation, Iterator[int]] = LruCache(max_entries=4096)
_INDEXES: LruCache[_Generation, KeyIndex] = LruCache(
    max_entries=1024, max_bytes=256 << 20, size_of=lambda index: index.nbytes
)


def generation_key_index(
    storage: TableStorage,
    shard_id: str,
    directory: str,
    key: list[str],
    open_generation: Callable[[], lance.LanceDataset],
) -> KeyIndex | None:
    """The generation's key index, once built (``None`` until then): lookups asked it
    ``READS_BEFORE_KEY_INDEX`` times, and it was built off their path (again after an eviction).

    Its live keys (deletes included) are read once, when the index is built.
    """
    generation = (storage.location, shard_id, directory, tuple(key))
    if (index := _INDEXES.find(generation)) is not None:
        return index
    reads = next(_READS.get(generation, itertools.count))
    if reads and reads % READS_BEFORE_KEY_INDEX == 0:
        build_in_background(
            lambda: _INDEXES.put(generation, KeyIndex(open_generation().to_table(columns=key), key)),
            f"the key index of generation {directory} of shard {shard_id}",
        )
    return None
