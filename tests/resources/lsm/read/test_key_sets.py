"""Key set operations: membership and joins by key, and the key index a run serves many lookups from."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, strategies as st

from resources.lsm.read import key_hashes, key_sets
from resources.lsm.read.key_sets import FewKeys, KeyIndex, key_join, key_mask, laid_over, spans, value_of_each_key

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
@pytest.mark.parametrize("count", [5, 120], ids=["a few keys: one by one", "many keys: by numpy"])
def test_a_key_index_finds_the_row_of_every_held_key_and_leaves_out_the_others(kind, count):
    table, key = TABLES[kind]
    index = KeyIndex(table.slice(0, 500), key)  # the last 100 rows' keys are not in the index
    asked = table.take(rng.permutation(600)[:count])
    rows = index.rows(asked.select(key))
    held = [row for row, n in enumerate(table["v"].to_pylist()[:500]) if n in set(asked["v"].to_pylist())]
    assert rows.tolist() == held
    assert index.rows(asked.select(key).slice(0, 0)).size == 0


@pytest.mark.parametrize("kind", ["string", "composite"])
def test_a_lookups_keys_prepared_once_answer_every_index_it_asks(kind):
    table, key = TABLES[kind]
    indexes = [KeyIndex(table.slice(start, 200), key) for start in (0, 150, 400)]  # overlapping, as entries
    asked = table.take([5, 160, 420, 599]).select(key)
    nulled = pa.concat_tables(
        [asked, asked.slice(0, 1).set_column(0, asked.field(0), pa.nulls(1, asked.field(0).type))]
    )
    few = FewKeys(nulled, key)  # a null is no key
    assert [index.rows(nulled, few).tolist() for index in indexes] == [index.rows(asked).tolist() for index in indexes]
    assert [len(index.rows(asked)) for index in indexes] == [2, 1, 2]  # rows 5 and 160, 160, 420 and 599


@pytest.mark.parametrize("kind", ["string", "composite"])
@pytest.mark.parametrize("count", [5, 120], ids=["a few keys: one by one", "many keys: by numpy"])
def test_a_key_index_tells_apart_keys_whose_hashes_collide(kind, count, monkeypatch):
    table, key = TABLES[kind]
    # Four hashes for 600 keys: every key found shares its hash with ~150 others.
    monkeypatch.setattr(key_sets, "key_hash", lambda values: key_hashes.key_hash(values) % 4)
    monkeypatch.setattr(key_sets, "key_hashes", lambda rows, key: key_hashes.key_hashes(rows, key) % np.uint64(4))
    twice = pa.concat_tables([table.slice(0, 500), table.slice(10, 1)])  # row 500 holds row 10's key again
    index = KeyIndex(twice, key)
    asked = pa.concat_tables([table.slice(10, 1), table.take(rng.permutation(600)[:count])]).select(key)
    wanted = {tuple(k.values()) for k in asked.to_pylist()}
    held = [row for row, k in enumerate(twice.select(key).to_pylist()) if tuple(k.values()) in wanted]
    assert 10 in held and 500 in held
    assert index.rows(asked).tolist() == held


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


@pytest.mark.parametrize("kind", sorted(TABLES))
def test_the_value_of_each_key_comes_from_the_row_holding_it_streamed_in_batches(kind):
    table, key = TABLES[kind]
    held = table.slice(0, 500)
    batches = pa.RecordBatchReader.from_batches(held.schema, held.to_batches(max_chunksize=64))
    # Keys held and not (the last 100), in another order, and a null key, which no row holds.
    asked = table.take(rng.permutation(600)).select(key)
    asked = pa.concat_tables([asked, asked.slice(0, 1).set_column(0, asked.field(0), pa.nulls(1, asked.field(0).type))])
    values = value_of_each_key(batches, asked, "v").to_pylist()
    v_of = {tuple(r[c] for c in key): r["v"] for r in held.to_pylist()}
    assert values == [v_of.get(tuple(r.values())) for r in asked.to_pylist()]
    assert sum(v is not None for v in values) == 500


def test_a_composite_key_joined_on_its_id_alone_keeps_only_rows_of_the_same_region():
    table, key = TABLES["composite"]
    # Rows 0-49 hold their ids again in region "zz": an id pairs a key with rows of two regions.
    elsewhere = table.slice(0, 50).set_column(0, "region", pa.array(["zz"] * 50))
    elsewhere = elsewhere.set_column(2, "v", pa.array(-np.arange(1, 51)))
    held = pa.concat_tables([table.slice(0, 500), elsewhere])
    batches = pa.RecordBatchReader.from_batches(held.schema, held.to_batches(max_chunksize=64))
    asked = pa.concat_tables([table.take(rng.permutation(600)), elsewhere.slice(0, 20)]).select(key)
    values = value_of_each_key(batches, asked, "v", on=["id"]).to_pylist()
    v_of = {(r["region"], r["id"]): r["v"] for r in held.to_pylist()}
    assert values == [v_of.get((r["region"], r["id"])) for r in asked.to_pylist()]
    assert sum(v is not None for v in values) == 520


@pytest.mark.parametrize("kind", sorted(TABLES))
def test_a_level_laid_over_another_keeps_the_newest_row_of_every_key(kind):
    table, key = TABLES[kind]
    older, newer = table.slice(0, 400), table.slice(300, 300)  # rows 300-399 are in both
    newer = newer.set_column(newer.schema.get_field_index("v"), "v", pa.array(np.full(300, -1)))
    laid = laid_over(older, newer, key)
    assert laid.num_rows == 600
    newest = {tuple(r[c] for c in key): r["v"] for r in laid.to_pylist()}
    assert newest == {tuple(r[c] for c in key): (-1 if n >= 300 else r["v"]) for n, r in enumerate(table.to_pylist())}


@given(st.lists(st.tuples(st.integers(0, 100), st.integers(0, 3)), max_size=20))
def test_spans_lists_each_range_in_order(ranges):
    first = np.array([f for f, _ in ranges], dtype=np.int64)
    counts = np.array([c for _, c in ranges], dtype=np.int64)
    assert spans(first, counts).tolist() == [f + n for f, c in ranges for n in range(c)]
