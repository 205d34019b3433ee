"""Merge into base: the merged view never changes and every generation lands exactly once.

Real Lance tables on disk; crashes are real SIGKILLs of a subprocess.
"""

from __future__ import annotations

import itertools
import random
import shutil
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import lance
import pyarrow as pa
import pytest
from lance.dataset import MergeInsertBuilder

from resources.lsm import LsmTable, MaintenancePolicy
from resources.lsm.format.compaction_marker import read_compacted_generations
from resources.lsm.maintenance import compaction
from resources.lsm.testing.changegen import EVENTS_SCHEMA, ChangeStreamSpec, generate_changes
from tests.helpers import rows_by_key, write_generation
from tests.resources.lsm.maintenance.maintenance_helpers import (
    assert_base_sane,
    assert_view,
    build_change_table,
    data_commits,
    marker_advances,
    markers_only_advance,
    merge_commits,
    oracle_view,
    run_worker,
)


def _generations(table: LsmTable) -> dict[str, tuple[int, ...]]:
    return {s.shard_id: tuple(g for g, _ in s.pending_generations) for s in table.shards()}


def _marker_history(table: LsmTable, shard_id: str) -> list[int]:
    markers = [
        read_compacted_generations(table.handle.storage, v["version"]).get(shard_id, 0)
        for v in table.dataset().versions()
    ]
    return sorted(set(markers))


def test_shard_by_shard_compaction_keeps_the_view_and_fills_the_base(tmp_path):
    table, batches = build_change_table(str(tmp_path / "t.lance"))
    pending = _generations(table)
    assert all(len(g) == len(batches) - 1 for g in pending.values())

    results = []
    for shard_id in table.shard_ids:
        (result,) = table.compact(shard_id, max_rows_per_pass=250).shards
        results.append(result)
        assert result.generations_merged == pending[shard_id]
        assert result.passes > 1  # 5 generations of ~170 rows each do not fit in 250 rows
        assert (result.compacted_generation, result.pending_generations) == (pending[shard_id][-1], 0)
        assert result.oldest_pending_age_seconds is None
        assert_view(table, batches)
        assert_base_sane(table.uri)

    assert sum(r.deletes_applied for r in results) > 0
    # Everything flushed is in the base; the WAL tail is still only in the WAL.
    assert rows_by_key(lance.dataset(table.uri).to_table()) == oracle_view(batches[:-1])
    assert rows_by_key(table.read(fresh=False)) == oracle_view(batches[:-1])
    assert marker_advances(table) == {r.shard_id: r.passes for r in results}

    again = table.compact()
    assert again.generations_merged == 0 and again.maintenance is None
    assert marker_advances(table) == {r.shard_id: r.passes for r in results}


def test_a_pass_stops_at_the_row_bound_but_takes_at_least_one_generation(tmp_path):
    table, _ = build_change_table(str(tmp_path / "a.lance"), num_shards=1, num_batches=5, batch_size=200)
    shard = table.shard_ids[0]
    sizes = [
        lance.dataset(f"{table.uri}/_mem_wal/{shard}/{d}").count_rows()
        for _, d in table.shards()[0].pending_generations
    ]
    other = shutil.copytree(table.uri, tmp_path / "b.lance")

    table.compact(max_rows_per_pass=1)
    assert _marker_history(table, shard) == [0, 1, 2, 3, 4]

    # The first merge into an empty base takes one generation per shard, whatever the bound.
    table = LsmTable.open(str(other))
    table.compact(max_rows_per_pass=sizes[1] + sizes[2])
    assert _marker_history(table, shard) == [0, 1, 3, 4]


