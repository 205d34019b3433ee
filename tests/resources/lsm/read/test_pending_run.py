"""Pending runs and their deletion vectors: built at flush, read by scans and lookups, never trusted blindly."""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import lance
import pyarrow as pa
import pytest

from resources.lsm import LsmTable
from resources.lsm.format.layout import KEY_INDEX_DIR, RUNS_DIR
from resources.lsm.maintenance import compaction
from resources.lsm.maintenance.compaction import MaintenancePolicy, maintain_base
from resources.lsm.maintenance.pending_runs import has_pending_run
from resources.lsm.read import pending_run
from resources.lsm.read.deletion_vector import fragment_ids
from resources.lsm.read.key_hash_files import key_hash_file
from resources.lsm.read.level_readers import builds_done
from resources.lsm.read.merged_read import resolve_levels
from resources.lsm.read.pending_run import NOT_IN_BASE, PendingRun, run_path
from resources.lsm.testing.changegen import ChangeStreamSpec, generate_changes
from tests.helpers import REPO_ROOT, drop_pending_runs, in_another_process, reads_of, rows_by_key, stored_run
from tests.resources.lsm.maintenance.maintenance_helpers import build_change_table, oracle_view

LOGGER = "resources.lsm.read.pending_run"


def merged_into_base_then_changed(uri: str) -> tuple[LsmTable, list[pa.Table]]:
    """A table whose base holds two merges (two fragments, deletions) and whose shards hold pending generations."""
    table, batches = build_change_table(uri, num_shards=2, num_batches=4)
    more = list(generate_changes(ChangeStreamSpec(num_keys=2500, num_batches=4, batch_size=400, seed=5)))
    for i, batch in enumerate(more):
        table.write(batch)
        table.flush()
        if i < 2:
            table.compact(maintenance=None)
    assert not any(has_pending_run(table.handle, s) for s in table.shards())  # flushes build none
    table.build_pending_runs()
    return table, batches + more


def stored_runs(table: LsmTable) -> list[str]:
    return sorted(
        f"{RUNS_DIR}/{shard}/{f.name}"
        for shard in table.shard_ids
        for f in table.handle.storage.list_files(f"{RUNS_DIR}/{shard}")
    )


def current_runs(table: LsmTable) -> list[str]:
    """The paths of the runs over each shard's whole pending set."""
    return [run_path(s.shard_id, s.pending_generations) for s in table.shards()]


REWRITE_EVERY_FRAGMENT = MaintenancePolicy(max_small_fragments=0, small_fragment_rows=1 << 30)
"""A tidy-up that rewrites the whole base: every row a run found moves."""


def keys_looked_up_in_base(monkeypatch) -> list[int]:
    """The ids every later base probe of a run build asks for, as they come (``pending_run.base_row_addresses``)."""
    looked_up: list[int] = []
    probe = pending_run.base_row_addresses

    def counting(dataset, keys, primary_key, index):
        looked_up.extend(keys["id"].to_pylist())
        return probe(dataset, keys, primary_key, index)

    monkeypatch.setattr(pending_run, "base_row_addresses", counting)
    return looked_up


def stored_base_rows(table: LsmTable) -> dict[int, int | None]:
    """Each key of the table's stored runs (read from their files) with the base row its run holds."""
    runs = [stored_run(table, shard) for shard in table.shards()]
    return {
        key: row
        for run in runs
        for key, row in zip(run.changes["id"].to_pylist(), run.base_rows.to_pylist(), strict=True)
    }


def assert_runs_match_a_fresh_build(table: LsmTable) -> None:
    """Every stored run holds, for each key, the base row a build from no earlier run finds."""
    stored = stored_base_rows(table)
    drop_pending_runs(table)
    LsmTable.open(table.uri).build_pending_runs()
    assert stored == stored_base_rows(table)


def assert_reads_and_lookups(table: LsmTable, batches: list[pa.Table]) -> None:
    expected = oracle_view(batches)
    assert rows_by_key(table.read()) == expected
    probe = [k for (k,) in list(expected)[:50]] + [999_999]
    assert rows_by_key(table.lookup(probe)) == {(k,): expected[(k,)] for k in probe if (k,) in expected}


def upserts(keys: list[int], schema: pa.Schema) -> pa.Table:
    """A change batch (``schema``: the change stream's) upserting ``keys``."""
    return pa.table(
        {
            "id": pa.array(keys, pa.int64()),
            "customer": ["c"] * len(keys),
            "amount": [1.0] * len(keys),
            "status": ["paid"] * len(keys),
            "_op": ["upsert"] * len(keys),
            "_seq": pa.array(range(len(keys)), pa.int64()),
        },
        schema=schema,
    )


