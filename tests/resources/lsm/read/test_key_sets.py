"""Key set operations: membership and joins by key, and the key index a run serves many lookups from."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from resources.lsm.read.key_sets import KeyIndex, key_join, key_mask

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


@pytest.mark.parametrize("kind", sorted(TABLES))
@pytest.mark.parametrize("asked", [1, 3], ids=["one key: compared", "several keys: hashed"])
def test_membership_by_key_holds_exactly_the_rows_of_the_keys_asked(kind, asked):
    table, key = TABLES[kind]
    # A null key on the left never matches (Lance would refuse it; a key column may still be nullable).
    left = pa.concat_tables([table, table.slice(0, 1).set_column(0, table.field(0), pa.nulls(1, table.field(0).type))])
    right = table.take([7, 300, 599][:asked]).select(key)
    wanted = {tuple(r.values()) for r in right.to_pylist()}
    expected = [tuple(r[c] for c in key) in wanted for r in left.to_pylist()]
    assert key_mask(left, right, key).tolist() == expected
    assert key_join(left, right, key, "left semi").num_rows == asked
    assert key_join(left, right, key, "left anti").num_rows == left.num_rows - asked
