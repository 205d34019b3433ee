"""Partial-update tables: an upsert sets the columns it gives, at every level, against a row-by-row oracle."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from resources.lsm import InvalidChangesError, LsmTable
from resources.lsm.format.schema import UNSET_COLUMN
from resources.lsm.testing.changegen import ChangeStreamSpec, generate_table_changes, replay_table
from resources.lsm.write.changes import resolve_changes, validate_changes
from tests.helpers import rows_by_key
from tests.resources.lsm.read.writer_child import acknowledge

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("qty", pa.int64()), ("price", pa.float64())])
VALUES = ["name", "qty", "price"]
ABSENT = object()
"""A field the change does not give (as opposed to an explicit null)."""


class Oracle:
    """The table as a dict, changes applied one row at a time in ``_seq`` order (later rows win ties)."""

    def __init__(self) -> None:
        self.rows: dict[int, dict] = {}

    def apply(self, changes: list[dict]) -> set[int]:
        for change in sorted(changes, key=lambda c: c["_seq"]):
            key = change["id"]
            if change["_op"] == "delete":
                self.rows.pop(key, None)
                continue
            row = self.rows.get(key) or {"id": key, **dict.fromkeys(VALUES)}
            self.rows[key] = {**row, **{c: v for c, v in change.items() if c in VALUES and v is not ABSENT}}
        return {c["id"] for c in changes}

    def view(self) -> dict:
        return {(k,): dict(r) for k, r in self.rows.items()}


def random_changes(rng: random.Random, keys: int, count: int) -> list[dict]:
    changes = []
    for _ in range(count):
        change = {"id": rng.randrange(keys), "_seq": rng.randrange(4)}
        if rng.random() < 0.15:
            changes.append({**change, "_op": "delete"})
            continue
        given = {
            "name": rng.choice([ABSENT, None, f"n{rng.randrange(100)}"]),
            "qty": rng.choice([ABSENT, None, rng.randrange(1000)]),
            "price": rng.choice([ABSENT, None, rng.random()]),
        }
        changes.append({**change, "_op": "upsert", **given})
    return changes


def as_batch(changes: list[dict], rng: random.Random) -> pa.Table:
    """The changes as Arrow: absent fields listed in ``_unset`` (holding junk values that must be ignored);
    a column no change gives is sometimes left out of the batch altogether."""
    columns = {name: [c[name] for c in changes] for name in ("id", "_op", "_seq")}
    unset = [[v for v in VALUES if c.get(v, ABSENT) is ABSENT] for c in changes]
    for name in VALUES:
        if all(c.get(name, ABSENT) is ABSENT for c in changes) and rng.random() < 0.5:
            continue
        junk = {"name": "junk", "qty": -1, "price": -1.0}[name]
        columns[name] = [junk if c.get(name, ABSENT) is ABSENT else c[name] for c in changes]
    types = {f.name: f.type for f in SCHEMA}
    batch = pa.table({n: pa.array(v, types.get(n)) for n, v in columns.items()})
    listed = [[n for n in u if n in batch.column_names] for u in unset]
    return batch.append_column(UNSET_COLUMN, pa.array(listed, pa.list_(pa.string())))


def expected_changes(before: dict, after: dict, touched: set[int]) -> dict:
    """What ``changes(since)`` reports: each touched key once, with its state now (deletes of keys live before)."""
    feed = {}
    for key in touched:
        if (key,) in after:
            feed[(key,)] = {**after[(key,)], "_op": "upsert"}
        elif (key,) in before:
            feed[(key,)] = "delete"
    return feed


def feed_of(table: LsmTable, since) -> dict:
    return {
        (r["id"],): "delete" if r["_op"] == "delete" else r for r in table.changes(since=since).read_all().to_pylist()
    }


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_partial_updates_at_every_level_equal_the_oracle(make_table, seed):
    rng = random.Random(seed)
    table = make_table(SCHEMA, num_shards=3, merge_engine="partial-update", max_memtable_rows=40)
    oracle, versions, touched_since = Oracle(), [], []
    for step in range(40):
        action = rng.choices(["write", "flush", "runs", "compact"], [6, 1, 1, 1])[0]
        if action == "write":
            changes = random_changes(rng, keys=60, count=rng.randrange(1, 30))
            table.write(as_batch(changes, rng))
            touched = oracle.apply(changes)
            for since in touched_since:
                since |= touched
        elif action == "flush":
            table.flush()
        elif action == "runs":
            table.build_pending_runs()
        else:
            table.compact()
        assert rows_by_key(table.read()) == oracle.view(), f"step {step} ({action})"
        if step % 8 == 3:
            versions.append((table.version(), oracle.view()))
            touched_since.append(set())

    probe = list(range(-2, 62))
    assert rows_by_key(table.lookup(probe)) == oracle.view()
    assert rows_by_key(LsmTable.open(table.uri).read()) == oracle.view()  # a new reader, from storage only
    for (version, view), touched in zip(versions, touched_since, strict=True):
        assert rows_by_key(table.read(as_of=version)) == view
        assert feed_of(table, version) == expected_changes(view, oracle.view(), touched)


def test_a_generated_partial_stream_equals_the_generators_oracle(make_table):
    table = make_table(SCHEMA, num_shards=2, merge_engine="partial-update", max_memtable_rows=100)
    spec = ChangeStreamSpec(num_keys=200, num_batches=4, batch_size=150, seed=3, partial_ratio=0.5)
    batches = list(generate_table_changes(table.schema, table.primary_key, spec))
    for batch in batches:
        table.write(batch)
    assert rows_by_key(table.read()) == replay_table(batches, ["id"])


def test_an_absent_column_keeps_its_value_and_an_explicit_null_is_a_value(make_table):
    table = make_table(SCHEMA, merge_engine="partial-update")
    table.write(pa.table({"id": [1, 2], "name": ["a", "b"], "qty": [1, 2], "price": [1.0, 2.0]}))
    table.flush()
    table.compact()  # key 1 and 2 now in the base
    table.write(pa.table({"id": [1, 2, 3], "qty": [10, None, 30]}))
    assert rows_by_key(table.read()) == {
        (1,): {"id": 1, "name": "a", "qty": 10, "price": 1.0},
        (2,): {"id": 2, "name": "b", "qty": None, "price": 2.0},
        (3,): {"id": 3, "name": None, "qty": 30, "price": None},  # a new key: unset columns are null
    }


def test_a_delete_clears_the_row_for_a_later_upsert_of_the_same_call(make_table):
    table = make_table(SCHEMA, merge_engine="partial-update")
    table.write(pa.table({"id": [1], "name": ["a"], "qty": [1], "price": [1.0]}))
    table.write(pa.table({"id": [1, 1], "name": [None, "b"], "_op": ["delete", "upsert"], UNSET_COLUMN: [[], ["qty"]]}))
    assert table.lookup([1]).to_pylist() == [{"id": 1, "name": "b", "qty": None, "price": None}]


def test_the_highest_seq_that_sets_a_column_wins_it():
    valid = validate_changes(
        pa.table(
            {
                "id": [7, 7, 7],
                "name": ["newest", "older", "junk"],
                "qty": [1, 2, 3],
                "_seq": [9, 5, 7],
                UNSET_COLUMN: ["qty, price", "", "name,price"],
            }
        ),
        SCHEMA,
        ["id"],
        partial_update=True,
    ).valid
    resolved = resolve_changes(valid, SCHEMA, ["id"])
    assert resolved.upserts.to_pylist() == [
        {"id": 7, "name": "newest", "qty": 3, "price": None, UNSET_COLUMN: ["price"]}
    ]


def test_unset_names_must_be_non_key_columns(make_table):
    table = make_table(SCHEMA, merge_engine="partial-update")
    with pytest.raises(InvalidChangesError) as refused:
        table.write(pa.table({"id": [1, 2], "name": ["a", "b"], UNSET_COLUMN: [["id"], ["colour"]]}))
    assert [r.row for r in refused.value.rejections] == [0, 1]
    assert "not non-key columns" in refused.value.rejections[1].reason


def test_a_last_write_wins_table_refuses_partial_rows(make_table):
    table = make_table(SCHEMA)
    with pytest.raises(InvalidChangesError, match="an upsert must carry every column"):
        table.write(pa.table({"id": [1], "name": ["a"], "qty": [1]}))
    with pytest.raises(InvalidChangesError, match="last-write-wins"):
        table.write(pa.table({"id": [1], "name": ["a"], "qty": [1], "price": [1.0], UNSET_COLUMN: [["price"]]}))
    table.write(pa.table({"id": [1], "name": ["a"], "qty": [1], "price": [1.0], UNSET_COLUMN: [[]]}))
    assert table.merge_engine == "last-write-wins" and table.count() == 1


@pytest.mark.parametrize(
    ("schema", "settings", "problem"),
    [
        (SCHEMA, {"merge_engine": "first-write-wins"}, "not one of"),
        (
            pa.schema([("id", pa.int64()), pa.field("name", pa.string(), nullable=False)]),
            {"merge_engine": "partial-update"},
            "nullable non-key columns",
        ),
        (SCHEMA, {"merge_engine": "partial-update", "durable_write": False}, "durable_write"),
    ],
)
def test_create_refuses_a_merge_engine_it_cannot_honour(tmp_path, schema, settings, problem):
    with pytest.raises(ValueError, match=problem):
        LsmTable.create(str(tmp_path / "t.lance"), schema, ["id"], **settings)
    assert not (tmp_path / "t.lance").exists()


def test_the_merge_engine_survives_reopening(make_table):
    table = make_table(SCHEMA, merge_engine="partial-update")
    assert LsmTable.open(table.uri).merge_engine == "partial-update"


def test_a_partial_update_after_a_sigkilled_writer_completes_from_its_acknowledged_rows(make_table, writer_process):
    table = make_table(SCHEMA, num_shards=2, merge_engine="partial-update")
    keys = pa.array(range(100), pa.int64())
    table.write(pa.table({"id": keys, "name": ["seed"] * 100, "qty": keys, "price": [0.0] * 100}))
    table.close()
    child = writer_process(table.uri)  # writes name and price; qty is not given
    acknowledge(child, "upsert", 0, 60)
    acknowledge(child, "upsert", 60, 40)
    child.kill()  # SIGKILL: its rows live only in its WAL, never flushed
    child.wait()

    survivor = LsmTable.open(table.uri)
    survivor.write(pa.table({"id": keys, "qty": pa.array(range(1000, 1100), pa.int64())}))
    expected = {(k,): {"id": k, "name": "child", "qty": 1000 + k, "price": float(k)} for k in range(100)}
    assert rows_by_key(survivor.read()) == expected
    survivor.flush()
    survivor.compact()
    assert rows_by_key(LsmTable.open(table.uri).read()) == expected
    survivor.close()
