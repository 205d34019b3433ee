"""The code location: one ``Definitions`` object, loaded by workspace.yaml.

It serves the default table (``LSM_TABLE_URI``; unprefixed names such as
``ingest_job``) and every table declared under ``LSM_TABLES_DIR`` (default
``tables/``; names prefixed by the table, such as ``orders_ingest_job``).
A declaration that does not load is reported and leaves the others running.

Importing it loads Dagster and this project's definitions only: Lance,
Arrow, Spark and Great Expectations are imported by the steps that use them
(``tests/test_definitions.py`` keeps it so).
"""

from dagster import Definitions, in_process_executor

from declarations import declared_tables_resource, load_tables, table_definitions, tables_dir
from jobs import AnyJob
from lsm_assets.table_context import DEFAULT_TABLE
from resources.gx_resource import GreatExpectationsResource
from resources.spark import SparkResource
from sensors import maintenance_sensors


def build_definitions() -> Definitions:
    """The default table, the declared tables, the sensors over all of them and the shared resources."""
    declared = load_tables(tables_dir(), taken=[DEFAULT_TABLE])
    tables = [DEFAULT_TABLE, *declared.tables]
    per_table = [table_definitions(DEFAULT_TABLE), *declared.definitions]
    jobs: dict[str, AnyJob] = {job.name: job for defs in per_table for job in defs.jobs or ()}
    shared = Definitions(
        sensors=maintenance_sensors(tables, jobs),
        executor=in_process_executor,
        resources={
            "spark": SparkResource(),
            "gx": GreatExpectationsResource(),
            **declared_tables_resource(declared.tables),
        },
    )
    return Definitions.merge(*per_table, declared.error_definitions(), shared)


defs = build_definitions()
