"""Maintenance assets and jobs: the merged view never changes, metadata is numeric."""

from __future__ import annotations

import subprocess
import sys

import lance
import pytest
from dagster import DagsterRun, DagsterRunStatus, instance_for_test, materialize

from jobs import flush_job, merge_job
from lsm_assets.live_writers import WRITER_TAGS
from lsm_assets.maintenance import flushed_generations, garbage_collected, merged_base
from resources.gx_resource import GreatExpectationsResource
from resources.lsm import LsmTable, TableVersion
from resources.lsm.maintenance.merge_leases import merge_leases
from resources.lsm.maintenance.pending_runs import has_pending_run
from resources.lsm.testing.changegen import EVENTS_SCHEMA, ChangeStreamSpec, generate_changes, replay
from resources.table_resource import LsmTableResource
from tests.helpers import REPO_ROOT, keys_in_bucket, resolved_job, rows_by_key, write_generation


def _table_with_history(make_table) -> tuple[LsmTable, dict]:
    """Three generations per shard with deletes and re-inserts, plus an unflushed WAL tail."""
    table = make_table(EVENTS_SCHEMA, num_shards=4)
    batches = list(
        generate_changes(
            ChangeStreamSpec(num_keys=300, num_batches=4, batch_size=250, delete_ratio=0.2, reinsert_ratio=0.1, seed=11)
        )
    )
    for batch in batches[:3]:
        table.write(batch)
        table.close()
    table.write(batches[3])
    table.detach_writers()  # crashed writers: the last batch is only in the WAL
    return LsmTable.open(table.uri), replay(batches)


def _view(table: LsmTable, fresh: bool = True) -> dict:
    return {k[0]: v for k, v in rows_by_key(table.read(fresh=fresh)).items()}


def test_flush_merge_and_gc_jobs_keep_the_view_and_report_numbers(make_table):
    table, oracle = _table_with_history(make_table)
    resources = {"lsm_table": LsmTableResource(uri=table.uri)}
    assert _view(table) == oracle

    flushed = resolved_job(flush_job, resources).execute_in_process(
        run_config={"ops": {"flushed_generations": {"config": {"idle_seconds": 0}}}}
    )
    assert flushed.success and _view(table) == oracle and _view(table, fresh=False) == oracle
    assert all(s.unflushed_wal_entries == 0 for s in table.shards())
    flush_metadata = flushed.asset_materializations_for_node("flushed_generations")[0].metadata
    assert flush_metadata["flushed"].value == 4 and flush_metadata["unflushed_wal_entries"].value == 0
    after_flush = flush_metadata["table_version"].value

    merged = resolved_job(merge_job, {**resources, "gx": GreatExpectationsResource()}).execute_in_process()
    assert merged.success and _view(table) == oracle
    guards = {e.check_name: e.passed for e in merged.get_asset_check_evaluations()}
    assert guards == {"base_primary_key_unique": True, "base_primary_key_not_null": True, "shards_recoverable": True}
    (materialization,) = merged.asset_materializations_for_node("merged_base")
    metadata = {k: v.value for k, v in materialization.metadata.items()}
    assert metadata["shards"] == 4
    assert metadata["generations_merged"] == sum(len(s.flushed_generations) for s in table.shards())
    assert sum(metadata[f"shard_{b}_generations_merged"] for b in range(4)) == metadata["generations_merged"]
    assert metadata["lag_generations"] == 0 and all(metadata[f"shard_{b}_lag_generations"] == 0 for b in range(4))
    assert 0 < metadata["maintenance_s"] < metadata["elapsed_s"]  # tidying the base is part of the merge's time
    assert TableVersion.parse(metadata["table_version"]) > TableVersion.parse(after_flush)
    base = rows_by_key(table.dataset().to_table())  # unique keys in the base itself
    assert {k[0] for k in base} == set(oracle)

    gc_config = {"orphan_grace_seconds": 0, "wal_grace_seconds": 0, "version_retention_hours": 0}
    generations = sum(len(s.flushed_generations) for s in table.shards())
    collected = materialize(
        [garbage_collected], resources=resources, run_config={"ops": {"garbage_collected": {"config": gc_config}}}
    )
    assert collected.success and _view(table) == oracle
    metadata = collected.asset_materializations_for_node("garbage_collected")[0].metadata
    assert metadata["compacted_generations_deleted"].value == generations
    assert metadata["wal_entries_deleted"].value > 0
    assert metadata["bytes_reclaimed"].value > 0
    # The merge's version is the latest, which GC keeps whatever the retention: it reads its view again.
    assert _view_as_of(table, materialization.metadata["table_version"].value) == oracle


def _view_as_of(table: LsmTable, version: str) -> dict:
    return {k[0]: v for k, v in rows_by_key(table.read(as_of=version)).items()}


