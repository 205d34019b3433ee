"""Two declared tables served by one code location, run end to end from the CLI."""

from __future__ import annotations

from dagster import AssetKey, DagsterInstance

from lsm_assets.ingestion import LandingChangesConfig
from resources.lsm import LsmTable
from resources.lsm.testing.changegen import ChangeStreamSpec, generate_table_changes, replay_table
from tests.helpers import rows_by_key, run_cli_job

CUSTOMERS = """
type: declarations.LsmTableComponent
attributes:
  name: customers
  uri: "{{ env('TEST_WAREHOUSE') }}/customers.lance"
  columns:
    - {name: customer_id, type: string}
    - {name: country, type: string}
    - {name: lifetime_value, type: "decimal128(12, 2)"}
  primary_key: [customer_id]
  shards: 2
  demo: {format: parquet, num_keys: 300, num_batches: 2, batch_size: 200}
"""

ORDER_LINES = """
type: declarations.LsmTableComponent
attributes:
  name: order_lines
  uri: "{{ env('TEST_WAREHOUSE') }}/order_lines.lance"
  columns:
    - {name: order_id, type: string}
    - {name: line, type: int32}
    - {name: quantity, type: int32}
  primary_key: [order_id, line]
  merge_engine: partial-update
  landing: {cdc: [{kind: debezium, order_by: source.lsn}]}
  demo: {format: debezium, num_keys: 300, num_batches: 2, batch_size: 200}
"""


def test_two_declared_tables_run_end_to_end_from_the_cli(tmp_path):
    tables = tmp_path / "tables"
    for name, text in (("customers", CUSTOMERS), ("order_lines", ORDER_LINES)):
        (tables / name).mkdir(parents=True)
        (tables / name / "defs.yaml").write_text(text)
    (tmp_path / "dagster_home").mkdir()
    env = {
        "LSM_TABLES_DIR": str(tables),
        "TEST_WAREHOUSE": str(tmp_path / "warehouse"),
        "LSM_WAREHOUSE": str(tmp_path / "warehouse"),
        "DAGSTER_HOME": str(tmp_path / "dagster_home"),
    }

    for name in ("customers", "order_lines"):
        run_cli_job(f"{name}_demo_job", env, timeout=900)

    for name in ("customers", "order_lines"):
        table = LsmTable.open(str(tmp_path / "warehouse" / f"{name}.lance"))
        partial = LandingChangesConfig().partial_ratio if table.merge_engine == "partial-update" else 0.0
        spec = ChangeStreamSpec(num_keys=300, num_batches=2, batch_size=200, seed=7, partial_ratio=partial)
        oracle = replay_table(list(generate_table_changes(table.schema, table.primary_key, spec)), table.primary_key)
        assert rows_by_key(table.read(), table.primary_key) == oracle
        assert all(not s.pending_generations for s in table.shards())
    with DagsterInstance.from_config(str(tmp_path / "dagster_home")) as instance:
        for name in ("customers", "order_lines"):
            event = instance.get_latest_materialization_event(AssetKey([name, "merged_base"]))
            assert event is not None and event.dagster_event.job_name == f"{name}_demo_job"
        assert instance.get_latest_materialization_event(AssetKey("merged_base")) is None  # the default table