def test_deletes_reinserts_and_updates_across_generations(make_table):
    table = make_table(num_shards=2)
    lowest = -(2**63)  # the one int64 that needs special SQL

    def flush(rows: list[dict]) -> None:
        table.write(pa.Table.from_pylist(rows, schema=table.schema.append(pa.field("_op", pa.string()))))
        table.close()

    def up(key: int, name: str) -> dict:
        return {"id": key, "name": name, "price": 1.0, "_op": "upsert"}

    def delete(key: int) -> dict:
        return {"id": key, "_op": "delete"}

    flush([up(k, "v1") for k in (lowest, 1, 2, 3, 4, 5)])
    table.compact()
    flush([delete(1), delete(2), up(3, "v2"), up(7, "v2"), delete(lowest)])
    flush([up(1, "v3"), delete(7), delete(100), up(3, "v3")])
    result = table.compact()

    expected = {(1,): "v3", (3,): "v3", (4,): "v1", (5,): "v1"}
    assert {k: r["name"] for k, r in rows_by_key(table.read()).items()} == expected
    assert {k: r["name"] for k, r in rows_by_key(lance.dataset(table.uri).to_table()).items()} == expected
    # Base rows touched: 1 and 3 updated; 2 and the lowest key deleted (7 and 100 never reached the base).
    assert (result.rows_upserted, result.rows_deleted) == (2, 2)


def test_a_key_written_many_times_within_one_generation_lands_once_with_its_last_write(make_table):
    table = make_table(num_shards=1)
    for name in ("a", "b", None, "c"):  # None: a delete in between
        row = {"id": [7], "_op": ["delete"]} if name is None else {"id": [7], "name": [name], "price": [1.0]}
        table.write(pa.table(row))
    table.write(pa.table({"id": [8], "name": ["x"], "price": [1.0]}))
    table.write(pa.table({"id": [8], "_op": ["delete"]}))
    table.close()
    assert len(table.shards()[0].pending_generations) == 1

    result = table.compact()
    assert (result.rows_upserted, result.rows_deleted) == (1, 0)
    assert rows_by_key(lance.dataset(table.uri).to_table()) == {(7,): {"id": 7, "name": "c", "price": 1.0}}


def test_composite_keys_with_awkward_strings_are_deleted_exactly(make_table):
    schema = pa.schema([("region", pa.string()), ("id", pa.int32()), ("name", pa.string())])
    table = make_table(schema, primary_key=("region", "id"), num_shards=2)
    regions = ["eu", "o'b|1:x", "1:o", "", "é|", "x\\"]
    table.write(
        pa.table(
            {
                "region": [r for r in regions for _ in range(3)],
                "id": pa.array([i for _ in regions for i in range(3)], pa.int32()),
                "name": ["v1"] * (3 * len(regions)),
            }
        )
    )
    table.close()
    table.compact()
    doomed = [("o'b|1:x", 1), ("1:o", 2), ("", 0), ("é|", 1), ("x\\", 2), ("nowhere", 1)]
    table.write(
        pa.table(
            {
                "region": [r for r, _ in doomed],
                "id": pa.array([i for _, i in doomed], pa.int32()),
                "_op": ["delete"] * len(doomed),
            }
        )
    )
    table.close()
    result = table.compact()

    expected = {(r, i) for r in regions for i in range(3)} - set(doomed)
    assert set(rows_by_key(table.read(), ("region", "id"))) == expected
    assert set(rows_by_key(lance.dataset(table.uri).to_table(), ("region", "id"))) == expected
    assert result.rows_deleted == len(doomed) - 1


def test_every_key_column_is_indexed_and_older_tables_gain_their_key_indexes_at_the_next_merge(make_table):
    schema = pa.schema([("region", pa.string()), ("id", pa.int32()), ("name", pa.string())])
    table = make_table(schema, primary_key=("region", "id"), num_shards=2)
    assert key_indexes(table) == {"region", "id"}

    for index in table.dataset().describe_indices():  # a table from before composite keys were indexed
        if index.field_names:
            table.dataset().drop_index(index.name)
    assert key_indexes(table) == set()
    table.write(pa.table({"region": ["eu", "us"], "id": pa.array([1, 2], pa.int32()), "name": ["a", "b"]}))
    table.close()
    table.compact()
    assert key_indexes(table) == {"region", "id"}
    plan = table.dataset().scanner(filter="region = 'eu' AND id = 1").explain_plan()
    assert "ScalarIndexQuery" in plan, plan
    assert rows_by_key(table.lookup([("eu", 1)]), ("region", "id")) == {
        ("eu", 1): {"region": "eu", "id": 1, "name": "a"}
    }


def key_indexes(table: LsmTable) -> set[str]:
    return {name for index in table.dataset().describe_indices() for name in index.field_names}


