"""The jobs from the CLI with the table and the landing directory (so the quarantine) on ``s3://``.

The store is a real ``moto_server`` process; the jobs get it from the
standard ``AWS_*`` environment variables only, as a deployment would.
"""

from __future__ import annotations

import os

from resources.lsm import LsmTable
from resources.lsm.format.storage import TableStorage
from resources.lsm.testing.changegen import ChangeStreamSpec, replay, write_landing_files
from tests.helpers import rows_by_key, run_cli_job

JOBS = ("ingest_job", "flush_job", "merge_job", "gc_job", "quality_job")


def test_ingest_flush_merge_gc_quality_jobs_on_s3_equal_the_oracle(s3_root, tmp_path):
    landing = f"{s3_root}/landing"
    spec = ChangeStreamSpec(num_keys=200, num_batches=2, batch_size=150, seed=4)
    batches = write_landing_files(spec, landing, "csv", malformed_per_file=1)
    (tmp_path / "dagster_home").mkdir()
    env = {
        **os.environ,
        "LSM_TABLE_URI": f"{s3_root}/table.lance",
        "LSM_LANDING_DIR": landing,
        "LSM_CREATE_TABLE": "true",  # a new table at a non-default URI must be asked for
        "LSM_NUM_SHARDS": "2",
        "DAGSTER_HOME": str(tmp_path / "dagster_home"),
    }

    for job in JOBS:
        run_cli_job(job, env)

    table = LsmTable.open(env["LSM_TABLE_URI"])
    oracle = replay(batches)
    assert {k[0]: v for k, v in rows_by_key(table.read()).items()} == oracle
    assert all(not s.pending_generations and not s.unflushed_wal_entries for s in table.shards())
    assert table.dataset().count_rows() == len(oracle)
    landing_files = TableStorage(landing)
    assert [e.name for e in landing_files.list_files("")] == [], "ingested files were archived"
    assert len(landing_files.list_dir("_archive")) == len(batches)
    (run,) = landing_files.list_dir("_quarantine")
    quarantined = [f for f in landing_files.list_files(f"_quarantine/{run.name}") if f.name.endswith(".json")]
    lines = b"".join(landing_files.read_bytes(f"_quarantine/{run.name}/{f.name}") for f in quarantined).splitlines()
    assert len(lines) == len(batches), "one malformed row per file, quarantined on s3"
