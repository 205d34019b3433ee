"""Ingestion assets and jobs, run for real: Dagster + local Spark + Lance on disk."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import build_init_resource_context, materialize

from jobs import continuous_ingest_job, ingest_job
from lsm_assets.ingestion import ingested_changes, landing_changes
from resources.lsm import LsmTable, WriterFencedError
from resources.lsm.maintenance.pending_runs import has_pending_run
from resources.lsm.testing.changegen import ChangeStreamSpec, generate_changes, replay, write_landing_files
from resources.region_writer import RegionWriterResource
from resources.spark import SparkResource
from resources.table_resource import LsmTableResource
from tests.helpers import resolved_job, rows_by_key, run_cli_job

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def locations(tmp_path, monkeypatch):
    monkeypatch.setenv("LSM_TABLE_URI", str(tmp_path / "table.lance"))
    monkeypatch.setenv("LSM_CREATE_TABLE", "true")
    monkeypatch.setenv("LSM_LANDING_DIR", str(tmp_path / "landing"))
    return tmp_path


def _resources(spark, tmp_path: Path) -> dict:
    table = LsmTableResource(uri=str(tmp_path / "table.lance"), create_if_missing=True)
    return {
        "lsm_table": table,
        "spark": SparkResource(master="local[2]"),
    }


def _view(uri: str) -> dict:
    return {k[0]: v for k, v in rows_by_key(LsmTable.open(uri).read()).items()}


def test_generate_then_ingest_lands_the_stream_with_metadata(spark, locations):
    config = {"num_keys": 400, "num_batches": 3, "batch_size": 300, "malformed_rows": 2, "seed": 4}
    result = materialize(
        [landing_changes, ingested_changes],
        resources=_resources(spark, locations),
        run_config={"ops": {"landing_changes": {"config": config}}},
    )
    assert result.success

    spec = ChangeStreamSpec(num_keys=400, num_batches=3, batch_size=300, seed=4)
    assert _view(str(locations / "table.lance")) == replay(list(generate_changes(spec)))
    metadata = result.asset_materializations_for_node("ingested_changes")[0].metadata
    assert metadata["files"].value == 3
    assert metadata["rows_quarantined"].value == 6
    assert metadata["rows_read"].value == 3 * 302
    assert sum(v.value for k, v in metadata.items() if k.startswith("shard_")) == (
        metadata["upserts"].value + metadata["deletes"].value
    )
    assert metadata["rows_per_s"].value > 0
    # The generations the write tasks cut have their pending runs when the run ends.
    table = LsmTable.open(str(locations / "table.lance"))
    assert metadata["pending_runs_built"].value == sum(1 for s in table.shards() if s.pending_generations) > 0
    assert all(has_pending_run(table.handle, s) for s in table.shards())


POLLING = {"poll_seconds": 0.5, "stop_after_idle_polls": 8, "max_files_per_batch": 1}
CONTINUOUS_RUNS = {
    # The default table's historical job: the op takes the polling settings.
    "continuous_ingest_job": (continuous_ingest_job, {"ingest_continuously": {"config": POLLING}}),
    # Every table's ingest job, in its continuous mode (the same step as a one-off ingestion).
    "ingest_job": (ingest_job, {"ingested_changes": {"config": {"continuous": True, **POLLING}}}),
}


@pytest.mark.parametrize("job_name", list(CONTINUOUS_RUNS))
def test_continuous_ingestion_takes_files_as_they_arrive_and_closes_writers(spark, locations, job_name):
    landing = locations / "landing"
    first = write_landing_files(
        ChangeStreamSpec(num_keys=200, num_batches=2, batch_size=100, seed=1), str(landing), prefix="a"
    )
    later = ChangeStreamSpec(num_keys=200, num_batches=2, batch_size=100, seed=2)
    arrivals: list = []
    writer = threading.Timer(3.0, lambda: arrivals.extend(write_landing_files(later, str(landing), prefix="b")))
    writer.start()

    job, ops = CONTINUOUS_RUNS[job_name]
    resources = _resources(spark, locations)
    result = resolved_job(job, resources).execute_in_process(run_config={"ops": ops}, resources=resources)
    writer.join()
    assert result.success
    uri = str(locations / "table.lance")
    assert _view(uri) == replay(first + arrivals)
    table = LsmTable.open(uri)
    assert all(s.unflushed_wal_entries == 0 for s in table.shards())  # flushed on the way out
    # Writers stayed open: one generation per shard for the whole run, not one per micro-batch.
    assert max(len(s.flushed_generations) for s in table.shards()) == 1
    assert all(has_pending_run(table.handle, s) for s in table.shards())  # built after the close cut them
    materializations = [
        e.event_specific_data.materialization.metadata
        for e in result.all_events
        if e.event_type_value == "ASSET_MATERIALIZATION"
    ]
    batches = materializations[:4]  # one per micro-batch of one file
    assert [m["files"].value for m in batches] == [1, 1, 1, 1]
    assert {
        "pending_runs_built",
        "pending_run_build_s",
        "pending_run_max_delay_s",
        "pending_run_longest_round_s",
        "pending_run_rounds_beside_writes",
        "pending_run_shards_left_to_merges",
    } <= set(batches[-1])
    if job_name == "ingest_job":  # the asset's own materialization sums the run, after the writers closed
        (total,) = materializations[4:]
        assert total["micro_batches"].value == 4
        assert total["files"].value == 4
        assert total["rows_read"].value == sum(m["rows_read"].value for m in batches)
        assert total["pending_runs_built"].value == sum(1 for s in table.shards() if s.pending_generations)
        assert total["table_version"].value == str(table.version())
    else:
        assert len(materializations) == 4


def test_region_writer_resource_fenced_by_another_writer_loses_nothing(locations):
    uri = str(locations / "table.lance")
    resource = RegionWriterResource(lsm_table=LsmTableResource(uri=uri))
    rows = pa.table({"id": [1, 2, 3], "customer": ["a", "b", "c"], "amount": [1.0, 2.0, 3.0], "status": ["new"] * 3})
    with resource.yield_for_execution(build_init_resource_context()) as writers:
        writers.put(rows)
        intruder = LsmTable.open(uri)
        intruder.claim()  # another process takes every shard over
        with pytest.raises(WriterFencedError, match="claimed by another writer"):
            writers.put(rows.slice(0, 1))
        intruder.close()
    # The retried run sees every acknowledged row and can write again.
    with resource.yield_for_execution(build_init_resource_context()) as writers:
        writers.delete(pa.table({"id": [2]}))
    assert sorted(_view(uri)) == [1, 3]


def test_ingest_job_runs_from_the_cli_with_env_defaults(locations):
    spec = ChangeStreamSpec(num_keys=100, num_batches=2, batch_size=100, seed=8)
    batches = write_landing_files(spec, str(locations / "landing"))
    os.makedirs(locations / "dagster_home")
    run_cli_job("ingest_job", {"DAGSTER_HOME": str(locations / "dagster_home")})
    assert _view(str(locations / "table.lance")) == replay(batches)


def test_continuous_job_from_the_cli_stops_cleanly_on_interrupt(locations):
    spec = ChangeStreamSpec(num_keys=200, num_batches=3, batch_size=100, seed=6)
    batches = write_landing_files(spec, str(locations / "landing"))
    config = locations / "run_config.yaml"
    config.write_text("ops:\n  ingest_continuously:\n    config:\n      poll_seconds: 0.5\n")
    env = {**os.environ, "DAGSTER_HOME": str(locations / "dagster_home")}
    os.makedirs(env["DAGSTER_HOME"])
    dagster = Path(sys.executable).with_name("dagster")
    run = subprocess.Popen(
        [str(dagster), "job", "execute", "-m", "definitions", "-j", "continuous_ingest_job", "-c", str(config)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    uri = str(locations / "table.lance")
    deadline = time.monotonic() + 300
    ledger = Path(uri) / "_lsm_ingest" / "files"
    while len(list(ledger.glob("*.json"))) < 3:
        if run.poll() is not None or time.monotonic() > deadline:
            run.kill()
            pytest.fail("continuous ingestion did not progress:\n" + run.communicate()[0][-4000:])
        time.sleep(0.5)

    run.send_signal(signal.SIGINT)  # what Ctrl-C delivers
    output, _ = run.communicate(timeout=120)
    # A planned stop: the step and the run succeed, nothing is logged as an error.
    assert run.returncode == 0, output[-4000:]
    assert "stop requested" in output and "closed the shard writers" in output
    assert "RUN_SUCCESS" in output and " - ERROR - " not in output, output[-4000:]
    assert _view(uri) == replay(batches)
    shards = LsmTable.open(uri).shards()
    assert all(s.unflushed_wal_entries == 0 for s in shards)


def test_ingest_run_takes_debezium_files_and_auto_evolves_the_table(spark, locations):
    import json

    landing = locations / "landing"
    landing.mkdir()

    def change(op: str, lsn: int, key: int, **extra: object) -> str:
        row = {"id": key, "customer": f"c{key}", "amount": float(key), "status": "new", **extra}
        before, after = (row, None) if op == "d" else (None, row)
        return json.dumps(
            {"schema": {}, "payload": {"op": op, "before": before, "after": after, "source": {"lsn": lsn}}}
        )

    (landing / "a.dbz.jsonl").write_text(
        "\n".join([change("c", 1, 1), change("c", 2, 2), change("d", 3, 1), "null", change("m", 4, 9)]) + "\n"
    )
    (landing / "b.dbz.jsonl").write_text(change("u", 5, 2, channel="web") + "\n")
    config = {
        "cdc_formats": [{"suffix": ".dbz.jsonl", "kind": "debezium", "order_by": "source.lsn"}],
        "auto_evolve": True,
    }
    result = materialize(
        [ingested_changes],
        resources=_resources(spark, locations),
        run_config={"ops": {"ingested_changes": {"config": config}}},
    )
    assert result.success
    metadata = result.asset_materializations_for_node("ingested_changes")[0].metadata
    assert metadata["files"].value == 2 and metadata["rows_quarantined"].value == 1
    assert metadata["columns_added"].value == ["channel"]
    view = _view(str(locations / "table.lance"))
    assert {k: (r["customer"], r["channel"]) for k, r in view.items()} == {2: ("c2", "web")}
