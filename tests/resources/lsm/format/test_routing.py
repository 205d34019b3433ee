"""Routing agrees with Lance's own bucket hash, for every key type."""

from __future__ import annotations

import pyarrow as pa
import pytest
from lance import mem_wal

from resources.lsm.format.routing import shard_ids_for
from resources.lsm.format.shard_manifest import list_wal_entries
from resources.lsm.format.wal import read_wal_entry


def _bucket_spec(num_buckets: int, source_id: int) -> mem_wal.ShardingSpec:
    """Lance's bucket transform, built independently of the table's own spec."""
    field = mem_wal.ShardingField(
        field_id="bucket",
        source_ids=[source_id],
        transform="bucket",
        result_type="int32",
        parameters={"num_buckets": str(num_buckets)},
    )
    return mem_wal.ShardingSpec(spec_id=1, fields=[field])


@pytest.mark.parametrize(
    "key_type, keys, expected",
    [
        (pa.int32(), [1, 2, 3], [2, 7, 1]),
        (pa.string(), ["a", "b"], [1, 5]),
    ],
)
def test_lance_bucket_hash_matches_the_spec_vectors(make_table, key_type, keys, expected):
    # Test vectors from Lance's MemWAL spec (8 buckets).
    table = make_table(pa.schema([("k", key_type), ("v", pa.string())]), ["k"], num_shards=8)
    buckets = table.buckets(pa.table({"k": pa.array(keys, key_type)}))
    assert buckets.tolist() == expected


@pytest.mark.parametrize(
    "schema, primary_key, make_rows",
    [
        (pa.schema([("id", pa.int64()), ("v", pa.string())]), ["id"], lambda i: {"id": i * 7919, "v": str(i)}),
        (pa.schema([("id", pa.string()), ("v", pa.string())]), ["id"], lambda i: {"id": f"user-{i}", "v": str(i)}),
        (
            pa.schema([("tenant", pa.string()), ("id", pa.int32()), ("v", pa.string())]),
            ["tenant", "id"],
            lambda i: {"tenant": f"t{i % 5}", "id": i, "v": str(i)},
        ),
    ],
)
def test_every_row_lands_in_the_shard_of_its_lance_bucket(make_table, schema, primary_key, make_rows):
    table = make_table(schema, primary_key, num_shards=4)
    rows = pa.Table.from_pylist([make_rows(i) for i in range(200)], schema=schema)
    table.write(rows)

    lance_schema = table.dataset().lance_schema
    spec = _bucket_spec(4, source_id=lance_schema.field(primary_key[0]).id())
    seen = 0
    for bucket, shard_id in enumerate(shard_ids_for(4)):
        for entry in list_wal_entries(table.handle.storage, shard_id):
            _, logged = read_wal_entry(table.handle.storage, shard_id, entry)
            if logged.num_rows == 0:
                continue
            got = mem_wal.evaluate_sharding_spec(logged.select(schema.names).to_batches()[0], spec, lance_schema)
            assert set(got.column(0).to_pylist()) == {bucket}
            seen += logged.num_rows
    assert seen == rows.num_rows


def test_shard_ids_are_stable_and_recorded_with_the_table(make_table):
    table = make_table(num_shards=3)
    reopened = type(table).open(table.uri)
    assert reopened.shard_ids == table.shard_ids == shard_ids_for(3)
    assert [s.shard_id for s in reopened.shards()] == shard_ids_for(3)
    assert [s.bucket for s in reopened.shards()] == [0, 1, 2]
