"""Benchmark ingestion: shard-writer ceiling vs our Spark ingestion vs naive Spark merge_insert.

    .venv/bin/python benchmarks/ingest.py                 # 1M change rows, 10k-row landing files
    .venv/bin/python benchmarks/ingest.py --quick         # ~50k rows smoke run
    .venv/bin/python benchmarks/ingest.py --py-spy        # also sample the Spark Python workers

One run generates one change stream (Parquet landing files, one per batch) and
measures, side by side on that same data:

(a) ceiling: the stream pre-validated, pre-routed and pre-resolved outside the
    timer, written with ``ds.mem_wal_writer(shard, durable_write=True, ...)``,
    one thread per shard, in the same per-shard chunks our write tasks use;
    timed from opening the writers to closing them. A grid of WAL flush
    intervals x rows per put picks the best; (a) is re-measured with it
    next to every (b) run.
(b) ours: ``ingest_landing_files`` on a ``spark_conf("local[2]")`` session,
    from landing files to durable in the WAL and closed writers. Session
    start-up and the first (cold) ingestion are reported, not used for ratios.
(d) the DataFrame writer: ``spark.read.parquet(<a copy of the landing files>)
    .write.format("lance_lsm").mode("append").save(uri)``, one Spark job from
    the same Parquet files to durable in the WAL and closed writers (the
    driver's commit applies the staged rows; ``_seq`` orders across files).
(c) naive: per landing file (10k-row micro-batch) Spark reads it, keeps the
    highest ``_seq`` per key, and the driver applies it to a plain Lance table:
    one ``merge_insert`` (update/insert) whose ``when_not_matched_by_source_delete``
    removes the deleted keys: one commit per micro-batch. Measured on a prefix
    and extrapolated: its cost per batch grows with the table.

Rows/s = change rows of the stream (or prefix) / seconds. Contents are checked
against ``replay`` after (a), (b), (c) and (d). Ratios are of medians from the same
run; the machine is shared, so only ratios are comparable across runs.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resources.lsm import LsmTable
from resources.lsm.format.schema import DELETE, OP_COLUMN, SEQ_COLUMN
from resources.lsm.ingest.landing import LandingLocation, LandingRetention
from resources.lsm.spark import ingest as spark_ingest
from resources.lsm.testing.changegen import EVENTS_SCHEMA, ChangeStreamSpec, replay, write_landing_files
from resources.lsm.write.changes import resolve_changes, validate_changes
from resources.lsm.write.shard_writers import LANCE_MAX_MEMTABLE_ROWS

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_B_OVER_C, TARGET_B_OVER_A = 5.0, 0.3

# ----------------------------------------------------------------- the data


def make_stream(landing: Path, rows: int, batch_size: int) -> list[pa.Table]:
    """Write the change stream as Parquet landing files; return its batches."""
    num_batches = max(1, rows // batch_size)
    spec = ChangeStreamSpec(
        num_keys=max(1, num_batches * batch_size * 3 // 10), num_batches=num_batches, batch_size=batch_size
    )
    return write_landing_files(spec, str(landing), "parquet")


def matches(table: pa.Table, oracle: dict) -> bool:
    """The table holds exactly the rows of ``oracle`` (key -> row, as ``replay`` returns), each key once."""
    rows = table.to_pylist()
    return len(rows) == len(oracle) and {r["id"]: r for r in rows} == oracle


# ------------------------------------------------------------ (a) the ceiling


@dataclass(frozen=True)
class CeilingRun:
    flush_interval_ms: int
    rows_per_put: int
    seconds: float
    open_seconds: float
    put_seconds: float
    close_seconds: float
    rows_written: int
    rows_per_second: float


def route_and_resolve(table: LsmTable, batches: list[pa.Table], rows_per_put: int) -> dict[str, list]:
    """Per shard, its rows in stream order cut into ``rows_per_put`` chunks, each resolved.

    Mirrors a write task: rows of a shard in file order, then ``_seq``
    order, renumbered, chunked, and resolved newest-wins per chunk.
    """
    per_shard: dict[int, list[pa.Table]] = collections.defaultdict(list)
    for batch in batches:
        good = validate_changes(batch, table.schema, table.primary_key).valid
        good = good.take(pc.sort_indices(good[SEQ_COLUMN]))
        buckets = table.buckets(good.select(table.primary_key))
        for b in np.unique(buckets):
            per_shard[int(b)].append(good.filter(pa.array(buckets == b)))
    work: dict[str, list] = {}
    for b, parts in per_shard.items():
        rows = pa.concat_tables(parts)
        rows = rows.set_column(
            rows.schema.get_field_index(SEQ_COLUMN), SEQ_COLUMN, pa.array(np.arange(rows.num_rows, dtype=np.int64))
        )
        chunks = [rows.slice(i, rows_per_put) for i in range(0, rows.num_rows, rows_per_put)]
        work[table.shard_ids[b]] = [resolve_changes(c, table.schema, table.primary_key) for c in chunks]
    return work


def run_ceiling(
    uri: Path, work: dict[str, list], input_rows: int, shards: int, flush_interval_ms: int, rows_per_put: int
) -> tuple[CeilingRun, LsmTable]:
    """Write pre-routed, pre-resolved chunks through one ``ShardWriter`` thread per shard."""
    shutil.rmtree(uri, ignore_errors=True)
    table = LsmTable.create(str(uri), EVENTS_SCHEMA, ["id"], num_shards=shards)
    dataset = table.dataset()
    phases: dict[str, tuple[float, float, float]] = {}

    def write_shard(shard_id: str) -> None:
        started = time.perf_counter()
        writer = dataset.mem_wal_writer(shard_id, durable_write=True, max_wal_flush_interval_ms=flush_interval_ms)
        opened = time.perf_counter()
        for resolved in work[shard_id]:
            if resolved.upserts.num_rows:
                writer.put(resolved.upserts)
            if resolved.deletes.num_rows:
                writer.delete(resolved.deletes)
        written = time.perf_counter()
        writer.close()
        phases[shard_id] = (opened - started, written - opened, time.perf_counter() - written)

    seconds = _timed(lambda: _in_threads(write_shard, list(work)))
    rows = sum(r.upserts.num_rows + r.deletes.num_rows for chunks in work.values() for r in chunks)
    run = CeilingRun(
        flush_interval_ms,
        rows_per_put,
        seconds,
        *(max(p[i] for p in phases.values()) for i in range(3)),
        rows,
        input_rows / seconds,
    )
    return run, table


def tune_ceiling(workdir: Path, batches: list[pa.Table], shards: int, tries: int = 2) -> tuple[list[CeilingRun], dict]:
    """Try Lance's default flush timer and shorter ones x rows per put, from one landing
    file's share of a shard up to a full MemTable; keep the fastest of ``tries`` per pair.

    Returns the runs and the routed work of every size tried.
    """
    shutil.rmtree(workdir / "routing.lance", ignore_errors=True)
    router = LsmTable.create(str(workdir / "routing.lance"), EVENTS_SCHEMA, ["id"], num_shards=shards)
    sizes = sorted({max(1, batches[0].num_rows // shards), 25_000, LANCE_MAX_MEMTABLE_ROWS})
    work = {size: route_and_resolve(router, batches, size) for size in sizes}
    rows = sum(b.num_rows for b in batches)
    runs = [
        min(
            (run_ceiling(workdir / "ceiling.lance", work[size], rows, shards, interval, size)[0] for _ in range(tries)),
            key=lambda r: r.seconds,
        )
        for interval in (100, 10, 5, 2)
        for size in sizes
    ]
    return runs, work


def _in_threads(work: Callable[[str], None], items: list[str]) -> None:
    errors: list[BaseException] = []

    def guarded(item: str) -> None:
        try:
            work(item)
        except BaseException as exc:  # re-raised below, in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(item,)) for item in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _timed(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


# ---------------------------------------------------------------- (b) ours


@dataclass(frozen=True)
class SparkRun:
    seconds: float
    rows_read: int
    rows_per_second: float
    phases: dict[str, float]
    shard_write_seconds: list[float]
    window_ms: tuple[int, int]


# Driver-side steps of ingest_landing_files, wrapped with timers for the profile.
_PHASES = {
    "_write_in_tasks": "write job: read + validate + route + stage files, route staged files by shard, "
    "write tasks (put + close)",
    "_quarantine": "quarantine job (files with bad rows staged again)",
}


def run_spark(spark, uri: Path, landing: Path, quarantine: Path, shards: int) -> tuple[SparkRun, LsmTable]:
    """``ingest_landing_files`` into a fresh table, with its driver-side steps timed."""
    shutil.rmtree(uri, ignore_errors=True)
    table = LsmTable.create(str(uri), EVENTS_SCHEMA, ["id"], num_shards=shards)
    phases: dict[str, float] = {}
    originals = {name: getattr(spark_ingest, name) for name in _PHASES}

    def timed(name: str, step: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return step(*args, **kwargs)
            finally:
                phases[_PHASES[name]] = phases.get(_PHASES[name], 0.0) + time.perf_counter() - started

        return wrapper

    for name, step in originals.items():
        setattr(spark_ingest, name, timed(name, step))
    try:
        started_ms = int(time.time() * 1000)
        # Keep the landing files in place: every round (and (c)) reads the same files.
        report = spark_ingest.ingest_landing_files(
            spark, str(uri), str(landing), str(quarantine), retention=LandingRetention("keep")
        )
        window = (started_ms, int(time.time() * 1000))
    finally:
        for name, step in originals.items():
            setattr(spark_ingest, name, step)
    phases["driver: list files, ledger, the rest"] = report.elapsed_seconds - sum(phases.values())
    run = SparkRun(
        report.elapsed_seconds,
        report.rows_read,
        report.rows_per_second,
        phases,
        sorted({s.write_seconds for s in report.shards}),
        window,
    )
    return run, table


def spark_session(event_dir: Path):
    """A ``spark_conf("local[2]")`` session; the event log (for the stage profile) is the only addition."""
    from resources.spark import spark_session

    event_dir.mkdir(parents=True, exist_ok=True)
    conf = {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": event_dir.as_uri(),
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
    }
    session = spark_session("local[2]", conf)
    session.sparkContext.setLogLevel("ERROR")
    return session


# --------------------------------------------------- (d) the DataFrame writer


def run_dataframe_writer(spark, uri: Path, frame_dir: Path, shards: int) -> tuple[float, LsmTable]:
    """``df.write.format("lance_lsm")`` of the stream's Parquet files into a fresh table; returns its seconds."""
    shutil.rmtree(uri, ignore_errors=True)
    table = LsmTable.create(str(uri), EVENTS_SCHEMA, ["id"], num_shards=shards)
    frame = spark.read.parquet(str(frame_dir))
    return _timed(lambda: frame.write.format("lance_lsm").mode("append").save(str(uri))), table


