"""Maintenance jobs run from the CLI with nothing but the environment defaults."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from resources.lsm import LsmTable
from resources.lsm.testing.changegen import (
    EVENTS_SCHEMA,
    ChangeStreamSpec,
    generate_changes,
    replay,
    write_landing_files,
)
from tests.helpers import rows_by_key, run_cli_job
from tests.resources.lsm.spark.test_bad_landing_files import HEADER, csv_line, good, jsonl


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
        "LSM_TABLE_URI": table.uri,
        "LSM_LANDING_DIR": str(tmp / "landing"),
        "DAGSTER_HOME": str(tmp / "dagster_home"),
    }
    return env, replay(batches)


@pytest.mark.parametrize("job", ["flush_job", "merge_job", "gc_job"])
def test_job_runs_from_the_cli_and_keeps_the_view(table_with_history, job):
    env, oracle = table_with_history
    run_cli_job(job, env)
    table = LsmTable.open(env["LSM_TABLE_URI"])
    assert {k[0]: v for k, v in rows_by_key(table.read()).items()} == oracle


def _materialization_metadata(dagster_home: Path, asset: str) -> dict:
    """The metadata values of the asset's latest materialization on the instance at ``dagster_home``."""
    from dagster import AssetKey, DagsterInstance

    with DagsterInstance.from_config(str(dagster_home)) as instance:
        event = instance.get_latest_materialization_event(AssetKey(asset))
    assert event is not None and event.asset_materialization is not None
    return {k: getattr(v, "value", v) for k, v in event.asset_materialization.metadata.items()}


def test_ingest_job_ingests_around_poison_files_and_reports_them(tmp_path):
    table = LsmTable.create(str(tmp_path / "table.lance"), EVENTS_SCHEMA, ["id"], num_shards=2)
    landing = tmp_path / "landing"
    spec = ChangeStreamSpec(num_keys=100, num_batches=2, batch_size=80, seed=9)
    batches = write_landing_files(spec, str(landing), "parquet", prefix="a")
    k = 10**9  # keys the generated stream never uses
    (landing / "b-overflow.jsonl").write_text(jsonl([good(k), {**good(k + 1), "id": 2**70}, good(k + 2)]))
    (landing / "c-op.jsonl").write_text(jsonl([{**good(k + 3), "_op": ["upsert"]}, good(k + 4)]))
    (landing / "d-dup.csv").write_text("id,customer,customer,amount,status\n5,x,y,1.0,new\n")
    (landing / "e-count.csv").write_text(f"{HEADER}\n{csv_line(good(k + 5))}\n{k + 6},x\n")
    (landing / "f-trunc.parquet").write_bytes(b"PAR1 still being written")
    (landing / "g.tsv").write_text("id\n")
    (tmp_path / "dagster_home").mkdir()
    env = {"LSM_TABLE_URI": table.uri, "LSM_LANDING_DIR": str(landing), "DAGSTER_HOME": str(tmp_path / "dagster_home")}

    output = run_cli_job("ingest_job", env)
    for expected in (
        "1 files still being written, left for the next run: f-trunc.parquet",
        "g.tsv: unsupported file type",
    ):
        assert expected in output
    metadata = _materialization_metadata(tmp_path / "dagster_home", "ingested_changes")
    assert metadata["files_incomplete"] == {"f-trunc.parquet": "still being written"}
    assert set(metadata["files_unsupported"]) == {"g.tsv"} and metadata["rows_quarantined"] == 4
    oracle = replay([*batches, pa.Table.from_pylist([good(k), good(k + 2), good(k + 4), good(k + 5)])])
    assert {key[0]: v for key, v in rows_by_key(table.read()).items()} == oracle
    quarantine = "".join(f.read_text() for f in (landing / "_quarantine").glob("run=*/*.json"))
    for reason in (
        "is not a valid int64",
        "is not one of ['upsert', 'delete']",
        "duplicate column names",
        "line has 2",
    ):
        assert reason in quarantine

    pq.write_table(pa.Table.from_pylist([good(k + 7)]), landing / "f-trunc.parquet")
    run_cli_job("ingest_job", env)
    oracle[k + 7] = {c: v for c, v in good(k + 7).items() if not c.startswith("_")}
    assert {key[0]: v for key, v in rows_by_key(table.read()).items()} == oracle


def test_demo_job_runs_end_to_end_from_the_cli(tmp_path):
    config = tmp_path / "demo.yaml"
    config.write_text(
        "ops:\n  landing_changes:\n    config:\n"
        "      num_keys: 500\n      num_batches: 2\n      batch_size: 300\n      seed: 3\n"
    )
    (tmp_path / "dagster_home").mkdir()
    env = {
        "LSM_TABLE_URI": str(tmp_path / "table.lance"),
        "LSM_CREATE_TABLE": "true",
        "LSM_LANDING_DIR": str(tmp_path / "landing"),
        "DAGSTER_HOME": str(tmp_path / "dagster_home"),
    }
    run_cli_job("demo_job", env, config, timeout=900)
    oracle = replay(list(generate_changes(ChangeStreamSpec(num_keys=500, num_batches=2, batch_size=300, seed=3))))
    table = LsmTable.open(env["LSM_TABLE_URI"])
    assert {k[0]: v for k, v in rows_by_key(table.read()).items()} == oracle
    # Merged into the base and collected: nothing pending, the base alone holds the view.
    assert all(not s.pending_generations and not s.unflushed_wal_entries for s in table.shards())
    assert table.dataset().count_rows() == len(oracle)


def test_add_columns_job_runs_from_the_cli_with_its_config(tmp_path):
    table = LsmTable.create(str(tmp_path / "table.lance"), EVENTS_SCHEMA, ["id"], num_shards=2)
    batches = list(generate_changes(ChangeStreamSpec(num_keys=100, num_batches=2, batch_size=80, seed=3)))
    for batch in batches:
        table.write(batch)
    table.detach_writers()  # the job fences, flushes and merges these WAL-only rows first
    config = tmp_path / "config.yaml"
    config.write_text("ops:\n  add_table_columns:\n    config:\n      columns:\n        channel: string\n")
    (tmp_path / "dagster_home").mkdir()
    output = run_cli_job(
        "add_columns_job", {"LSM_TABLE_URI": table.uri, "DAGSTER_HOME": str(tmp_path / "dagster_home")}, config
    )
    assert "add_columns: evolved" in output
    evolved = LsmTable.open(table.uri)
    assert evolved.schema.names[-1] == "channel"
    view = {k[0]: v for k, v in rows_by_key(evolved.read()).items()}
    assert view == {k: {**v, "channel": None} for k, v in replay(batches).items()}
