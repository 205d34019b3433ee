"""``quality_job``: every data-quality check against the table, from the CLI::

    dagster job execute -m definitions -j quality_job

The job runs the checks only (nothing is materialized), in one process: they
open the table (creating it on first use), which must not race, and the
pandas validations are faster than starting a process per check.
"""

from dagster import AssetSelection, define_asset_job, in_process_executor

from lsm_assets.checks import all_checks

quality_job = define_asset_job(
    "quality_job",
    selection=AssetSelection.checks(*all_checks),
    executor_def=in_process_executor,
    description="Primary-key uniqueness and non-null (base and merged view), schema conformance, "
                "WAL-replay recovery per shard, row-count reconciliation and a SIGKILL recovery drill.",
)

quality_jobs = [quality_job]
