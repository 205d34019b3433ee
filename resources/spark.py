"""``SparkResource``: the Spark session of a run (dagster-pyspark's), started only when a step asks for it.

Neither dagster-pyspark nor PySpark is imported with the definitions (PySpark's
modules cost about 0.4 s, paid by every code-server start, sensor tick and
run): the resource builds dagster-pyspark's ``LazyPySparkResource`` the first
time a step asks for the session (:mod:`resources.lazy_pyspark`).

``SPARK_MASTER`` (default ``local[*]``) picks the cluster. Executors run the
interpreter ``PYSPARK_PYTHON`` names (default: this one), so on one machine
they see the same pinned packages; see :func:`spark_conf` for cluster masters.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from dagster import ConfigurableResource
from pydantic import Field, PrivateAttr

from .settings import spark_master

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from .lazy_pyspark import PlatformPySparkResource


def spark_conf(master: str) -> dict[str, str]:
    """Session settings: small shuffles (data is partitioned by shard), Arrow on, no UI port clashes.

    ``PYSPARK_PYTHON`` (set to this interpreter unless already set) names the
    executors' Python: it must have this package installed (for a local master,
    or cluster workers on this machine, this interpreter has). PySpark reads
    the variable, not the session config, when the context starts. For a cluster
    master, executors get ``SPARK_EXECUTOR_MEMORY`` / ``SPARK_EXECUTOR_CORES``
    (default 1g, 1 core), and a master on the loopback interface makes the
    driver listen and advertise 127.0.0.1 (executors would otherwise dial the
    machine's host name, which need not resolve to a reachable address).
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
    # PySpark names the executors' interpreter from this variable when the
    # context starts (default "python3" on the PATH), whatever the session config says.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf["spark.pyspark.python"] = os.environ["PYSPARK_PYTHON"]
    if not master.startswith("local"):
        conf["spark.executor.memory"] = os.environ.get("SPARK_EXECUTOR_MEMORY", "1g")
        conf["spark.executor.cores"] = os.environ.get("SPARK_EXECUTOR_CORES", "1")
    if _on_loopback(master):
        conf["spark.driver.host"] = conf["spark.driver.bindAddress"] = "127.0.0.1"
    return conf


def _on_loopback(master: str) -> bool:
    """Whether a ``spark://host:port`` master URL names this machine's loopback interface."""
    host = master.removeprefix("spark://").split(":", 1)[0]
    return master.startswith("spark://") and host in ("127.0.0.1", "localhost")


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
    """dagster-pyspark's lazy Spark session, with the platform's settings and ``lance_lsm`` registered.

    A run whose steps never touch :attr:`spark_session` starts no JVM and
    imports no PySpark. ``spark_config`` adds Spark settings to :func:`spark_conf`'s.
    """

    master: str = Field(default_factory=spark_master, description="Spark master URL (env SPARK_MASTER).")
    spark_config: dict[str, Any] = Field(default_factory=dict, description="More Spark settings for the session.")
    _pyspark: PlatformPySparkResource | None = PrivateAttr(default=None)

    @property
    def pyspark(self) -> PlatformPySparkResource:
        """dagster-pyspark's ``LazyPySparkResource`` for these settings (built on first use)."""
        if self._pyspark is None:
            from .lazy_pyspark import PlatformPySparkResource

            self._pyspark = PlatformPySparkResource(master=self.master, spark_config=self.spark_config)
        return self._pyspark

    @property
    def spark_session(self) -> SparkSession:
        """The session, started on first use (the process's one session: see :func:`spark_session`)."""
        return self.pyspark.spark_session
