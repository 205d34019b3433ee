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
make lookups cheaper; a generation lookups keep opening is indexed instead
(:mod:`~resources.lsm.read.generation_keys`).

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
from collections.abc import Sequence
from typing import TypeAlias, cast

import lance
import numpy as np
import pyarrow as pa

from ..format.layout import generation_dir
from ..format.storage import TableStorage
from ..lru_cache import LruCache
from .key_hashes import WORD_MASK, Word

log = logging.getLogger(__name__)

BLOOM_FILTER_FILE = "bloom_filter.bin"
# Parquet SBBF salts: one per 32-bit word of a block.
_SALTS = np.array(
    [0x47B6137B, 0x44974D91, 0x8824AD5B, 0xA2B7289D, 0x705495C7, 0x2DF1424B, 0x9EFC4947, 0x5C6BFB31], dtype=np.uint64
)
_INT_FORMATS = {pa.int32(): "<i", pa.int64(): "<q"}
_SAMPLE_ROWS = 64  # keys of a generation its filter must admit before we trust it
_CACHED_FILTERS = 1024  # 32 KiB each in 14.0.2
_CACHED_STACKS = 16  # a shard's trusted filters stacked: 512 KiB at 16 pending generations
_VECTOR_KEYS = 16


def hashable_key_types(types: Sequence[pa.DataType]) -> bool:
    """Whether :func:`pk_hashes` reproduces Lance's hash for keys of these column types."""
    return all(t in _INT_FORMATS or t == pa.string() for t in types)


def pk_hashes(keys: Sequence[Sequence[int | str]], types: Sequence[pa.DataType]) -> np.ndarray:
    """Lance's 64-bit primary-key hash of every non-null key (types per :func:`hashable_key_types`), as ``uint64``.

    Many keys are hashed together with numpy, one pass per message length (a
    few µs per key); fewer than ``_VECTOR_KEYS`` one by one on Python ints,
    where numpy's cost per call (about 150 µs for one key) would dominate a
    point lookup.
    """
    messages = [_message(key, types) for key in keys]
    if len(messages) < _VECTOR_KEYS:
        return np.array([_siphash13(_message_words(m)) for m in messages], dtype=np.uint64)
    hashes = np.zeros(len(messages), dtype=np.uint64)
    lengths = np.fromiter((len(m) for m in messages), dtype=np.int64, count=len(messages))
    for length in np.unique(lengths):
        rows = np.flatnonzero(lengths == length)
        block = np.frombuffer(b"".join(messages[i] for i in rows), dtype=np.uint8).reshape(len(rows), int(length))
        hashes[rows] = _siphash13(_block_words(block))
    return hashes


def _message(key: Sequence[int | str], types: Sequence[pa.DataType]) -> bytes:
    """What Lance's hasher is fed for one key: per column a null-flag byte, then the value's bytes."""
    parts = []
    for value, value_type in zip(key, types, strict=True):
        parts.append(b"\x00")  # is_null = false
        fmt = _INT_FORMATS.get(value_type)
        parts.append(struct.pack(fmt, value) if fmt else cast(str, value).encode() + b"\xff")  # str if not int
    return b"".join(parts)


class SplitBlockBloomFilter:
    """A Parquet-style SBBF read from its raw bytes (no header)."""

    def __init__(self, data: bytes) -> None:
        if not data or len(data) % 32:
            raise ValueError(f"a split-block bloom filter is whole 32-byte blocks, got {len(data)} bytes")
        self._blocks = np.frombuffer(data, dtype="<u4").reshape(-1, 8)

    def might_contain_all(self, key_hashes: np.ndarray) -> np.ndarray:
        """For each hash of a ``uint64`` array, ``False`` only if no key with that hash was inserted."""
        held: np.ndarray = FilterStack([self]).held(key_hashes)[0]
        return held

    @property
    def blocks(self) -> np.ndarray:
        """The filter's blocks: one row of eight ``uint32`` words each."""
        return self._blocks


