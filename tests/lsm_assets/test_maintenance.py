"""Maintenance assets and jobs: the merged view never changes, metadata is numeric."""

from __future__ import annotations

import lance
from dagster import Definitions, DagsterRun, DagsterRunStatus, instance_for_test, materialize

from jobs import flush_job, merge_job, merge_shard_job
from lsm_assets.checks import all_checks
from lsm_assets.live_writers import WRITER_TAGS
from lsm_assets.maintenance import flushed_generations, garbage_collected, merged_base
from resources.lsm import LsmTable
from resources.lsm.testing.changegen import EVENTS_SCHEMA, ChangeStreamSpec, generate_changes, replay
from resources.gx_resource import GreatExpectationsResource
from resources.table_resource import LsmTableResource
from tests.helpers import keys_in_bucket, rows_by_key, write_generation


def _table_with_history(make_table) -> tuple[LsmTable, dict]:
    """Three generations per shard with deletes and re-inserts, plus an unflushed WAL tail."""
    table = make_table(EVENTS_SCHEMA, num_shards=4)
    batches = list(generate_changes(ChangeStreamSpec(num_keys=300, num_batches=4, batch_size=250,
                                                     delete_ratio=0.2, reinsert_ratio=0.1, seed=11)))
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

    flushed = flush_job.execute_in_process(resources=resources,
                                           run_config={"ops": {"flush_all_shards": {"config": {"idle_seconds": 0}}}})
    assert flushed.success and _view(table) == oracle and _view(table, fresh=False) == oracle
    assert all(s.unflushed_wal_entries == 0 for s in table.shards())

    merged = merge_job.execute_in_process(resources={**resources, "gx": GreatExpectationsResource()})
    assert merged.success and _view(table) == oracle
    guards = {e.check_name: e.passed for e in merged.get_asset_check_evaluations()}
    assert guards == {"base_primary_key_unique": True, "base_primary_key_not_null": True, "shards_recoverable": True}
    events = [e.event_specific_data.materialization for e in merged.all_events
              if e.event_type_value == "ASSET_MATERIALIZATION"]
    assert sorted(m.partition for m in events) == ["0", "1", "2", "3"]
    assert sum(m.metadata["generations_merged"].value for m in events) == sum(
        len(s.flushed_generations) for s in table.shards())
    assert all(m.metadata["lag_generations"].value == 0 for m in events)
    base = rows_by_key(table.dataset().to_table())  # unique keys in the base itself
    assert {k[0] for k in base} == set(oracle)

    gc_config = {"orphan_grace_seconds": 0, "wal_grace_seconds": 0, "version_retention_hours": 0}
    generations = sum(len(s.flushed_generations) for s in table.shards())
    collected = materialize([garbage_collected], resources=resources,
                            run_config={"ops": {"garbage_collected": {"config": gc_config}}})
    assert collected.success and _view(table) == oracle
    metadata = collected.asset_materializations_for_node("garbage_collected")[0].metadata
    assert metadata["compacted_generations_deleted"].value == generations
    assert metadata["wal_entries_deleted"].value > 0
    assert metadata["bytes_reclaimed"].value > 0


def test_partitioned_assets_work_per_shard_and_flush_skips_live_writers(make_table):
    table, oracle = _table_with_history(make_table)
    resources = {"lsm_table": LsmTableResource(uri=table.uri)}
    with instance_for_test() as instance:
        instance.add_run(DagsterRun(job_name="ingest_job", run_id="live", tags=WRITER_TAGS,
                                    status=DagsterRunStatus.STARTED))
        skipped = materialize([flushed_generations], partition_key="1", resources=resources, instance=instance,
                              run_config={"ops": {"flushed_generations": {"config": {"idle_seconds": 0}}}})
        assert skipped.asset_materializations_for_node("flushed_generations")[0].metadata["flushed"].value == 0
        assert table.shards()[1].unflushed_wal_entries > 0

        instance.delete_run("live")
        done = materialize([flushed_generations], partition_key="1", resources=resources, instance=instance,
                           run_config={"ops": {"flushed_generations": {"config": {"idle_seconds": 0}}}})
        assert done.asset_materializations_for_node("flushed_generations")[0].metadata["flushed"].value == 1
        assert table.shards()[1].unflushed_wal_entries == 0

        merged = materialize([merged_base], partition_key="1", resources=resources, instance=instance)
        metadata = merged.asset_materializations_for_node("merged_base")[0].metadata
        assert metadata["generations_merged"].value == 4 and metadata["lag_generations"].value == 0
        assert table.shards()[1].pending_generations == ()
        assert table.shards()[2].pending_generations != ()
    assert _view(table) == oracle


def _failed_checks(events) -> list[str]:
    return [e.event_specific_data.check_name for e in events
            if e.event_type_value == "ASSET_CHECK_EVALUATION" and not e.event_specific_data.passed]


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
        result = merge_job.execute_in_process(
            resources={"lsm_table": LsmTableResource(uri=table.uri), "gx": GreatExpectationsResource()},
            instance=instance, raise_on_error=False)
        # Events a failed step logged are in the instance (the UI), not in the in-process result.
        logged = [e.dagster_event for e in instance.all_logs(result.run_id) if e.dagster_event]
    assert not result.success
    assert _failed_checks(logged) == ["base_primary_key_unique"]
    assert not result.asset_materializations_for_node("merge_all_shards")
    shard = table.shards()[0]
    assert shard.compacted_generation == 1 and len(shard.pending_generations) == 1  # the merge never ran


def test_merge_shard_job_is_stopped_by_a_failed_blocking_check(make_table):
    table = _base_with_duplicates_and_pending_work(make_table)

    defs = Definitions(assets=[flushed_generations, merged_base], asset_checks=all_checks, jobs=[merge_shard_job],
                       resources={"lsm_table": LsmTableResource(uri=table.uri), "gx": GreatExpectationsResource()})
    with instance_for_test() as instance:
        result = defs.resolve_job_def("merge_shard_job").execute_in_process(
            partition_key="0", instance=instance, raise_on_error=False)
    assert not result.success
    assert _failed_checks(result.all_events) == ["base_primary_key_unique"]
    assert not result.asset_materializations_for_node("merged_base")
    shard = table.shards()[0]
    assert shard.compacted_generation == 1 and len(shard.pending_generations) == 1  # the merge never ran
