"""Pending runs keep up with live writers: built beside them, never fencing them, reads right throughout."""

from __future__ import annotations

import time
from pathlib import Path

import lance
import pyarrow as pa
import pytest

from resources.lsm import LsmTable
from resources.lsm.format.layout import KEY_INDEX_DIR, RUNS_DIR
from resources.lsm.maintenance.pending_runs import PendingRunKeeper, has_pending_run
from resources.lsm.read.key_hash_files import key_hash_file, stored_key_hash_files

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("value", pa.int64())])


def _live_table(tmp_path: Path) -> LsmTable:
    """A table whose writers cut a generation every 400 rows, as a busy live writer does."""
    return LsmTable.create(str(tmp_path / "t.lance"), SCHEMA, ["id"], num_shards=2, max_memtable_rows=400)


def _batch(start: int, value: int, rows: int = 600) -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + rows), pa.int64()), "value": [value] * rows}, schema=SCHEMA)


def _wait_for(condition, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_generations_a_live_writer_cuts_get_runs_and_the_writer_is_never_fenced(tmp_path):
    table = _live_table(tmp_path)
    oracle: dict[int, int] = {}
    with PendingRunKeeper(table.handle, interval_seconds=0.1) as keeper:
        for i in range(8):
            batch = _batch(i * 250, i)
            table.write(batch)  # a fenced writer would raise WriterFencedError here
            oracle.update(zip(batch["id"].to_pylist(), batch["value"].to_pylist(), strict=True))
            # Reads are right at every moment, whatever the keeper is doing.
            read = table.read()
            assert dict(zip(read["id"].to_pylist(), read["value"].to_pylist(), strict=True)) == oracle
        writers = set(table.writer_stats())
        _wait_for(lambda: all(has_pending_run(table.handle, s) for s in table.shards()))
    shards = table.shards()
    assert all(len(s.pending_generations) >= 2 for s in shards), "the writers cut generations while live"
    assert set(table.writer_stats()) == writers == set(table.shard_ids), "the same writers, still open"
    assert keeper.stats.runs_built >= 2 and keeper.stats.errors == 0
    assert 0 < keeper.stats.max_delay_seconds < 20
    table.write(_batch(10_000, 9))  # still this object's writers: no claim in between
    table.close()


def test_a_keeper_spends_at_most_its_busy_share_of_the_time_building_runs(tmp_path):
    table = _live_table(tmp_path)
    started = time.monotonic()
    # An interval far shorter than a round: without the cap the keeper would build nearly all the time.
    # Rounds never wait for the writer's pauses (patience 0): the share alone holds them back.
    with PendingRunKeeper(table.handle, interval_seconds=0.001, busy_share=0.2, patience_seconds=0) as keeper:
        for i in range(6):
            table.write(_batch(i * 250, i))
            time.sleep(0.2)
    elapsed = time.monotonic() - started
    stats = keeper.stats
    assert stats.rounds >= 2 and stats.runs_built >= 1 and stats.errors == 0
    # Each round is followed by a wait of 4 times its length; the last one may end as the keeper stops.
    assert stats.busy_seconds <= 0.2 * elapsed + stats.longest_round_seconds
    table.close()


def _every_shard_has_generations_and_their_run(table: LsmTable) -> bool:
    """Lance cuts a full MemTable's generation after the put returns: a shard may not have one yet."""
    return all(s.pending_generations and has_pending_run(table.handle, s) for s in table.shards())


def test_a_keeper_waits_for_writers_bound_by_the_cores_to_pause(tmp_path):
    table = _live_table(tmp_path)
    writes = table.handle.write_activity
    with PendingRunKeeper(table.handle, interval_seconds=0.05, patience_seconds=60) as keeper:
        with writes.writing():  # one put lasting the block: a flat-out writer's puts follow each other
            for i in range(4):
                table.write(_batch(i * 250, i))
            time.sleep(1.0)
            assert keeper.stats.rounds == 0, "no round while the writers are bound by the cores and patience lasts"
        _wait_for(lambda: _every_shard_has_generations_and_their_run(table))
    assert keeper.stats.runs_built >= 2 and keeper.stats.rounds_beside_writes == 0
    table.close()


def test_a_keeper_builds_beside_writers_that_never_pause_once_its_patience_ends(tmp_path):
    table = _live_table(tmp_path)
    keeper = PendingRunKeeper(table.handle, interval_seconds=0.05, patience_seconds=0.5)
    with keeper, table.handle.write_activity.writing():
        for i in range(4):
            table.write(_batch(i * 250, i))
        _wait_for(lambda: _every_shard_has_generations_and_their_run(table))
    assert keeper.stats.rounds_beside_writes >= 1 and keeper.stats.errors == 0
    table.close()


def test_a_keeper_does_not_wait_for_writers_bound_by_merges(tmp_path):
    table = _live_table(tmp_path)
    writes = table.handle.write_activity
    with PendingRunKeeper(table.handle, interval_seconds=0.05, patience_seconds=60) as keeper:
        writes.held()  # as a wait for merge capacity records it
        with writes.writing():
            for i in range(4):
                table.write(_batch(i * 250, i))
            _wait_for(lambda: _every_shard_has_generations_and_their_run(table))
    assert keeper.stats.runs_built >= 2 and keeper.stats.rounds_beside_writes == 0
    table.close()


def test_a_keepers_busy_share_must_be_a_share():
    with pytest.raises(ValueError, match="busy_share"):
        PendingRunKeeper(None, busy_share=0)  # type: ignore[arg-type]


def test_a_longer_run_retires_the_run_it_extends_and_readers_holding_that_one_stay_right(tmp_path):
    table = _live_table(tmp_path)
    reader = LsmTable.open(table.uri)
    oracle: dict[int, int] = {}
    for i in range(3):
        batch = _batch(i * 250, i)
        table.write(batch)
        table.close()
        oracle.update(zip(batch["id"].to_pylist(), batch["value"].to_pylist(), strict=True))
        table.build_pending_runs()
        read = reader.read()  # its cached runs are the ones the next build retires
        assert dict(zip(read["id"].to_pylist(), read["value"].to_pylist(), strict=True)) == oracle
        stored = [[f.name for f in table.handle.storage.list_files(f"{RUNS_DIR}/{s}")] for s in table.shard_ids]
        assert all(len(names) == 1 for names in stored), stored  # only the newest run of each shard
    assert all(has_pending_run(table.handle, s) for s in table.shards())


def test_a_failed_round_is_reported_and_the_next_one_builds_the_runs(tmp_path):
    table = _live_table(tmp_path)
    blocker = Path(table.uri, RUNS_DIR)
    blocker.write_text("a file where the runs directory goes: storing a run fails")
    problems: list[str] = []
    with PendingRunKeeper(table.handle, interval_seconds=0.1, report=problems.append) as keeper:
        table.write(_batch(0, 1, rows=2000))
        _wait_for(lambda: keeper.stats.errors > 0)
        blocker.unlink()
        _wait_for(lambda: all(has_pending_run(table.handle, s) for s in table.shards()))
    assert problems and "building pending runs failed" in problems[0]
    read = table.read()
    assert read.num_rows == 2000 and set(read["value"].to_pylist()) == {1}
    table.close()


def test_a_keepers_round_builds_runs_and_leaves_the_rewritten_bases_key_files_to_the_merge(tmp_path):
    table = _live_table(tmp_path)
    table.write(_batch(0, 1, rows=2000))
    table.close()
    table.compact(maintenance=None)
    lance.dataset(table.uri).optimize.compact_files(target_rows_per_fragment=1 << 20)  # fragments without key files
    missing = _fragments_without_key_files(table)
    assert missing
    table.write(_batch(500, 2))  # pending generations whose keys the base holds
    table.close()

    keeper = PendingRunKeeper(table.handle)
    keeper.keep_up()
    assert all(has_pending_run(table.handle, s) for s in table.shards()) and keeper.stats.errors == 0
    assert 0 < keeper.stats.longest_round_seconds <= keeper.stats.busy_seconds
    assert _fragments_without_key_files(table) == missing
    read = LsmTable.open(table.uri).read()
    assert dict(zip(read["id"].to_pylist(), read["value"].to_pylist(), strict=True)) == {
        i: 2 if 500 <= i < 1100 else 1 for i in range(2000)
    }
    table.build_pending_runs()  # a flush's or a merge's build stores them
    assert _fragments_without_key_files(table) == set()


def _fragments_without_key_files(table: LsmTable) -> set[int]:
    dataset = lance.dataset(table.uri)
    stored = stored_key_hash_files(table.handle.storage, KEY_INDEX_DIR)
    return {f.fragment_id for f in dataset.get_fragments() if key_hash_file(f, KEY_INDEX_DIR) not in stored}


def test_a_run_rebuilt_after_a_rewrite_does_not_count_as_its_generations_delay(tmp_path):
    table = _live_table(tmp_path)
    table.write(_batch(0, 1, rows=2000))
    table.close()
    table.compact(maintenance=None)
    table.write(_batch(500, 2))
    table.close()
    keeper = PendingRunKeeper(table.handle)
    keeper.keep_up()
    first_delay = keeper.stats.max_delay_seconds
    assert keeper.stats.runs_built == len(table.shard_ids) and first_delay > 0

    time.sleep(1.0)
    lance.dataset(table.uri).optimize.compact_files(target_rows_per_fragment=1 << 20)  # every run's rows move
    keeper.keep_up()
    assert keeper.stats.runs_built == 2 * len(table.shard_ids), "the stale runs were rebuilt"
    assert keeper.stats.max_delay_seconds == first_delay