def test_concurrent_first_merges_into_an_empty_base_commit_each_generation_once(tmp_path, monkeypatch):
    table, batches = build_change_table(str(tmp_path / "t.lance"), num_shards=1)
    both_planned = threading.Barrier(2, timeout=30)
    original = MergeInsertBuilder.execute
    state = threading.local()

    def execute(self, *args, **kwargs):
        if not getattr(state, "waited", False):  # hold both first commits until both planned
            state.waited = True
            both_planned.wait()
        return original(self, *args, **kwargs)

    monkeypatch.setattr(MergeInsertBuilder, "execute", execute)
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda _: LsmTable.open(table.uri).compact().shards[0], range(2)))

    assert sum(r.conflicts for r in results) >= 1
    merged = sorted(g for r in results for g in r.generations_merged)
    assert merged == list(range(1, len(batches)))  # each generation once
    assert markers_only_advance(table)
    assert_view(table, batches)
    assert_base_sane(table.uri)


def test_generations_flushed_during_a_merge_wait_for_the_next_one(tmp_path, monkeypatch):
    table, batches = build_change_table(str(tmp_path / "t.lance"), num_shards=2)
    before = _generations(table)
    late = next(generate_changes(ChangeStreamSpec(num_keys=2500, num_batches=1, batch_size=300, seed=99)))
    original = MergeInsertBuilder.execute

    def execute(self, *args, **kwargs):
        if late is not None and not getattr(execute, "done", False):
            execute.done = True
            writer = LsmTable.open(table.uri)
            writer.write(late)
            writer.close()  # replays the WAL tail and flushes it with `late`: a new generation
        return original(self, *args, **kwargs)

    monkeypatch.setattr(MergeInsertBuilder, "execute", execute)
    result = table.compact()
    assert {r.shard_id: r.generations_merged for r in result.shards} == before
    assert all(r.pending_generations == 1 and r.oldest_pending_age_seconds >= 0 for r in result.shards)
    assert_view(table, [*batches, late])

    monkeypatch.setattr(MergeInsertBuilder, "execute", original)
    table.compact()
    assert all(not s.pending_generations for s in table.shards())
    assert rows_by_key(lance.dataset(table.uri).to_table()) == oracle_view([*batches, late])


def test_writers_running_during_compaction_lose_nothing(tmp_path):
    table, batches = build_change_table(str(tmp_path / "t.lance"), num_shards=2)
    more = list(generate_changes(ChangeStreamSpec(num_keys=2500, num_batches=6, batch_size=300, seed=11)))

    def write_and_flush() -> None:
        writer = LsmTable.open(table.uri)
        for batch in more:
            writer.write(batch)
            writer.flush()

    thread = threading.Thread(target=write_and_flush)
    thread.start()
    merged = 0
    while thread.is_alive():
        merged += table.compact(maintenance=None).generations_merged
    thread.join()
    merged += table.compact().generations_merged

    assert merged == sum(len(s.flushed_generations) for s in table.shards())
    assert_view(table, batches + more)
    assert_base_sane(table.uri)
    assert rows_by_key(lance.dataset(table.uri).to_table()) == oracle_view(batches + more)


def test_maintenance_compacts_small_fragments_and_catches_indexes_up(tmp_path):
    table, batches = build_change_table(str(tmp_path / "t.lance"))
    result = table.compact(max_rows_per_pass=250, maintenance=MaintenancePolicy(max_small_fragments=2))

    assert result.maintenance.files_compacted and result.maintenance.indices_optimized
    assert 0 < result.maintenance.elapsed_seconds < result.elapsed_seconds
    base = table.dataset()
    assert base.version == result.maintenance.base_version
    assert len(base.get_fragments()) <= 2
    assert base.stats.index_stats("id_idx")["num_unindexed_rows"] == 0
    assert {s.shard_id: s.compacted_generation for s in table.shards()} == {
        r.shard_id: r.compacted_generation for r in result.shards
    }
    assert_view(table, batches)


