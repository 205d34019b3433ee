"""Adding nullable columns to a live table: every reader returns them, across base, generations and WAL tail."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pytest

from resources.lsm import LsmTable, register_spark_source
from resources.lsm.errors import InvalidChangesError, WriterFencedError
from resources.lsm.format.schema import ADDED_COLUMN_METADATA
from tests.helpers import rows_by_key
from tests.resources.lsm.evolve_child import NEW_COLUMN

NOTE = pa.field("note", pa.string())
ITEMS = pa.schema([("id", pa.int64()), ("name", pa.string()), ("price", pa.float64())])


def items(ids: list[int], name: str, **extra: list[object]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "name": [name] * len(ids), "price": [1.0] * len(ids), **extra})


def view(table: LsmTable) -> dict:
    return {k[0]: (r["name"], r.get("note")) for k, r in rows_by_key(table.read()).items()}


def levels_then_raw_evolve(make_table) -> LsmTable:
    """Rows in the base, a pending generation and the WAL tail, all of the old schema; then the base gains ``note``.

    The base is evolved with Lance directly, without draining: the state a
    writer opened before the change leaves when it keeps writing after it.
    """
    table = make_table()
    table.write(items([1, 2, 3], "base"))
    table.close()
    table.compact()
    table.write(items([2, 4], "generation"))
    table.close()
    table.write(items([3, 5], "tail"))
    table.detach_writers()
    table.dataset().add_columns(NOTE.with_metadata({ADDED_COLUMN_METADATA: b"true"}))
    return LsmTable.open(table.uri)


def test_every_reader_returns_the_new_column_null_for_older_rows_across_levels(make_table, spark):
    table = levels_then_raw_evolve(make_table)
    assert "note" in table.schema.names and "note" in table.added_columns
    table.write(items([5, 6], "new", note=["n5", "n6"]))
    table.detach_writers()  # the new rows stay in the WAL tail, after the old-schema entries
    expected = {
        1: ("base", None),
        2: ("generation", None),
        3: ("tail", None),
        4: ("generation", None),
        5: ("new", "n5"),
        6: ("new", "n6"),
    }
    assert view(table) == expected
    assert sorted(table.read(filter="note IS NOT NULL")["id"].to_pylist()) == [5, 6]
    found = table.lookup([1, 2, 3, 5])
    assert dict(zip(found["id"].to_pylist(), found["note"].to_pylist(), strict=True)) == {
        1: None,
        2: None,
        3: None,
        5: "n5",
    }
    register_spark_source(spark)
    frame = spark.read.format("lance_lsm").load(table.uri).toPandas()
    assert dict(zip(frame["id"], frame["note"].where(frame["note"].notna(), None), strict=True)) == {
        k: v[1] for k, v in expected.items()
    }
    table.flush()
    table.compact()
    assert view(LsmTable.open(table.uri)) == expected
    assert all(s.pending_generations == () for s in table.shards())


def test_add_columns_drains_then_evolves_and_stale_writers_keep_working(make_table):
    table = make_table()
    stale = LsmTable.open(table.uri)
    stale.write(items([1, 2], "stale"))  # its writers stay open across the change
    table.write(items([3], "before"))
    assert table.add_columns([NOTE]) == ["note"]
    assert all(s.pending_generations == () and s.unflushed_wal_entries == 0 for s in table.shards())
    # Its writer of key 2's shard was fenced by the change; a retry reclaims it, on the new schema (note null).
    with pytest.raises(WriterFencedError):
        stale.write(items([2], "stale again"))
    stale.write(items([2], "stale again"))
    table.write(items([4], "after", note=["n4"]))
    table.write(items([5], "no note"))  # an added column may be left out of an upsert
    assert view(table) == {
        1: ("stale", None),
        2: ("stale again", None),
        3: ("before", None),
        4: ("after", "n4"),
        5: ("no note", None),
    }
    assert table.add_columns(NOTE) == []  # a re-run adds nothing
    stale.close()


def test_only_nullable_unreserved_columns_of_a_new_or_equal_type_are_added(make_table):
    table = make_table()
    with pytest.raises(ValueError, match="nullable"):
        table.add_columns(pa.field("x", pa.int64(), nullable=False))
    with pytest.raises(ValueError, match="reserved"):
        table.add_columns(pa.field("_seq", pa.int64()))
    with pytest.raises(ValueError, match="exists with type"):
        table.add_columns(pa.field("name", pa.int64()))
    with pytest.raises(InvalidChangesError, match="unknown columns"):
        table.write(items([1], "x", note=["n"]))  # not added yet
    assert table.schema.names == ["id", "name", "price"]


@pytest.mark.parametrize("kill_after", ["fenced", "flushed", "merged", "evolved"])
def test_sigkill_between_steps_then_rerun_completes_with_every_row_once(make_table, kill_after):
    table = make_table()
    table.write(items(list(range(50)), "parent"))
    table.close()
    child = subprocess.run(
        [sys.executable, "-m", "tests.resources.lsm.evolve_child", table.uri, kill_after, "40", "30"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == -9 and "ack" in child.stdout, child.stderr
    expected = dict.fromkeys(range(40), ("parent", None)) | dict.fromkeys(range(40, 70), ("child", None))
    crashed = LsmTable.open(table.uri)
    assert view(crashed) == expected  # every acknowledged row exactly once, whatever step died
    assert ("note" in crashed.schema.names) == (kill_after == "evolved")
    crashed.add_columns(NEW_COLUMN)
    crashed.write(items([70], "after", note=["n70"]))
    assert view(crashed) == expected | {70: ("after", "n70")}
    assert crashed.lookup([45])["note"].to_pylist() == [None]
    crashed.close()


def test_a_merge_by_an_object_opened_before_the_change_keeps_the_new_column(make_table):
    table = make_table()
    stale = LsmTable.open(table.uri)  # opened on the old schema
    table.add_columns(NOTE)
    table.write(items([1, 2], "new", note=["n1", "n2"]))
    table.close()  # a generation of the new shape
    table.write(items([3], "tail", note=["n3"]))
    table.detach_writers()  # and a WAL tail of the new shape
    # The stale object reads its own columns, and may filter on the new one (the pinned base has it).
    assert stale.read().column_names == ["id", "name", "price"]
    assert sorted(stale.read(filter="note IN ('n1', 'n3')")["id"].to_pylist()) == [1, 3]
    stale.flush()
    stale.compact()
    assert all(s.pending_generations == () for s in table.shards())
    assert view(LsmTable.open(table.uri)) == {1: ("new", "n1"), 2: ("new", "n2"), 3: ("tail", "n3")}


def test_lookups_on_s3_null_fill_generations_written_before_the_change(s3_root, s3_server):
    # With storage options, lookups search generations themselves instead of Lance's planner.
    options = s3_server.storage_options()
    table = LsmTable.create(f"{s3_root}/table.lance", ITEMS, ["id"], num_shards=2, storage_options=options)
    table.write(items([1, 2], "generation"))
    table.close()
    table.dataset().add_columns(NOTE.with_metadata({ADDED_COLUMN_METADATA: b"true"}))
    evolved = LsmTable.open(table.uri, storage_options=options)
    evolved.write(items([2], "tail", note=["n2"]))
    found = evolved.lookup([1, 2])
    assert dict(zip(found["id"].to_pylist(), found["note"].to_pylist(), strict=True)) == {1: None, 2: "n2"}
    evolved.close()
