"""Unattended soak: Dagster on PostgreSQL, the daemon doing the work.

``dagster-daemon`` and ``dagster-webserver`` run as separate processes on an instance
stored in a real PostgreSQL server. ``continuous_ingest_job`` is launched through
the run queue (GraphQL, as the UI does); once it ingested a first file (its Spark
session is up), change files land every 3 seconds for 75 seconds, and the sensors
(thresholds lowered through their environment overrides) launch the maintenance
runs. Then the continuous run is terminated the way an operator does it, and the
merged view must equal the replay oracle of everything written. Run counts, queue
and wall times and the backlog over time are printed and kept in
``test-artifacts/soak/report.json``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from deploy.stack import ROOT, DagsterServices, dagster_home, dagster_services, postgres_bin, postgres_server
from resources.lsm import LsmTable
from resources.lsm.maintenance.policy import BackpressurePolicy
from resources.lsm.testing.changegen import (
    EVENTS_SCHEMA,
    ChangeStreamSpec,
    generate_changes,
    replay,
    write_landing_file,
)
from tests.helpers import rows_by_key

pytestmark = [
    pytest.mark.soak,
    pytest.mark.skipif(
        postgres_bin() is None, reason="PostgreSQL is not installed (./dev setup installs Debian's postgresql)"
    ),
]

ARTIFACTS = ROOT / "test-artifacts" / "soak"
FEED_SECONDS = 75
FILE_EVERY_SECONDS = 3.0
SPEC = ChangeStreamSpec(num_keys=1500, num_batches=1 + int(FEED_SECONDS / FILE_EVERY_SECONDS), batch_size=150, seed=5)
SENSOR_ENV = {
    "LSM_SENSOR_INTERVAL_SECONDS": "5",
    "LSM_MERGE_TRIGGER_GENERATIONS": "2",
    "LSM_FLUSH_TRIGGER_AGE_SECONDS": "5",
    "LSM_FLUSH_TRIGGER_IDLE_SECONDS": "5",
}
CONTINUOUS_CONFIG = {"ops": {"ingest_continuously": {"config": {"poll_seconds": 1.0, "max_files_per_batch": 5}}}}
MAINTENANCE_JOBS = ("flush_job", "merge_job")


@dataclass
class Soak:
    """The services, the table, and what the test observed."""

    dagster: DagsterServices
    home: Path
    table_uri: str
    landing: Path
    batches: list[Any] = field(default_factory=list)
    backlog: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture(scope="module")
def soak(tmp_path_factory) -> Soak:
    """PostgreSQL, a DAGSTER_HOME on it with deploy/dagster.yaml's settings, the daemon and the webserver."""
    tmp = tmp_path_factory.mktemp("soak")
    # Small MemTables, so the live writers cut generations while the soak runs.
    table = LsmTable.create(str(tmp / "table.lance"), EVENTS_SCHEMA, ["id"], num_shards=2, max_memtable_rows=300)
    with postgres_server(tmp / "logs" / "postgres.log") as server:
        home = dagster_home(tmp / "dagster_home", server)
        env = {
            **os.environ,
            **SENSOR_ENV,
            "DAGSTER_HOME": str(home),
            "LSM_TABLE_URI": table.uri,
            "LSM_LANDING_DIR": str(tmp / "landing"),
            "SPARK_MASTER": "local[1]",
        }
        with dagster_services(env, tmp / "logs") as dagster:
            yield Soak(dagster, home, table.uri, tmp / "landing")


def _warm_up(soak: Soak, batches: Iterator[Any]) -> float:
    """Land the stream's first file and wait until the run ingested it (its Spark session is up); seconds taken."""
    start = time.monotonic()
    soak.batches.append(next(batches))
    write_landing_file(soak.batches[0], str(soak.landing), 0)
    _wait_until(lambda: not _pending_landing_files(soak.landing), "the first file's ingestion", 240)
    return round(time.monotonic() - start, 1)


def _feed(soak: Soak, batches: Iterator[Any], gc_at: float) -> str:
    """Write one landing file every few seconds, sampling the backlog; launch gc_job at ``gc_at`` seconds."""
    table, start, gc_run = LsmTable.open(soak.table_uri), time.monotonic(), ""
    for tick, batch in enumerate(batches):
        write_landing_file(batch, str(soak.landing), len(soak.batches))
        soak.batches.append(batch)
        _sample(soak, table, start)
        if not gc_run and time.monotonic() - start >= gc_at:
            gc_run = soak.dagster.launch("gc_job")  # its cron (every 30 min) need not fire meanwhile
        time.sleep(max(0.0, start + (tick + 1) * FILE_EVERY_SECONDS - time.monotonic()))
    return gc_run


def _sample(soak: Soak, table: LsmTable, start: float) -> None:
    shards = table.shards()
    soak.backlog.append(
        {
            "t": round(time.monotonic() - start, 1),
            "pending_generations": [len(s.pending_generations) for s in shards],
            "unflushed_wal_entries": [s.unflushed_wal_entries for s in shards],
        }
    )


def _pending_landing_files(landing: Path) -> list[str]:
    return sorted(p.name for p in landing.glob("changes-*"))


def _wait_until(check: Any, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} not within {timeout:.0f}s"
        time.sleep(1)


