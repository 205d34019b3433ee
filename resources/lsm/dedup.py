"""Newest-wins deduplication of an ordered table by primary key."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_ROW = "__lsm_row"


def keep_last_per_key(table: pa.Table, primary_key: list[str]) -> pa.Table:
    """Keep the last row of every key (rows later in ``table`` are newer).

    The result lists the surviving rows in their original order.
    """
    if table.num_rows == 0:
        return table
    numbered = table.append_column(_ROW, pa.array(np.arange(table.num_rows, dtype=np.int64)))
    last = numbered.select([*primary_key, _ROW]).group_by(primary_key, use_threads=False).aggregate(
        [(_ROW, "max")]
    )
    keep = np.zeros(table.num_rows, dtype=bool)
    keep[last[f"{_ROW}_max"].to_numpy()] = True  # a mask keeps the order without sorting the winners
    return table.filter(pa.array(keep))
