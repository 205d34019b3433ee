"""Reads in the states a live table is in: generations just cut, runs built, a writer busy.

    .venv/bin/python benchmarks/live_reads.py                       # 64Mi rows, int64 / string / composite keys
    .venv/bin/python benchmarks/live_reads.py --rows 1048576 --kinds int64 --repeat 1 --live-repeat 1   # smoke run
    .venv/bin/python benchmarks/live_reads.py --kinds string --pending 16    # one kind, one state, then live
    .venv/bin/python benchmarks/live_reads.py --kinds string --pending 16 --max-deleted-fraction 0.3
    .venv/bin/python benchmarks/live_reads.py --kinds string composite --pending 0,16 --idle-only

Per key kind, on a base of ``--rows`` rows (``benchmarks/scale.py``'s tables,
built once under ``--data``, cloned by hard links), 4 shards, side by side
with plain Lance on the same base in one run (medians of ``--repeat``
alternating pairs, ``--live-repeat`` beside the writer; ratios are the
median of the pairs' ratios):

1. Generations just cut, before any run exists, with ``--pending`` (1, 4
   and 16; 0 measures the base alone) pending generations per shard, each
   write of ``--generation-rows`` random upserts over the shards (5% new
   keys; ``scale.py``'s rows): the merged scan (``LsmTable.scanner()``
   drained) against the base's ``to_batches()``, the first scan of a
   reader just opened (``LsmTable.open(uri)``) against a plain reader just
   opened, ``count()`` against the base scan in pairs of its own (Lance's
   ``count_rows()`` of the base reads only its metadata), and fresh point
   lookups against Lance's indexed point query on the base (p50 of
   ``--probes`` each, alternating pairs, each probe a key of its own).
2. The same once ``build_pending_runs()`` ran, and what building took (wall
   seconds per generation, on a machine doing nothing else).
3. While a writer process streams ``--live-rows-per-s`` changes of keys
   drawn anew (shard writers held open, generations cut by full MemTables, a
   ``PendingRunKeeper`` building their runs) and a merger process merges the
   shards the merge sensor's default trigger picks, as its runs do beside a
   writer run (``compact(runs_only=True)``, checked every 5 s): the merged
   scan, ``count()`` and lookups (``--live-probes``) against the base, twice
   (from 10 s after the writer started, then right after), then rounds of
   ``--lookup-probes`` fresh lookups a side for ``--lookup-seconds`` (each
   round's p50 ratio; their median, 90th percentile and worst), the runs' longest
   delay behind the generations, the keeper's mean round and the merges'
   durations and starts (against the writer's start, as the reads' spans are);
   then the writer's throughput with and without the keeper, in
   alternating runs of ``--writer-batches`` puts as fast as it can. The live
   writer waits for merge capacity before each put, as a continuous ingestion
   run does before each micro-batch (the seconds it waited are recorded), and
   each process's peak resident memory is recorded.

Results: ``benchmarks/results/live_reads.{json,md}`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from contextlib import nullcontext
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any

import lance
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.scale import (
    add_base_arguments,
    drain,
    median_ratio,
    on_each_base,
    p50_side_by_side,
    rows_for,
    save_results,
    seconds,
    side_medians,
    timed_pairs,
)
from resources.lsm import LsmTable, MaintenancePolicy
from resources.lsm.format.layout import RUNS_DIR
from resources.lsm.maintenance.backpressure import await_merge_capacity
from resources.lsm.maintenance.pending_runs import DEFAULT_KEEPER_PATIENCE_SECONDS, PendingRunKeeper
from resources.lsm.maintenance.policy import BackpressurePolicy, MergeTrigger

SHARDS = 4
WRITER_ROUNDS = 3
"""Runs per side (with and without the keeper) of the writer's throughput, alternating."""
BACKPRESSURE = BackpressurePolicy(max_wait_seconds=3600.0)
"""What the live writer waits for before each put: a continuous run's default, waiting however long merges take."""


def add_generations(table: LsmTable, kind: str, rows: int, count: int, size: int, rng: np.random.Generator) -> None:
    """``count`` more flushed generations of ``size`` random upserts (over every shard), none with a run yet."""
    for _ in range(count):
        ids = rng.integers(0, int(rows * 1.05), size)  # 5% beyond the base: new keys
        table.write(rows_for(kind, ids, rng))
        table.close()
    table.handle.storage.delete_dir(RUNS_DIR)


