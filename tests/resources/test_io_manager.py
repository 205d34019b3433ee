"""``LsmTableIOManager`` loads the merged view (or its changes) of the upstream asset's table into downstream assets."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest
from dagster import AssetIn, AssetKey, AssetSpec, MaterializeResult, asset, instance_for_test, materialize
from pyspark.sql import DataFrame as SparkDataFrame

from resources.declared_table import DeclaredTable
from resources.io_manager import LsmTableIOManager, TableChanges
from resources.spark import SparkResource
from resources.table_resource import DeclaredTables, LsmTableResource
from tests.helpers import rows_by_key

SEEN: dict[str, object] = {}


@asset
def items() -> MaterializeResult:
    """Stands in for ingestion: the table was written through the engine already."""
    return MaterializeResult(metadata={"written": True})


@asset
def as_arrow(items: pa.Table) -> None:
    SEEN["arrow"] = items


@asset
def as_pandas(items: pd.DataFrame) -> None:
    SEEN["pandas"] = items


@asset(required_resource_keys={"spark"})
def as_spark(items: SparkDataFrame) -> None:
    SEEN["spark"] = items.toPandas()


@asset(ins={"items": AssetIn("items", metadata={"lsm/format": "pandas"})})
def as_named_format(items) -> None:
    SEEN["named"] = items


@pytest.fixture
def table(make_table):
    t = make_table()
    t.write(pa.table({"id": pa.array(range(10), pa.int64()), "name": ["a"] * 10, "price": [1.0] * 10}))
    t.close()
    t.write(pa.table({"id": pa.array([3, 11], pa.int64()), "name": ["wal", "wal"], "price": [2.0, 2.0]}))
    t.write(pa.table({"id": pa.array([4], pa.int64()), "_op": ["delete"]}))
    return t


def row_count(result, asset_name: str) -> int:
    events = [e for e in result.all_events if e.event_type_value == "LOADED_INPUT" and e.step_key == asset_name]
    return events[0].event_specific_data.metadata["row_count"].value


def test_loads_the_fresh_merged_view_as_arrow_and_pandas(table):
    result = materialize([items, as_arrow, as_pandas], resources={"io_manager": LsmTableIOManager(uri=table.uri)})
    assert result.success
    expected = rows_by_key(table.read())
    assert len(expected) == 10 and expected[(3,)]["name"] == "wal" and (4,) not in expected
    assert rows_by_key(SEEN["arrow"]) == expected
    assert rows_by_key(pa.Table.from_pandas(SEEN["pandas"], preserve_index=False)) == expected
    assert row_count(result, "as_arrow") == row_count(result, "as_pandas") == 10


def test_loads_a_spark_dataframe_through_the_lance_lsm_source(table, spark):
    result = materialize(
        [items, as_spark],
        resources={
            "io_manager": LsmTableIOManager(uri=table.uri),
            "spark": SparkResource(master="local[2]"),
        },
    )
    assert result.success
    assert rows_by_key(pa.Table.from_pandas(SEEN["spark"], preserve_index=False)) == rows_by_key(table.read())
    assert row_count(result, "as_spark") == 10


def test_the_format_named_in_input_metadata_wins_over_a_missing_annotation(table):
    result = materialize([items, as_named_format], resources={"io_manager": LsmTableIOManager(uri=table.uri)})
    assert result.success and isinstance(SEEN["named"], pd.DataFrame)
    assert rows_by_key(pa.Table.from_pandas(SEEN["named"], preserve_index=False)) == rows_by_key(table.read())


def test_refuses_data_returned_by_an_asset(table):
    @asset(name="returns_rows")
    def returns_rows() -> pa.Table:
        return pa.table({"id": [1]})

    with pytest.raises(TypeError, match=r"write through LsmTable\.write"):
        materialize([returns_rows], resources={"io_manager": LsmTableIOManager(uri=table.uri)})


@pytest.mark.parametrize("filter_text, loaded", [("   ", 10), ("price > 1", 2), ("1=1; DROP TABLE x", None)])
def test_filter_metadata_is_checked_before_any_read(table, filter_text, loaded):
    @asset(name="items", metadata={"lsm/filter": filter_text})
    def filtered_items() -> MaterializeResult:
        return MaterializeResult()

    assets = [filtered_items, as_arrow]
    if loaded is None:
        with pytest.raises(ValueError, match="Lance would ignore everything after the ';'"):
            materialize(assets, resources={"io_manager": LsmTableIOManager(uri=table.uri)})
        return
    result = materialize(assets, resources={"io_manager": LsmTableIOManager(uri=table.uri)})
    assert result.success and row_count(result, "as_arrow") == loaded


def test_an_asset_of_a_declared_table_reads_that_table(table, tmp_path):
    """`orders/...` inputs read `orders` (its view and its changes), not the default table at `uri`."""
    columns = [{"name": f.name, "type": str(f.type)} for f in table.schema]
    declared = DeclaredTable(name="orders", uri=str(tmp_path / "orders.lance"), columns=columns, primary_key=["id"])
    orders = LsmTableResource.for_table(declared).open()
    orders.write(pa.table({"id": pa.array([100, 101], pa.int64()), "name": ["o", "o"], "price": [5.0, 6.0]}))
    upstream = AssetKey(["orders", "ingested_changes"])

    @asset(ins={"rows": AssetIn(upstream, input_manager_key="lsm_io_manager")})
    def orders_rows(rows: pa.Table) -> None:
        SEEN["orders"] = rows

    @asset(ins={"rows": AssetIn(upstream, input_manager_key="lsm_io_manager", metadata={"lsm/read": "changes"})})
    def orders_changes(rows: TableChanges) -> MaterializeResult:
        SEEN["orders_changes"] = rows
        return MaterializeResult(metadata=rows.cursor_metadata())

    resources = {"lsm_io_manager": LsmTableIOManager(uri=table.uri, tables=DeclaredTables([declared]))}
    assets = [AssetSpec(upstream), orders_rows, orders_changes]
    with instance_for_test() as instance:
        assert materialize(assets, resources=resources, instance=instance).success
        assert rows_by_key(SEEN["orders"]) == rows_by_key(orders.read())
        orders.write(pa.table({"id": pa.array([101], pa.int64()), "_op": ["delete"]}))
        assert materialize(assets, resources=resources, instance=instance).success
    changes = SEEN["orders_changes"]
    assert changes.since is not None and changes.rows.to_pylist() == [
        {"id": 101, "name": None, "price": None, "_op": "delete"}
    ]
    assert changes.previous()["id"].to_pylist() == [101]
