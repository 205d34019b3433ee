"""Point lookups of the base through the fragments' key indexes: the rows Lance's query finds, never another's."""

from __future__ import annotations

import logging

import lance
import numpy as np
import pyarrow as pa
import pytest

from resources.lsm import LsmTable
from resources.lsm.format.layout import KEY_INDEX_DIR
from resources.lsm.maintenance.compaction import MaintenancePolicy, compact
from resources.lsm.read import base_key_index, merged_read
from resources.lsm.read.base_key_index import BaseKeyIndex
from resources.lsm.read.deletion_vector import base_row_addresses
from resources.lsm.read.key_hash_files import key_hash_file, write_missing_key_hashes
from resources.lsm.read.key_hashes import key_hash
from resources.lsm.read.stored_hash_rows import StoredHashRows
from tests.helpers import rows_kept

SCHEMAS = {
    "string": pa.schema([pa.field("id", pa.string(), nullable=False), pa.field("value", pa.int64())]),
    "int64": pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("value", pa.int64())]),
    "composite": pa.schema(
        [
            pa.field("region", pa.string(), nullable=False),
            pa.field("id", pa.int32(), nullable=False),
            ("value", pa.int64()),
        ]
    ),
}
KEYS = {"string": ["id"], "int64": ["id"], "composite": ["region", "id"]}


def key_of(kind: str, i: int) -> tuple:
    return {"string": (f"k{i:05d}",), "int64": (i,), "composite": (f"r{i % 3}", i)}[kind]


def rows(kind: str, ids: range | list[int], value: int) -> pa.Table:
    keys = [key_of(kind, i) for i in ids]
    columns = {name: [k[n] for k in keys] for n, name in enumerate(KEYS[kind])}
    return pa.table({**columns, "value": [value] * len(keys)}, schema=SCHEMAS[kind])


def index_used(monkeypatch) -> list[int]:
    """Count the lookups answered through a base key index."""
    used: list[int] = []
    rows_of = BaseKeyIndex.rows
    monkeypatch.setattr(BaseKeyIndex, "rows", lambda self, *args: used.append(1) or rows_of(self, *args))
    return used


def make_table(path: str, kind: str) -> LsmTable:
    """A table whose base is 4 fragments of 500 rows (value 0), each with its key index."""
    table = LsmTable.create(path, SCHEMAS[kind], KEYS[kind], num_shards=2)
    lance.write_dataset(rows(kind, range(2000), 0), table.uri, mode="append", max_rows_per_file=500)
    assert write_missing_key_hashes(table.handle.storage, lance.dataset(table.uri), KEYS[kind], (KEY_INDEX_DIR,)) == 4
    return table


