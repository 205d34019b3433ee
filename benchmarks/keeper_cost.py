"""What building pending runs beside the writers costs continuous ingestion, merges included.

    .venv/bin/python benchmarks/keeper_cost.py --kinds string                 # 64Mi rows, 2 rounds of 150 s a side
    .venv/bin/python benchmarks/keeper_cost.py --rows 1048576 --kinds int64 --seconds 20 --rounds 1   # smoke run

With ``--alone`` the writer goes flat out with no merger beside it (no
backpressure): there the keeper's rounds are all cost, and it waits for the
writer's pauses for at most ``--patience`` seconds (its default, 20 s; 0: it
never waits) before sharing the cores.
In a deployment they are not extra work: a merge takes a run without
joining the base, and without runs it joins the base itself (or builds the
runs of what was flushed meanwhile when it ends). This measures the system:
per key kind, on a fresh clone of ``benchmarks/scale.py``'s base of
``--rows`` rows (4 shards) per side, a writer process puts
``--generation-rows`` random upserts of keys drawn anew as fast as it can
for ``--seconds``, each put waiting first for merge capacity as a
continuous ingestion run's micro-batches do, beside a merger process that
merges the shards the merge sensor's default trigger picks every 5 s (join-free
once runs exist, as beside a writer run). The sides, with the keeper and
without, alternate over ``--rounds`` rounds (which goes first alternates too).

Per side: rows/s written, seconds held by backpressure, merges, their
joining passes and the longest of them (a merge builds the runs of its
shards' generations flushed while it ran, which the keeper leaves to it),
the longest delay of the runs the keeper built behind their generations,
and CPU seconds of writer and merger together per million rows.
Results: ``benchmarks/results/keeper_cost.{json,md}`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.live_reads import merge_when_due, write_live
from benchmarks.scale import add_base_arguments, clone, save_results, template
from resources.lsm import MaintenancePolicy
from resources.lsm.maintenance.pending_runs import DEFAULT_KEEPER_PATIENCE_SECONDS


def children_cpu_seconds() -> float:
    """User and system CPU of every child process waited for so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def ingest(uri: str, kind: str, keep_runs: bool, args: argparse.Namespace) -> dict[str, Any]:
    """One side: a writer going as fast as merges let it for ``args.seconds``, beside a merger (``args.alone``:
    flat out, no merger)."""
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    cpu_before = children_cpu_seconds()
    rate = None if args.alone else math.inf
    writer = context.Process(
        target=write_live,
        args=(uri, kind, args.rows, args.generation_rows, keep_runs, 1 << 30, stop, rate, args.patience),
    )
    processes = (
        [writer]
        if args.alone
        else [writer, context.Process(target=merge_when_due, args=(uri, stop, MaintenancePolicy()))]
    )
    for process in processes:
        process.start()
    time.sleep(args.seconds)
    stop.set()
    for process in processes:
        process.join()
    if any(process.exitcode for process in processes):
        raise RuntimeError(f"exit codes {[p.exitcode for p in processes]} (writer, then merger): tracebacks are above")
    written = json.loads(Path(uri, f"writer-{int(keep_runs)}.json").read_text())
    merges = [] if args.alone else json.loads(Path(uri, "merges.json").read_text())
    rows, cpu = written["puts"] * args.generation_rows, children_cpu_seconds() - cpu_before
    return written | {
        "rows": rows,
        "cpu_s": cpu,
        "cpu_s_per_million_rows": cpu / (rows / 1e6),
        "merges": len(merges),
        "joining_passes": sum(m["joining_passes"] for m in merges),
        "merge_seconds": sum(m["seconds"] for m in merges),
        "longest_merge_s": max((m["seconds"] for m in merges), default=0.0),
    }


def render(results: dict[str, Any]) -> str:
    how = (
        "as fast as it can with no merger beside it (no backpressure)"
        if results["alone"]
        else "as fast as merge capacity lets it beside a merger (the merge sensor's default trigger, every 5 s)"
    )
    lines = [
        "# Continuous ingestion with and without the pending-run keeper"
        + ("" if results["alone"] else ", merges included"),
        "",
        f"`benchmarks/keeper_cost.py`, base of {results['rows']:,} rows, 4 shards; a writer puts "
        f"{results['generation_rows']:,} random upserts {how} for {results['seconds']:.0f} s; the keeper waits "
        f"{results['patience']:.0f} s at most for the writer to pause; sides alternate, each on a fresh clone "
        "of the base.",
        "",
        "| key | round | keeper | rows/s | held by backpressure | merges (joining passes), merge s | run delay max "
        "| keeper rounds (beside writes) | CPU s per 1M rows (writer + merger) |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for kind, found in results["kinds"].items():
        for side in found["sides"]:
            delay = f"{side['max_run_delay_s']:.1f} s" if "max_run_delay_s" in side else ""
            rounds = f"{side['rounds']} ({side['rounds_beside_writes']})" if side["keep_runs"] else ""
            longest = f", longest {side['longest_merge_s']:.0f} s" if side.get("longest_merge_s") else ""
            lines.append(
                f"| {kind} | {side['round']} | {'with' if side['keep_runs'] else 'without'} | "
                f"{side['rows_per_s']:,.0f} | {side['backpressure_s']:.0f} s | "
                f"{side['merges']} ({side['joining_passes']}), {side['merge_seconds']:.0f} s{longest} | {delay} | "
                f"{rounds} | "
                f"{side['cpu_s_per_million_rows']:.2f} |"
            )
        if "throughput_ratio" in found:
            lines.append(f"| {kind} | median | with / without | {found['throughput_ratio']:.2f}x | | | | | |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_base_arguments(parser, "keeper_cost")
    parser.add_argument("--seconds", type=float, default=150, help="seconds the writer writes per side")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both sides, alternating which goes first")
    parser.add_argument("--generation-rows", type=int, default=50_000, help="upserts per put")
    parser.add_argument(
        "--alone", action="store_true", help="the writer goes flat out with no merger (the keeper's rounds all cost)"
    )
    parser.add_argument(
        "--patience",
        type=float,
        default=DEFAULT_KEEPER_PATIENCE_SECONDS,
        help="seconds the keeper waits for the writer to pause, at most (0: rounds never wait)",
    )
    args = parser.parse_args()
    results: dict[str, Any] = {
        "rows": args.rows,
        "generation_rows": args.generation_rows,
        "seconds": args.seconds,
        "alone": args.alone,
        "patience": args.patience,
        "kinds": {},
    }
    scratch = args.data / "keeper-cost"
    for kind in args.kinds:
        base = template(args.data, kind, args.rows)
        sides: list[dict[str, Any]] = []
        found = results["kinds"][kind] = {"sides": sides}
        for round_ in range(args.rounds):
            for keep in (True, False) if round_ % 2 == 0 else (False, True):
                uri = str(clone(base, scratch / f"{kind}.lance"))
                side = ingest(uri, kind, keep, args)
                sides.append(side | {"round": round_, "keep_runs": keep})
                shutil.rmtree(uri, ignore_errors=True)
                print(kind, round_, keep, json.dumps(side, default=lambda v: round(v, 3)), flush=True)
                save_results(results, render(results), args.out)
        rates = {keep: [s["rows_per_s"] for s in sides if s["keep_runs"] == keep] for keep in (True, False)}
        found["throughput_ratio"] = statistics.median(rates[True]) / statistics.median(rates[False])
        save_results(results, render(results), args.out)
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
