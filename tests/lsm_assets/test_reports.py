"""The example reader asset gets the merged view through the IO manager."""

from __future__ import annotations

from dagster import materialize

from lsm_assets.ingestion import ingested_changes
from lsm_assets.reports import orders_by_status
from resources.io_manager import LsmTableIOManager
from resources.lsm.testing.changegen import EVENTS_SCHEMA, ChangeStreamSpec, generate_changes, replay


def test_orders_by_status_summarizes_the_merged_view(make_table):
    table = make_table(EVENTS_SCHEMA)
    batches = list(generate_changes(ChangeStreamSpec(num_keys=300, num_batches=3, batch_size=200, seed=5)))
    for batch in batches:
        table.write(batch)  # the last batches stay in the WAL only: fresh reads must include them
    oracle = replay(batches)

    result = materialize(
        [ingested_changes.to_source_asset(), orders_by_status],
        resources={"lsm_io_manager": LsmTableIOManager(uri=table.uri)},
    )
    metadata = result.asset_materializations_for_node("orders_by_status")[0].metadata
    assert metadata["live_orders"].value == len(oracle)
    for status in {row["status"] for row in oracle.values()}:
        expected = [row for row in oracle.values() if row["status"] == status]
        assert metadata[f"{status}_orders"].value == len(expected)
        assert abs(metadata[f"{status}_amount"].value - sum(r["amount"] for r in expected)) < 0.01
