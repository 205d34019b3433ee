"""From YAML declarations to definitions: names per table, and bad declarations that stop nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster import AssetKey

from declarations import load_tables
from lsm_assets.table_context import DEFAULT_TABLE
from resources.table_resource import DeclaredTables

ORDERS = """
type: declarations.LsmTableComponent
attributes:
  name: orders
  uri: "{{ env('TEST_WAREHOUSE') }}/orders.lance"
  columns:
    - {name: order_id, type: int64}
    - {name: customer, type: string}
    - {name: amount, type: "decimal128(12, 2)"}
  primary_key: [order_id]
  shards: 2
  landing: {retention: keep, csv_null_markers: ["", "NA"]}
  gc: {schedule: null}
  quality: {schedule: "0 5 * * *", sample_rows: 500}
"""

LINES = """
type: declarations.LsmTableComponent
attributes:
  name: order_lines
  uri: "{{ env('TEST_WAREHOUSE') }}/order_lines.lance"
  columns:
    - {name: order_id, type: string}
    - {name: line, type: int32}
    - {name: sku, type: string, nullable: false}
  primary_key: [order_id, line]
  landing:
    cdc: [{kind: debezium, order_by: source.lsn}]
"""


def declare(root: Path, folder: str, text: str) -> Path:
    (root / folder).mkdir(parents=True)
    (root / folder / "defs.yaml").write_text(text)
    return root / folder / "defs.yaml"


@pytest.fixture
def tables_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TEST_WAREHOUSE", str(tmp_path / "warehouse"))
    root = tmp_path / "tables"
    root.mkdir()
    return root


def test_each_declared_table_gets_its_own_assets_checks_jobs_schedules_and_resources(tables_dir, tmp_path):
    declare(tables_dir, "orders", ORDERS)
    declare(tables_dir, "order_lines", LINES)

    loaded = load_tables(tables_dir, taken=[DEFAULT_TABLE])

    assert not loaded.broken
    orders, lines = sorted(loaded.tables, key=lambda t: t.name != "orders")
    assert orders.table_uri == str(tmp_path / "warehouse" / "orders.lance")
    assert orders.declaration_file == str(tables_dir / "orders" / "defs.yaml")
    assert lines.primary_key == ["order_id", "line"] and lines.landing.cdc[0].kind == "debezium"
    defs = {t.name: d for t, d in zip(loaded.tables, loaded.definitions, strict=True)}
    keys = {k for a in defs["orders"].assets for k in a.keys}
    assert keys == {AssetKey(["orders", n]) for n in _ASSETS}
    assert {a.group_names_by_key[k] for a in defs["orders"].assets for k in a.keys} == {"orders"}
    checks = {c.name: c.asset_key for d in defs["orders"].asset_checks for c in d.check_specs}
    assert checks["base_primary_key_unique"] == AssetKey(["orders", "flushed_generations"])
    assert len(checks) == 8
    assert {j.name for j in defs["order_lines"].jobs} == {f"order_lines_{j}" for j in _JOBS}
    assert [s.name for s in defs["orders"].schedules] == ["orders_quality_schedule"]  # GC schedule declared off
    assert not defs["orders"].resources  # every declared table is opened through the one lsm_tables resource
    resource = DeclaredTables(loaded.tables)["orders"]
    assert resource.uri == orders.table_uri and resource.num_shards == 2 and resource.declared == orders


_ASSETS = ("ingested_changes", "flushed_generations", "merged_base", "garbage_collected", "table_summary")
_JOBS = ("ingest_job", "maintenance_job", "quality_job")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (ORDERS.replace('type: "decimal128(12, 2)"', "type: decimal(12)"), "unknown type 'decimal(12)'"),
        (ORDERS.replace("primary_key: [order_id]", "primary_key: [order_no]"), "['order_no'] are not among"),
        (ORDERS.replace("name: customer,", "name: order_id,"), "duplicate column names ['order_id']"),
        (ORDERS.replace("shards: 2", "shard: 2"), "shard"),
        (ORDERS.replace("retention: keep", "retention: forever"), "LandingDeclaration.retention"),
        (ORDERS.replace("name: orders", "name: Orders"), "table name 'Orders'"),
        (ORDERS.replace("columns:", "columns: [\n"), "defs.yaml"),
        (ORDERS.replace("shards: 2", "shards: 2\n  tidy: {max_deleted_fraction: 1.5}"), "max_deleted_fraction"),
        (ORDERS.replace("shards: 2", "shards: 2\n  tidy: {max_rows_rewritten_per_pass: 0}"), "must be at least 1"),
    ],
    ids=[
        "unknown-type",
        "missing-key-column",
        "duplicate-column",
        "unknown-field",
        "bad-value",
        "bad-name",
        "yaml",
        "bad-fraction",
        "bad-rewrite-budget",
    ],
)
def test_a_bad_declaration_is_reported_with_its_file_and_field_and_the_others_load(tables_dir, text, expected):
    bad = declare(tables_dir, "a_bad", text)
    declare(tables_dir, "order_lines", LINES)

    loaded = load_tables(tables_dir, taken=[DEFAULT_TABLE])

    assert [t.name for t in loaded.tables] == ["order_lines"]
    assert list(loaded.broken) == [str(bad)]
    assert expected in loaded.broken[str(bad)]
    (spec,) = loaded.error_definitions().assets
    assert spec.key == AssetKey(["a_bad", "declaration_error"]) and expected in spec.description


def test_two_tables_may_share_neither_a_name_nor_a_uri(tables_dir, tmp_path, monkeypatch):
    declare(tables_dir, "a_orders", ORDERS)
    twin = declare(tables_dir, "b_orders", ORDERS.replace("/orders.lance", "/other.lance"))
    same_uri = declare(tables_dir, "c_orders", ORDERS.replace("name: orders", "name: orders_copy"))
    monkeypatch.setenv("LSM_TABLE_URI", str(tmp_path / "warehouse" / "default.lance"))
    on_default = declare(
        tables_dir,
        "d_default",
        LINES.replace("/order_lines.lance", "/default.lance").replace("name: order_lines", "name: x"),
    )

    loaded = load_tables(tables_dir, taken=[DEFAULT_TABLE])

    assert [t.name for t in loaded.tables] == ["orders"]
    assert "name: table 'orders' is already declared by" in loaded.broken[str(twin)]
    assert str(tables_dir / "a_orders" / "defs.yaml") in loaded.broken[str(same_uri)]
    assert "LSM_TABLE_URI" in loaded.broken[str(on_default)]


def test_the_code_location_loads_with_a_broken_declaration(tables_dir, monkeypatch):
    declare(tables_dir, "orders", ORDERS.replace("int64", "int65"))
    declare(tables_dir, "order_lines", LINES)
    monkeypatch.setenv("LSM_TABLES_DIR", str(tables_dir))
    from definitions import build_definitions

    repository = build_definitions().get_repository_def()

    assert "order_lines_maintenance_job" in repository.job_names and "merge_job" in repository.job_names
    assert AssetKey(["orders", "declaration_error"]) in repository.assets_defs_by_key
    sensors = {s.name: s for s in repository.sensor_defs}
    assert {"flush_sensor", "merge_sensor"} <= set(sensors)
    assert {j.name for j in sensors["merge_sensor"].jobs} == {"merge_job", "order_lines_maintenance_job"}


def test_removing_a_declaration_removes_its_definitions_and_leaves_its_data(tables_dir, tmp_path):
    import shutil

    from resources.lsm import LsmTable
    from resources.table_resource import LsmTableResource

    declare(tables_dir, "orders", ORDERS)
    (orders,) = load_tables(tables_dir, taken=[DEFAULT_TABLE]).tables
    LsmTableResource.for_table(orders).open().close()
    shutil.rmtree(tables_dir / "orders")

    assert not load_tables(tables_dir, taken=[DEFAULT_TABLE]).tables
    assert LsmTable.open(orders.table_uri).primary_key == ["order_id"]
