"""Spark DataFrames over an LSM table's levels, for checks that must scale past memory.

The merged view comes from the ``lance_lsm`` data source
(:mod:`.source`). The base table alone is read here: one Spark task per
slice of base fragments, each streaming its fragments' record batches, so no
process holds more than a batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import lance
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from ..table import LsmTable
from .options import spark_options_of


def base_frame(spark: SparkSession, table: LsmTable, columns: list[str]) -> DataFrame:
    """``columns`` of every row of the base table (no LSM levels), pinned to its current version."""
    dataset = table.dataset()
    uri, version, options = table.uri, dataset.version, table.storage_options
    schema = pa.schema([dataset.schema.field(c) for c in columns])
    fragments = [(f.fragment_id,) for f in dataset.get_fragments()]

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        pinned = lance.dataset(uri, version=version, storage_options=options)
        for batch in batches:
            for fragment_id in batch.column(0).to_pylist():
                # An id of the pinned version's own fragments: never missing.
                fragment = cast(lance.LanceFragment, pinned.get_fragment(fragment_id))
                for rows in fragment.to_batches(columns=columns):
                    yield rows.cast(schema)

    ids = spark.createDataFrame(fragments, "fragment_id long")
    return ids.repartition(max(len(fragments), 1)).mapInArrow(read, from_arrow_schema(schema))


def merged_view_frame(spark: SparkSession, table: LsmTable, columns: list[str]) -> DataFrame:
    """``columns`` of the merged view (what :meth:`LsmTable.read` returns), read by Spark tasks."""
    from .source import register_spark_source

    register_spark_source(spark)
    storage = spark_options_of(table.storage_options)
    return spark.read.format("lance_lsm").option("columns", ",".join(columns)).options(**storage).load(table.uri)