def test_flush_stores_one_run_per_shard_whose_vector_points_at_the_superseded_base_rows(tmp_path):
    table, batches = merged_into_base_then_changed(str(tmp_path / "t.lance"))
    base = table.dataset().to_table(columns=["id"], with_row_address=True)
    address = dict(zip(base["id"].to_pylist(), base["_rowaddr"].to_pylist(), strict=True))
    for shard in table.shards():
        run = stored_run(table, shard)
        assert run is not None and run.generations == shard.pending_generations
        keys = run.changes["id"].to_pylist()
        assert len(set(keys)) == len(keys)
        assert run.base_rows.to_pylist() == [address.get(k, NOT_IN_BASE) for k in keys]
        assert 0 < len(run.superseded.addresses) < len(keys)  # most changes supersede a base row, not all
    assert_reads_and_lookups(LsmTable.open(table.uri), batches)


def test_a_run_read_from_storage_has_its_buffers_aligned_for_their_types(tmp_path):
    """The run's body sits 12 bytes into its file: parsed in place, Acero warned on every join over it."""
    table, _ = merged_into_base_then_changed(str(tmp_path / "t.lance"))
    for shard in table.shards():
        run = stored_run(table, shard)  # read from its file, not the builder's copy
        assert run is not None
        for column in [*run.changes.columns, run.base_rows]:
            for chunk in getattr(column, "chunks", [column]):
                width = chunk.type.bit_width // 8 if pa.types.is_primitive(chunk.type) else 0
                if width > 1:
                    assert chunk.buffers()[1].address % width == 0, chunk.type


def test_a_run_serving_many_lookups_answers_them_through_its_key_index_as_by_scanning(tmp_path):
    table, batches = merged_into_base_then_changed(str(tmp_path / "t.lance"))
    expected = oracle_view(batches)
    deleted = {k for (k,) in oracle_view(batches[:-1])} - {k for (k,) in expected}
    probes = [k for (k,) in list(expected)[:40]] + sorted(deleted)[:10] + [999_999]
    answers = [rows_by_key(table.lookup([k])) for k in probes]  # the first ones scan, the later ones hash
    assert answers == [{(k,): expected[(k,)]} if (k,) in expected else {} for k in probes]
    runs = [table.handle.runs.find(shard) for shard in table.shards() if shard.pending_generations]
    assert runs and all(run is not None and run.index_built(timeout=60) for run in runs)  # built off the lookups
    assert rows_by_key(table.lookup(probes)) == {(k,): expected[(k,)] for k in probes if (k,) in expected}


def indexed_run_and_a_newer_one(tmp_path, stored_by: str) -> tuple[LsmTable, PendingRun]:
    """A one-shard table whose lookups indexed its run (returned), then a newer run over one more
    generation (0 and 1,000 upserted to 2, 1 deleted), stored through the table itself or through
    a table opened as in another process (as a keeper would: the table's cache never sees it)."""
    schema = pa.schema([("id", pa.int64()), ("value", pa.int64())])
    table = LsmTable.create(str(tmp_path / "t.lance"), schema, ["id"], num_shards=1)
    table.write(pa.table({"id": range(1_000), "value": [0] * 1_000}, schema=schema))
    table.close()
    table.compact()
    table.write(pa.table({"id": range(0, 1_000, 2), "value": [1] * 500}, schema=schema))
    table.close()
    table.build_pending_runs()
    for key in range(10):
        table.lookup([key])
    (shard,) = table.shards()
    first = table.handle.runs.for_lookups(shard, table.primary_key)
    assert first is not None and first.index_built(timeout=60)
    writer = table if stored_by == "itself" else in_another_process(LsmTable.open(table.uri))
    writer.write(pa.table({"id": [0, 1, 1_000], "value": [2, 2, 2], "_op": ["upsert", "delete", "upsert"]}))
    writer.close()
    writer.build_pending_runs()  # the newer run: over the first's generation and the new one
    return table, first


