"""The merged full scan, and the resolved pending generations it keeps between reads."""

from __future__ import annotations

import gc
import threading
from collections.abc import Sequence
from datetime import timedelta

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from resources.lsm import LsmTable
from resources.lsm.format.layout import KEY_HASHES_DIR, KEY_INDEX_DIR, run_dir
from resources.lsm.format.schema import TOMBSTONE_COLUMN
from resources.lsm.read import merged_read
from resources.lsm.read.base_key_index import BaseKeyIndex
from resources.lsm.read.key_hash_files import key_files, write_missing_key_hashes
from resources.lsm.read.key_spread import unique_columns, unique_integer_column
from resources.lsm.read.pending_run import PendingRun, read_run, store_run
from resources.lsm.testing.changegen import ChangeStreamSpec, generate_changes
from tests.helpers import drop_pending_runs, rows_by_key
from tests.resources.lsm.maintenance.maintenance_helpers import build_change_table, oracle_view

EVERYTHING = {"orphan_grace_seconds": 0, "wal_grace_seconds": 0, "older_than": timedelta(0)}


def assert_reads(table: LsmTable, batches) -> None:
    """Full, projected and filtered scans of one table object all match the oracle."""
    expected = oracle_view(batches)
    assert rows_by_key(table.read()) == expected
    assert sorted(table.read(columns=["id"])["id"].to_pylist()) == sorted(k for (k,) in expected)
    paid = {k: row for k, row in expected.items() if row["status"] == "paid"}
    assert rows_by_key(table.read(filter="status = 'paid'")) == paid


def test_one_table_object_reads_right_while_generations_come_and_go(tmp_path):
    table, batches = build_change_table(str(tmp_path / "t.lance"), num_shards=3)
    assert_reads(table, batches)
    assert_reads(table, batches)  # the same sets of generations again: resolved ones reused

    more = list(generate_changes(ChangeStreamSpec(num_keys=2500, num_batches=2, batch_size=500, seed=11)))
    table.write(more[0])
    table.close()  # a new generation in every shard
    assert_reads(table, batches + more[:1])

    table.compact(max_rows_per_pass=700)  # a few generations leave the pending set
    assert_reads(table, batches + more[:1])
    table.write(more[1])
    table.compact()
    table.gc(**EVERYTHING)
    assert_reads(table, batches + more)


def pending(snapshot: merged_read.ReadSnapshot) -> tuple[tuple[str, str], ...]:
    """Every pending generation of the snapshot, as ``(shard id, directory)``."""
    return tuple((s.shard_id, d) for s in snapshot.shards for _, d in s.pending_generations)


def test_resolved_generations_are_kept_per_set_and_projection(tmp_path):
    table, _ = build_change_table(str(tmp_path / "t.lance"), num_shards=2)
    cache = merged_read.PendingGenerations(capacity=2)
    snapshot = table.handle.snapshot(fresh=False)
    everything, keys = (snapshot.tail.schema, snapshot.tail.select(["id", "_tombstone"]).schema)

    first = cache.resolved(snapshot, pending(snapshot), everything)
    assert first.num_rows and cache.resolved(snapshot, pending(snapshot), everything) is first
    assert cache.resolved(snapshot, pending(snapshot), keys).column_names == ["id", "_tombstone"]

    table.write(next(iter(generate_changes(ChangeStreamSpec(num_keys=100, num_batches=1, batch_size=50)))))
    table.close()
    after = table.handle.snapshot(fresh=False)
    after_flush = cache.resolved(after, pending(after), everything)
    assert after_flush is not first and after_flush.num_rows >= first.num_rows
    # Capacity 2: the oldest projection was dropped, the first set is read again.
    assert cache.resolved(snapshot, pending(snapshot), everything) is not first
    assert cache.resolved(snapshot, pending(snapshot), everything).equals(first)


def test_a_table_opened_anew_starts_with_the_generations_an_earlier_reader_resolved(tmp_path, monkeypatch):
    """Resolved generations are kept per process and table location: a second table never sees the first's."""
    first, batches = build_change_table(str(tmp_path / "a.lance"), seed=1)
    second, others = build_change_table(str(tmp_path / "b.lance"), seed=2)
    drop_pending_runs(first), drop_pending_runs(second)
    read = merged_read.read_generations
    opened: list[str] = []

    def counting_read(storage, generations, *args, **kwargs):
        opened.extend(storage.location for _ in generations)
        return read(storage, generations, *args, **kwargs)

    monkeypatch.setattr(merged_read, "read_generations", counting_read)
    assert rows_by_key(first.read()) == oracle_view(batches)
    assert opened and set(opened) == {first.uri}
    opened.clear()
    assert rows_by_key(LsmTable.open(first.uri).read()) == oracle_view(batches)
    assert opened == [], "the new reader resolved nothing again"
    assert rows_by_key(second.read()) == oracle_view(others)
    assert opened and set(opened) == {second.uri}


