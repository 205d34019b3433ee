"""Storage-fault soak: writers, ingestion and maintenance against an object store that fails 5% of requests.

A real ``moto_server`` sits behind the fault-injecting proxy (tests/faulty_s3.py),
which answers 500/503, resets connections before and after applying the
request, holds answers past the clients' 2 s timeout and cuts bodies short,
drawn from a seed. For ``SOAK_SECONDS``, at the same time:

- a writer thread writes change batches through the API (retrying a write
  that raised, as documented) and flushes its own MemTables now and then;
- the main thread lands files and runs ``ingest_job`` (Spark, in process)
  on a second table, and writes a change batch with
  ``df.write.format("lance_lsm")`` (one ``write_id`` per batch) to a third,
  re-running a run or a write that failed until it succeeds;
- a maintenance thread merges and collects garbage on both tables and reads
  the API table, checking that no acknowledged row is missing or doubled and
  no deleted key came back.

Then the faults stop: every table is flushed, merged and collected with no
grace, and must equal the replay oracle, with no orphan left. Requests,
faults by kind, retries and the operations that failed and recovered are
printed and kept in ``test-artifacts/storage_faults/report.json``.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from jobs import ingest_job
from resources.lsm import LsmTable, WriterFencedError
from resources.lsm.format.retry import RETRY_COUNTS
from resources.lsm.testing.changegen import (
    EVENTS_SCHEMA,
    ChangeStreamSpec,
    generate_changes,
    replay,
    write_landing_file,
)
from resources.spark import SparkResource
from resources.table_resource import LsmTableResource
from tests.faulty_s3 import FaultPlan
from tests.helpers import resolved_job, rows_by_key

pytestmark = pytest.mark.soak

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "storage_faults"
SOAK_SECONDS = 90
PLAN = FaultPlan(probability=0.05, seed=20, delay_seconds=3.0)
GRACE_SECONDS = 60  # GC's grace while writers run: longer than any flush under faults takes
API_SPEC = ChangeStreamSpec(num_keys=1500, num_batches=10_000, batch_size=100, seed=31)
INGEST_SPEC = ChangeStreamSpec(num_keys=1500, num_batches=100, batch_size=150, seed=32)
FRAME_SPEC = ChangeStreamSpec(num_keys=1500, num_batches=100, batch_size=300, seed=33)
FILES_PER_RUN = 2
MAX_RUNS_PER_ROUND = 6
EVERYTHING = {"orphan_grace_seconds": 0, "wal_grace_seconds": 0, "older_than": None, "retain_versions": 1}


@dataclass
class Observed:
    """What the soak saw: acknowledged API batches, ingested files, and failures by operation."""

    started: list[pa.Table] = field(default_factory=list)
    acknowledged: list[pa.Table] = field(default_factory=list)
    ingested: list[pa.Table] = field(default_factory=list)
    framed: list[pa.Table] = field(default_factory=list)
    failed: Counter[str] = field(default_factory=Counter)
    recovered: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    views_checked: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def attempt(self, operation: str, call: Any, stop: threading.Event) -> bool:
        """``call()`` until it succeeds (``True``) or ``stop`` is set, counting failures and recoveries."""
        failed = False
        while not stop.is_set():
            try:
                call()
            except (OSError, WriterFencedError) as exc:  # platform faults only: anything else fails the test
                with self.lock:
                    self.failed[operation] += 1
                    self.errors.append(f"{operation}: {type(exc).__name__}: {str(exc)[:200]}")
                failed = True
                continue
            if failed:
                with self.lock:
                    self.recovered[operation] += 1
            return True
        return False


def _view(table: LsmTable) -> dict:
    return {k[0]: v for k, v in rows_by_key(table.read()).items()}


def _keys(batches: list[pa.Table]) -> set:
    return {k for b in batches for k in b["id"].to_pylist()}


def _api_writer(table: LsmTable, observed: Observed, stop: threading.Event) -> None:
    for number, batch in enumerate(generate_changes(API_SPEC)):
        with observed.lock:
            observed.started.append(batch)
        if not observed.attempt("api write", lambda b=batch: table.write(b), stop):
            return  # stopped before it was acknowledged: repeated once the faults stop
        with observed.lock:
            observed.acknowledged.append(batch)
        if number % 10 == 9:
            observed.attempt("api flush", table.flush, stop)


def _maintenance(api_uri: str, ingest_uri: str, options: dict, observed: Observed, stop: threading.Event) -> None:
    tables = [LsmTable.open(uri, storage_options=options) for uri in (api_uri, ingest_uri)]
    grace = {"orphan_grace_seconds": GRACE_SECONDS, "wal_grace_seconds": GRACE_SECONDS}
    while not stop.is_set():
        for table in tables:
            observed.attempt("compact", table.compact, stop)
            observed.attempt("gc", lambda t=table: t.gc(**grace), stop)
        observed.attempt("read", lambda: _check_view(tables[0], observed), stop)


def _check_view(table: LsmTable, observed: Observed) -> None:
    """The merged view against the oracle of the batches acknowledged around the read.

    A key untouched by the batches in flight during the read must have its
    acknowledged value (present once, or absent when deleted: never resurrected).
    """
    with observed.lock:
        before = list(observed.acknowledged)
    view = _view(table)
    with observed.lock:
        unsettled = _keys(observed.started[len(before) :])  # written meanwhile: partly applied, maybe
    oracle = replay(before)
    for key in _keys(before) - unsettled:
        assert view.get(key) == oracle.get(key), f"key {key}: view {view.get(key)} != acknowledged {oracle.get(key)}"
    observed.views_checked += 1


def _ingest_round(ingest_uri: str, options: dict, observed: Observed, number: int) -> None:
    """Land ``FILES_PER_RUN`` files and run ingest_job until a run succeeds."""
    job = resolved_job(ingest_job, _resources(ingest_uri, options))
    for run in range(MAX_RUNS_PER_ROUND):
        result = job.execute_in_process(raise_on_error=False)
        if result.success:
            if run:
                observed.recovered["ingest_job"] += 1
            return
        observed.failed["ingest_job"] += 1
        failure = next(e.step_failure_data.error for e in result.all_events if e.is_step_failure)
        observed.errors.append(
            f"ingest_job: {(failure.cause or failure).message.strip()[-300:]}"
        )  # the error, not the traceback
    pytest.fail(f"ingest_job round {number} did not succeed in {MAX_RUNS_PER_ROUND} runs: {observed.errors[-3:]}")


def _dataframe_round(spark, uri: str, options: dict, batch: pa.Table, observed: Observed, number: int) -> None:
    """Write ``batch`` with ``df.write.format("lance_lsm")`` under its own write id until a write succeeds.

    A failed write is re-run with the same ``write_id``: it applies what the
    failed one did not, and nothing twice.
    """
    frame = spark.createDataFrame(batch)
    writer_options = {"write_id": f"soak-{number}", **{f"storage.{k}": v for k, v in options.items()}}
    for attempt in range(MAX_RUNS_PER_ROUND):
        try:
            frame.write.format("lance_lsm").mode("append").options(**writer_options).save(uri)
        except Exception as exc:  # Spark wraps the task's or the commit's store error in its own type
            observed.failed["dataframe write"] += 1
            observed.errors.append(f"dataframe write: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        if attempt:
            observed.recovered["dataframe write"] += 1
        observed.framed.append(batch)
        return
    pytest.fail(f"dataframe write {number} did not succeed in {MAX_RUNS_PER_ROUND} attempts: {observed.errors[-3:]}")


def _resources(ingest_uri: str, options: dict) -> dict:
    table = LsmTableResource(uri=ingest_uri, storage_options=options)
    return {
        "lsm_table": table,
        "spark": SparkResource(master="local[2]"),
    }


def test_nothing_acknowledged_is_lost_under_storage_faults(faulty_s3, spark, monkeypatch):
    proxy, root, options = faulty_s3
    landing = f"{root}/landing"
    monkeypatch.setenv("LSM_LANDING_DIR", landing)  # the harness lands files straight on the server (AWS_*)
    monkeypatch.delenv("LSM_QUARANTINE_DIR", raising=False)
    api = LsmTable.create(
        f"{root}/api.lance", EVENTS_SCHEMA, ["id"], num_shards=2, storage_options=options, max_memtable_rows=300
    )
    ingest_uri, frames_uri = f"{root}/ingest.lance", f"{root}/frames.lance"
    for uri in (ingest_uri, frames_uri):
        LsmTable.create(uri, EVENTS_SCHEMA, ["id"], num_shards=2, storage_options=options)
    options = {**options, "client_retry_timeout": "10"}  # a wedged Lance call is given up on sooner
    observed, stop = Observed(), threading.Event()
    retries_before = RETRY_COUNTS.snapshot()

    proxy.set_plan(PLAN)
    started = time.monotonic()
    threads = [
        threading.Thread(target=_api_writer, args=(api, observed, stop), name="api-writer"),
        threading.Thread(target=_maintenance, args=(api.uri, ingest_uri, options, observed, stop), name="maintenance"),
    ]
    for thread in threads:
        thread.start()
    files, frames = generate_changes(INGEST_SPEC), generate_changes(FRAME_SPEC)
    rounds = 0
    try:
        while time.monotonic() - started < SOAK_SECONDS:
            for _ in range(FILES_PER_RUN):
                batch = next(files)
                write_landing_file(batch, landing, len(observed.ingested))
                observed.ingested.append(batch)
            _ingest_round(ingest_uri, options, observed, rounds)
            _dataframe_round(spark, frames_uri, options, next(frames), observed, rounds)
            rounds += 1
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    faults, requests = proxy.faults(), proxy.counts["requests"]
    soak_seconds = round(time.monotonic() - started, 1)
    proxy.set_plan(FaultPlan())  # the faults stop

    # The write the stop interrupted (perhaps partly applied) is repeated, as a caller would.
    for batch in observed.started[len(observed.acknowledged) :]:
        api.write(batch)
        observed.acknowledged.append(batch)
    api.close()
    tables = {
        "api": (api, observed.acknowledged),
        "ingest": (LsmTable.open(ingest_uri, storage_options=options), observed.ingested),
        "dataframe": (LsmTable.open(frames_uri, storage_options=options), observed.framed),
    }
    for table, _ in tables.values():
        table.flush()
        table.compact()
        table.gc(**EVERYTHING)
    retries = {
        kind: {
            op: n - retries_before[kind].get(op, 0) for op, n in counts.items() if n > retries_before[kind].get(op, 0)
        }
        for kind, counts in RETRY_COUNTS.snapshot().items()
    }
    report = {
        "soak_seconds": soak_seconds,
        "requests": requests,
        "faults": faults,
        "engine_retries": retries,
        "operations_failed": dict(observed.failed),
        "operations_failed_then_recovered": dict(observed.recovered),
        "api_batches_acknowledged": len(observed.acknowledged),
        "files_ingested": len(observed.ingested),
        "dataframe_writes": len(observed.framed),
        "ingest_rounds": rounds,
        "views_checked_during_faults": observed.views_checked,
        "errors": observed.errors[:20],
    }
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))

    assert sum(faults.values()) >= 100 and set(faults) == {
        "error_500",
        "error_503",
        "reset_before",
        "reset_after",
        "delay",
        "truncate",
    }, faults
    assert len(observed.acknowledged) >= 20 and rounds >= 2 and observed.views_checked >= 2, report
    for name, (table, batches) in tables.items():
        # Every acknowledged row exactly once (rows_by_key refuses duplicates), nothing deleted back.
        assert _view(table) == replay(batches), name
        shards = table.shards()
        assert all(not s.pending_generations and not s.unflushed_wal_entries for s in shards), (name, shards)
        assert all(not s.orphan_directories for s in shards), (name, [s.orphan_directories for s in shards])
        assert table.dataset().count_rows() == len(replay(batches)), name
        assert not table.handle.storage.list_dir("_lsm_ingest/staging"), f"{name}: staging left behind"
    # A failed operation was re-run until it succeeded; none ended in a persistent-outage error.
    assert not any("StorageUnavailableError" in e for e in observed.errors), observed.errors
