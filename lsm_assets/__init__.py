"""What the platform produces for each table: ingestion, maintenance and report assets, and checks.

:func:`table_assets` builds one table's assets and :func:`table_checks` its
checks, named from the table (``orders/ingested_changes``, group ``orders``).
The modules also hold the default table's definitions under their historical
names (``lsm_assets.ingestion.ingested_changes``, ...).
"""

from dagster import AssetsDefinition

from resources.declared_table import DeclaredTable

from .checks import table_checks
from .ingestion import ingestion_assets
from .maintenance import maintenance_assets
from .reports import report_assets

__all__ = ["table_assets", "table_checks"]


def table_assets(table: DeclaredTable) -> list[AssetsDefinition]:
    """Every asset of ``table``: landing (demo data), ingestion, flush, merge, GC, summary."""
    ingestion = ingestion_assets(table)
    maintenance = maintenance_assets(table, ingestion[-1])
    return [*ingestion, *maintenance, *report_assets(table, maintenance[-1])]