def key_probes(kind: str, ids: list[int]) -> list[tuple[object, str]]:
    """For each id: the key as ``LsmTable.lookup`` takes it, and plain Lance's point filter on the base."""
    if kind == "int64":
        return [(i, f"id = {i}") for i in ids]
    if kind == "string":
        return [(f"k{i}", f"sid = 'k{i}'") for i in ids]
    return [((f"r{i % 16}", i), f"region = 'r{i % 16}' AND id = {i}") for i in ids]


def reads(uri: str, kind: str, repeat: int, probes: int) -> dict[str, Any]:
    """Merged scan, a new reader's first scan, count() and fresh lookups, each against plain Lance on the same base.

    Seconds are each side's median over ``repeat`` alternating pairs; ratios
    the median of the pairs' ratios (:func:`~benchmarks.scale.median_ratio`:
    beside a writer, a rewrite of the base loads the machine for minutes,
    and the sides' medians taken apart may come from pairs of which only
    one ran under it). Lookups are ``probes`` fresh point lookups against
    Lance's indexed point query on the latest base, in alternating pairs,
    each probe a key of its own.
    """
    table = LsmTable.open(uri)
    base = lance.dataset(uri)

    def base_scan() -> None:
        """The latest version, warm (beside a writer, the base changes with every merge)."""
        drain(base.checkout_version(base.latest_version).to_batches())

    scans = timed_pairs(lambda: drain(table.scanner()), base_scan, repeat)
    new_readers = timed_pairs(
        lambda: drain(LsmTable.open(uri).scanner()), lambda: drain(lance.dataset(uri).to_batches()), repeat
    )
    counts = timed_pairs(table.count, base_scan, repeat)
    latest = base.checkout_version(base.latest_version)  # the scans took minutes beside a writer
    ids = np.random.default_rng(len(uri)).choice(latest.count_rows(), 2 * probes + 2, replace=False).tolist()
    ours, theirs = p50_side_by_side(
        lambda probe: table.lookup([probe[0]]), lambda probe: latest.to_table(filter=probe[1]), key_probes(kind, ids)
    )
    merged, plain = side_medians(scans)
    new_reader, new_plain = side_medians(new_readers)
    counted, _ = side_medians(counts)
    return {
        "merged_scan_s": merged,
        "base_scan_s": plain,
        "scan_ratio": median_ratio(scans),
        "new_reader_scan_s": new_reader,
        "new_plain_reader_s": new_plain,
        "new_reader_ratio": median_ratio(new_readers),
        "count_s": counted,
        "count_vs_base_scan": median_ratio(counts),
        "lookup_ms": ours * 1e3,
        "lance_point_ms": theirs * 1e3,
        "lookup_ratio": ours / theirs,
        "pairs_s": {"scan": scans, "new_reader": new_readers, "count": counts},
    }


def lookups_over_time(uri: str, kind: str, rows: int, seconds: float, probes: int) -> dict[str, Any]:
    """Rounds of ``probes`` fresh lookups a side against Lance's point query on the latest base, for ``seconds``.

    Beside a writer the table changes every few seconds (a run replaced, a
    merge committed, the base tidied), and one p50 pair over a span lands
    on whichever of those it met: each round's p50 ratio is kept with when
    it started, and the rounds' median and 90th percentile summarize them.
    """
    table, base = LsmTable.open(uri), lance.dataset(uri)
    rng = np.random.default_rng(len(uri) + 1)
    rounds = []
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        latest = base.checkout_version(base.latest_version)  # same session: Lance's index cache stays warm
        ids = rng.choice(rows, 2 * probes + 2, replace=False).tolist()
        at = time.monotonic() - began
        ours, theirs = p50_side_by_side(
            lambda probe: table.lookup([probe[0]]),
            lambda probe, latest=latest: latest.to_table(filter=probe[1]),
            key_probes(kind, ids),
        )
        rounds.append({"at_s": at, "lookup_ms": ours * 1e3, "lance_point_ms": theirs * 1e3, "ratio": ours / theirs})
    ratios = [r["ratio"] for r in rounds]
    return {
        "rounds": rounds,
        "median_ratio": statistics.median(ratios),
        "p90_ratio": float(np.quantile(ratios, 0.9)),
        "worst_ratio": max(ratios),
    }


