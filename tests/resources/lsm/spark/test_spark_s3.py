"""Spark ingestion and the ``lance_lsm`` source with the table, landing files and quarantine on ``s3://``.

The Spark session started before the ``AWS_*`` variables were set, so its
Python workers have none: every executor reaches the store through the
storage options the driver passes along (moto_server, a real process).
"""

from __future__ import annotations

import json
import os

import pyarrow.fs as pafs

from resources.lsm import LsmTable, register_spark_source
from resources.lsm.format.layout import ARCHIVE_DIR
from resources.lsm.format.storage import TableStorage, filesystem
from resources.lsm.ingest.landing import IngestLedger
from resources.lsm.spark.frames import merged_view_frame
from resources.lsm.spark.ingest import ingest_landing_files
from resources.lsm.testing.changegen import EVENTS_SCHEMA, ChangeStreamSpec, replay, write_landing_files


def _quarantined(path: str, options: dict[str, str]) -> list[dict]:
    fs, root = filesystem(path, options)
    files = sorted(f.path for f in fs.get_file_info(pafs.FileSelector(root)) if f.path.endswith(".json"))
    return [json.loads(line) for f in files for line in fs.open_input_stream(f).read().decode().splitlines()]


def test_spark_ingestion_from_s3_landing_with_s3_quarantine_equals_the_oracle(spark, s3_root, s3_server):
    options = s3_server.storage_options()
    workers_env = spark.sparkContext.parallelize([0], 1).map(lambda _: os.environ.get("AWS_ENDPOINT_URL")).collect()
    assert workers_env == [None], "executors must get the store from the storage options alone"
    table_uri, landing, quarantine = f"{s3_root}/table.lance", f"{s3_root}/landing", f"{s3_root}/quarantine"
    table = LsmTable.create(table_uri, EVENTS_SCHEMA, ["id"], num_shards=2, storage_options=options)
    batches = []
    for prefix, fmt, seed in (("a", "csv", 1), ("b", "jsonl", 2), ("c", "parquet", 3)):
        spec = ChangeStreamSpec(num_keys=100, num_batches=1, batch_size=80, seed=seed, delete_ratio=0.2)
        batches += write_landing_files(spec, landing, fmt, malformed_per_file=1 if fmt == "csv" else 0, prefix=prefix)

    report = ingest_landing_files(spark, table_uri, landing, f"{s3_root}/quarantine", storage_options=options)

    assert report.files == ("a-000000.csv", "b-000000.jsonl", "c-000000.parquet")
    assert {k[0]: v for k, v in _view(table).items()} == replay(batches)
    assert report.quarantine_path and report.quarantine_path.startswith(f"{quarantine}/run=")
    rejected = _quarantined(report.quarantine_path, options)
    assert report.rows_quarantined == len(rejected) == 1 and rejected[0]["file"] == "a-000000.csv"
    assert sorted(e.name for e in IngestLedger(TableStorage(table_uri, options)).entries()) == list(report.files)
    archived = TableStorage(landing, options).list_dir(ARCHIVE_DIR)
    assert sorted(e.name for e in archived) == list(report.files)
    assert TableStorage(table_uri, options).list_dir("_lsm_ingest/staging") == []
    assert not ingest_landing_files(spark, table_uri, landing, quarantine, storage_options=options).files

    # The lance_lsm source reads the s3 table from Spark tasks, with pending generations and a merged base.
    table.compact()
    table.write(batches[0].slice(0, 10))  # a WAL tail too
    register_spark_source(spark)
    read = spark.read.format("lance_lsm").options(**{f"storage.{k}": v for k, v in options.items()}).load(table_uri)
    assert sorted(map(tuple, read.collect())) == sorted(map(tuple, (r.values() for r in _rows(table))))
    frame = merged_view_frame(spark, table, ["id", "status"])
    assert sorted(r.id for r in frame.collect()) == sorted(r["id"] for r in _rows(table))
    table.close()


def _view(table: LsmTable) -> dict:
    return {(row["id"],): row for row in _rows(table)}


def _rows(table: LsmTable) -> list[dict]:
    return table.read().to_pylist()