@pytest.fixture
def table(tmp_path) -> LsmTable:
    return make_table(str(tmp_path / "t.lance"), "string")


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_lookups_through_the_key_index_find_each_keys_live_row(tmp_path, kind, monkeypatch):
    """Rows merged since (their old rows deleted, new ones in new fragments), pending changes, absent keys."""
    table = make_table(str(tmp_path / "t.lance"), kind)
    table.write(rows(kind, range(0, 2000, 4), 1))
    table.close()
    table.compact()  # the updated rows move to new fragments, indexed by the merge's run build
    table.write(rows(kind, range(1, 2000, 4), 2))
    deleted = rows(kind, range(2, 2000, 8), 0).select(KEYS[kind])
    table.write(deleted.append_column("_op", pa.array(["delete"] * deleted.num_rows)))
    used = index_used(monkeypatch)
    asked = [*range(40), 1999, 5000]
    found = table.lookup([dict(zip(KEYS[kind], key_of(kind, i), strict=True)) for i in asked])
    expected = {key_of(kind, i): 1 if i % 4 == 0 else 2 if i % 4 == 1 else 0 for i in asked if i < 2000 and i % 8 != 2}
    assert {tuple(r[k] for k in KEYS[kind]): r["value"] for r in found.to_pylist()} == expected
    assert used == [1]
    assert table.lookup([dict(zip(KEYS[kind], key_of(kind, 5000), strict=True))]).num_rows == 0
    # One key at a time (each fragment's index searched a hash at a time): moved by the merge (the
    # index of its old fragment still offers its deleted row), unchanged, deleted since.
    for i in (0, 3, 10, 1999):
        one = table.lookup([dict(zip(KEYS[kind], key_of(kind, i), strict=True))])
        found_one = [(tuple(r[k] for k in KEYS[kind]), r["value"]) for r in one.to_pylist()]
        assert found_one == ([(key_of(kind, i), expected[key_of(kind, i)])] if i % 8 != 2 else [])


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_runs_and_counts_find_each_keys_live_base_row_through_the_key_index(tmp_path, kind, monkeypatch):
    """The rows Lance's scan finds: not the rows a merge deleted since their index was written, nor absent keys."""
    table = make_table(str(tmp_path / "t.lance"), kind)
    table.write(rows(kind, range(0, 2000, 4), 1))
    table.close()
    table.compact()  # the updated rows move to new fragments; their old rows stay in the old indexes
    dataset = lance.dataset(table.uri)
    keys = rows(kind, [0, 1, 402, 1203, 1999, 5000, 5001], 0).select(KEYS[kind])  # few: taken by address
    index = BaseKeyIndex.of(table.handle.storage, dataset)
    used = index_used(monkeypatch)

    through_index = base_row_addresses(dataset, keys, KEYS[kind], index)
    assert used == [1]
    assert through_index.to_pylist() == base_row_addresses(dataset, keys, KEYS[kind]).to_pylist()
    assert through_index.null_count == 2
    table.write(keys.append_column("_op", pa.array(["delete"] * keys.num_rows)))
    assert LsmTable.open(table.uri).count() == 2000 - (keys.num_rows - 2)
    assert used == [1, 1]


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_a_merge_from_runs_stores_the_key_index_of_the_fragments_it_writes(tmp_path, kind, monkeypatch):
    """Before any run build reads their keys back: the files reading them back would store, byte for byte."""
    table = make_table(str(tmp_path / "t.lance"), kind)
    table.write(rows(kind, [*range(0, 2000, 3), *range(2000, 2100)], 1))  # updates and new keys
    table.close()
    table.build_pending_runs()  # the merge below is then join-free
    result = compact(table.handle, table.handle.shard_ids, maintenance=None)
    assert sum(s.join_free_passes for s in result.shards) == sum(s.passes for s in result.shards) > 0
    dataset = lance.dataset(table.uri)
    storage = table.handle.storage
    paths = [key_hash_file(fragment, KEY_INDEX_DIR) for fragment in dataset.get_fragments()]
    stored = {path: storage.read_bytes(path) for path in paths}
    for path in paths:
        storage.delete_file(path)
    assert write_missing_key_hashes(storage, dataset, KEYS[kind], (KEY_INDEX_DIR,)) == len(paths)
    assert {path: storage.read_bytes(path) for path in paths} == stored
    used = index_used(monkeypatch)
    found = LsmTable.open(table.uri).lookup([dict(zip(KEYS[kind], key_of(kind, i), strict=True)) for i in (3, 4, 2050)])
    assert sorted(found["value"].to_pylist()) == [0, 1, 1]
    assert used == [1]


def test_fragments_a_merges_tidy_up_rewrote_get_their_key_index_with_it(table, monkeypatch):
    table.write(rows("string", range(0, 2000, 2), 1))
    table.close()
    tidy = MaintenancePolicy(max_small_fragments=0, small_fragment_rows=1 << 30)  # rewrite every fragment
    result = compact(table.handle, table.handle.shard_ids, maintenance=tidy)
    assert result.maintenance is not None and result.maintenance.fragments_removed > 0
    dataset = lance.dataset(table.uri)
    assert BaseKeyIndex.of(table.handle.storage, dataset) is not None  # every fragment has its index
    used = index_used(monkeypatch)
    assert LsmTable.open(table.uri).lookup(["k00002", "k00003"])["value"].to_pylist() == [1, 0]
    assert used == [1]


@pytest.mark.parametrize("asked", ["k00009", "k99999"])
def test_a_row_whose_hash_is_the_asked_keys_but_whose_key_is_not_is_never_returned(table, asked):
    """Two keys sharing a hash: the index offers the rows of both, the lookup keeps the one of the key asked."""
    dataset = lance.dataset(table.uri)
    hash_row_7_like(table, asked)
    offered, _ = BaseKeyIndex.of(table.handle.storage, dataset).search(np.array([key_hash([asked])], np.uint64)).pairs()
    assert 7 in offered.tolist()
    expected = [{"id": asked, "value": 0}] if asked < "k02000" else []
    assert LsmTable.open(table.uri).lookup([asked]).to_pylist() == expected


