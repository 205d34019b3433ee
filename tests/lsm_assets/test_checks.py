"""Asset checks on real tables: pass when healthy, fail (or block) when broken on purpose."""

from __future__ import annotations

import json
import shutil

import lance
import pyarrow as pa
from dagster import AssetSelection, Definitions, define_asset_job, in_process_executor, load_assets_from_modules

import lsm_assets.ingestion
import lsm_assets.maintenance
from lsm_assets.checks import (
    CHECKS,
    all_checks,
    base_primary_key_not_null,
    base_primary_key_unique,
    merged_view_primary_key_not_null,
    merged_view_primary_key_unique,
    row_count_reconciles,
    schema_conforms,
    shards_recoverable,
)
from resources.gx_resource import GreatExpectationsResource
from resources.lsm import LsmTable
from resources.lsm.format.layout import shard_dir
from resources.lsm.testing.changegen import EVENTS_SCHEMA, ChangeStreamSpec, generate_changes
from resources.lsm.write.shard_writers import ShardWriters
from resources.spark import SparkResource
from resources.table_resource import LsmTableResource
from tests.helpers import forge_null_key_wal_entry, forge_wal_entry, keys_in_bucket, run_cli_job

CHEAP_CHECKS = [
    merged_view_primary_key_unique,
    merged_view_primary_key_not_null,
    schema_conforms,
    base_primary_key_unique,
    base_primary_key_not_null,
    shards_recoverable,
]


def run(
    table: LsmTable,
    selection: AssetSelection,
    gx: GreatExpectationsResource | None = None,
    run_config: dict | None = None,
):
    """Execute ``selection`` against ``table`` in process; returns the run's result."""
    job = define_asset_job("under_test", selection=selection, executor_def=in_process_executor)
    defs = Definitions(
        assets=load_assets_from_modules([lsm_assets.ingestion, lsm_assets.maintenance]),
        asset_checks=all_checks,
        jobs=[job],
        resources={
            "lsm_table": LsmTableResource(uri=table.uri),
            "spark": SparkResource(),
            "gx": gx or GreatExpectationsResource(),
        },
    )
    return defs.resolve_job_def("under_test").execute_in_process(raise_on_error=False, run_config=run_config)


def evaluations(
    table: LsmTable, checks, gx: GreatExpectationsResource | None = None, run_config: dict | None = None
) -> dict:
    result = run(table, AssetSelection.checks(*checks), gx, run_config=run_config)
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def history(make_table, schema: pa.Schema = EVENTS_SCHEMA, primary_key=("id",)) -> LsmTable:
    """Merged, pending and WAL-only changes, with deletes and re-inserts."""
    table = make_table(schema, primary_key=primary_key)
    batches = list(generate_changes(ChangeStreamSpec(num_keys=300, num_batches=3, batch_size=200, seed=5)))
    for number, batch in enumerate(batches):
        table.write(
            batch
            if "region" not in schema.names
            else batch.append_column("region", pa.array(["eu" if k % 2 else "us" for k in batch["id"].to_pylist()]))
        )
        if number < 2:
            table.close()
        if number == 0:
            table.compact()
    table.detach_writers()  # the last batch stays in the WAL of a crashed writer
    return LsmTable.open(table.uri)


def append_duplicates(table: LsmTable, rows: int = 3) -> list:
    """Write base rows again, straight into the base table (bypassing the LSM path)."""
    table.compact()
    duplicates = table.dataset().to_table().slice(0, rows)
    lance.write_dataset(duplicates, table.uri, mode="append")
    return [
        [row[k] for k in table.primary_key] if len(table.primary_key) > 1 else row[table.primary_key[0]]
        for row in duplicates.to_pylist()
    ]


