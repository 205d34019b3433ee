"""Spark work in a child process, so tests can SIGKILL it at any moment or give it its own master."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
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


def write(table_uri: str, changes: str, write_id: str, master: str = "local[2]") -> None:
    """``df.write`` of the Parquet file ``changes`` under ``write_id``, on ``master``."""
    frame = spark_session(master).read.parquet(changes).repartition(4)
    frame.write.format("lance_lsm").mode("append").option("write_id", write_id).save(table_uri)


def write_with_a_failed_first_attempt(table_uri: str, changes: str, marker: str) -> None:
    """``df.write`` of the Parquet file ``changes``, where partition 0's first write attempt dies midway.

    That attempt gets its rows with ``customer`` replaced by
    :data:`FIRST_ATTEMPT_CUSTOMER`. Once its writer has a staged file open for
    writing, its Python worker is SIGKILLed and ``marker`` is written; Spark (up to 2
    attempts per task) runs the task again.
    """
    spark = spark_session("local[2,2]", {"spark.sql.execution.arrow.maxRecordsPerBatch": "50"})
    frame = spark.read.parquet(changes).repartition(2)
    watchdog = threading.Thread(target=_kill_first_attempt_while_staging, args=(marker,), daemon=True)
    watchdog.start()
    frame.mapInArrow(_mark_first_attempt, frame.schema).write.format("lance_lsm").mode("append").option(
        "write_id", "retried"
    ).save(table_uri)


def _mark_first_attempt(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from pyspark import TaskContext

    task = TaskContext.get()
    marked = task is not None and task.partitionId() == 0 and task.attemptNumber() == 0
    for batch in batches:
        if marked:
            customers = pa.array([FIRST_ATTEMPT_CUSTOMER] * batch.num_rows, batch.schema.field("customer").type)
            batch = batch.set_column(batch.schema.get_field_index("customer"), "customer", customers)
        yield batch


def _kill_first_attempt_while_staging(marker: str, timeout: float = 300.0) -> None:
    """SIGKILL the process (one of ours) writing partition 0's first-attempt staged file."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in _descendants(os.getpid()):
            if _writes_to(pid, "/part-00000-0-bucket-"):
                os.kill(pid, signal.SIGKILL)
                Path(marker).write_text("killed while staging")
                return
        time.sleep(0.005)


def _descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # the process ended meanwhile
    found, frontier = [], [root]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def _writes_to(pid: int, name_part: str) -> bool:
    """Whether ``pid`` has a file whose path holds ``name_part`` open for writing (a commit only reads them)."""
    try:
        return any(
            name_part in os.readlink(fd) and _open_for_writing(pid, fd.name) for fd in Path(f"/proc/{pid}/fd").iterdir()
        )
    except OSError:
        return False


def _open_for_writing(pid: int, fd: str) -> bool:
    flags = next(
        line for line in Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines() if line.startswith("flags:")
    )
    return int(flags.split()[1], 8) & os.O_ACCMODE != os.O_RDONLY