@pytest.mark.parametrize(
    "pending",
    [
        [5, 6, 7, 1000],  # a narrow range
        [-1, 7, 8, 200_000_000],  # a wide range, still a bitmap (one bit per value; 7 and 8 in two bytes)
        [-3, 0, 2, 9],  # negative keys
    ],
)
def test_key_bitmap_finds_exactly_the_pending_keys(pending):
    base = pa.record_batch({"id": pa.array([-(2**63), -3, -1, 0, 5, None, 8, 1000, 2**63 - 1, 7], pa.int64())})
    bitmap = merged_read._KeyBitmap.of(pa.table({"id": pa.array(pending, pa.int64())}), ["id"])
    assert bitmap is not None
    assert bitmap.found(base).tolist() == [k in pending for k in base["id"].to_pylist()]


@pytest.mark.parametrize("type_", [pa.int8(), pa.int16()], ids=str)
def test_key_bitmap_on_narrow_keys_spanning_their_whole_range_finds_exactly_the_pending_keys(type_):
    low, high = -(2 ** (type_.bit_width - 1)), 2 ** (type_.bit_width - 1) - 1
    base = pa.record_batch({"id": pa.array([low, low + 1, -1, 0, high - 1, high], type_)})
    for pending in ([low, 0, high], [low, 0, high - 1]):  # spans of 2^bits (wraps onto itself) and of less
        bitmap = merged_read._KeyBitmap.of(pa.table({"id": pa.array(pending, type_)}), ["id"])
        assert bitmap is not None
        assert bitmap.found(base).tolist() == [k in pending for k in base["id"].to_pylist()]


def test_key_bitmap_on_unsigned_keys_finds_exactly_the_pending_keys():
    base = pa.record_batch({"id": pa.array([0, 3, 8, 9, 2**64 - 1], pa.uint64())})
    bitmap = merged_read._KeyBitmap.of(pa.table({"id": pa.array([3, 9, 2**20], pa.uint64())}), ["id"])
    assert bitmap is not None
    assert bitmap.found(base).tolist() == [False, True, False, True, False]


@pytest.mark.parametrize(
    "keys",
    [
        pa.table({"id": pa.array([-(2**63), 0, 2**63 - 1], pa.int64())}),  # too wide a range
        pa.table({"id": pa.array([], pa.int64())}),
        pa.table({"id": ["a", "b"]}),
    ],
    ids=["too wide", "empty", "string"],
)
def test_keys_a_bitmap_cannot_hold_get_none(keys):
    assert merged_read._KeyBitmap.of(keys, ["id"]) is None


def test_a_composite_keys_bitmap_on_its_unique_integer_column_finds_exactly_the_pending_keys():
    """Rows whose id is pending under another region are not the key's; an id pending under two regions finds both."""
    pending = pa.table({"region": ["eu", "us", "eu", "ap"], "id": pa.array([5, 5, 9, 1000], pa.int64())})
    bitmap = merged_read._KeyBitmap.of(pending, ["region", "id"], unique="id")
    assert bitmap is not None
    base = pa.record_batch(
        {
            "region": ["eu", "us", "ap", "eu", "us", "eu", "ap", None, "eu"],
            "id": pa.array([5, 5, 5, 9, 9, None, 1000, 1000, 7], pa.int64()),
        }
    )
    expected = [
        (r, i) in set(zip(*pending.to_pydict().values(), strict=True))
        for r, i in zip(*base.to_pydict().values(), strict=True)
    ]
    assert bitmap.found(base).tolist() == expected == [True, True, False, True, False, False, True, False, False]


@pytest.mark.parametrize("unique", [None, "region"], ids=["no unique column", "a string one"])
def test_a_composite_key_without_a_unique_integer_column_gets_no_bitmap(unique):
    pending = pa.table({"region": ["eu", "us"], "id": pa.array([5, 6], pa.int64())})
    assert merged_read._KeyBitmap.of(pending, ["region", "id"], unique=unique) is None


