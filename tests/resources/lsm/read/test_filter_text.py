"""Filters Lance would ignore or misread are refused; an empty filter is no filter."""

from __future__ import annotations

import pyarrow as pa
import pytest

from resources.lsm.read.filter_text import checked_filter


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
