"""Bad landing files never fail an ingestion: bad lines and rows are quarantined, good rows land."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from resources.lsm import LsmTable
from resources.lsm.ingest.landing import IngestLedger, LandingPolicy
from resources.lsm.spark.ingest import ingest_landing_files
from resources.lsm.testing.changegen import EVENTS_SCHEMA, replay
from tests.helpers import rows_by_key

HEADER = "id,customer,amount,status,_op,_seq"


def good(key: int, op: str = "upsert", **values: object) -> dict[str, object]:
    """A valid change row (the oracle's input)."""
    return {"id": key, "customer": f"c{key}", "amount": float(key), "status": "new", "_op": op, "_seq": 0, **values}


def csv_line(row: dict[str, object]) -> str:
    return ",".join(str(row[c]) for c in HEADER.split(","))


def jsonl(rows: list[object]) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def view(table: LsmTable) -> dict:
    return {k[0]: v for k, v in rows_by_key(table.read()).items()}


def quarantined(path: str | None) -> list[dict]:
    assert path is not None
    return [json.loads(line) for f in sorted(Path(path).glob("*.json")) for line in f.read_text().splitlines()]


def by_file(rows: list[dict]) -> dict[str, list[tuple[int, str]]]:
    found: dict[str, list[tuple[int, str]]] = {}
    for r in sorted(rows, key=lambda r: (r["file"], r["row"])):
        found.setdefault(r["file"], []).append((r["row"], r["reason"]))
    return found


def land_poison(landing: Path) -> list[dict[str, object]]:
    """One file per kind of bad content, each with good rows around the bad ones; returns the good rows in order."""
    landing.mkdir()
    rows: list[dict[str, object]] = []

    def add(*new: dict[str, object]) -> list[dict[str, object]]:
        rows.extend(new)
        return list(new)

    (landing / "a-overflow.jsonl").write_text(
        jsonl([*add(good(1)), {**good(0), "id": 1180591620717411303424}, *add(good(2))])
    )
    (landing / "b-op.jsonl").write_text(
        jsonl([*add(good(3)), {**good(4), "_op": ["upsert"]}, {**good(5), "_op": {"x": 1}}, *add(good(6))])
    )
    deep = '{"id": 8, "customer": ' + "[" * 100_000 + "]" * 100_000 + "}"
    (landing / "c-deep.jsonl").write_text(jsonl([*add(good(7)), deep, "", *add(good(9))]))
    dup_header = "id,customer,customer,amount,status"
    (landing / "d-dup.csv").write_text(f"{dup_header}\n10,x,y,1.0,new\n")
    pq.write_table(pa.table([[11], ["x"], ["y"]], names=["id", "customer", "customer"]), landing / "e-dup.parquet")
    (landing / "f-count.csv").write_text(
        f"{HEADER}\n{csv_line(add(good(12))[0])}\n13,x,1.0,new,upsert,0,extra\n\n{csv_line(add(good(14))[0])}\n"
    )
    (landing / "g-utf8.csv").write_bytes(
        f"{HEADER}\n{csv_line(add(good(15))[0])}\n".encode()
        + b"16,caf\xe9,1.0,new,upsert,0\n"
        + f"{csv_line(add(good(17))[0])}\n".encode()
    )
    (landing / "h-utf8.jsonl").write_bytes(
        jsonl([add(good(18))[0]]).encode() + b'{"id": 19, "customer": "\xff"}\n' + jsonl([add(good(20))[0]]).encode()
    )
    (landing / "i-big.csv").write_text(f"{HEADER}\n{csv_line(add(good(21, customer='x' * 1_500_000))[0])}\n")
    nulls = [good(22, customer="NA", status="null"), good(23, customer="N/A", amount="nan"), good(24, customer="NULL")]
    (landing / "j-nulls.csv").write_text(
        f"{HEADER}\n" + "".join(csv_line(r) + "\n" for r in nulls) + "25,,,new,upsert,0\n"
    )
    add(*nulls, good(25, customer=None, amount=None))
    (landing / "k-bool.jsonl").write_text(jsonl([{**good(0), "id": True}, *add(good(26))]))
    (landing / "l-array.json").write_text(json.dumps([good(27)], indent=2) + "\n")
    (landing / "m-trunc.parquet").write_bytes(b"PAR1 half a parquet file")
    (landing / "n-trunc.csv").write_text(f"{HEADER}\n28,x")
    (landing / "o-partial.csv").write_text("id,customer,_op\n29,x,upsert\n1,,delete\n")
    add(good(1, op="delete"))
    (landing / "p.csv.gz").write_bytes(b"\x1f\x8b")
    (landing / "q.tsv").write_text("id\tcustomer\n")
    os.symlink(landing / "gone.csv", landing / "r.csv")
    return rows


def test_poison_files_never_fail_the_run_and_their_good_rows_land(spark, make_table, tmp_path):
    table = make_table(EVENTS_SCHEMA, num_shards=2)
    landing, quarantine = tmp_path / "landing", tmp_path / "quarantine"
    rows = land_poison(landing)

    report = ingest_landing_files(spark, table.uri, str(landing), str(quarantine))

    expected = replay([pa.Table.from_pylist([r]) for r in rows])
    got = view(table)
    assert math.isnan(got[23].pop("amount")) and expected[23].pop("amount") == "nan", "nan stays NaN"
    assert got == expected
    assert (got[22]["customer"], got[22]["status"], got[24]["customer"]) == ("NA", "null", "NULL")
    rejected = quarantined(report.quarantine_path)
    found = by_file(rejected)
    assert found["a-overflow.jsonl"] == [(1, "id='1180591620717411303424' is not a valid int64")]
    assert [row for row, _ in found["b-op.jsonl"]] == [1, 2]
    assert found["c-deep.jsonl"] == [(1, "JSON nested too deeply")]
    assert found["d-dup.csv"] == [(0, "duplicate column names ['customer']")]
    assert found["e-dup.parquet"] == [(0, "duplicate column names ['customer']")]
    assert found["f-count.csv"] == [(1, "line has 7 fields, the header 6")]
    assert found["g-utf8.csv"] == [(1, "column 'customer' is not valid UTF-8")]
    assert found["h-utf8.jsonl"] == [(1, "line is not valid UTF-8")]
    assert "j-nulls.csv" not in found, "NA, N/A, NULL, null, nan are values; only the empty field is null"
    assert found["k-bool.jsonl"] == [(0, "id='true' is not a valid int64")]
    assert "holds one JSON document" in found["l-array.json"][0][1] and found["l-array.json"][0][0] == -1
    assert found["o-partial.csv"] == [(0, "column 'amount' is missing; an upsert must carry every column")]
    records = {(r["file"], r["row"]): r.get("record") for r in rejected}
    assert records[("f-count.csv", 1)] == "13,x,1.0,new,upsert,0,extra", "the original line"
    assert records[("c-deep.jsonl", 1)].startswith('{"id": 8, "customer": [[[')
    assert "m-trunc.parquet" not in found and "n-trunc.csv" not in found
    assert report.files_rejected == {"l-array.json": found["l-array.json"][0][1]}
    assert report.scan.incomplete == ("m-trunc.parquet", "n-trunc.csv")
    assert set(report.scan.unsupported) == {"p.csv.gz", "q.tsv", "r.csv"}
    assert report.scan.unsupported["r.csv"] == "dangling symbolic link"
    assert "m-trunc.parquet" not in IngestLedger(table.handle.storage).ingested_names()

    # The next run takes the files once they are complete, and nothing else changes.
    pq.write_table(pa.Table.from_pylist([good(30)], schema=None), landing / "m-trunc.parquet")
    (landing / "n-trunc.csv").write_text(f"{HEADER}\n{csv_line(good(28))}\n")
    again = ingest_landing_files(spark, table.uri, str(landing), str(quarantine))
    assert again.files == ("m-trunc.parquet", "n-trunc.csv") and again.rows_quarantined == 0
    expected.update(
        {30: replay([pa.Table.from_pylist([good(30)])])[30], 28: replay([pa.Table.from_pylist([good(28)])])[28]}
    )
    got = view(table)
    got[23].pop("amount")
    assert got == expected


def test_a_file_landed_again_with_other_content_is_reported_and_skipped_by_default(spark, make_table, tmp_path):
    table = make_table(EVENTS_SCHEMA, num_shards=2)
    landing, quarantine = tmp_path / "landing", tmp_path / "quarantine"
    landing.mkdir()
    (landing / "a.jsonl").write_text(jsonl([good(1)]))
    ingest_landing_files(spark, table.uri, str(landing), str(quarantine))
    (landing / "a.jsonl").write_text(jsonl([good(1, customer="changed"), good(2)]))

    skipped = ingest_landing_files(spark, table.uri, str(landing), str(quarantine), run_id="second")

    assert skipped.files == () and list(skipped.scan.changed) == ["a.jsonl"]
    assert "was already ingested: skipped, left in place (changed_files='skip')" in skipped.scan.changed["a.jsonl"]
    assert [(r["file"], r["row"]) for r in quarantined(skipped.quarantine_path)] == [("a.jsonl", -1)]
    assert view(table) == replay([pa.Table.from_pylist([good(1)])]) and (landing / "a.jsonl").exists()

    ingested = ingest_landing_files(
        spark, table.uri, str(landing), str(quarantine), policy=LandingPolicy(changed_files="ingest")
    )
    assert ingested.files == ("a.jsonl",)
    assert view(table) == replay([pa.Table.from_pylist([good(1, customer="changed"), good(2)])])
    assert ingest_landing_files(spark, table.uri, str(landing), str(quarantine)).scan.changed == {}


def test_a_missing_landing_directory_is_reported_not_an_error(spark, make_table, tmp_path):
    table = make_table(EVENTS_SCHEMA, num_shards=2)
    report = ingest_landing_files(spark, table.uri, str(tmp_path / "nowhere"), str(tmp_path / "quarantine"))
    assert report.files == () and report.scan.landing_dir_missing


def test_files_of_a_format_the_table_does_not_take_are_reported_and_left(spark, make_table, tmp_path):
    table = make_table(EVENTS_SCHEMA, num_shards=2)
    landing = tmp_path / "landing"
    landing.mkdir()
    pq.write_table(pa.Table.from_pylist([good(1), good(2)]), landing / "a.parquet")
    (landing / "b.jsonl").write_text(jsonl([good(3)]))
    (landing / "c.csv").write_text(f"{HEADER}\n{csv_line(good(4))}\n")
    policy = LandingPolicy(formats=("parquet",))

    report = ingest_landing_files(spark, table.uri, str(landing), str(tmp_path / "q"), policy=policy)

    assert list(report.files) == ["a.parquet"] and set(view(table)) == {1, 2}
    assert set(report.scan.unsupported) == {"b.jsonl", "c.csv"}
    assert "not among this table's landing formats ['parquet']" in report.scan.unsupported["b.jsonl"]
    assert sorted(p.name for p in landing.iterdir() if p.is_file()) == ["b.jsonl", "c.csv"]  # left, never read