def test_a_scan_searching_the_index_drops_only_the_rows_of_the_keys_it_searched(table):
    hash_row_7_like(table, "k00009")
    dataset = lance.dataset(table.uri)
    index = BaseKeyIndex.of(table.handle.storage, dataset)
    pending = pa.table({"id": ["k00009", "k01999", "k05000"]})
    found = StoredHashRows.indexed(index, pending, ["id"], dataset.get_fragments())
    assert rows_kept(found, dataset) == [f"k{i:05d}" for i in range(2000) if i not in (9, 1999)]


def test_many_hashes_searched_through_presence_filters_find_the_rows_a_plain_search_finds(table, monkeypatch):
    """Every row of each hash (two for a hash two keys share), none for hashes no fragment holds."""
    hash_row_7_like(table, "k00009")
    searched = np.array([key_hash([f"k{i:05d}"]) for i in range(0, 4000, 3)], np.uint64)
    index = BaseKeyIndex.of(table.handle.storage, lance.dataset(table.uri))
    plain = index.search(searched).pairs()
    monkeypatch.setattr(base_key_index, "_FILTERED_SEARCH_HASHES", 1)
    filtered = index.search(searched).pairs()
    assert [a.tolist() for a in filtered] == [a.tolist() for a in plain]
    assert len(plain[0]) == len(range(0, 2000, 3)) + 1  # and row 7, whose hash is k00009's


def hash_row_7_like(table: LsmTable, key: str) -> None:
    """Rewrite the first fragment's index as if its row 7 (k00007) hashed like ``key``: a collision."""
    path = key_hash_file(lance.dataset(table.uri).get_fragment(0), KEY_INDEX_DIR)
    stored = table.handle.storage.read_bytes(path)
    hashes, offsets = np.frombuffer(stored[:4000], "<u8").copy(), np.frombuffer(stored[4000:], "<u4")
    hashes[offsets == 7] = key_hash([key])
    order = np.argsort(hashes, kind="stable")
    table.handle.storage.write_bytes_atomic(path, hashes[order].tobytes() + offsets[order].tobytes())


def test_a_base_with_a_fragment_lacking_its_index_searches_the_others_and_queries_only_that_one(table, monkeypatch):
    dataset = lance.dataset(table.uri)
    table.handle.storage.delete_file(key_hash_file(dataset.get_fragment(2), KEY_INDEX_DIR))
    assert BaseKeyIndex.of(table.handle.storage, dataset) is None  # callers that need every fragment: none
    partial = BaseKeyIndex.of(table.handle.storage, dataset, partial=True)
    assert partial is not None and partial.missing == (2,)
    used = index_used(monkeypatch)
    queried = []
    query = merged_read._queried_rows
    monkeypatch.setattr(
        merged_read,
        "_queried_rows",
        lambda *args: queried.append([f.fragment_id for f in args[4]]) or query(*args),
    )

    found = LsmTable.open(table.uri).lookup(["k01001", "k00003", "k01999", "k09999"])  # fragments 2, 0, 3; absent

    assert found["id"].to_pylist() == ["k01001", "k00003", "k01999"]
    assert used == [1] and queried == [[2]]
    keys = rows("string", [3, 1001, 1999, 9999], 0).select(["id"])
    assert base_row_addresses(dataset, keys, ["id"], partial).to_pylist() == (
        base_row_addresses(dataset, keys, ["id"]).to_pylist()
    )
    table.write(keys.append_column("_op", pa.array(["delete"] * keys.num_rows)))
    assert LsmTable.open(table.uri).count() == 2000 - 3


def test_a_base_with_no_fragment_indexed_has_no_partial_index_either(table):
    dataset = lance.dataset(table.uri)
    for fragment in dataset.get_fragments():
        table.handle.storage.delete_file(key_hash_file(fragment, KEY_INDEX_DIR))
    assert BaseKeyIndex.of(table.handle.storage, dataset, partial=True) is None  # Lance's query, as a whole
    assert LsmTable.open(table.uri).lookup(["k01001", "k00003"])["id"].to_pylist() == ["k01001", "k00003"]


