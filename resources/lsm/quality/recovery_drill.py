"""Recovery drill: SIGKILL a writer mid-stream, recover, and prove nothing acknowledged was lost.

On a scratch table (the caller's directory) that starts from a bounded sample
of the table's merged view (``DrillConfig.sample_rows``, see :mod:`.scratch`),
:func:`run_drill`:

1. generates change batches for the table's schema (each key at most once
   per batch; existing and new keys; upserts and deletes);
2. starts a child process (``python -m resources.lsm.quality.recovery_drill``) that
   writes them in order through :meth:`LsmTable.write`, appends a batch's
   number to the acknowledgement log only after ``write`` returned, and
   closes its writers every ``batches_per_generation`` batches, so every
   shard flushes a new generation;
3. SIGKILLs the child at a random moment after at least two generations were
   flushed (so the recovery flush makes a third);
4. verifies the recovery state (:mod:`.recovery_checks`), reopens the shards,
   replays and flushes the WAL, merges every generation into the base;
5. compares the merged view with the oracle, and checks that the batches
   acknowledged since the child's last close were found in the WAL.

What can be asserted: batches are written one after another, so the batches
in the log are a prefix ``0..a-1`` and every one of them must be applied
exactly once; batch ``a`` (in flight at the kill, or written but not yet
logged) may be applied or not, key by key: each of its keys is in either the
state before it or after it, never a mix of columns; batches after ``a`` never
started and must be absent. Rows the drill did not touch must not change, and
no key may appear twice in the merged view or in the base table.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from ..format.schema import DELETE, OP_COLUMN
from ..table import LsmTable
from .recovery_checks import ShardRecovery, verify_shards
from .scratch import DEFAULT_SAMPLE_ROWS, key_pool, scratch_sample, synthetic_changes

_PROJECT_ROOT = Path(__file__).resolve().parents[3]
Key = tuple[object, ...]
State = dict[Key, dict[str, object] | None]  # key -> row, or None when the key is absent


@dataclass(frozen=True)
class DrillConfig:
    """Shape of one drill. ``seed`` makes the batches and the kill moment reproducible.

    ``sample_rows`` bounds the scratch table's base (rows of the source's
    merged view): the drill's memory and time follow it and the batches, not
    the source's size. The oracle holds the sample and the batches.
    """

    batches: int = 24
    batch_size: int = 40
    batches_per_generation: int = 3
    existing_keys: int = 100
    new_keys: int = 100
    delete_ratio: float = 0.25
    max_kill_jitter_seconds: float = 0.05
    timeout_seconds: float = 120.0
    seed: int = 0
    sample_rows: int = DEFAULT_SAMPLE_ROWS


@dataclass(frozen=True)
class DrillReport:
    """What was killed when, what recovery found and replayed, and the verdict.

    ``violations`` lists every broken guarantee (empty when ``passed``).
    """

    seed: int
    killed: bool
    killed_after_seconds: float
    batches_acknowledged: int
    batches_total: int
    in_flight_batch: int | None
    in_flight_keys_applied: int
    batches_only_in_wal: int
    rows_replayed: int
    generations_merged: int
    keys_verified: int
    deleted_keys_verified: int
    rows_before: int
    rows_after: int
    findings_before_recovery: tuple[str, ...]
    violations: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.violations


def run_drill(table: LsmTable, scratch_dir: str, config: DrillConfig = DrillConfig()) -> DrillReport:
    """Run the drill on a scratch sample of ``table`` made under ``scratch_dir``; ``table`` is not written."""
    rng = np.random.default_rng(config.seed)
    os.makedirs(scratch_dir, exist_ok=True)
    copy = scratch_sample(table, os.path.join(scratch_dir, "table.lance"), config.sample_rows)
    before = _state(copy, copy.read())
    existing = pa.table(
        {k: pa.array([key[i] for key in before], copy.schema.field(k).type) for i, k in enumerate(copy.primary_key)}
    )
    pool = key_pool(copy, existing, config.new_keys, rng, config.existing_keys)
    batches = [
        synthetic_changes(
            copy,
            pool.take(rng.choice(pool.num_rows, config.batch_size, replace=False)),
            config.delete_ratio,
            rng,
            f"batch{i}",
        )
        for i in range(config.batches)
    ]
    _write_batches(batches, os.path.join(scratch_dir, "batches.arrow"))
    # After two closes and at least one more acknowledged batch: the WAL then holds rows a replay must flush,
    # so the merge sees three generations per shard however the kill lands (right after a close, the tail is empty).
    kill_after = int(rng.integers(2 * config.batches_per_generation + 1, config.batches))
    killed, elapsed = _run_and_kill(
        copy.uri, scratch_dir, config, kill_after, float(rng.uniform(0, config.max_kill_jitter_seconds))
    )
    acknowledged = _acknowledged(os.path.join(scratch_dir, "acks.log"))

    recovered = LsmTable.open(copy.uri)
    findings = verify_shards(recovered.handle)
    recovered.flush()
    merged = recovered.compact()
    return _verdict(
        recovered,
        config,
        before,
        batches,
        acknowledged,
        killed,
        elapsed,
        findings,
        min(len(s.generations_merged) for s in merged.shards),
    )


def _run_and_kill(
    uri: str, scratch_dir: str, config: DrillConfig, kill_after: int, jitter: float
) -> tuple[bool, float]:
    """Start the writer child; SIGKILL it ``jitter`` seconds after ``kill_after`` acks.

    Returns whether it was killed (it may finish first) and when, in seconds after start.
    """
    ack_path, log_path = os.path.join(scratch_dir, "acks.log"), os.path.join(scratch_dir, "writer.log")
    started = time.monotonic()
    with open(log_path, "wb") as log:  # a file, not a pipe: a full pipe would stall the child
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "resources.lsm.quality.recovery_drill",
                uri,
                os.path.join(scratch_dir, "batches.arrow"),
                ack_path,
                str(config.batches_per_generation),
            ],
            cwd=_PROJECT_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        while len(_acknowledged(ack_path)) < kill_after and child.poll() is None:
            if time.monotonic() - started > config.timeout_seconds:
                raise TimeoutError(
                    f"drill writer acknowledged only {len(_acknowledged(ack_path))} batches "
                    f"in {config.timeout_seconds}s"
                )
            time.sleep(0.002)
        time.sleep(jitter)
        killed = child.poll() is None
        if killed:
            child.send_signal(signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
    if not killed and child.returncode != 0:
        raise RuntimeError(f"drill writer failed (exit {child.returncode}), see {log_path}")
    return killed, time.monotonic() - started


def _verdict(
    table: LsmTable,
    config: DrillConfig,
    before: State,
    batches: list[pa.Table],
    acknowledged: list[int],
    killed: bool,
    elapsed: float,
    findings: list[ShardRecovery],
    generations_merged: int,
) -> DrillReport:
    violations = (
        [f"acknowledgement log {acknowledged[:10]}... is not the prefix 0..{len(acknowledged) - 1}"]
        if acknowledged != list(range(len(acknowledged)))
        else []
    )
    done = len(acknowledged)
    without = _apply(table, before, batches[:done])
    in_flight = done if done < len(batches) else None
    with_in_flight = _apply(table, without, batches[done : done + 1])
    view = table.read()
    after = _state(table, view, violations)
    applied = 0
    keys = set(without) | set(with_in_flight) | set(after)
    for key in keys:
        actual = after.get(key)
        if actual == without.get(key):
            continue
        if in_flight is not None and actual == with_in_flight.get(key):
            applied += 1
            continue
        violations.append(f"key {key}: {actual} is neither {without.get(key)} nor {with_in_flight.get(key)}")
    _state(table, table.dataset().to_table(columns=list(table.primary_key)), violations, "base table")
    # Batches acknowledged after the child's last close exist only in the WAL.
    batches_in_wal = done % config.batches_per_generation if killed else 0
    rows_replayed = sum(f.wal_rows for f in findings)
    if rows_replayed < batches_in_wal * config.batch_size:
        violations.append(
            f"{batches_in_wal} acknowledged batches were only in the WAL, "
            f"but recovery found {rows_replayed} rows to replay"
        )
    if generations_merged < 3:
        violations.append(f"only {generations_merged} generations per shard were merged; the drill needs 3")
    return DrillReport(
        seed=config.seed,
        killed=killed,
        killed_after_seconds=round(elapsed, 3),
        batches_acknowledged=done,
        batches_total=len(batches),
        in_flight_batch=in_flight,
        in_flight_keys_applied=applied,
        batches_only_in_wal=batches_in_wal,
        rows_replayed=rows_replayed,
        generations_merged=generations_merged,
        keys_verified=len(keys),
        deleted_keys_verified=sum(1 for k, v in without.items() if v is None and k not in after),
        rows_before=sum(1 for v in before.values() if v is not None),
        rows_after=view.num_rows,
        findings_before_recovery=tuple(f"{x.severity.value}: {x.message}" for f in findings for x in f.errors),
        violations=tuple(violations),
    )


def _state(table: LsmTable, rows: pa.Table, violations: list[str] | None = None, where: str = "merged view") -> State:
    """Rows by key; a key seen twice is recorded in ``violations`` (when given)."""
    state: State = {}
    for row in rows.to_pylist():
        key = tuple(row[k] for k in table.primary_key)
        if key in state and violations is not None:
            violations.append(f"key {key} appears more than once in the {where}")
        state[key] = row
    return state


def _apply(table: LsmTable, state: State, batches: list[pa.Table]) -> State:
    """The oracle: ``state`` after ``batches`` (deleted keys map to ``None``)."""
    result = dict(state)
    for batch in batches:
        for row in batch.to_pylist():
            key = tuple(row[k] for k in table.primary_key)
            op = row.pop(OP_COLUMN)
            result[key] = None if op == DELETE else row
    return result


def _write_batches(batches: list[pa.Table], path: str) -> None:
    with ipc.new_file(path, batches[0].schema) as writer:
        for batch in batches:
            writer.write_table(batch)


def _acknowledged(ack_path: str) -> list[int]:
    try:
        with open(ack_path, encoding="utf-8") as log:
            # A line without its newline is an append the kill interrupted.
            return [int(line) for line in log.read().split("\n")[:-1]]
    except FileNotFoundError:
        return []


def _write_and_acknowledge(uri: str, batches_path: str, ack_path: str, batches_per_generation: int) -> None:
    """The child: write each batch, then log it; close writers every few batches (a new generation)."""
    table = LsmTable.open(uri)
    reader = ipc.open_file(batches_path)
    with open(ack_path, "a", encoding="utf-8") as log:
        for number in range(reader.num_record_batches):
            table.write(pa.Table.from_batches([reader.get_batch(number)]))
            log.write(f"{number}\n")
            log.flush()
            os.fsync(log.fileno())
            if (number + 1) % batches_per_generation == 0:
                table.close()
    table.close()


if __name__ == "__main__":
    _write_and_acknowledge(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
