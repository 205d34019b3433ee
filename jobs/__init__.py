"""When things run: job definitions."""

from dagster import AssetSelection, define_asset_job, job

from lsm_assets.ingestion import ingest_continuously

ingest_job = define_asset_job(
    "ingest_job",
    selection=AssetSelection.assets("ingested_changes"),
    description="Ingest every pending landing file with Spark (executors write through shard writers).",
)


@job(description="Long-running ingestion: keeps region writers open and ingests landing files as "
                 "they arrive until the run is terminated, then flushes and closes the writers.")
def continuous_ingest_job():
    ingest_continuously()


demo_job = define_asset_job(
    "demo_job",
    selection=AssetSelection.assets("landing_changes", "ingested_changes"),
    description="End to end: generate a change stream as landing files and ingest it with Spark.",
)

all_jobs = [ingest_job, continuous_ingest_job, demo_job]
