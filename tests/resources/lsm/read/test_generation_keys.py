"""Generations lookups keep asking answer through their key index: the same rows, fewer reads."""

from __future__ import annotations

import pyarrow as pa
import pytest

from resources.lsm.read import level_readers, merged_read
from resources.lsm.read.generation_keys import READS_BEFORE_KEY_INDEX
from tests.helpers import drop_pending_runs, rows_by_key

# Keys Lance's bloom filters cannot prune (uint16): every generation may hold every key, so every
# lookup meets every generation, the case a 100k-row generation's filter makes common.
SCHEMAS = {
    "one column": (pa.schema([("id", pa.uint16()), ("v", pa.string())]), ["id"]),
    "composite": (pa.schema([("region", pa.string()), ("id", pa.uint16()), ("v", pa.string())]), ["region", "id"]),
}


def key_of(key: list[str], n: int) -> object:
    return n if len(key) == 1 else {"region": f"r{n % 3}", "id": n}


def columns(key: list[str], numbers: range) -> dict[str, pa.Array]:
    out = {"id": pa.array(numbers, pa.uint16())}
    return out if len(key) == 1 else {"region": [f"r{n % 3}" for n in numbers], **out}


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_a_generation_asked_often_answers_through_its_key_index_as_by_reading_it(make_table, monkeypatch, kind):
    schema, key = SCHEMAS[kind]
    table = make_table(schema, key, num_shards=1)
    expected: dict[int, str] = {}
    for label, numbers in (("a", range(60)), ("b", range(40, 100)), ("c", range(90, 120))):
        table.write(pa.table({**columns(key, numbers), "v": [label] * len(numbers)}))
        table.close()
        expected.update(dict.fromkeys(numbers, label))
    table.write(pa.table({**columns(key, range(50, 55)), "_op": ["delete"] * 5}))
    table.close()
    for n in range(50, 55):
        del expected[n]
    drop_pending_runs(table)  # every lookup searches the generations
    reads: list[int] = []
    read = merged_read.generation_rows
    monkeypatch.setattr(merged_read, "generation_rows", lambda *a, **k: reads.append(1) or read(*a, **k))

    probes = [5, 45, 52, 95, 110, 130, 500]  # in one generation or two, deleted, never written
    for _ in range(READS_BEFORE_KEY_INDEX + 2):
        for n in probes:
            found = rows_by_key(table.lookup([key_of(key, n)]), tuple(key))
            assert {k[-1]: row["v"] for k, row in found.items()} == ({n: expected[n]} if n in expected else {})
    assert rows_by_key(table.lookup([key_of(key, n) for n in probes]), tuple(key)).keys() == {
        tuple(key_of(key, n).values()) if len(key) > 1 else (n,) for n in probes if n in expected
    }

    assert level_readers.builds_done(timeout=60)  # built off the lookups' path
    reads.clear()
    for n in (130, 500, 131, 7_000):  # held by no generation: none is read
        assert table.lookup([key_of(key, n)]).num_rows == 0
    assert reads == []
    assert table.lookup([key_of(key, 95)])["v"].to_pylist() == ["c"]
    assert len(reads) == 2, "only the two generations holding the key are read"