def _run_report(instance: DagsterInstance) -> dict[str, Any]:
    """Runs per job: how many, launched by which sensor, statuses and wall times."""
    report: dict[str, Any] = {}
    for record in instance.get_run_records(RunsFilter(), limit=500):
        run = record.dagster_run
        job = report.setdefault(
            run.job_name, {"runs": 0, "by_sensor": 0, "statuses": {}, "wall_seconds": [], "queued_seconds": []}
        )
        job["runs"] += 1
        job["by_sensor"] += "dagster/sensor_name" in run.tags
        job["by_schedule"] = job.get("by_schedule", 0) + ("dagster/schedule_name" in run.tags)
        job["statuses"][run.status.value] = job["statuses"].get(run.status.value, 0) + 1
        if record.start_time and record.end_time:
            job["wall_seconds"].append(round(record.end_time - record.start_time, 1))
            job["queued_seconds"].append(round(record.start_time - record.create_timestamp.timestamp(), 1))
    return report


def _runs_per_tick(instance: DagsterInstance, sensor_name: str) -> list[int]:
    """For each tick of ``sensor_name`` that requested runs: how many runs it launched."""
    states = [s for s in instance.all_instigator_state() if s.instigator_name == sensor_name]
    assert len(states) == 1, f"{sensor_name} has no state: the daemon never ran it"
    ticks = instance.get_ticks(states[0].instigator_origin_id, states[0].selector_id, limit=1000)
    return [len(tick.run_ids) for tick in ticks if tick.run_ids]


def _unfinished(instance: DagsterInstance) -> list[str]:
    statuses = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING]
    statuses += [DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]
    return [r.dagster_run.run_id for r in instance.get_run_records(RunsFilter(statuses=statuses))]


def test_daemon_keeps_the_table_maintained_under_continuous_ingestion(soak: Soak):
    started = time.monotonic()
    ingest_run = soak.dagster.launch("continuous_ingest_job", CONTINUOUS_CONFIG)
    _wait_until(lambda: soak.dagster.status(ingest_run) == "STARTED", "the continuous run to start", 120)
    run_start_seconds = round(time.monotonic() - started, 1)
    batches = generate_changes(SPEC)
    first_file_seconds = _warm_up(soak, batches)
    gc_run = _feed(soak, batches, gc_at=FEED_SECONDS / 2)
    _wait_until(lambda: not _pending_landing_files(soak.landing), "continuous ingestion of every file", 90)

    # The operator's planned stop: Terminate (as in the UI).
    fed = time.monotonic()
    soak.dagster.terminate(ingest_run)
    final_status = soak.dagster.wait(ingest_run, timeout=120)
    stopped = time.monotonic()
    events = soak.dagster.events(ingest_run)
    with DagsterInstance.from_config(str(soak.home)) as instance:
        _wait_until(lambda: not _unfinished(instance), "maintenance runs to finish", 300)
        drained = time.monotonic()
        gc_status = soak.dagster.status(gc_run)
        runs = _run_report(instance)
        failed_runs = [
            r.dagster_run.run_id for r in instance.get_run_records(RunsFilter(statuses=[DagsterRunStatus.FAILURE]))
        ]
        ticks = {name: _runs_per_tick(instance, name) for name in ("flush_sensor", "merge_sensor")}
    table = LsmTable.open(soak.table_uri)
    _sample(soak, table, started)
    report = {
        "wall_seconds": round(time.monotonic() - started, 1),
        "files_written": len(soak.batches),
        "rows_written": sum(b.num_rows for b in soak.batches),
        "continuous_run_status": final_status,
        "continuous_run_queued_to_started_seconds": run_start_seconds,
        "then_until_first_file_ingested_seconds": first_file_seconds,
        "terminate_to_finished_seconds": round(stopped - fed, 1),
        "continuous_run_last_events": [f"{e['__typename']}: {e.get('message', '')[:100]}" for e in events[-8:]],
        "then_until_no_run_in_progress_seconds": round(drained - stopped, 1),
        "runs": runs,
        "runs_per_sensor_tick": ticks,
        "max_pending_generations": max(max(s["pending_generations"]) for s in soak.backlog),
        "backlog": soak.backlog,
    }
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "backlog"}, indent=2))

    # A planned stop is not a failure, in the run status or in its event log.
    assert final_status in ("CANCELED", "SUCCESS"), soak.dagster.failures(ingest_run)
    errors = [e for e in events if e["__typename"] == "ExecutionStepFailureEvent" or e.get("level") == "ERROR"]
    assert not errors, errors
    assert any("stop requested" in e.get("message", "") for e in events), "the run did not take the planned-stop path"
    # The sensors launched maintenance, one run per tick, and nothing failed.
    merges = runs.get("merge_job", {})
    assert merges.get("by_sensor", 0) >= 1, runs
    assert all(n == 1 for per_tick in ticks.values() for n in per_tick), ticks
    assert gc_status == "SUCCESS", soak.dagster.failures(gc_run)
    assert not failed_runs, "\n".join(soak.dagster.failures(run_id) for run_id in failed_runs)
    # The backlog never reached the backpressure limit: ingestion never had to wait for merging.
    assert report["max_pending_generations"] < BackpressurePolicy.stop_generations, soak.backlog
    # Writers closed (MemTables flushed) and the merged view holds exactly what was written.
    assert all(s.unflushed_wal_entries == 0 for s in table.shards()), table.shards()
    assert {k[0]: v for k, v in rows_by_key(table.read()).items()} == replay(soak.batches)