@pytest.mark.parametrize("max_deleted_fraction, rewritten", [(0.1, True), (0.3, False)])
def test_a_tidy_up_rewrites_the_fragments_past_the_policys_deleted_fraction(tmp_path, max_deleted_fraction, rewritten):
    table = LsmTable.create(str(tmp_path / "t.lance"), EVENTS_SCHEMA, ["id"], num_shards=1)
    write_generation(table, list(range(1000)), "first")
    table.compact(maintenance=None)
    (large,) = [f.fragment_id for f in table.dataset().get_fragments()]
    for start in range(0, 200, 50):  # 20% of its rows updated, a small fragment added by each merge
        write_generation(table, list(range(start, start + 50)), "again")
        table.compact(maintenance=None)

    # The small fragments start the tidy-up; the policy decides whether the large one is rewritten too.
    write_generation(table, [5], "last")
    policy = MaintenancePolicy(
        max_small_fragments=1,
        small_fragment_rows=500,
        target_fragment_rows=1000,  # the large fragment is not merged with them for its size
        max_deleted_fraction=max_deleted_fraction,
    )
    tidy = table.compact(maintenance=policy).maintenance

    assert tidy.files_compacted
    assert (large not in {f.fragment_id for f in table.dataset().get_fragments()}) == rewritten
    view = rows_by_key(table.read())
    assert len(view) == 1000 and view[(5,)]["customer"] == "last" and view[(100,)]["customer"] == "again"


def test_a_tidy_up_rewrites_at_most_its_budget_and_later_merges_go_on_where_it_stopped(tmp_path):
    table = LsmTable.create(str(tmp_path / "t.lance"), EVENTS_SCHEMA, ["id"], num_shards=1)
    for start in range(0, 1000, 250):
        write_generation(table, list(range(start, start + 250)), "first")
        table.compact(maintenance=None)
    originals = {f.fragment_id for f in table.dataset().get_fragments()}
    assert len(originals) == 4
    policy = MaintenancePolicy(target_fragment_rows=250, max_rows_rewritten_per_pass=300)  # one group a pass
    customers = dict.fromkeys(range(1000), "first")
    left = []
    for i in range(3):
        updated = [k for k in range(1000) if k % 5 == i]  # a fifth of every fragment's rows
        write_generation(table, updated, f"again {i}")
        table.build_pending_runs()  # runs whose rows the tidy-up moves
        customers.update(dict.fromkeys(updated, f"again {i}"))
        tidy = table.compact(maintenance=policy).maintenance

        assert tidy.files_compacted and tidy.fragments_removed >= 1
        left.append(len(originals & {f.fragment_id for f in table.dataset().get_fragments()}))
        view = rows_by_key(table.read())
        assert {key[0]: row["customer"] for key, row in view.items()} == customers
    assert 0 < left[0] < len(originals) and left[-1] == 0  # the first pass left some for the next ones


@pytest.mark.parametrize("delta_fraction, most_segments", [(1.0, 3), (0.0, 2)])
def test_each_merge_indexes_only_its_rows_and_merges_index_deltas_occasionally(tmp_path, delta_fraction, most_segments):
    # delta_fraction 1.0: deltas never outgrow the base's segment, so they are only merged
    # among themselves; 0.0: every second merge rebuilds the index into one segment.
    batches = list(generate_changes(ChangeStreamSpec(num_keys=2000, num_batches=8, batch_size=300, seed=3)))
    table = LsmTable.create(str(tmp_path / "t.lance"), EVENTS_SCHEMA, ["id"], num_shards=2)
    policy = MaintenancePolicy(max_index_deltas=2, max_index_delta_fraction=delta_fraction)
    segments = []
    for batch in batches:
        table.write(batch)
        table.close()
        table.compact(maintenance=policy)
        stats = table.dataset().stats.index_stats("id_idx")
        assert stats["num_unindexed_rows"] == 0
        segments.append(len(stats["num_indexed_rows_per_delta"]))

    assert max(segments) == most_segments  # at most 1 + max_index_deltas, and reached
    assert any(later < earlier for earlier, later in itertools.pairwise(segments))  # merged again
    assert_view(table, batches)
    some = [row["id"] for row in table.read(columns=["id"]).slice(0, 50).to_pylist()]
    assert sorted(table.lookup(some)["id"].to_pylist()) == sorted(some)  # answered through the segments
    # Every optimization records the index catch-up, so GC can delete what was merged.
    assert (
        table.gc(
            orphan_grace_seconds=0, wal_grace_seconds=0, retain_versions=1, older_than=None
        ).compacted_generations.count
        > 0
    )
    assert_view(table, batches)