def test_a_composite_keys_unique_columns_are_those_nearly_every_sampled_row_holds_its_own_value_of(tmp_path):
    rows = 5000
    table = pa.table({"tenant": pa.array(np.arange(rows) % 7, pa.int64()), "id": pa.array(np.arange(rows), pa.int64())})
    table = table.append_column("name", pa.array([f"n{i}" for i in range(rows)]))
    dataset = lance.write_dataset(
        table.append_column("day", pa.array(np.arange(rows) % 30, pa.int64())), tmp_path / "b"
    )
    assert unique_columns(dataset, ["tenant", "id"]) == ["id"]
    assert unique_columns(dataset, ["tenant", "name"]) == ["name"]
    assert unique_columns(dataset, ["tenant", "day"]) == []
    assert unique_integer_column(dataset, ["tenant", "id"]) == "id"
    assert unique_integer_column(dataset, ["tenant", "name"]) is None  # unique, but a string
    assert unique_integer_column(dataset, ["id"]) is None  # a one-column key is its own


def test_a_composite_key_dropped_through_its_unique_integer_columns_bitmap_reads_the_oracle(tmp_path, monkeypatch):
    """Ids held under two regions: a pending key drops its own base row, never the other region's."""
    schema = pa.schema([("region", pa.string()), ("id", pa.int64()), ("v", pa.int64())])
    table = LsmTable.create(str(tmp_path / "t.lance"), schema, ["region", "id"], num_shards=2)
    held = [("r0", i) for i in range(2000)] + [("r1", i) for i in range(50)]  # id distinct in 2000 of 2050 rows
    table.write(pa.table({"region": [r for r, _ in held], "id": [i for _, i in held], "v": [0] * len(held)}))
    table.close()
    table.compact()
    table.write(pa.table({"region": ["r1", "r2", "r0"], "id": [5, 9000, 40], "v": [1, 1, 1]}))
    table.flush()  # a generation without a run
    table.write(pa.table({"region": ["r0", "r1"], "id": [7, 45], "_op": ["delete", "delete"]}))  # the WAL tail
    bitmaps = []
    of = merged_read._KeyBitmap.of.__func__
    monkeypatch.setattr(
        merged_read._KeyBitmap, "of", classmethod(lambda cls, *a: bitmaps.append(of(cls, *a)) or bitmaps[-1])
    )
    expected = {key: 0 for key in held if key not in {("r0", 7), ("r1", 45)}} | {
        ("r1", 5): 1,
        ("r2", 9000): 1,
        ("r0", 40): 1,
    }

    read = LsmTable.open(table.uri).read()

    keys = zip(read["region"].to_pylist(), read["id"].to_pylist(), strict=True)
    assert dict(zip(keys, read["v"].to_pylist(), strict=True)) == expected
    assert read.num_rows == len(expected) and bitmaps and all(b is not None for b in bitmaps)
    assert table.count() == len(expected)
    table.close()


def test_resolved_generations_larger_than_the_byte_budget_are_not_kept(tmp_path):
    table, _ = build_change_table(str(tmp_path / "t.lance"), num_shards=2)
    snapshot = table.handle.snapshot(fresh=False)
    shape = snapshot.tail.schema
    tight = merged_read.PendingGenerations(max_bytes=1024)
    first = tight.resolved(snapshot, pending(snapshot), shape)
    assert first.nbytes > 1024 and tight.resolved(snapshot, pending(snapshot), shape) is not first
    roomy = merged_read.PendingGenerations(max_bytes=first.nbytes)
    kept = roomy.resolved(snapshot, pending(snapshot), shape)
    assert roomy.resolved(snapshot, pending(snapshot), shape) is kept and kept.equals(first)


def test_a_result_over_the_byte_budget_does_not_evict_the_others(tmp_path):
    table, _ = build_change_table(str(tmp_path / "t.lance"), num_shards=2)
    snapshot = table.handle.snapshot(fresh=False)
    narrow = pa.schema([snapshot.tail.schema.field(c) for c in ("id", TOMBSTONE_COLUMN)])
    small = merged_read.PendingGenerations().resolved(snapshot, pending(snapshot), narrow)
    cache = merged_read.PendingGenerations(max_bytes=small.nbytes)
    kept = cache.resolved(snapshot, pending(snapshot), narrow)
    cache.resolved(snapshot, pending(snapshot), snapshot.tail.schema)  # every column: over the budget
    assert cache.resolved(snapshot, pending(snapshot), narrow) is kept


