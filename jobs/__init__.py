"""When things run: each table's jobs.

Every declared table gets the same jobs, named after it (:func:`table_jobs`):
``<table>_ingest_job`` (once, or continuously with ``continuous: true``),
``<table>_maintenance_job`` (flush, merge and GC: a whole pass, or the
steps a run selects), ``<table>_quality_job`` and, for a table with demo
data, ``<table>_demo_job`` (end to end). A declared table's columns evolve
through its declaration (``evolve: true``), so it has no add-columns job.
The default table (``LSM_TABLE_URI``) keeps its historical jobs, so existing
scripts keep working: ``ingest_job``, ``continuous_ingest_job``,
``add_columns_job``, ``flush_job``, ``merge_job``, ``gc_job``,
``quality_job``, ``demo_job``::

    dagster job execute -m definitions -j merge_job                 # the default table
    dagster job execute -m definitions -j orders_maintenance_job    # flush, merge, GC `orders`
    dagster asset materialize -m definitions --select orders/merged_base   # only merge `orders`

A table's jobs are few on purpose: each job costs the code location's load
time (~8 ms at 50 tables: the webserver takes every job's snapshot, mostly its
run-config schema, on each load), so modes of one job are config, not jobs.

Every job runs in one process (steps are short, and a process per step would
pay the code location's import again for each). Every run carries
``lsm/table: <table>``. Jobs that hold shard writers carry
``lsm/writer: <table>``, so a flush never claims a shard from a live
ingestion of the same table; the sensors' flush and merge runs carry
``lsm/maintenance: <table>/<kind>`` (a whole maintenance pass,
``<table>/maintenance``). ``deploy/dagster.yaml`` limits each of
these per tag value: one writer run and one run of each maintenance kind per
table, while other tables' runs go on.
"""

from dagster import (
    AssetKey,
    AssetSelection,
    JobDefinition,
    OpDefinition,
    define_asset_job,
    in_process_executor,
    job,
)
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from lsm_assets.checks import CHECKED_ASSETS
from lsm_assets.live_writers import writer_tags
from lsm_assets.ops import add_columns_op, continuous_ingest_op
from lsm_assets.table_context import DEFAULT_TABLE
from resources.declared_table import DeclaredTable

MAINTENANCE_TAG = "lsm/maintenance"
TABLE_TAG = "lsm/table"

AnyJob = JobDefinition | UnresolvedAssetJobDefinition


def table_tags(table: DeclaredTable, **more: str) -> dict[str, str]:
    """The run tags of every job of ``table``, plus ``more``."""
    return {TABLE_TAG: table.name, **more}


def maintenance_tags(table: DeclaredTable, kind: str) -> dict[str, str]:
    """The run tags of ``table``'s ``kind`` (``flush``, ``merge``) maintenance runs."""
    return table_tags(table, **{MAINTENANCE_TAG: f"{table.name}/{kind}"})


def _assets(table: DeclaredTable, *names: str) -> AssetSelection:
    return AssetSelection.assets(*(AssetKey(table.asset_key(n)) for n in names)).without_checks()


MAINTENANCE_ASSETS = {"flush": "flushed_generations", "merge": "merged_base", "gc": "garbage_collected"}
"""Each kind of maintenance run and the asset it materializes."""


def maintenance_job_name(table: DeclaredTable, kind: str) -> str:
    """The job of ``table``'s ``kind`` runs (a run of it selects the kind's asset, :data:`MAINTENANCE_ASSETS`)."""
    return table.job_name(f"{kind}_job" if table.is_default else "maintenance_job")


def table_jobs(table: DeclaredTable) -> list[AnyJob]:
    """Every job of ``table``."""
    writers = table_tags(table, **writer_tags(table.name))
    jobs: list[AnyJob] = [
        _asset_job(
            table,
            "ingest_job",
            _assets(table, "ingested_changes"),
            writers,
            "Ingest every pending landing file with Spark (executors write through shard writers). With config "
            "`continuous: true`: keep the writers open and ingest files as they land until the run is terminated.",
        ),
        *(_default_table_jobs(writers) if table.is_default else [_maintenance_job(table)]),
        _asset_job(
            table,
            "quality_job",
            AssetSelection.checks_for_assets(*(AssetKey(table.asset_key(n)) for n in CHECKED_ASSETS)),
            table_tags(table),
            "Primary-key uniqueness and non-null (base and merged view), schema conformance, WAL-replay recovery "
            "per shard, row-count reconciliation and a SIGKILL recovery drill.",
        ),
    ]
    if table.demo:
        jobs.append(_demo_job(table, writers))
    return jobs


