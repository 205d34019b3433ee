"""``SparkResource``: the Spark session of a run, started only when a step asks for it.

``SPARK_MASTER`` (default ``local[*]``) picks the cluster. For local masters
the executors run this interpreter, so they see the same pinned packages.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from dagster import ConfigurableResource, InitResourceContext
from pydantic import Field, PrivateAttr

from .settings import spark_master

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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


def spark_session(master: str | None = None, extra_conf: dict[str, str] | None = None) -> SparkSession:
    """The process's Spark session with the platform's settings and ``lance_lsm`` registered.

    Returns the active session if one exists (``getOrCreate``): one session per
    process, whoever asks first (a run, a test, a benchmark).
    """
    from pyspark.sql import SparkSession

    from .lsm import register_spark_source

    builder = SparkSession.builder
    for key, value in {**spark_conf(master or spark_master()), **(extra_conf or {})}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    register_spark_source(session)
    return session


class SparkResource(ConfigurableResource):
    """A Spark session for the steps that need one, started on first use.

    A run whose steps never touch :attr:`spark_session` starts no JVM, and
    importing this module does not import PySpark.
    """

    master: str = Field(default_factory=spark_master, description="Spark master URL (env SPARK_MASTER).")
    extra_conf: dict[str, str] = Field(default_factory=dict, description="More Spark settings for the session.")
    _session: SparkSession | None = PrivateAttr(default=None)

    @property
    def spark_session(self) -> SparkSession:
        """The session (started and ``lance_lsm`` registered on first access)."""
        if self._session is None:
            self._session = spark_session(self.master, self.extra_conf)
        return self._session

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        # The session stays up for the process: tests and long-lived workers
        # share it, and a run process ends right after its steps anyway.
        self._session = None
