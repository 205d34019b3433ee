"""Sensors that flush and merge shards when they need it, and the maintenance schedules.

Each sensor reads every shard's state once per tick, asks the engine's
trigger (:mod:`resources.lsm.maintenance.policy`) about each, and requests at
most ONE run for all the shards that need work, naming them in the run
config: a round of maintenance costs one process, not one per shard. The
``run_key`` joins the per-shard keys (each names the shard state that asked),
so repeated ticks over the same state never request the same work twice.
While a run of the same kind is queued or in progress the tick is skipped, so
runs never pile up and two merges never run at once.

Thresholds and the tick interval are the engine's defaults unless these
environment variables (read when the definitions load) override them:
``LSM_SENSOR_INTERVAL_SECONDS`` (30), ``LSM_MERGE_TRIGGER_GENERATIONS`` (4),
``LSM_MERGE_TRIGGER_ROWS`` (1000000), ``LSM_MERGE_TRIGGER_AGE_SECONDS`` (600),
``LSM_FLUSH_TRIGGER_AGE_SECONDS`` (300), ``LSM_FLUSH_TRIGGER_IDLE_SECONDS`` (60).
"""

import json
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from dagster import (
    DagsterRunStatus,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    ScheduleDefinition,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from jobs import MAINTENANCE_TAG, flush_job, gc_job, merge_job, quality_job
from lsm_assets.live_writers import live_writer_runs
from resources.lsm.maintenance.policy import Decision, FlushTrigger, MergeTrigger
from resources.table_resource import LsmTableResource

if TYPE_CHECKING:
    from resources.lsm import LsmTable, ShardState

_UNFINISHED = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]


def _env_number(name: str, default: float) -> float:
    """``name`` from the environment as a number, else ``default``."""
    value = os.environ.get(name)
    return float(value) if value else default


def flush_trigger() -> FlushTrigger:
    """The flush trigger: engine defaults, overridden by ``LSM_FLUSH_TRIGGER_*``."""
    default = FlushTrigger()
    return FlushTrigger(
        max_age_seconds=_env_number("LSM_FLUSH_TRIGGER_AGE_SECONDS", default.max_age_seconds),
        max_bytes=default.max_bytes,
        idle_seconds=_env_number("LSM_FLUSH_TRIGGER_IDLE_SECONDS", default.idle_seconds),
    )


def merge_trigger() -> MergeTrigger:
    """The merge trigger: engine defaults, overridden by ``LSM_MERGE_TRIGGER_*``."""
    default = MergeTrigger()
    return MergeTrigger(
        generations=int(_env_number("LSM_MERGE_TRIGGER_GENERATIONS", default.generations)),
        pending_rows=int(_env_number("LSM_MERGE_TRIGGER_ROWS", default.pending_rows)),
        max_age_seconds=_env_number("LSM_MERGE_TRIGGER_AGE_SECONDS", default.max_age_seconds),
    )


SENSOR_INTERVAL_SECONDS = int(_env_number("LSM_SENSOR_INTERVAL_SECONDS", 30))


class Trigger(Protocol):
    def decide(self, state: "ShardState", now: float) -> Decision | None: ...


def missing_pending_run(table: "LsmTable", state: "ShardState") -> Decision | None:
    """Work for a shard whose pending generations have no stored pending run (its readers join keys)."""
    if table.has_pending_run(state):
        return None
    newest = state.pending_generations[-1][0]
    return Decision(
        reason=f"{len(state.pending_generations)} pending generations (up to {newest}) without a pending run",
        key=f"{state.shard_id}:run-{newest}",
    )


def shard_sensor(
    name: str,
    job: UnresolvedAssetJobDefinition,
    asset_name: str,
    trigger: Trigger,
    description: str,
    skip_while_writing: bool = False,
    interval_seconds: int = SENSOR_INTERVAL_SECONDS,
    otherwise: Callable[["LsmTable", "ShardState"], Decision | None] | None = None,
) -> SensorDefinition:
    """A sensor requesting one run of ``job`` for all the shards where ``trigger`` decides so.

    The run's config sets ``shards`` on the ``asset_name`` step. With
    ``skip_while_writing`` the whole tick is skipped while a run holding shard
    writers is in progress. ``otherwise`` is asked about the shards the
    trigger leaves alone.
    """
    kind = (job.tags or {}).get(MAINTENANCE_TAG, job.name)

    @sensor(
        name=name,
        job=job,
        minimum_interval_seconds=interval_seconds,
        description=description,
        default_status=DefaultSensorStatus.RUNNING,
    )
    def _sensor(context: SensorEvaluationContext, lsm_table: LsmTableResource) -> SensorResult | SkipReason:
        busy = _unfinished_runs(context, job.name)
        if busy:
            return SkipReason(f"{job.name} runs not finished yet ({', '.join(busy)}); they take what is pending")
        if skip_while_writing:
            live = live_writer_runs(context.instance)
            if live:
                return SkipReason(f"writer runs in progress ({', '.join(live)}); not claiming their shards")
        now = time.time()
        decisions = {}
        table = lsm_table.open()
        for state in table.shards():
            decision = trigger.decide(state, now)
            if decision is None and otherwise is not None:
                decision = otherwise(table, state)
            if decision is not None:
                decisions[state.bucket] = decision
                context.log.info(f"shard {state.bucket}: {decision.reason}")
        if not decisions:
            return SkipReason("no shard needs it (every shard is below the thresholds)")
        buckets = sorted(decisions)
        run_key = "|".join(decisions[b].key for b in buckets)
        request = RunRequest(
            run_key=run_key,
            run_config={"ops": {asset_name: {"config": {"shards": buckets}}}},
            tags={MAINTENANCE_TAG: kind, "lsm/shards": ",".join(map(str, buckets))},
        )
        cursor = json.dumps({str(b): decisions[b].key for b in buckets}, sort_keys=True)
        return SensorResult(run_requests=[request], cursor=cursor)

    return _sensor


def _unfinished_runs(context: SensorEvaluationContext, job_name: str) -> list[str]:
    records = context.instance.get_run_records(RunsFilter(job_name=job_name, statuses=_UNFINISHED), limit=5)
    return [r.dagster_run.run_id for r in records]


flush_sensor = shard_sensor(
    "flush_sensor",
    flush_job,
    "flushed_generations",
    flush_trigger(),
    "Flushes the shards whose WAL holds data no generation has (crashed or idle writers): "
    "older than 5 minutes or over 64 MiB, and untouched for 60 s; and builds the pending run "
    "(readers' shortcut) of shards whose pending generations have none.",
    skip_while_writing=True,
    otherwise=missing_pending_run,
)

merge_sensor = shard_sensor(
    "merge_sensor",
    merge_job,
    "merged_base",
    merge_trigger(),
    "Merges the shards with 4 pending generations, 1M pending rows, or a generation 10 minutes old "
    "into the base, in one run.",
)

gc_schedule = ScheduleDefinition(
    name="gc_schedule",
    job=gc_job,
    cron_schedule="*/30 * * * *",
    default_status=DefaultScheduleStatus.RUNNING,
    description="Garbage-collects merged generations, consumed WAL and old versions every 30 minutes.",
)

quality_schedule = ScheduleDefinition(
    name="quality_schedule",
    job=quality_job,
    cron_schedule="17 3 * * *",
    default_status=DefaultScheduleStatus.STOPPED,
    description="Runs every data-quality check once a day (off by default: the checks scan the whole table).",
)