def test_the_scanner_streams_the_merged_view_and_stops_when_dropped(tmp_path):
    table, batches = build_change_table(str(tmp_path / "t.lance"), num_shards=2)
    reader = table.scanner(columns=["id", "status"], filter="status = 'paid'")
    assert isinstance(reader, pa.RecordBatchReader) and reader.schema.names == ["id", "status"]
    streamed = reader.read_all()
    expected = {k: {"id": k[0], "status": "paid"} for k, v in oracle_view(batches).items() if v["status"] == "paid"}
    assert rows_by_key(streamed) == expected == rows_by_key(table.read(["id", "status"], "status = 'paid'"))

    threads = threading.active_count()  # the level readers' pool is up: the reads above used it
    for _ in range(3):
        started = table.scanner()
        next(iter(started))  # read one batch, then walk away
        del started
    gc.collect()
    assert threading.active_count() <= threads  # a scan holds no thread of its own, dropped or not
    assert rows_by_key(table.read()) == oracle_view(batches)


def test_duckdb_and_polars_read_the_merged_view_directly(tmp_path):
    duckdb = pytest.importorskip("duckdb")
    polars = pytest.importorskip("polars")
    table, batches = build_change_table(str(tmp_path / "t.lance"), num_shards=2)
    oracle = oracle_view(batches)
    merged = duckdb.from_arrow(table.scanner())
    assert merged.aggregate("count(*), count(distinct id)").fetchall() == [(len(oracle), len(oracle))]
    frame = polars.from_arrow(table.scanner(columns=["id", "amount"]))
    assert frame.height == len(oracle) and frame["id"].n_unique() == len(oracle)


def test_lookups_with_storage_options_search_generations_like_lances_planner(tmp_path):
    """With storage options, lookups bypass Lance's planner for generations (it drops the options): same rows."""
    table, batches = build_change_table(str(tmp_path / "t.lance"), num_shards=3)
    table.compact(max_rows_per_pass=10**9)  # a base under the pending generations
    more = list(generate_changes(ChangeStreamSpec(num_keys=2500, num_batches=2, batch_size=500, seed=9)))
    for batch in more:
        table.write(batch)
        table.close()  # pending generations above the base, with updates and deletes
    with_options = LsmTable.open(table.uri, storage_options={"timeout": "30s"})
    keys = list(range(0, 2600, 7))  # present in the base, in generations, deleted, never written
    planned, searched = table.lookup(keys), with_options.lookup(keys)
    assert rows_by_key(searched) == rows_by_key(planned)
    assert rows_by_key(planned) == {k: row for k, row in oracle_view(batches + more).items() if k[0] in set(keys)}


def counted_joins(monkeypatch) -> list[int]:
    """The number of keys of each anti-join scans start from now on."""
    joins: list[int] = []
    anti_join_stream = merged_read.anti_join_stream
    monkeypatch.setattr(
        merged_read,
        "anti_join_stream",
        lambda batches, keys: joins.append(keys.num_rows) or anti_join_stream(batches, keys),
    )
    return joins


def counted_key_drops(monkeypatch) -> list[int]:
    """The number of keys each scan from now on drops by key: joined, or searched in the base's key index."""
    drops = counted_joins(monkeypatch)
    indexed = merged_read.StoredHashRows.indexed
    monkeypatch.setattr(
        merged_read.StoredHashRows,
        "indexed",
        lambda index, keys, *args: drops.append(keys.num_rows) or indexed(index, keys, *args),
    )
    return drops


KEYS_WITHOUT_BITMAP = {
    "wide int64": (pa.int64(), lambda i: i * (1 << 40)),
    "string": (pa.string(), lambda i: f"key-{i:06d}"),
}


