"""The Spark session every ingestion and Spark read uses.

``SPARK_MASTER`` (default ``local[*]``) picks the cluster. For local masters
the executors run this interpreter, so they see the same pinned packages.
"""

from __future__ import annotations

import os
import sys

from dagster_pyspark import PySparkResource

from .settings import spark_master


def spark_conf(master: str) -> dict[str, str]:
    """Session settings: small shuffles (data is partitioned by shard), Arrow on, no UI port clashes.

    For a local master this also points ``PYSPARK_PYTHON`` at this interpreter
    (unless set): PySpark's workers read the variable, not the session config.
    """
    conf = {
        "spark.master": master,
        "spark.app.name": "lance-lsm",
        "spark.sql.shuffle.partitions": "8",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": "2g",
        "spark.sql.adaptive.enabled": "false",  # keep one partition per shard range
    }
    if master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        conf["spark.pyspark.python"] = os.environ["PYSPARK_PYTHON"]
    return conf


def lsm_pyspark_resource() -> PySparkResource:
    """dagster-pyspark's resource configured for this platform."""
    return PySparkResource(spark_config=spark_conf(spark_master()))