def measure_pending(uri: str, kind: str, args: argparse.Namespace, rng: np.random.Generator) -> dict[str, Any]:
    table = LsmTable.open(uri)
    states: dict[str, Any] = {}
    cut = 0
    for pending in args.pending:
        add_generations(table, kind, args.rows, pending - cut, args.generation_rows, rng)
        cut = pending
        without = reads(uri, kind, args.repeat, args.probes)  # through a table object opened now: no run cached
        build = seconds(lambda: LsmTable.open(uri).build_pending_runs())
        with_runs = reads(uri, kind, args.repeat, args.probes)
        states[str(pending)] = {
            "no_runs": without,
            "runs": with_runs,
            "build_runs_s": build,
            "build_s_per_generation": build / (pending * SHARDS) if pending else 0.0,
        }
        print(kind, pending, json.dumps(states[str(pending)], default=lambda v: round(v, 3)), flush=True)
    return states


def write_live(
    uri: str,
    kind: str,
    rows: int,
    size: int,
    keep_runs: bool,
    batches: int,
    stop: EventType | None,
    rate: float | None = None,
    patience: float = DEFAULT_KEEPER_PATIENCE_SECONDS,
) -> None:
    """A writer process: puts of ``size`` rows through writers held open, ``batches`` of them or until ``stop``.

    ``rate`` caps the rows written per second: a steady stream, each put of
    keys drawn anew (most never written before, as in a change stream over a
    large table), each waiting first for merge capacity as a continuous
    ingestion run's micro-batches do (:func:`await_merge_capacity`, the
    default threshold, until ``stop``). ``None`` writes as fast as it can,
    cycling through 40 puts made ahead, so that only writing is timed.

    With ``keep_runs`` a :class:`PendingRunKeeper` builds the runs of the
    generations the writers cut, waiting ``patience`` seconds at most for
    the writer to pause (0: never waits). Writes its rows/s (and the keeper's work) to
    ``<uri>/writer-<keep_runs>.json``.
    """
    table = LsmTable.open(uri)
    rng = np.random.default_rng(7)
    made_ahead = min(batches, 40) if rate is None else 0
    ahead = [rows_for(kind, rng.integers(0, rows, size), rng) for _ in range(made_ahead)]
    written, stalled = 0, 0.0
    keeper = PendingRunKeeper(table.handle, patience_seconds=patience) if keep_runs else None
    with keeper or nullcontext():
        started = time.perf_counter()
        while written < batches and not (stop is not None and stop.is_set()):
            if rate is not None and stop is not None:
                stalled += await_merge_capacity(table.handle, BACKPRESSURE, log=lambda _: None, stopped=stop.is_set)
            table.write(ahead[written % len(ahead)] if ahead else rows_for(kind, rng.integers(0, rows, size), rng))
            written += 1
            if rate is not None:
                time.sleep(max(0.0, started + written * size / rate - time.perf_counter()))
        elapsed = time.perf_counter() - started
    table.close()
    result: dict[str, float] = {"rows_per_s": written * size / elapsed, "puts": written, "backpressure_s": stalled}
    if keeper is not None:
        stats = keeper.stats
        result |= {
            "runs_built": stats.runs_built,
            "max_run_delay_s": stats.max_delay_seconds,
            "rounds": stats.rounds,
            "seconds_per_round": stats.busy_seconds / max(1, stats.rounds),
            "longest_round_s": stats.longest_round_seconds,
            "rounds_beside_writes": stats.rounds_beside_writes,
            "shards_left_to_merges": stats.shards_left_to_merges,
        }
    Path(uri, f"writer-{int(keep_runs)}.json").write_text(json.dumps(result))


def merge_when_due(uri: str, stop: EventType, policy: MaintenancePolicy, interval_s: float = 5.0) -> None:
    """A merger process: the shards :class:`MergeTrigger`'s defaults pick, merged every ``interval_s`` as the merge
    sensor's runs merge them beside a writer run (only generations with a pending run), tidying the base under
    ``policy``. Writes each merge's
    start (seconds after the merger's), seconds (how many of them tidied the base, what that rewrote, whether a
    concurrent commit pre-empted it) and passes to ``<uri>/merges.json``."""
    began = time.perf_counter()
    table = LsmTable.open(uri)
    trigger = MergeTrigger()
    merges = []
    while not stop.wait(interval_s):
        due = [state.shard_id for state in table.shards() if trigger.decide(state, time.time())]
        if due:
            started = time.perf_counter()
            result = table.compact(due, runs_only=True, maintenance=policy)
            passes = sum(s.passes for s in result.shards)
            joined = passes - sum(s.join_free_passes for s in result.shards)
            tidy = result.maintenance
            merges.append(
                {
                    "started_s": started - began,
                    "seconds": time.perf_counter() - started,
                    "maintenance_seconds": tidy.elapsed_seconds if tidy else 0.0,
                    "fragments_rewritten": tidy.fragments_removed if tidy else 0,
                    "tidying_pre_empted": bool(tidy and tidy.skipped_by_conflict),
                    "passes": passes,
                    "joining_passes": joined,
                }
            )
    Path(uri, "merges.json").write_text(json.dumps(merges))


