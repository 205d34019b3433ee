"""The run a keeper rebuilds after a merge took part of its run: every key looked up, or the base rows lent.

    .venv/bin/python benchmarks/runs_after_merge.py                  # 64Mi rows, int64 / string / composite keys
    .venv/bin/python benchmarks/runs_after_merge.py --rows 1048576 --kinds int64 --repeat 1   # smoke run

Beside live writers a merge plans with the runs stored when it starts; while
it commits, the keeper extends the runs over the generations cut meanwhile.
Once the merge commits, those longer runs start below the marker, so the run
over the rest is built again. Per key kind, on a base of ``--rows`` rows
(``benchmarks/scale.py``'s tables, cloned by hard links), 4 shards:
``--generations`` writes of ``--generation-rows`` random upserts (one
generation per shard each) with their runs built, then a merge that, as it
commits, sees as many writes more cut and their runs extended (a keeper round
landing then, reproduced at the merge's data commit). From that state, in
alternating pairs (``--repeat``), the run over the rest is built with the
longer runs in place (their base rows lent: only a liveness check per key) and
without them (every key looked up in the base, a take of its key to compare).

Results: ``benchmarks/results/runs_after_merge.{json,md}`` (``--out``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.scale import add_base_arguments, on_each_base, rows_for, save_results
from resources.lsm import LsmTable
from resources.lsm.format.layout import RUNS_DIR
from resources.lsm.maintenance import compaction


def write(table: LsmTable, kind: str, rows: int, writes: int, size: int, rng: np.random.Generator) -> None:
    """``writes`` flushed generations per shard of ``size`` random upserts each (5% new keys), with their runs."""
    for _ in range(writes):
        table.write(rows_for(kind, rng.integers(0, int(rows * 1.05), size), rng))
        table.close()
    table.build_pending_runs()


def merged_while_cut(uri: str, kind: str, args: argparse.Namespace) -> None:
    """Runs over ``--generations`` writes, merged while as many more are cut and the runs extended over them."""
    table = LsmTable.open(uri)
    rng = np.random.default_rng(13)
    write(table, kind, args.rows, args.generations, args.generation_rows, rng)
    commit_data = compaction.commit_data

    def keeper_meanwhile(*commit_args: Any, **commit_kwargs: Any) -> int:
        write(table, kind, args.rows, args.generations, args.generation_rows, rng)
        return commit_data(*commit_args, **commit_kwargs)

    compaction.commit_data = keeper_meanwhile
    try:
        compaction.compact(table.handle, table.handle.shard_ids, maintenance=None)
    finally:
        compaction.commit_data = commit_data


def rebuild_seconds(uri: str, runs: Path, lent: bool) -> tuple[float, int]:
    """Restore the runs stored after the merge (or none), then build the run over the rest: seconds, keys."""
    live = Path(uri, RUNS_DIR)
    shutil.rmtree(live, ignore_errors=True)
    if lent:
        shutil.copytree(runs, live)
    table = LsmTable.open(uri)
    started = time.perf_counter()
    built = table.build_pending_runs()
    return time.perf_counter() - started, sum(built.values())


def measure(uri: str, kind: str, args: argparse.Namespace, scratch: Path) -> dict[str, float]:
    merged_while_cut(uri, kind, args)
    runs = scratch / f"{kind}-runs"
    shutil.copytree(Path(uri, RUNS_DIR), runs)
    rebuild_seconds(uri, runs, lent=True)  # warm: the base's key index mapped, its pages read
    times: dict[bool, list[float]] = {True: [], False: []}
    for round_ in range(args.repeat):
        for lent in (True, False) if round_ % 2 else (False, True):
            seconds, keys = rebuild_seconds(uri, runs, lent)
            times[lent].append(seconds)
    lent_s, looked_up_s = statistics.median(times[True]), statistics.median(times[False])
    result = {"keys": keys, "lent_s": lent_s, "looked_up_s": looked_up_s, "speedup": looked_up_s / lent_s}
    print(kind, result, flush=True)
    return result


def render(results: dict[str, Any]) -> str:
    lines = [
        "# The run rebuilt after a merge took part of it",
        "",
        f"`benchmarks/runs_after_merge.py`, base of {results['rows']:,} rows, 4 shards; runs over "
        f"{results['generations']} writes of {results['generation_rows']:,} upserts merged while "
        f"{results['generations']} more were cut and the runs extended over them. Building the run over the "
        "rest, medians of alternating pairs from the same state:",
        "",
        "| key | keys in the rebuilt runs | base rows lent by the longer runs | every key looked up | speed-up |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for kind, r in results["kinds"].items():
        lines.append(
            f"| {kind} | {r['keys']:,} | {r['lent_s']:.2f} s | {r['looked_up_s']:.2f} s | {r['speedup']:.1f}x |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_base_arguments(parser, "runs_after_merge")
    parser.add_argument("--generations", type=int, default=4, help="writes merged, and as many cut meanwhile")
    parser.add_argument("--generation-rows", type=int, default=50_000, help="upserts per write")
    parser.add_argument("--repeat", type=int, default=3, help="alternating pairs")
    args = parser.parse_args()
    results: dict[str, Any] = {
        "rows": args.rows,
        "generations": args.generations,
        "generation_rows": args.generation_rows,
        "kinds": on_each_base(args, lambda uri, kind, scratch: measure(uri, kind, args, scratch)),
    }
    save_results(results, render(results), args.out)


if __name__ == "__main__":
    main()
