"""Assertion and set-up helpers shared by the tests."""

from __future__ import annotations

import pyarrow as pa

from resources.lsm import LsmTable


def rows_by_key(table: pa.Table, key=("id",)) -> dict:
    """A pyarrow table as {key tuple: row dict}, asserting keys are unique."""
    result = {}
    for row in table.to_pylist():
        k = tuple(row[c] for c in key)
        assert k not in result, f"duplicate key {k} in merged view"
        result[k] = row
    return result


def keys_in_bucket(table: LsmTable, bucket: int, count: int, start: int = 0) -> list[int]:
    """``count`` int64 keys (from ``start`` up) that Lance routes to ``bucket``."""
    candidates = pa.table({"id": pa.array(range(start, start + 64 * count), pa.int64())})
    hits = candidates.filter(pa.array(table.buckets(candidates) == bucket))["id"].to_pylist()
    assert len(hits) >= count
    return hits[:count]


def write_generation(table: LsmTable, keys: list[int], label: str) -> None:
    """Upsert ``keys`` (events schema) and close the writers: one new generation per touched shard."""
    table.write(pa.table({"id": pa.array(keys, pa.int64()), "customer": [label] * len(keys),
                          "amount": [float(k) for k in keys], "status": ["new"] * len(keys)}))
    table.close()