@pytest.mark.parametrize("key_type", KEYS_WITHOUT_BITMAP, ids=list(KEYS_WITHOUT_BITMAP))
@pytest.mark.parametrize("vector", [False, True], ids=["flat", "with a vector column"])
@pytest.mark.parametrize("many", [False, True], ids=["few keys", "many keys"])
@pytest.mark.parametrize(
    "stored", [(), (KEY_HASHES_DIR,), (KEY_INDEX_DIR,)], ids=["keys read", "key hashes", "key index"]
)
def test_pending_keys_without_a_run_are_dropped_from_the_base_once_per_scan(
    tmp_path, monkeypatch, key_type, vector, many, stored
):
    arrow_type, key_of = KEYS_WITHOUT_BITMAP[key_type]
    fields = [pa.field("id", arrow_type), pa.field("value", pa.int64())]
    if vector:  # a nested column: Arrow's join cannot carry it, so the keys' rows are found first
        fields.append(pa.field("vec", pa.list_(pa.float32(), 2)))
    schema = pa.schema(fields)
    table = LsmTable.create(str(tmp_path / "t.lance"), schema, ["id"], num_shards=2)

    def rows(keys: Sequence[int], value: int) -> pa.Table:
        columns = {"id": pa.array([key_of(i) for i in keys], arrow_type), "value": [value] * len(keys)}
        if vector:
            columns["vec"] = pa.array([[float(i), 0.0] for i in keys], pa.list_(pa.float32(), 2))
        return pa.table(columns, schema=schema)

    # A base of several fragments, so the lookup ahead of the scan works group by group.
    lance.write_dataset(rows(range(20_000), 0), table.uri, mode="append", max_rows_per_file=2500)
    # Few keys against the base are looked up through Lance's or our key index, many by scanning the key column.
    updated, deleted = (range(0, 20_000, 7), range(3, 20_000, 11)) if many else ([7], [19_999])
    table.write(rows(updated, 1))  # pending changes without a run: dropped from the base by key
    table.write(pa.table({"id": pa.array([key_of(i) for i in deleted], arrow_type), "_op": ["delete"] * len(deleted)}))
    table.close()
    drop_pending_runs(table)
    # As a merge or a run build stores them (per-row hashes for a table with a nested column).
    write_missing_key_hashes(table.handle.storage, lance.dataset(table.uri), ["id"], stored)
    joins = counted_joins(monkeypatch)
    looked_up: list[int] = []

    class Counted(merged_read.SupersededRows):
        def __init__(self, dataset, keys, *args):
            looked_up.append(keys.num_rows)
            super().__init__(dataset, keys, *args)

    monkeypatch.setattr(merged_read, "SupersededRows", Counted)
    hashed: list[int] = []
    indexed: list[int] = []

    class CountedHashes(merged_read.StoredHashRows):
        @classmethod
        def of(cls, storage, dataset, keys, *args):
            found = super().of(storage, dataset, keys, *args)
            hashed.extend([keys.num_rows] if found else [])
            return found

        @classmethod
        def indexed(cls, index, keys, *args):
            indexed.append(keys.num_rows)
            return super().indexed(index, keys, *args)

    monkeypatch.setattr(merged_read, "StoredHashRows", CountedHashes)

    read = table.read()

    expected = {key_of(i): 1 if i in updated else 0 for i in range(20_000) if i not in deleted}
    assert dict(zip(read["id"].to_pylist(), read["value"].to_pylist(), strict=True)) == expected
    assert read.num_rows == len(expected)
    assert read.schema == table.schema  # the not-null key and column types come through
    changed = len({*updated, *deleted})
    if KEY_INDEX_DIR in stored and not many:  # searching the index for few keys costs less than any scan
        once = ([], [], [], [changed])
    elif not vector:
        once = ([changed], [], [], [])
    else:
        once = ([], [], [changed], []) if KEY_HASHES_DIR in stored else ([], [changed], [], [])
    assert (joins, looked_up, hashed, indexed) == once  # once for the whole scan
    if vector or not once[0]:  # dropped by position: the base rows keep their scan order
        gone = {key_of(i) for i in [*updated, *deleted]}
        base_order = [k for k in lance.dataset(table.uri).to_table()["id"].to_pylist() if k not in gone]
        assert read["id"].to_pylist()[: len(base_order)] == base_order
    assert table.count() == len(expected)