# -------------------------------------------------------- (c) naive merge_insert


@dataclass(frozen=True)
class MergeInsertRun:
    batches: int
    total_batches: int
    rows: int
    seconds: float
    first_batch_seconds: float
    last_batch_seconds: float
    rows_per_second: float


def run_merge_insert(spark, uri: Path, paths: list[str], total_batches: int) -> tuple[MergeInsertRun, pa.Table]:
    """Apply each landing file to a plain Lance table: Spark dedupes, one merge_insert commits it."""
    shutil.rmtree(uri, ignore_errors=True)
    dataset = lance.write_dataset(EVENTS_SCHEMA.empty_table(), str(uri))
    per_batch = []
    for path in paths:
        started = time.perf_counter()
        apply_changes(dataset, latest_change_per_key(spark, path))
        per_batch.append(time.perf_counter() - started)
    rows = sum(pq.ParquetFile(path).metadata.num_rows for path in paths)
    # Means of the first and last few batches show how the cost grows with the table.
    edge = max(1, min(5, len(per_batch) // 4))
    run = MergeInsertRun(
        len(paths),
        total_batches,
        rows,
        sum(per_batch),
        statistics.mean(per_batch[:edge]),
        statistics.mean(per_batch[-edge:]),
        rows / sum(per_batch),
    )
    return run, lance.dataset(str(uri)).to_table()


def latest_change_per_key(spark, path: str) -> pa.Table:
    """Spark reads one micro-batch and keeps the highest ``_seq`` per key (collected to the driver)."""
    from pyspark.sql import Window, functions as F

    newest_first = Window.partitionBy("id").orderBy(F.col(SEQ_COLUMN).desc())
    return (
        spark.read.parquet(path)
        .withColumn("__rank", F.row_number().over(newest_first))
        .filter("__rank = 1")
        .drop("__rank")
        .toArrow()
    )


def apply_changes(dataset: lance.LanceDataset, latest: pa.Table) -> None:
    """Upsert and delete in one commit: deleted keys are not in the source (one change per
    key), so ``when_not_matched_by_source_delete`` restricted to them removes them."""
    is_delete = pc.equal(latest[OP_COLUMN], DELETE)
    upserts = latest.filter(pc.invert(is_delete)).select(EVENTS_SCHEMA.names).cast(EVENTS_SCHEMA)
    deleted = latest.filter(is_delete)["id"].to_pylist()
    merge = dataset.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
    if deleted:
        merge = merge.when_not_matched_by_source_delete(f"id IN ({', '.join(map(str, deleted))})")
    merge.execute(upserts)


# --------------------------------------------------------------- the profile


def stage_profile(event_dir: Path, run: SparkRun) -> list[dict]:
    """Spark stages of the jobs that ran inside ``run`` (from the event log), in order."""
    logs = sorted(p for p in event_dir.rglob("*") if p.is_file() and not p.name.endswith(".inprogress"))
    jobs, stages, tasks = {}, {}, collections.defaultdict(collections.Counter)
    for line in logs[-1].read_text().splitlines():
        event = json.loads(line)
        kind = event["Event"]
        if kind == "SparkListenerJobStart":
            jobs[event["Job ID"]] = (event["Submission Time"], event["Stage IDs"])
        elif kind == "SparkListenerStageCompleted":
            stages[event["Stage Info"]["Stage ID"]] = event["Stage Info"]
        elif kind == "SparkListenerTaskEnd" and event.get("Task Metrics"):
            metrics, counter = event["Task Metrics"], tasks[event["Stage ID"]]
            counter["task_seconds"] += metrics["Executor Run Time"] / 1000
            counter["gc_seconds"] += metrics["JVM GC Time"] / 1000
            counter["shuffle_write_mb"] += metrics["Shuffle Write Metrics"]["Shuffle Bytes Written"] / 1e6
    start, end = run.window_ms
    profile = []
    for job_id, (submitted, stage_ids) in sorted(jobs.items()):
        if not start <= submitted <= end:
            continue
        ran = sorted(
            (stages[i] for i in stage_ids if i in stages and "Submission Time" in stages[i]),
            key=lambda stage: stage["Submission Time"],
        )
        parents = {p for stage in ran for p in stage["Parent IDs"]}
        profile += [
            {
                "job": job_id,
                "stage": stage["Stage ID"],
                "tasks": stage["Number of Tasks"],
                "role": "shuffle map" if stage["Stage ID"] in parents else "result (collect)",
                "wall_seconds": (stage["Completion Time"] - stage["Submission Time"]) / 1000,
                **{k: round(v, 3) for k, v in tasks[stage["Stage ID"]].items()},
            }
            for stage in ran
        ]
    return profile


# Where Spark's Python workers spend wall time, by the first of these frames on the stack.
_WORKER_FRAMES = [
    # Write tasks run each shard in a thread of its own: match those threads' frames first.
    ("ShardWriter.close", [("", "write task: close writer (flush MemTable)")]),
    (
        "write_shard",
        [
            ("ShardWriter.put", "write task: put (durable WAL)"),
            ("ShardWriter.delete", "write task: delete (durable WAL)"),
            ("resolve_ordered_changes", "write task: resolve newest-wins"),
            ("ShardRouter.buckets", "write task: check shard of every row"),
            ("read_staged", "write task: read staged files"),
            ("ShardWriters._open", "write task: open writer (claim shard, replay WAL)"),
            ("", "write task: other"),
        ],
    ),
    ("_write_partition", [("LsmTable.open", "write task: open table"), ("", "write task: waiting for its shards")]),
    (
        "_stage_files",
        [
            ("LandingLocation.read", "stage task: read file"),
            ("validate_changes", "stage task: validate"),
            ("LsmTable.buckets", "stage task: bucket hash"),
            ("rows_by_bucket", "stage task: sort by bucket and _seq"),
            ("StagedFiles", "stage task: write staged files"),
            ("", "stage task: other"),
        ],
    ),
    # A task's function is running but not in our code (idle workers wait elsewhere).
    ("invoke_udf.<locals>.process", [("", "worker: Arrow I/O with the JVM")]),
]


def py_spy_profile(raw: Path, rate: int) -> dict[str, float]:
    """Seconds of Python-worker wall time per activity, from ``py-spy record -f raw --idle``."""
    seconds: collections.Counter = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if "pyspark.daemon" not in stack:
            continue
        for root, activities in _WORKER_FRAMES:
            if root in stack:
                label = next(label for frame, label in activities if frame in stack)
                seconds[label] += int(count) / rate
                break
    return {k: round(v, 2) for k, v in seconds.most_common()}


class PySpy:
    """``py-spy record`` of this process and its children (Spark's JVM and Python workers)."""

    RATE = 100

    def __init__(self, output: Path) -> None:
        self.output = output
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> PySpy:
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        self._process = subprocess.Popen(
            [
                py_spy,
                "record",
                "--pid",
                str(os.getpid()),
                "--subprocesses",
                "--idle",
                "--rate",
                str(self.RATE),
                "--format",
                "raw",
                "--output",
                str(self.output),
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # let it attach before the measured work starts
        return self

    def __exit__(self, *exc_info) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGINT)
        self._process.wait(timeout=60)


# ------------------------------------------------------------------- the run


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="ingest-bench-")).resolve()
    shutil.rmtree(workdir / "landing", ignore_errors=True)
    shutil.rmtree(workdir / "spark-events", ignore_errors=True)
    batches = make_stream(workdir / "landing", args.rows, args.batch_size)
    shutil.rmtree(workdir / "frame", ignore_errors=True)
    shutil.copytree(workdir / "landing", workdir / "frame")  # (d) reads a DataFrame of its own
    paths = [f.path for f in LandingLocation(str(workdir / "landing")).files()]
    rows, oracle = sum(b.num_rows for b in batches), replay(batches)
    print(f"{rows:,} change rows in {len(batches)} files under {workdir}", flush=True)

    grid, work = tune_ceiling(workdir, batches, args.shards)
    best = max(grid, key=lambda r: r.rows_per_second)
    print(f"(a) best: flush {best.flush_interval_ms} ms, {best.rows_per_put:,} rows per put", flush=True)

    startup = time.perf_counter()
    spark = spark_session(workdir / "spark-events")
    startup = time.perf_counter() - startup
    spark_runs, ceiling_runs, writer_runs, checks = side_by_side(
        spark, workdir, args, work[best.rows_per_put], best, rows, oracle
    )
    worker_profile = {}
    if args.py_spy:  # an extra run: sampling slows it, so it is not timed
        with PySpy(workdir / "py-spy.txt"):
            run_spark(spark, workdir / "spark.lance", workdir / "landing", workdir / "quarantine", args.shards)
        worker_profile = py_spy_profile(workdir / "py-spy.txt", PySpy.RATE)

    prefix = min(args.merge_batches, len(batches))
    merge, merged = run_merge_insert(spark, workdir / "merge.lance", paths[:prefix], len(batches))
    checks[f"(c) first {prefix} batches"] = matches(merged, replay(batches[:prefix]))
    spark.stop()

    results = summarize(
        args, rows, len(batches), grid, best, ceiling_runs, spark_runs, writer_runs, startup, merge, checks
    )
    results["profile_b"] = {
        "driver_phases_seconds": {k: round(v, 3) for k, v in spark_runs[-1].phases.items()},
        "write_task_seconds": [round(s, 3) for s in spark_runs[-1].shard_write_seconds],
        "spark_stages": stage_profile(workdir / "spark-events", spark_runs[-1]),
        "python_workers_seconds": worker_profile,
    }
    markdown = render(results)
    print(markdown)
    for path, text in ((args.json, json.dumps(results, indent=2)), (args.markdown, markdown)):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + "\n")
    return 0 if all(checks.values()) else 1


