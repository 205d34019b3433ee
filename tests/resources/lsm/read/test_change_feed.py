"""The change feed: every key written between two versions, with its state at the later one, against an oracle."""

from __future__ import annotations

import itertools
import random

import pyarrow as pa
import pytest

from resources.lsm import LsmTable, VersionNotRetainedError
from resources.lsm.read import change_feed
from resources.lsm.testing.changegen import EVENTS_SCHEMA
from tests.resources.lsm.maintenance.maintenance_helpers import build_change_table, run_worker
from tests.resources.lsm.read.test_time_travel import BATCHES, versioned_history


def expected_changes(before: dict, after: dict, written: set) -> dict:
    """The oracle: each key ``written`` in between once: an upsert with its row in ``after``, or a delete
    if ``before`` holds it and ``after`` does not."""
    changes = {k: {**after[k], "_op": "upsert"} for k in written if k in after}
    for k in written:
        if k in before and k not in after:
            changes[k] = {**dict.fromkeys(before[k]), "id": before[k]["id"], "_op": "delete"}
    return changes


def keys_of(batches: list[pa.Table]) -> set:
    return {(k,) for batch in batches for k in batch["id"].to_pylist()}


def feed(table: LsmTable, since, until=None) -> dict:
    changes = table.changes(since=since, until=until)
    assert changes.schema.names == [*EVENTS_SCHEMA.names, "_op"]
    rows = pa.Table.from_batches(list(changes), schema=changes.schema).to_pylist()
    by_key = {(r["id"],): r for r in rows}
    assert len(by_key) == len(rows), "a key appears twice"
    return by_key


def test_changes_between_any_two_versions_follow_the_oracle(tmp_path):
    table, versions = versioned_history(str(tmp_path / "t.lance"))
    table.close()
    table.compact()
    for (i, (since, before)), (j, (until, after)) in itertools.combinations(enumerate(versions), 2):
        assert feed(table, since, until) == expected_changes(before, after, keys_of(BATCHES[i + 1 : j + 1]))
    latest, view = versions[-1]
    assert feed(table, latest) == {}
    assert feed(table, versions[0][0]) == expected_changes(versions[0][1], view, keys_of(BATCHES[1:]))  # until now


def test_what_was_written_before_the_version_is_not_a_change(make_table):
    table = make_table(EVENTS_SCHEMA)
    row = {"id": [1], "customer": ["a"], "amount": [1.0], "status": ["new"]}
    table.write(pa.table(row))
    table.write(pa.table({**row, "id": [3]}))
    since = table.version()  # keys 1 and 3 in the WAL, flushed after `since`
    table.close()
    assert feed(table, since) == {}
    table.write(pa.table({**row, "status": ["paid"]}))
    table.write(pa.table(row))  # changed and changed back: written, with its newest row
    table.write(pa.table({"id": [2], "customer": ["b"], "amount": [2.0], "status": ["new"]}))
    table.write(pa.table({"id": [2, 3], "_op": ["delete", "delete"]}))  # 2 was never live at `since`
    assert feed(table, since) == {
        (1,): {"id": 1, "customer": "a", "amount": 1.0, "status": "new", "_op": "upsert"},
        (3,): {"id": 3, "customer": None, "amount": None, "status": None, "_op": "delete"},
    }


def test_the_feed_never_reads_the_base_for_upserts(make_table, monkeypatch):
    """Upserts come from the levels written after `since`; only deleted keys are looked up, at `since`."""
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
    table.write(pa.table({"id": [12, 10**6], "_op": ["delete", "delete"]}))
    looked_up = []
    lookup = change_feed.lookup

    def counting_lookup(snapshot, keys, *args):
        looked_up.append(keys.num_rows)
        return lookup(snapshot, keys, *args)

    monkeypatch.setattr(change_feed, "lookup", counting_lookup)
    assert {k: r["_op"] for k, r in feed(table, since).items()} == {(7,): "upsert", (4999,): "upsert", (12,): "delete"}
    assert looked_up == [2]  # the two deleted keys, not the upserted ones


def test_a_merge_killed_midway_never_changes_the_feed(tmp_path):
    uri = str(tmp_path / "t.lance")
    build_change_table(uri)
    table = LsmTable.open(uri)
    since = table.version()
    late = {"id": 10**6, "customer": "late", "amount": 1.0, "status": "new"}
    table.write(pa.Table.from_pylist([late], schema=EVENTS_SCHEMA))
    table.close()
    expected = {(late["id"],): {**late, "_op": "upsert"}}
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


def test_a_feed_over_wal_entries_removed_in_between_is_refused(tmp_path):
    # Both versions' own tails are intact: only an entry written between them is gone (removed by hand).
    table = LsmTable.create(str(tmp_path / "t.lance"), EVENTS_SCHEMA, ["id"], num_shards=1)
    row = {"id": [1], "customer": ["a"], "amount": [1.0], "status": ["new"]}
    table.write(pa.table(row))
    since = table.version()
    (wal,) = (tmp_path / "t.lance" / "_mem_wal").glob("*/wal")
    before = set(wal.iterdir())
    for key in (2, 3):
        table.write(pa.table({**row, "id": [key]}))
    table.close()  # flushed: the later version replays nothing
    until = table.version()
    assert set(feed(table, since, until)) == {(2,), (3,)}
    written = sorted(set(wal.iterdir()) - before)
    assert len(written) == 2
    written[0].unlink()

    with pytest.raises(VersionNotRetainedError, match="were removed") as raised:
        table.changes(since=since, until=until)
    assert raised.value.version == since
