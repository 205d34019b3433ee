"""Merge leases: a merge holds its shards until the runs it builds as it ends are stored; keepers pass them over."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest

from resources.lsm import LsmTable
from resources.lsm.format.layout import MERGE_LEASES_DIR
from resources.lsm.maintenance import compaction
from resources.lsm.maintenance.merge_leases import leased_shards, merge_leases
from resources.lsm.maintenance.pending_runs import PendingRunKeeper, has_pending_run
from tests.helpers import keys_in_bucket

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("value", pa.int64())])


def _table_with_generations(tmp_path: Path) -> LsmTable:
    """Two shards, each with flushed generations and no run yet."""
    table = LsmTable.create(str(tmp_path / "t.lance"), SCHEMA, ["id"], num_shards=2, max_memtable_rows=400)
    table.write(pa.table({"id": pa.array(range(2000), pa.int64()), "value": [1] * 2000}, schema=SCHEMA))
    table.flush()
    assert all(s.pending_generations for s in table.shards())
    return table


def test_a_lease_holds_for_the_block_and_is_released_even_when_it_fails(tmp_path):
    table = _table_with_generations(tmp_path)
    storage, (first, second) = table.handle.storage, table.shard_ids
    with merge_leases(storage, [first]):
        assert leased_shards(storage) == {first}
    assert leased_shards(storage) == set()
    with pytest.raises(RuntimeError), merge_leases(storage, [first, second]):
        raise RuntimeError("the merge failed")
    assert leased_shards(storage) == set() and storage.list_files(MERGE_LEASES_DIR) == []
    table.close()


def test_a_store_refusing_a_lease_leaves_it_out_and_the_merge_runs(tmp_path, monkeypatch):
    table = _table_with_generations(tmp_path)
    storage = table.handle.storage

    def refused(relative: str, data: bytes) -> None:
        raise OSError(f"the store refused {relative}")

    monkeypatch.setattr(storage, "write_bytes_atomic", refused)
    ran = []
    with merge_leases(storage, table.shard_ids):
        ran.append(leased_shards(storage))
    assert ran == [set()]  # the block ran, holding nothing
    table.close()


def test_a_crashed_merges_lease_lapses_and_the_next_merge_deletes_it(tmp_path):
    table = _table_with_generations(tmp_path)
    storage, shard = table.handle.storage, table.shard_ids[0]
    lapsed = f"{MERGE_LEASES_DIR}/{shard}@{int(time.time() * 1000) - 1}"
    storage.write_bytes_atomic(lapsed, b"")  # as a merge killed an instant ago past its lease leaves it
    leftover = f"{lapsed}.0a3f.tmp"  # a lease write's staging file, left by a crash before its rename
    storage.write_bytes_atomic(leftover, b"")
    assert leased_shards(storage) == set()
    with merge_leases(storage, [table.shard_ids[1]]):
        assert leased_shards(storage) == {table.shard_ids[1]}
    assert not storage.exists(lapsed) and not storage.exists(leftover)
    assert storage.list_files(MERGE_LEASES_DIR) == []
    table.close()


def test_a_keeper_passes_over_the_shards_a_merge_holds_and_builds_them_once_released(tmp_path):
    table = _table_with_generations(tmp_path)
    merged, other = table.shard_ids
    keeper = PendingRunKeeper(table.handle)
    with merge_leases(table.handle.storage, [merged]):
        keeper.keep_up()
    states = {s.shard_id: s for s in table.shards()}
    assert not has_pending_run(table.handle, states[merged]) and has_pending_run(table.handle, states[other])
    assert keeper.stats.shards_left_to_merges == 1 and keeper.stats.runs_built == 1
    keeper.keep_up()
    assert has_pending_run(table.handle, table.shards()[table.shard_ids.index(merged)])
    assert keeper.stats.shards_left_to_merges == 1 and keeper.stats.runs_built == 2
    table.close()


def test_a_merge_holds_its_shards_until_the_runs_it_builds_as_it_ends_are_stored(tmp_path, monkeypatch):
    table = _table_with_generations(tmp_path)
    storage, merged = table.handle.storage, table.shard_ids[:1]
    seen: dict[str, list[set[str]]] = {"merge": [], "build": []}
    merge, build = compaction.compact, LsmTable.build_pending_runs

    def merging(*args, **kwargs):
        seen["merge"].append(leased_shards(storage))
        return merge(*args, **kwargs)

    def building(self, *args, **kwargs):
        seen["build"].append(leased_shards(storage))
        return build(self, *args, **kwargs)

    monkeypatch.setattr(compaction, "compact", merging)
    monkeypatch.setattr(LsmTable, "build_pending_runs", building)
    table.write(pa.table({"id": pa.array([5, 7], pa.int64()), "value": [2, 2]}, schema=SCHEMA))
    table.flush()  # a generation the merge's build over its shard covers

    table.compact(merged)

    # The end build runs under the lease; a second one, once let go, covers what writers cut meanwhile.
    assert seen == {"merge": [set(merged)], "build": [set(merged), set()]}
    assert leased_shards(storage) == set()
    assert dict(zip(*table.read().select(["id", "value"]).to_pydict().values(), strict=True))[5] == 2
    table.close()


def test_a_generation_cut_while_a_merge_held_its_shard_gets_its_run_once_the_merge_lets_go(tmp_path, monkeypatch):
    table = _table_with_generations(tmp_path)
    writer = LsmTable.open(table.uri)
    shard, (key,) = table.shard_ids[0], keys_in_bucket(table, 0, 1)
    build = LsmTable.build_pending_runs
    keeper = PendingRunKeeper(writer.handle)

    def building_then_a_writer_closes(self, *args, **kwargs):
        built = build(self, *args, **kwargs)
        if leased_shards(self.handle.storage):  # the merge's end build has read the states: a writer cuts now
            writer.write(pa.table({"id": pa.array([key], pa.int64()), "value": [3]}, schema=SCHEMA))
            writer.close()
            keeper.keep_up()  # the writer session's closing round leaves the leased shard to the merge
        return built

    monkeypatch.setattr(LsmTable, "build_pending_runs", building_then_a_writer_closes)
    table.compact([shard])

    state = next(s for s in table.shards() if s.shard_id == shard)
    assert keeper.stats.shards_left_to_merges == 1 and state.pending_generations
    assert has_pending_run(table.handle, state)
    assert dict(zip(*table.read().select(["id", "value"]).to_pydict().values(), strict=True))[key] == 3
    table.close()
