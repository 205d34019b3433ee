"""What a Dagster run of this code location costs to operate, before and after a change, side by side.

    .venv/bin/python benchmarks/runs.py                          # before = 6688d86, after = the working tree
    .venv/bin/python benchmarks/runs.py --jobs flush_job merge_job --skip-sensor
    .venv/bin/python benchmarks/runs.py --before <rev> --rows 200000

BEFORE is a git revision checked out with ``git worktree add`` (default
/tmp/runs-before, removed at the end unless ``--keep-worktree``) into its own
venv (``python3 -m venv`` + this venv's ``uv pip install -r requirements.lock``
from that tree), created when missing. AFTER is this working tree with
``.venv``. Each version gets its own scratch directory: a table created
empty with the engine (``LSM_TABLE_URI``), a landing directory
(``LSM_LANDING_DIR``) and a ``DAGSTER_HOME`` holding that version's instance
settings (``deploy/dagster.yaml``, or ``dagster.yaml`` at the root of older
trees).

Measured for both versions, interleaved (before/after for one measurement,
then the next, alternating which goes first) because the machine is shared:

1. ``import definitions`` in a fresh interpreter, cwd = the tree: the
   interpreter's wall time, the import alone, and peak RSS (median of 3),
   with the bytecode cache and again compiling every module from source.
2. Each CLI job, ``dagster job execute -m definitions -j <job>``, on prepared
   state: ``ingest_job`` gets ``--rows`` change rows as 10 Parquet landing files
   (the tree's ``scripts/generate_changes.py``); ``flush_job`` gets a crashed
   writer's WAL in every shard (the engine writes ``--rows``/4 changes, the
   process exits without closing, the WAL files are aged past the flush's
   30 s idle limit); ``merge_job`` gets generations written with
   ``LsmTable.write`` + ``close`` until every shard has 4 pending; ``gc_job``
   runs with zero grace periods (as in ``demo_job``) so it deletes what the
   merge made obsolete; ``quality_job`` and ``demo_job`` run as they are.
   Recorded: wall time of the CLI process; steps = the sum of
   STEP_START -> STEP_SUCCESS/FAILURE over the run's steps (from the
   instance's event log); overhead = wall - steps; CPU seconds and peak RSS
   of the whole process tree (Spark's JVM and step subprocesses included).
3. One merge round launched by the merge sensor: a fresh instance, a table
   with a base and 4 shards of 4 pending generations each; ``flush_sensor``
   and ``gc_schedule`` are stopped with the CLI, then ``dagster-daemon run``
   starts (daemon, code server, run workers). Measured from the daemon's
   start until every run the merge sensor launched has finished (and no new
   one appeared for 2 s): runs, each run's queue (ENQUEUED -> STARTING), launch
   (STARTING -> RUN_START: the run worker's start-up) and run time
   (RUN_START -> end) and step time,
   the round's wall time, CPU seconds (split at the first run's creation:
   daemon and code-server start-up before it) and peak RSS of the tree.

How the process tree is measured: this process becomes a child subreaper
(Linux ``prctl``), so processes that outlive their parent (a JVM, a run
worker) are re-parented here and reaped once they exit; CPU seconds are
``getrusage(RUSAGE_CHILDREN)`` deltas, which then cover every process of the
tree. Peak RSS is the largest sum of RSS over all descendants, sampled every
100 ms (pages shared between processes count in each).

Bytecode: every process of a version reads a bytecode cache under its
scratch directory (``PYTHONPYCACHEPREFIX``), filled with ``compileall``
before anything is measured, as an installed deployment has it; nothing is
written into the trees or venvs. (An environment with
``PYTHONDONTWRITEBYTECODE`` and no ``__pycache__`` would otherwise compile
every module in every process.)

Results: a table on stdout, ``benchmarks/results/runs.json`` (raw numbers,
machine, versions) and ``benchmarks/results/runs.md`` (the table and the
targets). A full run takes about 15-20 minutes on 2 cores, plus the first
creation of the before venv.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, RunsFilter
from dagster._core.storage.dagster_run import FINISHED_STATUSES, RunRecord
from dagster._core.storage.tags import SENSOR_NAME_TAG

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DEFAULT_BEFORE = "6688d86"
DEFAULT_WORKTREE = Path("/tmp/runs-before")
JOBS = ("ingest_job", "flush_job", "merge_job", "gc_job", "quality_job", "demo_job")
NUM_SHARDS = 4
PENDING_GENERATIONS = 4  # the merge sensor's generation trigger
IMPORT_ROUNDS = 3
JOB_TIMEOUT_S = 600
SENSOR_TIMEOUT_S = 600
SETTLE_S = 2.0  # a sensor round is over when no new run appeared for this long
MB = 1 << 20

Result = dict[str, Any]
"""Raw numbers of one measurement, as written to runs.json."""

# ------------------------------------------------------------------ versions


@dataclass(frozen=True)
class Version:
    """One side of the comparison: a source tree, its venv, and its own scratch state."""

    name: str
    tree: Path
    venv: Path
    scratch: Path

    def bin(self, program: str) -> str:
        return str(self.venv / "bin" / program)

    @property
    def instance_yaml(self) -> Path:
        deployed = self.tree / "deploy" / "dagster.yaml"
        return deployed if deployed.exists() else self.tree / "dagster.yaml"

    @property
    def changegen_module(self) -> str:
        moved = self.tree / "resources" / "lsm" / "testing" / "changegen.py"
        return "resources.lsm.testing.changegen" if moved.exists() else "resources.lsm.changegen"

    def env(self, table: Path, home: Path | None = None, bytecode_cache: bool = True) -> dict[str, str]:
        """The environment of this version's processes: its venv first on PATH, its table and instance.

        Bytecode lives under the scratch directory (``PYTHONPYCACHEPREFIX``),
        so nothing is written into the trees or venvs; without
        ``bytecode_cache`` every import compiles its source.
        """
        skip = ("LSM_", "DAGSTER_", "PYSPARK_", "PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")
        env = {k: v for k, v in os.environ.items() if not k.startswith(skip)}
        env.update(
            PATH=f"{self.venv / 'bin'}:{env.get('PATH', '')}",
            VIRTUAL_ENV=str(self.venv),
            PYTHONPATH=str(self.tree),
            LSM_TABLE_URI=str(table),
            LSM_LANDING_DIR=str(self.scratch / "landing"),
            PYTHONPYCACHEPREFIX=str(self.scratch / ("pycache" if bytecode_cache else "no-pycache")),
        )
        if not bytecode_cache:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        if home is not None:
            env["DAGSTER_HOME"] = str(home)
        return env

    def compile_bytecode(self) -> None:
        """Fill the bytecode cache for the venv and the tree, as an installed deployment has it."""
        run(
            [self.bin("python"), "-m", "compileall", "-q", "-j", "0", str(self.venv / "lib"), str(self.tree)],
            cwd=self.tree,
            env=self.env(self.scratch / "table.lance"),
        )

    def new_home(self, label: str) -> Path:
        """A DAGSTER_HOME with this version's instance settings and initialized storage."""
        home = self.scratch / f"home-{label}"
        home.mkdir(parents=True)
        shutil.copy(self.instance_yaml, home / "dagster.yaml")
        with DagsterInstance.from_config(str(home)) as instance:
            instance.get_run_records(limit=1)
        return home