@pytest.mark.parametrize("runs", [False, True], ids=["keys joined", "pending runs"])
def test_a_composite_key_whose_parts_recur_in_other_keys_counts_and_reads_each_key_once(tmp_path, runs):
    # (r0, 5) and (r1, 7) are pending; (r0, 7) and (r1, 5) are base rows no change touches.
    schema = pa.schema([("region", pa.string()), ("seq", pa.int64()), ("value", pa.int64())])
    table = LsmTable.create(str(tmp_path / "t.lance"), schema, ["region", "seq"], num_shards=2)
    regions = [f"r{r}" for r in range(10) for _ in range(1000)]
    table.write(pa.table({"region": regions, "seq": list(range(1000)) * 10, "value": [0] * 10_000}, schema=schema))
    table.close()
    table.compact()
    table.write(pa.table({"region": ["r0", "r1"], "seq": [5, 7], "value": [1, 1]}, schema=schema))
    table.close()
    if runs:
        table.build_pending_runs()
    else:
        drop_pending_runs(table)
    fresh = LsmTable.open(table.uri)

    read = fresh.read()

    assert read.num_rows == fresh.count() == 10_000
    changed = read.filter(pc.equal(read["value"], 1))
    assert sorted(zip(changed["region"].to_pylist(), changed["seq"].to_pylist(), strict=True)) == [("r0", 5), ("r1", 7)]
    assert fresh.lookup([("r0", 7), ("r1", 5), ("r0", 5)])["value"].to_pylist() == [0, 0, 1]


def test_a_composite_key_looked_up_in_a_generation_is_filtered_on_the_column_the_base_finds_selective(
    tmp_path, monkeypatch
):
    # Every id occurs once per region: on its region, one key would read a tenth of each generation.
    schema = pa.schema([("region", pa.string()), ("seq", pa.int64()), ("value", pa.int64())])
    table = LsmTable.create(str(tmp_path / "t.lance"), schema, ["region", "seq"], num_shards=1)
    table.write(
        pa.table({"region": [f"r{i % 10}" for i in range(10_000)], "seq": range(10_000), "value": [0] * 10_000})
    )
    table.close()
    table.compact()
    table.write(pa.table({"region": [f"r{i % 10}" for i in range(2_000)], "seq": range(2_000), "value": [1] * 2_000}))
    table.close()
    drop_pending_runs(table)
    filters = []
    read_generation = merged_read.generation_rows

    def spied(generation, columns, filter=None):
        filters.append(filter)
        return read_generation(generation, columns, filter=filter)

    monkeypatch.setattr(merged_read, "generation_rows", spied)

    assert LsmTable.open(table.uri).lookup([("r7", 17)])["value"].to_pylist() == [1]
    assert filters == ["`seq` IN (17)"]


@pytest.mark.parametrize("key", [["id"], ["region", "id"]], ids=["string", "composite"])
def test_rows_a_run_drops_and_keys_joined_above_it_leave_the_merged_view_together(tmp_path, key):
    schema = pa.schema([("region", pa.string()), ("id", pa.string()), ("value", pa.int64())])
    table = LsmTable.create(str(tmp_path / "t.lance"), schema, key, num_shards=2)

    def rows(ids: range, value: int) -> pa.Table:
        return pa.table(
            {"region": [f"r{i % 3}" for i in ids], "id": [f"k{i}" for i in ids], "value": [value] * len(ids)}
        )

    table.write(rows(range(3_000), 0))
    table.close()
    table.compact()
    table.write(pa.concat_tables([rows(range(0, 3_000, 7), 1), rows(range(3_000, 3_050), 1)]))  # into runs
    table.close()
    table.build_pending_runs()
    table.write(rows(range(0, 3_000, 5), 2))  # in the WAL tail: joined by key, some changed again above the runs
    deleted = rows(range(1, 3_000, 11), 0)
    table.write(deleted.append_column("_op", pa.array(["delete"] * deleted.num_rows)))

    read = table.read()

    expected = {f"k{i}": 0 for i in range(3_000)} | {f"k{i}": 1 for i in [*range(0, 3_000, 7), *range(3_000, 3_050)]}
    expected |= {f"k{i}": 2 for i in range(0, 3_000, 5)}
    for i in range(1, 3_000, 11):
        expected.pop(f"k{i}")
    assert dict(zip(read["id"].to_pylist(), read["value"].to_pylist(), strict=True)) == expected
    assert read.num_rows == table.count() == len(expected)