def test_every_check_passes_on_a_healthy_table(make_table):
    table = history(make_table)
    results = evaluations(table, all_checks)
    assert sorted(results) == sorted(spec.name for check in all_checks for spec in check.check_specs)
    failed = {
        name: {k: getattr(v, "value", v) for k, v in e.metadata.items()} for name, e in results.items() if not e.passed
    }
    assert not failed, failed  # the metadata says why (a drill lists its violations)
    unique = results["merged_view_primary_key_unique"].metadata
    assert unique["backend"].value == "pandas" and unique["gx_success_percent"].value == 100.0
    assert unique["rows"].value == table.count()
    drill = results["recovery_drill"].metadata
    assert drill["killed"].value and drill["verdict"].value == "passed"
    assert drill["generations_merged"].value >= 3
    assert drill["rows_replayed"].value > 0 or drill["batches_only_in_wal"].value == 0
    assert results["row_count_reconciles"].metadata["merge_actual_change"].value == 0
    assert results["shards_recoverable"].metadata["rows_to_replay"].value > 0


def test_duplicate_keys_in_the_base_fail_the_base_uniqueness_check(make_table):
    table = history(make_table)
    keys = append_duplicates(table)
    failed = evaluations(table, [base_primary_key_unique])["base_primary_key_unique"]
    assert not failed.passed
    assert sorted(failed.metadata["offending_keys_sample"].value) == sorted(keys)
    assert failed.metadata["gx_unsuccessful_expectations"].value == 1


def test_base_duplicates_fail_the_merged_view_check_too(make_table):
    # The merged view trusts the base to hold each key once, so a base broken
    # from outside shows its duplicates to readers (of keys with no newer
    # change: everything is merged first), and both checks fail.
    table = history(make_table)
    table.flush()
    keys = append_duplicates(table)
    results = evaluations(table, [merged_view_primary_key_unique, base_primary_key_unique])
    assert not results["base_primary_key_unique"].passed
    failed = results["merged_view_primary_key_unique"]
    assert not failed.passed
    assert sorted(failed.metadata["offending_keys_sample"].value) == sorted(keys)