def side_by_side(
    spark, workdir: Path, args: argparse.Namespace, work: dict[str, list], best: CeilingRun, rows: int, oracle: dict
) -> tuple[list[SparkRun], list[CeilingRun], list[float], dict[str, bool]]:
    """Rounds of (b), (d), then (a) with the best settings; round 0's (b) and (d) are the cold ones."""
    checks: dict[str, bool] = {}
    spark_runs, ceiling_runs, writer_runs = [], [], []
    for round_ in range(args.repeat + 1):
        run, table = run_spark(spark, workdir / "spark.lance", workdir / "landing", workdir / "quarantine", args.shards)
        checks[f"(b) run {round_}"] = matches(LsmTable.open(table.uri).read(), oracle)
        spark_runs.append(run)
        seconds, table = run_dataframe_writer(spark, workdir / "writer.lance", workdir / "frame", args.shards)
        checks[f"(d) run {round_}"] = matches(LsmTable.open(table.uri).read(), oracle)
        writer_runs.append(seconds)
        run, table = run_ceiling(
            workdir / "ceiling.lance", work, rows, args.shards, best.flush_interval_ms, best.rows_per_put
        )
        ceiling_runs.append(run)
        print(
            f"round {round_}: (b) {spark_runs[-1].seconds:.2f}s, (d) {seconds:.2f}s, (a) {run.seconds:.2f}s", flush=True
        )
    checks["(a)"] = matches(LsmTable.open(table.uri).read(), oracle)
    return spark_runs, ceiling_runs, writer_runs, checks


