"""Spark work in a child process, so tests can SIGKILL it at any moment or give it its own master."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pyarrow as pa

from resources.lsm.spark.ingest import ingest_landing_files
from resources.spark import spark_session

FIRST_ATTEMPT_CUSTOMER = "written-by-a-failed-attempt"


def ingest(table_uri: str, landing_dir: str, quarantine_dir: str) -> None:
    ingest_landing_files(spark_session("local[2]"), table_uri, landing_dir, quarantine_dir)


def stream(table_uri: str, source_dir: str, checkpoint: str) -> None:
    """Stream the Parquet files of ``source_dir`` (one per micro-batch, oldest first) into the table, then stop."""
    spark = spark_session("local[2]")
    query = (
        spark.readStream.schema(spark.read.parquet(source_dir).schema)
        .option("maxFilesPerTrigger", 1)
        .parquet(source_dir)
        .writeStream.format("lance_lsm")
        .option("checkpointLocation", checkpoint)
        .start(table_uri)
    )
    query.processAllAvailable()
    query.stop()


def write_with_a_failed_first_attempt(table_uri: str, changes: str, marker: str) -> None:
    """``df.write`` of the Parquet file ``changes``, where partition 0's first attempt fails midway.

    That attempt hands the writer a few batches with ``customer`` replaced by
    :data:`FIRST_ATTEMPT_CUSTOMER`, touches ``marker`` and raises; Spark (up to
    2 attempts per task) runs it again.
    """
    spark = spark_session("local[2,2]", {"spark.sql.execution.arrow.maxRecordsPerBatch": "50"})
    frame = spark.read.parquet(changes).repartition(2)
    frame.mapInArrow(partial(_fail_first_attempt, marker), frame.schema).write.format("lance_lsm").mode(
        "append"
    ).option("write_id", "retried").save(table_uri)


def _fail_first_attempt(marker: str, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from pyspark import TaskContext

    task = TaskContext.get()
    doomed = task is not None and task.partitionId() == 0 and task.attemptNumber() == 0
    for number, batch in enumerate(batches):
        if doomed and number == 3:
            Path(marker).touch()
            raise RuntimeError("first attempt of partition 0 fails on purpose")
        if doomed:
            customers = pa.array([FIRST_ATTEMPT_CUSTOMER] * batch.num_rows, batch.schema.field("customer").type)
            batch = batch.set_column(batch.schema.get_field_index("customer"), "customer", customers)
        yield batch
