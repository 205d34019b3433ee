"""Fresh reads across processes: rows acknowledged by another process's writer are
visible at once (from its WAL), and stay visible after that process is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pyarrow as pa

from resources.lsm import LsmTable
from tests.helpers import reads_of, rows_by_key
from tests.resources.lsm.read.writer_child import acknowledge


def test_rows_acknowledged_in_another_process_are_read_fresh_and_survive_sigkill(make_table, writer_process):
    table = make_table()
    table.write(pa.table({"id": pa.array(range(50), pa.int64()), "name": ["parent"] * 50, "price": [1.0] * 50}))
    table.close()  # a flushed generation under the child's WAL-only rows
    child = writer_process(table.uri)

    acknowledge(child, "upsert", 40, 30)  # rewrites 40..49, adds 50..69
    acknowledge(child, "delete", 0, 1)
    assert child.poll() is None, "the writer keeps running"
    fresh = rows_by_key(table.read())
    assert set(fresh) == {(k,) for k in range(1, 70)}
    assert all(fresh[(k,)]["name"] == "child" for k in range(40, 70))
    assert all(fresh[(k,)]["name"] == "parent" for k in range(1, 40))
    assert table.count() == 69
    assert table.lookup([45, 65])["name"].to_pylist() == ["child", "child"]

    stale = rows_by_key(table.read(fresh=False))
    assert all(stale[(k,)]["name"] == "parent" for k in range(40, 50)) and (60,) not in stale

    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert rows_by_key(table.read()) == fresh
    assert sum(s.unflushed_wal_entries for s in table.shards()) > 0, "still only in the WAL"
    table.flush()
    assert rows_by_key(table.read(fresh=False)) == fresh


def test_base_commits_by_another_process_are_seen_by_a_reader_with_warm_caches(make_table):
    table = make_table()
    table.write(pa.table({"id": pa.array(range(10), pa.int64()), "name": ["before"] * 10, "price": [1.0] * 10}))
    table.close()
    table.compact()
    assert table.lookup([3])["name"].to_pylist() == ["before"]  # base index and metadata now cached

    commit = (
        "import lance, pyarrow as pa, sys; ds = lance.dataset(sys.argv[1]); "
        "ds.merge_insert('id').when_matched_update_all().execute("
        "pa.table({'id': pa.array([3], pa.int64()), 'name': ['after'], 'price': [2.0]}).cast(ds.schema))"
    )
    subprocess.run([sys.executable, "-c", commit, table.uri], check=True)
    assert table.lookup([3])["name"].to_pylist() == ["after"]
    assert rows_by_key(table.read(fresh=False))[(3,)]["name"] == "after"


def test_stray_files_in_a_wal_directory_never_break_a_fresh_read(make_table):
    """Only ``<binary position>.arrow`` files are WAL entries; anything else someone drops there is ignored."""
    table = make_table()
    table.write(pa.table({"id": pa.array([1], pa.int64()), "name": ["flushed"], "price": [1.0]}))
    table.close()  # flushed: its WAL entry is now below the replay position
    table.write(pa.table({"id": pa.array([2], pa.int64()), "name": ["in the wal"], "price": [2.0]}))
    table.detach_writers()  # acknowledged, unflushed: only the WAL holds it
    for shard in table.shard_ids:
        for stray in ("notes.arrow", "README", "0101.arrow.tmp"):
            table.handle.storage.write_bytes_atomic(f"_mem_wal/{shard}/wal/{stray}", b"not a WAL entry")
    assert {k[0]: r["name"] for k, r in rows_by_key(table.read()).items()} == {1: "flushed", 2: "in the wal"}
    assert table.lookup([2])["name"].to_pylist() == ["in the wal"]


def test_a_reader_reads_each_wal_entry_once_and_still_sees_every_new_one(make_table, writer_process):
    """Beside a busy writer every fresh read meets the whole tail again: the handle keeps the entries it read."""
    table = make_table()
    child = writer_process(table.uri)
    wal_reads = reads_of(table, "/wal/")
    acknowledge(child, "upsert", 0, 20)
    assert set(rows_by_key(table.read())) == {(k,) for k in range(20)}
    read_once = len(wal_reads)
    assert read_once > 0 and table.lookup([5])["name"].to_pylist() == ["child"]
    assert len(wal_reads) == read_once, "the lookup met only entries already read"

    acknowledge(child, "upsert", 20, 10)
    acknowledge(child, "delete", 0, 1)
    assert set(rows_by_key(table.read())) == {(k,) for k in range(1, 30)}
    assert table.count() == 29
    assert len(wal_reads) == len(set(wal_reads)), "every WAL entry read once"


def test_a_reader_reads_each_shard_manifest_once_and_still_sees_every_new_version(make_table):
    """A fresh read finds each shard's latest manifest from the last one its handle saw: one probe when unchanged."""
    table = make_table()
    table.write(pa.table({"id": pa.array(range(10), pa.int64()), "name": ["a"] * 10, "price": [1.0] * 10}))
    table.close()
    reader = LsmTable.open(table.uri)
    manifest_reads = reads_of(reader, "/manifest/")
    assert set(rows_by_key(reader.read())) == {(k,) for k in range(10)}
    read_once = len(manifest_reads)
    assert read_once > 0
    assert reader.lookup([3])["name"].to_pylist() == ["a"] and reader.count() == 10
    assert len(manifest_reads) == read_once, "no manifest or version hint read again while nothing changed"

    table.write(pa.table({"id": pa.array(range(5, 15), pa.int64()), "name": ["b"] * 10, "price": [2.0] * 10}))
    table.close()  # new manifest versions on the shards written
    fresh = rows_by_key(reader.read())
    assert set(fresh) == {(k,) for k in range(15)} and fresh[(7,)]["name"] == "b"
    assert len(manifest_reads) == len(set(manifest_reads)), "every manifest version read once"
