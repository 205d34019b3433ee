"""The platform on a Spark standalone cluster: a master and two workers on 127.0.0.1, 1 core each.

``ingest_job`` runs through the real CLI with ``SPARK_MASTER=spark://…``, the
``lance_lsm`` source reads the table back on the same cluster, and a DataFrame is
written with ``df.write.format("lance_lsm")`` there: executors are separate JVMs
with their own Python workers, which import this package and open the table
themselves. Each must match the change generator's replay oracle.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.stack import ROOT, SparkCluster, spark_cluster
from resources.lsm import LsmTable
from resources.lsm.testing.changegen import (
    EVENTS_SCHEMA,
    ChangeStreamSpec,
    generate_changes,
    replay as replay_oracle,
    write_landing_files,
)
from tests.helpers import rows_by_key, run_cli_job

pytestmark = pytest.mark.skipif(shutil.which("java") is None, reason="Java is not installed (Spark needs a JVM)")

SPEC = ChangeStreamSpec(num_keys=600, num_batches=4, batch_size=300, seed=11)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> SparkCluster:
    """A standalone master and two 1-core workers for this module."""
    with spark_cluster(tmp_path_factory.mktemp("spark-cluster"), workers=2, cores=1, memory="1g") as running:
        yield running


@pytest.fixture(scope="module")
def ingested(cluster, tmp_path_factory) -> tuple[dict[str, str], dict]:
    """``ingest_job`` run by the CLI against the cluster; returns (its environment, the oracle)."""
    tmp = tmp_path_factory.mktemp("cluster-ingest")
    batches = write_landing_files(SPEC, str(tmp / "landing"))
    env = {
        **os.environ,
        "SPARK_MASTER": cluster.master_url,
        "LSM_TABLE_URI": str(tmp / "table.lance"),
        "LSM_CREATE_TABLE": "true",  # a new table at a non-default URI must be asked for
        "LSM_LANDING_DIR": str(tmp / "landing"),
        "DAGSTER_HOME": str(tmp / "dagster_home"),
    }
    (tmp / "dagster_home").mkdir()
    run_cli_job("ingest_job", env)
    return env, replay_oracle(batches)


def test_ingest_job_on_the_cluster_matches_the_oracle(ingested):
    env, oracle = ingested
    table = LsmTable.open(env["LSM_TABLE_URI"])
    assert {k[0]: v for k, v in rows_by_key(table.read()).items()} == oracle
    assert sum(s.unflushed_wal_entries + len(s.pending_generations) for s in table.shards()) > 0


def test_lance_lsm_source_reads_the_merged_view_on_executors(ingested):
    env, oracle = ingested
    child = Path(__file__).with_name("spark_read_child.py")
    result = subprocess.run(
        [sys.executable, str(child), env["LSM_TABLE_URI"]],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert {row["id"]: row for row in report["rows"]} == oracle
    assert report["partitions"] == 4  # one per shard
    # Two executors (one per worker), each its own JVM, and Python workers that are not the driver.
    assert len(report["executor_jvm_pids"]) == 2, report["executor_jvm_pids"]
    assert not set(report["executor_jvm_pids"]) & set(report["driver_pids"])
    assert report["driver_pids"][0] not in report["python_worker_pids"]


def test_a_dataframe_written_on_the_cluster_equals_the_oracle(cluster, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    batches = list(generate_changes(SPEC))
    pq.write_table(pa.concat_tables(batches), tmp_path / "changes.parquet")
    uri = str(tmp_path / "written.lance")
    LsmTable.create(uri, EVENTS_SCHEMA, ["id"], num_shards=4).close()
    code = (
        "from tests.resources.lsm.spark.spark_child import write; "
        f"write({uri!r}, {str(tmp_path / 'changes.parquet')!r}, 'cluster', {cluster.master_url!r})"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert {k[0]: v for k, v in rows_by_key(LsmTable.open(uri).read()).items()} == replay_oracle(batches)
