"""Spark ingestion of landing files: oracle equality, quarantine, idempotent re-runs, crashes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from resources.lsm import LsmTable
from resources.lsm.format.layout import ARCHIVE_DIR, STAGING_DIR
from resources.lsm.ingest.landing import IngestLedger, LandingRetention
from resources.lsm.spark.ingest import ingest_landing_files
from resources.lsm.testing.changegen import (
    EVENTS_SCHEMA,
    MALFORMED_KINDS,
    ChangeStreamSpec,
    replay,
    write_landing_files,
)
from tests.helpers import rows_by_key

ROOT = Path(__file__).resolve().parents[4]


def _view(table: LsmTable) -> dict:
    return {k[0]: v for k, v in rows_by_key(table.read()).items()}


def _mixed_landing(landing: Path, malformed: int = 0) -> list[pa.Table]:
    """CSV, then JSON Lines, then Parquet files over one key space; returns batches in file order."""
    batches = []
    for prefix, fmt, seed in (("a", "csv", 1), ("b", "jsonl", 2), ("c", "parquet", 3)):
        spec = ChangeStreamSpec(
            num_keys=150, num_batches=2, batch_size=120, seed=seed, delete_ratio=0.2, reinsert_ratio=0.1
        )
        batches += write_landing_files(spec, str(landing), fmt, malformed, prefix=prefix)
    return batches


def _quarantined(path: str) -> list[dict]:
    return [json.loads(line) for f in sorted(Path(path).glob("*.json")) for line in f.read_text().splitlines()]


def test_ingestion_of_mixed_files_equals_the_replay_oracle_and_reruns_are_noops(spark, make_table, tmp_path):
    table = make_table(EVENTS_SCHEMA, num_shards=4)
    batches = _mixed_landing(tmp_path / "landing")

    report = ingest_landing_files(spark, table.uri, str(tmp_path / "landing"), str(tmp_path / "quarantine"))

    assert _view(table) == replay(batches)
    assert len(report.files) == 6 and report.rows_quarantined == 0
    assert report.rows_read == sum(b.num_rows for b in batches)
    assert {s.shard_id for s in report.shards} <= set(table.shard_ids)
    assert sorted(e.name for e in IngestLedger(table.handle.storage).entries()) == sorted(report.files)
    # Each shard was written by exactly one task, which flushed and closed its writer.
    assert all(s.unflushed_wal_entries == 0 for s in table.shards())
    assert _staging_runs(table.uri) == [], "the run deletes its staged files"

    again = ingest_landing_files(spark, table.uri, str(tmp_path / "landing"), str(tmp_path / "quarantine"))
    assert again.files == () and _view(table) == replay(batches)


def test_bad_rows_are_quarantined_with_file_row_and_reason(spark, make_table, tmp_path):
    table = make_table(EVENTS_SCHEMA, num_shards=4)
    landing = tmp_path / "landing"
    batches = _mixed_landing(landing, malformed=len(MALFORMED_KINDS))
    (landing / "d-broken.parquet").write_bytes(b"this is not parquet")

    report = ingest_landing_files(spark, table.uri, str(landing), str(tmp_path / "quarantine"))

    assert _view(table) == replay(batches)  # good rows landed, bad ones did not
    rejected = _quarantined(report.quarantine_path)
    assert report.rows_quarantined == len(rejected) == 6 * len(MALFORMED_KINDS) + 1
    reasons = {r["reason"].split(" ")[0] for r in rejected if r["file"] == "a-000000.csv"}
    assert reasons == {"primary-key", "amount='twelve'", "_op='upsert-please'", "unknown"}
    assert {r["row"] for r in rejected if r["file"] == "a-000000.csv"} == {120, 121, 122, 123}
    broken = [r for r in rejected if r["file"] == "d-broken.parquet"]
    assert len(broken) == 1 and "cannot be read as parquet" in broken[0]["reason"]
    for r in rejected:
        if r["file"] != "d-broken.parquet":
            assert json.loads(r["record"])["customer"] == "bad"


def test_reapplying_unrecorded_files_leaves_the_view_unchanged(spark, make_table, tmp_path):
    table = make_table(EVENTS_SCHEMA, num_shards=4)
    batches = _mixed_landing(tmp_path / "landing")
    # As if the driver died after the writes but before recording (and so retiring) the last four files.
    keep = LandingRetention("keep")
    ingest_landing_files(spark, table.uri, str(tmp_path / "landing"), str(tmp_path / "quarantine"), retention=keep)
    ledger_dir = Path(table.uri) / "_lsm_ingest" / "files"
    for entry in sorted(ledger_dir.iterdir())[2:]:
        entry.unlink()

    report = ingest_landing_files(spark, table.uri, str(tmp_path / "landing"), str(tmp_path / "quarantine"))
    assert len(report.files) == 4
    assert _view(table) == replay(batches)


def _ingest_process(table_uri: str, landing: Path, quarantine: Path) -> subprocess.Popen:
    code = (
        "import sys; from tests.resources.lsm.spark.spark_child import ingest; "
        f"ingest({table_uri!r}, {str(landing)!r}, {str(quarantine)!r})"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _staging_runs(table_uri: str) -> list[str]:
    staging = Path(table_uri, STAGING_DIR)
    return sorted(p.name for p in staging.iterdir()) if staging.exists() else []


def _wal_entries(table_uri: str) -> int:
    return sum(1 for _ in Path(table_uri, "_mem_wal").glob("*/wal/*.arrow"))


@pytest.mark.parametrize("kill_after_wal_entries", [1, 6])
def test_sigkill_mid_ingestion_then_rerun_equals_the_oracle(spark, make_table, tmp_path, kill_after_wal_entries):
    table = make_table(EVENTS_SCHEMA, num_shards=4)
    spec = ChangeStreamSpec(num_keys=3000, num_batches=12, batch_size=2000, seed=5)
    batches = write_landing_files(spec, str(tmp_path / "landing"), "parquet")

    child = _ingest_process(table.uri, tmp_path / "landing", tmp_path / "quarantine")
    deadline = time.monotonic() + 180
    while _wal_entries(table.uri) < kill_after_wal_entries and child.poll() is None:
        assert time.monotonic() < deadline, "ingestion never started writing"
        time.sleep(0.02)
    os.killpg(child.pid, signal.SIGKILL)  # driver, JVM and Python workers at once
    assert child.wait() == -signal.SIGKILL, "ingestion finished before the kill; use more data"
    left_behind = _staging_runs(table.uri)
    assert len(left_behind) == 1, "the killed run had staged its files"

    ingest_landing_files(spark, table.uri, str(tmp_path / "landing"), str(tmp_path / "quarantine"))
    reopened = LsmTable.open(table.uri)
    assert _view(reopened) == replay(batches)
    assert _staging_runs(table.uri) == left_behind, "a run deletes only its own staged files"
    assert reopened.gc(orphan_grace_seconds=0, older_than=None).orphan_directories.count >= 1
    assert _staging_runs(table.uri) == [] and _view(reopened) == replay(batches)
    # Every file is recorded once and archived, whether the killed run or the rerun recorded it.
    assert not list((tmp_path / "landing").glob("*.parquet"))
    assert sorted(e.name for e in IngestLedger(table.handle.storage).entries()) == sorted(
        p.name for p in (tmp_path / "landing" / ARCHIVE_DIR).glob("*.parquet")
    )