@pytest.mark.parametrize("newest", ["wal tail", "generation after the run"])
def test_a_key_of_a_run_changed_again_above_it_supersedes_its_base_row_once(tmp_path, newest):
    schema = pa.schema([("id", pa.int64()), ("value", pa.int64())])
    table = LsmTable.create(str(tmp_path / "t.lance"), schema, ["id"], num_shards=1)
    table.write(pa.table({"id": [1, 2, 3], "value": [0, 0, 0]}, schema=schema))
    table.close()
    table.compact()
    table.write(pa.table({"id": [1], "value": [1]}, schema=schema))
    table.close()
    table.build_pending_runs()  # the run's vector holds key 1's base row
    table.write(pa.table({"id": [1], "value": [2]}, schema=schema))  # and key 1 changes again above the run
    if newest != "wal tail":
        table.close()

    assert table.count() == table.read().num_rows == 3
    assert table.lookup([1])["value"].to_pylist() == [2]


def test_a_narrow_integer_key_spanning_its_range_is_read_once_after_an_upsert(tmp_path):
    schema = pa.schema([pa.field("id", pa.int16(), nullable=False), pa.field("v", pa.string())])
    table = LsmTable.create(str(tmp_path / "t.lance"), schema, ["id"], num_shards=2)
    keys = pa.array([-32768, -1, 0, 32767], pa.int16())
    table.write(pa.table({"id": keys, "v": ["base"] * 4}, schema=schema))
    table.close()
    table.compact()
    assert lance.dataset(table.uri).count_rows() == 4, "in the base"
    table.write(pa.table({"id": pa.array([-32768, 32767], pa.int16()), "v": ["new"] * 2}, schema=schema))
    table.close()  # pending, no run: the base rows of both keys are dropped by the key bitmap
    drop_pending_runs(table)
    assert {k[0]: row["v"] for k, row in rows_by_key(table.read()).items()} == {
        -32768: "new",
        -1: "base",
        0: "base",
        32767: "new",
    }
    assert table.read().num_rows == 4 and table.count() == 4


HOT_SCHEMA = pa.schema([pa.field("id", pa.string(), nullable=False), pa.field("value", pa.int64())])


def hot_rows(keys: Sequence[int], value: int) -> pa.Table:
    return pa.table({"id": [f"k{i:05d}" for i in keys], "value": [value] * len(keys)}, schema=HOT_SCHEMA)


def table_with_runs_of_every_tenth_key(path: str) -> LsmTable:
    """3,000 base rows ``k00000``.. (value 0); every tenth key changed (value 1) in generations with runs."""
    table = LsmTable.create(path, HOT_SCHEMA, ["id"], num_shards=2)
    lance.write_dataset(hot_rows(range(3000), 0), table.uri, mode="append", max_rows_per_file=1000)
    table.write(hot_rows(range(0, 3000, 10), 1))
    table.close()
    table.build_pending_runs()
    return table


@pytest.mark.parametrize("new_keys", [0, 30], ids=["only keys a run holds", "and keys no run holds"])
def test_keys_a_trusted_run_holds_are_not_joined_when_changed_again(tmp_path, monkeypatch, new_keys):
    table = table_with_runs_of_every_tenth_key(str(tmp_path / "t.lance"))
    rows = hot_rows
    table.write(rows(range(0, 3000, 20), 2))  # changed again above the runs, flushed...
    table.close()
    table.write(rows([*range(10, 3000, 40), *range(3001, 3001 + 2 * new_keys, 2)], 3))  # ...and in the WAL tail
    table.write(pa.table({"id": ["k00030", "k00005"], "_op": ["delete", "delete"]}))  # a run's key, a base key
    joins = counted_key_drops(monkeypatch)

    read = table.read()

    expected = {f"k{i:05d}": 0 for i in range(3000)} | {f"k{i:05d}": 1 for i in range(0, 3000, 10)}
    expected |= {f"k{i:05d}": 2 for i in range(0, 3000, 20)} | {f"k{i:05d}": 3 for i in range(10, 3000, 40)}
    expected |= {f"k{i:05d}": 3 for i in range(3001, 3001 + 2 * new_keys, 2)}
    del expected["k00030"], expected["k00005"]
    assert dict(zip(read["id"].to_pylist(), read["value"].to_pylist(), strict=True)) == expected
    assert joins == [new_keys + 1]  # the keys no run holds (k00005 among them), once for the whole scan
    assert table.count() == len(expected)


