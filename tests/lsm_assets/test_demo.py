"""The demo asset writes a generated stream whose merged view equals the oracle."""

from __future__ import annotations

from dagster import materialize

from lsm_assets.demo import demo_changes
from resources.table_resource import LsmTableResource
from resources.lsm import LsmTable
from resources.lsm.changegen import ChangeStreamSpec, generate_changes, replay
from tests.helpers import rows_by_key

CONFIG = {"num_keys": 300, "num_batches": 4, "batch_size": 200, "seed": 3}


def test_demo_changes_lands_the_stream_and_reports_metadata(tmp_path):
    uri = str(tmp_path / "table.lance")
    result = materialize([demo_changes], resources={"lsm_table": LsmTableResource(uri=uri)},
                         run_config={"ops": {"demo_changes": {"config": CONFIG}}})
    assert result.success

    expected = replay(list(generate_changes(ChangeStreamSpec(**CONFIG))))
    table = LsmTable.open(uri)
    assert {k[0]: v for k, v in rows_by_key(table.read()).items()} == expected

    metadata = result.asset_materializations_for_node("demo_changes")[0].metadata
    assert metadata["live_rows"].value == len(expected)
    assert metadata["rows_written"].value == metadata["upserts"].value + metadata["deletes"].value
    assert metadata["rows_per_s"].value > 0