class FilterStack:
    """Bloom filters tested together: those of one size stacked into one array.

    Which block a hash falls in depends only on the filter's size, and the
    bits it sets there not at all: both are computed once per test, and all
    filters of a size are read with one index (a lookup asks up to one filter
    per pending generation; all are one size in pylance 14.0.2).
    """

    def __init__(self, filters: Sequence[SplitBlockBloomFilter]) -> None:
        rows_by_size: dict[int, list[int]] = {}
        for row, bloom in enumerate(filters):
            rows_by_size.setdefault(len(bloom.blocks), []).append(row)
        self._count = len(filters)
        self._groups = [
            (size, np.array(rows), np.stack([filters[row].blocks for row in rows]))
            for size, rows in rows_by_size.items()
        ]

    def held(self, key_hashes: np.ndarray) -> np.ndarray:
        """For each filter (rows, in the order given) and hash (columns), ``False`` only if it holds no such key."""
        low = key_hashes & np.uint64(0xFFFFFFFF)
        bits = ((low[:, None] * _SALTS) & np.uint64(0xFFFFFFFF)) >> np.uint64(27)
        wanted = np.uint32(1) << bits.astype(np.uint32)
        held = np.empty((self._count, len(key_hashes)), dtype=bool)
        for size, rows, blocks in self._groups:
            held[rows] = np.all(blocks[:, _block_positions(key_hashes, size)] & wanted == wanted, axis=2)
        return held


def _block_positions(key_hashes: np.ndarray, size: int) -> np.ndarray:
    """The block each hash of a ``uint64`` array falls in, in a filter of ``size`` blocks."""
    positions: np.ndarray = ((key_hashes >> np.uint64(32)) * np.uint64(size)) >> np.uint64(32)
    return positions


_TrustedFilters: TypeAlias = tuple[tuple[tuple[int, str], ...], FilterStack | None]
"""Generations with a trusted filter, and their filters stacked (``None`` if there is none)."""

_FILTERS: LruCache[tuple[str, str, str], SplitBlockBloomFilter | None] = LruCache(_CACHED_FILTERS)
"""Generations' filters (``None``: not trusted) by table location, shard and directory, for the whole process:
they never change once listed, and every table object opened anew would read and check them again."""


class GenerationFilters:
    """A table's view of its flushed generations' bloom filters, cached once per process (:data:`_FILTERS`)."""

    def __init__(self, storage: TableStorage, key_fields: Sequence[pa.Field]) -> None:
        self._storage = storage
        self._key = [f.name for f in key_fields]
        self._types = [f.type for f in key_fields]
        self._enabled = hashable_key_types(self._types)
        self._stacks: LruCache[tuple[str, tuple[tuple[int, str], ...]], _TrustedFilters] = LruCache(_CACHED_STACKS)
        """Each shard's trusted filters over the generations asked, kept while lookups ask the same ones."""

    def candidate_keys(
        self, shard_id: str, generations: Sequence[tuple[int, str]], keys: Sequence[Sequence[int | str]]
    ) -> dict[tuple[int, str], np.ndarray]:
        """For each of ``generations``, the positions in ``keys`` of those it may hold (all of them if unsure)."""
        everyone = np.arange(len(keys))
        if not self._enabled:
            return dict.fromkeys(generations, everyone)
        held = dict.fromkeys(generations, everyone)  # a generation without a trusted filter may hold any key
        trusted, stack = self._trusted_filters(shard_id, tuple(generations))
        if stack is not None:
            found = stack.held(pk_hashes(keys, self._types))
            hits = cast(list[bool], found.any(axis=1).tolist())  # most generations hold none of the keys
            none = everyone[:0]
            held.update(
                (generation, np.flatnonzero(row) if hit else none)
                for generation, row, hit in zip(trusted, found, hits, strict=True)
            )
        return held

    def _trusted_filters(self, shard_id: str, generations: tuple[tuple[int, str], ...]) -> _TrustedFilters:
        """The generations with a trusted filter, and those filters stacked (``None``: no such generation).

        Kept per shard and generations once every filter is written (a lookup
        then reads none of them again); while one is missing, resolved anew.
        """
        try:
            return self._stacks.get((shard_id, generations), lambda: self._stack(shard_id, generations, written=True))
        except FileNotFoundError:
            return self._stack(shard_id, generations, written=False)

    def _stack(self, shard_id: str, generations: tuple[tuple[int, str], ...], written: bool) -> _TrustedFilters:
        """:meth:`_trusted_filters` resolved; a filter not written yet raises ``FileNotFoundError`` if ``written``."""
        trusted = {}
        for generation in generations:
            try:
                bloom = self._filter(shard_id, generation[1])
            except FileNotFoundError:
                if written:
                    raise
                continue  # a flush that listed the generation first may still write it
            if bloom is not None:
                trusted[generation] = bloom
        return tuple(trusted), FilterStack(list(trusted.values())) if trusted else None

    def _filter(self, shard_id: str, directory: str) -> SplitBlockBloomFilter | None:
        """The generation's filter (``FileNotFoundError`` while not written); ``None`` if it cannot be trusted."""
        return _FILTERS.get((self._storage.location, shard_id, directory), lambda: self._load(shard_id, directory))

    def _load(self, shard_id: str, directory: str) -> SplitBlockBloomFilter | None:
        """The generation's filter read and checked; ``FileNotFoundError`` while it is not written yet."""
        path = generation_dir(shard_id, directory)
        bloom = SplitBlockBloomFilter(self._storage.read_bytes(f"{path}/{BLOOM_FILTER_FILE}"))
        if self._admits_own_keys(bloom, path):
            return bloom
        log.warning(
            "bloom filter of %s does not admit its own keys; not used for pruning (has Lance's key hash changed?)",
            self._storage.path(path),
        )
        return None

    def _admits_own_keys(self, bloom: SplitBlockBloomFilter, path: str) -> bool:
        generation = lance.dataset(self._storage.uri(path), storage_options=self._storage.storage_options)
        sample = generation.to_table(columns=self._key, limit=_SAMPLE_ROWS)
        keys = list(zip(*(sample[c].to_pylist() for c in self._key), strict=True))
        return bool(np.all(bloom.might_contain_all(pk_hashes(keys, self._types))))


