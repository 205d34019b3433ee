"""Costs against base size at a fixed change volume: LSM table vs plain Lance on the same data.

    .venv/bin/python benchmarks/scale.py --max-rows 16000000
    .venv/bin/python benchmarks/scale.py --lookups-only --min-rows 16000000   # lookups, 16Mi and 64Mi
    .venv/bin/python benchmarks/scale.py --scans-only --min-rows 32000000 --max-rows-other-keys 67108864

For each base size (1M, 2M, 4M, ... up to ``--max-rows``, default 64M rows;
int64 key ``id``, 4 shards) the same change volume is applied: 4 flushed
generations of 50k random-key upserts (200k changes). Measured side by side
in one run, on the same data:

* merged full scan (``LsmTable.scanner()``, 4 pending generations) vs a
  plain Lance scan of the base (in Lance's default batches, and in the
  merged scan's); also for a string key and a composite key (up to
  ``--max-rows-other-keys``; ``--scans-only``: every key type, nothing else);
* merge of the 200k changes (``LsmTable.compact``, with its base upkeep)
  vs one plain ``merge_insert`` of the same resolved rows into the same base;
* lookup p50 (``fresh=True``) with 0 and 16 pending generations vs Lance's
  indexed point query ``to_table(filter="id = k")`` on the base; a batch
  lookup of 1,000 keys vs ``id IN (...)``;
* peak RSS of a full streamed read (``LsmTable.scanner()``, in a child process);
* ``quality_job`` wall time and peak RSS (``dagster job execute`` on the
  base with 4 pending generations and a WAL tail): of the run's Python
  driver, and of every process of the run summed (Spark's JVM and workers
  included), up to ``--quality-max-rows``; ``--quality-only`` adds them to
  an earlier run's results.

Base tables are built once per size under ``--data`` (plain Lance appends
plus ``LsmTable.create``) and cloned per run by hard links (Lance never
rewrites a data or index file), so re-runs skip the build.
Results go to ``benchmarks/results/scale.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import lance
import numpy as np
import psutil
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.compare import PeakRss
from resources.lsm import LsmTable
from resources.lsm.read.merged_read import BASE_BATCH_ROWS
from resources.lsm.testing.changegen import EVENTS_SCHEMA

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
SIZES = [1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 32 << 20, 64 << 20]
SHARDS = 4
GENERATIONS = 4
GENERATION_ROWS = 50_000
CHUNK = 1 << 20
STATUSES = np.array(["new", "paid", "shipped", "returned"])
CUSTOMERS = np.char.add("c", np.arange(997).astype(str))
KEYS = {"int64": ["id"], "string": ["sid"], "composite": ["region", "id"]}
K = TypeVar("K")


# ------------------------------------------------------------------ data


def schema_for(kind: str) -> pa.Schema:
    if kind == "int64":
        return EVENTS_SCHEMA
    if kind == "string":
        return pa.schema([("sid", pa.string()), *[(f.name, f.type) for f in EVENTS_SCHEMA if f.name != "id"]])
    return pa.schema([("region", pa.string()), *[(f.name, f.type) for f in EVENTS_SCHEMA]])


def rows_for(kind: str, ids: np.ndarray, rng: np.random.Generator) -> pa.Table:
    """Rows of ``kind``'s schema for the integer ids ``ids`` (each id one key)."""
    columns: dict[str, pa.Array] = {
        "customer": pa.array(CUSTOMERS[ids % 997]),
        "amount": pa.array(np.round(rng.random(len(ids)) * 1000, 2)),
        "status": pa.array(STATUSES[rng.integers(0, len(STATUSES), len(ids))]),
    }
    if kind == "string":
        columns = {"sid": pa.array(np.char.add("k", ids.astype(str))), **columns}
    else:
        columns = {"id": pa.array(ids, pa.int64()), **columns}
    if kind == "composite":
        columns = {"region": pa.array(np.char.add("r", (ids % 16).astype(str))), **columns}
    return pa.table(columns).cast(schema_for(kind))


