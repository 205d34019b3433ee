"""Shared fixtures: real Lance tables on local disk."""

from __future__ import annotations

import pyarrow as pa
import pytest

from resources.lsm import LsmTable

ITEMS_SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("price", pa.float64())])


@pytest.fixture
def make_table(tmp_path):
    """Create LSM tables under the test's temporary directory; closes them afterwards."""
    created: list[LsmTable] = []

    def make(
        schema: pa.Schema = ITEMS_SCHEMA, primary_key=("id",), num_shards: int = 4, name: str = "table", **writer_config
    ) -> LsmTable:
        table = LsmTable.create(
            str(tmp_path / f"{name}.lance"), schema, list(primary_key), num_shards=num_shards, **writer_config
        )
        created.append(table)
        return table

    yield make
    for table in created:
        table.close()


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for the whole test session (the platform's SparkResource reuses it)."""
    from resources.spark import spark_session

    session = spark_session("local[2]")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
