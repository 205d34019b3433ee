"""Ops: steps that are not the materialization of one asset.

``ingest_continuously`` runs for as long as its run does, recording each
micro-batch as a materialization of ``ingested_changes``. ``add_table_columns``
adds nullable columns to the live table (schema evolution).
"""

import time
from typing import TYPE_CHECKING

from dagster import (
    AssetKey,
    AssetMaterialization,
    AssetObservation,
    Config,
    MetadataValue,
    OpDefinition,
    OpExecutionContext,
    op,
)
from dagster._core.errors import DagsterExecutionInterruptedError
from pydantic import Field

from resources.declared_table import DeclaredTable
from resources.region_writer import WriterSession, claimed_writers
from resources.spark import SparkResource

from .ingestion import IngestConfig, ingest, ingest_defaults, pending_run_metadata
from .table_context import (
    DEFAULT_TABLE,
    SPARK_RESOURCE,
    StepConfig,
    open_table,
    table_resource,
    version_metadata,
)

if TYPE_CHECKING:
    from resources.lsm import LsmTable


class ContinuousIngestConfig(IngestConfig):
    poll_seconds: float = Field(default=5.0, description="Pause between looks at the landing directory.")
    max_files_per_batch: int = Field(default=20, description="Files per micro-batch.")
    stop_after_idle_polls: int = Field(default=0, description="Stop after this many empty polls (0: never).")


CONTINUOUS_INGEST_CONFIG = StepConfig(ContinuousIngestConfig, ingest_defaults)


def continuous_ingest_op(table: DeclaredTable) -> OpDefinition:
    """The op of ``table``'s continuous ingestion job."""

    @op(
        name=table.job_name("ingest_continuously"),
        required_resource_keys={table.resource_key, SPARK_RESOURCE},
        config_schema=CONTINUOUS_INGEST_CONFIG.schema(table),
    )
    def ingest_continuously(context: OpExecutionContext) -> None:
        """Ingest landing files as they arrive until the run is terminated (or idle long enough).

        Spark stages each micro-batch (read, validate, route, sort); its rows are
        written here through region writers that stay open for the whole run, so no
        generation is cut per micro-batch. The generations the writers cut get
        their pending runs within seconds, built beside the writers (never
        fencing them). Terminating the run is a planned stop: the current
        micro-batch is either recorded or left for the next run, the writers are
        flushed and closed, and the step ends successfully.
        """
        config = CONTINUOUS_INGEST_CONFIG.resolve(context, table)
        ingested = AssetKey(table.asset_key("ingested_changes"))
        with claimed_writers(table_resource(context, table), context.log) as session:
            _ingest_until_stopped(context, config, context.resources.spark, session, ingested)

    return ingest_continuously


def _ingest_until_stopped(
    context: OpExecutionContext,
    config: ContinuousIngestConfig,
    spark: SparkResource,
    session: "WriterSession",
    ingested: AssetKey,
) -> None:
    table = session.table
    idle = batches = 0
    try:
        while not config.stop_after_idle_polls or idle < config.stop_after_idle_polls:
            metadata = ingest(
                context, config, spark.spark_session, table, max_files=config.max_files_per_batch, writers=table
            )
            if not metadata["files"]:
                idle += 1
                time.sleep(config.poll_seconds)
                continue
            idle, batches = 0, batches + 1
            # Each micro-batch shows up as a materialization of the ingested table.
            metadata |= pending_run_metadata(session.runs) | version_metadata(table)
            context.log_event(AssetMaterialization(asset_key=ingested, metadata=metadata))
    except (DagsterExecutionInterruptedError, KeyboardInterrupt):
        # Terminate in the UI raises the first, Ctrl-C on the CLI the second:
        # both are an operator's planned stop, not a failure.
        context.log.info(f"stop requested after {batches} micro-batches; closing writers")
        return
    context.log.info(f"idle for {idle} polls after {batches} micro-batches; closing writers")


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
