"""Which flushed generations may hold a primary key: their bloom filters.

Every flushed generation carries ``bloom_filter.bin``, a split-block bloom
filter (Parquet's SBBF: 256-bit blocks of eight little-endian u32 words) of
the primary-key hashes of its rows, deletes included. pylance 14.0.2's
``LsmPointLookupPlanner`` never uses them: it opens every generation and
probes its index on every lookup (about 1.3 ms each). A lookup here opens
only the generations whose filter may hold the key (those not covered by a
pending run). The newest-wins answer is unchanged: a skipped generation has
no row, live or deleted, for that key. Every filter is 32 KiB in 14.0.2:
measured, no false positives at 2.5k keys, but 60% at 90k keys (near the
default 100k-row MemTable), so smaller MemTables (``max_memtable_rows``)
make lookups cheaper.

The key hash is Lance's ``compute_pk_hash``: Rust's ``DefaultHasher``
(SipHash-1-3 with zero keys) fed, per key column, a null-flag byte and the
value (integers as little-endian bytes; strings as UTF-8 then ``0xFF``).
It matches 14.0.2's filters for int32, int64 and string key columns only
(int8/16, unsigned and large_string keys hash differently); keys of other
types are never pruned. Each filter is also checked against a sample of its
own generation's keys when first loaded: should a Lance upgrade change the
hash, pruning switches itself off instead of hiding rows.
"""

from __future__ import annotations

import logging
import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import cast

import lance
import numpy as np
import pyarrow as pa

from ..format.layout import generation_dir
from ..format.storage import TableStorage

log = logging.getLogger(__name__)

BLOOM_FILTER_FILE = "bloom_filter.bin"
_MASK64 = 2**64 - 1
# Parquet SBBF salts: one per 32-bit word of a block.
_SALT = (0x47B6137B, 0x44974D91, 0x8824AD5B, 0xA2B7289D, 0x705495C7, 0x2DF1424B, 0x9EFC4947, 0x5C6BFB31)
_INT_FORMATS = {pa.int32(): "<i", pa.int64(): "<q"}
_SAMPLE_ROWS = 64  # keys of a generation its filter must admit before we trust it
_CACHED_FILTERS = 1024  # 32 KiB each in 14.0.2


def hashable_key_types(types: Sequence[pa.DataType]) -> bool:
    """Whether :func:`pk_hash` reproduces Lance's hash for a key of these column types."""
    return all(t in _INT_FORMATS or t == pa.string() for t in types)


def pk_hash(values: Sequence[int | str], types: Sequence[pa.DataType]) -> int:
    """Lance's 64-bit primary-key hash of one non-null key (types per :func:`hashable_key_types`)."""
    parts = []
    for value, value_type in zip(values, types, strict=True):
        parts.append(b"\x00")  # is_null = false
        fmt = _INT_FORMATS.get(value_type)
        parts.append(struct.pack(fmt, value) if fmt else cast(str, value).encode() + b"\xff")  # str if not int
    return _siphash13(b"".join(parts))


class SplitBlockBloomFilter:
    """A Parquet-style SBBF read from its raw bytes (no header)."""

    def __init__(self, data: bytes) -> None:
        if not data or len(data) % 32:
            raise ValueError(f"a split-block bloom filter is whole 32-byte blocks, got {len(data)} bytes")
        self._blocks = np.frombuffer(data, dtype="<u4").reshape(-1, 8)

    def might_contain(self, key_hash: int) -> bool:
        """``False`` only if no key with this hash was inserted."""
        block = self._blocks[((key_hash >> 32) * len(self._blocks)) >> 32]
        low = key_hash & 0xFFFFFFFF
        return all(
            int(word) >> (((low * salt) & 0xFFFFFFFF) >> 27) & 1 for word, salt in zip(block, _SALT, strict=True)
        )


