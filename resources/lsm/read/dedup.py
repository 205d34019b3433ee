"""Newest-wins deduplication of an ordered table by primary key."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_ROW = "__lsm_row"


def keep_last_per_key(table: pa.Table, primary_key: list[str]) -> pa.Table:
    """Keep the last row of every key (rows later in ``table`` are newer).

    The result lists the surviving rows in their original order; it is
    ``table`` itself when every key occurs once (no copy).
    """
    if table.num_rows == 0:
        return table
    last = last_per_key(table, primary_key)
    return table if last.all() else table.filter(pa.array(last))


def last_per_key(table: pa.Table, primary_key: list[str]) -> np.ndarray:
    """For each row, whether it is the last row of its key (a boolean mask)."""
    keep = np.zeros(table.num_rows, dtype=bool)
    if table.num_rows:
        numbered = table.select(primary_key).append_column(_ROW, pa.array(np.arange(table.num_rows, dtype=np.int64)))
        last = numbered.group_by(primary_key, use_threads=False).aggregate([(_ROW, "max")])
        keep[last[f"{_ROW}_max"].to_numpy()] = True  # a mask keeps the order without sorting the winners
    return keep
