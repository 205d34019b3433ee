"""Maintenance jobs run from the CLI with nothing but the environment defaults."""

from __future__ import annotations

import os

import pytest

from resources.lsm import LsmTable
from resources.lsm.testing.changegen import EVENTS_SCHEMA, ChangeStreamSpec, generate_changes, replay
from tests.helpers import rows_by_key, run_job_cli


@pytest.fixture(scope="module")
def table_with_history(tmp_path_factory):
    """A table with two generations per shard and an unflushed WAL tail; returns (env, oracle)."""
    tmp = tmp_path_factory.mktemp("cli")
    table = LsmTable.create(str(tmp / "table.lance"), EVENTS_SCHEMA, ["id"], num_shards=4)
    batches = list(generate_changes(ChangeStreamSpec(num_keys=200, num_batches=3, batch_size=150, seed=2)))
    for batch in batches[:2]:
        table.write(batch)
        table.close()
    table.write(batches[2])
    table.detach_writers()  # crashed writers leave an unflushed WAL tail
    (tmp / "dagster_home").mkdir()
    env = {
        **os.environ,
        "LSM_TABLE_URI": table.uri,
        "LSM_LANDING_DIR": str(tmp / "landing"),
        "DAGSTER_HOME": str(tmp / "dagster_home"),
    }
    return env, replay(batches)


@pytest.mark.parametrize("job", ["flush_job", "merge_job", "gc_job"])
def test_job_runs_from_the_cli_and_keeps_the_view(table_with_history, job):
    env, oracle = table_with_history
    assert "RUN_SUCCESS" in run_job_cli(job, env)
    table = LsmTable.open(env["LSM_TABLE_URI"])
    assert {k[0]: v for k, v in rows_by_key(table.read()).items()} == oracle


def test_demo_job_runs_end_to_end_from_the_cli(tmp_path):
    config = tmp_path / "demo.yaml"
    config.write_text(
        "ops:\n  landing_changes:\n    config:\n"
        "      num_keys: 500\n      num_batches: 2\n      batch_size: 300\n      seed: 3\n"
    )
    (tmp_path / "dagster_home").mkdir()
    env = {
        **os.environ,
        "LSM_TABLE_URI": str(tmp_path / "table.lance"),
        "LSM_LANDING_DIR": str(tmp_path / "landing"),
        "DAGSTER_HOME": str(tmp_path / "dagster_home"),
    }
    run_job_cli("demo_job", env, "-c", str(config))
    oracle = replay(list(generate_changes(ChangeStreamSpec(num_keys=500, num_batches=2, batch_size=300, seed=3))))
    table = LsmTable.open(env["LSM_TABLE_URI"])
    assert {k[0]: v for k, v in rows_by_key(table.read()).items()} == oracle
    # Merged into the base and collected: nothing pending, the base alone holds the view.
    assert all(not s.pending_generations and not s.unflushed_wal_entries for s in table.shards())
    assert table.dataset().count_rows() == len(oracle)
