"""When things run: job definitions.

``ingest_job``, ``flush_job``, ``merge_job``, ``gc_job`` and ``demo_job`` (the
end-to-end pipeline of the README quick start) run
from the CLI with only the environment defaults::

    dagster job execute -m definitions -j merge_job

``flush_shard_job`` / ``merge_shard_job`` handle one shard partition; the
sensors request them. Jobs that hold shard writers carry the ``lsm/writer``
tag, so a flush never claims a shard from a live ingestion.
"""

from dagster import AssetSelection, define_asset_job, in_process_executor, job

from lsm_assets.demo import collect_table_garbage, generate_landing_files, ingest_landing, summarize_table
from lsm_assets.checks import MERGE_GUARDS
from lsm_assets.ingestion import ingest_continuously
from lsm_assets.live_writers import WRITER_TAGS
from lsm_assets.maintenance import flush_all_shards, merge_all_shards
from lsm_assets.merge_guards import check_merge_guards

ingest_job = define_asset_job(
    "ingest_job",
    selection=AssetSelection.assets("ingested_changes").without_checks(),
    tags=WRITER_TAGS,
    description="Ingest every pending landing file with Spark (executors write through shard writers).",
)


@job(tags=WRITER_TAGS, executor_def=in_process_executor,  # one op holding the writers
     description="Long-running ingestion: keeps region writers open and ingests landing files as "
                 "they arrive until the run is terminated, then flushes and closes the writers.")
def continuous_ingest_job():
    ingest_continuously()


@job(description="Flush every shard's unflushed WAL into a generation (skips shards with live writers).")
def flush_job():
    flush_all_shards()


@job(description="Merge every shard's flushed generations into the base table, after the blocking "
                 "merge guards passed.")
def merge_job():
    merge_all_shards(after=check_merge_guards())


flush_shard_job = define_asset_job(
    "flush_shard_job", selection=AssetSelection.assets("flushed_generations").without_checks(),
    description="Flush one shard (requested by the flush sensor).")

merge_shard_job = define_asset_job(
    "merge_shard_job",
    # The blocking guards (base keys unique and non-null, shard recoverable) run
    # first and stop the merge if they fail; the heavy scratch-copy checks do not.
    selection=AssetSelection.assets("merged_base").without_checks() | AssetSelection.checks(*MERGE_GUARDS),
    description="Merge one shard into the base, guarded by blocking checks (requested by the merge sensor).")

gc_job = define_asset_job(
    "gc_job", selection=AssetSelection.assets("garbage_collected").without_checks(),
    description="Delete merged generations, consumed WAL, old orphans and old base versions.")

@job(tags=WRITER_TAGS, config={"ops": {"collect_table_garbage": {"config": {
    "orphan_grace_seconds": 0, "wal_grace_seconds": 0, "version_retention_hours": 0}}}},
     description="End to end on the default table: generate a change stream, ingest it with Spark, "
                 "flush, check the merge guards, merge into the base, collect garbage, and summarize "
                 "the merged view.")
def demo_job():
    ingested = ingest_landing(after=generate_landing_files())
    merged = merge_all_shards(after=check_merge_guards(after=flush_all_shards(after=ingested)))
    summarize_table(after=collect_table_garbage(after=merged))


all_jobs = [ingest_job, continuous_ingest_job, flush_job, merge_job, flush_shard_job, merge_shard_job,
            gc_job, demo_job]