def template(data: Path, kind: str, rows: int) -> Path:
    """The base of ``rows`` rows as an LSM table (no changes), built on first use.

    Its fragments have their key files, as a merge leaves a base (a template
    built before a kind of key file existed gets it on its next use).
    """
    path = data / f"{kind}-{rows}.lance"
    if (path / ".complete").exists():
        LsmTable.open(str(path)).build_pending_runs()  # no pending generations: writes missing key files only
        return path
    shutil.rmtree(path, ignore_errors=True)
    started = time.perf_counter()
    schema = LsmTable.create(str(path), schema_for(kind), KEYS[kind], num_shards=SHARDS).schema
    rng = np.random.default_rng(rows)

    def batches() -> Iterator[pa.RecordBatch]:
        for start in range(0, rows, CHUNK):
            yield from rows_for(kind, np.arange(start, min(start + CHUNK, rows)), rng).to_batches()

    lance.write_dataset(pa.RecordBatchReader.from_batches(schema, batches()), str(path), mode="append")
    lance.dataset(str(path)).optimize.optimize_indices()
    LsmTable.open(str(path)).build_pending_runs()
    (path / ".complete").write_text(f"built in {time.perf_counter() - started:.1f}s\n")
    print(f"built {path.name} in {time.perf_counter() - started:.1f}s", flush=True)
    return path


def clone(source: Path, target: Path) -> Path:
    """A copy of a table whose data, index and key files are hard links (never rewritten once written)."""
    shutil.rmtree(target, ignore_errors=True)
    for directory, _, files in os.walk(source):
        relative = Path(directory).relative_to(source)
        (target / relative).mkdir(parents=True, exist_ok=True)
        shared = relative.parts[:1] in (("data",), ("_indices",), ("_lsm_key_hashes",))
        for name in files:
            (os.link if shared else shutil.copy2)(Path(directory) / name, target / relative / name)
    return target


def add_base_arguments(parser: argparse.ArgumentParser, results_name: str) -> None:
    """``--rows``, ``--kinds``, ``--data`` and ``--out``: what a benchmark over each key kind's cloned base takes."""
    parser.add_argument("--rows", type=int, default=64 << 20, help="base rows (default 64Mi)")
    parser.add_argument("--kinds", nargs="+", choices=list(KEYS), default=list(KEYS))
    parser.add_argument("--data", type=Path, default=Path("/work/bench-data"), help="where base tables are kept")
    parser.add_argument("--out", type=Path, default=RESULTS / results_name, help="results path without suffix")


