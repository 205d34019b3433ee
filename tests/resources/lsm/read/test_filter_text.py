"""Filters Lance would ignore or misread are refused; an empty filter is no filter."""

from __future__ import annotations

import lance
import pyarrow as pa
import pytest

from resources.lsm.read import key_spread
from resources.lsm.read.filter_text import checked_filter, keys_filter


@pytest.mark.parametrize("empty", [None, "", "   ", "\n"])
def test_empty_filters_are_no_filter(empty):
    assert checked_filter(empty) is None


@pytest.mark.parametrize("kept", ["price > 1", "name = 'a;b'", "name = 'it''s; fine'", '"odd;name" = 1'])
def test_semicolons_inside_literals_are_kept(kept):
    assert checked_filter(kept) == kept


def test_a_semicolon_outside_literals_is_refused_by_every_reader(make_table):
    table = make_table()
    table.write(pa.table({"id": [1, 2], "name": ["a", "b"], "price": [1.0, 2.0]}))
    for read in (
        lambda f: table.read(filter=f),
        lambda f: table.count(filter=f),
        lambda f: table.search([0.0], 1, filter=f),
    ):
        with pytest.raises(ValueError, match="Lance would ignore everything after the ';'"):
            read("1=1; DROP TABLE x")
    assert table.read(filter="").num_rows == 2 and table.count(filter="  ") == 2
    assert table.count(filter="price > 1") == 1


def composite_keys(pairs: list[tuple[str, int]]) -> pa.Table:
    return pa.table({"region": [r for r, _ in pairs], "id": pa.array([i for _, i in pairs], pa.int64())})


def test_one_composite_key_is_looked_up_on_the_column_most_selective_in_the_base():
    one = composite_keys([("r3", 123)])
    assert keys_filter(one, ["region", "id"], {"region": 16, "id": 65_536}) == "`id` IN (123)"
    # Many tenants, few ids each: the region narrows the base more than the id.
    assert keys_filter(one, ["region", "id"], {"region": 50_000, "id": 10}) == "`region` IN ('r3')"


def test_without_a_spread_many_composite_keys_are_looked_up_on_their_most_distinct_column():
    many = composite_keys([(f"r{i % 16}", i) for i in range(1000)])
    assert keys_filter(many, ["region", "id"]).startswith("`id` IN (0, 1, 2")


def test_the_spread_of_a_composite_key_is_sampled_once_per_table(tmp_path, monkeypatch):
    keys = composite_keys([(f"r{i % 16}", i) for i in range(5000)])
    dataset = lance.write_dataset(keys, str(tmp_path / "base"))
    assert key_spread.key_spread(dataset, ["id"]) == {}
    assert key_spread.key_spread(dataset, ["region", "id"]) == {"region": 16, "id": 5000}
    monkeypatch.setattr(key_spread.pc, "count_distinct", None)  # a second sample would fail
    assert key_spread.key_spread(lance.dataset(dataset.uri), ["region", "id"]) == {"region": 16, "id": 5000}
