"""Write activity: whether a table's writers are bound by the cores, as a pending-run keeper asks."""

from __future__ import annotations

import time

import pyarrow as pa

from resources.lsm import LsmTable
from resources.lsm.write.activity import PAUSE_SECONDS, WriteActivity


def test_writers_are_bound_by_the_cores_while_any_put_is_in_flight_and_until_they_pause():
    activity = WriteActivity()
    time.sleep(PAUSE_SECONDS)
    assert not activity.cores_bound(), "no put yet"
    with activity.writing():
        with activity.writing():  # two shards' puts overlapping
            assert activity.cores_bound()
        assert activity.cores_bound(), "one put is still in flight"
    assert activity.cores_bound(), "the next put of a writer going flat out follows at once"
    time.sleep(PAUSE_SECONDS)
    assert not activity.cores_bound(), "a pause"


def test_writers_held_for_merge_capacity_are_bound_by_merges():
    activity = WriteActivity()
    activity.held()
    with activity.writing():
        assert not activity.cores_bound()


def test_a_tables_puts_and_backpressure_waits_are_its_activity(tmp_path):
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("value", pa.int64())])
    table = LsmTable.create(str(tmp_path / "t.lance"), schema, ["id"], num_shards=2)
    activity = table.handle.write_activity
    time.sleep(PAUSE_SECONDS)
    assert not activity.cores_bound()
    table.write(pa.table({"id": pa.array([1, 2, 3], pa.int64()), "value": [1, 2, 3]}, schema=schema))
    assert activity.cores_bound(), "the put ended just now"
    table.close()