def test_assets_work_on_the_configured_shards_and_flush_skips_live_writers(make_table):
    table, oracle = _table_with_history(make_table)
    resources = {"lsm_table": LsmTableResource(uri=table.uri), "gx": GreatExpectationsResource()}
    flush_shard_1 = {"ops": {"flushed_generations": {"config": {"idle_seconds": 0, "shards": [1]}}}}
    with instance_for_test() as instance:
        instance.add_run(
            DagsterRun(job_name="ingest_job", run_id="live", tags=WRITER_TAGS, status=DagsterRunStatus.STARTED)
        )
        skipped = materialize([flushed_generations], resources=resources, instance=instance, run_config=flush_shard_1)
        assert skipped.asset_materializations_for_node("flushed_generations")[0].metadata["flushed"].value == 0
        assert table.shards()[1].unflushed_wal_entries > 0

        instance.delete_run("live")
        done = materialize([flushed_generations], resources=resources, instance=instance, run_config=flush_shard_1)
        metadata = done.asset_materializations_for_node("flushed_generations")[0].metadata
        assert metadata["shards"].value == 1 and metadata["shard_1_flushed"].value == 1
        assert table.shards()[1].unflushed_wal_entries == 0
        assert table.shards()[2].unflushed_wal_entries > 0

        merged = materialize(
            [merged_base],
            resources=resources,
            instance=instance,
            run_config={"ops": {"merged_base": {"config": {"shards": [1]}}}},
        )
        metadata = merged.asset_materializations_for_node("merged_base")[0].metadata
        assert metadata["shard_1_generations_merged"].value == 4 and metadata["shard_1_lag_generations"].value == 0
        assert "shard_2_generations_merged" not in metadata
        assert table.shards()[1].pending_generations == ()
        assert table.shards()[2].pending_generations != ()
    assert _view(table) == oracle


def test_the_flush_leaves_the_runs_of_shards_under_merge_to_that_merge(make_table):
    table, oracle = _table_with_history(make_table)
    resources = {"lsm_table": LsmTableResource(uri=table.uri)}
    flush = {"ops": {"flushed_generations": {"config": {"idle_seconds": 0}}}}
    merging = table.shard_ids[1]

    with merge_leases(table.handle.storage, [merging]):  # as a merge running beside the flush holds it
        flushed = materialize([flushed_generations], resources=resources, run_config=flush)

    metadata = {
        k: v.value for k, v in flushed.asset_materializations_for_node("flushed_generations")[0].metadata.items()
    }
    assert metadata["shard_1_pending_run_left_to_merge"] == 1 and metadata["shard_1_pending_run_changes"] == 0
    assert metadata["pending_run_left_to_merge"] == 1
    assert all(metadata[f"shard_{b}_pending_run_changes"] > 0 for b in (0, 2, 3))
    runs = {s.shard_id: has_pending_run(table.handle, s) for s in table.shards()}
    assert runs == {shard: shard != merging for shard in table.shard_ids}
    assert _view(table) == oracle

    again = materialize([flushed_generations], resources=resources, run_config=flush)
    metadata = again.asset_materializations_for_node("flushed_generations")[0].metadata
    assert metadata["shard_1_pending_run_changes"].value > 0 and metadata["pending_run_left_to_merge"].value == 0
    assert all(has_pending_run(table.handle, s) for s in table.shards()) and _view(table) == oracle


@pytest.mark.parametrize(
    "config, rewritten, left_deleted", [({}, 2, 0.0), ({"max_deleted_fraction": 0.5}, 0, 200 / 1200)]
)
def test_the_merge_rewrites_the_base_past_the_deleted_fraction_its_run_allows(
    make_table, config, rewritten, left_deleted
):
    table = make_table(EVENTS_SCHEMA, num_shards=1)
    write_generation(table, list(range(1000)), "first")
    table.compact(maintenance=None)
    write_generation(table, list(range(200)), "again")  # its merge deletes 20% of the base's one fragment

    merged = materialize(
        [merged_base],
        resources={"lsm_table": LsmTableResource(uri=table.uri), "gx": GreatExpectationsResource()},
        run_config={"ops": {"merged_base": {"config": config}}},
    )

    metadata = merged.asset_materializations_for_node("merged_base")[0].metadata
    assert metadata["fragments_rewritten"].value == rewritten  # by default, both fragments into one
    assert metadata["base_deleted_fraction"].value == pytest.approx(left_deleted, abs=1e-4)
    view = _view(table)
    assert len(view) == 1000 and view[0]["customer"] == "again" and view[999]["customer"] == "first"


