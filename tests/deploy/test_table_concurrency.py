"""Per-table concurrency under the daemon: one table's writer run never waits on another table's runs."""

from __future__ import annotations

import os
import time

from deploy.stack import dagster_home, dagster_services

TABLE = """
type: declarations.LsmTableComponent
attributes:
  name: {name}
  columns:
    - {{name: id, type: int64}}
    - {{name: note, type: string}}
  primary_key: [id]
  shards: 2
"""


def test_a_tables_writer_runs_queue_behind_each_other_and_never_behind_another_tables(tmp_path):
    for name in ("orders", "customers"):
        (tmp_path / "tables" / name).mkdir(parents=True)
        (tmp_path / "tables" / name / "defs.yaml").write_text(TABLE.format(name=name))
    env = {
        **os.environ,
        "DAGSTER_HOME": str(dagster_home(tmp_path / "dagster_home")),
        "LSM_TABLES_DIR": str(tmp_path / "tables"),
        "LSM_WAREHOUSE": str(tmp_path / "warehouse"),
        "LSM_TABLE_URI": str(tmp_path / "default.lance"),
        "SPARK_MASTER": "local[1]",
    }
    with dagster_services(env, tmp_path / "logs") as ui:
        continuous = {"ops": {"orders__ingested_changes": {"config": {"continuous": True, "poll_seconds": 0.5}}}}
        live = ui.launch("orders_ingest_job", continuous)
        _wait_for_status(ui, live, "STARTED")
        same_table = ui.launch("orders_ingest_job")
        other_table = ui.launch("customers_ingest_job")

        assert ui.wait(other_table, timeout=300) == "SUCCESS", ui.failures(other_table)
        assert ui.wait(ui.launch("orders_maintenance_job"), timeout=300) == "SUCCESS"  # not a writer
        assert ui.status(live) == "STARTED"
        assert ui.status(same_table) == "QUEUED"  # one writer run per table

        ui.terminate(live)
        assert ui.wait(live, timeout=300) in ("SUCCESS", "CANCELED")
        assert ui.wait(same_table, timeout=300) == "SUCCESS", ui.failures(same_table)


def _wait_for_status(ui, run_id: str, wanted: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while (status := ui.status(run_id)) != wanted:
        assert status not in ("SUCCESS", "FAILURE", "CANCELED"), ui.failures(run_id)
        assert time.monotonic() < deadline, f"run {run_id} still {status}"
        time.sleep(0.5)
