"""Benchmark one change-stream workload through this platform and the tools users would pick instead.

    .venv/bin/python benchmarks/compare.py --scale small     # ~100k-row base, 20 batches of 5k (~6 min)
    .venv/bin/python benchmarks/compare.py --scale medium    # ~1M-row base, 100 batches of 10k (~25 min)

The workload (``resources/lsm/changegen.py``): one ``ChangeStreamSpec`` history
(``--update-ratio``, ``--delete-ratio``, ``--reinsert-ratio``; the rest inserts
new keys) long enough to leave about ``--base-rows`` live keys; its ``replay``
is the base table every system starts from. The next ``--batches`` batches of
``--batch-size`` change rows are the stream, written as Parquet landing files;
updates and deletes pick uniformly among all live keys, so they hit the base.
``replay`` of base + stream is the oracle.

Each system runs in its own process (``compare_systems.py``; its docstring
has the per-system method), one after the other, on the same files:

platform            ``ingest_landing_files`` (Spark ``local[2]``, the
                    platform's session settings) with the shard writers held
                    open, one landing file per call (continuous mode), then
                    flush + merge into the base + GC.
platform-backlog    ``ingest_landing_files`` in batch mode over every file in
                    ONE call (Spark tasks write and close the writers), then
                    flush + merge + GC: the platform catching up a backlog.
lance-merge-insert  a plain Lance table, one ``merge_insert`` per batch
                    (upserts + deletes in one commit), then version cleanup.
delta-merge         delta-rs, one ``merge`` per batch, then ``vacuum``.
paimon              pypaimon primary-key table, one write + commit per batch,
                    in its own venv (``benchmarks/.venv-paimon``): pypaimon
                    needs pyarrow < 20, the platform pins 26.
shardwriter-ceiling pre-validated, pre-resolved, pre-routed rows; only the
                    durable ``ShardWriter`` puts/deletes (one thread per shard)
                    are timed; then flush + merge + GC.

The numbers, per system (``rows`` = change rows in the stream):

write rows/s        rows / sum of the apply calls' seconds. A call runs from
                    reading a landing file to the system's acknowledgement
                    (commit, or durable in the WAL).
batch p50 / p99     percentiles of the calls' seconds (one call: the backlog).
merged rows/s       rows / (apply seconds + the flush and merge phases): until
                    every change is in the base table. For merge-per-batch
                    systems the commit IS the merge, so it equals write rows/s.
                    pypaimon cannot compact, so Paimon has none.
visibility p50/p99  after sampled calls (``--probes``), a separate reader in
                    the same process looks up one key the call upserted until
                    it returns the new values: first such read minus the
                    acknowledgement. For the platform the reader is
                    ``LsmTable.lookup`` (fresh: base + generations + WAL tail).
size after stream   bytes under the table directory after the last call
                    (history kept); after maintenance: after the phases above.
peak RSS            highest sum of RSS over the system's process tree (Spark's
                    JVM and Python workers included), sampled every 100 ms;
                    ``ru_maxrss`` of the direct child is kept in the JSON.
correct             the content a reader gets right after the stream and after
                    maintenance both equal the oracle.

Every system runs ``--rounds`` times (order rotated each round); the round
with the median apply seconds is reported, correctness over all rounds.
Ratios are relative to lance-merge-insert in the same run; the machine may be
shared, so compare ratios, not absolute numbers, across runs. Results:
``benchmarks/results/compare-<scale>.json`` (raw), ``.md`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from resources.lsm.testing.changegen import EVENTS_SCHEMA, ChangeStreamSpec, generate_changes, replay  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
SYSTEMS_SCRIPT = REPO / "benchmarks" / "compare_systems.py"
SYSTEMS = ["lance-merge-insert", "delta-merge", "paimon", "platform", "platform-backlog", "shardwriter-ceiling"]
BASELINE = "lance-merge-insert"
MERGE_PHASES = ("flush (close writers)", "flush (other shards)", "merge into base")
NOT_MERGED = {"paimon"}  # pypaimon writes level-0 files only; compaction needs Paimon's Java writers

PAIMON_VERSION = "2.1.0"
PAIMON_VENV = REPO / "benchmarks" / ".venv-paimon"
PAIMON_WHY_OWN_VENV = (
    f"pypaimon {PAIMON_VERSION} requires pyarrow >=16,<20 (not 19.0.0) and fsspec <2026; "
    "the platform pins pyarrow 26.0.1 and fsspec 2026.9.0"
)

SCALES = {
    "small": {"base_rows": 100_000, "batches": 20, "batch_size": 5_000, "probes": 10, "rounds": 3},
    "medium": {"base_rows": 1_000_000, "batches": 100, "batch_size": 10_000, "probes": 20, "rounds": 3},
}


# ------------------------------------------------------------------ workload


@dataclass(frozen=True)
class Workload:
    history_batches: int
    history_rows: int
    base_rows: int
    stream_rows: int
    files: list[str]
    base_path: str


def make_workload(workdir: Path, args: argparse.Namespace) -> tuple[Workload, pa.Table]:
    """Base table (Parquet), stream landing files, and the oracle's final content."""
    growth = 1 - args.update_ratio - 2 * args.delete_ratio  # live keys added per change row
    if growth <= 0:
        raise SystemExit("update ratio + 2 x delete ratio must stay below 1, or the base never grows")
    history = math.ceil(args.base_rows / (growth * args.batch_size))
    spec = ChangeStreamSpec(
        num_keys=2**62,
        num_batches=history + args.batches,
        batch_size=args.batch_size,
        update_ratio=args.update_ratio,
        delete_ratio=args.delete_ratio,
        reinsert_ratio=args.reinsert_ratio,
        seed=args.seed,
    )
    batches = list(generate_changes(spec))
    base = live_rows(replay(batches[:history]))
    pq.write_table(base, workdir / "base.parquet")
    landing = workdir / "landing"
    shutil.rmtree(landing, ignore_errors=True)
    landing.mkdir()
    # The files write_landing_files makes without malformed rows, for the stream only
    # (it would write the history too, converting every batch to Python rows first).
    files = []
    for number, batch in enumerate(batches[history:]):
        files.append(str(landing / f"changes-{number:06d}.parquet"))
        pq.write_table(batch, files[-1])
    base_changes = base.append_column("_op", pa.array(["upsert"] * base.num_rows)).append_column(
        "_seq", pa.array(np.arange(base.num_rows, dtype=np.int64))
    )
    oracle = live_rows(replay([base_changes, *batches[history:]]))
    workload = Workload(
        history,
        history * args.batch_size,
        base.num_rows,
        args.batches * args.batch_size,
        files,
        str(workdir / "base.parquet"),
    )
    return workload, oracle


