"""Recorded landing files are archived, deleted or kept; a crash between recording and retiring leaves no orphan."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from resources.lsm.format.layout import ARCHIVE_DIR
from resources.lsm.ingest.landing import IngestLedger, LandingLocation, LandingRetention, new_ledger_entry
from resources.lsm.ingest.landing_scan import pending_landing_files
from resources.lsm.spark.ingest import ingest_landing_files
from resources.lsm.testing.changegen import EVENTS_SCHEMA, ChangeStreamSpec, replay, write_landing_files
from tests.helpers import rows_by_key


def _landing(tmp_path: Path, names: list[str]) -> Path:
    landing = tmp_path / "landing"
    landing.mkdir()
    for name in names:
        pq.write_table(pa.table({"id": pa.array([1], pa.int64())}), landing / name)
    return landing


def test_archive_moves_recorded_files_and_expires_old_archives(tmp_path):
    landing = _landing(tmp_path, ["a.parquet", "b.parquet"])
    stale = landing / ARCHIVE_DIR / "old.parquet"
    stale.parent.mkdir()
    stale.write_bytes(b"x")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))

    retired = LandingLocation(str(landing)).retire(["a.parquet"], LandingRetention("archive", 3600))
    assert retired == 1
    assert sorted(os.listdir(landing)) == [ARCHIVE_DIR, "b.parquet"]
    assert os.listdir(landing / ARCHIVE_DIR) == ["a.parquet"]  # the stale archive is gone


def test_delete_and_keep(tmp_path):
    landing = _landing(tmp_path, ["a.parquet", "b.parquet"])
    LandingLocation(str(landing)).retire(["a.parquet"], LandingRetention("delete"))
    LandingLocation(str(landing)).retire(["b.parquet"], LandingRetention("keep"))
    assert sorted(os.listdir(landing)) == ["b.parquet"]


def test_a_recorded_file_left_by_a_crash_is_retired_and_a_different_one_under_its_name_stays(make_table, tmp_path):
    table = make_table(EVENTS_SCHEMA)
    landing = _landing(tmp_path, ["a.parquet", "b.parquet", "c.parquet"])
    ledger = IngestLedger(table.handle.storage)
    files = {f.name: f for f in LandingLocation(str(landing)).files()}
    ledger.record(new_ledger_entry(files["a.parquet"], 1, 0, "crashed-run"))  # recorded, never retired
    ledger.record(new_ledger_entry(files["b.parquet"], 1, 0, "earlier-run"))
    (landing / "b.parquet").write_bytes(b"a longer file landed again under a recorded name")

    pending = pending_landing_files(table.uri, str(landing), LandingRetention("archive"))
    assert [f.name for f in pending] == ["c.parquet"]
    assert sorted(os.listdir(landing)) == [ARCHIVE_DIR, "b.parquet", "c.parquet"]
    assert os.listdir(landing / ARCHIVE_DIR) == ["a.parquet"]


def test_ingestion_archives_what_it_recorded_by_default(make_table, tmp_path, spark):
    table = make_table(EVENTS_SCHEMA)
    landing = tmp_path / "landing"
    batches = write_landing_files(ChangeStreamSpec(num_keys=100, num_batches=3, batch_size=50, seed=3), str(landing))

    report = ingest_landing_files(spark, table.uri, str(landing), str(tmp_path / "quarantine"))
    assert len(report.files) == 3
    assert sorted(os.listdir(landing / ARCHIVE_DIR)) == sorted(report.files)
    assert not LandingLocation(str(landing)).files()
    assert {k[0]: v for k, v in rows_by_key(table.read()).items()} == replay(batches)
    assert not ingest_landing_files(spark, table.uri, str(landing), str(tmp_path / "quarantine")).files
