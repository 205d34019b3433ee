"""Landing files of CDC envelopes (Debezium, generic) and unknown columns (refused, or added with auto_evolve)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from resources.lsm import LsmTable
from resources.lsm.ingest.cdc import CdcFormat
from resources.lsm.ingest.landing import LandingPolicy
from resources.lsm.spark.ingest import ingest_landing_files
from tests.helpers import rows_by_key

DEBEZIUM_DIR = LandingPolicy(cdc_formats=(("", CdcFormat("debezium")),))


def envelope(op: str, lsn: int, before: dict | None = None, after: dict | None = None) -> dict:
    return {"op": op, "before": before, "after": after, "source": {"lsn": lsn}, "ts_ms": 0}


def item(key: int, name: str, **extra: object) -> dict:
    return {"id": key, "name": name, "price": float(key), **extra}


def lines(*records: object) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)


def view(table: LsmTable) -> dict:
    return {k[0]: (r["name"], r.get("note")) for k, r in rows_by_key(table.read()).items()}


def quarantined(path: str | None) -> list[tuple[str, int, str]]:
    assert path is not None
    rows = [json.loads(line) for f in sorted(Path(path).glob("*.json")) for line in f.read_text().splitlines()]
    return sorted((r["file"], r["row"], r["reason"]) for r in rows)


def test_debezium_files_land_with_deletes_tombstones_and_bad_envelopes_quarantined(spark, make_table, tmp_path):
    table = make_table()
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "a.jsonl").write_text(
        lines(
            envelope("r", 1, None, item(1, "snap")),
            {"schema": {"type": "struct"}, "payload": envelope("c", 2, None, item(2, "two"))},
            envelope("u", 5, item(1, "snap"), item(1, "updated")),
            envelope("c", 4, None, item(1, "older than the update")),
            envelope("c", 3, None, item(3, "three")),
        )
    )
    (landing / "b.jsonl").write_text(
        lines(
            envelope("d", 6, item(2, "two"), None),
            {"key": {"id": 2}, "value": None},
            "null",
            envelope("t", 7),
            envelope("u", 8, None, None),
            envelope("c", 9, None, item(4, "four")),
            {"key": {"id": 3}, "value": None},
        )
    )
    report = ingest_landing_files(spark, table.uri, str(landing), str(tmp_path / "q"), "cdc", policy=DEBEZIUM_DIR)
    assert view(LsmTable.open(table.uri)) == {1: ("updated", None), 4: ("four", None)}
    assert report.files == ("a.jsonl", "b.jsonl") and report.rows_quarantined == 2
    assert quarantined(report.quarantine_path) == [
        ("b.jsonl", 3, "Debezium op 't' is not one of c, r, u, d"),
        ("b.jsonl", 4, "Debezium op 'u' without an 'after' object"),
    ]


def test_suffix_formats_mix_plain_and_generic_cdc_files(spark, make_table, tmp_path):
    table = make_table()
    landing = tmp_path / "landing"
    landing.mkdir()
    pq.write_table(pa.table({"id": [1, 2], "name": ["p1", "p2"], "price": [1.0, 2.0]}), landing / "a.parquet")
    generic = CdcFormat(
        "generic", op_column="kind", delete_values=("D",), order_columns=("commit",), drop_columns=("commit",)
    )
    pq.write_table(
        pa.table(
            {
                "id": [1, 2, 2],
                "name": ["g1", "g2", "g2"],
                "price": [1.0, 2.0, 2.0],
                "kind": ["U", "D", "U"],
                "commit": [1, 9, 3],
            }
        ),
        landing / "b.cdc.parquet",
    )
    policy = LandingPolicy(cdc_formats=((".cdc.parquet", generic),))
    report = ingest_landing_files(spark, table.uri, str(landing), str(tmp_path / "q"), "mixed", policy=policy)
    assert report.rows_quarantined == 0
    # Key 2: the delete (commit 9) outranks the upsert listed after it (commit 3).
    assert view(LsmTable.open(table.uri)) == {1: ("g1", None)}


def test_unknown_columns_are_refused_unless_auto_evolve_adds_them(spark, make_table, tmp_path):
    table = make_table()
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "a.jsonl").write_text(
        lines(envelope("c", 1, None, item(1, "old")), envelope("c", 2, None, item(2, "new", note="n2")))
    )
    refused = ingest_landing_files(spark, table.uri, str(landing), str(tmp_path / "q"), "r1", policy=DEBEZIUM_DIR)
    assert quarantined(refused.quarantine_path) == [("a.jsonl", 1, "unknown column 'note' holds 'n2'")]
    assert refused.columns_added == ()
    assert view(LsmTable.open(table.uri)) == {1: ("old", None)}

    (landing / "b.jsonl").write_text(
        lines(envelope("c", 3, None, item(3, "new", note="n3")), envelope("u", 4, None, item(1, "no note")))
    )
    evolving = LandingPolicy(cdc_formats=DEBEZIUM_DIR.cdc_formats, auto_evolve=True)
    added = ingest_landing_files(spark, table.uri, str(landing), str(tmp_path / "q"), "r2", policy=evolving)
    assert added.columns_added == ("note",) and added.rows_quarantined == 0
    evolved = LsmTable.open(table.uri)
    assert evolved.schema.field("note").type == pa.string()
    assert view(evolved) == {1: ("no note", None), 3: ("new", "n3")}


def test_auto_evolve_in_continuous_mode_evolves_through_the_open_writers(spark, make_table, tmp_path):
    table = make_table()
    table.claim()  # a continuous run's writers, open across micro-batches
    landing = tmp_path / "landing"
    landing.mkdir()
    pq.write_table(pa.table({"id": [1], "name": ["plain"], "price": [1.0]}), landing / "a.parquet")
    pq.write_table(pa.table({"id": [2], "name": ["wide"], "price": [2.0], "note": ["n2"]}), landing / "b.parquet")
    policy = LandingPolicy(auto_evolve=True)
    report = ingest_landing_files(
        spark, table.uri, str(landing), str(tmp_path / "q"), "cont", writers=table, policy=policy
    )
    assert report.columns_added == ("note",) and report.rows_quarantined == 0
    assert table.schema.names[-1] == "note"
    table.write(pa.table({"id": pa.array([3], pa.int64()), "name": ["direct"], "price": [3.0], "note": ["n3"]}))
    assert view(table) == {1: ("plain", None), 2: ("wide", "n2"), 3: ("direct", "n3")}
