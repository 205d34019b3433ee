"""Streamed integer-key checks: every repeat is counted once, whatever batch or block it falls in."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from resources.lsm.quality.key_stats import integer_key_stats


def _batches(*columns: list) -> list[pa.RecordBatch]:
    return [pa.record_batch([pa.array(c, pa.int64())], ["id"]) for c in columns]


def test_repeats_within_and_across_batches_and_blocks_are_counted_and_sampled():
    far = 2**40  # another bitmap block
    stats = integer_key_stats(_batches([1, 2, 3, None, -5, far], [3, 3, 7, -5, far + 1], [None], []))
    assert (stats.rows, stats.nulls, stats.duplicates) == (12, 2, 3)  # 3 twice more, -5 once more
    assert sorted(stats.sample) == [-5, 3] and not stats.unique and not stats.not_null


def test_a_permutation_is_unique_and_the_sample_is_bounded():
    keys = np.random.default_rng(1).permutation(3 << 22) - (1 << 22)  # negatives too, 3 blocks
    stats = integer_key_stats(_batches(*np.array_split(keys, 7)))
    assert stats.unique and stats.not_null and stats.rows == len(keys)
    repeated = integer_key_stats(_batches(keys, keys[:50]), sample_size=5)
    assert repeated.duplicates == 50 and repeated.sample == sorted(keys[:50].tolist())[:5]


def test_keys_spread_over_more_blocks_than_the_budget_are_left_to_the_caller():
    spread = [i << 30 for i in range(5)]
    assert integer_key_stats(_batches(spread), max_bytes=4 << 22) is None
    assert integer_key_stats(_batches(spread), max_bytes=5 << 22).unique
