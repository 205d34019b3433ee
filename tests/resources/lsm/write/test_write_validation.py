"""Bad input to ``write`` is refused with a clear error and nothing is applied."""

from __future__ import annotations

import pyarrow as pa
import pytest

from resources.lsm import InvalidChangesError

GOOD = {"id": [1, 2], "name": ["a", "b"], "price": [1.0, 2.0]}


def _nothing_written(table) -> bool:
    return table.count() == 0 and all(s.writer_epoch == 0 and s.unflushed_wal_entries == 0 for s in table.shards())


@pytest.mark.parametrize(
    "batch, message",
    [
        (
            pa.table({"id": pa.array([1, None], pa.int64()), "name": ["a", "b"], "price": [1.0, 2.0]}),
            "row 1: primary-key column 'id' is null",
        ),
        (
            pa.table({"id": ["1", "two"], "name": ["a", "b"], "price": [1.0, 2.0]}),
            "row 1: id='two' is not a valid int64",
        ),
        (pa.table({**GOOD, "_op": ["upsert", "merge"]}), "row 1: _op='merge' is not one of ['upsert', 'delete']"),
        (pa.table({**GOOD, "_seq": pa.array([1, None], pa.int64())}), "row 1: _seq is null"),
    ],
)
def test_invalid_rows_refuse_the_whole_write(make_table, batch, message):
    table = make_table()
    with pytest.raises(InvalidChangesError, match=r"1 of 2 rows are invalid") as raised:
        table.write(batch)
    assert message in str(raised.value)
    assert [r.row for r in raised.value.rejections] == [1]
    assert _nothing_written(table)


def test_unknown_column_is_named(make_table):
    table = make_table()
    with pytest.raises(ValueError, match=r"unknown columns \['colour'\]"):
        table.write(pa.table({**GOOD, "colour": ["red", "blue"]}))
    assert _nothing_written(table)


def test_missing_key_column_is_named(make_table):
    table = make_table()
    with pytest.raises(ValueError, match=r"primary-key columns \['id'\] are missing"):
        table.write(pa.table({"name": ["a"]}))


def test_castable_values_are_accepted(make_table):
    table = make_table()
    table.write(pa.table({"id": ["7"], "name": [None], "price": [3]}))  # string key, int price
    assert table.read().to_pylist() == [{"id": 7, "name": None, "price": 3.0}]


def test_an_upsert_missing_a_column_is_refused_instead_of_wiping_it(make_table):
    table = make_table()
    table.write(pa.table(GOOD))
    with pytest.raises(
        InvalidChangesError, match="row 0: column 'price' is missing; an upsert must carry every column"
    ):
        table.write(pa.table({"id": [1], "name": ["x"]}))
    assert table.lookup([1]).to_pylist() == [{"id": 1, "name": "a", "price": 1.0}]


def test_delete_needs_only_the_key_and_missing_keys_are_noops(make_table):
    table = make_table()
    table.write(pa.table(GOOD))
    result = table.write(pa.table({"id": [2, 99], "_op": ["delete", "DELETE "]}))
    assert result.deletes == 2
    assert table.read().to_pylist() == [{"id": 1, "name": "a", "price": 1.0}]


def test_pandas_input_and_highest_seq_wins(make_table):
    pd = pytest.importorskip("pandas")
    table = make_table()
    frame = pd.DataFrame(
        {"id": [5, 5, 5], "name": ["new", "newest", "old"], "price": [1.0, 2.0, 0.0], "_seq": [2, 3, 1]}
    )
    result = table.write(frame)
    assert result.upserts == 1
    assert table.lookup([5]).to_pylist() == [{"id": 5, "name": "newest", "price": 2.0}]


def test_shard_ordered_writes_keep_the_last_change_per_key_and_refuse_other_shards(make_table):
    table = make_table(num_shards=2)
    keys = pa.table({"id": pa.array(range(20), pa.int64())})
    buckets = table.buckets(keys)
    mine = [k for k, b in zip(range(20), buckets, strict=True) if b == 0]
    first, second = mine[0], mine[1]
    ordered = pa.table(
        {
            "id": pa.array([first, second, first, second], pa.int64()),
            "name": ["old", "gone", "new", None],
            "price": [1.0, 2.0, 3.0, None],
            "_op": ["upsert", "upsert", "upsert", "delete"],
        }
    )

    written = table.write_shard_ordered(table.shard_ids[0], ordered)
    assert (written.upserts, written.deletes) == (1, 1)
    assert table.read().to_pylist() == [{"id": first, "name": "new", "price": 3.0}]

    theirs = next(k for k, b in zip(range(20), buckets, strict=True) if b == 1)
    with pytest.raises(ValueError, match="got rows of other shards"):
        table.write_shard_ordered(
            table.shard_ids[0], ordered.slice(0, 1).set_column(0, "id", pa.array([theirs], pa.int64()))
        )


@pytest.mark.parametrize(
    "make_batch, message",
    [
        (
            lambda pd: pd.DataFrame({"id": [1, "abc"], "name": ["a", "b"], "price": [1.0, 2.0]}),
            "id='abc' is not a valid int64",
        ),
        (
            lambda pd: pd.DataFrame({"id": [1, 2**70], "name": ["a", "b"], "price": [1.0, 2.0]}),
            "row 1: id='1180591620717411303424' is not a valid int64",
        ),
        (lambda pd: pa.table({**GOOD, "_op": [["upsert"], ["delete"]]}), "is not a valid string"),
        (lambda pd: pa.table({**GOOD, "_op": [{"x": 1}, {"x": 2}]}), "is not a valid string"),
        (lambda pd: pa.table({"id": [True, False], "name": ["a", "b"], "price": [1.0, 2.0]}), "id=True is a boolean"),
    ],
)
def test_values_arrow_cannot_convert_are_invalid_changes_not_raw_errors(make_table, make_batch, message):
    pd = pytest.importorskip("pandas")
    table = make_table()
    with pytest.raises(InvalidChangesError, match="nothing was written") as raised:
        table.write(make_batch(pd))
    assert message in str(raised.value)
    assert _nothing_written(table)


@pytest.mark.parametrize(
    "batch, problem",
    [
        (
            pa.table([[1], ["a"], ["b"], [1.0]], names=["id", "name", "name", "price"]),
            "duplicate column names ['name']",
        ),
        (pa.table({**GOOD, "colour": ["red", "blue"]}), "unknown columns ['colour']"),
        (pa.table({"name": ["a"]}), "primary-key columns ['id'] are missing"),
    ],
)
def test_batch_level_problems_are_invalid_changes_with_the_problem(make_table, batch, problem):
    table = make_table()
    with pytest.raises(InvalidChangesError) as raised:
        table.write(batch)
    assert raised.value.problem is not None and problem in raised.value.problem
    assert _nothing_written(table)


def test_nan_stays_nan(make_table):
    table = make_table()
    table.write(pa.table({"id": [1], "name": ["nan"], "price": [float("nan")]}))
    row = table.read().to_pylist()[0]
    assert row["name"] == "nan" and row["price"] != row["price"]
