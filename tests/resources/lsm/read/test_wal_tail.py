"""The WAL tail: entries lookups keep asking get a key index, a tail resolved once is only extended, and the
process keeps what it read for every table object, never for another table at the same location."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pytest

from resources.lsm import LsmTable
from resources.lsm.format import shard_manifest
from resources.lsm.format.shard_manifest import WalEntryFile
from resources.lsm.read import wal_tail
from resources.lsm.read.dedup import keep_last_per_key
from resources.lsm.read.generation_keys import READS_BEFORE_KEY_INDEX
from resources.lsm.read.wal_tail import CachedEntry
from resources.lsm.testing.changegen import EVENTS_SCHEMA


@pytest.mark.parametrize("key", [["id"], ["region", "id"]], ids=["one column", "composite"])
def test_an_entry_holding_a_key_twice_answers_its_newest_row_before_and_after_it_is_indexed(key):
    # A writer may buffer two puts of one key into one WAL entry: the later row is the newer change.
    rows = pa.table({"region": ["r1", "r1", "r2", "r1"], "id": ["a", "b", "a", "a"], "value": [1, 2, 3, 4]})
    entry = CachedEntry({}, rows, key)
    asked = pa.table({"region": ["r1"], "id": ["a"]}).select(key)
    answers = [keep_last_per_key(entry.rows_of(asked), key)["value"].to_pylist() for _ in range(24)]
    assert answers == [[4]] * 24  # row 3 is the key's last row, whether the key is ("r1", "a") or "a"
    assert entry.rows_of(pa.table({"region": ["r9"], "id": ["zz"]}).select(key)).num_rows == 0


def test_lookups_beside_an_open_writer_index_each_entry_they_keep_asking_and_follow_the_oracle(make_table, monkeypatch):
    built: list[int] = []

    class Counted(wal_tail.KeyIndex):
        def __init__(self, table: pa.Table, key: list[str]) -> None:
            built.append(table.num_rows)
            super().__init__(table, key)

    monkeypatch.setattr(wal_tail, "KeyIndex", Counted)
    table = make_table(EVENTS_SCHEMA, num_shards=1)
    oracle: dict[int, str] = {}
    for round_ in range(3):  # three WAL entries, never flushed: the writer stays open
        ids = list(range(round_ * 50, round_ * 50 + 200))
        status = f"s{round_}"
        table.write(pa.table({"id": ids, "customer": ["c"] * 200, "amount": [1.0] * 200, "status": [status] * 200}))
        oracle |= dict.fromkeys(ids, status)
    table.write(pa.table({"id": [60, 999], "_op": ["delete", "delete"]}))
    oracle.pop(60)

    for probe in range(3 * READS_BEFORE_KEY_INDEX):
        asked = [probe * 7 % 320, 60, 999]
        found = table.lookup(asked)
        assert dict(zip(found["id"].to_pylist(), found["status"].to_pylist(), strict=True)) == {
            k: oracle[k] for k in asked if k in oracle
        }
    assert len(built) == 4  # each entry once, after READS_BEFORE_KEY_INDEX lookups asked it


@pytest.mark.parametrize("key", [["id"], ["customer", "id"]], ids=["one column", "composite"])
def test_a_scan_beside_an_open_writer_resolves_only_the_entries_written_since_its_last_read(
    make_table, monkeypatch, key
):
    table = make_table(EVENTS_SCHEMA, primary_key=key, num_shards=1)
    read: list[str] = []
    read_entry = wal_tail._read_entry
    monkeypatch.setattr(
        wal_tail,
        "_read_entry",
        lambda storage, scope, shard, entry, *a: (
            read.append(entry.name) or read_entry(storage, scope, shard, entry, *a)
        ),
    )
    oracle: dict[int, str] = {}
    for round_ in range(4):  # entries rewrite and delete keys of earlier ones; the writer stays open
        ids = list(range(round_ * 30, round_ * 30 + 60))
        table.write(pa.table({"id": ids, "customer": ["c"] * 60, "amount": [1.0] * 60, "status": [f"s{round_}"] * 60}))
        table.write(pa.table({"id": [round_ * 7], "customer": ["c"], "_op": ["delete"]}))
        oracle |= dict.fromkeys(ids, f"s{round_}")
        oracle.pop(round_ * 7)
        read.clear()
        rows = table.scanner(columns=["id", "status"]).read_all()
        assert dict(zip(rows["id"].to_pylist(), rows["status"].to_pylist(), strict=True)) == oracle
        assert len(read) == (2 if round_ else len(set(read)))  # after the first read: the two entries just written
    (state,) = table.shards()
    whole = wal_tail.read_wal_tail(
        table.handle.storage, state.shard_id, state.wal_entries, table.handle.dataset().schema, key
    )
    assert (
        whole.sort_by("id").to_pylist()
        == table.handle.wal_tails.find((table.handle.cache_scope, state.shard_id)).rows.sort_by("id").to_pylist()
    )


def test_a_table_opened_anew_reads_no_wal_entry_another_table_object_read(make_table, monkeypatch):
    table = make_table(EVENTS_SCHEMA, num_shards=2)
    table.write(pa.table({"id": range(100), "customer": ["c"] * 100, "amount": [1.0] * 100, "status": ["a"] * 100}))
    assert table.count() == 100
    read: list[str] = []
    read_wal_entry = wal_tail.read_wal_entry
    monkeypatch.setattr(
        wal_tail,
        "read_wal_entry",
        lambda storage, shard, entry: read.append(entry.name) or read_wal_entry(storage, shard, entry),
    )

    again = LsmTable.open(table.uri)  # as the next Dagster step in this process would
    assert again.count() == 100 and read == []
    table.write(pa.table({"id": [5], "customer": ["c"], "amount": [2.0], "status": ["b"]}))
    rows = LsmTable.open(table.uri).scanner(columns=["id", "status"]).read_all()
    assert rows.num_rows == 100 and dict(zip(*rows.to_pydict().values(), strict=True))[5] == "b"
    assert len(read) == 1  # the entry just written, and only that one


def test_a_table_created_again_at_the_same_location_is_not_read_from_the_first_ones_cached_files(tmp_path, monkeypatch):
    # A store without modification times (pyarrow gives None): WAL entries of equal names and sizes look alike.
    monkeypatch.setattr(
        shard_manifest, "WalEntryFile", lambda position, name, size, _: WalEntryFile(position, name, size, None)
    )
    uri = str(tmp_path / "t.lance")
    for status in ("one", "two"):  # equal lengths: equal entry sizes
        table = LsmTable.create(uri, EVENTS_SCHEMA, ["id"], num_shards=1)
        table.write(pa.table({"id": range(10), "customer": ["c"] * 10, "amount": [1.0] * 10, "status": [status] * 10}))
        assert set(table.scanner(columns=["status"]).read_all()["status"].to_pylist()) == {status}
        assert table.lookup([3])["status"].to_pylist() == [status]
        shutil.rmtree(uri)  # dropped with its writer open: its entries were never flushed
