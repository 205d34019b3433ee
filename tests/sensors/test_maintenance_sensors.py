"""Flush and merge sensors against real tables and a real Dagster instance."""

from __future__ import annotations

import pyarrow as pa
import pytest
from dagster import DagsterRun, DagsterRunStatus, build_sensor_context, instance_for_test

from definitions import defs
from jobs import MAINTENANCE_TAG, flush_job, merge_job
from lsm_assets.live_writers import WRITER_TAGS
from resources.lsm import LsmTable
from resources.lsm.maintenance.policy import FlushTrigger, MergeTrigger
from resources.lsm.testing.changegen import EVENTS_SCHEMA
from resources.table_resource import LsmTableResource
from sensors.maintenance import merge_sensor, missing_pending_run, shard_sensor
from tests.helpers import keys_in_bucket, write_generation


@pytest.fixture
def instance():
    with instance_for_test() as instance:
        yield instance


def _evaluate(sensor, instance, uri: str, cursor: str | None = None):
    """One tick of ``sensor`` against the code location's repository and a test table."""
    context = build_sensor_context(
        instance=instance, cursor=cursor, definitions=defs, resources={"lsm_table": LsmTableResource(uri=uri)}
    )
    return sensor.evaluate_tick(context)


def test_merge_sensor_requests_exactly_the_shards_at_the_trigger_once(make_table, instance):
    table = make_table(EVENTS_SCHEMA, num_shards=4)
    for generation in range(4):  # buckets 1 and 3 reach the trigger (4), bucket 2 stays at 2
        write_generation(table, keys_in_bucket(table, 1, 5, start=generation * 1000), f"g{generation}")
        write_generation(table, keys_in_bucket(table, 3, 5, start=generation * 1000), f"g{generation}")
        if generation < 2:
            write_generation(table, keys_in_bucket(table, 2, 5, start=generation * 1000), f"g{generation}")

    first = _evaluate(merge_sensor, instance, table.uri)
    (request,) = first.run_requests  # one run for every shard that needs it
    assert _shards(request, "merged_base") == [1, 3]
    assert request.job_name in (None, merge_job.name) and request.tags[MAINTENANCE_TAG] == "merge"
    # The same state asks for the same work: Dagster drops a repeated run_key.
    again = _evaluate(merge_sensor, instance, table.uri, cursor=first.cursor)
    assert [r.run_key for r in again.run_requests] == [request.run_key]

    table.compact(table.shard_ids[1])
    after = _evaluate(merge_sensor, instance, table.uri, cursor=again.cursor)
    assert [_shards(r, "merged_base") for r in after.run_requests] == [[3]]
    assert after.run_requests[0].run_key != request.run_key

    instance.add_run(DagsterRun(job_name=merge_job.name, run_id="merging", status=DagsterRunStatus.STARTED))
    busy = _evaluate(merge_sensor, instance, table.uri)
    assert not busy.run_requests and "merging" in busy.skip_message  # never two merges at once
    instance.delete_run("merging")
    table.compact()
    done = _evaluate(merge_sensor, instance, table.uri)
    assert not done.run_requests and "no shard needs it" in done.skip_message


def test_flush_sensor_requests_crashed_shards_and_waits_for_live_writers(make_table, instance):
    table = make_table(EVENTS_SCHEMA, num_shards=4)
    keys = keys_in_bucket(table, 0, 3) + keys_in_bucket(table, 2, 3)
    table.write(pa.table({"id": keys, "customer": ["c"] * 6, "amount": [1.0] * 6, "status": ["new"] * 6}))
    table.detach_writers()  # the writers die without closing: their WAL is unflushed
    sensor = shard_sensor(
        "test_flush_sensor", flush_job, "flushed_generations", FlushTrigger(0, 0, 0), "test", skip_while_writing=True
    )

    result = _evaluate(sensor, instance, table.uri)
    assert [_shards(r, "flushed_generations") for r in result.run_requests] == [[0, 2]]

    instance.add_run(
        DagsterRun(job_name="ingest_job", run_id="live-writer", tags=WRITER_TAGS, status=DagsterRunStatus.STARTED)
    )
    waiting = _evaluate(sensor, instance, table.uri)
    assert not waiting.run_requests and "live-writer" in waiting.skip_message

    LsmTable.open(table.uri).flush()
    instance.delete_run("live-writer")
    assert not _evaluate(sensor, instance, table.uri).run_requests


def test_the_flush_sensor_asks_for_pending_runs_where_generations_have_none(make_table, instance):
    table = make_table(EVENTS_SCHEMA, num_shards=3)
    write_generation(table, keys_in_bucket(table, 1, 5), "flushed")  # a flush builds no run
    write_generation(table, keys_in_bucket(table, 2, 5), "flushed")
    table.build_pending_runs(table.shard_ids[2])
    sensor = shard_sensor(
        "test_flush_sensor", flush_job, "flushed_generations", FlushTrigger(), "test", otherwise=missing_pending_run
    )

    (request,) = _evaluate(sensor, instance, table.uri).run_requests
    assert _shards(request, "flushed_generations") == [1]
    assert request.tags["lsm/shards"] == "1"
    table.build_pending_runs()
    assert not _evaluate(sensor, instance, table.uri).run_requests


def test_the_merge_trigger_fires_on_pending_rows_before_the_generation_count(make_table, instance):
    table = make_table(EVENTS_SCHEMA, num_shards=2)
    write_generation(table, keys_in_bucket(table, 0, 50), "big")
    write_generation(table, keys_in_bucket(table, 1, 5), "small")
    assert table.shards()[0].pending_rows == 50 and table.shards()[1].pending_rows == 5
    sensor = shard_sensor("test_merge_sensor", merge_job, "merged_base", MergeTrigger(pending_rows=20), "test")

    (request,) = _evaluate(sensor, instance, table.uri).run_requests
    assert _shards(request, "merged_base") == [0]


def _shards(request, step: str) -> list[int]:
    return request.run_config["ops"][step]["config"]["shards"]


def test_trigger_thresholds_follow_their_environment_overrides(monkeypatch):
    from sensors.maintenance import flush_trigger, merge_trigger

    assert merge_trigger() == MergeTrigger() and flush_trigger() == FlushTrigger()
    monkeypatch.setenv("LSM_MERGE_TRIGGER_GENERATIONS", "2")
    monkeypatch.setenv("LSM_MERGE_TRIGGER_AGE_SECONDS", "30")
    monkeypatch.setenv("LSM_FLUSH_TRIGGER_IDLE_SECONDS", "5")
    assert merge_trigger() == MergeTrigger(generations=2, max_age_seconds=30.0)
    assert flush_trigger() == FlushTrigger(idle_seconds=5.0)