def test_compact_rejects_unknown_shards_and_empty_passes(make_table):
    table = make_table()
    with pytest.raises(ValueError, match="unknown shards"):
        table.compact("00000000-0000-0000-0000-000000000000")
    with pytest.raises(ValueError, match="max_rows_per_pass"):
        table.compact(max_rows_per_pass=0)


def test_the_first_merge_into_an_empty_base_commits_one_generation_per_shard_with_its_marker(tmp_path):
    table, batches = build_change_table(str(tmp_path / "t.lance"))
    pending = _generations(table)

    result = table.compact(maintenance=None)

    # Commit 1: data and markers together, generation 1 of every shard; then one data commit for the rest
    # of every shard (its claim) and one marker commit.
    assert (merge_commits(table), data_commits(table)) == (2, 1)
    assert {r.shard_id: (r.generations_merged, r.passes) for r in result.shards} == {
        s: (g, 2) for s, g in pending.items()
    }
    assert len({r.base_version for r in result.shards}) == 1
    assert result.rows_deleted == 0 or sum(r.deletes_applied for r in result.shards) > 0
    assert rows_by_key(lance.dataset(table.uri).to_table()) == oracle_view(batches[:-1])
    assert_view(table, batches)


def _merged_then_flushed(tmp_path, *, num_batches: int, seed: int, runs: bool) -> tuple[LsmTable, list[pa.Table]]:
    """A table merged once, then ``num_batches`` more batches flushed (with their pending runs if ``runs``)."""
    table, batches = build_change_table(str(tmp_path / "t.lance"))
    table.compact()
    more = list(generate_changes(ChangeStreamSpec(num_keys=4000, num_batches=num_batches, batch_size=600, seed=seed)))
    for batch in more:
        table.write(batch)
        table.close()
    if runs:
        table.build_pending_runs()
    return table, [*batches, *more]


@pytest.mark.parametrize("with_runs", [True, False], ids=["join-free", "merge_insert"])
def test_one_data_commit_and_one_marker_commit_merge_every_shard(tmp_path, with_runs):
    table, batches = _merged_then_flushed(tmp_path, num_batches=3, seed=23, runs=with_runs)
    pending = _generations(table)
    commits_before = (merge_commits(table), data_commits(table))

    result = table.compact(maintenance=None)

    assert (merge_commits(table), data_commits(table)) == (commits_before[0] + 1, commits_before[1] + 1)
    assert {r.shard_id: (r.generations_merged, r.passes, r.join_free_passes) for r in result.shards} == {
        s: (g, 1, int(with_runs)) for s, g in pending.items()
    }
    assert result.rows_deleted > 0  # the new batches delete keys the base holds
    assert rows_by_key(lance.dataset(table.uri).to_table()) == oracle_view(batches)
    assert_view(table, batches)
    assert_base_sane(table.uri)


def test_a_run_a_keeper_extended_past_the_merges_targets_merges_whole_and_join_free(tmp_path, monkeypatch):
    table, batches = _merged_then_flushed(tmp_path, num_batches=2, seed=47, runs=True)
    (later,) = generate_changes(ChangeStreamSpec(num_keys=4000, num_batches=1, batch_size=600, seed=53))
    merge_round, cut = compaction._merge_round, []

    def keeper_first(*args, **kwargs):
        """Once the merge fixed its targets, a writer cuts a generation and a keeper extends the runs over it."""
        if not cut:
            cut.append(later)
            table.write(later)
            table.close()
            table.build_pending_runs()
        return merge_round(*args, **kwargs)

    monkeypatch.setattr(compaction, "_merge_round", keeper_first)
    result = table.compact(maintenance=None)

    assert all(r.passes == r.join_free_passes == 1 and r.pending_generations == 0 for r in result.shards)
    assert all(len(r.generations_merged) == 3 for r in result.shards)  # the two targeted, and the one cut since
    assert rows_by_key(lance.dataset(table.uri).to_table()) == oracle_view([*batches, later])


