"""Garbage collection reclaims space and never changes what any retained reader sees."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta
from pathlib import Path

import lance
import pyarrow as pa

from resources.lsm import LsmTable
from resources.lsm.format.layout import STAGING_DIR
from resources.lsm.format.schema import PRIMARY_KEY_METADATA, TOMBSTONE_COLUMN, empty_tail
from resources.lsm.format.shard_manifest import list_generation_dirs, list_wal_entries
from resources.lsm.read import merged_read
from resources.lsm.testing.changegen import ChangeStreamSpec, generate_changes
from tests.helpers import rows_by_key
from tests.resources.lsm.maintenance.maintenance_helpers import (
    assert_base_sane,
    assert_view,
    build_change_table,
    oracle_view,
    run_worker,
)

EVERYTHING = {"orphan_grace_seconds": 0, "wal_grace_seconds": 0, "retain_versions": 1, "older_than": None}


def _generation_dirs(table: LsmTable) -> set[str]:
    return {d for s in table.shard_ids for _, d in list_generation_dirs(table.handle.storage, s)}


def test_gc_before_and_after_compaction_keeps_the_view(tmp_path):
    table, batches = build_change_table(str(tmp_path / "t.lance"))
    flushed = _generation_dirs(table)

    early = table.gc(**EVERYTHING)  # nothing is merged yet: every generation is still needed
    assert early.compacted_generations.count == 0 and _generation_dirs(table) == flushed
    assert_view(table, batches)

    table.compact()
    result = table.gc(**EVERYTHING)
    assert result.compacted_generations.count == len(flushed) and result.compacted_generations.bytes > 0
    assert result.base_versions.count > 0 and result.base_versions.bytes > 0
    kinds = (result.compacted_generations, result.wal_entries, result.orphan_directories, result.base_versions)
    assert result.bytes_reclaimed == sum(r.bytes for r in (*kinds, result.pending_runs, result.key_hashes))
    assert _generation_dirs(table) == set()
    assert [v["version"] for v in table.dataset().versions()] == [table.dataset().version]
    # Only entries after the replay position (the unflushed tail) are left, and it is still visible.
    assert _wal_positions(table) == _wal_positions(table, after_replay=True)
    assert any(_wal_positions(table).values())
    assert_view(table, batches)
    assert_base_sane(table.uri)

    # Writers, flushes and merges carry on over the collected table.
    more = list(generate_changes(ChangeStreamSpec(num_keys=2500, num_batches=2, batch_size=300, seed=3)))
    for batch in more:
        table.write(batch)
        table.flush()
    table.compact()
    table.gc(**EVERYTHING)
    assert_view(table, batches + more)
    assert rows_by_key(lance.dataset(table.uri).to_table()) == oracle_view(batches + more)


def test_a_generation_stays_while_a_retained_base_version_lists_it(tmp_path):
    table, batches = build_change_table(str(tmp_path / "t.lance"), num_shards=2)
    before_merge = table.dataset().version
    table.compact()

    kept = table.gc(orphan_grace_seconds=0, wal_grace_seconds=0, older_than=timedelta(days=1))
    assert kept.compacted_generations.count == 0
    # A reader pinned to the pre-merge version lists every generation as pending, and reads them.
    pinned = lance.dataset(table.uri, version=before_merge)
    states = table.handle.shard_states(pinned)
    snapshot = merged_read.ReadSnapshot(pinned, tuple(states), empty_tail(table.schema), ("id",), table.handle.storage)
    scanned = merged_read.scan(pinned, ["id"], lambda: snapshot, table.schema.names, None).read_all()
    assert rows_by_key(scanned) == oracle_view(batches[:-1])

    collected = table.gc(**EVERYTHING)
    assert collected.compacted_generations.count == sum(len(s.flushed_generations) for s in table.shards())
    assert_view(table, batches)


def test_merged_generations_wait_for_the_index_to_catch_up(tmp_path):
    table, batches = build_change_table(str(tmp_path / "t.lance"), num_shards=2)
    table.compact(maintenance=None)  # the id index has not seen the merged rows
    assert table.gc(**EVERYTHING).compacted_generations.count == 0

    table.dataset().optimize.optimize_indices()  # records the index catch-up
    assert table.gc(**EVERYTHING).compacted_generations.count > 0
    assert_view(table, batches)


def _plant_orphan(table: LsmTable, shard_id: str) -> str:
    """A real SSTable directory no manifest lists (as a fenced flush leaves), with a live-looking row."""
    fields = [
        pa.field("id", pa.int64(), nullable=False, metadata={PRIMARY_KEY_METADATA: b"true"}),
        *[table.schema.field(n) for n in table.schema.names[1:]],
        pa.field(TOMBSTONE_COLUMN, pa.bool_(), nullable=False),
    ]
    row = {"id": [0], "customer": ["orphan"], "amount": [0.0], "status": ["orphan"], TOMBSTONE_COLUMN: [False]}
    directory = "deadbeef_gen_99"
    lance.write_dataset(pa.table(row, schema=pa.schema(fields)), f"{table.uri}/_mem_wal/{shard_id}/{directory}")
    return directory


def _backdate(path: str, seconds: float) -> None:
    then = time.time() - seconds
    for root, dirs, files in os.walk(path):
        for name in [*files, *dirs]:
            os.utime(os.path.join(root, name), (then, then))
    os.utime(path, (then, then))


def test_orphans_are_kept_for_their_grace_period(tmp_path):
    table, batches = build_change_table(str(tmp_path / "t.lance"), num_shards=2)
    shard = table.shard_ids[0]
    orphan = _plant_orphan(table, shard)
    listed = {d for s in table.shards() for _, d in s.flushed_generations}

    young = table.gc(orphan_grace_seconds=3600, wal_grace_seconds=0, older_than=None, retain_versions=1)
    assert young.orphan_directories.count == 0 and orphan in _generation_dirs(table)

    _backdate(f"{table.uri}/_mem_wal/{shard}/{orphan}", 7200)
    old = table.gc(orphan_grace_seconds=3600, wal_grace_seconds=0, older_than=None, retain_versions=1)
    assert old.orphan_directories.count == 1 and old.orphan_directories.bytes > 0
    assert _generation_dirs(table) == listed  # pending generations are never orphans
    assert_view(table, batches)


def _wal_positions(table: LsmTable, after_replay: bool = False) -> dict[str, list[int]]:
    """WAL entry positions per shard (only those after the replay position, if asked)."""
    return {
        s.shard_id: [
            e.position
            for e in list_wal_entries(table.handle.storage, s.shard_id)
            if not after_replay or e.position > s.replay_after_wal_position
        ]
        for s in table.shards()
    }


def test_consumed_wal_entries_wait_for_their_grace_and_unflushed_ones_stay(tmp_path):
    table, batches = build_change_table(str(tmp_path / "t.lance"), num_shards=2)
    before, tail = _wal_positions(table), _wal_positions(table, after_replay=True)

    assert table.gc(wal_grace_seconds=3600, older_than=timedelta(0)).wal_entries.count == 0
    assert table.gc(wal_grace_seconds=0).wal_entries.count == 0  # the version retention keeps them (time travel)
    assert _wal_positions(table) == before

    result = table.gc(wal_grace_seconds=0, older_than=timedelta(0))
    assert result.wal_entries.count == sum(map(len, before.values())) - sum(map(len, tail.values())) > 0
    assert result.wal_entries.bytes > 0
    assert _wal_positions(table) == tail
    assert_view(table, batches)


def test_gc_killed_midway_is_finished_by_the_next_run(tmp_path):
    table, batches = build_change_table(str(tmp_path / "t.lance"))
    table.compact()
    assert run_worker(table.uri, "gc", "after-delete", 2) == -signal.SIGKILL
    assert_view(LsmTable.open(table.uri), batches)
    table.gc(**EVERYTHING)
    assert _generation_dirs(table) == set()
    assert_view(table, batches)


def test_staging_left_by_a_crashed_ingestion_is_kept_for_the_grace_period(tmp_path):
    table, batches = build_change_table(str(tmp_path / "t.lance"), num_shards=2)
    staged = Path(table.uri, STAGING_DIR, "run=crashed-1234")
    staged.mkdir(parents=True)
    (staged / "part-00000-0-bucket-00000.arrows").write_bytes(b"x" * 100)

    young = table.gc(orphan_grace_seconds=3600, wal_grace_seconds=0, older_than=None, retain_versions=1)
    assert young.orphan_directories.count == 0 and staged.exists()

    _backdate(str(staged), 7200)
    old = table.gc(orphan_grace_seconds=3600, wal_grace_seconds=0, older_than=None, retain_versions=1)
    assert old.orphan_directories.count == 1 and old.orphan_directories.bytes == 100
    assert not staged.exists()
    assert_view(table, batches)
