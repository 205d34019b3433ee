"""Benchmark the read paths: freshness, merged scans and lookups, Spark reads.

    .venv/bin/python benchmarks/read.py            # full run
    .venv/bin/python benchmarks/read.py --quick    # smoke run

Freshness: a writer process acknowledges one-row upserts (durable in its WAL,
never flushed); this process polls ``LsmTable.lookup`` for the key from the
moment it sends the command. Freshness = first poll that sees the row minus
the writer's acknowledgement time (negative: visible before ``put`` returned).

Scan and lookup latency: ``read()`` (median of ``--repeat``) and one-key
``lookup()`` calls of the merged view with 0, 2, 4 and 8 un-merged generations
per shard (each rewriting 5% of the keys). Warm lookups: p50 / p99 over
``--lookups`` random keys through one long-lived table object (its first
lookups after new generations load their bloom filters, and count). Cold
lookup: the first lookup of a freshly opened table (empty caches), median of
``--repeat`` opens.

Spark: reading every column of the merged view with the ``lance_lsm`` source
against ``spark.read.parquet`` over an equal Parquet copy, both written to
Spark's ``noop`` sink (rows/s, median of ``--repeat``), side by side in one
session.

Targets: freshness p99 <= 250 ms; point lookup p50 <= 10 ms with 8 generations.
Results go to benchmarks/results/read.json and read.md (and ``--json``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.maintenance import make_base, median_seconds, rows_for  # noqa: E402
from resources.lsm import LsmTable  # noqa: E402
from resources.lsm.testing.changegen import EVENTS_SCHEMA  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"


def writer_child(uri: str) -> None:
    """``--writer-child``: upsert key ``k`` for every line ``k``; print the acknowledgement time."""
    table = LsmTable.open(uri)
    rng = np.random.default_rng(0)
    for line in sys.stdin:
        table.write(rows_for(np.array([int(line)]), rng))
        print(time.time(), flush=True)


def bench_freshness(root: Path, samples: int, num_shards: int) -> dict:
    table = LsmTable.create(str(root / "fresh.lance"), EVENTS_SCHEMA, ["id"], num_shards=num_shards)
    child = subprocess.Popen(
        [sys.executable, __file__, "--writer-child", table.uri],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    lags = []
    try:
        for key in range(samples):
            child.stdin.write(f"{key}\n")
            child.stdin.flush()
            while table.lookup([key], columns=["id"]).num_rows == 0:
                pass
            visible = time.time()
            lags.append(visible - float(child.stdout.readline()))
    finally:
        child.kill()
        child.wait()
    lags_ms = np.array(lags) * 1000
    return {
        "samples": samples,
        "p50_ms": float(np.percentile(lags_ms, 50)),
        "p99_ms": float(np.percentile(lags_ms, 99)),
        "max_ms": float(lags_ms.max()),
    }


def cold_lookup_seconds(uri: str, key: int) -> float:
    """The first ``lookup`` of a freshly opened table (the open itself not timed)."""
    table = LsmTable.open(uri)
    started = time.perf_counter()
    table.lookup([key])
    return time.perf_counter() - started


def bench_generations(root: Path, num_keys: int, num_shards: int, repeat: int, lookups: int) -> dict:
    rng = np.random.default_rng(7)
    table = make_base(str(root / "gens.lance"), num_keys, num_shards, rng)
    results, generations = {}, 0
    for target in (0, 2, 4, 8):
        while generations < target:
            table.write(rows_for(rng.choice(num_keys, num_keys // 20, replace=False), rng))
            table.close()
            generations += 1
        keys = rng.integers(0, num_keys, lookups)
        warm = [median_seconds(lambda k=k: table.lookup([int(k)]), 1) for k in keys]
        cold = [cold_lookup_seconds(table.uri, int(k)) for k in keys[:repeat]]
        results[target] = {
            "scan_ms": median_seconds(table.read, repeat) * 1000,
            "lookup_p50_ms": float(np.percentile(warm, 50)) * 1000,
            "lookup_p99_ms": float(np.percentile(warm, 99)) * 1000,
            "lookup_cold_ms": float(np.median(cold)) * 1000,
            "lookups": lookups,
            "rows": table.count(),
        }
    return results


def bench_spark(root: Path, num_keys: int, num_shards: int, repeat: int) -> dict:
    from resources.spark import spark_session

    table = make_base(str(root / "spark.lance"), num_keys, num_shards, np.random.default_rng(11))
    parquet = root / "copy.parquet"
    pq.write_table(table.read(), parquet)

    spark = spark_session("local[2]")  # lance_lsm registered
    spark.sparkContext.setLogLevel("ERROR")
    readers = {
        "lance_lsm": lambda: spark.read.format("lance_lsm").load(table.uri),
        "parquet": lambda: spark.read.parquet(str(parquet)),
    }
    results = {}
    for name, frame in readers.items():
        frame().write.format("noop").mode("overwrite").save()  # warm up workers and caches
        seconds = median_seconds(lambda frame=frame: frame().write.format("noop").mode("overwrite").save(), repeat)
        results[name] = {"seconds": seconds, "rows_per_s": num_keys / seconds}
    results["ratio"] = results["lance_lsm"]["rows_per_s"] / results["parquet"]["rows_per_s"]
    spark.stop()
    return results


def markdown(results: dict) -> str:
    fresh, gens, spark = results["freshness"], results["generations"], results["spark"]
    lines = [
        f"Rows: {results['num_keys']:,}, shards: {results['num_shards']}, repeat: {results['repeat']}",
        "",
        "| measure | value | target |",
        "| --- | ---: | --- |",
        f"| freshness p50 (ms) | {fresh['p50_ms']:.1f} | |",
        f"| freshness p99 (ms) | {fresh['p99_ms']:.1f} | <= 250 |",
    ]
    for count, r in gens.items():
        target = "<= 10" if int(count) == 8 else ""
        lines.append(f"| {count} generations: full scan (ms) | {r['scan_ms']:.1f} | |")
        lines.append(
            f"| {count} generations: lookup p50 / p99 (ms) | {r['lookup_p50_ms']:.1f} / "
            f"{r['lookup_p99_ms']:.1f} | {target} (p50) |"
        )
        lines.append(f"| {count} generations: cold lookup (ms) | {r['lookup_cold_ms']:.1f} | |")
    lines += [
        f"| Spark lance_lsm (rows/s) | {spark['lance_lsm']['rows_per_s']:,.0f} | |",
        f"| Spark parquet copy (rows/s) | {spark['parquet']['rows_per_s']:,.0f} | |",
        f"| Spark lance_lsm / parquet | {spark['ratio']:.2f}x | |",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--rows", type=int, help="keys in the base table (default 500k, quick 20k)")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--repeat", type=int, help="repetitions per timing (default 5, quick 2)")
    parser.add_argument("--samples", type=int, help="freshness samples (default 200, quick 30)")
    parser.add_argument("--lookups", type=int, help="warm lookups per generation count (default 200, quick 40)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--writer-child", metavar="URI", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.writer_child:
        writer_child(args.writer_child)
        return
    num_keys = args.rows or (20_000 if args.quick else 500_000)
    repeat = args.repeat or (2 if args.quick else 5)
    samples = args.samples or (30 if args.quick else 200)
    lookups = args.lookups or (40 if args.quick else 200)
    with tempfile.TemporaryDirectory(prefix="lsm-read-bench-") as tmp:
        root = Path(tmp)
        results = {
            "num_keys": num_keys,
            "num_shards": args.shards,
            "repeat": repeat,
            "freshness": bench_freshness(root, samples, args.shards),
            "generations": bench_generations(root, num_keys, args.shards, repeat, lookups),
            "spark": bench_spark(root, num_keys, args.shards, repeat),
        }
    table = markdown(results)
    print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    for path in [RESULTS / "read.json", *([args.json] if args.json else [])]:
        path.write_text(json.dumps(results, indent=2))
    (RESULTS / "read.md").write_text(table)


if __name__ == "__main__":
    main()
