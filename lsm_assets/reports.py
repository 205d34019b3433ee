"""Downstream readers: assets that consume the merged view through the IO manager."""

import pandas as pd
from dagster import AssetIn, MaterializeResult, asset

from .ingestion import ingested_changes


@asset(group_name="reports", ins={"orders": AssetIn(ingested_changes.key, input_manager_key="lsm_io_manager")},
       kinds={"pandas"})
def orders_by_status(orders: pd.DataFrame) -> MaterializeResult:
    """Live orders and their total amount per status, read from the merged view
    (base + pending generations + WAL tail) as a pandas DataFrame."""
    summary = orders.groupby("status")["amount"].agg(["count", "sum"])
    metadata = {"live_orders": len(orders)}
    for status, row in summary.iterrows():
        metadata[f"{status}_orders"] = int(row["count"])
        metadata[f"{status}_amount"] = round(float(row["sum"]), 2)
    return MaterializeResult(metadata=metadata)
