"""CDC envelopes → the change layout: Debezium (wrapped or not, tombstones, ordering) and generic mappings."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from resources.lsm.ingest.cdc import CdcFormat, records_to_changes, to_changes
from resources.lsm.ingest.landing import LandingPolicy, read_landing_file

DEBEZIUM = CdcFormat("debezium")


def envelope(op: str, lsn: int, before: dict | None = None, after: dict | None = None, ts_ms: int = 0) -> dict:
    return {"op": op, "before": before, "after": after, "source": {"lsn": lsn, "ts_ms": ts_ms}, "ts_ms": ts_ms}


def item(key: int, name: str) -> dict:
    return {"id": key, "name": name, "price": float(key)}


def test_debezium_ops_map_to_upserts_and_deletes_ordered_by_lsn():
    records = [
        envelope("u", 30, item(1, "a"), item(1, "b")),
        envelope("c", 10, None, item(1, "a")),
        envelope("r", 5, None, item(2, "snap")),
        envelope("d", 40, item(2, "snap"), None),
    ]
    mapped = records_to_changes(records, DEBEZIUM)
    rows = mapped.changes.to_pylist()
    assert [(r["id"], r["name"], r["_op"]) for r in rows] == [
        (1, "b", "upsert"),
        (1, "a", "upsert"),
        (2, "snap", "upsert"),
        (2, "snap", "delete"),
    ]
    # _seq ranks by LSN: the create (lsn 10) before the update (lsn 30), though it came later.
    assert [r["_seq"] for r in rows] == [2, 1, 0, 3]
    assert mapped.rejections == [] and mapped.record_numbers.tolist() == [0, 1, 2, 3]


def test_schema_payload_wrapper_and_kafka_key_value_pairs_unwrap():
    wrapped = {"schema": {"type": "struct"}, "payload": envelope("c", 1, None, item(7, "w"))}
    pair = {"key": {"id": 8}, "value": {"schema": {}, "payload": envelope("c", 2, None, item(8, "kv"))}}
    mapped = records_to_changes([wrapped, pair], DEBEZIUM)
    assert [(r["id"], r["name"], r["_op"]) for r in mapped.changes.to_pylist()] == [
        (7, "w", "upsert"),
        (8, "kv", "upsert"),
    ]


def test_tombstones_with_a_key_delete_and_keyless_ones_are_skipped():
    records = [
        envelope("c", 9, None, item(3, "x")),
        {"key": {"id": 3}, "value": None},  # tombstone after a delete: deletes the key, ranked first
        None,  # a bare tombstone: no key, nothing to do
        {"schema": {}, "payload": None},
    ]
    mapped = records_to_changes(records, DEBEZIUM)
    assert mapped.skipped == 2
    rows = {r["_seq"]: (r["id"], r["_op"]) for r in mapped.changes.to_pylist()}
    # The keyed tombstone never overrides a change of its batch: it sorts before it.
    assert rows == {0: (3, "delete"), 1: (3, "upsert")}


def test_malformed_envelopes_are_rejected_one_by_one_with_reasons():
    records = [
        envelope("c", 1, None, item(1, "ok")),
        envelope("t", 2),
        envelope("c", 3, None, None),
        envelope("d", 4, None, None),
        {"op": "c", "after": item(5, "no-lsn")},
        ["not", "an", "envelope"],
        envelope("u", "later", None, item(6, "string lsn")),
    ]
    mapped = records_to_changes(records, DEBEZIUM)
    reasons = {r.row: r.reason for r in mapped.rejections}
    assert sorted(reasons) == [1, 2, 3, 4, 5, 6]
    assert "'t' is not one of c, r, u, d" in reasons[1]
    assert "without an 'after'" in reasons[2]
    assert "without a 'before'" in reasons[3]
    assert "no source.lsn" in reasons[4]
    assert "not an object" in reasons[5]
    assert "does not compare" in reasons[6]
    assert mapped.changes["id"].to_pylist() == [1] and mapped.record_numbers.tolist() == [0]


def test_ordering_by_ts_ms_keeps_record_order_on_ties():
    records = [
        envelope("u", 0, None, item(1, n), ts_ms=ts) for n, ts in (("late", 200), ("first", 100), ("second", 100))
    ]
    mapped = records_to_changes(records, CdcFormat("debezium", order_by="ts_ms"))
    by_seq = sorted(mapped.changes.to_pylist(), key=lambda r: r["_seq"])
    assert [r["name"] for r in by_seq] == ["first", "second", "late"]


def test_generic_mapping_from_an_arrow_table():
    rows = pa.table(
        {
            "id": [1, 1, 2, 3],
            "name": ["a", "b", "c", "d"],
            "price": [1.0, 2.0, 3.0, 4.0],
            "kind": ["I", "D", "U", "X"],
            "commit": [2, 5, 1, 1],
            "pos": [0, 0, 1, 0],
        }
    )
    fmt = CdcFormat(
        "generic", op_column="kind", delete_values=("D",), upsert_values=("I", "U"), order_columns=("commit", "pos")
    )
    mapped = to_changes(rows, fmt)
    assert [(r.row, r.reason) for r in mapped.rejections] == [(3, "kind='X' is not a delete ['D'] or upsert value")]
    out = mapped.changes.to_pylist()
    assert "kind" not in mapped.changes.column_names
    assert [(r["id"], r["_op"], r["_seq"]) for r in out] == [(1, "upsert", 1), (1, "delete", 2), (2, "upsert", 0)]


def test_generic_null_ordering_value_is_rejected():
    fmt = CdcFormat("generic", op_column="op", order_columns=("ts",))
    mapped = records_to_changes([{"id": 1, "op": "c", "ts": None}, {"id": 2, "op": "c", "ts": 3}], fmt)
    assert [r.row for r in mapped.rejections] == [0]
    assert mapped.changes["id"].to_pylist() == [2]


def test_invalid_format_settings_are_refused():
    with pytest.raises(ValueError, match="debezium"):
        CdcFormat("maxwell")  # type: ignore[arg-type]


def test_policy_picks_the_longest_matching_suffix():
    generic = CdcFormat("generic")
    policy = LandingPolicy(cdc_formats=(("", DEBEZIUM), (".gen.parquet", generic)))
    assert policy.cdc_format("a.jsonl") is DEBEZIUM
    assert policy.cdc_format("b.gen.parquet") is generic
    assert LandingPolicy().cdc_format("a.jsonl") is None


def test_debezium_json_lines_file_keeps_file_rows_and_line_text(tmp_path):
    lines = [
        json.dumps(envelope("c", 1, None, item(1, "a"))),
        "",
        "null",
        "{broken",
        json.dumps(envelope("x", 2, None, item(2, "b"))),
        json.dumps({"schema": {}, "payload": envelope("u", 3, item(1, "a"), item(1, "c"))}),
    ]
    path = tmp_path / "orders.jsonl"
    path.write_text("\n".join(lines) + "\n")
    read = read_landing_file(str(path), cdc=DEBEZIUM)
    assert [(r.row, r.record) for r in read.rejections] == [(3, "{broken"), (4, lines[4])]
    assert [read.file_row(i) for i in range(read.table.num_rows)] == [0, 5]
    assert read.table["name"].to_pylist() == ["a", "c"]


def test_kafka_messages_as_json_text_columns_decode_and_bad_text_is_rejected():
    messages = pa.table(
        {
            "key": [json.dumps({"id": 1}), json.dumps({"id": 2}), None],
            "value": [json.dumps({"schema": {}, "payload": envelope("c", 1, None, item(1, "kafka"))}), None, "{oops"],
        }
    )
    mapped = to_changes(messages, DEBEZIUM)
    assert [(r["id"], r["_op"]) for r in mapped.changes.to_pylist()] == [(1, "upsert"), (2, "delete")]
    assert [r.row for r in mapped.rejections] == [2] and "not valid JSON" in mapped.rejections[0].reason
