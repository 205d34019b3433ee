"""Write activity: what a pending-run keeper reads to wait for the writers' pauses."""

from __future__ import annotations

import time

import pyarrow as pa

from resources.lsm import LsmTable
from resources.lsm.write.activity import WriteActivity


def test_no_quiet_while_any_put_is_in_flight():
    activity = WriteActivity()
    with activity.writing():
        with activity.writing():  # two shards' puts overlapping
            assert activity.quiet_seconds() == 0
        assert activity.quiet_seconds() == 0, "one put is still in flight"
    time.sleep(0.05)
    assert activity.quiet_seconds() >= 0.05


def test_a_tables_writes_are_its_activity(tmp_path):
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("value", pa.int64())])
    table = LsmTable.create(str(tmp_path / "t.lance"), schema, ["id"], num_shards=2)
    time.sleep(0.2)
    assert table.write_activity.quiet_seconds() >= 0.2
    table.write(pa.table({"id": pa.array([1, 2, 3], pa.int64()), "value": [1, 2, 3]}, schema=schema))
    assert table.write_activity.quiet_seconds() < 0.2, "the write ended just now"
    table.close()