def summarize(
    args: argparse.Namespace,
    rows: int,
    files: int,
    grid: list[CeilingRun],
    best: CeilingRun,
    ceiling_runs: list[CeilingRun],
    spark_runs: list[SparkRun],
    writer_runs: list[float],
    startup: float,
    merge: MergeInsertRun,
    checks: dict[str, bool],
) -> dict:
    """The numbers: medians of the warm rounds, ratios, targets."""
    a = statistics.median(r.seconds for r in ceiling_runs[1:] or ceiling_runs)
    b = statistics.median(r.seconds for r in spark_runs[1:] or spark_runs)
    d = statistics.median(writer_runs[1:] or writer_runs)
    a_rate, b_rate, c_rate, d_rate = rows / a, rows / b, merge.rows_per_second, rows / d
    return {
        "config": {
            "rows": rows,
            "files": files,
            "batch_size": args.batch_size,
            "shards": args.shards,
            "spark_master": "local[2]",
            "cpus": os.cpu_count(),
            "repeat": args.repeat,
            "quick": args.quick,
        },
        "a_ceiling": {
            "seconds": a,
            "rows_per_second": a_rate,
            "best": asdict(best),
            "runs": [asdict(r) for r in ceiling_runs],
            "grid": [asdict(r) for r in grid],
        },
        "b_spark_ingest": {
            "seconds": b,
            "rows_per_second": b_rate,
            "cold_seconds": spark_runs[0].seconds,
            "session_start_seconds": startup,
            "runs_seconds": [r.seconds for r in spark_runs],
        },
        "c_naive_merge_insert": {
            **asdict(merge),
            "extrapolated": merge.batches < merge.total_batches,
            "extrapolated_seconds_full_stream": rows / c_rate,
        },
        "d_dataframe_writer": {
            "seconds": d,
            "rows_per_second": d_rate,
            "cold_seconds": writer_runs[0],
            "runs_seconds": writer_runs,
        },
        "ratios": {
            "b_over_c": b_rate / c_rate,
            "b_over_a": b_rate / a_rate,
            "d_over_a": d_rate / a_rate,
            "d_over_b": d_rate / b_rate,
            "d_over_c": d_rate / c_rate,
        },
        "targets": {
            "b_over_c": TARGET_B_OVER_C,
            "b_over_a": TARGET_B_OVER_A,
            "b_over_c_met": b_rate / c_rate >= TARGET_B_OVER_C,
            "b_over_a_met": b_rate / a_rate >= TARGET_B_OVER_A,
        },
        "correct": checks,
    }