def test_a_damaged_index_is_reported_and_lances_query_used(table, caplog):
    damaged = key_hash_file(lance.dataset(table.uri).get_fragment(1), KEY_INDEX_DIR)
    table.handle.storage.write_bytes_atomic(damaged, b"\0" * 12)  # 1 row of 500
    with caplog.at_level(logging.WARNING, logger=base_key_index.__name__):
        assert BaseKeyIndex.of(table.handle.storage, lance.dataset(table.uri)) is None
    assert damaged in caplog.text
    assert LsmTable.open(table.uri).lookup(["k00600"])["id"].to_pylist() == ["k00600"]


def test_an_unindexed_base_takes_up_its_index_once_written_and_is_not_listed_again_until_then(table, monkeypatch):
    """A base version first met without a complete index: its index is written later, without a new version."""
    dataset = lance.dataset(table.uri)
    table.handle.storage.delete_file(key_hash_file(dataset.get_fragment(0), KEY_INDEX_DIR))
    now = [1000.0]
    monkeypatch.setattr(base_key_index.time, "monotonic", lambda: now[0])
    opened = []
    open_index = base_key_index._opened
    monkeypatch.setattr(base_key_index, "_opened", lambda *args: opened.append(1) or open_index(*args))
    assert BaseKeyIndex.of(table.handle.storage, dataset) is None
    now[0] += base_key_index._MISSING_FILES_RECHECK_SECONDS
    assert BaseKeyIndex.of(table.handle.storage, dataset, partial=True).missing == (0,)
    assert len(opened) == 1  # the files it lacks are looked for, not the table's whole list again
    write_missing_key_hashes(table.handle.storage, dataset, ["id"], (KEY_INDEX_DIR,))
    assert BaseKeyIndex.of(table.handle.storage, dataset) is None and len(opened) == 1  # looked for a moment ago
    now[0] += base_key_index._MISSING_FILES_RECHECK_SECONDS
    complete = BaseKeyIndex.of(table.handle.storage, dataset)
    assert complete is not None and not complete.missing and len(opened) == 2
    assert BaseKeyIndex.of(table.handle.storage, dataset) is complete and len(opened) == 2


def test_time_travel_lookups_find_the_rows_of_their_version_through_its_fragments_indexes(table, monkeypatch):
    before = table.version()
    table.write(rows("string", range(0, 2000, 2), 1))
    table.close()
    table.compact()
    used = index_used(monkeypatch)
    then = table.lookup(["k00000", "k00001"], as_of=before)
    now = table.lookup(["k00000", "k00001"])
    assert then["value"].to_pylist() == [0, 0] and now["value"].to_pylist() == [1, 0]
    assert used == [1, 1]


def test_gc_deletes_the_index_of_fragments_no_retained_version_holds(table):
    table.write(rows("string", range(0, 2000, 2), 1))
    table.close()
    table.compact()  # deletes superseded rows, appends fragments, stores their indexes
    lance.dataset(table.uri).optimize.compact_files(target_rows_per_fragment=10_000)  # one new fragment
    table.build_pending_runs()
    reclaimed = table.gc(orphan_grace_seconds=0, wal_grace_seconds=0, older_than=None, retain_versions=1)
    dataset = lance.dataset(table.uri)
    left = {f"{KEY_INDEX_DIR}/{entry.name}" for entry in table.handle.storage.list_files(KEY_INDEX_DIR)}
    assert left == {key_hash_file(f, KEY_INDEX_DIR) for f in dataset.get_fragments()}
    assert reclaimed.key_hashes.count >= 4
    assert LsmTable.open(table.uri).lookup(["k00000", "k00001"])["value"].to_pylist() == [1, 0]


@pytest.mark.parametrize(
    ("fragments", "rows_each", "keys", "searched"),
    [
        (1, 300_000, 1_000, True),  # a small table, a generation's keys: the search costs less than a join
        (1, 300_000, 12_000, False),  # four generations' keys: Arrow's join of 300k rows costs less
        (64, 1 << 20, 200_000, True),  # 64Mi rows: the join probes every row through a table outgrowing the caches
        (64, 1 << 20, 800_000, True),
        (64, 1 << 20, 4_000_000, False),
    ],
)
def test_a_scan_searches_the_index_only_where_its_cost_per_key_stays_below_a_join_of_every_row(
    fragments, rows_each, keys, searched
):
    empty = np.zeros(0, np.uint64)
    index = BaseKeyIndex(
        [base_key_index._FragmentIndex(i, np.zeros(rows_each, np.uint64), empty) for i in range(fragments)]
    )
    assert index.searched_faster_than_scanned(keys) is searched
