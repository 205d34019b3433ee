"""Flush and merge sensors against real tables and a real Dagster instance."""

from __future__ import annotations

import pyarrow as pa
import pytest
from dagster import AssetKey, DagsterRun, DagsterRunStatus, build_sensor_context, instance_for_test

from jobs import MAINTENANCE_TAG, TABLE_TAG, maintenance_tags, table_jobs
from lsm_assets.live_writers import writer_tags
from lsm_assets.table_context import DEFAULT_TABLE
from resources.declared_table import DeclaredTable
from resources.lsm import LsmTable
from resources.lsm.maintenance.policy import FlushTrigger, MergeTrigger
from resources.lsm.testing.changegen import EVENTS_SCHEMA
from resources.table_resource import DeclaredTables, LsmTableResource
from sensors.maintenance import FLUSH, MERGE, Maintenance, maintenance_sensor, missing_pending_run
from tests.helpers import keys_in_bucket, write_generation


@pytest.fixture
def instance():
    with instance_for_test() as instance:
        yield instance


def _declared(name: str) -> DeclaredTable:
    columns = [{"name": f.name, "type": str(f.type)} for f in EVENTS_SCHEMA]
    return DeclaredTable(name=name, columns=columns, primary_key=["id"])


def _sensor(maintenance: Maintenance, tables: list[DeclaredTable]):
    jobs = {job.name: job for table in tables for job in table_jobs(table)}
    return maintenance_sensor(f"test_{maintenance.kind}_sensor", maintenance, tables, jobs, "test")


def _evaluate(sensor, instance, uris: dict[str, str], cursor: str | None = None):
    """One tick of ``sensor``, each table's resource opening the table at ``uris[name]``."""
    declared = DeclaredTables([_declared(name).model_copy(update={"uri": uri}) for name, uri in uris.items()])
    resources = {
        "lsm_table": LsmTableResource(uri=uris.get(DEFAULT_TABLE.name, "unused.lance")),
        "lsm_tables": declared,
    }
    context = build_sensor_context(instance=instance, cursor=cursor, resources=resources)
    return sensor.evaluate_tick(context)


def test_merge_sensor_requests_exactly_the_shards_at_the_trigger_once(make_table, instance):
    table = make_table(EVENTS_SCHEMA, num_shards=4)
    for generation in range(4):  # buckets 1 and 3 reach the trigger (4), bucket 2 stays at 2
        write_generation(table, keys_in_bucket(table, 1, 5, start=generation * 1000), f"g{generation}")
        write_generation(table, keys_in_bucket(table, 3, 5, start=generation * 1000), f"g{generation}")
        if generation < 2:
            write_generation(table, keys_in_bucket(table, 2, 5, start=generation * 1000), f"g{generation}")
    sensor, uris = _sensor(MERGE, [DEFAULT_TABLE]), {"default": table.uri}

    first = _evaluate(sensor, instance, uris)
    (request,) = first.run_requests  # one run for every shard that needs it
    assert _shards(request, "merged_base") == [1, 3]
    assert request.job_name == "merge_job" and request.tags[MAINTENANCE_TAG] == "default/merge"
    assert request.tags[TABLE_TAG] == "default"
    # The same state asks for the same work: Dagster drops a repeated run_key.
    again = _evaluate(sensor, instance, uris, cursor=first.cursor)
    assert [r.run_key for r in again.run_requests] == [request.run_key]

    table.compact(table.shard_ids[1])
    after = _evaluate(sensor, instance, uris, cursor=again.cursor)
    assert [_shards(r, "merged_base") for r in after.run_requests] == [[3]]
    assert after.run_requests[0].run_key != request.run_key

    for kind in ("merge", "maintenance"):  # a merge run, or a whole maintenance pass
        tags = maintenance_tags(DEFAULT_TABLE, kind)
        instance.add_run(DagsterRun(job_name="any", run_id="merging", tags=tags, status=DagsterRunStatus.STARTED))
        busy = _evaluate(sensor, instance, uris)
        assert not busy.run_requests and "merging" in busy.skip_message  # never two merges of a table at once
        instance.delete_run("merging")
    table.compact()
    done = _evaluate(sensor, instance, uris)
    assert not done.run_requests and "below the thresholds" in done.skip_message


def test_flush_sensor_requests_crashed_shards_and_waits_for_the_tables_live_writers(make_table, instance):
    table = make_table(EVENTS_SCHEMA, num_shards=4)
    keys = keys_in_bucket(table, 0, 3) + keys_in_bucket(table, 2, 3)
    table.write(pa.table({"id": keys, "customer": ["c"] * 6, "amount": [1.0] * 6, "status": ["new"] * 6}))
    table.detach_writers()  # the writers die without closing: their WAL is unflushed
    now = Maintenance("flush", lambda t: FlushTrigger(0, 0, 0), True)
    sensor, uris = _sensor(now, [DEFAULT_TABLE]), {"default": table.uri}

    result = _evaluate(sensor, instance, uris)
    assert [_shards(r, "flushed_generations") for r in result.run_requests] == [[0, 2]]

    # Another table's live writer does not hold this table back; its own does.
    other = writer_tags("customers")
    instance.add_run(DagsterRun(job_name="x", run_id="other-writer", tags=other, status=DagsterRunStatus.STARTED))
    assert len(_evaluate(sensor, instance, uris).run_requests) == 1
    own = writer_tags("default")
    instance.add_run(DagsterRun(job_name="ingest_job", run_id="live-writer", tags=own, status=DagsterRunStatus.STARTED))
    waiting = _evaluate(sensor, instance, uris)
    assert not waiting.run_requests and "live-writer" in waiting.skip_message

    LsmTable.open(table.uri).flush()
    instance.delete_run("live-writer")
    assert not _evaluate(sensor, instance, uris).run_requests