def render(results: dict) -> str:
    """The Markdown report."""
    config, a, b, c, d = (
        results[k] for k in ("config", "a_ceiling", "b_spark_ingest", "c_naive_merge_insert", "d_dataframe_writer")
    )
    ratios, targets, profile = results["ratios"], results["targets"], results["profile_b"]
    best, rows, warm = a["best"], config["rows"], max(1, config["repeat"])
    c_note = (
        f"first {c['batches']} of {c['total_batches']} micro-batches, rows/s extrapolated to the stream "
        f"(per batch {c['first_batch_seconds']:.2f}s at the start, {c['last_batch_seconds']:.2f}s at the "
        f"end: it grows with the table, so the full stream would be slower)"
        if c["extrapolated"]
        else f"all {c['batches']} micro-batches"
    )
    lines = [
        f"## Ingestion: {rows:,} change rows, {config['files']} Parquet files of {config['batch_size']:,} rows, "
        f"{config['shards']} shards, Spark {config['spark_master']} on {config['cpus']} CPUs",
        "",
        "| variant | seconds | rows/s | how |",
        "| --- | ---: | ---: | --- |",
        f"| (a) ShardWriter ceiling | {a['seconds']:.2f} | {a['rows_per_second']:,.0f} | pre-routed, one thread per "
        f"shard, durable, WAL flush {best['flush_interval_ms']} ms, <= {best['rows_per_put']:,} rows per put; "
        f"median of {warm} |",
        f"| (b) Spark ingest_landing_files | {b['seconds']:.2f} | {b['rows_per_second']:,.0f} | landing files to "
        f"durable WAL + closed writers; warm median of {warm} (cold first run {b['cold_seconds']:.1f}s, "
        f"session start {b['session_start_seconds']:.1f}s, both excluded) |",
        f"| (c) naive Spark + merge_insert | {c['seconds']:.2f} | {c['rows_per_second']:,.0f} | "
        f"{c['rows']:,} rows; {c_note} |",
        f'| (d) Spark df.write.format("lance_lsm") | {d["seconds"]:.2f} | {d["rows_per_second"]:,.0f} | the same '
        f"Parquet files as one DataFrame to durable WAL + closed writers; warm median of {warm} (cold first run "
        f"{d['cold_seconds']:.1f}s excluded) |",
        "",
        "| ratio | value | target | met |",
        "| --- | ---: | ---: | --- |",
        f"| (b) / (c) | {ratios['b_over_c']:.1f}x | >= {targets['b_over_c']:.0f}x | "
        f"{'yes' if targets['b_over_c_met'] else 'NO'} |",
        f"| (b) / (a) | {ratios['b_over_a']:.2f}x | >= {targets['b_over_a']:.1f}x | "
        f"{'yes' if targets['b_over_a_met'] else 'NO'} |",
        f"| (d) / (a) | {ratios['d_over_a']:.2f}x | | |",
        f"| (d) / (b) | {ratios['d_over_b']:.2f}x | | |",
        f"| (d) / (c) | {ratios['d_over_c']:.1f}x | | |",
        "",
        "Contents equal `replay` of the stream: "
        + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in results["correct"].items())
        + ".",
        "",
        "### (a) tuning: WAL flush interval x rows per put (per shard, before newest-wins)",
        "",
        "100 ms is Lance's default; `LsmTable` passes the table's recorded writer settings (the tuned",
        "defaults) to every writer it opens, since pylance does not apply them by itself.",
        "",
        "| flush ms | rows per put | seconds | open | puts | close | rows written | rows/s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *(
            f"| {r['flush_interval_ms']} | {r['rows_per_put']:,} | {r['seconds']:.2f} | {r['open_seconds']:.2f} | "
            f"{r['put_seconds']:.2f} | {r['close_seconds']:.2f} | {r['rows_written']:,} | {r['rows_per_second']:,.0f} |"
            for r in a["grid"]
        ),
        "",
        "### (b) where the time goes (last warm run)",
        "",
        "| driver step | seconds |",
        "| --- | ---: |",
        *(f"| {k} | {v:.2f} |" for k, v in profile["driver_phases_seconds"].items()),
        "",
        f"Write tasks (open writer .. close), seconds per shard: {profile['write_task_seconds']}",
        "",
        "| Spark job | stage | role | tasks | wall s | task s (sum) | JVM GC s | shuffle write MB |",
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
        *(
            f"| {s['job']} | {s['stage']} | {s['role']} | {s['tasks']} | {s['wall_seconds']:.2f} | "
            f"{s.get('task_seconds', 0):.2f} | {s.get('gc_seconds', 0):.2f} | {s.get('shuffle_write_mb', 0):.1f} |"
            for s in profile["spark_stages"]
        ),
    ]
    if profile["python_workers_seconds"]:
        lines += [
            "",
            "| Python workers (py-spy, wall incl. waits, extra untimed run) | seconds |",
            "| --- | ---: |",
            *(f"| {k} | {v:.2f} |" for k, v in profile["python_workers_seconds"].items()),
        ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="change rows in the stream")
    parser.add_argument("--batch-size", type=int, default=10_000, help="rows per landing file (micro-batch)")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5, help="warm (a)+(b)+(d) rounds after the cold one")
    parser.add_argument("--merge-batches", type=int, default=25, help="micro-batches (c) runs before extrapolating")
    parser.add_argument("--json", default=str(RESULTS / "ingest.json"))
    parser.add_argument("--markdown", default=str(RESULTS / "ingest.md"))
    parser.add_argument("--workdir", help="where data and tables go (default: a new temporary directory)")
    parser.add_argument("--py-spy", action="store_true", help="sample Spark's Python workers in an extra (b) run")
    parser.add_argument("--quick", action="store_true", help="smoke run: 50k rows, one warm round")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.repeat = 50_000, 1
    return args


if __name__ == "__main__":
    sys.exit(main())