def peak_rss_gb(pid: int | None) -> float:
    """The peak resident memory of process ``pid`` (``None``: this one) so far, in GB (Linux's ``VmHWM``)."""
    status = Path(f"/proc/{pid or 'self'}/status").read_text()
    kilobytes = next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))
    return int(kilobytes) / 1e6


def during_ingestion(uri: str, kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """Reads while a writer process streams changes, then the writer's throughput with and without the keeper."""
    rows, size, repeat = args.rows, args.generation_rows, args.live_repeat
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    live_writer = (uri, kind, rows, size, True, 1 << 30, stop, args.live_rows_per_s)
    writer = context.Process(target=write_live, args=live_writer)
    writer.start()
    policy = MaintenancePolicy(
        max_deleted_fraction=args.max_deleted_fraction, max_rows_rewritten_per_pass=args.max_rows_rewritten_per_pass
    )
    merger = context.Process(target=merge_when_due, args=(uri, stop, policy))
    merger.start()
    started = time.monotonic()
    time.sleep(10)  # the writer claimed its shards and cut generations
    live = []
    for _ in range(2):  # its first minutes, then once merges took some of its changes in
        writing_for = time.monotonic() - started
        measured = reads(uri, kind, repeat, args.live_probes)
        live.append(measured | {"writer_seconds": writing_for, "until_writer_seconds": time.monotonic() - started})
    lookup_rounds = lookups_over_time(uri, kind, rows, args.lookup_seconds, args.lookup_probes)
    for role, process in (("writer", writer), ("merger", merger)):
        if process.exitcode is not None:  # its traceback is above: what was measured is not of a live table
            raise RuntimeError(f"the {role} process stopped during the reads (exit code {process.exitcode})")
    peaks = {role: peak_rss_gb(pid) for role, pid in (("reader", None), ("writer", writer.pid), ("merger", merger.pid))}
    stop.set()
    writer.join()
    merger.join()
    keeper = json.loads(Path(uri, "writer-1.json").read_text())
    merges = json.loads(Path(uri, "merges.json").read_text())
    throughput: dict[bool, list[float]] = {True: [], False: []}
    for round_ in range(WRITER_ROUNDS):
        for keep in (True, False) if round_ % 2 == 0 else (False, True):
            process = context.Process(target=write_live, args=(uri, kind, rows, size, keep, args.writer_batches, None))
            process.start()
            process.join()
            throughput[keep].append(json.loads(Path(uri, f"writer-{int(keep)}.json").read_text())["rows_per_s"])
    with_keeper, without = statistics.median(throughput[True]), statistics.median(throughput[False])
    return {
        "reads": live[0],
        "reads_later": live[1],
        "lookups_over_time": lookup_rounds,
        "keeper_while_reading": keeper,
        "merges_while_reading": merges,
        "peak_rss_gb": peaks,
        "writer_rows_per_s_runs": {"with_keeper": throughput[True], "without_keeper": throughput[False]},
        "writer_rows_per_s_with_keeper": with_keeper,
        "writer_rows_per_s_without_keeper": without,
        "keeper_throughput_ratio": with_keeper / without,
    }


def render(results: dict[str, Any]) -> str:
    lines = [
        "# Reads of a live table: generations just cut, runs built, a writer busy",
        "",
        f"`benchmarks/live_reads.py`, base of {results['rows']:,} rows, {SHARDS} shards; each generation write "
        f"puts {results['generation_rows']:,} random upserts over the shards (one generation per shard); "
        f"{_writer_phase(results)}. Every ratio is against plain Lance on the same base, measured side by side: scan "
        f"and count() ratios are the median of the ratios of alternating pairs ({_pairs(results)}; count() against "
        "a base scan of its own).",
        "",
        "| key | pending gens/shard | state | merged scan / base scan | new reader / new plain reader "
        "| count() / base scan | count() s | lookup p50 / Lance point query |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for kind, found in results["kinds"].items():
        for pending, state in found["pending"].items():
            for name in ("no_runs", "runs"):
                r = state[name]
                lines.append(f"| {kind} | {pending} | {name.replace('_', ' ')} | {_read_cells(r)} |")
        for name in ("reads", "reads_later") if "live" in found else ():
            r = found["live"][name]
            until = f"-{r['until_writer_seconds']:.0f}" if "until_writer_seconds" in r else ""
            span = f"{r['writer_seconds']:.0f}{until}"
            lines.append(f"| {kind} | live | writer busy {span} s | {_read_cells(r)} |")
    lines += [
        "",
        "| key | building runs, s per generation (most pending) | writer with keeper / without "
        "| run delay while live (max) | keeper round while live (mean / longest) "
        "| merges while live (median / max s, longest base tidying, joining passes) "
        "| live writer held by backpressure | peak RSS reader / writer / merger |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for kind, found in results["kinds"].items():
        most = max(found["pending"], key=int)
        build = found["pending"][most]["build_s_per_generation"]
        if "live" not in found:
            lines.append(f"| {kind} | {build:.3f} | not measured | | | | | |")
            continue
        live = found["live"]
        keeper = live["keeper_while_reading"]
        delay, round_s = keeper.get("max_run_delay_s", 0.0), keeper.get("seconds_per_round", 0.0)
        rounds = f"{round_s:.2f}" + (f" / {keeper['longest_round_s']:.1f}" if "longest_round_s" in keeper else "")
        lines.append(
            f"| {kind} | {build:.3f} | {live['keeper_throughput_ratio']:.2f}x | {delay:.1f} s | {rounds} s "
            f"| {_merges_cell(live.get('merges_while_reading', []))} | {_stall_cell(keeper)} "
            f"| {_peaks_cell(live.get('peak_rss_gb'))} |"
        )
    return "\n".join(lines + _lookup_rounds_table(results)) + "\n"


def _lookup_rounds_table(results: dict[str, Any]) -> list[str]:
    """Lookups beside the writer, round by round, summarized per key kind (none if no run measured them)."""
    measured = {k: f["live"]["lookups_over_time"] for k, f in results["kinds"].items() if "live" in f}
    measured = {k: m for k, m in measured.items() if m}
    if not measured:
        return []
    lines = [
        "",
        "| key | lookup rounds beside the writer | p50 / Lance p50 per round: median / p90 / worst "
        "| ours / Lance p50, median over rounds |",
        "| --- | ---: | ---: | ---: |",
    ]
    for kind, m in measured.items():
        rounds = m["rounds"]
        ours = statistics.median(r["lookup_ms"] for r in rounds)
        theirs = statistics.median(r["lance_point_ms"] for r in rounds)
        lines.append(
            f"| {kind} | {len(rounds)} over {rounds[-1]['at_s']:.0f} s "
            f"| {m['median_ratio']:.2f}x / {m['p90_ratio']:.2f}x / {m['worst_ratio']:.2f}x "
            f"| {ours:.2f} / {theirs:.2f} ms |"
        )
    return lines


def _measured_live(results: dict[str, Any]) -> bool:
    return any("live" in found for found in results["kinds"].values())


def _writer_phase(results: dict[str, Any]) -> str:
    """What ran beside the reads of the live phase (``--idle-only`` runs have none)."""
    if not _measured_live(results):
        return "idle states only (`--idle-only`: no writer phase)"
    return (
        f"the live writer streams {results['live_rows_per_s']:,.0f} rows/s, its keeper builds runs and a merger "
        "merges the shards the merge sensor's default trigger picks (only generations with a run, as beside a "
        f"writer run), {_tidying(results)}"
    )


def _pairs(results: dict[str, Any]) -> str:
    beside = f", {results.get('live_repeat', 3)} beside the writer" if _measured_live(results) else ""
    return f"{results.get('repeat', 3)} per state{beside}"


def _tidying(results: dict[str, Any]) -> str:
    """How the merger tidied the base (results of runs before the tidy-up budget name none)."""
    text = f"tidying the base once more than {results.get('max_deleted_fraction', 0.1):.0%} of its rows are deleted"
    budget = results.get("max_rows_rewritten_per_pass")
    return text + (f" (at most {budget:,} rows a tidy-up)" if budget else "")


def _merges_cell(merges: list[dict[str, float]]) -> str:
    if not merges:
        return "none"
    seconds = [m["seconds"] for m in merges]
    tidying = max(m["maintenance_seconds"] for m in merges)
    joining = sum(int(m["joining_passes"]) for m in merges)
    return (
        f"{len(merges)}: {statistics.median(seconds):.1f} / {max(seconds):.1f} s (tidying {tidying:.1f} s), {joining}"
    )


def _stall_cell(writer: dict[str, float]) -> str:
    if "backpressure_s" not in writer:
        return "not applied"
    return f"{writer['backpressure_s']:.0f} s ({writer['rows_per_s']:,.0f} rows/s written)"


def _peaks_cell(peaks: dict[str, float] | None) -> str:
    return "not measured" if peaks is None else " / ".join(f"{peaks[role]:.1f}" for role in peaks) + " GB"


def _read_cells(r: dict[str, Any]) -> str:
    return (
        f"{r['scan_ratio']:.2f}x | {r['new_reader_ratio']:.2f}x | {r['count_vs_base_scan']:.2f}x | {r['count_s']:.3f} "
        f"| {r['lookup_ms']:.2f} / {r['lance_point_ms']:.2f} ms = {r['lookup_ratio']:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_base_arguments(parser, "live_reads")
    parser.add_argument("--repeat", type=int, default=3, help="alternating pairs per measurement")
    parser.add_argument(
        "--live-repeat", type=int, default=7, help="alternating pairs per measurement beside the writer"
    )
    parser.add_argument(
        "--pending",
        type=lambda text: sorted(int(n) for n in text.split(",")),
        default=[1, 4, 16],
        help="pending generations per shard measured before the live phase, comma-separated (default 1,4,16)",
    )
    parser.add_argument("--generation-rows", type=int, default=50_000, help="upserts per generation")
    parser.add_argument("--probes", type=int, default=100, help="fresh lookups per side and state")
    parser.add_argument("--live-probes", type=int, default=300, help="fresh lookups per side beside the writer")
    parser.add_argument(
        "--lookup-seconds", type=float, default=180, help="seconds of lookup rounds beside the writer, after the spans"
    )
    parser.add_argument("--lookup-probes", type=int, default=100, help="fresh lookups per side and round")
    parser.add_argument(
        "--writer-batches",
        type=int,
        default=200,
        help="puts of a generation's rows per throughput run (200: 10M rows, long enough for several keeper rounds)",
    )
    parser.add_argument(
        "--live-rows-per-s", type=float, default=50_000, help="the stream written while reads are measured"
    )
    parser.add_argument(
        "--max-deleted-fraction",
        type=float,
        default=MaintenancePolicy.max_deleted_fraction,
        help="the merger's tidy-up threshold (MaintenancePolicy.max_deleted_fraction)",
    )
    parser.add_argument(
        "--max-rows-rewritten-per-pass",
        type=int,
        default=MaintenancePolicy.max_rows_rewritten_per_pass,
        help="the merger's tidy-up budget (MaintenancePolicy.max_rows_rewritten_per_pass)",
    )
    parser.add_argument("--idle-only", action="store_true", help="measure the idle states only (no writer phase)")
    args = parser.parse_args()

    results: dict[str, Any] = {
        "rows": args.rows,
        "generation_rows": args.generation_rows,
        "live_rows_per_s": args.live_rows_per_s,
        "max_deleted_fraction": args.max_deleted_fraction,
        "max_rows_rewritten_per_pass": args.max_rows_rewritten_per_pass,
        "repeat": args.repeat,
        "live_repeat": args.live_repeat,
        "kinds": {},
    }

    def measure(uri: str, kind: str, _scratch: Path) -> dict[str, Any]:
        # Saved after each phase: a run stopped later (out of memory, out of time) keeps what it measured.
        found = results["kinds"][kind] = {"pending": measure_pending(uri, kind, args, np.random.default_rng(11))}
        save_results(results, render(results), args.out)
        if not args.idle_only:
            found["live"] = during_ingestion(uri, kind, args)
            save_results(results, render(results), args.out)
        return found

    on_each_base(args, measure)


if __name__ == "__main__":
    main()
