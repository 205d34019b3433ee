"""Key set operations: the key index a run serves many lookups from."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from resources.lsm.read.key_sets import KeyIndex

rng = np.random.default_rng(12)
NUMBERS = rng.choice(10_000, 600, replace=False)
TABLES = {
    "int64": (pa.table({"id": pa.array(NUMBERS, pa.int64()), "v": NUMBERS}), ["id"]),
    "int32": (pa.table({"id": pa.array(NUMBERS - 5_000, pa.int32()), "v": NUMBERS}), ["id"]),
    # Non-ASCII text: the sorted index must order strings as Python compares them.
    "string": (pa.table({"id": [f"{'éz'[n % 2] * (n % 3)}k{n}" for n in NUMBERS], "v": NUMBERS}), ["id"]),
    "composite": (pa.table({"region": [f"r{n % 7}" for n in NUMBERS], "id": NUMBERS, "v": NUMBERS}), ["region", "id"]),
}


@pytest.mark.parametrize("kind", sorted(TABLES))
def test_a_key_index_finds_the_row_of_every_held_key_and_leaves_out_the_others(kind):
    table, key = TABLES[kind]
    index = KeyIndex(table.slice(0, 500), key)  # the last 100 rows' keys are not in the index
    asked = table.take(rng.permutation(600)[:120])
    rows = index.rows(asked.select(key))
    held = [row for row, n in enumerate(table["v"].to_pylist()[:500]) if n in set(asked["v"].to_pylist())]
    assert sorted(rows.tolist()) == held
    assert table.take(rows).select(key).to_pylist() == [
        k for k in asked.select(key).to_pylist() if k in table.slice(0, 500).select(key).to_pylist()
    ]
    assert index.rows(asked.select(key).slice(0, 0)).size == 0
