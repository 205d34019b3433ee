"""Downstream readers: assets that consume the merged view."""

from typing import Any

from dagster import AssetExecutionContext, AssetIn, MaterializeResult, MetadataValue, asset

from resources.table_resource import LsmTableResource

from .ingestion import ingested_changes
from .maintenance import garbage_collected


@asset(
    group_name="reports",
    kinds={"pandas"},
    ins={
        "orders": AssetIn(ingested_changes.key, input_manager_key="lsm_io_manager", metadata={"lsm/format": "pandas"})
    },
)
def orders_by_status(orders: Any) -> MaterializeResult:
    """Live orders and their total amount per status, read from the merged view
    (base + pending generations + WAL tail) as a pandas DataFrame."""
    summary = orders.groupby("status")["amount"].agg(["count", "sum"])
    metadata = {"live_orders": len(orders)}
    for status, row in summary.iterrows():
        metadata[f"{status}_orders"] = int(row["count"])
        metadata[f"{status}_amount"] = round(float(row["sum"]), 2)
    return MaterializeResult(metadata=metadata)


@asset(group_name="reports", deps=[garbage_collected], kinds={"lance"})
def table_summary(context: AssetExecutionContext, lsm_table: LsmTableResource) -> MaterializeResult:
    """The merged view's size and every shard's state, after maintenance."""
    table = lsm_table.open()
    shards = table.shards()
    live_rows = table.count()
    base_rows = table.dataset().count_rows()
    for s in shards:
        context.log.info(
            f"shard {s.bucket}: epoch {s.writer_epoch}, generations "
            f"{[g for g, _ in s.flushed_generations]}, merged up to {s.compacted_generation}, "
            f"{s.unflushed_wal_entries} unflushed WAL entries"
        )
    context.log.info(f"merged view: {live_rows} live rows ({base_rows} in the base table) at {table.uri}")
    return MaterializeResult(
        metadata={
            "live_rows": live_rows,
            "base_rows": base_rows,
            "pending_generations": sum(len(s.pending_generations) for s in shards),
            "table_uri": MetadataValue.path(table.uri),
        }
    )
