"""One table's Dagster definitions: its assets, checks, jobs, schedules and resources."""

from dagster import AssetsDefinition, Definitions

import jobs
import lsm_assets.checks
from jobs import table_jobs
from lsm_assets import ingestion, maintenance, reports, table_assets, table_checks
from lsm_assets.table_context import IO_MANAGER, REGION_WRITERS_RESOURCE, TABLE_RESOURCE
from resources.declared_table import DeclaredTable
from resources.io_manager import LsmTableIOManager
from resources.region_writer import RegionWriterResource
from resources.table_resource import LsmTableResource
from sensors import table_schedules


def table_definitions(table: DeclaredTable) -> Definitions:
    """Everything ``table`` gets, named after it (the default table keeps the historical names)."""
    if table.is_default:
        resource, io_manager = LsmTableResource(), LsmTableIOManager()
        assets, checks, table_job_defs = _default_assets(), lsm_assets.checks.all_checks, jobs.all_jobs
    else:
        resource, io_manager = LsmTableResource.for_table(table), LsmTableIOManager(uri=table.table_uri)
        assets, checks, table_job_defs = table_assets(table), table_checks(table), table_jobs(table)
    return Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=table_job_defs,
        schedules=table_schedules(table),
        resources={
            table.resource_key(TABLE_RESOURCE): resource,
            table.resource_key(REGION_WRITERS_RESOURCE): RegionWriterResource(lsm_table=resource),
            table.resource_key(IO_MANAGER): io_manager,
        },
    )


def _default_assets() -> list[AssetsDefinition]:
    """The default table's assets, as its modules define them (tests and scripts import those)."""
    return [
        ingestion.landing_changes,
        ingestion.ingested_changes,
        maintenance.flushed_generations,
        maintenance.merged_base,
        maintenance.garbage_collected,
        reports.table_summary,
        reports.orders_by_status,
    ]
