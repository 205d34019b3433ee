"""Assertion helpers shared by the tests."""

from __future__ import annotations

import pyarrow as pa


def rows_by_key(table: pa.Table, key=("id",)) -> dict:
    """A pyarrow table as {key tuple: row dict}, asserting keys are unique."""
    result = {}
    for row in table.to_pylist():
        k = tuple(row[c] for c in key)
        assert k not in result, f"duplicate key {k} in merged view"
        result[k] = row
    return result
