"""``LsmTableIOManager`` loads the merged view into downstream assets by annotation."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest
from dagster import AssetIn, MaterializeResult, asset, materialize
from pyspark.sql import DataFrame as SparkDataFrame

from resources.io_manager import LsmTableIOManager
from resources.spark import SparkResource
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
