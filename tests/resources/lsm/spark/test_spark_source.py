"""The ``lance_lsm`` Spark source returns exactly the merged view."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.datasource import GreaterThanOrEqual, StringStartsWith

from resources.lsm import LsmTable, register_spark_source
from resources.lsm.spark.source import LsmDataSource
from tests.conftest import ITEMS_SCHEMA
from tests.helpers import rows_by_key


def items(ids, name: str) -> pa.Table:
    ids = list(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "name": [name] * len(ids), "price": [float(i) for i in ids]})


def deletes(ids) -> pa.Table:
    return pa.table({"id": pa.array(list(ids), pa.int64()), "_op": ["delete"] * len(ids)})


@pytest.fixture(scope="module")
def lsm(spark, tmp_path_factory):
    """Every level populated: merged base, two pending generations, a WAL tail; deletes in each."""
    table = LsmTable.create(str(tmp_path_factory.mktemp("spark") / "t.lance"), ITEMS_SCHEMA, ["id"], num_shards=3)
    for changes in (items(range(600), "base"), deletes(range(20))):
        table.write(changes)
        table.close()
    table.compact()
    for changes in (items(range(100, 250), "gen2"), deletes(range(240, 260))):
        table.write(changes)
        table.close()
    table.write(items(range(200, 220), "tail"))
    table.write(items(range(700, 710), "tail"))
    table.write(deletes(range(300, 305)))
    register_spark_source(spark)
    yield table
    table.close()


def spark_rows(df) -> dict:
    return rows_by_key(pa.Table.from_pandas(df.toPandas(), preserve_index=False))


def test_equals_the_merged_view_with_one_partition_per_shard(spark, lsm):
    df = spark.read.format("lance_lsm").load(lsm.uri)
    assert df.rdd.getNumPartitions() == lsm.num_shards
    assert spark_rows(df) == rows_by_key(lsm.read())
    assert sum(s.unflushed_wal_entries for s in lsm.shards()) > 0, "the WAL tail was part of the read"
    stale = spark.read.format("lance_lsm").option("fresh", "false").load(lsm.uri)
    assert spark_rows(stale) == rows_by_key(lsm.read(fresh=False))


def test_column_pruning(spark, lsm):
    by_option = spark.read.format("lance_lsm").option("columns", "id,name").load(lsm.uri)
    by_schema = spark.read.format("lance_lsm").schema("id long, price double").load(lsm.uri)
    assert by_option.columns == ["id", "name"] and by_schema.columns == ["id", "price"]
    assert spark_rows(by_option) == rows_by_key(lsm.read(columns=["id", "name"]))
    assert spark_rows(by_schema) == rows_by_key(lsm.read(columns=["id", "price"]))


@pytest.mark.parametrize(
    "spark_filter, lance_filter",
    [
        ("price >= 150 AND price < 230", "price >= 150 AND price < 230"),
        ("name = 'base' AND id IN (5, 25, 120, 400)", "name = 'base' AND id IN (5, 25, 120, 400)"),
        ("NOT name LIKE 'ta%'", "NOT name LIKE 'ta%'"),
    ],
)
def test_pushed_filters_apply_to_the_newest_version(spark, lsm, spark_filter, lance_filter):
    df = spark.read.format("lance_lsm").load(lsm.uri).filter(spark_filter)
    assert spark_rows(df) == rows_by_key(lsm.read(filter=lance_filter))


def test_push_filters_keeps_what_it_can_express(lsm):
    source = LsmDataSource({"path": lsm.uri})
    reader = source.reader(source.schema())
    on_price, on_missing = GreaterThanOrEqual(("price",), 150.0), StringStartsWith(("nope",), "x")
    assert list(reader.pushFilters([on_price, on_missing])) == [on_missing]
    assert reader.filters == [on_price]


def test_partitions_split_the_base_and_pin_the_snapshot(lsm):
    source = LsmDataSource({"path": lsm.uri})
    reader = source.reader(source.schema())
    partitions = reader.partitions()
    fragments = [f for p in partitions for f in p.fragment_ids]
    assert sorted(fragments) == sorted(f.fragment_id for f in lsm.dataset().get_fragments())
    lsm.write(items([900], "later"))  # after planning: not part of this read
    rows = pa.Table.from_batches([b for p in partitions for b in reader.read(p)])
    assert 900 not in rows["id"].to_pylist()
    assert rows_by_key(rows) == {k: v for k, v in rows_by_key(lsm.read()).items() if k != (900,)}


def test_as_of_reads_a_version_and_changes_since_reads_the_feed(spark, tmp_path):
    table = LsmTable.create(str(tmp_path / "versions.lance"), ITEMS_SCHEMA, ["id"], num_shards=2)
    table.write(items(range(50), "one"))
    table.close()
    table.compact()
    table.write(items(range(40, 60), "two"))  # in the WAL when the version is taken
    version, view = table.version(), rows_by_key(table.read())
    table.write(deletes(range(5)))
    table.write(items(range(55, 70), "three"))
    table.close()
    table.compact()
    register_spark_source(spark)

    then = spark.read.format("lance_lsm").option("as_of", str(version)).load(table.uri)
    assert spark_rows(then) == view
    feed = spark.read.format("lance_lsm").option("changes_since", str(version)).load(table.uri)
    expected = rows_by_key(table.changes(since=version).read_all())
    assert spark_rows(feed) == expected and len(expected) == 5 + 15