def test_beside_live_writers_the_merge_takes_only_generations_with_a_run(make_table):
    table = make_table(EVENTS_SCHEMA, num_shards=2)
    batches = list(generate_changes(ChangeStreamSpec(num_keys=400, num_batches=3, batch_size=200, seed=5)))
    for batch in batches[:2]:
        table.write(batch)
        table.close()
    table.compact()  # a base, so that runs hold its rows
    for batch in batches[1:]:
        table.write(batch)
        table.close()
        if batch is batches[1]:
            table.build_pending_runs()  # the last generation has none yet: the keeper's next round builds it
    resources = {"lsm_table": LsmTableResource(uri=table.uri), "gx": GreatExpectationsResource()}
    with instance_for_test() as instance:
        instance.add_run(
            DagsterRun(job_name="ingest_job", run_id="live", tags=WRITER_TAGS, status=DagsterRunStatus.STARTED)
        )
        beside = materialize([merged_base], resources=resources, instance=instance)
        metadata = {k: v.value for k, v in beside.asset_materializations_for_node("merged_base")[0].metadata.items()}
        assert metadata["writer_runs_live"] == 1
        # Per shard: one join-free commit of its run; its newest generation left pending.
        assert metadata["join_free_commits"] == metadata["commits"] == metadata["lag_generations"] == 2
        assert _view(table) == replay(batches)

        instance.delete_run("live")
        alone = materialize([merged_base], resources=resources, instance=instance)
        metadata = {k: v.value for k, v in alone.asset_materializations_for_node("merged_base")[0].metadata.items()}
        assert metadata["writer_runs_live"] == 0 and metadata["lag_generations"] == 0
    assert _view(table) == replay(batches)


def _failed_checks(events) -> list[str]:
    return [
        e.event_specific_data.check_name
        for e in events
        if e.event_type_value == "ASSET_CHECK_EVALUATION" and not e.event_specific_data.passed
    ]


def _base_with_duplicates_and_pending_work(make_table) -> LsmTable:
    table = make_table(EVENTS_SCHEMA, num_shards=4)
    write_generation(table, keys_in_bucket(table, 0, 5), "first")
    table.compact()
    write_generation(table, keys_in_bucket(table, 0, 5, start=500), "second")
    lance.write_dataset(table.dataset().to_table().slice(0, 2), table.uri, mode="append")  # duplicate keys
    return table


def test_merge_job_is_stopped_by_a_failed_merge_guard(make_table):
    table = _base_with_duplicates_and_pending_work(make_table)
    with instance_for_test() as instance:
        resources = {"lsm_table": LsmTableResource(uri=table.uri), "gx": GreatExpectationsResource()}
        result = resolved_job(merge_job, resources).execute_in_process(instance=instance, raise_on_error=False)
        # Events a failed step logged are in the instance (the UI), not in the in-process result.
        logged = [e.dagster_event for e in instance.all_logs(result.run_id) if e.dagster_event]
    assert not result.success
    assert _failed_checks(logged) == ["base_primary_key_unique"]
    assert not result.asset_materializations_for_node("merged_base")
    shard = table.shards()[0]
    assert shard.compacted_generation == 1 and len(shard.pending_generations) == 1  # the merge never ran


def test_an_unknown_shard_fails_the_run_with_the_table_shard_count(make_table):
    table, _ = _table_with_history(make_table)
    resources = {"lsm_table": LsmTableResource(uri=table.uri), "gx": GreatExpectationsResource()}
    result = resolved_job(merge_job, resources).execute_in_process(
        run_config={"ops": {"merged_base": {"config": {"shards": [7]}}}}, raise_on_error=False
    )
    assert not result.success
    assert "buckets [7] do not exist" in str(result.failure_data_for_node("merged_base").error)


@pytest.mark.parametrize(
    "setting, value",
    [("max_rows_per_pass", 0), ("max_deleted_fraction", 1.0), ("max_rows_rewritten_per_pass", 0)],
)
def test_a_merge_config_out_of_range_fails_the_step_naming_the_setting_before_any_merge(make_table, setting, value):
    table, _ = _table_with_history(make_table)
    pending = [shard.pending_generations for shard in table.shards()]
    resources = {"lsm_table": LsmTableResource(uri=table.uri), "gx": GreatExpectationsResource()}
    result = resolved_job(merge_job, resources).execute_in_process(
        run_config={"ops": {"merged_base": {"config": {setting: value}}}}, raise_on_error=False
    )
    assert not result.success
    assert setting in str(result.failure_data_for_node("merged_base").error)
    assert [shard.pending_generations for shard in table.shards()] == pending


_MERGE_IN_A_FRESH_PROCESS = """
import sys
from jobs import merge_job
from resources.table_resource import LsmTableResource
from tests.helpers import resolved_job
result = resolved_job(merge_job, {"lsm_table": LsmTableResource(uri=sys.argv[1])}).execute_in_process()
assert result.success
from pyspark import SparkContext  # imported with dagster-pyspark's resource class: no session may start
started = {"great_expectations": "great_expectations" in sys.modules, "spark": SparkContext._active_spark_context}
print(sorted(name for name, loaded in started.items() if loaded))
"""


def test_a_merge_run_loads_no_great_expectations_and_starts_no_spark(make_table):
    table, oracle = _table_with_history(make_table)
    table.flush()
    output = subprocess.run(
        [sys.executable, "-c", _MERGE_IN_A_FRESH_PROCESS, table.uri],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert output.strip().splitlines()[-1] == "[]"
    assert _view(table) == oracle and all(not s.pending_generations for s in table.shards())
