"""Sensors that flush and merge every table's shards when they need it, and each table's schedules.

One flush sensor and one merge sensor cover every table. Each tick reads the
instance's unfinished runs once, then every table's shard states (in
parallel, a table at a time on a thread), asks the table's trigger
(:mod:`resources.lsm.maintenance.policy`) about each shard, and requests at
most ONE run per table for all the shards that need work, naming them in the
run config: a round of maintenance costs one process per table, not one per
shard. The ``run_key`` joins the table name and the per-shard keys (each
names the shard state that asked), so repeated ticks over the same state
never request the same work twice. A table whose run of the same kind is
queued or in progress is skipped, so runs never pile up and two merges of
one table never run at once. A table that cannot be read (missing, broken
storage) is logged and skipped; the other tables are served.

Thresholds come from each table's declaration (``triggers``), else from
these environment variables (read when the definitions load), else from the
engine's defaults: ``LSM_SENSOR_INTERVAL_SECONDS`` (30),
``LSM_MERGE_TRIGGER_GENERATIONS`` (4), ``LSM_MERGE_TRIGGER_ROWS`` (1000000),
``LSM_MERGE_TRIGGER_AGE_SECONDS`` (600), ``LSM_FLUSH_TRIGGER_AGE_SECONDS``
(300), ``LSM_FLUSH_TRIGGER_IDLE_SECONDS`` (60).
"""

import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from dagster import (
    AssetKey,
    DagsterRunStatus,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    schedule,
    sensor,
)

from jobs import MAINTENANCE_ASSETS, MAINTENANCE_TAG, AnyJob, maintenance_job_name, maintenance_tags
from lsm_assets.live_writers import WRITER_TAG
from lsm_assets.table_context import table_resource
from resources.declared_table import DeclaredTable
from resources.lsm.maintenance.policy import Decision, FlushTrigger, MergeTrigger

if TYPE_CHECKING:
    from resources.lsm import LsmTable, ShardState

_UNFINISHED = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]
_READERS = 8
"""Tables whose shard states one tick reads at once (object-store latency, not CPU, is the cost)."""


def _env_number(name: str, default: float) -> float:
    """``name`` from the environment as a number, else ``default``."""
    value = os.environ.get(name)
    return float(value) if value else default


def _first(*values: float | None) -> float:
    return next(v for v in values if v is not None)


def flush_trigger(table: DeclaredTable | None = None) -> FlushTrigger:
    """``table``'s flush trigger: declared thresholds, else ``LSM_FLUSH_TRIGGER_*``, else the engine's."""
    default, declared = FlushTrigger(), table.triggers.flush if table else None
    return FlushTrigger(
        max_age_seconds=_first(
            declared and declared.max_age_seconds,
            _env_number("LSM_FLUSH_TRIGGER_AGE_SECONDS", default.max_age_seconds),
        ),
        max_bytes=default.max_bytes,
        idle_seconds=_first(
            declared and declared.idle_seconds, _env_number("LSM_FLUSH_TRIGGER_IDLE_SECONDS", default.idle_seconds)
        ),
    )


def merge_trigger(table: DeclaredTable | None = None) -> MergeTrigger:
    """``table``'s merge trigger: declared thresholds, else ``LSM_MERGE_TRIGGER_*``, else the engine's."""
    default, declared = MergeTrigger(), table.triggers.merge if table else None
    return MergeTrigger(
        generations=int(
            _first(
                declared and declared.generations,
                _env_number("LSM_MERGE_TRIGGER_GENERATIONS", default.generations),
            )
        ),
        pending_rows=int(
            _first(declared and declared.pending_rows, _env_number("LSM_MERGE_TRIGGER_ROWS", default.pending_rows))
        ),
        max_age_seconds=_first(
            declared and declared.max_age_seconds,
            _env_number("LSM_MERGE_TRIGGER_AGE_SECONDS", default.max_age_seconds),
        ),
    )


SENSOR_INTERVAL_SECONDS = int(_env_number("LSM_SENSOR_INTERVAL_SECONDS", 30))


class Trigger(Protocol):
    def decide(self, state: "ShardState", now: float) -> Decision | None: ...


def missing_pending_run(table: "LsmTable", state: "ShardState") -> Decision | None:
    """Work for a shard whose pending generations have no stored pending run (its readers join keys)."""
    from resources.lsm.maintenance.pending_runs import has_pending_run

    if has_pending_run(table.handle, state):
        return None
    newest = state.pending_generations[-1][0]
    return Decision(
        reason=f"{len(state.pending_generations)} pending generations (up to {newest}) without a pending run",
        key=f"{state.shard_id}:run-{newest}",
    )


