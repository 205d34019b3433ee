"""Merged reads by key type: int64, string (UUID hex) and composite (string, int64) keys.

    .venv/bin/python benchmarks/read_keys.py            # 300k-row base, as the deletion-vector issue measured
    .venv/bin/python benchmarks/read_keys.py --quick    # smoke run

For each key type: a base of ``--rows`` rows (BTREE on each key column),
4 shards, then ``--gen-rows`` random upserts (5% new keys) flushed per
generation until each shard holds 4, then 16 pending generations. Measured
side by side, alternating, medians of ``--repeat`` pairs:

- full scan of the base alone (``dataset.to_table()``) vs the merged view
  through a warm table object (``LsmTable.read()``), and vs the first read
  through a table object just opened (what every Dagster run pays; the open
  itself is not timed);
- point lookups (p50 of ``--lookups`` random keys, warm table object) vs
  Lance's own point query on the base (``to_table(filter=...)``), in
  alternating pairs, each probe a key no probe asked for before;
- the write side: ``flush()`` of one generation per shard, and the
  maintenance step that then builds the pending runs (``build_pending_runs``).

Targets (issue: deletion vectors): merged scan <= 1.3x the base scan with 4
pending generations per shard, new reader included; <= 1.6x with 16; lookups
<= 5 ms p50 with 16; the step that builds the vectors <= 1.5x the flush.
Results: benchmarks/results/read_keys.md / .json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.maintenance import median_seconds, paired_median_seconds  # noqa: E402
from benchmarks.scale import p50_side_by_side  # noqa: E402
from resources.lsm import LsmTable  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
KEYS = {"int64": ["id"], "string": ["id"], "composite": ["region", "seq"]}
STATUSES = np.array(["new", "paid", "shipped", "returned"])


def rows_for(kind: str, ids: np.ndarray, rng: np.random.Generator) -> pa.Table:
    """Rows for integer ids ``ids``, keyed the ``kind`` way (the same id always gives the same key)."""
    if kind == "int64":
        key = {"id": pa.array(ids, pa.int64())}
    elif kind == "string":
        key = {"id": pa.array([uuid.UUID(int=int(i) * 0x9E3779B97F4A7C15 % (1 << 128)).hex for i in ids])}
    else:
        key = {"region": pa.array(np.char.add("region-", (ids % 16).astype(str))), "seq": pa.array(ids // 16)}
    return pa.table(
        {
            **key,
            "customer": pa.array(np.char.add("c", (ids % 997).astype(str))),
            "amount": pa.array(np.round(rng.random(len(ids)) * 1000, 2)),
            "status": pa.array(STATUSES[rng.integers(0, len(STATUSES), len(ids))]),
        }
    )


def make_table(uri: str, kind: str, rows: int, rng: np.random.Generator) -> LsmTable:
    """An LSM table of ``kind`` keys whose base holds ``rows`` rows, indexed."""
    schema = rows_for(kind, np.arange(1), rng).schema
    table = LsmTable.create(uri, schema, KEYS[kind], num_shards=4)
    lance.write_dataset(rows_for(kind, np.arange(rows), rng).cast(table.schema), uri, mode="append")
    table.dataset().optimize.optimize_indices()
    return LsmTable.open(uri)


def add_generations(table: LsmTable, kind: str, count: int, args, rng: np.random.Generator) -> None:
    """``count`` flushed generations per shard, then their pending runs (as the flush job builds them)."""
    for _ in range(count):
        table.write(rows_for(kind, rng.integers(0, int(args.rows * 1.05), args.gen_rows), rng))
        table.flush()
    table.build_pending_runs()


def point_query(kind: str, key: tuple) -> str:
    if kind == "composite":
        return f"region = '{key[0]}' AND seq = {key[1]}"
    return f"id = {key[0]}" if kind == "int64" else f"id = '{key[0]}'"


def bench_kind(workdir: Path, kind: str, args) -> dict:
    rng = np.random.default_rng(7)
    table = make_table(str(workdir / f"{kind}.lance"), kind, args.rows, rng)
    base = table.dataset()
    probe_table = rows_for(kind, rng.choice(args.rows, 2 * args.lookups + 2, replace=False), rng).select(KEYS[kind])
    probes = list(zip(*(probe_table.column(k).to_pylist() for k in KEYS[kind]), strict=True))

    def new_reader_pair() -> tuple[float, float]:
        """(base scan, first read of a table object opened just before), timed back to back."""
        reader = LsmTable.open(table.uri)
        base_scan = median_seconds(base.to_table, 1)
        return base_scan, median_seconds(reader.read, 1)

    results, written = {}, 0
    for generations in (4, 16):
        add_generations(table, kind, generations - written, args, rng)
        written = generations
        table.read()  # warm
        base_scan, warm = paired_median_seconds(base.to_table, table.read, args.repeat)
        pairs = [new_reader_pair() for _ in range(args.repeat)]
        base_scan_2, first = (statistics.median(p[i] for p in pairs) for i in (0, 1))
        lookup, lance_point = p50_side_by_side(
            lambda k: table.lookup([k]), lambda k: base.to_table(filter=point_query(kind, k)), probes
        )
        results[generations] = {
            "base_scan_s": base_scan,
            "warm_scan_s": warm,
            "warm_ratio": warm / base_scan,
            "new_reader_scan_s": first,
            "new_reader_ratio": first / base_scan_2,
            "lookup_p50_s": lookup,
            "lance_point_query_p50_s": lance_point,
        }
        print(kind, generations, {k: round(v, 4) for k, v in results[generations].items()}, flush=True)
    table.close()
    return results


def bench_flush(workdir: Path, args) -> dict:
    """``flush()`` of one generation per shard, then ``build_pending_runs()`` over the new pending set (int64)."""
    rng = np.random.default_rng(11)
    table = make_table(str(workdir / "flush.lance"), "int64", args.rows, rng)
    flushes, builds = [], []
    for _ in range(args.flushes):
        table.write(rows_for("int64", rng.integers(0, int(args.rows * 1.05), args.gen_rows), rng))
        flushes.append(median_seconds(table.flush, 1))
        builds.append(median_seconds(table.build_pending_runs, 1))
    flush, build = statistics.median(flushes), statistics.median(builds)
    return {"flush_s": flush, "build_s": build, "build_ratio": build / flush}


def report_markdown(report: dict) -> str:
    lines = [
        f"# Merged reads by key type ({report['config']['rows']:,}-row base, 4 shards, "
        f"{report['config']['gen_rows']:,} upserts per flush)",
        "",
        "| key | pending gens/shard | base scan | merged, warm | ratio | merged, new reader | ratio "
        "| lookup p50 | Lance point query p50 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for kind, by_gens in report["keys"].items():
        for gens, r in by_gens.items():
            lines.append(
                f"| {kind} | {gens} | {r['base_scan_s'] * 1e3:.1f} ms | {r['warm_scan_s'] * 1e3:.1f} ms "
                f"| {r['warm_ratio']:.2f}x | {r['new_reader_scan_s'] * 1e3:.1f} ms | {r['new_reader_ratio']:.2f}x "
                f"| {r['lookup_p50_s'] * 1e3:.2f} ms | {r['lance_point_query_p50_s'] * 1e3:.2f} ms |"
            )
    f = report["flush"]
    lines += [
        "",
        f"Flush of one generation per shard: {f['flush_s'] * 1e3:.0f} ms; building the pending runs after it: "
        f"{f['build_s'] * 1e3:.0f} ms ({f['build_ratio']:.2f}x the flush, medians of {report['config']['flushes']}).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--gen-rows", type=int, default=None, help="upserts per flush (default rows/100)")
    parser.add_argument("--repeat", type=int, default=15, help="alternating base/merged scan pairs")
    parser.add_argument("--lookups", type=int, default=200)
    parser.add_argument("--flushes", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="small smoke run; results not written")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.repeat, args.lookups, args.flushes = 20_000, 3, 5, 2
    args.gen_rows = args.gen_rows or args.rows // 100
    with tempfile.TemporaryDirectory(prefix="lsm-read-keys-") as tmp:
        workdir = Path(tmp)
        report = {
            "config": dict(vars(args)),
            "keys": {kind: bench_kind(workdir, kind, args) for kind in KEYS},
            "flush": bench_flush(workdir, args),
        }
    markdown = report_markdown(report)
    print(markdown)
    if not args.quick:
        (RESULTS / "read_keys.json").write_text(json.dumps(report, indent=2))
        (RESULTS / "read_keys.md").write_text(markdown)


if __name__ == "__main__":
    main()
