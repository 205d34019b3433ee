"""Ops: the default table's steps that are not the materialization of one asset.

``ingest_continuously`` (``continuous_ingest_job``) runs for as long as its
run does, recording each micro-batch as a materialization of
``ingested_changes``; declared tables ingest continuously through
``ingested_changes`` itself (``continuous: true``). ``add_table_columns`` adds
nullable columns to the live table (schema evolution).
"""

from typing import TYPE_CHECKING

from dagster import (
    AssetKey,
    AssetObservation,
    Config,
    MetadataValue,
    OpDefinition,
    OpExecutionContext,
    op,
)
from pydantic import Field

from resources.declared_table import DeclaredTable

from .ingestion import INGEST_CONFIG, ingest_until_stopped
from .table_context import DEFAULT_TABLE, SPARK_RESOURCE, open_table

if TYPE_CHECKING:
    from resources.lsm import LsmTable


def continuous_ingest_op(table: DeclaredTable) -> OpDefinition:
    """The op of ``table``'s ``continuous_ingest_job``: ``ingested_changes`` with ``continuous: true``.

    Its config is the ingestion's (without ``continuous``, which it always
    is), under the op's name, as scripts written for this job pass it.
    """
    schema = {name: field for name, field in INGEST_CONFIG.schema(table).items() if name != "continuous"}

    @op(
        name=table.job_name("ingest_continuously"),
        required_resource_keys={table.resource_key, SPARK_RESOURCE},
        config_schema=schema,
    )
    def ingest_continuously(context: OpExecutionContext) -> None:
        """Ingest landing files as they arrive until the run is terminated (or idle long enough)."""
        ingest_until_stopped(context, INGEST_CONFIG.resolve(context, table), table)

    return ingest_continuously


class AddColumnsConfig(Config):
    columns: dict[str, str] = Field(
        description="New columns: name → Arrow type name (string, int64, double, bool, date32, timestamp[us], ...)."
    )


def add_columns_op(table: DeclaredTable) -> OpDefinition:
    """The op of ``table``'s schema-evolution job."""

    @op(name=table.job_name("add_table_columns"), required_resource_keys={table.resource_key})
    def add_table_columns(context: OpExecutionContext, config: AddColumnsConfig) -> None:
        """Add nullable columns to the live table; afterwards writes may carry them and every reader returns them.

        Runs ``LsmTable.add_columns``: fence every shard's writer, flush, merge
        into the base, add the columns to the base, reopen. Each step is logged.
        A run that fails or dies midway leaves a table a re-run completes (columns
        already added are skipped), so retrying the run is always safe.
        """
        _add_columns(context, config, open_table(context, table), AssetKey(table.asset_key("ingested_changes")))

    return add_table_columns


def _add_columns(context: OpExecutionContext, config: AddColumnsConfig, table: "LsmTable", ingested: AssetKey) -> None:
    import pyarrow as pa

    fields = [pa.field(name, pa.type_for_alias(type_name)) for name, type_name in config.columns.items()]
    try:
        added = table.add_columns(fields, on_step=lambda step: context.log.info(f"add_columns: {step}"))
    finally:
        table.close()
    context.log.info(f"added {added or 'no'} columns; the table's columns are {table.schema.names}")
    context.log_event(
        AssetObservation(
            asset_key=ingested,
            metadata={"columns_added": MetadataValue.json(added), "schema": MetadataValue.json(table.schema.names)},
        )
    )


ingest_continuously = continuous_ingest_op(DEFAULT_TABLE)
add_table_columns = add_columns_op(DEFAULT_TABLE)