def test_lookups_read_the_indexed_run_a_newer_one_extends_until_that_one_is_indexed(tmp_path):
    table, first = indexed_run_and_a_newer_one(tmp_path, stored_by="itself")

    (shard,) = table.shards()
    assert table.handle.runs.for_lookups(shard, table.primary_key) is first  # the newer one is not indexed yet
    answers = [table.lookup([key])["value"].to_pylist() for key in [0, 1, 2, 3, 1_000] * 2]
    assert answers == [[2], [], [1], [0], [2]] * 2  # the new generation is read above the older run
    newer = table.handle.runs.find(shard)
    assert newer is not None and newer is not first and newer.index_built(timeout=60)
    assert table.handle.runs.for_lookups(shard, table.primary_key) is newer
    assert table.lookup([0, 1, 2, 1_000])["value"].to_pylist() == [2, 1, 2]


def test_lookups_read_a_newer_run_another_process_stored_off_their_path(tmp_path, monkeypatch):
    table, first = indexed_run_and_a_newer_one(tmp_path, stored_by="a table opened anew")
    readers = []
    read_run = pending_run.read_run
    monkeypatch.setattr(pending_run, "read_run", lambda *a: readers.append(threading.current_thread()) or read_run(*a))

    (shard,) = table.shards()
    assert table.handle.runs.for_lookups(shard, table.primary_key) is first  # the newer run is read meanwhile
    answers = [table.lookup([key])["value"].to_pylist() for key in [0, 1, 2, 3, 1_000] * 4]
    assert answers == [[2], [], [1], [0], [2]] * 4  # the new generation is read above the older run
    assert builds_done(timeout=60)
    assert readers and threading.main_thread() not in readers
    newer = table.handle.runs.find(shard)
    assert newer is not None and newer is not first and newer.generations == shard.pending_generations
    assert newer.index_built(timeout=60)
    assert table.handle.runs.for_lookups(shard, table.primary_key) is newer
    assert table.lookup([0, 1, 2, 1_000])["value"].to_pylist() == [2, 1, 2]


def test_a_table_opened_anew_reads_no_run_and_builds_no_key_index_an_earlier_one_did(tmp_path, monkeypatch):
    table, batches = merged_into_base_then_changed(str(tmp_path / "t.lance"))
    pending_run.SHARED_RUNS.clear()
    first = LsmTable.open(table.uri)
    assert_reads_and_lookups(first, batches)  # reads each run
    for key in range(50):
        first.lookup([key])  # and indexes its keys
    runs = [first.handle.runs.find(shard) for shard in first.shards()]
    assert all(run is not None and run.index_built(timeout=60) for run in runs)
    read: list[str] = []
    read_run = pending_run.read_run
    monkeypatch.setattr(
        pending_run, "read_run", lambda storage, path, shard: read.append(path) or read_run(storage, path, shard)
    )

    again = LsmTable.open(table.uri)
    assert_reads_and_lookups(again, batches)
    assert not read
    assert [again.handle.runs.for_lookups(shard, again.primary_key) for shard in again.shards()] == runs


def test_without_runs_reads_are_right_and_warn_once_maintenance_is_late(tmp_path, caplog, monkeypatch):
    table, batches = merged_into_base_then_changed(str(tmp_path / "t.lance"))
    drop_pending_runs(table)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert_reads_and_lookups(LsmTable.open(table.uri), batches)
    assert not caplog.text  # just flushed: maintenance has not had its turn yet

    monkeypatch.setattr(pending_run, "MISSING_RUN_WARNING_SECONDS", 0.0)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert_reads_and_lookups(LsmTable.open(table.uri), batches)
    assert caplog.text.count("is missing") == len(table.shard_ids)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert_reads_and_lookups(LsmTable.open(table.uri), batches)
    assert "is missing" not in caplog.text  # said once per process, not once per table object


def test_a_run_found_missing_is_looked_for_again_only_after_the_recheck_interval(tmp_path, monkeypatch):
    table, batches = merged_into_base_then_changed(str(tmp_path / "t.lance"))
    drop_pending_runs(table)
    reader, maintainer = LsmTable.open(table.uri), in_another_process(LsmTable.open(table.uri))
    for each in (reader, maintainer):
        assert_reads_and_lookups(each, batches)  # finds every shard's run missing
    in_another_process(table).build_pending_runs()  # stores them

    shard = reader.shards()[0]
    assert maintainer.handle.runs.find(shard, maintenance=True) is not None  # maintenance always looks
    looks = reads_of(reader, "")
    assert reader.handle.runs.find(shard) is None and not looks  # a read within the interval: no I/O
    assert_reads_and_lookups(reader, batches)  # and reads stay right without the run
    monkeypatch.setattr(pending_run, "MISSING_RUN_RECHECK_SECONDS", 0.0)
    assert reader.handle.runs.find(shard) is not None and looks  # after the interval a read looks again