def test_a_lost_write_fails_row_count_reconciliation(make_table, monkeypatch):
    # The probe runs on a scratch sample, so what it can catch is a write path that loses rows.
    table = history(make_table)
    put = ShardWriters.put

    def lossy(self, shard_id, upserts, deletes):
        if upserts is not None and upserts.num_rows and upserts["customer"][0].as_py().startswith("probe"):
            upserts = upserts.slice(0, upserts.num_rows // 2)  # the probe's rows: acknowledged, half never stored
        return put(self, shard_id, upserts, deletes)

    monkeypatch.setattr(ShardWriters, "put", lossy)
    config = {"ops": {"merged_base_checks": {"config": {"seed": 7, "sample_rows": 100}}}}
    failed = evaluations(table, [row_count_reconciles], run_config=config)["row_count_reconciles"]
    assert not failed.passed and failed.metadata["sample_rows"].value == 100
    expected, actual = failed.metadata["ingest_expected_change"].value, failed.metadata["ingest_actual_change"].value
    assert actual < expected


def test_a_wal_entry_with_other_column_types_fails_schema_conformance(make_table):
    table = history(make_table)
    forge_wal_entry(
        table, {"id": pa.array([10**6], pa.int64()), "customer": ["c"], "amount": ["1.5 EUR"], "status": ["new"]}
    )
    failed = evaluations(table, [schema_conforms])["schema_conforms"]
    assert not failed.passed
    (problem,) = failed.metadata["level_problems"].value
    assert "amount string" in problem and "amount double" in problem
    assert "1.5 EUR" in failed.metadata["merged_view_error"].value


def test_schema_conformance_reads_one_batch_of_a_large_view(make_table):
    table = make_table(EVENTS_SCHEMA, num_shards=2)
    ids = list(range(70_000))  # more than one scan batch (65,536 rows)
    table.write(
        pa.table({"id": ids, "customer": ["c"] * len(ids), "amount": [1.0] * len(ids), "status": ["s"] * len(ids)})
    )
    table.close()
    table.compact()  # the base streams in batches
    passed = evaluations(table, [schema_conforms])["schema_conforms"]
    assert passed.passed and 0 < passed.metadata["rows"].value < len(ids)


def test_a_recorded_key_that_differs_from_the_key_metadata_fails_schema_conformance(make_table):
    # Lance refuses to change primary-key field metadata once set; the key the
    # table records for routing and merging is ours to keep in line with it.
    table = history(make_table)
    assert evaluations(table, [schema_conforms])["schema_conforms"].passed
    table.dataset().update_config({"lsm.primary_key": json.dumps(["id", "status"])})
    failed = evaluations(table, [schema_conforms])["schema_conforms"]
    assert not failed.passed
    assert failed.metadata["key_problems"].value == [
        "fields with primary-key metadata ['id'] differ from the table's key ['id', 'status']",
        "key column 'status' is nullable",
    ]


def test_composite_keys_are_checked_as_one_compound_key(make_table):
    schema = EVENTS_SCHEMA.append(pa.field("region", pa.string()))
    table = history(make_table, schema, primary_key=("id", "region"))
    assert evaluations(table, [base_primary_key_unique])["base_primary_key_unique"].passed
    keys = append_duplicates(table, rows=2)
    failed = evaluations(table, [base_primary_key_unique])["base_primary_key_unique"]
    assert not failed.passed
    assert sorted(failed.metadata["offending_keys_sample"].value) == sorted(keys)
    assert "expect_compound_columns_to_be_unique:id,region" in failed.metadata["gx_results"].value


def test_a_failed_blocking_check_stops_the_merge(make_table):
    table = history(make_table)
    append_duplicates(table)
    table.write(
        pa.table(
            {
                "id": keys_in_bucket(table, 0, 5, start=10**6),
                "customer": ["new"] * 5,
                "amount": [1.0] * 5,
                "status": ["new"] * 5,
            }
        )
    )
    table.close()
    marker = table.shards()[0].compacted_generation
    assert table.shards()[0].pending_generations  # a merge would have work to do
    selection = AssetSelection.assets("flushed_generations", "merged_base").without_checks() | AssetSelection.checks(
        base_primary_key_unique
    )
    result = run(table, selection, run_config={"ops": {"flushed_generations": {"config": {"idle_seconds": 0}}}})
    assert not result.success
    assert [e.check_name for e in result.get_asset_check_evaluations()] == ["base_primary_key_unique"]
    assert [m.asset_key.path for m in result.asset_materializations_for_node("flushed_generations")] == [
        ["flushed_generations"]
    ]
    assert result.asset_materializations_for_node("merged_base") == []
    assert table.shards()[0].compacted_generation == marker


def test_a_deleted_generation_directory_fails_recovery(make_table):
    table = history(make_table)
    shard = next(s for s in table.shards() if s.pending_generations)
    shutil.rmtree(f"{table.uri}/{shard_dir(shard.shard_id)}/{shard.pending_generations[0][1]}")
    failed = evaluations(table, [shards_recoverable])["shards_recoverable"]
    assert not failed.passed
    (finding,) = failed.metadata["findings"].value
    assert finding["bucket"] == shard.bucket and "does not open" in finding["message"]


def test_a_null_key_fails_recovery_and_the_not_null_check(make_table):
    table = make_table()
    forge_null_key_wal_entry(table)
    results = evaluations(table, [shards_recoverable, merged_view_primary_key_not_null])
    assert not results["shards_recoverable"].passed
    # Reading the merged view refuses the null key, so the not-null check cannot pass.
    assert "merged_view_primary_key_not_null" not in results or not results["merged_view_primary_key_not_null"].passed


def test_gx_not_null_names_the_offending_rows():
    import pandas as pd

    outcome = GreatExpectationsResource().keys_not_null(pd.DataFrame({"id": [1, None, 3]}), ["id"])
    assert (
        not outcome.success and outcome.expectations["expect_column_values_to_not_be_null:id"]["unexpected_count"] == 1
    )


def test_large_tables_are_validated_on_spark(make_table, spark):
    table = history(make_table)
    keys = append_duplicates(table)
    gx = GreatExpectationsResource(spark_row_threshold=0, stream_integer_keys=False)
    failed = evaluations(table, [base_primary_key_unique], gx)["base_primary_key_unique"]
    assert not failed.passed and failed.metadata["backend"].value == "spark"
    assert sorted(failed.metadata["offending_keys_sample"].value) == sorted(keys)


def test_a_large_merged_view_is_validated_on_spark(make_table, spark):
    table = history(make_table)
    gx = GreatExpectationsResource(spark_row_threshold=0, stream_integer_keys=False)
    results = evaluations(table, [merged_view_primary_key_unique, merged_view_primary_key_not_null], gx)
    assert all(r.passed and r.metadata["backend"].value == "spark" for r in results.values())
    assert results["merged_view_primary_key_unique"].metadata["rows"].value == table.count()


def test_a_large_level_with_an_integer_key_is_streamed_through_a_bitmap(make_table):
    table = history(make_table)
    keys = append_duplicates(table)
    gx = GreatExpectationsResource(spark_row_threshold=0)
    key_checks = [
        base_primary_key_unique,
        base_primary_key_not_null,
        merged_view_primary_key_unique,
        merged_view_primary_key_not_null,
    ]
    results = evaluations(table, key_checks, gx)
    assert all(r.metadata["backend"].value == "arrow" for r in results.values())
    failed = results["base_primary_key_unique"]
    assert not failed.passed and failed.metadata["duplicate_keys"].value == len(keys)
    assert sorted(failed.metadata["offending_keys_sample"].value) == sorted(keys)
    assert results["merged_view_primary_key_unique"].metadata["rows"].value == table.count()
    assert results["base_primary_key_not_null"].passed and results["merged_view_primary_key_not_null"].passed
    assert results["base_primary_key_unique"].metadata["rows"].value == table.dataset().count_rows()


def test_quality_job_runs_from_the_cli_against_a_new_default_table(tmp_path):
    env = {
        "DAGSTER_HOME": str(tmp_path),
        "LSM_TABLE_URI": str(tmp_path / "table.lance"),
        "LSM_CREATE_TABLE": "true",
        "LSM_LANDING_DIR": str(tmp_path / "landing"),
    }
    output = run_cli_job("quality_job", env)
    assert output.count("ASSET_CHECK_EVALUATION") == len(CHECKS)
    assert "RUN_SUCCESS" in output and (tmp_path / "table.lance").exists()


def test_the_drill_checks_defaults_are_the_drills_own():
    """The check's config repeats DrillConfig's defaults (importing it would load Lance with the definitions)."""
    from lsm_assets.checks import DrillCheckConfig
    from resources.lsm.quality.recovery_drill import DrillConfig
    from resources.lsm.quality.scratch import DEFAULT_SAMPLE_ROWS

    config = DrillCheckConfig()
    assert (config.batches, config.batch_size, config.batches_per_generation, config.sample_rows) == (
        DrillConfig.batches,
        DrillConfig.batch_size,
        DrillConfig.batches_per_generation,
        DrillConfig.sample_rows,
    )
    assert config.sample_rows == DEFAULT_SAMPLE_ROWS


def test_levels_written_before_an_added_column_still_conform(make_table):
    from resources.lsm.format.schema import ADDED_COLUMN_METADATA

    table = history(make_table)  # merged, pending and WAL-only changes, all of the old schema
    # The base gains a column without draining: what a writer opened before the change leaves behind.
    table.dataset().add_columns(pa.field("channel", pa.string(), metadata={ADDED_COLUMN_METADATA: b"true"}))
    results = evaluations(table, [schema_conforms, shards_recoverable])
    assert results["schema_conforms"].passed, results["schema_conforms"].metadata
    assert results["shards_recoverable"].passed
    assert results["schema_conforms"].metadata["columns"].value[-1] == "channel"
