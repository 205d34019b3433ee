"""A 64-bit hash of primary keys (integer and string columns, one or several), for key indexes and stored hashes.

Many keys are hashed with numpy (:func:`key_hashes`): every pass runs
without Python's GIL, so a key index built on a background thread does not
stall lookups on other threads (a Python dict of 500k composite keys held
the GIL up to 140 ms at a time; hashing them, 7 ms). One key is hashed on
Python ints (:func:`key_hash`, a few µs, where numpy's cost per call would
be tens of µs); both run the same arithmetic, so they agree.

The hash is the engine's own, and stored (:mod:`~resources.lsm.read.key_hash_files`:
changing it means a new layout version there): a key's columns are folded
in order, integers by value (an int32 and an int64 holding the same number
agree) and strings by their UTF-8 bytes, eight at a time, then mixed by
Murmur3's finaliser. Equal keys always hash alike; callers compare the keys
of equal hashes before trusting them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa

Word: TypeAlias = Any
"""A 64-bit word of one key (a Python int) or of many (a ``uint64`` array): 64-bit hash arithmetic written
once serves both (here and in :mod:`~resources.lsm.read.pk_bloom`).

``Any``: numpy's stubs type ``uint64`` arithmetic with Python ints as float."""

WORD_MASK = (1 << 64) - 1
"""Python ints grow: ``& WORD_MASK`` keeps them to 64 bits, as ``uint64`` arrays are."""
_GOLDEN = 0x9E37_79B9_7F4A_7C15
"""An odd 64-bit constant (2^64 / golden ratio): multiplying by it spreads low bits upwards."""
NUMPY_HASHED_KEYS = 16
"""Keys from which :func:`key_hashes` costs less than :func:`key_hash` on each (~45 µs a call against ~2 µs a key)."""
_LOW_BYTES = np.array([(1 << (8 * n)) - 1 for n in range(9)], dtype=np.uint64)
"""``_LOW_BYTES[n]``: a mask of a word's ``n`` low bytes."""


def key_hash(values: Sequence[int | str]) -> int:
    """The hash of one key (its column values, in key order), as :func:`key_hashes` gives it."""
    hashed = 0
    for value in values:
        hashed = _fold(hashed, value & WORD_MASK if isinstance(value, int) else _string_bits(value.encode()))
    return int(_finish(hashed))


def key_hashes(table: pa.Table | pa.RecordBatch, key: Sequence[str]) -> np.ndarray:
    """The hash of each row's key (``uint64``): equal keys hash alike, whatever table they are in.

    The key columns must be integers or strings. A null hashes as whatever
    its slot holds.
    """
    hashed: np.ndarray | None = None
    for name in key:
        column = table.column(name)
        bits = _column_bits(column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column)
        hashed = bits if hashed is None else _fold(hashed, bits)  # folding into 0 is the identity
    finished: np.ndarray = _finish(hashed)
    return finished


def _fold(hashed: Word, bits: Word) -> Word:
    """``hashed`` with one more 64-bit word folded in."""
    return _wrapped(hashed * _GOLDEN) ^ bits


def _finish(hashed: Word) -> Word:
    """Murmur3's 64-bit finaliser: every input bit reaches every output bit."""
    hashed ^= hashed >> 33
    hashed = _wrapped(hashed * 0xFF51_AFD7_ED55_8CCD)
    hashed ^= hashed >> 33
    hashed = _wrapped(hashed * 0xC4CE_B9FE_1A85_EC53)
    return hashed ^ (hashed >> 33)


def _wrapped(word: Word) -> Word:
    """``word`` modulo 2^64: ``uint64`` arrays wrap by themselves, Python ints grow."""
    return word & WORD_MASK if isinstance(word, int) else word


def _string_bits(data: bytes) -> int:
    """One string's bytes folded into a word: its length, then its little-endian 8-byte words (the last one short)."""
    bits = len(data)
    for start in range(0, len(data), 8):
        bits = _fold(bits, int.from_bytes(data[start : start + 8], "little"))
    return bits


def _column_bits(column: pa.Array) -> np.ndarray:
    """Each value as a word to fold (integers as themselves, strings by :func:`_string_bits`)."""
    if not len(column):
        return np.zeros(0, dtype=np.uint64)
    if pa.types.is_integer(column.type):
        values: np.ndarray = (column.fill_null(0) if column.null_count else column).to_numpy()
        return values.astype(np.int64).view(np.uint64)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return _strings_bits(column)
    raise TypeError(f"key column of type {column.type}: only integer and string keys are hashed")


def _strings_bits(column: pa.Array) -> np.ndarray:
    """:func:`_string_bits` of every string of ``column``, a pass per eight bytes of the longest one."""
    offset_type = np.int64 if pa.types.is_large_string(column.type) else np.int32
    _, offsets_buffer, data_buffer = column.buffers()
    offsets = np.frombuffer(offsets_buffer, offset_type, count=column.offset + len(column) + 1)[column.offset :]
    first, size = int(offsets[0]), int(offsets[-1] - offsets[0])
    # The strings' bytes and eight zero bytes after them: an 8-byte word starting at any of them can be read.
    data = np.zeros(size + 8, dtype=np.uint8)
    if data_buffer is not None:
        data[:size] = np.frombuffer(data_buffer, np.uint8, count=size, offset=first)
    words = np.ndarray((size + 1,), dtype="<u8", buffer=data, strides=(1,))  # words[i]: bytes i..i+7
    starts = (offsets[:-1] - first).astype(np.int64)
    lengths = np.diff(offsets).astype(np.int64)
    shortest, longest = int(lengths.min(initial=0)), int(lengths.max(initial=0))
    bits = lengths.astype(np.uint64)
    for skip in range(0, longest, 8):
        word = np.take(words, np.minimum(starts + skip, size))  # a string that ended reads a word it then drops
        if shortest < skip + 8:  # the last word of some strings: only their own bytes
            word &= _LOW_BYTES[np.clip(lengths - skip, 0, 8)]
        folded = _fold(bits, word)
        bits = folded if shortest > skip else np.where(lengths > skip, folded, bits)
    return bits
