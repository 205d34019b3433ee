"""Run an ingestion in a child process, so tests can SIGKILL it at any moment."""

from __future__ import annotations

from resources.lsm.spark.ingest import ingest_landing_files
from resources.spark import spark_session


def ingest(table_uri: str, landing_dir: str, quarantine_dir: str) -> None:
    ingest_landing_files(spark_session("local[2]"), table_uri, landing_dir, quarantine_dir)