def _rotl(value: Word, bits: int) -> Word:
    return ((value << bits) | (value >> (64 - bits))) & WORD_MASK


def _sip_round(v: list[Word]) -> None:
    v[0] = (v[0] + v[1]) & WORD_MASK
    v[1] = _rotl(v[1], 13) ^ v[0]
    v[0] = _rotl(v[0], 32)
    v[2] = (v[2] + v[3]) & WORD_MASK
    v[3] = _rotl(v[3], 16) ^ v[2]
    v[0] = (v[0] + v[3]) & WORD_MASK
    v[3] = _rotl(v[3], 21) ^ v[0]
    v[2] = (v[2] + v[1]) & WORD_MASK
    v[1] = _rotl(v[1], 17) ^ v[2]
    v[2] = _rotl(v[2], 32)


def _siphash13(words: Sequence[Word]) -> Word:
    """SipHash-1-3 with keys (0, 0) (Rust's ``DefaultHasher``) of messages given as their 64-bit words.

    The last word holds the message's trailing bytes and its length (mod
    256) in the top byte. Words are Python ints (one message) or ``uint64``
    arrays (one message per element): the same arithmetic serves both.
    """
    v: list[Word] = [0x736F6D6570736575, 0x646F72616E646F6D, 0x6C7967656E657261, 0x7465646279746573]
    for word in words:
        v[3] ^= word
        _sip_round(v)
        v[0] ^= word
    v[2] ^= 0xFF
    for _ in range(3):
        _sip_round(v)
    return v[0] ^ v[1] ^ v[2] ^ v[3]


def _message_words(message: bytes) -> list[int]:
    """One message's 64-bit little-endian words, the last padded and carrying the length (see :func:`_siphash13`)."""
    whole = len(message) - len(message) % 8
    words = [int.from_bytes(message[o : o + 8], "little") for o in range(0, whole, 8)]
    return [*words, int.from_bytes(message[whole:], "little") | (len(message) & 0xFF) << 56]


def _block_words(messages: np.ndarray) -> list[np.ndarray]:
    """The words of each row of ``messages`` (``uint8``, one length), as ``uint64`` arrays (see :func:`_siphash13`)."""
    rows, length = messages.shape
    whole = length - length % 8
    words = [np.ascontiguousarray(messages[:, o : o + 8]).view("<u8").ravel() for o in range(0, whole, 8)]
    tail = np.zeros((rows, 8), dtype=np.uint8)
    tail[:, : length - whole] = messages[:, whole:]
    return [*words, tail.view("<u8").ravel() | np.uint64((length & 0xFF) << 56)]