def test_while_the_newest_generations_wait_for_their_run_reads_use_the_shorter_run_without_looking(
    tmp_path, monkeypatch
):
    table, batches = merged_into_base_then_changed(str(tmp_path / "t.lance"))
    more = list(generate_changes(ChangeStreamSpec(num_keys=2500, num_batches=1, batch_size=300, seed=9)))
    table.write(more[0])
    table.flush()  # a generation per shard newer than the stored runs
    reader = LsmTable.open(table.uri)
    assert_reads_and_lookups(reader, batches + more)
    looks: list[str] = []
    storage = reader.handle.storage
    monkeypatch.setattr(storage, "read_bytes", lambda path, read=storage.read_bytes: looks.append(path) or read(path))
    monkeypatch.setattr(
        storage, "list_files", lambda path, listing=storage.list_files: looks.append(path) or listing(path)
    )
    for shard in reader.shards():
        run = reader.handle.runs.find(shard)
        assert run is not None and run.generations == shard.pending_generations[:-1]
    assert not any(path.startswith(RUNS_DIR) for path in looks)  # neither read nor listed again
    assert_reads_and_lookups(reader, batches + more)


def test_a_corrupt_or_truncated_run_is_read_around_with_a_warning(tmp_path, caplog):
    table, batches = merged_into_base_then_changed(str(tmp_path / "t.lance"))
    first, second = current_runs(table)
    path = table.handle.storage.path(first)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    with open(table.handle.storage.path(second), "r+b") as f:
        f.seek(0)
        f.write(b"not an arrow file")
    pending_run.SHARED_RUNS.clear()  # read by a new process
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert_reads_and_lookups(LsmTable.open(table.uri), batches)
    assert caplog.text.count("is unreadable") == 2


def test_a_base_rewrite_makes_vectors_stale_reads_join_keys_and_the_next_build_refreshes_them(tmp_path):
    table, batches = merged_into_base_then_changed(str(tmp_path / "t.lance"))
    before = fragment_ids(table.dataset())
    maintain_base(table.handle.storage, table.dataset(), REWRITE_EVERY_FRAGMENT)
    assert not before & fragment_ids(table.dataset())  # every row has a new address
    assert_reads_and_lookups(LsmTable.open(table.uri), batches)
    assert sorted(table.build_pending_runs()) == sorted(table.shard_ids)
    assert table.build_pending_runs() == {}  # current now
    assert_reads_and_lookups(LsmTable.open(table.uri), batches)


def _base_rows_of_runs(table: LsmTable) -> list[tuple[int, int]]:
    """(key, base row) of every key the table's stored runs found in the base."""
    return [(key, row) for key, row in stored_base_rows(table).items() if row != int(NOT_IN_BASE)]


def test_a_rewrite_of_some_fragments_joins_and_looks_up_again_only_the_keys_whose_row_moved(tmp_path, monkeypatch):
    table, batches = merged_into_base_then_changed(str(tmp_path / "t.lance"))
    kept = max(fragment_ids(table.dataset()))
    # Lance's own compaction, not a tidy-up: where it put the rows is not recorded.
    table.dataset().optimize.compact_files(excluded_fragment_ids=[kept], materialize_deletions_threshold=0.0)
    assert kept in fragment_ids(table.dataset()) and len(fragment_ids(table.dataset())) > 1
    rows = _base_rows_of_runs(table)
    moved = sorted(key for key, row in rows if row >> 32 != kept)
    assert moved and len(moved) < len(rows)  # the kept fragment holds some of the runs' rows

    reader = LsmTable.open(table.uri)
    levels = resolve_levels(reader.handle.snapshot(fresh=True), ["id"])
    assert sorted(levels.joined_keys["id"].to_pylist()) == moved
    assert_reads_and_lookups(reader, batches)

    looked_up = keys_looked_up_in_base(monkeypatch)
    assert sorted(table.build_pending_runs()) == sorted(table.shard_ids)
    assert sorted(looked_up) == moved
    assert resolve_levels(LsmTable.open(table.uri).handle.snapshot(fresh=True), ["id"]).joined_keys.num_rows == 0
    assert_reads_and_lookups(LsmTable.open(table.uri), batches)


