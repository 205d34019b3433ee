"""Sensors that flush and merge shards when they need it, and the GC schedule.

Each sensor reads every shard's state (one ``LsmTable.shards()`` call) and
requests one run per shard that needs work. The ``run_key`` names the shard
state that triggered it, so repeated ticks over the same state never request
the same work twice; the cursor remembers the last key per shard for the UI.
"""

import json
import time
from dataclasses import dataclass
from typing import Callable

from dagster import (DefaultScheduleStatus, DefaultSensorStatus, RunRequest, ScheduleDefinition,
                     SensorDefinition, SensorEvaluationContext, SensorResult, SkipReason, sensor)

from jobs import flush_shard_job, gc_job, merge_shard_job
from lsm_assets.live_writers import live_writer_runs
from resources.lsm import ShardState
from resources.table_resource import LsmTableResource

SHARD_TAG = "lsm/shard"


@dataclass(frozen=True)
class ShardDecision:
    """Why a shard needs a run, and the key that identifies the state asking for it."""

    reason: str
    run_key: str


ShardRule = Callable[[ShardState, float], "ShardDecision | None"]


def shard_sensor(name: str, job, rule: ShardRule, description: str,
                 skip_while_writing: bool = False, interval_seconds: int = 30) -> SensorDefinition:
    """A sensor requesting ``job`` for every shard where ``rule`` returns a decision.

    ``rule(state, now)`` sees one shard; with ``skip_while_writing`` the whole
    tick is skipped while a run holding shard writers is in progress.
    """

    @sensor(name=name, job=job, minimum_interval_seconds=interval_seconds, description=description,
            default_status=DefaultSensorStatus.RUNNING, required_resource_keys={"lsm_table"})
    def _sensor(context: SensorEvaluationContext):
        if skip_while_writing:
            live = live_writer_runs(context.instance)
            if live:
                return SkipReason(f"writer runs in progress ({', '.join(live)}); not claiming their shards")
        lsm_table: LsmTableResource = context.resources.lsm_table
        cursor = json.loads(context.cursor) if context.cursor else {}
        now = time.time()
        requests, idle = [], []
        for state in lsm_table.open().shards():
            decision = rule(state, now)
            if decision is None:
                idle.append(state.bucket)
                continue
            context.log.info(f"shard {state.bucket}: {decision.reason}")
            cursor[str(state.bucket)] = decision.run_key
            requests.append(RunRequest(run_key=decision.run_key, partition_key=str(state.bucket),
                                       tags={SHARD_TAG: str(state.bucket)}))
        if not requests:
            return SkipReason(f"no shard needs it (shards {idle} below thresholds)")
        return SensorResult(run_requests=requests, cursor=json.dumps(cursor, sort_keys=True))

    return _sensor


def needs_flush(max_age_seconds: float, max_bytes: int, idle_seconds: float) -> ShardRule:
    """Unflushed WAL older than ``max_age_seconds`` or bigger than ``max_bytes``,
    and untouched for ``idle_seconds`` (so no writer is appending to it)."""

    def rule(state: ShardState, now: float) -> ShardDecision | None:
        if not state.unflushed_wal_entries or state.unflushed_wal_first_mtime_ns is None:
            return None
        age = now - state.unflushed_wal_first_mtime_ns / 1e9
        quiet = now - (state.unflushed_wal_last_mtime_ns or 0) / 1e9
        if quiet < idle_seconds or (age < max_age_seconds and state.unflushed_wal_bytes < max_bytes):
            return None
        return ShardDecision(
            f"{state.unflushed_wal_entries} WAL entries ({state.unflushed_wal_bytes} bytes, {age:.0f}s old)",
            f"flush-{state.shard_id}-epoch{state.writer_epoch}-after{state.replay_after_wal_position}")

    return rule


def needs_merge(generation_trigger: int, max_age_seconds: float) -> ShardRule:
    """``generation_trigger`` or more pending generations, or the oldest older than ``max_age_seconds``."""

    def rule(state: ShardState, now: float) -> ShardDecision | None:
        pending = state.pending_generations
        if not pending:
            return None
        age = now - state.oldest_pending_mtime_ns / 1e9 if state.oldest_pending_mtime_ns else 0.0
        if len(pending) < generation_trigger and age < max_age_seconds:
            return None
        return ShardDecision(f"{len(pending)} generations awaiting merge (oldest {age:.0f}s)",
                             f"merge-{state.shard_id}-upto{pending[-1][0]}")

    return rule


flush_sensor = shard_sensor(
    "flush_sensor", flush_shard_job, needs_flush(max_age_seconds=300, max_bytes=64 << 20, idle_seconds=60),
    "Flushes shards whose WAL holds data no generation has (crashed or idle writers).",
    skip_while_writing=True)

merge_sensor = shard_sensor(
    "merge_sensor", merge_shard_job, needs_merge(generation_trigger=4, max_age_seconds=600),
    "Merges a shard into the base once it has 4 pending generations or its oldest is 10 minutes old.")

gc_schedule = ScheduleDefinition(
    name="gc_schedule", job=gc_job, cron_schedule="*/30 * * * *",
    default_status=DefaultScheduleStatus.RUNNING,
    description="Garbage-collects merged generations, consumed WAL and old versions every 30 minutes.")