def live_rows(state: dict) -> pa.Table:
    """``replay``'s key -> row dict as a table sorted by key."""
    return pa.Table.from_pylist([state[k] for k in sorted(state)], schema=EVENTS_SCHEMA)


def compare_content(path: Path, oracle: pa.Table) -> dict:
    """Whether the system's content at ``path`` equals the oracle; counts of differences if not."""
    content = pq.read_table(path).select(EVENTS_SCHEMA.names).cast(EVENTS_SCHEMA).sort_by("id")
    if content.equals(oracle):
        return {"equal": True, "rows": content.num_rows}
    got = {r["id"]: r for r in content.to_pylist()}
    want = {r["id"]: r for r in oracle.to_pylist()}
    return {
        "equal": False,
        "rows": content.num_rows,
        "missing": len(want.keys() - got.keys()),
        "extra": len(got.keys() - want.keys()),
        "duplicates": content.num_rows - len(got),
        "different": sum(got[k] != want[k] for k in got.keys() & want.keys()),
    }


# ------------------------------------------------------------------ processes


class PeakRss(threading.Thread):
    """Samples the summed RSS of a process and all its descendants; keeps the peak."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.root, self.interval, self.peak = psutil.Process(pid), interval, 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            try:
                processes = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            self.peak = max(self.peak, sum(_rss(p) for p in processes))

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        return self.peak


def _rss(process: psutil.Process) -> int:
    try:
        return process.memory_info().rss
    except psutil.Error:
        return 0


def run_system(system: str, python: str, config: dict, workdir: Path) -> dict:
    """Run one system's process; its result plus peak RSS, or the error it died with."""
    config_path = workdir / f"{system}-config.json"
    config_path.write_text(json.dumps(config))
    log_path = workdir / f"{system}.log"
    print(f"[compare] {system} ...", flush=True)
    load_before = os.getloadavg()[0]
    with open(log_path, "w") as log:
        # PYTHONPATH: the child, Spark's JVM and its Python workers import this checkout's engine.
        child = subprocess.Popen(
            [python, str(SYSTEMS_SCRIPT), system, str(config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        sampler = PeakRss(child.pid)
        sampler.start()
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
    memory = {
        "peak_rss_tree_bytes": sampler.stop(),
        "ru_maxrss_child_bytes": usage.ru_maxrss * 1024,
        "load_average_1min_before_after": [load_before, os.getloadavg()[0]],
    }
    result_path = Path(config["out"]) / f"{system}.json"
    if child.returncode != 0 or not result_path.exists():
        tail = log_path.read_text().splitlines()[-25:]
        print(f"[compare] {system} FAILED (exit {child.returncode}):\n" + "\n".join(tail), flush=True)
        return {"system": system, "error": f"exit {child.returncode}: " + "\n".join(tail), **memory}
    return {**json.loads(result_path.read_text()), **memory}


def paimon_python() -> tuple[str | None, str]:
    """The Paimon venv's interpreter (created on first use with ``uv``), or None and why not."""
    python = PAIMON_VENV / "bin" / "python"
    probe = [str(python), "-c", "import importlib.metadata as m, pypaimon; print(m.version('pypaimon'))"]
    if python.exists() and _output(probe) == PAIMON_VERSION:
        return str(python), PAIMON_WHY_OWN_VENV
    uv = Path(sys.executable).with_name("uv")
    steps = [
        [str(uv), "venv", "-q", "--allow-existing", "--python", sys.executable, str(PAIMON_VENV)],
        [str(uv), "pip", "install", "-q", "--python", str(python), f"pypaimon=={PAIMON_VERSION}"],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            return None, f"could not install pypaimon {PAIMON_VERSION} in {PAIMON_VENV}: {done.stderr.strip()}"
    return str(python), PAIMON_WHY_OWN_VENV


def _output(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""


def run_checked(system: str, python: str, config: dict, workdir: Path, oracle: pa.Table) -> dict:
    """One run of a system, with its content after the stream and after maintenance checked."""
    result = run_system(system, python, config, workdir)
    if "error" not in result:
        result["checks"] = {
            when: compare_content(workdir / "out" / f"{system}-{when}.parquet", oracle)
            for when in ("after-stream", "after-maintenance")
        }
    return result


# ------------------------------------------------------------------ numbers


def representative(runs: list[dict]) -> dict:
    """The round with the median apply seconds (the first failure, if any round failed)."""
    failed = [r for r in runs if "error" in r]
    if failed:
        return failed[0]
    return sorted(runs, key=lambda r: sum(r["batch_seconds"]))[(len(runs) - 1) // 2]


def summarize(result: dict, rows: int, runs: list[dict]) -> dict:
    """The derived numbers of one system's representative round; correctness over all rounds."""
    if "error" in result:
        return {"error": result["error"], "peak_rss_mb": result["peak_rss_tree_bytes"] / 2**20}
    batches, lags = result["batch_seconds"], result["visibility_seconds"]
    write_seconds = sum(batches)
    merge_seconds = sum(result["maintenance_seconds"].get(phase, 0.0) for phase in MERGE_PHASES)
    merged = None if result["system"] in NOT_MERGED else rows / (write_seconds + merge_seconds)
    return {
        "write_rows_per_s": rows / write_seconds,
        "merged_rows_per_s": merged,
        "write_seconds": write_seconds,
        "merge_seconds": merge_seconds,
        "batch_p50_ms": percentile(batches, 50) * 1000,
        "batch_p99_ms": percentile(batches, 99) * 1000,
        "visibility_p50_ms": percentile(lags, 50) * 1000,
        "visibility_p99_ms": percentile(lags, 99) * 1000,
        "size_after_stream_mb": result["bytes_after_stream"] / 2**20,
        "size_after_maintenance_mb": result["bytes_after_maintenance"] / 2**20,
        "peak_rss_mb": result["peak_rss_tree_bytes"] / 2**20,
        "correct": all(c["equal"] for r in runs for c in r["checks"].values()),
        "write_rows_per_s_rounds": [rows / sum(r["batch_seconds"]) for r in runs],
    }


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def add_ratios(summaries: dict[str, dict]) -> None:
    """Write and merged rows/s relative to the baseline system, in place."""
    base = summaries.get(BASELINE, {})
    for summary in summaries.values():
        for key in ("write_rows_per_s", "merged_rows_per_s"):
            if summary.get(key) and base.get(key):
                summary[key.replace("rows_per_s", "ratio")] = summary[key] / base[key]


def machine() -> dict:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


# ------------------------------------------------------------------ report


def fmt(value, pattern: str = "{:,.0f}", missing: str = "n/a") -> str:
    return missing if value is None else pattern.format(value)


def render(results: dict) -> str:
    """The Markdown report."""
    w, m, c = results["workload"], results["machine"], results["config"]
    lines = [
        f"## Change stream: {w['stream_rows']:,} changes in {c['batches']} batches of {c['batch_size']:,} "
        f"onto a {w['base_rows']:,}-row base ({c['scale']})",
        "",
        f"{results['date']}; {m['cpu']}, {m['cores']} cores, {m['ram_gb']} GB RAM, {m['os']}, "
        f"Python {m['python']}; load average at start {m['load_average_at_start']} (shared machine: "
        f"compare ratios). Updates {c['update_ratio']:.0%}, deletes {c['delete_ratio']:.0%}, re-inserts "
        f"{c['reinsert_ratio']:.0%} of each batch, the rest new keys; {c['shards']} shards / buckets; "
        f"Spark local[2]. Each system ran {c['rounds']} time(s), order rotated; shown: the round with the "
        f"median apply time.",
        "",
        "| system | write rows/s | x Lance | merged rows/s | x Lance | batch p50 / p99 ms "
        "| visible p50 / p99 ms | MB after stream / maint. | peak RSS MB | correct |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for system, s in results["summary"].items():
        if "error" in s:
            lines.append(f"| {system} | failed: see notes | | | | | | | {s['peak_rss_mb']:,.0f} | |")
            continue
        lines.append(
            f"| {system} | {s['write_rows_per_s']:,.0f} | {fmt(s.get('write_ratio'), '{:.2f}x')} "
            f"| {fmt(s['merged_rows_per_s'])} | {fmt(s.get('merged_ratio'), '{:.2f}x')} "
            f"| {s['batch_p50_ms']:,.0f} / {s['batch_p99_ms']:,.0f} "
            f"| {s['visibility_p50_ms']:,.0f} / {s['visibility_p99_ms']:,.0f} "
            f"| {s['size_after_stream_mb']:,.1f} / {s['size_after_maintenance_mb']:,.1f} "
            f"| {s['peak_rss_mb']:,.0f} | {'yes' if s['correct'] else 'NO'} |"
        )
    lines += [
        "",
        *phase_table(results),
        "",
        *ingest_profile(results),
        "Notes:",
        "",
        *(f"- {system}: {note}" for system, note in results["notes"].items()),
    ]
    return "\n".join(lines)


def phase_table(results: dict) -> list[str]:
    """Seconds outside the stream: warm-up, base load, maintenance phases, full reads."""
    lines = [
        "| system | write rows/s, every round | warm-up s | load base s | maintenance s (phases) "
        "| full read after stream / maint. s |",
        "| --- | --- | ---: | ---: | --- | ---: |",
    ]
    for system, r in results["raw"].items():
        if "error" in r:
            continue
        phases = ", ".join(f"{k} {v:.2f}" for k, v in r["maintenance_seconds"].items()) or "none available"
        rates = ", ".join(f"{x:,.0f}" for x in results["summary"][system]["write_rows_per_s_rounds"])
        lines.append(
            f"| {system} | {rates} | {r['warm_up_seconds']:.1f} | {r['load_base_seconds']:.1f} "
            f"| {phases} | {r['read_after_stream_seconds']:.2f} / {r['read_after_maintenance_seconds']:.2f} |"
        )
    return lines


def ingest_profile(results: dict) -> list[str]:
    """Where the platform's apply calls spend their time (driver-side steps of ``ingest_landing_files``)."""
    lines = []
    for system, r in results["raw"].items():
        if not r.get("ingest_phases_seconds"):
            continue
        calls = len(r["batch_seconds"])
        lines += [
            f"{system}: {calls} call(s) of ingest_landing_files, ms per call",
            "",
            "| step | ms per call |",
            "| --- | ---: |",
            *(f"| {k} | {v / calls * 1000:,.0f} |" for k, v in r["ingest_phases_seconds"].items()),
            "",
        ]
    return lines


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = {k: v for k, v in results["summary"].items() if "error" not in v}
    names = list(ok)
    panels = [
        ("write rows/s", ["write_rows_per_s"]),
        ("merged rows/s (until in the base)", ["merged_rows_per_s"]),
        ("batch latency ms (p50, p99)", ["batch_p50_ms", "batch_p99_ms"]),
        ("visibility ms (p50, p99)", ["visibility_p50_ms", "visibility_p99_ms"]),
        ("peak RSS MB", ["peak_rss_mb"]),
        ("MB on disk (after stream, after maint.)", ["size_after_stream_mb", "size_after_maintenance_mb"]),
    ]
    figure, axes = plt.subplots(2, 3, figsize=(16, 8.5))
    for axis, (title, keys) in zip(axes.flat, panels, strict=False):
        width = 0.8 / len(keys)
        for i, key in enumerate(keys):
            values = [ok[n][key] or 0 for n in names]
            axis.bar(np.arange(len(names)) + i * width, values, width, label=key.split("_")[-2])
        axis.set_title(title)
        axis.set_yscale("log")
        axis.set_xticks(np.arange(len(names)) + width * (len(keys) - 1) / 2, names, rotation=30, ha="right", fontsize=8)
        if len(keys) > 1:
            axis.legend(fontsize=7)
    c = results["config"]
    figure.suptitle(
        f"{c['batches']} batches x {c['batch_size']:,} changes onto a "
        f"{results['workload']['base_rows']:,}-row base ({c['scale']}), {results['date']}"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)


# ------------------------------------------------------------------ the run


def notes(raw: dict, paimon_note: str) -> dict[str, str]:
    found = {}
    if "paimon" in raw:
        found["paimon"] = paimon_note + (
            "; no compaction or snapshot expiry from Python, so readers merge every level-0 file (merged rows/s: n/a)"
        )
    for system, r in raw.items():
        if "error" in r:
            found[system] = "FAILED: " + r["error"].splitlines()[-1][:300]
    return found


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="compare-bench-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "out").mkdir(exist_ok=True)
    load = machine()
    workload, oracle = make_workload(workdir, args)
    print(
        f"[compare] base {workload.base_rows:,} rows, stream {workload.stream_rows:,} changes "
        f"in {len(workload.files)} files under {workdir}",
        flush=True,
    )
    probes = sorted({int(i) for i in np.linspace(0, args.batches - 1, min(args.probes, args.batches))})
    config = {
        "workdir": str(workdir),
        "out": str(workdir / "out"),
        "base": workload.base_path,
        "landing": str(workdir / "landing"),
        "files": workload.files,
        "shards": args.shards,
        "probe_batches": probes,
    }
    paimon, paimon_note = paimon_python() if "paimon" in args.systems else (None, "not run")
    rounds: dict[str, list[dict]] = {system: [] for system in args.systems}
    for round_ in range(args.rounds):
        for system in args.systems[round_ % len(args.systems) :] + args.systems[: round_ % len(args.systems)]:
            python = paimon if system == "paimon" else sys.executable
            rounds[system].append(
                run_checked(system, python, config, workdir, oracle)
                if python
                else {"system": system, "error": paimon_note, "peak_rss_tree_bytes": 0}
            )
    raw = {system: representative(runs) for system, runs in rounds.items()}
    summaries = {system: summarize(r, workload.stream_rows, rounds[system]) for system, r in raw.items()}
    add_ratios(summaries)
    results = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": load,
        "config": {k: v for k, v in vars(args).items() if k not in ("workdir", "systems")},
        "workload": {k: v for k, v in asdict(workload).items() if k != "files"},
        "summary": summaries,
        "notes": notes(raw, paimon_note),
        "raw": raw,
        "other_rounds": {system: [r for r in runs if r is not raw[system]] for system, runs in rounds.items()},
    }
    write_outputs(results, args.scale)
    if not args.keep_workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if all(s.get("correct") for s in summaries.values()) else 1


def write_outputs(results: dict, scale: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    markdown = render(results)
    print(markdown)
    (RESULTS / f"compare-{scale}.json").write_text(json.dumps(results, indent=2) + "\n")
    (RESULTS / f"compare-{scale}.md").write_text(markdown + "\n")
    plot(results, RESULTS / f"compare-{scale}.png")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", choices=sorted(SCALES), default="small")
    parser.add_argument("--base-rows", type=int, help="live keys the base should hold (approximate)")
    parser.add_argument("--batches", type=int, help="batches (landing files) in the stream")
    parser.add_argument("--batch-size", type=int, help="change rows per batch")
    parser.add_argument("--probes", type=int, help="batches after which visibility is measured")
    parser.add_argument("--update-ratio", type=float, default=ChangeStreamSpec.update_ratio)
    parser.add_argument("--delete-ratio", type=float, default=ChangeStreamSpec.delete_ratio)
    parser.add_argument("--reinsert-ratio", type=float, default=ChangeStreamSpec.reinsert_ratio)
    parser.add_argument("--rounds", type=int, help="runs of every system, order rotated; the median is reported")
    parser.add_argument("--shards", type=int, default=4, help="MemWAL shards, and Paimon buckets")
    parser.add_argument("--seed", type=int, default=ChangeStreamSpec.seed)
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=SYSTEMS)
    parser.add_argument("--workdir", help="where data and tables go (default: a new temporary directory)")
    parser.add_argument("--keep-workdir", action="store_true", help="keep tables and logs after the run")
    args = parser.parse_args(argv)
    for key, value in SCALES[args.scale].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


if __name__ == "__main__":
    sys.exit(main())
