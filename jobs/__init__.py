"""When things run: job definitions."""

from dagster import AssetSelection, define_asset_job

demo_job = define_asset_job(
    "demo_job",
    selection=AssetSelection.assets("demo_changes"),
    description="End-to-end demo: generate a change stream and write it through the LSM engine.",
)

all_jobs = [demo_job]
