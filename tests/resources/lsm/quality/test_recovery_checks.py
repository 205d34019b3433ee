"""WAL-replay recovery checks on real tables: healthy shards pass, broken ones are named."""

from __future__ import annotations

import os
import shutil

import lance
import pyarrow as pa

from resources.lsm import LsmTable
from resources.lsm.format.layout import shard_dir
from resources.lsm.format.shard_manifest import list_wal_entries, read_shard_manifest
from resources.lsm.quality.recovery_checks import Severity, verify_shards
from tests.helpers import forge_null_key_wal_entry, keys_in_bucket


def history(make_table) -> LsmTable:
    """Three generations per shard, the first two merged, plus an unflushed WAL tail."""
    table = make_table()
    for generation in range(3):
        table.write(pa.table({"id": list(range(40)), "name": [f"g{generation}"] * 40, "price": [1.0] * 40}))
        table.write(pa.table({"id": [generation], "_op": ["delete"]}))
        table.close()
        if generation == 1:
            table.compact()
    table.write(pa.table({"id": [100, 101], "name": ["tail", "tail"], "price": [2.0, 2.0]}))
    table.detach_writers()  # a crashed writer: its rows are only in the WAL
    return LsmTable.open(table.uri)


def errors(table: LsmTable, check: str) -> list[str]:
    return [f.message for s in verify_shards(table.handle) for f in s.errors if f.check == check]


def test_a_healthy_table_passes_and_counts_what_replay_needs(make_table):
    table = history(make_table)
    shards = verify_shards(table.handle)
    assert all(s.passed and not s.findings for s in shards)
    assert all(s.compacted_generation == 2 and s.generations_verified == 1 for s in shards)
    assert sum(s.wal_rows for s in shards) == 2
    assert [s.bucket for s in verify_shards(table.handle, [2])] == [2]


def test_the_decoder_reads_physical_rows_of_every_generation(make_table):
    table = history(make_table)
    shard = table.shards()[0]
    manifest = read_shard_manifest(table.handle.storage, shard.shard_id)
    sstable = manifest.sstables[-1]
    dataset = lance.dataset(f"{table.uri}/{shard_dir(shard.shard_id)}/{sstable.path}")
    assert sstable.physical_rows == sum(f.physical_rows for f in dataset.get_fragments()) > 0
    assert [t.generation for t in manifest.sstables] == [g for g, _ in manifest.flushed_generations] == [1, 2, 3]


def test_a_deleted_generation_directory_fails(make_table):
    table = history(make_table)
    shard = table.shards()[1]
    generation, directory = shard.pending_generations[0]
    shutil.rmtree(f"{table.uri}/{shard_dir(shard.shard_id)}/{directory}")
    (message,) = errors(table, "generations")
    assert message.startswith(f"generation {generation} ({directory}): does not open")
    assert verify_shards(table.handle)[1].passed is False and verify_shards(table.handle)[0].passed


def test_a_truncated_wal_entry_fails(make_table):
    table = history(make_table)
    shard = next(s for s in table.shards() if s.unflushed_wal_entries)
    entry = list_wal_entries(table.handle.storage, shard.shard_id)[-1]
    path = f"{table.uri}/{shard_dir(shard.shard_id)}/wal/{entry.name}"
    os.truncate(path, os.path.getsize(path) // 2)
    (message,) = errors(table, "wal")
    assert f"position {entry.position}" in message and "unreadable" in message


def test_a_missing_wal_position_fails(make_table):
    table = make_table()
    key = keys_in_bucket(table, 0, 1)[0]
    for price in (1.0, 2.0):
        table.write(pa.table({"id": [key], "name": ["x"], "price": [price]}))
    shard = table.shards()[0]
    table.detach_writers()
    entries = list_wal_entries(table.handle.storage, shard.shard_id)
    os.remove(f"{table.uri}/{shard_dir(shard.shard_id)}/wal/{entries[-2].name}")
    assert any("missing position" in m for m in errors(table, "wal"))


def test_orphan_directories_warn_and_are_never_opened(make_table):
    table = history(make_table)
    shard = table.shards()[3]
    orphan = f"{table.uri}/{shard_dir(shard.shard_id)}/deadbeef_gen_9"
    os.makedirs(orphan)  # not even a dataset: opening it would fail
    (report,) = verify_shards(table.handle, [3])
    assert report.passed and report.orphan_directories == ("deadbeef_gen_9",)
    assert [f.severity for f in report.findings] == [Severity.WARNING]


def test_a_null_key_in_a_forged_wal_entry_fails(make_table):
    table = make_table()
    forge_null_key_wal_entry(table)
    assert any("null primary-key" in m for m in errors(table, "wal"))
