"""Primary-key uniqueness and non-null of a large level, streamed, in bounded memory.

For a single integer key, :func:`integer_key_stats` reads the key column batch
by batch and marks every value in a bitmap of seen keys, kept in blocks of
``2**22`` values allocated on first use: a value seen before is a duplicate.
Memory is one byte per value of the blocks the keys touch (4 MiB per block),
so dense keys such as a sequence of 64M ids take 64 MiB, whatever the number
of rows. Keys spread too thinly for that (more than ``max_bytes`` of blocks)
are left to the caller's other validation (Spark), as is any other key type.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

_BLOCK_BITS = 22
_BLOCK = 1 << _BLOCK_BITS
DEFAULT_MAX_BYTES = 512 << 20
"""Bitmap blocks one check may allocate (128 blocks of 4 MiB)."""


@dataclass
class KeyStats:
    """Rows read, null keys and duplicate key occurrences (beyond the first) of one key column."""

    rows: int = 0
    nulls: int = 0
    duplicates: int = 0
    sample: list[int] = field(default_factory=list)

    @property
    def unique(self) -> bool:
        return self.duplicates == 0

    @property
    def not_null(self) -> bool:
        return self.nulls == 0


def integer_key_stats(
    batches: Iterable[pa.RecordBatch], max_bytes: int = DEFAULT_MAX_BYTES, sample_size: int = 20
) -> KeyStats | None:
    """Stats of the single integer column of ``batches``, or ``None`` when its keys need more than ``max_bytes``.

    ``sample`` holds up to ``sample_size`` duplicated values, in the order
    their repeats were read.
    """
    stats = KeyStats()
    blocks: dict[int, np.ndarray] = {}
    for batch in batches:
        column = batch.column(0)
        stats.rows += len(column)
        stats.nulls += column.null_count
        keys = np.sort(column.drop_null().to_numpy().astype(np.int64, copy=False))
        if not len(keys):
            continue
        highs = keys >> _BLOCK_BITS  # sorted, so each block's keys are one slice
        starts = np.flatnonzero(np.diff(highs, prepend=highs[0] - 1))
        for start, end in zip(starts, [*starts[1:], len(keys)], strict=True):
            high = int(highs[start])
            if high not in blocks:
                if (len(blocks) + 1) * _BLOCK > max_bytes:
                    return None
                blocks[high] = np.zeros(_BLOCK, dtype=np.bool_)
            _mark(blocks[high], keys[start:end], high, stats, sample_size)
    return stats


def _mark(seen: np.ndarray, keys: np.ndarray, high: int, stats: KeyStats, sample_size: int) -> None:
    """Mark ``keys`` (all in block ``high``) as seen; count repeats within them and of earlier keys."""
    low, counts = np.unique(keys & (_BLOCK - 1), return_counts=True)
    repeated = seen[low]
    # Every occurrence is a duplicate, except the first of a value not seen before.
    stats.duplicates += int(counts.sum() - np.count_nonzero(~repeated))
    offending = low[repeated | (counts > 1)]
    room = sample_size - len(stats.sample)
    if room > 0 and len(offending):
        stats.sample += [int(v) for v in (offending[:room] + (high << _BLOCK_BITS))]
    seen[low] = True
