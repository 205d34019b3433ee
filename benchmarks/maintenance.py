"""Benchmark merge-into-base and merged reads.

    .venv/bin/python benchmarks/maintenance.py --rows 500000 --json out.json

Merge throughput: ``LsmTable.compact`` (read the generations, resolve newest
wins, one ``merge_insert`` commit per shard with the marker) against one plain
``merge_insert`` of the already-resolved rows into an identical base table,
with Lance's defaults and, for reference, with ``use_index(False)``. With
deletes, the plain baseline needs a second ``merge_insert`` (when_matched_delete).
Change rows per second = rows in the merged generations / seconds.

Read latency: full scan and point lookup of the merged view with 0, 4 and 16
un-merged generations per shard, against the base table alone (a plain Lance
scan, and a BTREE-indexed ``id = k`` filter). A table object keeps the
pending generations it resolved, so the first scan by a new reader (which
resolves them) is reported next to the repeated ones.

Targets: merge >= 0.8x plain merge_insert; merged scan with 4 generations <=
1.5x base-only scan. Timings are medians over ``--repeat`` runs; the full
scans alternate with the base-only scan (``--scan-repeat`` pairs) so both
see the same machine load.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resources.lsm import LsmTable
from resources.lsm.format.compaction_marker import read_compacted_generations
from resources.lsm.format.schema import TOMBSTONE_COLUMN
from resources.lsm.read.dedup import keep_last_per_key
from resources.lsm.testing.changegen import EVENTS_SCHEMA

STATUSES = np.array(["new", "paid", "shipped", "returned"])


def rows_for(ids: np.ndarray, rng: np.random.Generator) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "customer": pa.array(np.char.add("c", (ids % 997).astype(str))),
            "amount": pa.array(np.round(rng.random(len(ids)) * 1000, 2)),
            "status": pa.array(STATUSES[rng.integers(0, len(STATUSES), len(ids))]),
        }
    )


def changes(rng: np.random.Generator, num_keys: int, n: int, delete_fraction: float) -> pa.Table:
    """``n`` changes: updates of existing keys, 5% new keys, ``delete_fraction`` deletes."""
    ids = rng.integers(0, int(num_keys * 1.05), n)
    ops = np.where(rng.random(n) < delete_fraction, "delete", "upsert")
    return rows_for(ids, rng).append_column("_op", pa.array(ops))


def make_base(uri: str, num_keys: int, num_shards: int, rng: np.random.Generator) -> LsmTable:
    """An LSM table whose base holds ``num_keys`` rows, fully indexed."""
    table = LsmTable.create(uri, EVENTS_SCHEMA, ["id"], num_shards=num_shards)
    lance.write_dataset(rows_for(np.arange(num_keys), rng).cast(table.schema), uri, mode="append")
    table.dataset().optimize.optimize_indices()
    return LsmTable.open(uri)


def write_generations(table: LsmTable, batches: list[pa.Table]) -> None:
    """Each batch becomes one generation in every shard."""
    for batch in batches:
        table.write(batch)
        table.flush()


def median_seconds(work: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def paired_median_seconds(
    first: Callable[[], object], second: Callable[[], object], repeat: int
) -> tuple[float, float]:
    """Medians of ``first`` and ``second`` run alternately, so both see the same machine load."""
    pairs = [(median_seconds(first, 1), median_seconds(second, 1)) for _ in range(repeat)]
    return statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)


def resolved_changes(table: LsmTable) -> tuple[pa.Table, pa.Table, int]:
    """What compaction will apply: (upserts, delete keys, generation rows), read like compact does."""
    parts = []
    for state in table.shards():
        for _, directory in state.pending_generations:
            parts.append(lance.dataset(f"{table.uri}/_mem_wal/{state.shard_id}/{directory}").to_table())
    rows = pa.concat_tables(parts)
    final = keep_last_per_key(rows, ["id"])
    dead = final[TOMBSTONE_COLUMN].to_numpy(zero_copy_only=False)
    upserts = final.filter(pa.array(~dead)).drop_columns([TOMBSTONE_COLUMN]).cast(table.schema)
    return upserts, final.filter(pa.array(dead)).select(["id"]), rows.num_rows


def bench_merge(workdir: Path, args, delete_fraction: float) -> dict:
    """Median seconds of compact vs plain merge_insert on copies of one prepared table."""
    rng = np.random.default_rng(1)
    template = str(workdir / f"merge-{delete_fraction}.lance")
    table = make_base(template, args.rows, args.shards, rng)
    per_generation = args.change_rows // args.merge_generations
    write_generations(
        table, [changes(rng, args.rows, per_generation, delete_fraction) for _ in range(args.merge_generations)]
    )
    upserts, deletes, generation_rows = resolved_changes(table)

    def fresh_copy() -> str:
        target = workdir / "merge-run.lance"
        shutil.rmtree(target, ignore_errors=True)
        return str(shutil.copytree(template, target))

    def plain(uri: str, use_index: bool) -> None:
        (
            lance.dataset(uri)
            .merge_insert("id")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .use_index(use_index)
            .execute(upserts)
        )
        if deletes.num_rows:  # a plain merge_insert cannot also delete: a second commit
            lance.dataset(uri).merge_insert("id").when_matched_delete().execute(deletes)

    variants: dict[str, Callable[[str], object]] = {
        "compact": lambda uri: LsmTable.open(uri).compact(maintenance=None),
        "plain": lambda uri: plain(uri, use_index=True),  # Lance's default
        "plain_hash_join": lambda uri: plain(uri, use_index=False),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeat):  # interleaved, so background load hits every variant alike
        for name, work in variants.items():
            uri = fresh_copy()
            started = time.perf_counter()
            work(uri)
            times[name].append(time.perf_counter() - started)
    seconds = {name: statistics.median(values) for name, values in times.items()}
    return {
        "generation_rows": generation_rows,
        "upserts": upserts.num_rows,
        "deletes": deletes.num_rows,
        **{f"{name}_seconds": value for name, value in seconds.items()},
        **{f"{name}_rows_per_second": generation_rows / value for name, value in seconds.items()},
        "ratio": seconds["plain"] / seconds["compact"],
        "ratio_hash_join": seconds["plain_hash_join"] / seconds["compact"],
    }


def bench_reads(workdir: Path, args) -> dict:
    """Scan and lookup latency with 0, 4 and 16 pending generations, each next to the base alone."""
    rng = np.random.default_rng(2)
    table = make_base(str(workdir / "reads.lance"), args.rows, args.shards, rng)
    probe = [int(k) for k in rng.integers(0, args.rows, args.lookups)]
    base = table.dataset()

    def first_scan_seconds() -> float:
        """A full scan by a new table object: the pending generations are not resolved yet."""
        reader = LsmTable.open(table.uri)
        started = time.perf_counter()
        reader.read()
        return time.perf_counter() - started

    def lookups(lookup: Callable[[int], object]) -> float:
        return statistics.median(median_seconds(lambda k=k: lookup(k), 1) for k in probe)

    results = {}
    written = 0
    for generations in (0, 4, 16):
        write_generations(table, [changes(rng, args.rows, args.gen_rows, 0.05) for _ in range(generations - written)])
        written = generations
        base_scan, scan = paired_median_seconds(base.to_table, table.read, args.scan_repeat)
        results[generations] = {
            "base_scan_seconds": base_scan,
            "scan_seconds": scan,
            "first_scan_seconds": statistics.median(first_scan_seconds() for _ in range(args.repeat)),
            "base_lookup_seconds": lookups(lambda k: base.to_table(filter=f"id = {k}")),
            "lookup_seconds": lookups(lambda k: table.lookup([k])),
        }
    assert not read_compacted_generations(table.handle.storage, table.dataset().version)  # nothing merged
    return results


def print_report(report: dict) -> None:
    rows = []
    for name, merge in (("upserts only", report["merge_upserts"]), ("5% deletes", report["merge_deletes"])):
        rows.append(
            (
                f"merge, {name} (change rows/s)",
                f"{merge['compact_rows_per_second']:,.0f}",
                f"{merge['plain_rows_per_second']:,.0f}",
                f"{merge['ratio']:.2f}x",
                ">= 0.80x",
            )
        )
        rows.append(
            (
                "  vs plain with use_index=False",
                "",
                f"{merge['plain_hash_join_rows_per_second']:,.0f}",
                f"{merge['ratio_hash_join']:.2f}x",
                "",
            )
        )
    for kind, unit, digits in (("scan", "full scan", 1), ("lookup", "point lookup", 2)):
        for generations, r in report["reads"].items():
            ours, base = r[f"{kind}_seconds"], r[f"base_{kind}_seconds"]
            target = "<= 1.50x" if (kind, generations) == ("scan", 4) else ""
            rows.append(
                (
                    f"{unit}, {generations} pending gens (ms)",
                    f"{ours * 1e3:.{digits}f}",
                    f"{base * 1e3:.{digits}f}",
                    f"{ours / base:.2f}x",
                    target,
                )
            )
            if kind == "scan" and generations:
                first = r["first_scan_seconds"]
                rows.append(
                    (
                        "  first scan by a new reader (ms)",
                        f"{first * 1e3:.1f}",
                        f"{base * 1e3:.1f}",
                        f"{first / base:.2f}x",
                        "",
                    )
                )
    header = ("measurement", "ours", "plain/base", "ratio", "target")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print(
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=500_000, help="rows in the base table")
    parser.add_argument("--change-rows", type=int, default=None, help="change rows merged (default rows/5)")
    parser.add_argument("--merge-generations", type=int, default=4, help="generations the changes are flushed into")
    parser.add_argument("--gen-rows", type=int, default=None, help="change rows per read generation (default rows/100)")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--lookups", type=int, default=30, help="point lookups per configuration")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scan-repeat", type=int, default=41, help="alternating base/merged full-scan pairs")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    args.change_rows = args.change_rows or args.rows // 5
    args.gen_rows = args.gen_rows or args.rows // 100

    with tempfile.TemporaryDirectory(prefix="lsm-bench-") as tmp:
        workdir = Path(tmp)
        report = {
            "config": {k: v for k, v in vars(args).items() if k != "json"},
            "merge_upserts": bench_merge(workdir, args, delete_fraction=0.0),
            "merge_deletes": bench_merge(workdir, args, delete_fraction=0.05),
            "reads": bench_reads(workdir, args),
        }
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))


if __name__ == "__main__":
    main()
