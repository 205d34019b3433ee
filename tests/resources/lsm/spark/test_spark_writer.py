"""The lance_lsm DataFrame writer and streaming sink: oracle equality, quarantine, exactly-once, crashes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from resources.lsm import LsmTable
from resources.lsm.format.layout import QUARANTINE_DIR, STAGING_DIR
from resources.lsm.format.storage import TableStorage
from resources.lsm.spark.writer import WriteLedger, last_write_report
from resources.lsm.testing.changegen import EVENTS_SCHEMA, ChangeStreamSpec, generate_changes, replay
from tests.helpers import rows_by_key
from tests.resources.lsm.spark.spark_child import FIRST_ATTEMPT_CUSTOMER

ROOT = Path(__file__).resolve().parents[4]


def _view(table: LsmTable) -> dict:
    return {k[0]: v for k, v in rows_by_key(table.read()).items()}


def _changes(num_batches: int, seed: int = 3, batch_size: int = 400) -> list[pa.Table]:
    spec = ChangeStreamSpec(num_keys=600, num_batches=num_batches, batch_size=batch_size, seed=seed, delete_ratio=0.2)
    return list(generate_changes(spec))


def _write(frame, uri: str, **options: str) -> None:
    frame.write.format("lance_lsm").mode("append").options(**options).save(uri)


def _staging_left(uri: str) -> list[str]:
    staging = Path(uri, STAGING_DIR)
    return sorted(p.name for p in staging.iterdir()) if staging.exists() else []


def test_a_dataframe_of_changes_in_shuffled_partitions_equals_the_replay_oracle(spark, make_table):
    table = make_table(EVENTS_SCHEMA, num_shards=4)
    batches = _changes(3)
    # _seq increases across the batches: one job of all of them, rows spread
    # over partitions at random, must resolve to the batch-by-batch oracle.
    frame = spark.createDataFrame(pa.concat_tables(batches)).repartition(5)

    _write(frame, table.uri, write_id="all")

    assert _view(LsmTable.open(table.uri)) == replay(batches)
    report = last_write_report(table.uri, "all")
    assert report is not None and report.rows == sum(b.num_rows for b in batches) and report.rejected == 0
    assert sum(u + d for u, d in report.shards.values()) == len({r["id"] for b in batches for r in b.to_pylist()})
    assert _staging_left(table.uri) == []
    assert LsmTable.open(table.uri).shards()[0].pending_generations, "the commit closed (flushed) its writers"


def test_rows_without_op_or_seq_are_upserts(spark, make_table):
    table = make_table()
    table.write(pa.table({"id": [1, 2], "name": ["a", "b"], "price": [1.0, 2.0]}))
    table.close()

    _write(spark.createDataFrame([(2, "b2", 20.0), (3, "c", 3.0)], "id long, name string, price double"), table.uri)

    assert _view(LsmTable.open(table.uri)) == {
        1: {"id": 1, "name": "a", "price": 1.0},
        2: {"id": 2, "name": "b2", "price": 20.0},
        3: {"id": 3, "name": "c", "price": 3.0},
    }


def _with_bad_rows(spark):
    rows = [
        (1, "good", 1.0, None, "upsert", 1),
        (None, "null key", 2.0, None, "upsert", 2),
        (3, "bad op", 3.0, None, "merge", 3),
        (4, "unknown column", 4.0, "red", "upsert", 4),
        (5, "good", 5.0, None, "upsert", 9),
    ]
    schema = "id long, name string, price double, color string, _op string, _seq long"
    return spark.createDataFrame(rows, schema).coalesce(1)


def test_bad_rows_are_quarantined_with_source_row_and_reason_and_good_rows_applied(spark, make_table, tmp_path):
    table = make_table()

    _write(_with_bad_rows(spark), table.uri, write_id="bad", quarantine=str(tmp_path / "quarantine"))

    assert sorted(_view(LsmTable.open(table.uri))) == [1, 5]
    report = last_write_report(table.uri, "bad")
    assert report is not None and (report.rows, report.rejected) == (5, 3)
    assert report.quarantine_path == str(tmp_path / "quarantine" / "run=bad")
    lines = [
        json.loads(line)
        for f in Path(report.quarantine_path).glob("*.json")
        for line in f.read_text().split("\n")
        if line
    ]
    reasons = {line["row"]: line["reason"] for line in lines}
    assert set(reasons) == {1, 2, 3}
    assert "primary-key column 'id' is null" in reasons[1]
    assert "'merge'" in reasons[2] and "unknown column 'color'" in reasons[3]
    assert all(line["file"].startswith("write=bad-") for line in lines)
    assert json.loads(next(line["record"] for line in lines if line["row"] == 3))["color"] == "red"


def test_fail_on_rejects_fails_the_job_quarantines_and_applies_nothing(spark, make_table):
    table = make_table()

    with pytest.raises(Exception, match="fail_on_rejects is set"):
        _write(_with_bad_rows(spark), table.uri, write_id="strict", fail_on_rejects="true")

    assert _view(LsmTable.open(table.uri)) == {}
    assert len(list(Path(table.uri, QUARANTINE_DIR, "run=strict").glob("*.json"))) == 1
    assert WriteLedger(TableStorage(table.uri), "strict").last_report() is None
    assert _staging_left(table.uri) == []


def test_a_dataframe_without_the_key_or_in_overwrite_mode_is_refused_before_any_task(spark, make_table):
    table = make_table()
    frame = spark.createDataFrame([("a", 1.0)], "name string, price double")

    with pytest.raises(Exception, match="primary-key columns"):
        _write(frame, table.uri)
    with pytest.raises(Exception, match="append"):
        spark.createDataFrame([(1, "a", 1.0)], "id long, name string, price double").write.format("lance_lsm").mode(
            "overwrite"
        ).save(table.uri)
    assert not Path(table.uri, STAGING_DIR).exists()


def test_rerunning_a_write_id_never_applies_a_change_twice(spark, make_table):
    table = make_table()
    frame = spark.createDataFrame([(i, "job", float(i)) for i in range(40)], "id long, name string, price double")
    _write(frame, table.uri, write_id="once")
    table.write(pa.table({"id": [7], "name": ["newer"], "price": [70.0]}))  # a later change by another writer
    table.close()

    _write(frame, table.uri, write_id="once")  # the job run again

    view = _view(LsmTable.open(table.uri))
    assert view[7]["name"] == "newer", "the re-run applied its rows a second time, over a newer change"
    report = last_write_report(table.uri, "once")
    assert report is not None and report.shards == {} and len(report.skipped) == 4


def test_a_rerun_after_a_commit_crash_applies_only_the_shards_not_recorded(spark, make_table):
    table = make_table()
    frame = spark.createDataFrame([(i, "job", float(i)) for i in range(40)], "id long, name string, price double")
    done = table.shard_ids[0]
    # As a commit killed right after recording shard 0 leaves it: shard 0
    # applied (and since overwritten by a newer writer), the others not.
    WriteLedger(table.handle.storage, "crashed").record_applied(done, 0)

    _write(frame, table.uri, write_id="crashed")

    reopened = LsmTable.open(table.uri)
    buckets = reopened.buckets(pa.table({"id": pa.array(range(40), pa.int64())}))
    expected = {i for i in range(40) if buckets[i] != 0}
    assert set(_view(reopened)) == expected and expected and len(expected) < 40
    report = last_write_report(table.uri, "crashed")
    assert report is not None and report.skipped == (done,) and done not in report.shards


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", f"from tests.resources.lsm.spark.spark_child import *; {code}"],
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def test_a_failed_task_attempts_staged_rows_are_never_applied(make_table, tmp_path):
    table = make_table(EVENTS_SCHEMA)
    batches = _changes(4, seed=11, batch_size=2000)
    pq.write_table(pa.concat_tables(batches), tmp_path / "changes.parquet")
    marker = tmp_path / "first-attempt-failed"

    child = _child(
        f"write_with_a_failed_first_attempt({table.uri!r}, {str(tmp_path / 'changes.parquet')!r}, {str(marker)!r})"
    )
    _, stderr = child.communicate(timeout=300)

    assert child.returncode == 0, stderr.decode()[-3000:]
    assert marker.exists(), "partition 0's first attempt was never killed while staging: the test proves nothing"
    view = _view(LsmTable.open(table.uri))
    assert view == replay(batches)
    assert FIRST_ATTEMPT_CUSTOMER not in {row["customer"] for row in view.values()}
    report = last_write_report(table.uri, "retried")
    assert report is not None and report.rows == sum(b.num_rows for b in batches), "an attempt was counted twice"


def test_sigkill_mid_commit_then_rerun_of_the_write_id_equals_the_oracle(spark, make_table, tmp_path):
    table = make_table(EVENTS_SCHEMA)
    batches = _changes(6, seed=17, batch_size=4000)
    pq.write_table(pa.concat_tables(batches), tmp_path / "changes.parquet")
    ledger = Path(table.uri, "_lsm_ingest", "writes", "killed")

    child = _child(f"write({table.uri!r}, {str(tmp_path / 'changes.parquet')!r}, 'killed')")
    deadline = time.monotonic() + 240
    while not (ledger.exists() and list(ledger.glob("*-*-*-*-*.json"))) and child.poll() is None:
        assert time.monotonic() < deadline, "the commit never recorded a shard"
        time.sleep(0.002)
    os.killpg(child.pid, signal.SIGKILL)  # driver, JVM and Python workers at once: as soon as a shard is recorded
    assert child.wait() == -signal.SIGKILL, "the job finished before the kill"
    # Shards are written in parallel: the kill lands after 1 to 4 of them were recorded.
    recorded = sorted(p.stem for p in ledger.glob("*-*-*-*-*.json"))

    _write(spark.read.parquet(str(tmp_path / "changes.parquet")), table.uri, write_id="killed")

    assert _view(LsmTable.open(table.uri)) == replay(batches)
    report = last_write_report(table.uri, "killed")
    # Spark's Python worker running the commit may outlive the kill for a moment and record one more shard.
    assert report is not None and set(recorded) <= set(report.skipped)
    assert sorted([*report.skipped, *report.shards]) == sorted(table.shard_ids)


def _stream_source(directory: Path, batches: list[pa.Table]) -> None:
    """One Parquet file per batch, modification times one second apart (the file source's order)."""
    directory.mkdir()
    start = time.time() - len(batches) - 10
    for number, batch in enumerate(batches):
        path = directory / f"changes-{number:04d}.parquet"
        pq.write_table(batch, path)
        os.utime(path, (start + number, start + number))


def _stream_write_id(table_uri: str, checkpoint: Path) -> str:
    """The one write id the stream used: ``stream-<query id>``, the query id Spark keeps in the checkpoint."""
    writes = [p.name for p in Path(table_uri, "_lsm_ingest", "writes").iterdir()]
    assert writes == ["stream-" + json.loads((checkpoint / "metadata").read_text())["id"]]
    return writes[0]


def _last_batch(table_uri: str) -> int:
    writes = Path(table_uri, "_lsm_ingest", "writes")
    reports = list(writes.glob("*/last-commit.json")) if writes.exists() else []
    return json.loads(reports[0].read_text())["batch_id"] if reports else -1


def test_sigkill_mid_stream_then_restart_from_the_checkpoint_equals_the_oracle(make_table, tmp_path):
    table = make_table(EVENTS_SCHEMA)
    batches = _changes(10, seed=21, batch_size=300)
    _stream_source(tmp_path / "source", batches)
    run = f"stream({table.uri!r}, {str(tmp_path / 'source')!r}, {str(tmp_path / 'checkpoint')!r})"

    child = _child(run)
    deadline = time.monotonic() + 240
    while _last_batch(table.uri) < 3 and child.poll() is None:
        assert time.monotonic() < deadline, "the stream never committed"
        time.sleep(0.05)
    os.killpg(child.pid, signal.SIGKILL)  # driver, JVM and Python workers at once
    assert child.wait() == -signal.SIGKILL, "the stream finished before the kill; use more batches"
    killed_at = _last_batch(table.uri)
    assert killed_at < len(batches) - 1

    restarted = _child(run)
    _, stderr = restarted.communicate(timeout=300)
    assert restarted.returncode == 0, stderr.decode()[-3000:]

    assert _view(LsmTable.open(table.uri)) == replay(batches)
    assert _last_batch(table.uri) == len(batches) - 1
    _stream_write_id(table.uri, tmp_path / "checkpoint")  # the restart continued the same write


def test_a_micro_batch_replayed_after_a_driver_crash_is_skipped(spark, make_table, tmp_path):
    table = make_table(EVENTS_SCHEMA)
    batches = _changes(2, seed=31)
    _stream_source(tmp_path / "source", batches)

    def run() -> None:
        query = (
            spark.readStream.schema(spark.read.parquet(str(tmp_path / "source")).schema)
            .option("maxFilesPerTrigger", 1)
            .parquet(str(tmp_path / "source"))
            .writeStream.format("lance_lsm")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .start(table.uri)
        )
        query.processAllAvailable()
        query.stop()

    run()
    # A driver that crashed after the sink's commit of batch 1 but before
    # Spark's commit log recorded it: Spark runs batch 1 again on restart.
    for name in ("1", ".1.crc"):  # the log entry and Hadoop's checksum of it
        (tmp_path / "checkpoint" / "commits" / name).unlink()
    changed = next(r for r in batches[1].to_pylist() if r["_op"] == "upsert")
    newer = {**{k: v for k, v in changed.items() if not k.startswith("_")}, "status": "newer"}
    table.write(pa.Table.from_pylist([newer], schema=EVENTS_SCHEMA))
    table.close()

    run()

    view = _view(LsmTable.open(table.uri))
    assert view[changed["id"]]["status"] == "newer", "the replayed batch was applied again"
    report = last_write_report(table.uri, _stream_write_id(table.uri, tmp_path / "checkpoint"))
    assert report is not None and report.batch_id == 1 and report.shards == {} and report.skipped
    assert _staging_left(table.uri) == []


def test_a_dataframe_written_to_an_s3_table_with_an_s3_quarantine_equals_the_oracle(spark, s3_root, s3_server):
    options = s3_server.storage_options()
    workers_env = spark.sparkContext.parallelize([0], 1).map(lambda _: os.environ.get("AWS_ENDPOINT_URL")).collect()
    assert workers_env == [None], "executors and the commit must get the store from the storage options alone"
    table_uri, quarantine = f"{s3_root}/table.lance", f"{s3_root}/quarantine"
    LsmTable.create(table_uri, EVENTS_SCHEMA, ["id"], num_shards=2, storage_options=options)
    batches = _changes(2, seed=41, batch_size=200)
    bad = pa.table({"id": pa.array([None], pa.int64()), "customer": ["x"], "amount": [1.0], "status": ["new"]})
    bad = bad.append_column("_op", pa.array(["upsert"])).append_column("_seq", pa.array([0], pa.int64()))
    frame = spark.createDataFrame(pa.concat_tables([*batches, bad])).repartition(3)

    _write(frame, table_uri, write_id="s3", quarantine=quarantine, **{f"storage.{k}": v for k, v in options.items()})

    table = LsmTable.open(table_uri, storage_options=options)
    assert _view(table) == replay(batches)
    report = last_write_report(table_uri, "s3", options)
    assert report is not None and report.rejected == 1 and report.quarantine_path == f"{quarantine}/run=s3"
    quarantined = TableStorage(report.quarantine_path, options).list_files("")
    assert len(quarantined) == 1
    line = json.loads(TableStorage(report.quarantine_path, options).read_bytes(quarantined[0].name))
    assert "primary-key column 'id' is null" in line["reason"]
    assert TableStorage(table_uri, options).list_dir(STAGING_DIR) == []


def test_debezium_records_in_shuffled_partitions_resolve_by_their_lsn(spark, make_table):
    table = make_table()
    # Key 1: created, updated, deleted, re-created; key 2: created then updated; key 3: a bad envelope.
    events = [
        ("c", None, {"id": 1, "name": "a", "price": 1.0}, 10),
        ("u", {"id": 1, "name": "a", "price": 1.0}, {"id": 1, "name": "a2", "price": 2.0}, 20),
        ("c", None, {"id": 2, "name": "b", "price": 5.0}, 25),
        ("d", {"id": 1, "name": "a2", "price": 2.0}, None, 30),
        ("u", {"id": 2, "name": "b", "price": 5.0}, {"id": 2, "name": "b2", "price": 6.0}, 35),
        ("c", None, {"id": 1, "name": "a3", "price": 3.0}, 40),
        ("x", None, {"id": 3, "name": "c", "price": 7.0}, 50),
    ]
    rows = [{"op": op, "before": b, "after": a, "source": {"lsn": lsn}} for op, b, a, lsn in reversed(events)]
    frame = spark.createDataFrame(
        rows,
        "op string, before struct<id:long,name:string,price:double>, "
        "after struct<id:long,name:string,price:double>, source struct<lsn:long>",
    ).repartition(3)

    _write(frame, table.uri, cdc="debezium", write_id="cdc")

    assert _view(LsmTable.open(table.uri)) == {
        1: {"id": 1, "name": "a3", "price": 3.0},
        2: {"id": 2, "name": "b2", "price": 6.0},
    }
    report = last_write_report(table.uri, "cdc")
    assert report is not None and report.rejected == 1  # the unknown op 'x'


def test_rows_with_a_new_column_are_quarantined_unless_auto_evolve_adds_it(spark, make_table):
    table = make_table()
    frame = spark.createDataFrame([(1, "a", 1.0, "eu")], "id long, name string, price double, region string")
    _write(frame, table.uri, write_id="refused")
    report = last_write_report(table.uri, "refused")
    assert report is not None and report.rejected == 1 and _view(LsmTable.open(table.uri)) == {}

    _write(frame, table.uri, auto_evolve="true")

    evolved = LsmTable.open(table.uri)
    assert "region" in evolved.schema.names
    assert _view(evolved) == {1: {"id": 1, "name": "a", "price": 1.0, "region": "eu"}}