@pytest.mark.parametrize("version_read_kept", [True, False], ids=["followed", "version-read-cleaned-up"])
def test_after_a_tidy_up_rewrote_the_base_the_next_build_follows_the_rows_it_moved(
    tmp_path, monkeypatch, version_read_kept
):
    table, batches = merged_into_base_then_changed(str(tmp_path / "t.lance"))
    moved = sorted(key for key, _ in _base_rows_of_runs(table))
    maintain_base(table.handle.storage, table.dataset(), REWRITE_EVERY_FRAGMENT)
    if not version_read_kept:
        table.dataset().cleanup_old_versions(older_than=timedelta(0))  # and its files: nothing to follow rows in

    looked_up = keys_looked_up_in_base(monkeypatch)
    assert sorted(table.build_pending_runs()) == sorted(table.shard_ids)
    assert sorted(looked_up) == ([] if version_read_kept else moved)
    assert resolve_levels(LsmTable.open(table.uri).handle.snapshot(fresh=True), ["id"]).joined_keys.num_rows == 0
    assert_reads_and_lookups(LsmTable.open(table.uri), batches)
    assert_runs_match_a_fresh_build(table)


@pytest.mark.parametrize("version_read_kept", [True, False], ids=["followed", "version-read-cleaned-up"])
def test_after_a_tidy_up_a_reader_follows_the_rows_it_moved_and_joins_only_the_keys_it_cannot(
    tmp_path, version_read_kept
):
    table, batches = merged_into_base_then_changed(str(tmp_path / "t.lance"))
    moved = sorted(key for key, _ in _base_rows_of_runs(table))
    maintain_base(table.handle.storage, table.dataset(), REWRITE_EVERY_FRAGMENT)
    if not version_read_kept:
        table.dataset().cleanup_old_versions(older_than=timedelta(0))  # and its files: nothing to follow rows in
    reader = LsmTable.open(table.uri)

    for _ in range(2):  # the second read finds the run as the first left it
        levels = resolve_levels(reader.handle.snapshot(fresh=True), ["id"])
        assert sorted(levels.joined_keys["id"].to_pylist()) == ([] if version_read_kept else moved)
    assert_reads_and_lookups(reader, batches)


def test_generations_newer_than_the_stored_run_are_read_on_top_of_it(tmp_path):
    table, batches = merged_into_base_then_changed(str(tmp_path / "t.lance"))
    newest = list(generate_changes(ChangeStreamSpec(num_keys=2500, num_batches=1, batch_size=400, seed=9)))
    table.write(newest[0])
    table.flush()  # only the runs over the older generations exist
    reader = LsmTable.open(table.uri)
    for shard in reader.shards():
        run = stored_run(reader, shard)
        assert run is not None and run.extra_generations(shard) == shard.pending_generations[-1:]
    assert_reads_and_lookups(reader, batches + newest)


def test_an_extended_run_looks_up_only_keys_no_earlier_run_looked_up(tmp_path, monkeypatch):
    table, batches = merged_into_base_then_changed(str(tmp_path / "t.lance"))
    in_runs = [k for shard in table.shards() for k in stored_run(table, shard).changes["id"].to_pylist()]
    looked_up = keys_looked_up_in_base(monkeypatch)
    keys = sorted(in_runs)[:300] + list(range(900_000, 900_050))  # keys the runs hold (in the base or not), new ones
    newest = upserts(keys, batches[0].schema)
    table.write(newest)
    table.flush()
    table.build_pending_runs()

    assert sorted(looked_up) == keys[300:]  # one probe, for the keys never looked up before
    assert_reads_and_lookups(LsmTable.open(table.uri), [*batches, newest])