def _maintenance_job(table: DeclaredTable) -> UnresolvedAssetJobDefinition:
    """A declared table's one maintenance job: the sensors' and schedules' runs select one kind's asset."""
    return _asset_job(
        table,
        "maintenance_job",
        _assets(table, *MAINTENANCE_ASSETS.values()),
        maintenance_tags(table, "maintenance"),
        "A maintenance pass: flush shards' unflushed WAL (skipping shards with live writers), merge flushed "
        "generations into the base after the merge guards (beside live writers, only those with a pending run), "
        "collect garbage. Sensor and schedule runs select "
        "one step; config `shards` limits flush and merge to some shards.",
    )


def _default_table_jobs(writers: dict[str, str]) -> list[AnyJob]:
    """The default table's continuous-ingest, add-columns, flush, merge and GC jobs, under their historical names."""
    table = DEFAULT_TABLE

    continuous_ingest_job = _op_job(
        "continuous_ingest_job",
        continuous_ingest_op(table),
        writers,
        "Long-running ingestion: keeps region writers open and ingests landing files as they arrive until the run "
        "is terminated, then flushes and closes the writers.",
    )
    add_columns_job = _op_job(
        "add_columns_job",
        add_columns_op(table),
        writers,
        "Schema evolution: add nullable columns to the live table (config `columns`: name → Arrow type). Fences "
        "writers, flushes, merges, then adds the columns; safe to re-run.",
    )
    return [
        continuous_ingest_job,
        add_columns_job,
        _asset_job(
            table,
            "flush_job",
            _assets(table, "flushed_generations"),
            maintenance_tags(table, "flush"),
            "Flush shards' unflushed WAL into generations (all shards, or config `shards`; skips shards with "
            "live writers).",
        ),
        _asset_job(
            table,
            "merge_job",
            _assets(table, "merged_base"),
            maintenance_tags(table, "merge"),
            "Merge shards' flushed generations into the base table (all shards, or config `shards`), after the "
            "merge guards passed; while a run holds the table's writers, only generations with a pending run.",
        ),
        _asset_job(
            table,
            "gc_job",
            _assets(table, "garbage_collected"),
            table_tags(table),
            "Delete merged generations, consumed WAL, old orphans and old base versions.",
        ),
    ]


def _op_job(name: str, step: OpDefinition, tags: dict[str, str], description: str) -> JobDefinition:
    """A job of the one op ``step``, in one process."""

    @job(name=name, tags=tags, executor_def=in_process_executor, description=description)
    def single_step() -> None:
        step()

    return single_step


def _asset_job(
    table: DeclaredTable,
    kind: str,
    selection: AssetSelection,
    tags: dict[str, str],
    description: str,
    config: dict | None = None,
) -> UnresolvedAssetJobDefinition:
    """``table``'s ``kind`` job over ``selection``, in one process."""
    return define_asset_job(
        table.job_name(kind),
        selection=selection,
        tags=tags,
        executor_def=in_process_executor,
        description=description,
        config=config,
    )


def _demo_job(table: DeclaredTable, tags: dict[str, str]) -> UnresolvedAssetJobDefinition:
    steps = ["landing_changes", "ingested_changes", "flushed_generations", "merged_base", "garbage_collected"]
    step_key = "__".join
    return _asset_job(
        table,
        "demo_job",
        _assets(table, *steps, "table_summary"),
        tags,
        "End to end: generate a change stream, ingest it with Spark, flush, merge into the base (after the merge "
        "guards), collect garbage, and summarize the merged view.",
        config={
            "ops": {
                step_key(table.asset_key("flushed_generations")): {"config": {"idle_seconds": 0}},
                step_key(table.asset_key("garbage_collected")): {
                    "config": {"orphan_grace_seconds": 0, "wal_grace_seconds": 0, "version_retention_hours": 0}
                },
            }
        },
    )


all_jobs = table_jobs(DEFAULT_TABLE)
"""The default table's jobs."""
(
    ingest_job,
    continuous_ingest_job,
    add_columns_job,
    flush_job,
    merge_job,
    gc_job,
    quality_job,
    demo_job,
) = all_jobs
