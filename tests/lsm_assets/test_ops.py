"""The schema-evolution job, run for real: Dagster + Lance on disk; then the IO manager reads the new column."""

from __future__ import annotations

import pyarrow as pa
from dagster import MaterializeResult, asset, materialize

from jobs import add_columns_job
from resources.io_manager import LsmTableIOManager
from resources.lsm import LsmTable
from resources.lsm.testing.changegen import EVENTS_SCHEMA
from resources.table_resource import LsmTableResource

SEEN: dict[str, pa.Table] = {}


@asset
def orders() -> MaterializeResult:
    """Stands in for ingestion: the table was written through the engine already."""
    return MaterializeResult()


@asset
def loaded(orders: pa.Table) -> None:
    SEEN["orders"] = orders


def order(key: int, **extra: list[object]) -> pa.Table:
    return pa.table({"id": pa.array([key], pa.int64()), "customer": ["c"], "amount": [1.0], "status": ["new"], **extra})


def run_job(uri: str, columns: dict[str, str]):
    return add_columns_job.execute_in_process(
        run_config={"ops": {"add_table_columns": {"config": {"columns": columns}}}},
        resources={"lsm_table": LsmTableResource(uri=uri)},
    )


def observed(result) -> list[str]:
    (observation,) = [e.asset_observation_data.asset_observation for e in result.all_events if e.is_asset_observation]
    return observation.metadata["columns_added"].value


def test_add_columns_job_evolves_the_live_table_and_a_rerun_adds_nothing(make_table):
    table = make_table(EVENTS_SCHEMA)
    table.write(order(1))
    table.close()
    table.write(order(2))
    table.detach_writers()  # key 2 is left in the WAL only: the job flushes and merges it first
    result = run_job(table.uri, {"channel": "string", "score": "int32"})
    assert result.success and observed(result) == ["channel", "score"]
    evolved = LsmTable.open(table.uri)
    assert evolved.schema.field("score").type == pa.int32()
    assert all(s.pending_generations == () and s.unflushed_wal_entries == 0 for s in evolved.shards())
    evolved.write(order(3, channel=["web"], score=pa.array([7], pa.int32())))

    again = run_job(table.uri, {"channel": "string"})
    assert again.success and observed(again) == []

    assert materialize([orders, loaded], resources={"io_manager": LsmTableIOManager(uri=table.uri)}).success
    rows = {r["id"]: (r["channel"], r["score"]) for r in SEEN["orders"].to_pylist()}
    assert rows == {1: (None, None), 2: (None, None), 3: ("web", 7)}
    evolved.close()
