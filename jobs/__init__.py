"""When things run: job definitions.

``ingest_job``, ``flush_job``, ``merge_job``, ``gc_job`` and ``demo_job`` run
from the CLI with only the environment defaults::

    dagster job execute -m definitions -j merge_job

``flush_shard_job`` / ``merge_shard_job`` handle one shard partition; the
sensors request them. Jobs that hold shard writers carry the ``lsm/writer``
tag, so a flush never claims a shard from a live ingestion.
"""

from dagster import AssetSelection, define_asset_job, job

from lsm_assets.ingestion import ingest_continuously
from lsm_assets.live_writers import WRITER_TAGS
from lsm_assets.maintenance import flush_all_shards, merge_all_shards

ingest_job = define_asset_job(
    "ingest_job",
    selection=AssetSelection.assets("ingested_changes"),
    tags=WRITER_TAGS,
    description="Ingest every pending landing file with Spark (executors write through shard writers).",
)


@job(tags=WRITER_TAGS,
     description="Long-running ingestion: keeps region writers open and ingests landing files as "
                 "they arrive until the run is terminated, then flushes and closes the writers.")
def continuous_ingest_job():
    ingest_continuously()


@job(description="Flush every shard's unflushed WAL into a generation (skips shards with live writers).")
def flush_job():
    flush_all_shards()


@job(description="Merge every shard's flushed generations into the base table.")
def merge_job():
    merge_all_shards()


flush_shard_job = define_asset_job(
    "flush_shard_job", selection=AssetSelection.assets("flushed_generations"),
    description="Flush one shard (requested by the flush sensor).")

merge_shard_job = define_asset_job(
    "merge_shard_job", selection=AssetSelection.assets("merged_base"),
    description="Merge one shard into the base (requested by the merge sensor).")

gc_job = define_asset_job(
    "gc_job", selection=AssetSelection.assets("garbage_collected"),
    description="Delete merged generations, consumed WAL, old orphans and old base versions.")

demo_job = define_asset_job(
    "demo_job",
    selection=AssetSelection.assets("landing_changes", "ingested_changes"),
    tags=WRITER_TAGS,
    description="End to end: generate a change stream as landing files and ingest it with Spark.",
)

all_jobs = [ingest_job, continuous_ingest_job, flush_job, merge_job, flush_shard_job, merge_shard_job,
            gc_job, demo_job]
