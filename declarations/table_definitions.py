"""One table's Dagster definitions: its assets, checks, jobs and schedules (and the default table's resources)."""

from dagster import AssetsDefinition, Definitions, ResourceDefinition

import jobs
import lsm_assets.checks
from jobs import table_jobs
from lsm_assets import ingestion, maintenance, reports, table_assets, table_checks
from resources.declared_table import DECLARED_TABLES_RESOURCE, DeclaredTable
from resources.io_manager import LsmTableIOManager
from resources.table_resource import DeclaredTables, LsmTableResource
from sensors import table_schedules


def table_definitions(table: DeclaredTable) -> Definitions:
    """Everything ``table`` gets, named after it (the default table keeps the historical names).

    A declared table's resource is not here: every declared table shares the
    ``lsm_tables`` resource (:func:`declared_tables_resource`).
    """
    if not table.is_default:
        return Definitions(
            assets=table_assets(table),
            asset_checks=table_checks(table),
            jobs=table_jobs(table),
            schedules=table_schedules(table),
        )
    return Definitions(
        assets=_default_assets(),
        asset_checks=lsm_assets.checks.all_checks,
        jobs=jobs.all_jobs,
        schedules=table_schedules(table),
        resources={table.resource_key: LsmTableResource()},
    )


def declared_tables_resource(tables: list[DeclaredTable]) -> dict[str, ResourceDefinition | LsmTableIOManager]:
    """The one resource every declared table is opened through, and the IO manager reading every table."""
    registry = ResourceDefinition.hardcoded_resource(
        DeclaredTables(tables), f"The declared tables' LsmTableResource by name ({len(tables)} tables)"
    )
    return {DECLARED_TABLES_RESOURCE: registry, "lsm_io_manager": LsmTableIOManager(tables=registry)}


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
        reports.order_totals,
    ]
