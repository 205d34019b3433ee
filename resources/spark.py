"""The Spark session every ingestion and Spark read uses.

``SPARK_MASTER`` (default ``local[*]``) picks the cluster. For local masters
the executors run this interpreter, so they see the same pinned packages.
"""

from __future__ import annotations

import os
import sys

from dagster import InitResourceContext
from dagster_pyspark import PySparkResource

from .lsm import register_spark_source
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
        "spark.sql.adaptive.enabled": "false",  # keep one partition per shard
        # The lance_lsm source pushes filters; Spark refuses it unless this is on.
        "spark.sql.python.filterPushdown.enabled": "true",
    }
    if master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        conf["spark.pyspark.python"] = os.environ["PYSPARK_PYTHON"]
    return conf


class LsmPySparkResource(PySparkResource):
    """dagster-pyspark's resource whose session can read ``spark.read.format("lance_lsm")``."""

    def setup_for_execution(self, context: InitResourceContext) -> None:
        super().setup_for_execution(context)
        register_spark_source(self.spark_session)


def lsm_pyspark_resource() -> LsmPySparkResource:
    """The platform's PySpark resource: this platform's settings, ``lance_lsm`` registered."""
    return LsmPySparkResource(spark_config=spark_conf(spark_master()))