class GenerationFilters:
    """Per-table cache of flushed generations' bloom filters (they never change once listed).

    Bounded: the least recently used filters are dropped first.
    """

    def __init__(self, storage: TableStorage, key_fields: Sequence[pa.Field]) -> None:
        self._storage = storage
        self._key = [f.name for f in key_fields]
        self._types = [f.type for f in key_fields]
        self._enabled = hashable_key_types(self._types)
        self._filters: OrderedDict[tuple[str, str], SplitBlockBloomFilter | None] = OrderedDict()
        self._lock = threading.Lock()  # lookups may share a table object across threads

    def candidates(
        self, shard_id: str, generations: Sequence[tuple[int, str]], key: Sequence[int | str]
    ) -> tuple[tuple[int, str], ...]:
        """Those of ``shard_id``'s ``generations`` that may hold ``key`` (all of them if unsure)."""
        if not self._enabled:
            return tuple(generations)
        key_hash = pk_hash(key, self._types)
        return tuple(g for g in generations if self._may_hold(shard_id, g[1], key_hash))

    def _may_hold(self, shard_id: str, directory: str, key_hash: int) -> bool:
        bloom = self._filter(shard_id, directory)
        return bloom is None or bloom.might_contain(key_hash)

    def _filter(self, shard_id: str, directory: str) -> SplitBlockBloomFilter | None:
        """The generation's filter; ``None`` if it cannot be trusted (never pruned)."""
        cache_key = (shard_id, directory)
        with self._lock:
            if cache_key in self._filters:
                self._filters.move_to_end(cache_key)
                return self._filters[cache_key]
        path = generation_dir(shard_id, directory)
        bloom: SplitBlockBloomFilter | None
        try:
            bloom = SplitBlockBloomFilter(self._storage.read_bytes(f"{path}/{BLOOM_FILTER_FILE}"))
        except FileNotFoundError:
            return None  # not cached: a flush that listed the generation first may still write it
        if not self._admits_own_keys(bloom, path):
            log.warning(
                "bloom filter of %s does not admit its own keys; not used for pruning (has Lance's key hash changed?)",
                self._storage.path(path),
            )
            bloom = None
        with self._lock:
            self._filters[cache_key] = bloom
            if len(self._filters) > _CACHED_FILTERS:
                self._filters.popitem(last=False)
        return bloom

    def _admits_own_keys(self, bloom: SplitBlockBloomFilter, path: str) -> bool:
        generation = lance.dataset(self._storage.uri(path), storage_options=self._storage.storage_options)
        sample = generation.to_table(columns=self._key, limit=_SAMPLE_ROWS)
        return all(
            bloom.might_contain(pk_hash(row, self._types))
            for row in zip(*(sample[c].to_pylist() for c in self._key), strict=True)
        )


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (64 - bits))) & _MASK64


def _sip_round(v0: int, v1: int, v2: int, v3: int) -> tuple[int, int, int, int]:
    v0 = (v0 + v1) & _MASK64
    v1 = _rotl(v1, 13) ^ v0
    v0 = _rotl(v0, 32)
    v2 = (v2 + v3) & _MASK64
    v3 = _rotl(v3, 16) ^ v2
    v0 = (v0 + v3) & _MASK64
    v3 = _rotl(v3, 21) ^ v0
    v2 = (v2 + v1) & _MASK64
    v1 = _rotl(v1, 17) ^ v2
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


def _siphash13(message: bytes) -> int:
    """SipHash-1-3 with keys (0, 0): Rust's ``DefaultHasher`` over ``message``."""
    v0, v1, v2, v3 = 0x736F6D6570736575, 0x646F72616E646F6D, 0x6C7967656E657261, 0x7465646279746573
    whole = len(message) - len(message) % 8
    for offset in range(0, whole, 8):
        word = int.from_bytes(message[offset : offset + 8], "little")
        v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3 ^ word)
        v0 ^= word
    last = ((len(message) & 0xFF) << 56) | int.from_bytes(message[whole:], "little")
    v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3 ^ last)
    v0 ^= last
    v2 ^= 0xFF
    for _ in range(3):
        v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3
