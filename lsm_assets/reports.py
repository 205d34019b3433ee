"""Downstream readers: assets that consume the merged view.

Every table gets a ``table_summary`` after maintenance. The default (demo)
table has two examples of downstream assets reading through the IO manager:
``orders_by_status`` recomputes its totals from the whole merged view each
run; ``order_totals`` keeps the same totals up to date from the change feed
alone (what changed since its last run, and those keys' previous values).
"""

import json
from typing import TYPE_CHECKING, Any

from dagster import AssetExecutionContext, AssetIn, AssetsDefinition, MaterializeResult, MetadataValue, asset

from resources.declared_table import DeclaredTable
from resources.io_manager import READ_METADATA, TableChanges, last_materialized_value

from .ingestion import ingested_changes
from .maintenance import garbage_collected
from .table_context import DEFAULT_TABLE, open_table, table_asset

if TYPE_CHECKING:
    from resources.lsm import LsmTable


@asset(
    group_name=DEFAULT_TABLE.group,
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


TOTALS_METADATA = "totals"
"""``order_totals``' state in its materialization metadata: ``{status: [orders, amount]}``."""


@asset(
    group_name=DEFAULT_TABLE.group,
    kinds={"python"},
    ins={
        "orders": AssetIn(ingested_changes.key, input_manager_key="lsm_io_manager", metadata={READ_METADATA: "changes"})
    },
)
def order_totals(context: AssetExecutionContext, orders: TableChanges) -> MaterializeResult:
    """Live orders and their total amount per status (as ``orders_by_status``), kept up to date
    incrementally: each run reads only the changes since the previous one, takes the changed keys'
    previous rows out of the totals and puts their new ones in."""
    import pyarrow.compute as pc

    recorded = last_materialized_value(context.instance, context.asset_key, TOTALS_METADATA)
    totals = json.loads(recorded) if orders.since is not None and recorded else {}
    _add_rows(totals, orders.previous(["status", "amount"]), -1)
    _add_rows(totals, orders.rows.filter(pc.equal(orders.rows["_op"], "upsert")), 1)
    totals = {status: entry for status, entry in sorted(totals.items()) if entry[0]}
    metadata: dict[str, Any] = {"live_orders": sum(e[0] for e in totals.values()), "changes_read": len(orders.rows)}
    for status, (count, amount) in totals.items():
        metadata[f"{status}_orders"] = int(count)
        metadata[f"{status}_amount"] = round(amount, 2)
    return MaterializeResult(metadata={**metadata, TOTALS_METADATA: json.dumps(totals), **orders.cursor_metadata()})


def _add_rows(totals: dict[str, list], rows: Any, sign: int) -> None:
    """Count ``rows`` (``status``, ``amount``) into ``totals`` (``sign`` -1: take them out)."""
    for status, amount in zip(rows["status"].to_pylist(), rows["amount"].to_pylist(), strict=True):
        entry = totals.setdefault(status, [0, 0.0])
        entry[0] += sign
        entry[1] += sign * (amount or 0.0)


def _table_summary(table: DeclaredTable, collected: AssetsDefinition) -> AssetsDefinition:
    @table_asset(table, "table_summary", deps=[collected], kinds={"lance"})
    def table_summary(context: AssetExecutionContext) -> MaterializeResult:
        """The merged view's size and every shard's state, after maintenance."""
        return MaterializeResult(metadata=summarize(context, open_table(context, table)))

    return table_summary


def summarize(context: AssetExecutionContext, table: "LsmTable") -> dict[str, Any]:
    """Log every shard's state and the merged view's size; return them as metadata."""
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
    return {
        "live_rows": live_rows,
        "base_rows": base_rows,
        "pending_generations": sum(len(s.pending_generations) for s in shards),
        "table_uri": MetadataValue.path(table.uri),
    }


def report_assets(table: DeclaredTable, collected: AssetsDefinition) -> list[AssetsDefinition]:
    """``table``'s reports: its summary after maintenance."""
    return [_table_summary(table, collected)]


(table_summary,) = report_assets(DEFAULT_TABLE, garbage_collected)
