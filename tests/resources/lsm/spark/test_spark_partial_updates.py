"""Partial updates through Spark: landing files (JSON, CSV, Debezium), the DataFrame writer, the sink, the source."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from resources.lsm import LsmTable
from resources.lsm.ingest.cdc import CdcFormat
from resources.lsm.ingest.landing import LandingPolicy
from resources.lsm.spark.ingest import ingest_landing_files
from resources.lsm.testing.changegen import ChangeStreamSpec, replay_table, write_table_landing_files
from tests.helpers import rows_by_key

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("qty", pa.int64()), ("price", pa.float64())])
SEED = [{"id": k, "name": f"n{k}", "qty": k, "price": float(k)} for k in range(1, 6)]


def seeded(make_table) -> LsmTable:
    table = make_table(SCHEMA, merge_engine="partial-update")
    table.write(pa.Table.from_pylist(SEED, schema=SCHEMA))
    table.flush()
    return table


def view(table: LsmTable) -> dict:
    return {k[0]: (r["name"], r["qty"], r["price"]) for k, r in rows_by_key(LsmTable.open(table.uri).read()).items()}


def lines(*records: object) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def test_landing_files_set_only_the_fields_they_carry(spark, make_table, tmp_path):
    table = seeded(make_table)
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "a.jsonl").write_text(
        lines(
            {"id": 1, "qty": 10},  # name and price absent: kept
            {"id": 2, "name": None},  # an explicit null is a value
            {"id": 9, "price": 9.5},  # a new key: the rest null
            {"id": 3, "_op": "delete"},
            {"id": 5, "qty": 55, "_unset": ["colour"]},  # not a column: quarantined, the rest lands
        )
    )
    (landing / "b.csv").write_text("id,price\n4,44.0\n")  # columns missing from the header are not set
    (landing / "c.cdc.jsonl").write_text(
        lines({"op": "u", "before": None, "after": {"id": 2, "qty": 22}, "source": {"lsn": 1}, "ts_ms": 0})
    )
    policy = LandingPolicy(cdc_formats=((".cdc.jsonl", CdcFormat("debezium")),))
    report = ingest_landing_files(spark, table.uri, str(landing), str(tmp_path / "q"), "partial", policy=policy)

    assert view(table) == {
        1: ("n1", 10, 1.0),
        2: (None, 22, 2.0),
        4: ("n4", 4, 44.0),
        5: ("n5", 5, 5.0),
        9: (None, None, 9.5),
    }
    assert report.rows_quarantined == 1
    quarantined = [json.loads(line) for f in Path(report.quarantine_path).glob("*.json") for line in f.open()]
    assert [(q["file"], q["row"]) for q in quarantined] == [("a.jsonl", 4)]
    assert "colour" in quarantined[0]["reason"]


def test_the_dataframe_writer_sets_the_columns_the_frame_has(spark, make_table):
    table = seeded(make_table)
    frame = spark.createDataFrame([(1, 100), (7, 700)], "id long, qty long")
    frame.write.format("lance_lsm").mode("append").save(table.uri)
    columns = "id long, name string, price double, _unset array<string>"
    unset = spark.createDataFrame([(2, "two", 2.5, ["price"])], columns)
    unset.write.format("lance_lsm").mode("append").save(table.uri)

    assert view(table) == {
        1: ("n1", 100, 1.0),
        2: ("two", 2, 2.0),
        3: ("n3", 3, 3.0),
        4: ("n4", 4, 4.0),
        5: ("n5", 5, 5.0),
        7: (None, 700, None),
    }
    merged = spark.read.format("lance_lsm").load(table.uri).toPandas()  # the source reads the completed rows
    assert rows_by_key(pa.Table.from_pandas(merged, preserve_index=False)) == rows_by_key(table.read())


def test_the_streaming_sink_sets_the_columns_each_batch_has(spark, make_table, tmp_path):
    table = seeded(make_table)
    source = tmp_path / "source"
    source.mkdir()
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64()), "price": [10.5, 20.5]}), source / "0.parquet")
    query = (
        spark.readStream.schema("id long, price double")
        .parquet(str(source))
        .writeStream.format("lance_lsm")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start(table.uri)
    )
    query.processAllAvailable()
    query.stop()

    assert view(table)[1] == ("n1", 1, 10.5) and view(table)[2] == ("n2", 2, 20.5)


def test_generated_partial_streams_in_json_and_csv_land_as_their_oracle_replays_them(spark, make_table, tmp_path):
    table = make_table(SCHEMA, num_shards=2, merge_engine="partial-update")
    landing = str(tmp_path / "landing")
    batches = []
    for seed, fmt, prefix in ((5, "jsonl", "a"), (6, "csv", "b")):  # in file-name order: JSON, then CSV
        spec = ChangeStreamSpec(num_keys=150, num_batches=2, batch_size=120, seed=seed, partial_ratio=0.4)
        batches += write_table_landing_files(table.schema, table.primary_key, spec, landing, fmt, prefix=prefix)
    assert all(any(b["_unset"].to_pylist()) for b in batches), "every file has partial rows"

    report = ingest_landing_files(spark, table.uri, landing, str(tmp_path / "q"), "generated")

    assert report.rows_quarantined == 0 and len(report.files) == 4
    assert rows_by_key(LsmTable.open(table.uri).read()) == replay_table(batches, ["id"])
