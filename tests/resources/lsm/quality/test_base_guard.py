"""The merge guard on base keys checks exactly the rows appended since the last merge."""

from __future__ import annotations

import lance

from resources.lsm.quality.base_guard import verify_appended_keys
from resources.lsm.testing.changegen import EVENTS_SCHEMA
from tests.helpers import write_generation


def test_merged_rows_need_no_check_and_appended_duplicates_are_found(make_table):
    table = make_table(EVENTS_SCHEMA)
    write_generation(table, list(range(100)), "first")
    table.compact()
    assert verify_appended_keys(table.handle).rows_checked == 0  # merges keep keys unique by construction

    lance.write_dataset(table.dataset().to_table().slice(0, 2), table.uri, mode="append")  # two duplicates
    lance.write_dataset(table.dataset().to_table().slice(0, 0), table.uri, mode="append")
    lance.write_dataset(
        table.dataset().to_table().slice(10, 3).set_column(0, "id", [[1000, 1001, 1002]]), table.uri, mode="append"
    )
    found = verify_appended_keys(table.handle)
    assert found.rows_checked == 5 and found.versions == 5  # 3 appends, the index upkeep, the merge
    assert found.duplicate_keys == 2 and sorted(found.duplicate_sample) == [(0,), (1,)]
    assert found.keys_not_null and not found.keys_unique


def test_the_next_merge_ends_the_scope_and_large_appends_are_left_to_quality_job(make_table):
    table = make_table(EVENTS_SCHEMA)
    write_generation(table, list(range(100)), "first")
    table.compact()
    lance.write_dataset(table.dataset().to_table().slice(0, 50), table.uri, mode="append")
    assert verify_appended_keys(table.handle, max_rows=49).rows_unchecked == 50
    assert verify_appended_keys(table.handle, max_rows=50).duplicate_keys == 50

    write_generation(table, [5000], "second")
    table.compact()
    assert verify_appended_keys(table.handle).rows_checked == 0  # guarded by the merge before (a known limit)


def test_appended_rows_rewritten_by_compact_files_are_still_checked(make_table):
    table = make_table(EVENTS_SCHEMA)
    write_generation(table, list(range(100)), "first")
    table.compact()
    appended = []
    for start in (0, 50):  # two small fragments with two duplicate keys each, then rewritten into one
        rows = table.dataset().to_table().slice(start, 2)
        lance.write_dataset(rows, table.uri, mode="append")
        appended += [(k,) for k in rows["id"].to_pylist()]
    table.dataset().optimize.compact_files()  # remaps the key index: a transaction pylance cannot decode
    table.dataset().optimize.optimize_indices()

    found = verify_appended_keys(table.handle)
    assert found.rows_checked == 4
    assert sorted(found.duplicate_sample) == sorted(appended)


def test_versions_garbage_collection_removed_end_the_walk(make_table):
    table = make_table(EVENTS_SCHEMA)
    write_generation(table, list(range(100)), "first")
    table.compact()  # the merge, then the index upkeep: the merge's version is not the latest
    table.gc(retain_versions=1, older_than=None)
    assert verify_appended_keys(table.handle).rows_checked == 0

    lance.write_dataset(table.dataset().to_table().slice(0, 3), table.uri, mode="append")
    found = verify_appended_keys(table.handle)
    assert found.rows_checked == 3 and found.duplicate_keys == 3