def ensure_before(rev: str, worktree: Path) -> Path:
    """Check ``rev`` out at ``worktree`` with its pinned packages in ``worktree/.venv``; return the venv."""
    if not worktree.exists():
        run(["git", "worktree", "add", "--detach", str(worktree), rev], cwd=REPO)
    wanted = run(["git", "rev-parse", f"{rev}^{{commit}}"], cwd=REPO).strip()
    if run(["git", "rev-parse", "HEAD"], cwd=worktree).strip() != wanted:
        raise SystemExit(f"{worktree} is not at {rev}: remove it (git worktree remove --force {worktree})")
    venv = worktree / ".venv"
    if not (venv / "bin" / "dagster").exists():
        uv = str(REPO / ".venv" / "bin" / "uv")
        run(["python3", "-m", "venv", str(venv)], cwd=worktree)
        run(
            [uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), "-r", "requirements.lock"],
            cwd=worktree,
        )
        run(
            [uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), "--no-deps", "-e", "."], cwd=worktree
        )
    return venv


def remove_worktree(worktree: Path) -> None:
    run(["git", "worktree", "remove", "--force", str(worktree)], cwd=REPO)


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 900) -> str:
    """Run a setup command (not measured); raise with its output if it fails."""
    done = subprocess.run(cmd, cwd=cwd, env=env, timeout=timeout, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done.stdout


def package_versions(version: Version) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json, platform; print(json.dumps({'python': platform.python_version(), "
        "**{p: m.version(p) for p in ('dagster', 'pylance', 'pyspark', 'great-expectations')}}))"
    )
    versions: dict[str, str] = json.loads(run([version.bin("python"), "-c", code], cwd=version.tree))
    return versions


# ------------------------------------------------------- process-tree usage


@dataclass
class Usage:
    """What one process tree cost: wall seconds, CPU seconds, peak RSS in bytes; the 1-minute load at its start."""

    wall: float = 0.0
    cpu: float = 0.0
    peak_rss: int = 0
    returncode: int | None = None
    load: float = 0.0


def become_subreaper() -> None:
    """Orphaned descendants are re-parented to this process (so their CPU time is counted when reaped)."""
    pr_set_child_subreaper = 36
    if ctypes.CDLL(None, use_errno=True).prctl(pr_set_child_subreaper, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def children_cpu() -> float:
    usage = os.times()
    return usage.children_user + usage.children_system


def live_tree_cpu() -> float:
    """CPU seconds of the descendants alive now (their own and their reaped children's)."""
    total = 0.0
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            t = proc.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


class TreeSampler:
    """Samples the summed RSS of this process's descendants every ``interval`` seconds."""

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.is_set():
            rss = 0
            for proc in psutil.Process().children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    rss += proc.memory_info().rss
            self.peak_rss = max(self.peak_rss, rss)
            self._stop.wait(self.interval)


def reap_descendants(timeout: float) -> None:
    """Wait for every remaining descendant to exit (killing them after ``timeout``), reaping re-parented ones."""
    deadline = time.monotonic() + timeout
    while True:
        orphans = psutil.Process().children()
        if not orphans:
            return
        if time.monotonic() > deadline:
            for proc in psutil.Process().children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        for proc in orphans:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(proc.pid, os.WNOHANG)
        time.sleep(0.05)


def measure(cmd: list[str], cwd: Path, env: dict[str, str], log: Path, timeout: float) -> Usage:
    """Run ``cmd`` to completion; wall time until it exits, CPU and peak RSS of its whole tree."""
    cpu_before, load = children_cpu(), os.getloadavg()[0]
    with TreeSampler() as sampler, log.open("w") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            returncode = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            returncode = proc.wait()
        wall = time.perf_counter() - start
        reap_descendants(timeout=60)
    cpu = children_cpu() - cpu_before
    return Usage(wall=wall, cpu=cpu, peak_rss=sampler.peak_rss, returncode=returncode, load=load)


# ----------------------------------------------------------- prepared state

# Run by each version's interpreter in its tree: the engine's API is the same in both.
_PREPARE = """
import os, sys, time
from importlib import import_module
from resources.lsm import LsmTable

uri, changegen, mode, rows, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
gen = import_module(changegen)
batches = gen.generate_changes(gen.ChangeStreamSpec(num_keys=rows, num_batches=1000, batch_size=rows // 4, seed=seed))
if not os.path.exists(uri):
    LsmTable.create(uri, gen.EVENTS_SCHEMA, ["id"], num_shards=int(sys.argv[6])).close()

def pending():
    return min(len(s.pending_generations) for s in LsmTable.open(uri).shards())

# mode "create": the empty table only
if mode == "base":            # rows changes merged into the base
    table = LsmTable.open(uri)
    for _ in range(4):
        table.write(next(batches))
    table.close()
    table.compact()
elif mode == "generations":   # write + close until every shard has that many pending generations
    while pending() < int(sys.argv[7]):
        table = LsmTable.open(uri)
        table.write(next(batches))
        table.close()
elif mode == "crashed":       # a writer dies after its rows are durable; its WAL is untouched for 2 minutes
    LsmTable.open(uri).write(next(batches))
    aged = time.time() - 120
    for folder, _, files in os.walk(os.path.join(uri, "_mem_wal")):
        for name in files:
            os.utime(os.path.join(folder, name), (aged, aged))
    os._exit(0)
"""


def prepare_table(version: Version, table: Path, mode: str, rows: int, seed: int) -> None:
    cmd = [
        version.bin("python"),
        "-c",
        _PREPARE,
        str(table),
        version.changegen_module,
        mode,
        str(rows),
        str(seed),
        str(NUM_SHARDS),
        str(PENDING_GENERATIONS),
    ]
    run(cmd, cwd=version.tree, env=version.env(table))


def prepare_landing(version: Version, table: Path, rows: int) -> None:
    files = 10
    cmd = [
        version.bin("python"),
        "scripts/generate_changes.py",
        "--landing-dir",
        str(version.scratch / "landing"),
        "--num-keys",
        str(rows // 2),
        "--num-batches",
        str(files),
        "--batch-size",
        str(rows // files),
        "--prefix",
        f"bench-{time.time_ns()}",
    ]
    run(cmd, cwd=version.tree, env=version.env(table))


Preparation = Callable[[Version, Path, int], None]
PREPARATIONS: dict[str, Preparation] = {
    "ingest_job": prepare_landing,
    "flush_job": lambda v, table, rows: prepare_table(v, table, "crashed", rows, seed=11),
    "merge_job": lambda v, table, rows: prepare_table(v, table, "generations", rows, seed=13),
}

GC_NOW = {
    "ops": {
        "garbage_collected": {
            "config": {"orphan_grace_seconds": 0, "wal_grace_seconds": 0, "version_retention_hours": 0}
        }
    }
}
RUN_CONFIG: dict[str, Result] = {"gc_job": GC_NOW}

# ------------------------------------------------------------- run records

STEP_EVENTS = {DagsterEventType.STEP_START, DagsterEventType.STEP_SUCCESS, DagsterEventType.STEP_FAILURE}
RUN_EVENTS = {DagsterEventType.RUN_ENQUEUED, DagsterEventType.RUN_STARTING}


def step_seconds(instance: DagsterInstance, run_id: str) -> dict[str, float]:
    """Seconds from STEP_START to STEP_SUCCESS/FAILURE per step key."""
    starts: dict[str, float] = {}
    durations: dict[str, float] = {}
    for entry in instance.all_logs(run_id, of_type=STEP_EVENTS):
        key = entry.step_key or "?"
        if entry.dagster_event_type == DagsterEventType.STEP_START:
            starts[key] = entry.timestamp
        elif key in starts:
            durations[key] = entry.timestamp - starts[key]
    return durations


def run_summary(instance: DagsterInstance, record: RunRecord) -> Result:
    """A run's status, lifecycle times (queue, launch, run) and step times, from its record and events."""
    run_id = record.dagster_run.run_id
    events = {e.dagster_event_type: e.timestamp for e in instance.all_logs(run_id, of_type=RUN_EVENTS)}
    created = record.create_timestamp.timestamp()
    enqueued = events.get(DagsterEventType.RUN_ENQUEUED, created)
    launched = events.get(DagsterEventType.RUN_STARTING, enqueued)
    started = record.start_time or launched
    steps = step_seconds(instance, run_id)
    return {
        "run_id": run_id,
        "job": record.dagster_run.job_name,
        "status": record.dagster_run.status.value,
        "tags": {k: v for k, v in record.dagster_run.tags.items() if k.startswith("lsm/")},
        "created": created,
        "end": record.end_time,
        "queue_s": launched - enqueued,
        "launch_s": started - launched,
        "run_s": (record.end_time or started) - started,
        "steps_s": sum(steps.values()),
        "steps": steps,
    }


# ------------------------------------------------------------ measurements


@dataclass
class Side:
    """A version with the table and instance its CLI jobs share."""

    version: Version
    table: Path
    home: Path
    results: Result = field(default_factory=dict)


def new_side(version: Version, rows: int) -> Side:
    """The version's empty table (created with the engine, as a deployment creates it once) and instance."""
    table = version.scratch / "table.lance"
    prepare_table(version, table, "create", rows, seed=0)
    return Side(version, table, version.new_home("jobs"))


def measure_import(version: Version, bytecode_cache: bool) -> Result:
    """``import definitions`` in a fresh interpreter: its wall time, the import's, and peak RSS.

    Peak RSS is the interpreter's VmHWM (``ru_maxrss`` would report this
    process's size, the high-water mark a forked child inherits).
    """
    code = (
        "import re, time; t = time.perf_counter(); import definitions; print(time.perf_counter() - t, "
        "int(re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read())[1]) * 1024)"
    )
    start = time.perf_counter()
    env = version.env(version.scratch / "table.lance", bytecode_cache=bytecode_cache)
    out = run([version.bin("python"), "-c", code], cwd=version.tree, env=env)
    wall = time.perf_counter() - start
    import_s, peak_rss = out.split()[-2:]
    return {"wall_s": wall, "import_s": float(import_s), "peak_rss": int(peak_rss)}


def measure_job(side: Side, job: str, rows: int) -> Result:
    version = side.version
    prepare = PREPARATIONS.get(job)
    if prepare:
        prepare(version, side.table, rows)
    cmd = [version.bin("dagster"), "job", "execute", "-m", "definitions", "-j", job]
    if job in RUN_CONFIG:
        config = version.scratch / f"{job}.yaml"
        config.write_text(json.dumps(RUN_CONFIG[job]))
        cmd += ["-c", str(config)]
    log = version.scratch / f"{job}.log"
    usage = measure(cmd, version.tree, version.env(side.table, side.home), log, JOB_TIMEOUT_S)
    with DagsterInstance.from_config(str(side.home)) as instance:
        records = instance.get_run_records(RunsFilter(job_name=job), limit=1)
        run = run_summary(instance, records[0]) if records else None
    if usage.returncode or not run or run["status"] != DagsterRunStatus.SUCCESS.value:
        print(f"[runs] {version.name} {job} did not succeed; end of its output:\n{log.read_text()[-4000:]}")
    steps = run["steps_s"] if run else 0.0
    return {**asdict(usage), "steps_s": steps, "overhead_s": usage.wall - steps, "run": run}


def stop_other_instigators(version: Version, home: Path, table: Path) -> None:
    """Only the merge sensor may act in the sensor round: stop the flush sensor and the GC schedule."""
    env = version.env(table, home)
    run([version.bin("dagster"), "sensor", "stop", "flush_sensor", "-w", "workspace.yaml"], cwd=version.tree, env=env)
    run([version.bin("dagster"), "schedule", "stop", "gc_schedule", "-w", "workspace.yaml"], cwd=version.tree, env=env)


def sensor_round(version: Version, rows: int) -> Result:
    """Start the daemon on a table that needs a merge in every shard; measure until the merge runs finished."""
    table = version.scratch / "sensor.lance"
    prepare_table(version, table, "base", rows, seed=17)
    prepare_table(version, table, "generations", rows, seed=19)
    home = version.new_home("sensor")
    stop_other_instigators(version, home, table)
    log = version.scratch / "daemon.log"
    cpu_before, load = children_cpu(), os.getloadavg()[0]
    with TreeSampler() as sampler, DagsterInstance.from_config(str(home)) as instance, log.open("w") as out:
        start = time.time()
        daemon = subprocess.Popen(
            [version.bin("dagster-daemon"), "run", "-w", "workspace.yaml"],
            cwd=version.tree,
            env=version.env(table, home),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            records, first_run_cpu, timed_out = _await_merge_runs(instance, start)
        finally:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait()
            reap_descendants(timeout=30)
        runs = [run_summary(instance, r) for r in records]
    cpu = children_cpu() - cpu_before
    startup_cpu = first_run_cpu - cpu_before
    if timed_out or any(r["status"] != DagsterRunStatus.SUCCESS.value for r in runs):
        print(
            f"[runs] {version.name} merge round: timed out or failed runs; end of the daemon's output:\n"
            f"{log.read_text()[-4000:]}"
        )
    first_created = min((r["created"] for r in runs), default=start)
    last_end = max((r["end"] or start for r in runs), default=start)
    return {
        "runs": runs,
        "num_runs": len(runs),
        "timed_out": timed_out,
        "statuses": sorted({r["status"] for r in runs}),
        "wall_s": last_end - start,
        "first_run_after_s": first_created - start,
        "cpu_s": cpu,
        "startup_cpu_s": startup_cpu,
        "runs_cpu_s": cpu - startup_cpu,
        "peak_rss": sampler.peak_rss,
        "load": load,
        "steps_s": sum(r["steps_s"] for r in runs),
        "run_s": sum(r["run_s"] for r in runs),
        "queue_s": sum(r["queue_s"] for r in runs),
        "launch_s": sum(r["launch_s"] for r in runs),
    }


def _await_merge_runs(instance: DagsterInstance, start: float) -> tuple[list[RunRecord], float, bool]:
    """Poll until the merge sensor's runs all finished and no new one appeared for ``SETTLE_S``.

    Returns the run records, ``children_cpu() + live_tree_cpu()`` when the
    first run was created (daemon and code-server start-up, the first
    ticks), and whether it timed out.
    """
    merge_runs = RunsFilter(tags={SENSOR_NAME_TAG: "merge_sensor"})
    startup_cpu, seen, settled_since = 0.0, 0, time.time()
    while time.time() - start < SENSOR_TIMEOUT_S:
        records = instance.get_run_records(merge_runs)
        if records and not seen:
            startup_cpu = children_cpu() + live_tree_cpu()
        if len(records) != seen:
            seen, settled_since = len(records), time.time()
        done = records and all(r.dagster_run.status in FINISHED_STATUSES for r in records)
        if done and time.time() - settled_since >= SETTLE_S:
            return list(records), startup_cpu, False
        time.sleep(0.2)
    return list(instance.get_run_records(merge_runs)), startup_cpu, True


# ------------------------------------------------------------------ report

TARGETS = [
    # (label, where in the results, limit, unit)
    ("flush_job overhead", ("jobs", "flush_job", "overhead_s"), 5.0, "s"),
    ("merge_job overhead", ("jobs", "merge_job", "overhead_s"), 5.0, "s"),
    ("gc_job overhead", ("jobs", "gc_job", "overhead_s"), 5.0, "s"),
    ("4-shard merge round CPU", ("sensor", "cpu_s"), 15.0, "CPU-s"),
    ("4-shard merge round peak RSS", ("sensor", "peak_rss"), 1.5 * 1024 * MB, "bytes"),
    ("demo_job wall", ("jobs", "demo_job", "wall"), 45.0, "s"),
    ("import definitions wall", ("import", "wall_s"), 2.5, "s"),
    ("import definitions peak RSS", ("import", "peak_rss"), 200 * MB, "bytes"),
]


def _lookup(results: Result, path: tuple[str, ...]) -> float | None:
    value: object = results
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value if isinstance(value, (int, float)) else None


def target_rows(before: Result, after: Result) -> list[Result]:
    rows = []
    for label, path, limit, unit in TARGETS:
        b, a = _lookup(before, path), _lookup(after, path)
        rows.append(
            {
                "target": label,
                "limit": limit,
                "unit": unit,
                "before": b,
                "after": a,
                "met": None if a is None else a <= limit,
            }
        )
    return rows


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "bytes":
        return f"{value / MB:,.0f} MB"
    if unit == "CPU-s":
        return f"{value:.1f} CPU-s"
    return f"{value:.1f} s"


def _change(before: Result, after: Result, key: str) -> str:
    """``before → after`` for one number of two results: bytes in MB, CPU and load bare, the rest in seconds."""
    if key == "peak_rss":
        return f"{before[key] / MB:,.0f} → {after[key] / MB:,.0f} MB"
    return f"{before[key]:.1f} → {after[key]:.1f}" + ("" if key in ("cpu", "load") else " s")


def import_table(before: Result, after: Result) -> list[str]:
    lines = [
        f"| `import definitions` (median of {IMPORT_ROUNDS}) | interpreter wall | the import | peak RSS |",
        "| --- | ---: | ---: | ---: |",
    ]
    for key, label in (("import", "bytecode cached"), ("import_from_source", "every module compiled from source")):
        cells = [_change(before[key], after[key], k) for k in ("wall_s", "import_s", "peak_rss")]
        lines.append(f"| {label} | {' | '.join(cells)} |")
    return lines


def job_table(before: Result, after: Result, jobs: Iterable[str]) -> list[str]:
    lines = [
        "| job (before → after) | wall | steps | overhead | CPU-s | peak RSS | load at start |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for job in jobs:
        b, a = before["jobs"][job], after["jobs"][job]
        failed = [
            f"{side} {r['run']['status'] if r['run'] else 'no run'}"
            for side, r in (("before", b), ("after", a))
            if not r["run"] or r["run"]["status"] != DagsterRunStatus.SUCCESS.value
        ]
        note = f" ({', '.join(failed)})" if failed else ""
        cells = [_change(b, a, k) for k in ("wall", "steps_s", "overhead_s", "cpu", "peak_rss", "load")]
        lines.append(f"| `{job}`{note} | {' | '.join(cells)} |")
    return lines


def sensor_table(before: Result, after: Result) -> list[str]:
    lines = ["| merge round (sensor → runs done) | before | after |", "| --- | ---: | ---: |"]
    rows: list[tuple[str, Callable[[Result], str]]] = [
        ("runs launched (statuses)", lambda s: f"{s['num_runs']} ({', '.join(s['statuses'])})"),
        ("daemon start → last run done", lambda s: f"{s['wall_s']:.1f} s"),
        ("daemon start → first run created", lambda s: f"{s['first_run_after_s']:.1f} s"),
        (
            "queue / launch / run, summed over runs",
            lambda s: f"{s['queue_s']:.1f} / {s['launch_s']:.1f} / {s['run_s']:.1f} s",
        ),
        ("steps, summed over runs", lambda s: f"{s['steps_s']:.1f} s"),
        (
            "CPU: total (start-up before the first run + rest)",
            lambda s: f"{s['cpu_s']:.1f} ({s['startup_cpu_s']:.1f} + {s['runs_cpu_s']:.1f}) CPU-s",
        ),
        ("peak RSS of the tree", lambda s: f"{s['peak_rss'] / MB:,.0f} MB"),
        ("1-minute load average at the start", lambda s: f"{s['load']:.1f}"),
    ]
    for label, show in rows:
        lines.append(f"| {label} | {show(before['sensor'])} | {show(after['sensor'])} |")
    return lines


def targets_table(targets: list[Result]) -> list[str]:
    lines = ["| target | limit | before | after | after meets it |", "| --- | ---: | ---: | ---: | --- |"]
    for t in targets:
        met = "-" if t["met"] is None else ("met" if t["met"] else "**not met**")
        lines.append(
            f"| {t['target']} | {_fmt(t['limit'], t['unit'])} | {_fmt(t['before'], t['unit'])} "
            f"| {_fmt(t['after'], t['unit'])} | {met} |"
        )
    return lines


def markdown(report: Result) -> str:
    before, after, machine = report["before"], report["after"], report["machine"]
    after_rev = f"`{report['after_rev']}`"
    if report["after_rev_at_end"] != report["after_rev"]:
        after_rev += f" (`{report['after_rev_at_end']}` by the end: the tree changed during the run)"
    lines = [
        "# What a Dagster run costs to operate: before and after",
        "",
        f"`benchmarks/runs.py --rows {report['rows']}` on {machine['date']}: before = `{report['before_rev']}`, "
        f"after = {after_rev}, measured alternately. {machine['nproc']} cores, load average "
        f"{machine['load_before'][0]:.1f} at the start / {machine['load_after'][0]:.1f} at the end (a shared "
        "machine: read the differences, not the absolute numbers). Every process reads a bytecode cache filled "
        "beforehand, as an installed deployment has it.",
        "",
        *import_table(before, after),
        "",
        "Wall = the `dagster job execute` process; steps = STEP_START → end summed over the run's steps; "
        "overhead = wall - steps; CPU seconds and peak RSS = the whole process tree (step processes, Spark's JVM); "
        "load at start = the machine's 1-minute load average when the job started.",
        "",
        *job_table(before, after, report["jobs"]),
        "",
    ]
    if "sensor" in before and "sensor" in after:
        lines += [
            "One merge round launched by the merge sensor through `dagster-daemon run` (4 shards with "
            f"{PENDING_GENERATIONS} pending generations each, fresh instance; daemon, code server and run "
            "workers counted):",
            "",
            *sensor_table(before, after),
            "",
        ]
    lines += ["Targets (for after):", "", *targets_table(report["targets"]), ""]
    return "\n".join(lines)


# -------------------------------------------------------------------- main


def machine_info(load_before: tuple[float, float, float]) -> Result:
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "memory_gb": round(psutil.virtual_memory().total / 1e9, 1),
        "platform": platform.platform(),
        "load_before": load_before,
        "load_after": os.getloadavg(),
    }


def after_revision() -> str:
    head = run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO).strip()
    dirty = run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO).strip()
    return f"{head} + working tree" if dirty else head


def interleaved(sides: list[Side], index: int) -> list[Side]:
    """Both sides, the first one alternating with ``index``."""
    return sides if index % 2 == 0 else sides[::-1]


def median_import(samples: list[Result]) -> Result:
    return {key: statistics.median(s[key] for s in samples) for key in samples[0]} | {"samples": samples}


def measure_imports(sides: list[Side]) -> None:
    """``import definitions`` with the bytecode cache (``import``) and compiling every module from source."""
    for key, cached in (("import", True), ("import_from_source", False)):
        samples: dict[str, list[Result]] = {side.version.name: [] for side in sides}
        for i in range(IMPORT_ROUNDS):
            for side in interleaved(sides, i):
                samples[side.version.name].append(measure_import(side.version, cached))
        for side in sides:
            side.results[key] = median_import(samples[side.version.name])


def measure_all(sides: list[Side], jobs: list[str], rows: int, sensor: bool) -> None:
    measure_imports(sides)
    for side in sides:
        side.results["jobs"] = {}
    for i, job in enumerate(jobs):
        for side in interleaved(sides, i):
            print(f"[runs] {side.version.name}: {job}", flush=True)
            side.results["jobs"][job] = measure_job(side, job, rows)
    if sensor:
        for side in sides:
            print(f"[runs] {side.version.name}: merge sensor round", flush=True)
            side.results["sensor"] = sensor_round(side.version, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--before", default=DEFAULT_BEFORE, help="git revision to compare with (default %(default)s)")
    parser.add_argument("--jobs", nargs="+", choices=JOBS, default=list(JOBS), help="CLI jobs to measure")
    parser.add_argument("--skip-sensor", action="store_true", help="skip the daemon's merge round")
    parser.add_argument("--rows", type=int, default=100_000, help="change rows per ingestion (default %(default)s)")
    parser.add_argument("--worktree", type=Path, default=DEFAULT_WORKTREE, help="where BEFORE is checked out")
    parser.add_argument("--keep-worktree", action="store_true", help="keep BEFORE's worktree and venv for next time")
    args = parser.parse_args()

    become_subreaper()
    load_before = os.getloadavg()
    before_venv = ensure_before(args.before, args.worktree)
    after_rev = after_revision()
    scratch = Path(tempfile.mkdtemp(prefix="runs-"))
    try:
        versions = [
            Version("before", args.worktree, before_venv, scratch / "before"),
            Version("after", REPO, REPO / ".venv", scratch / "after"),
        ]
        for v in versions:
            (v.scratch / "landing").mkdir(parents=True)
            v.compile_bytecode()
        sides = [new_side(v, args.rows) for v in versions]
        measure_all(sides, args.jobs, args.rows, not args.skip_sensor)
        report = {
            "rows": args.rows,
            "jobs": args.jobs,
            "before_rev": args.before,
            "after_rev": after_rev,
            "after_rev_at_end": after_revision(),
            "versions": {v.name: package_versions(v) for v in versions},
            "before": sides[0].results,
            "after": sides[1].results,
            "targets": target_rows(sides[0].results, sides[1].results),
            "machine": machine_info(load_before),
        }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if not args.keep_worktree:
            remove_worktree(args.worktree)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "runs.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    text = markdown(report)
    (RESULTS / "runs.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