@pytest.mark.parametrize(
    "lent, tidy",
    [(True, None), (False, None), (True, REWRITE_EVERY_FRAGMENT)],
    ids=["base-much-larger-than-the-keys", "base-cheaper-to-scan", "rows-followed-through-the-merges-tidy-up"],
)
def test_a_run_a_merge_took_part_of_lends_its_base_rows_to_the_run_over_the_rest(tmp_path, monkeypatch, lent, tidy):
    table, batches = merged_into_base_then_changed(str(tmp_path / "t.lance"))
    # This base holds ~4k rows for ~300 keys: lending pays from 100 rows a key on, so it is made to pay here.
    monkeypatch.setattr(pending_run, "_ROWS_SCANNED_PER_KEY_LENT", 1 if lent else 1 << 30)
    merged_first = {k for shard in table.shards() for k in table.handle.runs.find(shard).changes["id"].to_pylist()}
    in_base = set(lance.dataset(table.uri).to_table(columns=["id"])["id"].to_pylist())
    again = sorted(merged_first)[::3]  # the merge changes their base row: what the run found is gone
    untouched = sorted(in_base - merged_first)[:200]  # their base row stays
    new = list(range(900_000, 900_040))  # absent from the base
    rest = upserts(again + untouched + new, batches[0].schema)
    looked_up = keys_looked_up_in_base(monkeypatch)  # counted once the merge commits
    commit_data = compaction.commit_data

    def keeper_meanwhile(*args, **kwargs):
        """While the merge commits what it planned, a writer cuts a generation and a keeper extends the runs."""
        table.write(rest)
        table.flush()
        table.build_pending_runs()
        looked_up.clear()
        return commit_data(*args, **kwargs)

    monkeypatch.setattr(compaction, "commit_data", keeper_meanwhile)
    merged = table.compact(maintenance=tidy)  # then builds the run over the rest
    assert all(s.pending_generations == 1 and s.join_free_passes == s.passes == 1 for s in merged.shards)

    # Lent, the untouched keys kept the rows the longer runs found.
    assert sorted(looked_up) == sorted(again + new if lent else again + untouched + new)
    assert_runs_match_a_fresh_build(table)
    assert_reads_and_lookups(LsmTable.open(table.uri), [*batches, rest])
    assert LsmTable.open(table.uri).count() == len(oracle_view([*batches, rest]))


def test_gc_retires_runs_of_merged_generations_and_leftover_temporary_files(tmp_path):
    table, batches = merged_into_base_then_changed(str(tmp_path / "t.lance"))
    shard = table.shard_ids[0]
    leftover = f"{RUNS_DIR}/{shard}/00000001-00000002-0123456789abcdef.arrow.{'0' * 32}.tmp"
    table.handle.storage.write_bytes_atomic(leftover, b"half a run")
    extra = list(generate_changes(ChangeStreamSpec(num_keys=2500, num_batches=2, batch_size=100, seed=4)))
    for batch in extra:
        table.write(batch)
        table.flush()
        table.build_pending_runs()  # a run over each longer prefix
    everything = {"orphan_grace_seconds": 0, "wal_grace_seconds": 0, "retain_versions": 1, "older_than": None}
    table.gc(**everything)  # nothing merged: only the leftover and runs over shorter prefixes go
    assert stored_runs(table) == sorted(current_runs(table))
    table.compact()
    assert table.gc(**everything).pending_runs.count == len(table.shard_ids)
    assert stored_runs(table) == []
    assert_reads_and_lookups(LsmTable.open(table.uri), batches + extra)


BUILDER = """
import sys
from resources.lsm import LsmTable
from resources.lsm.format.layout import KEY_INDEX_DIR
from tests.helpers import drop_pending_runs
table = LsmTable.open(sys.argv[1])
print("ready", flush=True)
while True:
    drop_pending_runs(table)
    table.handle.storage.delete_dir(KEY_INDEX_DIR)  # written again after the runs, fragment by fragment
    table.build_pending_runs()
"""


def test_sigkill_while_runs_are_built_never_changes_an_answer(tmp_path, caplog):
    table, batches = merged_into_base_then_changed(str(tmp_path / "t.lance"))
    rng = random.Random(3)
    for _ in range(6):
        child = subprocess.Popen(
            [sys.executable, "-c", BUILDER, table.uri], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 0.6))
        child.send_signal(signal.SIGKILL)
        child.wait()
        pending_run.SHARED_RUNS.clear()  # read what the kill left, as a new process would
        with caplog.at_level(logging.WARNING):
            assert_reads_and_lookups(LsmTable.open(table.uri), batches)  # through whichever key indexes exist
        assert "unreadable" not in caplog.text  # runs appear whole or not at all
        assert "does not index" not in caplog.text  # and so do key indexes
    # Whatever the kills left, the next build completes the runs and key indexes, and GC the half-written files.
    table.build_pending_runs()
    for state in table.shards():
        assert table.handle.storage.exists(run_path(state.shard_id, state.pending_generations))
    table.gc(orphan_grace_seconds=0, wal_grace_seconds=0, older_than=None, retain_versions=1)
    indexes = {f"{KEY_INDEX_DIR}/{entry.name}" for entry in table.handle.storage.list_files(KEY_INDEX_DIR)}
    assert indexes == {key_hash_file(f, KEY_INDEX_DIR) for f in table.dataset().get_fragments()}
    assert_reads_and_lookups(LsmTable.open(table.uri), batches)
