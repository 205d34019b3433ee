"""Read a table through the ``lance_lsm`` source on the master named by ``SPARK_MASTER``; print a JSON report.

Run as a child process: a test process keeps one Spark session (``local[2]``), so a
session on a cluster needs a process of its own.
"""

from __future__ import annotations

import json
import os
import sys


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def _worker_pids(_: object) -> tuple[int, int]:
    """This Python worker's pid and its JVM's (worker -> pyspark.daemon -> executor JVM)."""
    return os.getpid(), _parent(os.getppid())


def main(uri: str) -> None:
    from resources.spark import spark_session

    spark = spark_session(os.environ["SPARK_MASTER"])
    frame = spark.read.format("lance_lsm").load(uri)
    rows = [row.asDict() for row in frame.collect()]
    pids = spark.sparkContext.parallelize(range(8), 8).map(_worker_pids).collect()
    report = {
        "rows": rows,
        "partitions": frame.rdd.getNumPartitions(),
        "python_worker_pids": sorted({worker for worker, _ in pids}),
        "executor_jvm_pids": sorted({jvm for _, jvm in pids}),
        "driver_pids": [os.getpid(), spark.sparkContext._jvm.ProcessHandle.current().pid()],
    }
    spark.stop()
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
