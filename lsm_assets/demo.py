"""The end-to-end demo as ops: generate → ingest → flush → merge → GC → summary.

Each step calls the same function as its asset and records a materialization
of that asset (per shard for flush and merge), so the demo fills the asset
graph in the UI.
"""

from dagster import AssetMaterialization, In, MetadataValue, Nothing, OpExecutionContext, op

from .ingestion import IngestConfig, LandingChangesConfig, ingest, ingested_changes, landing_changes, write_landing
from .maintenance import GcConfig, collect_garbage, garbage_collected


@op(description="Write a generated change stream into the landing directory.")
def generate_landing_files(context: OpExecutionContext, config: LandingChangesConfig) -> None:
    context.log_event(AssetMaterialization(landing_changes.key, metadata=write_landing(context, config)))


@op(required_resource_keys={"lsm_table", "pyspark"}, ins={"after": In(Nothing)},
    description="Ingest the pending landing files with Spark.")
def ingest_landing(context: OpExecutionContext, config: IngestConfig) -> None:
    table = context.resources.lsm_table.open()
    metadata = ingest(context, config, context.resources.pyspark.spark_session, table)
    context.log_event(AssetMaterialization(ingested_changes.key, metadata=metadata))


@op(required_resource_keys={"lsm_table"}, ins={"after": In(Nothing)},
    description="Garbage-collect what the merge made obsolete.")
def collect_table_garbage(context: OpExecutionContext, config: GcConfig) -> None:
    metadata = collect_garbage(context, context.resources.lsm_table.open(), config)
    context.log_event(AssetMaterialization(garbage_collected.key, metadata=metadata))


@op(required_resource_keys={"lsm_table"}, ins={"after": In(Nothing)},
    description="Summarize the merged view and every shard's state.")
def summarize_table(context: OpExecutionContext) -> None:
    table = context.resources.lsm_table.open()
    shards = table.shards()
    live_rows = table.count()
    base_rows = table.dataset().count_rows()
    for s in shards:
        context.log.info(f"shard {s.bucket}: epoch {s.writer_epoch}, generations "
                         f"{[g for g, _ in s.flushed_generations]}, merged up to {s.compacted_generation}, "
                         f"{s.unflushed_wal_entries} unflushed WAL entries")
    context.log.info(f"merged view: {live_rows} live rows ({base_rows} in the base table) at {table.uri}")
    context.add_output_metadata({
        "live_rows": live_rows, "base_rows": base_rows,
        "pending_generations": sum(len(s.pending_generations) for s in shards),
        "table_uri": MetadataValue.path(table.uri),
    })
