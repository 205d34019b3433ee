"""The example reader assets: the merged view, and the change feed, through the IO manager."""

from __future__ import annotations

from dagster import instance_for_test, materialize

from lsm_assets.ingestion import ingested_changes
from lsm_assets.reports import order_totals, orders_by_status
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


def test_order_totals_follow_the_change_feed_and_equal_a_full_recomputation(make_table, tmp_path):
    table = make_table(EVENTS_SCHEMA)
    batches = list(generate_changes(ChangeStreamSpec(num_keys=300, num_batches=4, batch_size=200, seed=9)))
    assets = [ingested_changes.to_source_asset(), orders_by_status, order_totals]
    with instance_for_test() as instance:

        def run(uri: str = table.uri):
            resources = {"lsm_io_manager": LsmTableIOManager(uri=uri)}
            return materialize(assets, resources=resources, instance=instance, raise_on_error=False)

        changes_read = []
        for number, batch in enumerate(batches):
            table.write(batch)
            if number == 1:
                table.close()
                table.compact()  # a merge between two runs
            if number == 2:  # a failed run records no cursor: the next one reads its changes again
                assert not run(str(tmp_path / "missing.lance")).success
                continue
            result = run()
            full, incremental = (
                {k: v.value for k, v in result.asset_materializations_for_node(name)[0].metadata.items()}
                for name in ("orders_by_status", "order_totals")
            )
            changes_read.append(incremental.pop("changes_read"))
            for name in [n for n in full if n.endswith("_orders") or n == "live_orders"]:
                assert incremental[name] == full[name], name
            for name in [n for n in full if n.endswith("_amount")]:
                assert abs(incremental[name] - full[name]) < 0.01, name
            assert set(incremental) - {"totals", "lsm/changes_until"} == set(full)
        assert changes_read[0] == len(replay(batches[:1]))  # the first run reads the whole view
        assert all(0 < n < len(replay(batches)) for n in changes_read[1:])
