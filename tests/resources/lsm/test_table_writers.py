"""Opening shard writers over whatever WAL earlier writers left behind."""

from __future__ import annotations

import logging

import pyarrow as pa

from resources.lsm import LsmTable
from tests.helpers import rows_by_key

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


def test_a_wal_generation_larger_than_the_memtable_limit_is_flushed_not_fatal(make_table, caplog):
    table = make_table(SCHEMA, num_shards=1, max_memtable_rows=300)
    shard = table.shard_ids[0]
    # A writer with larger limits logs one 500-row generation and dies unflushed: a replaying writer
    # of the recorded limits (300 rows) refuses that WAL, as after some store faults.
    oversized = table.dataset().mem_wal_writer(shard, max_memtable_rows=1000, durable_write=True)
    for start in range(0, 500, 100):  # one generation logged as five WAL entries
        oversized.put(pa.table({"id": pa.array(range(start, start + 100), pa.int64()), "v": ["old"] * 100}))

    reopened = LsmTable.open(table.uri)
    with caplog.at_level(logging.WARNING, logger="resources.lsm.table"):
        reopened.write(pa.table({"id": pa.array([0, 1000], pa.int64()), "v": ["new", "new"]}))
    reopened.close()
    assert oversized.memtable_stats()["row_count"] == 500  # never flushed: still open, and now fenced

    assert "larger MemTable limits" in caplog.text
    view = rows_by_key(LsmTable.open(table.uri).read())
    assert len(view) == 501 and view[(0,)]["v"] == "new" and view[(1000,)]["v"] == "new" and view[(7,)]["v"] == "old"
