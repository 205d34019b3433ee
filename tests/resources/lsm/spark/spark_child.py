"""Run an ingestion in a child process, so tests can SIGKILL it at any moment."""

from __future__ import annotations

from pyspark.sql import SparkSession

from resources.lsm.spark.ingest import ingest_landing_files
from resources.spark import spark_conf


def ingest(table_uri: str, landing_dir: str, quarantine_dir: str) -> None:
    builder = SparkSession.builder
    for key, value in spark_conf("local[2]").items():
        builder = builder.config(key, value)
    ingest_landing_files(builder.getOrCreate(), table_uri, landing_dir, quarantine_dir)
