"""Change streams for any declared schema, and their Debezium form, through the real engine."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from resources.lsm.ingest.cdc import CdcFormat, records_to_changes
from resources.lsm.testing.changegen import (
    EVENTS_SCHEMA,
    ChangeStreamSpec,
    debezium_records,
    generate_changes,
    generate_table_changes,
    replay,
    replay_table,
    write_table_landing_files,
)
from tests.helpers import rows_by_key

SPEC = ChangeStreamSpec(num_keys=300, num_batches=3, batch_size=200, seed=5)
INT_KEY = pa.schema([pa.field("id", pa.int64(), False), ("reading", pa.float64()), ("at", pa.timestamp("us"))])
STRING_KEY = pa.schema([pa.field("sku", pa.string(), False), ("price", pa.decimal128(12, 2)), ("ok", pa.bool_())])
COMPOSITE = pa.schema([pa.field("order", pa.string(), False), pa.field("line", pa.int32(), False), ("qty", pa.int32())])
SCHEMAS = {"int64": (INT_KEY, ["id"]), "string": (STRING_KEY, ["sku"]), "composite": (COMPOSITE, ["order", "line"])}


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_a_stream_of_any_schema_lands_in_the_engine_as_its_oracle_says(make_table, kind):
    schema, key = SCHEMAS[kind]
    batches = list(generate_table_changes(schema, key, SPEC))
    assert batches[0].equals(next(generate_table_changes(schema, key, SPEC)))  # deterministic per seed
    assert all(b.schema.names == [*schema.names, "_op", "_seq"] for b in batches)
    seqs = [s for b in batches for s in b["_seq"].to_pylist()]
    assert len(set(seqs)) == len(seqs)

    table = make_table(schema, key, num_shards=2)
    for batch in batches:
        table.write(batch)
    oracle = replay_table(batches, key)
    assert 0 < len(oracle) <= SPEC.num_keys
    assert rows_by_key(table.read(), key) == oracle


def test_the_events_stream_is_unchanged_and_its_oracles_agree():
    batches = list(generate_changes(SPEC))
    assert {k[0]: v for k, v in replay_table(batches, ["id"]).items()} == replay(batches)
    assert batches[0].schema.names == [*EVENTS_SCHEMA.names, "_op", "_seq"]


def test_debezium_envelopes_round_trip_through_the_cdc_reader(make_table, tmp_path):
    schema, key = SCHEMAS["composite"]
    batches = write_table_landing_files(schema, key, SPEC, str(tmp_path / "landing"), "debezium", prefix="cdc")
    files = sorted((tmp_path / "landing").iterdir())
    assert [f.name for f in files] == [f"cdc-{n:06d}.jsonl" for n in range(SPEC.num_batches)]
    table = make_table(schema, key, num_shards=2)
    for file in files:
        records = [json.loads(line) for line in file.read_text().splitlines()]
        changes = records_to_changes(records, CdcFormat("debezium", "source.lsn"))
        assert not changes.rejections
        table.write(changes.changes)
    assert rows_by_key(table.read(), key) == replay_table(batches, key)
    assert {r["op"] for r in debezium_records(batches[-1], key)} == {"u", "d"}


def test_malformed_rows_are_only_made_for_the_events_table(tmp_path):
    schema, key = SCHEMAS["string"]
    with pytest.raises(ValueError, match="events table"):
        write_table_landing_files(schema, key, SPEC, str(tmp_path), malformed_per_file=1)