@dataclass(frozen=True)
class Maintenance:
    """One kind of shard maintenance a sensor requests (``flush``, ``merge``) and its trigger per table.

    A run of it selects the kind's asset (:data:`jobs.MAINTENANCE_ASSETS`) in
    the table's maintenance job (:func:`jobs.maintenance_job_name`). With
    ``skip_while_writing`` a table is skipped while a run holding its shard
    writers is in progress. ``otherwise`` is asked about the shards the
    trigger leaves alone.
    """

    kind: str
    trigger: Callable[[DeclaredTable], Trigger]
    skip_while_writing: bool = False
    otherwise: Callable[["LsmTable", "ShardState"], Decision | None] | None = None


@dataclass
class _Tick:
    """What one tick found: run requests, the new cursor, and why tables were skipped."""

    requests: list[RunRequest] = field(default_factory=list)
    cursor: dict[str, dict[str, str]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def maintenance_sensor(
    name: str,
    maintenance: Maintenance,
    tables: list[DeclaredTable],
    jobs: dict[str, AnyJob],
    description: str,
    interval_seconds: int = SENSOR_INTERVAL_SECONDS,
) -> SensorDefinition:
    """A sensor requesting, per table, one run of ``maintenance`` for all the shards that need it.

    ``jobs`` holds every table's jobs by name (the sensor targets each table's maintenance job).
    """

    targets = sorted({maintenance_job_name(t, maintenance.kind) for t in tables})

    @sensor(
        name=name,
        jobs=[jobs[target] for target in targets],
        minimum_interval_seconds=interval_seconds,
        description=description,
        default_status=DefaultSensorStatus.RUNNING,
        required_resource_keys={t.resource_key for t in tables},
    )
    def _sensor(context: SensorEvaluationContext) -> SensorResult | SkipReason:
        busy, writing = _runs_in_progress(context, maintenance, tables)
        tick, now = _Tick(), time.time()
        to_read = []
        for table in tables:
            if busy.get(table.name):
                tick.skipped[table.name] = f"{maintenance.kind} runs not finished yet ({', '.join(busy[table.name])})"
            elif maintenance.skip_while_writing and writing.get(table.name):
                tick.skipped[table.name] = f"writer runs in progress ({', '.join(writing[table.name])})"
            else:
                to_read.append(table)
        with ThreadPoolExecutor(max_workers=_READERS) as pool:
            found = pool.map(lambda t: _decide(context, maintenance, t, now), to_read)
            for table, (decisions, problem) in zip(to_read, found, strict=True):
                _add(context, tick, maintenance, table, decisions, problem)
        if not tick.requests:
            reasons = "; ".join(f"{t}: {r}" for t, r in tick.skipped.items())
            return SkipReason(f"no table needs it ({reasons or 'every shard is below the thresholds'})")
        return SensorResult(run_requests=tick.requests, cursor=json.dumps(tick.cursor, sort_keys=True))

    return _sensor


def _runs_in_progress(
    context: SensorEvaluationContext, maintenance: Maintenance, tables: list[DeclaredTable]
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Per table: unfinished runs of this kind (or whole maintenance passes), and in-progress runs holding
    its writers.

    One query of the instance per tick, whatever the number of tables.
    """
    table_of_tag = {
        maintenance_tags(t, kind)[MAINTENANCE_TAG]: t.name for t in tables for kind in (maintenance.kind, "maintenance")
    }
    busy: dict[str, list[str]] = {}
    writing: dict[str, list[str]] = {}
    for record in context.instance.get_run_records(RunsFilter(statuses=_UNFINISHED), limit=1000):
        run = record.dagster_run
        if run.tags.get(MAINTENANCE_TAG) in table_of_tag:
            busy.setdefault(table_of_tag[run.tags[MAINTENANCE_TAG]], []).append(run.run_id)
        if WRITER_TAG in run.tags and run.status != DagsterRunStatus.QUEUED:
            writing.setdefault(run.tags[WRITER_TAG], []).append(run.run_id)
    return busy, writing


def _decide(
    context: SensorEvaluationContext, maintenance: Maintenance, table: DeclaredTable, now: float
) -> tuple[dict[int, Decision], str | None]:
    """The shards of ``table`` that need ``maintenance`` now, or why the table could not be read."""
    from resources.lsm import LsmTable, TableNotFoundError

    resource = table_resource(context, table)
    try:
        lsm = LsmTable.open(resource.uri, storage_options=resource.storage_options)
        trigger = maintenance.trigger(table)
        decisions = {}
        for state in lsm.shards():
            decision = trigger.decide(state, now)
            if decision is None and maintenance.otherwise is not None:
                decision = maintenance.otherwise(lsm, state)
            if decision is not None:
                decisions[state.bucket] = decision
        return decisions, None
    except TableNotFoundError:
        return {}, "no table yet (created by its first run)"
    except Exception as error:
        return {}, f"cannot read its state: {type(error).__name__}: {error}"


def _add(
    context: SensorEvaluationContext,
    tick: _Tick,
    maintenance: Maintenance,
    table: DeclaredTable,
    decisions: dict[int, Decision],
    problem: str | None,
) -> None:
    """Record ``table``'s outcome in ``tick``: a run request for its shards, or why there is none."""
    if problem is not None:
        context.log.warning(f"{table.name}: {problem}")
        tick.skipped[table.name] = problem
        return
    if not decisions:
        tick.skipped[table.name] = "every shard is below the thresholds"
        return
    for bucket, decision in sorted(decisions.items()):
        context.log.info(f"{table.name} shard {bucket}: {decision.reason}")
    buckets = sorted(decisions)
    asset = table.asset_key(MAINTENANCE_ASSETS[maintenance.kind])
    step = "__".join(asset)
    tick.requests.append(
        RunRequest(
            job_name=maintenance_job_name(table, maintenance.kind),
            asset_selection=[AssetKey(asset)],
            run_key=f"{table.name}|" + "|".join(decisions[b].key for b in buckets),
            run_config={"ops": {step: {"config": {"shards": buckets}}}},
            tags={**maintenance_tags(table, maintenance.kind), "lsm/shards": ",".join(map(str, buckets))},
        )
    )
    tick.cursor[table.name] = {str(b): decisions[b].key for b in buckets}


FLUSH = Maintenance("flush", flush_trigger, True, missing_pending_run)
MERGE = Maintenance("merge", merge_trigger)


def maintenance_sensors(tables: list[DeclaredTable], jobs: dict[str, AnyJob]) -> list[SensorDefinition]:
    """The flush and merge sensors over ``tables``, whose jobs ``jobs`` holds by name."""
    return [
        maintenance_sensor(
            "flush_sensor",
            FLUSH,
            tables,
            jobs,
            "Flushes, per table, the shards whose WAL holds data no generation has (crashed or idle writers) "
            "once the table's flush trigger fires, and builds the pending run (readers' shortcut) of shards "
            "whose pending generations have none. Tables with a live writer run are skipped. In force: "
            + _thresholds(tables, FLUSH, _flush_text),
        ),
        maintenance_sensor(
            "merge_sensor",
            MERGE,
            tables,
            jobs,
            "Merges, per table, the shards at the table's merge trigger into the base, one run per table. "
            "In force: " + _thresholds(tables, MERGE, _merge_text),
        ),
    ]


def _thresholds(tables: list[DeclaredTable], maintenance: Maintenance, text: Callable[[Trigger], str]) -> str:
    """The thresholds each table's trigger holds, tables with the same ones named together."""
    by_text: dict[str, list[str]] = {}
    for table in tables:
        by_text.setdefault(text(maintenance.trigger(table)), []).append(table.name)
    return "; ".join(f"{', '.join(names)}: {thresholds}" for thresholds, names in by_text.items()) + "."


def _flush_text(trigger: Trigger) -> str:
    assert isinstance(trigger, FlushTrigger)
    return (
        f"WAL data older than {trigger.max_age_seconds:g} s or over {trigger.max_bytes >> 20} MiB, "
        f"untouched for {trigger.idle_seconds:g} s"
    )


def _merge_text(trigger: Trigger) -> str:
    assert isinstance(trigger, MergeTrigger)
    return (
        f"{trigger.generations} pending generations, {trigger.pending_rows:,} pending rows, "
        f"or a generation {trigger.max_age_seconds:g} s old"
    )


def table_schedules(table: DeclaredTable) -> list[ScheduleDefinition]:
    """``table``'s GC schedule (unless declared off) and its quality schedule (if declared)."""
    schedules = [_gc_schedule(table)] if table.gc.schedule else []
    quality_cron = table.quality.schedule or (DEFAULT_QUALITY_CRON if table.is_default else None)
    quality_status = DefaultScheduleStatus.RUNNING if table.quality.schedule else DefaultScheduleStatus.STOPPED
    if quality_cron:
        schedules.append(
            ScheduleDefinition(
                name=table.job_name("quality_schedule"),
                job_name=table.job_name("quality_job"),
                cron_schedule=quality_cron,
                default_status=quality_status,
                description=f"Runs every data-quality check of {table.name} ({quality_cron})"
                + ("" if table.quality.schedule else "; off by default: the checks scan the whole table")
                + ".",
            )
        )
    return schedules


def _gc_schedule(table: DeclaredTable) -> ScheduleDefinition:
    """``table``'s GC runs: its maintenance job's ``garbage_collected`` step, on the declared cron."""
    assert table.gc.schedule

    @schedule(
        name=table.job_name("gc_schedule"),
        job_name=maintenance_job_name(table, "gc"),
        cron_schedule=table.gc.schedule,
        default_status=DefaultScheduleStatus.RUNNING,
        description=f"Garbage-collects {table.name}'s merged generations, consumed WAL and old versions "
        f"({table.gc.schedule}).",
    )
    def gc_schedule(_context: ScheduleEvaluationContext) -> RunRequest:
        return RunRequest(
            asset_selection=[AssetKey(table.asset_key(MAINTENANCE_ASSETS["gc"]))], tags=maintenance_tags(table, "gc")
        )

    return gc_schedule


DEFAULT_QUALITY_CRON = "17 3 * * *"
"""The default table's quality schedule (stopped unless turned on in the UI)."""