@pytest.mark.parametrize("changed_again", [False, True], ids=["unchanged since", "changed again above it"])
def test_keys_a_run_of_an_older_version_did_not_look_up_are_dropped_by_key(tmp_path, changed_again):
    """A stored run may hold keys without their base row (null): those base rows are found by key."""
    table = table_with_runs_of_every_tenth_key(str(tmp_path / "t.lance"))
    storage = table.handle.storage
    for shard_id in table.shard_ids:
        for entry in storage.list_files(run_dir(shard_id)):
            run = read_run(storage, f"{run_dir(shard_id)}/{entry.name}", shard_id)
            unknown = pa.nulls(len(run.base_rows), pa.uint64())
            store_run(storage, PendingRun(run.shard_id, run.generations, run.changes, unknown))
    expected = {f"k{i:05d}": 1 if i % 10 == 0 else 0 for i in range(3000)}
    if changed_again:
        table.write(hot_rows(range(0, 3000, 20), 2))  # in the WAL tail
        expected |= {f"k{i:05d}": 2 for i in range(0, 3000, 20)}

    read = LsmTable.open(table.uri).read()  # a table object that never saw the runs as built

    assert dict(zip(read["id"].to_pylist(), read["value"].to_pylist(), strict=True)) == expected
    assert LsmTable.open(table.uri).count() == 3000


def test_a_scan_reads_the_bases_deleted_rows_and_drops_them_with_the_superseded_ones(tmp_path):
    table, batches = build_change_table(str(tmp_path / "t.lance"), num_shards=2)
    table.compact(maintenance=None)  # updates and deletes leave deletion files in the base
    more = list(generate_changes(ChangeStreamSpec(num_keys=2500, num_batches=2, batch_size=400, seed=13)))
    for batch in more:
        table.write(batch)
        table.flush()
    base = table.dataset()
    physical = sum(f.physical_rows for f in base.get_fragments())
    assert physical > base.count_rows()

    read = merged_read.base_batches(base, ["id"], None).read_all()
    assert read.num_rows == physical and read["_rowid"].null_count == physical - base.count_rows()
    assert_reads(table, batches + more)
    table.build_pending_runs()
    assert_reads(LsmTable.open(table.uri), batches + more)


def test_rows_found_ahead_are_matched_to_the_live_rows_of_batches_with_deleted_rows(tmp_path, monkeypatch):
    table, batches = build_change_table(str(tmp_path / "t.lance"), num_shards=2)
    table.compact(maintenance=None)  # deletion files in the base
    more = list(generate_changes(ChangeStreamSpec(num_keys=2500, num_batches=2, batch_size=400, seed=17)))
    for batch in more:
        table.write(batch)
        table.flush()  # pending keys without a run
    write_missing_key_hashes(
        table.handle.storage, table.dataset(), ["id"], key_files(table.handle.storage, table.dataset())
    )
    # The pending keys' rows found through the key index ahead of the scan, not by the bitmap of integer keys.
    monkeypatch.setattr(merged_read._KeyBitmap, "of", classmethod(lambda cls, keys, key, unique: None))
    monkeypatch.setattr(BaseKeyIndex, "searched_faster_than_scanned", lambda self, keys: True)
    assert rows_by_key(LsmTable.open(table.uri).read()) == oracle_view(batches + more)


def test_a_batchs_deleted_rows_are_never_kept_and_never_tested_by_address():
    addresses = pa.array([None, 7 << 32 | 2, None, 8 << 32, None, 8 << 32 | 2], pa.uint64())
    row_ids = pa.array([None, 2, None, 3, None, 5], pa.uint64())
    batch = pa.record_batch({"_rowaddr": addresses, "_rowid": row_ids})
    live_addresses, live = merged_read._live_rows(batch)
    assert live_addresses.tolist() == [7 << 32 | 2, 8 << 32, 8 << 32 | 2] and live.tolist() == [1, 3, 5]
    assert merged_read._at_rows(np.array([True, False, True]), live, 6).tolist() == [False, True] + [False] * 3 + [True]
    sliced_addresses, sliced_live = merged_read._live_rows(batch.slice(3, 3))  # bitmaps and values at an offset
    assert sliced_addresses.tolist() == [8 << 32, 8 << 32 | 2] and sliced_live.tolist() == [0, 2]
    deleted = pa.record_batch({"_rowaddr": pa.nulls(3, pa.uint64()), "_rowid": pa.nulls(3, pa.uint64())})
    assert merged_read._live_rows(deleted)[0].tolist() == []
    whole = pa.record_batch({"_rowaddr": pa.array([1, 2], pa.uint64()), "_rowid": pa.array([1, 2], pa.uint64())})
    assert merged_read._live_rows(whole)[1] is None
