"""dagster-pyspark's ``LazyPySparkResource`` with the platform's session settings.

Imported by :class:`resources.spark.SparkResource` when a step first asks for
the session, never with the definitions (it imports ``pyspark.sql``).
"""

from dagster_pyspark import LazyPySparkResource

from .spark import spark_session


class PlatformPySparkResource(LazyPySparkResource):
    """The lazy session, built by :func:`resources.spark.spark_session` (``lance_lsm`` registered)."""

    master: str

    def _init_session(self) -> None:
        # The process's one session (see spark_session): tests and long-lived
        # workers share it, and a run process ends right after its steps anyway.
        if self._spark_session is None:
            self._spark_session = spark_session(self.master, self.spark_config)