def test_runs_only_merges_the_runs_and_leaves_generations_without_one_for_a_later_call(tmp_path):
    table, batches = _merged_then_flushed(tmp_path, num_batches=2, seed=37, runs=True)
    with_runs = _generations(table)
    later = list(generate_changes(ChangeStreamSpec(num_keys=4000, num_batches=1, batch_size=600, seed=41)))
    table.write(later[0])
    table.close()  # no run: a keeper would build it within seconds
    batches += later

    first = table.compact(maintenance=None, runs_only=True)

    assert {r.shard_id: (r.generations_merged, r.passes, r.join_free_passes) for r in first.shards} == {
        s: (g, 1, 1) for s, g in with_runs.items()
    }
    assert all(r.pending_generations == 1 for r in first.shards)
    assert_view(table, batches)
    second = table.compact(maintenance=None, runs_only=True)  # the first call ended building their runs
    assert all(r.join_free_passes == r.passes == 1 and r.pending_generations == 0 for r in second.shards)
    assert rows_by_key(lance.dataset(table.uri).to_table()) == oracle_view(batches)


def test_runs_only_without_any_run_merges_everything_as_before(tmp_path):
    table, batches = _merged_then_flushed(tmp_path, num_batches=2, seed=43, runs=False)
    pending = _generations(table)

    result = table.compact(maintenance=None, runs_only=True)

    assert {r.shard_id: (r.generations_merged, r.join_free_passes) for r in result.shards} == {
        s: (g, 0) for s, g in pending.items()
    }
    assert rows_by_key(lance.dataset(table.uri).to_table()) == oracle_view(batches)


def test_a_join_free_merge_keeps_the_key_index_finding_every_row(tmp_path):
    table, batches = _merged_then_flushed(tmp_path, num_batches=2, seed=29, runs=True)
    table.compact(maintenance=None)  # the new rows are not indexed yet
    expected = oracle_view(batches)
    base = lance.dataset(table.uri)
    assert base.stats.index_stats("id_idx")["num_unindexed_rows"] > 0
    keys = [k for (k,) in expected][::7]
    found = base.to_table(filter=f"id IN ({', '.join(map(str, keys))})")
    assert "ScalarIndexQuery" in base.scanner(filter=f"id IN ({keys[0]})").explain_plan()
    assert rows_by_key(found) == {(k,): expected[(k,)] for k in keys}


def _hold_data_commits(monkeypatch, parties: int) -> threading.Event:
    """Make the first data commit of each of ``parties`` threads wait until all of them reach it."""
    planned = threading.Barrier(parties, timeout=60)
    first_arrived = threading.Event()
    original = compaction.commit_data
    state = threading.local()

    def commit_data(*args, **kwargs):
        if not getattr(state, "waited", False):
            state.waited = True
            first_arrived.set()
            planned.wait()
        return original(*args, **kwargs)

    monkeypatch.setattr(compaction, "commit_data", commit_data)
    return first_arrived


def test_concurrent_merges_over_different_generations_and_paths_commit_each_generation_once(tmp_path, monkeypatch):
    table, batches = build_change_table(str(tmp_path / "t.lance"), num_shards=1)
    table.compact()
    more = list(generate_changes(ChangeStreamSpec(num_keys=2500, num_batches=4, batch_size=300, seed=31)))
    for batch in more[:3]:
        table.write(batch)
        table.close()
    table.build_pending_runs()
    first_planned = _hold_data_commits(monkeypatch, 2)
    with ThreadPoolExecutor(max_workers=1) as pool:
        with_run = pool.submit(lambda: table.compact(maintenance=None).shards[0])
        assert first_planned.wait(60)
        # The second merge plans later: one more generation, and no run (it must join).
        shutil.rmtree(tmp_path / "t.lance" / "_lsm_runs")
        table.write(more[3])
        table.close()
        joined = LsmTable.open(table.uri).compact(maintenance=None).shards[0]
        first = with_run.result()

    merged = sorted(first.generations_merged + joined.generations_merged)
    assert merged == sorted(set(merged)) and len(merged) == 4  # every new generation once
    assert first.conflicts + joined.conflicts >= 1
    assert markers_only_advance(table)
    assert rows_by_key(lance.dataset(table.uri).to_table()) == oracle_view([*batches, *more])
    assert_view(table, [*batches, *more])
    assert_base_sane(table.uri)


