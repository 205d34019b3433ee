"""When things run: job definitions.

``ingest_job``, ``flush_job``, ``merge_job``, ``gc_job``, ``quality_job`` and
``demo_job`` (the end-to-end pipeline of the README quick start) run from the
CLI with only the environment defaults (``add_columns_job`` needs its
``columns`` config)::

    dagster job execute -m definitions -j merge_job

Every job runs in one process (steps are short, and a process per step would
pay the code location's import again for each). The sensors launch
``flush_job`` and ``merge_job`` with the shards that need them in the run
config. Jobs that hold shard writers carry the ``lsm/writer`` tag, so a flush
never claims a shard from a live ingestion; flush and merge runs carry
``lsm/maintenance`` (see ``deploy/dagster.yaml``'s limits).
"""

from dagster import AssetSelection, define_asset_job, in_process_executor, job

from lsm_assets.checks import all_checks
from lsm_assets.live_writers import WRITER_TAGS
from lsm_assets.ops import add_table_columns, ingest_continuously

MAINTENANCE_TAG = "lsm/maintenance"


def _assets(*names: str) -> AssetSelection:
    return AssetSelection.assets(*names).without_checks()


ingest_job = define_asset_job(
    "ingest_job",
    selection=_assets("ingested_changes"),
    tags=WRITER_TAGS,
    executor_def=in_process_executor,
    description="Ingest every pending landing file with Spark (executors write through shard writers).",
)


@job(
    tags=WRITER_TAGS,
    executor_def=in_process_executor,
    description="Long-running ingestion: keeps region writers open and ingests landing files as "
    "they arrive until the run is terminated, then flushes and closes the writers.",
)
def continuous_ingest_job() -> None:
    ingest_continuously()


@job(
    tags=WRITER_TAGS,
    executor_def=in_process_executor,
    description="Schema evolution: add nullable columns to the live table (config `columns`: name → Arrow "
    "type). Fences writers, flushes, merges, then adds the columns; safe to re-run.",
)
def add_columns_job() -> None:
    add_table_columns()


flush_job = define_asset_job(
    "flush_job",
    selection=_assets("flushed_generations"),
    tags={MAINTENANCE_TAG: "flush"},
    executor_def=in_process_executor,
    description="Flush shards' unflushed WAL into generations (all shards, or config `shards`; "
    "skips shards with live writers).",
)

merge_job = define_asset_job(
    "merge_job",
    selection=_assets("merged_base"),
    tags={MAINTENANCE_TAG: "merge"},
    executor_def=in_process_executor,
    description="Merge shards' flushed generations into the base table (all shards, or config `shards`), "
    "after the merge guards passed.",
)

gc_job = define_asset_job(
    "gc_job",
    selection=_assets("garbage_collected"),
    executor_def=in_process_executor,
    description="Delete merged generations, consumed WAL, old orphans and old base versions.",
)

quality_job = define_asset_job(
    "quality_job",
    selection=AssetSelection.checks(*all_checks),
    executor_def=in_process_executor,
    description="Primary-key uniqueness and non-null (base and merged view), schema conformance, "
    "WAL-replay recovery per shard, row-count reconciliation and a SIGKILL recovery drill.",
)

demo_job = define_asset_job(
    "demo_job",
    selection=_assets(
        "landing_changes",
        "ingested_changes",
        "flushed_generations",
        "merged_base",
        "garbage_collected",
        "table_summary",
    ),
    tags=WRITER_TAGS,
    executor_def=in_process_executor,
    config={
        "ops": {
            "flushed_generations": {"config": {"idle_seconds": 0}},
            "garbage_collected": {
                "config": {"orphan_grace_seconds": 0, "wal_grace_seconds": 0, "version_retention_hours": 0}
            },
        }
    },
    description="End to end on the default table: generate a change stream, ingest it with Spark, "
    "flush, merge into the base (after the merge guards), collect garbage, and summarize "
    "the merged view.",
)

all_jobs = [
    ingest_job,
    continuous_ingest_job,
    add_columns_job,
    flush_job,
    merge_job,
    gc_job,
    quality_job,
    demo_job,
]
