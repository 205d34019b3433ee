"""Base fragments' stored key hashes: written once per fragment, and what a scan finds through them."""

from __future__ import annotations

import lance
import numpy as np
import pyarrow as pa
import pytest

from resources.lsm import LsmTable
from resources.lsm.read import merged_read
from resources.lsm.read.key_hash_files import (
    computed_key_hashes,
    key_hash_file,
    read_key_hashes,
    write_missing_key_hashes,
)
from resources.lsm.read.key_hashes import key_hashes
from resources.lsm.read.stored_hash_rows import StoredHashRows
from tests.helpers import drop_pending_runs, rows_kept

VECTOR = pa.list_(pa.float32(), 2)
SCHEMA = pa.schema([pa.field("id", pa.string(), nullable=False), pa.field("value", pa.int64()), ("vec", VECTOR)])
"""A nested column: Arrow's join cannot carry it, so scans find the pending keys' rows through stored hashes."""


def rows(keys: range, value: int) -> pa.Table:
    ids = [f"k{i:05d}" for i in keys]
    return pa.table({"id": ids, "value": [value] * len(ids), "vec": [[float(value), 0.0]] * len(ids)}, schema=SCHEMA)


@pytest.fixture
def table(tmp_path) -> LsmTable:
    """A string-keyed table whose base is 4 fragments of 500 rows, key hashes stored."""
    table = LsmTable.create(str(tmp_path / "t.lance"), SCHEMA, ["id"], num_shards=2)
    lance.write_dataset(rows(range(2000), 0), table.uri, mode="append", max_rows_per_file=500)
    assert write_missing_key_hashes(table.handle.storage, lance.dataset(table.uri), ["id"]) == 4
    return table


def test_hashes_are_written_once_per_fragment(table):
    dataset = lance.dataset(table.uri)
    assert write_missing_key_hashes(table.handle.storage, dataset, ["id"]) == 0
    for fragment in dataset.get_fragments():
        keys = fragment.to_table(columns=["id"])
        assert read_key_hashes(table.handle.storage, fragment).tolist() == key_hashes(keys, ["id"]).tolist()


def test_a_fragments_hashes_cover_its_deleted_rows_in_place(table):
    """A read of a version from before a deletion still meets those rows: each row keeps its slot."""
    dataset = lance.dataset(table.uri)
    dataset.delete("id IN ('k00001', 'k00002', 'k00600')")
    fragment = lance.dataset(table.uri).get_fragment(0)
    assert fragment.count_rows() == 498
    hashes = computed_key_hashes(lance.dataset(table.uri), fragment, ["id"])
    assert hashes.tolist() == key_hashes(rows(range(500), 0), ["id"]).tolist()


def test_a_row_whose_hash_is_a_pending_keys_but_whose_key_is_not_stays(table):
    dataset = lance.dataset(table.uri)
    fragment = dataset.get_fragment(0)
    forged = read_key_hashes(table.handle.storage, fragment).copy()
    forged[5] = forged[9]  # k00005 now "hashes" like k00009: a collision
    table.handle.storage.write_bytes_atomic(key_hash_file(fragment), forged.tobytes())
    pending = pa.table({"id": ["k00009", "k01999"]})
    found = StoredHashRows.of(table.handle.storage, dataset, pending, ["id"])
    assert rows_kept(found, dataset) == [f"k{i:05d}" for i in range(2000) if i not in (9, 1999)]


def test_without_every_fragments_hashes_the_scan_looks_keys_up_another_way(table):
    dataset = lance.dataset(table.uri)
    table.handle.storage.delete_file(key_hash_file(dataset.get_fragment(2)))
    assert StoredHashRows.of(table.handle.storage, dataset, pa.table({"id": ["k00001"]}), ["id"]) is None


def test_hashes_damaged_after_the_scan_found_them_are_computed_from_the_keys(table):
    dataset = lance.dataset(table.uri)
    pending = pa.table({"id": ["k00001", "k00777", "k01500"]})
    table.handle.storage.write_bytes_atomic(key_hash_file(dataset.get_fragment(1)), b"\0" * 8)  # 1 row of 500
    found = StoredHashRows.of(table.handle.storage, dataset, pending, ["id"])
    assert rows_kept(found, dataset) == [f"k{i:05d}" for i in range(2000) if i not in (1, 777, 1500)]


@pytest.mark.parametrize("through", ["scan", "time travel"])
def test_merged_reads_through_stored_hashes_match_the_changes(table, through, monkeypatch):
    before = table.version()
    table.write(rows(range(0, 2000, 3), 1))
    table.write(pa.table({"id": [f"k{i:05d}" for i in range(1, 2000, 5)], "_op": ["delete"] * 400}))
    table.close()
    drop_pending_runs(table)
    found: list[int] = []
    monkeypatch.setattr(merged_read.StoredHashRows, "of", counted(merged_read.StoredHashRows.of, found))
    expected = {f"k{i:05d}": 1 if i % 3 == 0 else 0 for i in range(2000) if i % 5 != 1}
    if through == "time travel":  # a merge since deleted the superseded base rows; the hashes are the same
        changes_version = table.version()
        table.compact(max_rows_per_pass=10**9)
        read = table.read(as_of=changes_version)
        assert rows_of(table.read(as_of=before)) == {f"k{i:05d}": 0 for i in range(2000)}
    else:
        read = table.read()
        # A filtered scan: the base batches hold only some rows, the rows found may not be among them.
        assert rows_of(table.read(filter="value = 0")) == {k: v for k, v in expected.items() if v == 0}
    assert rows_of(read) == expected
    assert found and all(found)  # every scan found the rows through the stored hashes


def rows_of(read: pa.Table) -> dict[str, int]:
    return dict(zip(read["id"].to_pylist(), read["value"].to_pylist(), strict=True))


def counted(of, found: list[int]):
    """``StoredHashRows.of`` noting into ``found`` whether each call found every fragment's hashes."""

    def of_and_count(*args, **kwargs):
        rows = of(*args, **kwargs)
        found.append(rows is not None)
        return rows

    return of_and_count


def test_gc_deletes_the_hashes_of_fragments_no_retained_version_holds(table):
    table.write(rows(range(0, 2000, 2), 1))
    table.close()
    table.compact(max_rows_per_pass=10**9)  # deletes superseded rows, appends fragments, stores their hashes
    lance.dataset(table.uri).optimize.compact_files(target_rows_per_fragment=10_000)  # one new fragment
    table.build_pending_runs()
    reclaimed = table.gc(orphan_grace_seconds=0, wal_grace_seconds=0, older_than=None, retain_versions=1)
    dataset = lance.dataset(table.uri)
    left = {entry.name for entry in table.handle.storage.list_files("_lsm_key_hashes/v1")}
    assert left == {key_hash_file(f).rsplit("/", 1)[1] for f in dataset.get_fragments()}
    assert reclaimed.key_hashes.count >= 4 and reclaimed.key_hashes.bytes > 0
    assert rows_of(table.read()) == {f"k{i:05d}": 1 if i % 2 == 0 else 0 for i in range(2000)}
    rewritten = dataset.get_fragments()[0]
    stored = read_key_hashes(table.handle.storage, rewritten)
    assert np.array_equal(stored, computed_key_hashes(dataset, rewritten, ["id"]))
