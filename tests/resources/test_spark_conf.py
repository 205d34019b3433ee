"""What a Spark session asks of its master: executors' Python, driver address, executor size."""

from __future__ import annotations

import sys

from resources.spark import spark_conf


def test_every_master_names_the_executors_python(monkeypatch):
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    for master in ("local[2]", "spark://10.0.0.5:7077"):
        assert spark_conf(master)["spark.pyspark.python"] == sys.executable
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/venv/bin/python")
    assert spark_conf("spark://10.0.0.5:7077")["spark.pyspark.python"] == "/opt/venv/bin/python"


def test_cluster_masters_get_small_executors_and_a_reachable_driver(monkeypatch):
    monkeypatch.delenv("SPARK_EXECUTOR_MEMORY", raising=False)
    loopback = spark_conf("spark://127.0.0.1:7077")
    assert loopback["spark.driver.host"] == loopback["spark.driver.bindAddress"] == "127.0.0.1"
    assert (loopback["spark.executor.memory"], loopback["spark.executor.cores"]) == ("1g", "1")
    remote = spark_conf("spark://10.0.0.5:7077")
    assert "spark.driver.host" not in remote
    assert "spark.executor.memory" not in spark_conf("local[2]")
