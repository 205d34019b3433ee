"""Step config shared by every table: declared fields come from the run's table unless the run sets them."""

from __future__ import annotations

from dagster import build_op_context

from lsm_assets.checks import DRILL_CHECK_CONFIG
from lsm_assets.ingestion import INGEST_CONFIG
from lsm_assets.maintenance import GC_CONFIG, MERGE_CONFIG
from resources.declared_table import ColumnDeclaration, DeclaredTable
from resources.lsm.maintenance.policy import BackpressurePolicy

ORDERS = DeclaredTable.model_validate(
    {
        "name": "orders",
        "columns": [ColumnDeclaration(name="order_id", type="int64")],
        "primary_key": ["order_id"],
        "landing": {"directory": "/landing/orders", "retention": "keep", "csv_null_markers": ["", "NA"]},
        "gc": {"wal_grace_seconds": 5.0},
        "tidy": {"max_deleted_fraction": 0.3, "max_rows_rewritten_per_pass": 5000},
        "quality": {"sample_rows": 500},
    }
)
CUSTOMERS = ORDERS.model_copy(
    update={"name": "customers", "landing": ORDERS.landing.model_copy(update={"directory": "/c"})}
)


def test_every_table_shares_one_schema_and_a_run_without_config_takes_its_tables_declaration():
    assert INGEST_CONFIG.schema(ORDERS) is INGEST_CONFIG.schema(CUSTOMERS)

    orders = INGEST_CONFIG.resolve(build_op_context(op_config={}), ORDERS)
    customers = INGEST_CONFIG.resolve(build_op_context(op_config={}), CUSTOMERS)

    assert (orders.landing_dir, customers.landing_dir) == ("/landing/orders", "/c")
    assert orders.landing_retention == "keep" and orders.csv_null_markers == ["", "NA"]
    assert orders.quarantine_dir == "/landing/orders/_quarantine"
    assert GC_CONFIG.resolve(build_op_context(op_config={}), ORDERS).wal_grace_seconds == 5.0
    merge = MERGE_CONFIG.resolve(build_op_context(op_config={}), ORDERS)
    assert (merge.max_deleted_fraction, merge.max_rows_rewritten_per_pass) == (0.3, 5000)
    assert DRILL_CHECK_CONFIG.resolve(build_op_context(op_config=None), ORDERS).sample_rows == 500


def test_what_a_run_sets_wins_over_the_declaration():
    given = {"landing_dir": "/elsewhere", "landing_retention": "delete", "stop_generations": 3}

    config = INGEST_CONFIG.resolve(build_op_context(op_config=given), ORDERS)

    assert (config.landing_dir, config.landing_retention, config.stop_generations) == ("/elsewhere", "delete", 3)
    assert config.csv_null_markers == ["", "NA"]  # not set by the run: still the declaration's
    assert MERGE_CONFIG.resolve(build_op_context(op_config={"shards": [1]}), ORDERS).shards == [1]


def test_declared_fields_have_no_default_in_the_schema_and_the_others_keep_theirs():
    fields = INGEST_CONFIG.schema(ORDERS)

    assert not fields["landing_dir"].is_required and not fields["landing_dir"].default_provided
    assert "the table's declaration" in fields["landing_dir"].description
    assert fields["stop_generations"].default_value == BackpressurePolicy.stop_generations