def on_each_base(
    args: argparse.Namespace, measure: Callable[[str, str, Path], dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """``measure(uri, kind, scratch)`` per kind of ``args.kinds``, on a fresh clone of its base in ``scratch``."""
    found = {}
    scratch = Path(tempfile.mkdtemp(prefix="bench-bases-"))
    try:
        for kind in args.kinds:
            uri = str(clone(template(args.data, kind, args.rows), scratch / f"{kind}.lance"))
            found[kind] = measure(uri, kind, scratch)
            shutil.rmtree(uri, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return found


# ------------------------------------------------------------- measurements


def seconds(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def wall_and_cpu(work: Callable[[], object]) -> tuple[float, float]:
    """Wall and CPU seconds (every thread of the process) of ``work()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - wall, time.process_time() - cpu


def alternating_wall_and_cpu(sides: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """``<side>_s`` and ``<side>_cpu_s``: medians over ``repeat`` rounds of every side in turn, the order
    reversed every other round (so that no side always runs first)."""
    found: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
    for round_ in range(repeat):
        for side in list(sides) if round_ % 2 == 0 else list(reversed(sides)):
            found[side].append(wall_and_cpu(sides[side]))
    medians = {}
    for side, times in found.items():
        medians[f"{side}_s"] = statistics.median(t[0] for t in times)
        medians[f"{side}_cpu_s"] = statistics.median(t[1] for t in times)
    return medians


def paired(first: Callable[[], object], second: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Medians of ``first`` and ``second`` run alternately (:func:`timed_pairs`)."""
    return side_medians(timed_pairs(first, second, repeat))


def side_medians(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    """Each side's median over ``pairs``, taken apart."""
    return statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)


def timed_pairs(first: Callable[[], object], second: Callable[[], object], repeat: int) -> list[tuple[float, float]]:
    """``repeat`` timings of ``first`` and ``second`` run alternately (after one warm-up each), so both see the
    same load.

    Which side goes first alternates too: a load that eases or grows (a
    writer just started) would otherwise always fall heavier on one side.
    """
    first(), second()
    return [_timed_pair(first, second, leading=i % 2 == 0) for i in range(repeat)]


def median_ratio(pairs: list[tuple[float, float]]) -> float:
    """The median of the pairs' ratios (first / second).

    Under a load that comes and goes (a rewrite of the base beside a
    writer), both sides of a pair saw about the same load, while the two
    sides' medians taken apart may come from pairs that did not.
    """
    return statistics.median(ours / theirs for ours, theirs in pairs)


def _timed_pair(first: Callable[[], object], second: Callable[[], object], leading: bool) -> tuple[float, float]:
    """One timing of each, ``first`` timed first if ``leading``."""
    if leading:
        took = seconds(first)
        return took, seconds(second)
    other = seconds(second)
    return seconds(first), other


def drain(reader: pa.RecordBatchReader | Iterator[pa.RecordBatch]) -> int:
    return sum(batch.num_rows for batch in reader)


def p50_side_by_side(ours: Callable[[K], object], theirs: Callable[[K], object], keys: list[K]) -> tuple[float, float]:
    """p50 of ``ours(k)`` and of ``theirs(k)``, in alternating pairs, each probe a key of its own.

    Every probe asks for a key no probe asked for before, as a serving
    process sees fresh keys: probing one key with both sides would leave the
    second on warm pages, and a p50 over half cold, half warm probes lands
    anywhere between the two. ``keys`` should be distinct; the first two
    are a warm-up, one for each side. Which side goes first alternates.
    """
    ours(keys[0]), theirs(keys[1])
    times: tuple[list[float], list[float]] = ([], [])
    pairs = list(zip(keys[2::2], keys[3::2], strict=False))
    for i, (mine, their) in enumerate(pairs):
        probes = [(0, ours, mine), (1, theirs, their)]
        for side, probe, key in probes if i % 2 == 0 else probes[::-1]:
            times[side].append(seconds(lambda probe=probe, key=key: probe(key)))
    return statistics.median(times[0]), statistics.median(times[1])


def write_generations(table: LsmTable, kind: str, rows: int, count: int, rng: np.random.Generator) -> list[pa.Table]:
    """``count`` flushed generations of ``GENERATION_ROWS`` random-key upserts each (every shard gets one).

    Then the pending runs are built, as the flush job does after flushing.
    """
    batches = [rows_for(kind, rng.integers(0, rows, GENERATION_ROWS), rng) for _ in range(count)]
    for batch in batches:
        table.write(batch)
        table.close()
    table.build_pending_runs()
    return batches


def scan_ratio(table: LsmTable, repeat: int) -> dict[str, float]:
    """Merged full scan against plain Lance's default scan, and against one in the merged scan's batch size."""
    base = table.dataset()
    merged, plain = paired(lambda: drain(table.scanner()), lambda: drain(base.to_batches()), repeat)
    merged_2, same_batches = paired(
        lambda: drain(table.scanner()), lambda: drain(base.to_batches(batch_size=BASE_BATCH_ROWS)), repeat
    )
    return {
        "merged_scan_s": merged,
        "base_scan_s": plain,
        "scan_ratio": merged / plain,
        "base_scan_same_batches_s": same_batches,
        "scan_ratio_same_batches": merged_2 / same_batches,
    }


def lookups(table: LsmTable, rows: int, rng: np.random.Generator, probes: int) -> dict[str, float]:
    """Point lookups (fresh) and Lance's indexed point query on the same base, side by side, p50 in ms."""
    base = table.dataset()
    keys = [int(k) for k in rng.choice(rows, 2 * probes + 2, replace=False)]
    batch = [int(k) for k in rng.choice(rows, 1000, replace=False)]
    in_list = f"id IN ({', '.join(map(str, batch))})"
    ours, lance_point = p50_side_by_side(lambda k: table.lookup([k]), lambda k: base.to_table(filter=f"id = {k}"), keys)
    ours_batch, lance_batch = paired(lambda: table.lookup(batch), lambda: base.to_table(filter=in_list), 3)
    return {
        "lookup_ms": ours * 1e3,
        "lance_point_ms": lance_point * 1e3,
        "lookup_ratio": ours / lance_point,
        "batch_lookup_ms": ours_batch * 1e3,
        "lance_batch_ms": lance_batch * 1e3,
    }


def merges(data: Path, source: Path, rows: int, repeat: int) -> dict[str, float]:
    """Medians over fresh clones: ``compact`` of 4 generations vs plain ``merge_insert`` of the same rows.

    Plain Lance runs with its default (``use_index=True``: a key-index probe
    per source row) and with ``use_index(False)`` (a hash join against a scan
    of the base); its index upkeep is a full ``optimize_indices()``.
    """
    from resources.lsm.read.dedup import keep_last_per_key

    times: dict[str, list[float]] = {}
    for attempt in range(repeat):
        rng = np.random.default_rng(rows + 10 + attempt)
        table = LsmTable.open(str(clone(source, data / "run-merge.lance")))
        upserts = keep_last_per_key(pa.concat_tables(write_generations(table, "int64", rows, GENERATIONS, rng)), ["id"])
        sample = {"merge_s": table.compact().elapsed_seconds}
        # Before #21: the same merge, then the key index re-optimized in full.
        before = LsmTable.open(str(clone(source, data / "run-merge.lance")))
        write_generations(before, "int64", rows, GENERATIONS, np.random.default_rng(rows + 10 + attempt))
        sample["merge_full_reindex_s"] = seconds(
            lambda t=before: (t.compact(maintenance=None), t.dataset().optimize.optimize_indices())
        )
        for name, use_index in (("lance_merge_insert_s", True), ("lance_merge_insert_hash_join_s", False)):
            sample[name] = plain_merge(clone(source, data / "run-plain.lance"), upserts, use_index)
        sample["lance_optimize_indices_s"] = seconds(
            lambda: lance.dataset(str(data / "run-plain.lance")).optimize.optimize_indices()
        )
        for name, value in sample.items():
            times.setdefault(name, []).append(value)
    return {"changes": GENERATIONS * GENERATION_ROWS} | {name: statistics.median(v) for name, v in times.items()}


def plain_merge(uri: Path, upserts: pa.Table, use_index: bool) -> float:
    """Seconds of one plain ``merge_insert`` of ``upserts`` (update or insert by ``id``)."""
    dataset = lance.dataset(str(uri))
    builder = dataset.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().use_index(use_index)
    rows = upserts.cast(dataset.schema)
    return seconds(lambda: builder.execute(rows))


CHILD_READ = """
import sys, time
sys.path.insert(0, sys.argv[1])
import lance
from resources.lsm import LsmTable
started = time.perf_counter()
if sys.argv[3] == "lsm":
    rows = sum(b.num_rows for b in LsmTable.open(sys.argv[2]).scanner())
else:
    rows = sum(b.num_rows for b in lance.dataset(sys.argv[2]).to_batches())
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent across fork and exec.
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(rows, time.perf_counter() - started, peak * 1024)
"""


def streamed_read_rss(uri: str, reader: str) -> dict[str, float]:
    """Peak RSS (GB) and time of a full streamed read in a fresh process."""
    output = subprocess.run(
        [sys.executable, "-c", CHILD_READ, str(REPO), uri, reader], capture_output=True, text=True, check=True
    ).stdout.split()
    return {
        f"{reader}_read_rows": int(output[0]),
        f"{reader}_read_s": float(output[1]),
        f"{reader}_read_rss_gb": int(output[2]) / 1e9,
    }


def quality_job(uri: str) -> dict[str, object]:
    """Wall time, peak RSS (driver; all processes) and step times of ``dagster job execute -j quality_job``."""
    with tempfile.TemporaryDirectory(prefix="scale-dagster-") as home:
        env = {**os.environ, "DAGSTER_HOME": home, "LSM_TABLE_URI": uri}
        command = [
            str(Path(sys.executable).with_name("dagster")),
            "job",
            "execute",
            "-m",
            "definitions",
            "-j",
            "quality_job",
        ]
        started = time.perf_counter()
        child = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        tree, driver = PeakRss(child.pid), DriverRss(child.pid)
        tree.start(), driver.start()
        output, _ = child.communicate()
        elapsed, peak = time.perf_counter() - started, tree.stop()
    passed = child.returncode == 0 and "RUN_SUCCESS" in output
    if not passed:
        print(output[-3000:], file=sys.stderr)
    steps = {name: float(value) / (1000 if unit == "ms" else 1) for name, value, unit in STEP_TIME.findall(output)}
    return {
        "quality_s": elapsed,
        "quality_rss_gb": peak / 1e9,
        "quality_driver_rss_gb": driver.stop() / 1e9,
        "quality_passed": passed,
        "quality_steps_s": steps,
    }


STEP_TIME = re.compile(r'Finished execution of step "(\w+)" in ([0-9.]+)(m?s)\.')


class DriverRss(PeakRss):
    """The peak RSS of the run's own (Python driver) process, without Spark's JVM and workers."""

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            try:
                self.peak = max(self.peak, self.root.memory_info().rss)
            except psutil.Error:
                return


def measure_size(data: Path, rows: int, args: argparse.Namespace) -> dict[str, object]:
    """Every int64-key measurement at one base size."""
    rng = np.random.default_rng(rows + 1)
    source = template(data, "int64", rows)
    table = LsmTable.open(str(clone(source, data / "run-int64.lance")))
    result: dict[str, object] = {"rows": rows, "disk_gb": du(source) / 1e9}
    write_generations(table, "int64", rows, GENERATIONS, rng)
    result |= {f"pending4_{k}": v for k, v in lookups(table, rows, rng, args.probes).items()}
    result |= scan_ratio(table, args.repeat)
    result |= merges(data, source, rows, args.repeat)
    table.compact()
    result |= {f"pending0_{k}": v for k, v in lookups(table, rows, rng, args.probes).items()}
    result |= streamed_read_rss(table.uri, "lsm") | streamed_read_rss(table.uri, "lance")
    write_generations(table, "int64", rows, 16, rng)
    result |= {f"pending16_{k}": v for k, v in lookups(table, rows, rng, args.probes).items()}
    if rows <= args.quality_max_rows:
        result |= quality_job(pending_table(data, rows).uri)
    print(json.dumps(result), flush=True)
    return result


def measure_lookups(data: Path, rows: int, args: argparse.Namespace) -> dict[str, object]:
    """Lookups only (``--lookups-only``): the base as built, then with 16 pending generations and their runs."""
    rng = np.random.default_rng(rows + 4)
    table = LsmTable.open(str(clone(template(data, "int64", rows), data / "run-int64.lance")))
    result: dict[str, object] = {"rows": rows}
    result |= {f"pending0_{k}": v for k, v in lookups(table, rows, rng, args.probes).items()}
    write_generations(table, "int64", rows, 16, rng)
    result |= {f"pending16_{k}": v for k, v in lookups(table, rows, rng, args.probes).items()}
    print(json.dumps(result), flush=True)
    return result


def render_lookups(results: list[dict]) -> str:
    lines = [
        "# Point lookups against base size (`benchmarks/scale.py --lookups-only`)",
        "",
        f'{machine()}. Single-key `lookup(fresh=True)` p50 against Lance\'s `to_table(filter="id = k")` '
        "(BTREE) on the same base, in alternating pairs, each probe a key no probe asked for before; 16 pending: "
        f"16 flushed generations of {GENERATION_ROWS:,} random-key upserts and their pending runs. "
        "Batch: 1,000 keys in one call against `id IN (...)`.",
        "",
        "| base rows | 0 pending: LSM / Lance (ms) | ratio | 16 pending: LSM / Lance (ms) | ratio "
        "| batch of 1,000, 0 pending: LSM / Lance (ms) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r['rows'] >> 20}Mi "
        f"| {_pair(r, 'pending0', 'lookup', 'lance_point', 2)} | {r['pending0_lookup_ratio']:.2f}x "
        f"| {_pair(r, 'pending16', 'lookup', 'lance_point', 2)} | {r['pending16_lookup_ratio']:.2f}x "
        f"| {_pair(r, 'pending0', 'batch_lookup', 'lance_batch', 0)} |"
        for r in results
    ]
    return "\n".join(lines) + "\n"


def _pair(result: dict, state: str, ours: str, theirs: str, digits: int) -> str:
    return f"{result[f'{state}_{ours}_ms']:.{digits}f} / {result[f'{state}_{theirs}_ms']:.{digits}f}"


def other_key_scan(data: Path, kind: str, rows: int, repeat: int) -> dict[str, float]:
    rng = np.random.default_rng(rows + 2)
    table = LsmTable.open(str(clone(template(data, kind, rows), data / f"run-{kind}.lance")))
    write_generations(table, kind, rows, GENERATIONS, rng)
    result = {"rows": rows, **scan_ratio(table, repeat)}
    print(kind, json.dumps(result), flush=True)
    return result


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# ----------------------------------------------------------------- report


def render(results: dict) -> str:
    sizes = results["int64"]
    lines = [
        "# Costs against base size (benchmarks/scale.py)",
        "",
        f"{results['machine']}. Change volume at every size: {GENERATIONS} flushed generations of "
        f"{GENERATION_ROWS:,} random-key upserts, {SHARDS} shards. LSM and plain Lance measured side by side "
        "on the same data in one run. Lookups: p50 of single-key `lookup(fresh=True)` against Lance's "
        '`to_table(filter="id = k")` (BTREE) on the same base; batch: 1,000 keys in one call against '
        "`id IN (...)`. Merge times are medians over `--repeat` fresh clones.",
        "",
        "| base rows | merged scan / base scan | merge 200k: LSM / with a full re-index, as before (s) "
        "| plain `merge_insert`: default / hash join (s) | + plain `optimize_indices` (s) "
        "| lookup p50, 0 pending (ms) | 16 pending (ms) | Lance point query (ms) "
        "| batch of 1,000: LSM / Lance (ms) | streamed read peak RSS: LSM / Lance (GB) | quality_job (s, GB) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in sizes:
        quality = (
            f"{r['quality_s']:.0f} s, {r['quality_driver_rss_gb']:.2f} GB driver / {r['quality_rss_gb']:.2f} GB all"
            if "quality_s" in r
            else "not run"
        )
        if "quality_passed" in r and not r["quality_passed"]:
            quality += " (failed)"
        lines.append(
            f"| {r['rows'] / 2**20:,.0f}Mi | {scan_cell(r)} "
            f"| {r['merge_s']:.2f} / {fmt(r.get('merge_full_reindex_s'))} "
            f"| {r['lance_merge_insert_s']:.2f} / {r['lance_merge_insert_hash_join_s']:.2f} "
            f"| {r['lance_optimize_indices_s']:.2f} "
            f"| {r['pending0_lookup_ms']:.2f} | {r['pending16_lookup_ms']:.2f} | {r['pending0_lance_point_ms']:.2f} "
            f"| {r['pending0_batch_lookup_ms']:.0f} / {r['pending0_lance_batch_ms']:.0f} "
            f"| {r['lsm_read_rss_gb']:.2f} / {r['lance_read_rss_gb']:.2f} | {quality} |"
        )
    for kind in ("string", "composite"):
        if results.get(kind):
            lines += ["", f"Merged full scan, {kind} key ({', '.join(KEYS[kind])}), 4 pending generations:", ""]
            lines += ["| base rows | merged scan / base scan |", "| ---: | ---: |"]
            lines += [f"| {r['rows'] / 2**20:,.0f}Mi | {scan_cell(r)} |" for r in results[kind]]
    lines += extrapolation(sizes)
    lines += ["", "Cost against base size (each column scaled to its largest value; `#` = 1/40):", "", "```"]
    lines += ascii_plot(sizes)
    lines += ["```", ""]
    return "\n".join(lines)


EXTRAPOLATED = {
    "disk_gb": "base on disk (GB)",
    "base_scan_s": "plain Lance full scan (s)",
    "merged_scan_s": "merged full scan, 4 pending generations (s)",
    "merge_s": "merge of 200k changes (s)",
    "lance_merge_insert_hash_join_s": "plain `merge_insert` of 200k, hash join (s)",
    "lsm_read_rss_gb": "peak RSS of a full streamed read (GB)",
    "pending0_lookup_ms": "lookup p50, 0 pending (ms)",
    "quality_s": "quality_job (s)",
    "quality_driver_rss_gb": "quality_job driver peak RSS (GB)",
}


def extrapolation(sizes: list[dict]) -> list[str]:
    """Least-squares lines ``a + b * rows`` over the measured sizes, read at 1B rows."""
    if len(sizes) < 2:
        return []
    rows = np.array([r["rows"] for r in sizes], dtype=float)
    lines = [
        "",
        f"Extrapolated to 1B rows: a straight line `a + b x rows` fitted to the {len(sizes)} sizes above "
        "(least squares; a line that falls is read as flat, at the median), so a cost that does not grow "
        "with the base stays flat.",
        "",
        "| cost | at the largest size measured | per 1M more base rows | at 1B rows |",
        "| --- | ---: | ---: | ---: |",
    ]
    for key, label in EXTRAPOLATED.items():
        if any(key not in r for r in sizes):
            continue
        values = np.array([r[key] for r in sizes], dtype=float)
        slope, intercept = np.polyfit(rows, values, 1)
        if slope <= 0:  # no growth measured (noise on a shared machine): flat at the median
            slope, intercept = 0.0, float(np.median(values))
        lines.append(f"| {label} | {values[-1]:.2f} | {slope * 1e6:+.4f} | {intercept + slope * 1e9:.1f} |")
    return lines


def fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def scan_cell(r: dict) -> str:
    return f"{r['scan_ratio']:.2f}x ({r['merged_scan_s']:.2f} s vs {r['base_scan_s']:.2f} s)"


def ascii_plot(sizes: list[dict]) -> list[str]:
    """A text plot of merge time, lookup p50 and scan time against base size (for where the PNG is not shown)."""
    series = {"merge (s)": "merge_s", "lookup p50 (ms)": "pending0_lookup_ms", "merged scan (s)": "merged_scan_s"}
    out = []
    for label, key in series.items():
        top = max(r[key] for r in sizes) or 1.0
        out.append(label)
        out += [
            f"  {r['rows'] / 2**20:>5,.0f}Mi {'#' * max(1, round(40 * r[key] / top)):<40} {r[key]:.2f}" for r in sizes
        ]
    return out


_PLOT_PANELS = {
    "merge of the 200k changes (s)": {
        "LSM compact, with its index upkeep": "merge_s",
        "LSM merge + full re-index (before)": "merge_full_reindex_s",
        "plain merge_insert, hash join": "lance_merge_insert_hash_join_s",
    },
    "lookup p50, fresh (ms)": {
        "LSM, 0 pending": "pending0_lookup_ms",
        "LSM, 16 pending": "pending16_lookup_ms",
        "Lance point query (BTREE)": "pending0_lance_point_ms",
    },
    "full scan (s)": {"LSM merged view, 4 pending": "merged_scan_s", "plain Lance, base": "base_scan_s"},
    "peak RSS (GB)": {
        "LSM streamed read": "lsm_read_rss_gb",
        "Lance streamed read": "lance_read_rss_gb",
        "quality_job driver": "quality_driver_rss_gb",
    },
}


def plot(sizes: list[dict], path: Path) -> None:
    """Each cost against base size, LSM next to plain Lance, on log-log axes (a flat line follows the change)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 2, figsize=(12, 8))
    for axis, (title, series) in zip(axes.flat, _PLOT_PANELS.items(), strict=True):
        for label, key in series.items():
            points = [(r["rows"], r[key]) for r in sizes if r.get(key) is not None]
            axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
        axis.set(title=title, xlabel="base rows", xscale="log", yscale="log")
        axis.legend(fontsize=8)
    figure.suptitle(f"Costs against base size, {GENERATIONS} x {GENERATION_ROWS:,} changes, {machine()}")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def machine() -> str:
    return (
        f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}, pylance {lance.__version__}"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.data.mkdir(parents=True, exist_ok=True)
    sizes = [s for s in SIZES if s <= args.max_rows]
    if args.quality_only:
        return quality_only(args, [s for s in sizes if s <= args.quality_max_rows])
    if args.lookups_only:
        found = []
        for rows in (s for s in sizes if s >= args.min_rows):
            found.append(measure_lookups(args.data, rows, args))
            args.out.with_name("scale-lookups.md").write_text(render_lookups(found))
        return 0
    if args.scans_only:
        return scans_only(args, [s for s in sizes if args.min_rows <= s <= args.max_rows_other_keys])
    results: dict = {"machine": machine(), "int64": [], "string": [], "composite": []}
    for rows in sizes:
        results["int64"].append(measure_size(args.data, rows, args))
        write_outputs(results, args.out)
    for kind in ("string", "composite"):
        for rows in (s for s in sizes if s <= args.max_rows_other_keys):
            results[kind].append(other_key_scan(args.data, kind, rows, args.repeat))
            write_outputs(results, args.out)
    return 0


def scans_only(args: argparse.Namespace, sizes: list[int]) -> int:
    """Merged full scan vs base scan for every key type at ``sizes`` (``--scans-only``), into scale-scans.md."""
    found: dict[str, list[dict]] = {}
    for rows in sizes:
        for kind in ("int64", "string", "composite"):
            found.setdefault(kind, []).append(other_key_scan(args.data, kind, rows, args.repeat))
            args.out.with_name("scale-scans.md").write_text(render_scans(found))
    return 0


def render_scans(found: dict[str, list[dict]]) -> str:
    lines = [
        "# Merged full scan by key type (`benchmarks/scale.py --scans-only`)",
        "",
        f"{machine()}. {GENERATIONS} pending generations of {GENERATION_ROWS:,} random-key upserts with their "
        f"pending runs, {SHARDS} shards; `LsmTable.scanner()` drained against a plain Lance `to_batches()` of "
        "the same base, alternating, medians of `--repeat` pairs; then against one in the merged scan's batch "
        "size (Lance's default batches are smaller, and slower).",
        "",
        f"| key | base rows | merged scan | base scan | ratio | base scan, {BASE_BATCH_ROWS:,}-row batches | ratio |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {kind} | {r['rows'] / (1 << 20):.0f}Mi | {r['merged_scan_s']:.2f} s | {r['base_scan_s']:.2f} s "
        f"| {r['scan_ratio']:.2f}x | {r['base_scan_same_batches_s']:.2f} s | {r['scan_ratio_same_batches']:.2f}x |"
        for kind, results in found.items()
        for r in results
    ]
    return "\n".join(lines) + "\n"


def quality_only(args: argparse.Namespace, sizes: list[int]) -> int:
    """Add ``quality_job`` numbers to the sizes of an earlier run's results."""
    results = json.loads(args.out.with_suffix(".json").read_text())
    for entry in results["int64"]:
        if entry["rows"] in sizes:
            entry |= quality_job(pending_table(args.data, entry["rows"]).uri)
            print(entry["rows"], json.dumps({k: v for k, v in entry.items() if k.startswith("quality")}), flush=True)
            write_outputs(results, args.out)
    return 0


def pending_table(data: Path, rows: int) -> LsmTable:
    """A clone of the base with 4 pending generations and a WAL tail (crashed writers)."""
    rng = np.random.default_rng(rows + 3)
    table = LsmTable.open(str(clone(template(data, "int64", rows), data / "run-quality.lance")))
    write_generations(table, "int64", rows, GENERATIONS, rng)
    table.write(rows_for("int64", rng.integers(0, rows, 1000), rng))
    table.detach_writers()
    return table


def save_results(results: dict, markdown: str, out: Path) -> None:
    """Write ``results`` to ``out``.json and ``markdown`` to ``out``.md, and print the markdown."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    out.with_suffix(".md").write_text(markdown)
    print(markdown)


def write_outputs(results: dict, out: Path) -> None:
    """Write after every size, so an interrupted run keeps what it measured."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    out.with_suffix(".md").write_text(render(results))
    if results["int64"]:
        plot(results["int64"], out.with_suffix(".png"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-rows", type=int, default=SIZES[-1], help="largest base size (default 64Mi rows)")
    parser.add_argument(
        "--max-rows-other-keys", type=int, default=16 << 20, help="largest size for string/composite keys"
    )
    parser.add_argument("--quality-max-rows", type=int, default=SIZES[-1], help="largest size to run quality_job on")
    parser.add_argument("--quality-only", action="store_true", help="add quality_job numbers to scale.json")
    parser.add_argument(
        "--lookups-only", action="store_true", help="measure lookups only, into scale-lookups.md (next to --out)"
    )
    parser.add_argument(
        "--scans-only",
        action="store_true",
        help="merged scans of every key type only, up to --max-rows-other-keys, into scale-scans.md",
    )
    parser.add_argument(
        "--min-rows", type=int, default=SIZES[0], help="smallest base size (with --lookups-only, --scans-only)"
    )
    parser.add_argument("--data", type=Path, default=Path("/work/bench-data"), help="where base tables are kept")
    parser.add_argument("--out", type=Path, default=RESULTS / "scale", help="results path without suffix")
    parser.add_argument("--repeat", type=int, default=3, help="paired scans per size")
    parser.add_argument("--probes", type=int, default=200, help="keys per lookup p50")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