def test_the_flush_sensor_asks_for_pending_runs_where_generations_have_none(make_table, instance):
    table = make_table(EVENTS_SCHEMA, num_shards=3)
    write_generation(table, keys_in_bucket(table, 1, 5), "flushed")  # a flush builds no run
    write_generation(table, keys_in_bucket(table, 2, 5), "flushed")
    table.build_pending_runs(table.shard_ids[2])
    sensor, uris = _sensor(FLUSH, [DEFAULT_TABLE]), {"default": table.uri}
    assert FLUSH.otherwise is missing_pending_run

    (request,) = _evaluate(sensor, instance, uris).run_requests
    assert _shards(request, "flushed_generations") == [1]
    assert request.tags["lsm/shards"] == "1"
    table.build_pending_runs()
    assert not _evaluate(sensor, instance, uris).run_requests


def test_the_merge_trigger_fires_on_pending_rows_before_the_generation_count(make_table, instance):
    table = make_table(EVENTS_SCHEMA, num_shards=2)
    write_generation(table, keys_in_bucket(table, 0, 50), "big")
    write_generation(table, keys_in_bucket(table, 1, 5), "small")
    assert table.shards()[0].pending_rows == 50 and table.shards()[1].pending_rows == 5
    rows = Maintenance("merge", lambda t: MergeTrigger(pending_rows=20))

    (request,) = _evaluate(_sensor(rows, [DEFAULT_TABLE]), instance, {"default": table.uri}).run_requests
    assert _shards(request, "merged_base") == [0]


def test_one_tick_serves_every_table_and_a_broken_one_stops_none(make_table, instance, tmp_path):
    """Runs per table (job, run key, tags, step); a missing table and one whose storage is broken
    are reported, and every other table still gets its run."""
    orders, customers = make_table(EVENTS_SCHEMA, name="orders"), make_table(EVENTS_SCHEMA, name="customers")
    for table in (orders, customers):
        for generation in range(4):
            write_generation(table, keys_in_bucket(table, 0, 3, start=generation * 100), f"g{generation}")
    broken = make_table(EVENTS_SCHEMA, name="broken")
    for manifest in (tmp_path / "broken.lance" / "_versions").iterdir():
        manifest.write_bytes(b"not a manifest")
    tables = [_declared(n) for n in ("orders", "customers", "broken", "missing")]
    uris = {"orders": orders.uri, "customers": customers.uri, "broken": broken.uri, "missing": str(tmp_path / "m")}

    result = _evaluate(_sensor(MERGE, tables), instance, uris)
    requests = {r.tags[TABLE_TAG]: r for r in result.run_requests}
    assert sorted(requests) == ["customers", "orders"]
    for name, request in requests.items():
        assert request.job_name == f"{name}_maintenance_job" and request.run_key.startswith(f"{name}|")
        assert request.asset_selection == [AssetKey([name, "merged_base"])]
        assert request.tags[MAINTENANCE_TAG] == f"{name}/merge"
        assert _shards(request, f"{name}__merged_base") == [0]
    assert requests["orders"].run_key != requests["customers"].run_key


def _shards(request, step: str) -> list[int]:
    return request.run_config["ops"][step]["config"]["shards"]


def test_trigger_thresholds_follow_the_declaration_then_the_environment(monkeypatch):
    from sensors.maintenance import flush_trigger, merge_trigger

    assert merge_trigger() == MergeTrigger() and flush_trigger() == FlushTrigger()
    monkeypatch.setenv("LSM_MERGE_TRIGGER_GENERATIONS", "2")
    monkeypatch.setenv("LSM_MERGE_TRIGGER_AGE_SECONDS", "30")
    monkeypatch.setenv("LSM_FLUSH_TRIGGER_IDLE_SECONDS", "5")
    assert merge_trigger() == MergeTrigger(generations=2, max_age_seconds=30.0)
    assert flush_trigger() == FlushTrigger(idle_seconds=5.0)
    triggers = {"merge": {"generations": 8}, "flush": {"max_age_seconds": 10.0}}
    declared = DeclaredTable(**{**_declared("orders").model_dump(), "triggers": triggers})
    assert merge_trigger(declared) == MergeTrigger(generations=8, max_age_seconds=30.0)
    assert flush_trigger(declared) == FlushTrigger(max_age_seconds=10.0, idle_seconds=5.0)
