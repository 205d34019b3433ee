"""The change feed: net change per key between two versions, against the difference of their views."""

from __future__ import annotations

import itertools
import random

import pyarrow as pa
import pytest

from resources.lsm import LsmTable
from resources.lsm.read import change_feed
from resources.lsm.testing.changegen import EVENTS_SCHEMA
from tests.resources.lsm.maintenance.maintenance_helpers import build_change_table, oracle_view, run_worker
from tests.resources.lsm.read.test_time_travel import versioned_history


def expected_changes(before: dict, after: dict) -> dict:
    """The oracle: upserts for keys new or different in ``after``, deletes for keys only ``before`` holds."""
    changes = {k: {**row, "_op": "upsert"} for k, row in after.items() if before.get(k) != row}
    for k, row in before.items():
        if k not in after:
            changes[k] = {**dict.fromkeys(row), "id": row["id"], "_op": "delete"}
    return changes


def feed(table: LsmTable, since, until=None) -> dict:
    changes = table.changes(since=since, until=until)
    assert changes.schema.names == [*EVENTS_SCHEMA.names, "_op"]
    rows = pa.Table.from_batches(list(changes), schema=changes.schema).to_pylist()
    by_key = {(r["id"],): r for r in rows}
    assert len(by_key) == len(rows), "a key appears twice"
    return by_key


def test_changes_between_any_two_versions_are_the_difference_of_their_views(tmp_path):
    table, versions = versioned_history(str(tmp_path / "t.lance"))
    table.close()
    table.compact()
    for (since, before), (until, after) in itertools.combinations(versions, 2):
        assert feed(table, since, until) == expected_changes(before, after)
    latest, view = versions[-1]
    assert feed(table, latest) == {}
    assert feed(table, versions[0][0]) == expected_changes(versions[0][1], view)  # until now


def test_a_key_changed_and_changed_back_is_not_a_change(make_table):
    table = make_table(EVENTS_SCHEMA)
    row = {"id": [1], "customer": ["a"], "amount": [1.0], "status": ["new"]}
    table.write(pa.table(row))
    since = table.version()
    table.write(pa.table({**row, "status": ["paid"]}))
    table.close()
    table.write(pa.table(row))
    table.write(pa.table({"id": [2], "customer": ["b"], "amount": [2.0], "status": ["new"]}))
    table.write(pa.table({"id": [2], "_op": ["delete"]}))
    assert feed(table, since) == {}


def test_the_feed_reads_only_the_changed_keys(make_table, monkeypatch):
    """Keys come from the levels written after `since`; the base is only probed, for those keys."""
    table = make_table(EVENTS_SCHEMA, num_shards=2)
    base = pa.table(
        {"id": range(5000), "customer": ["c"] * 5000, "amount": [1.0] * 5000, "status": ["new"] * 5000},
        schema=EVENTS_SCHEMA,
    )
    table.write(base)
    table.close()
    table.compact()
    since = table.version()
    table.write(pa.table({"id": [7, 4999], "customer": ["x", "y"], "amount": [2.0, 3.0], "status": ["paid", "paid"]}))
    looked_up = []
    lookup = change_feed.lookup
    monkeypatch.setattr(
        change_feed, "lookup", lambda s, keys, *a: looked_up.append(keys.num_rows) or lookup(s, keys, *a)
    )
    assert sorted(feed(table, since)) == [(7,), (4999,)]
    assert looked_up == [2, 2]


def test_a_merge_killed_midway_never_changes_the_feed(tmp_path):
    uri = str(tmp_path / "t.lance")
    _, batches = build_change_table(uri)
    table = LsmTable.open(uri)
    since, before = table.version(), oracle_view(batches)
    table.write(
        pa.table({"id": [10**6], "customer": ["late"], "amount": [1.0], "status": ["new"]}, schema=EVENTS_SCHEMA)
    )
    table.close()
    expected = expected_changes(
        before, {**before, (10**6,): {"id": 10**6, "customer": "late", "amount": 1.0, "status": "new"}}
    )
    rng = random.Random(3)
    for nth in (1, 2):
        run_worker(uri, "compact", "during-commit", nth, rng.uniform(0.0, 0.02))
        assert feed(LsmTable.open(uri), since) == expected
    LsmTable.open(uri).compact()
    assert feed(LsmTable.open(uri), since) == expected


def test_until_before_since_is_refused(make_table):
    table = make_table(EVENTS_SCHEMA)
    early = table.version()
    table.write(pa.table({"id": [1], "customer": ["a"], "amount": [1.0], "status": ["new"]}))
    with pytest.raises(ValueError, match="older than since"):
        table.changes(since=table.version(), until=early)
