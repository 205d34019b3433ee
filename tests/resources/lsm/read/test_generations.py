"""Readers use exactly the manifest's generations above the compacted marker."""

from __future__ import annotations

import lance
import pyarrow as pa
from lance.mem_wal import CompactedSsTable

from resources.lsm.format.compaction_marker import read_compacted_generations
from resources.lsm.format.schema import PRIMARY_KEY_METADATA, TOMBSTONE_COLUMN


def _shard_of(table, key: int) -> str:
    return table.shard_ids[int(table.buckets(pa.table({"id": pa.array([key], pa.int64())}))[0])]


def _put_and_flush(table, key: int, name: str) -> None:
    table.write(pa.table({"id": [key], "name": [name], "price": [1.0]}))
    table.close()


def _merge_into_base(table, rows: pa.Table, shard_id: str, generation: int) -> None:
    """Stand-in for merge-into-base: data and the compacted marker in one commit."""
    (
        table.dataset()
        .merge_insert("id")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .mark_sstables_as_compacted([CompactedSsTable(shard_id, generation)])
        .execute(rows)
    )


def _names(table, **kwargs) -> list:
    return table.read(columns=["name"], **kwargs)["name"].to_pylist()


def test_compacted_marker_is_decoded_per_version_and_compacted_generations_are_skipped(make_table):
    table = make_table()
    shard = _shard_of(table, 1)
    for name in ("a", "b"):
        _put_and_flush(table, 1, name)

    _merge_into_base(table, pa.table({"id": [1], "name": ["a"], "price": [1.0]}), shard, 1)
    merged_once = table.dataset().version
    assert read_compacted_generations(table.handle.storage, merged_once) == {shard: 1}
    assert read_compacted_generations(table.handle.storage, merged_once - 1) == {}
    assert _names(table) == ["b"]  # generation 2 is above the marker and wins

    _put_and_flush(table, 1, "c")
    _merge_into_base(table, pa.table({"id": [1], "name": ["c"], "price": [1.0]}), shard, 3)
    state = next(s for s in table.shards() if s.shard_id == shard)
    assert state.compacted_generation == 3
    assert [g for g, _ in state.flushed_generations] == [1, 2, 3]
    assert state.pending_generations == ()
    # Including generation 2 (value 'b') would resurrect a stale value.
    assert _names(table) == ["c"]
    assert _names(table, fresh=False) == ["c"]


def _plant_orphan_generation(table, shard_id: str, generation: int, key: int, name: str) -> str:
    """A real SSTable directory that no manifest lists (as a fenced flush leaves)."""
    directory = f"deadbeef_gen_{generation}"
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata={PRIMARY_KEY_METADATA: b"true"}),
            pa.field("name", pa.string()),
            pa.field("price", pa.float64()),
            pa.field(TOMBSTONE_COLUMN, pa.bool_(), nullable=False),
        ]
    )
    rows = pa.table({"id": [key], "name": [name], "price": [9.0], TOMBSTONE_COLUMN: [False]}, schema=schema)
    lance.write_dataset(rows, f"{table.uri}/_mem_wal/{shard_id}/{directory}")
    return directory


def test_orphan_generation_directories_are_reported_and_never_read(make_table):
    table = make_table()
    shard = _shard_of(table, 1)
    _put_and_flush(table, 1, "flushed")
    table.write(pa.table({"id": [1], "name": ["in-wal"], "price": [1.0]}))
    orphan = _plant_orphan_generation(table, shard, generation=2, key=1, name="orphan")

    state = next(s for s in table.shards() if s.shard_id == shard)
    assert state.orphan_directories == (orphan,)
    assert [g for g, _ in state.flushed_generations] == [1]
    assert _names(table) == ["in-wal"]
    assert _names(table, fresh=False) == ["flushed"]
    assert table.lookup([1])["name"].to_pylist() == ["in-wal"]

    table.flush()  # the real generation 2 now exists beside the orphan of the same number
    state = next(s for s in table.shards() if s.shard_id == shard)
    assert [g for g, _ in state.flushed_generations] == [1, 2]
    assert orphan not in dict(state.flushed_generations).values()
    assert _names(table, fresh=False) == ["in-wal"]
    assert table.lookup([1], fresh=False)["name"].to_pylist() == ["in-wal"]


def test_a_crashed_writers_wal_is_visible_and_flushed_by_the_next_writer(make_table):
    table = make_table()
    table.write(pa.table({"id": [1, 2, 3], "name": ["a", "b", "c"], "price": [1.0, 2.0, 3.0]}))
    table.detach_writers()  # drop the writers without close(), as a crash would
    reopened = type(table).open(table.uri)
    assert sorted(_names(reopened)) == ["a", "b", "c"]
    assert _names(reopened, fresh=False) == []
    assert sum(s.unflushed_wal_entries for s in reopened.shards()) > 0

    flushed = reopened.flush()
    assert flushed and all(s.unflushed_wal_entries == 0 for s in reopened.shards())
    assert sorted(_names(reopened, fresh=False)) == ["a", "b", "c"]


def test_recorded_writer_settings_apply_and_large_writes_are_sliced_to_the_memtable_cap(make_table):
    table = make_table(num_shards=1, max_memtable_rows=1000)
    ids = list(range(2500))
    result = table.write(pa.table({"id": ids, "name": [str(i) for i in ids], "price": [1.0] * len(ids)}))
    assert result.shards[0].upserts == 2500 and table.count() == 2500
    table.close()
    # 1000-row MemTables (the recorded cap, not Lance's 100k default) -> 3 generations.
    assert len(table.shards()[0].flushed_generations) == 3
    assert sorted(table.read(columns=["id"], fresh=False)["id"].to_pylist()) == ids