# ---------------------------------------------------------------- crash matrix


@pytest.fixture(scope="module")
def crash_template(tmp_path_factory):
    """One table (3 shards x 5 generations + a WAL tail) copied for every crash scenario."""
    uri = str(tmp_path_factory.mktemp("crash") / "template.lance")
    _, batches = build_change_table(uri)
    return uri, batches


def _assert_recovers(uri: str, batches: list[pa.Table]) -> None:
    """The view is intact now, and a clean re-run merges the rest exactly once."""
    table = LsmTable.open(uri)
    assert_view(table, batches)
    assert_base_sane(uri)
    table.compact()
    assert_view(table, batches)
    assert_base_sane(uri)
    assert markers_only_advance(table)
    assert all(s.compacted_generation == s.flushed_generations[-1][0] for s in table.shards())
    assert rows_by_key(lance.dataset(uri).to_table()) == oracle_view(batches[:-1])


@pytest.fixture(scope="module")
def crash_template_with_runs(tmp_path_factory):
    """A merged table with 3 more generations per shard, their pending runs built, and a WAL tail."""
    uri = str(tmp_path_factory.mktemp("crash-runs") / "template.lance")
    table, batches = build_change_table(uri)
    table.compact()
    table.close()
    more = list(generate_changes(ChangeStreamSpec(num_keys=2500, num_batches=4, batch_size=500, seed=37)))
    for batch in more[:-1]:
        table.write(batch)
        table.close()
    table.write(more[-1])
    table.detach_writers()
    table.build_pending_runs()
    return uri, [*batches, *more]


def _commits(table: LsmTable) -> int:
    return merge_commits(table) + data_commits(table)


# A first merge: whole commits (empty base), then data and marker commits in turn.
@pytest.mark.parametrize(
    ("mode", "nth"),
    [("before-commit", 1), ("after-commit", 1), ("before-commit", 5), *(("after-commit", n) for n in (4, 5, 6))],
)
def test_compaction_killed_before_or_after_a_commit(crash_template, tmp_path, mode, nth):
    template, batches = crash_template
    uri = str(shutil.copytree(template, tmp_path / "t.lance"))
    before = _commits(LsmTable.open(uri))

    assert run_worker(uri, "compact", mode, nth) == -signal.SIGKILL
    committed = nth - 1 if mode == "before-commit" else nth
    assert _commits(LsmTable.open(uri)) - before == committed
    _assert_recovers(uri, batches)


# A join-free merge: commit 1 is its data (deletion files, new rows, the claim), commit 2 its marker.
@pytest.mark.parametrize(("mode", "nth"), [("before-commit", 1), ("after-commit", 1), ("after-commit", 2)])
def test_join_free_merge_killed_around_its_two_commits(crash_template_with_runs, tmp_path, mode, nth):
    template, batches = crash_template_with_runs
    uri = str(shutil.copytree(template, tmp_path / "t.lance"))
    table = LsmTable.open(uri)
    before = (merge_commits(table), data_commits(table))

    assert run_worker(uri, "compact", mode, nth) == -signal.SIGKILL
    table = LsmTable.open(uri)
    after = (merge_commits(table), data_commits(table))
    assert (
        after
        == {1: before, 2: (before[0], before[1] + 1), 3: (before[0] + 1, before[1] + 1)}[nth + (mode == "after-commit")]
    )
    assert_view(table, batches)  # between the two commits too: the claim covers what the marker lags
    table.compact()
    assert data_commits(table) == before[1] + 1  # a re-run settles the claim, it never re-applies the data
    _assert_recovers(uri, batches)


def test_compactions_killed_at_random_moments_during_commits(crash_template, tmp_path):
    template, batches = crash_template
    uri = str(shutil.copytree(template, tmp_path / "t.lance"))
    rng = random.Random(5)
    for _ in range(5):
        run_worker(uri, "compact", "during-commit", 1, rng.uniform(0.0, 0.02))
        table = LsmTable.open(uri)
        assert_view(table, batches)
        assert_base_sane(uri)
        assert markers_only_advance(table)
    _assert_recovers(uri, batches)
