"""Rows a recorded rewrite of the base moved are followed to where they are now, through chains of rewrites."""

from __future__ import annotations

import json
from types import SimpleNamespace

import lance
import numpy as np
import pyarrow as pa
import pytest

from resources.lsm.format.layout import REWRITES_DIR
from resources.lsm.format.storage import TableStorage
from resources.lsm.read import rewrites
from resources.lsm.read.deletion_vector import fragment_ids
from resources.lsm.read.rewrites import compact_recording_moves, follow_moved_rows


def _addresses_by_id(dataset: lance.LanceDataset) -> dict[int, int]:
    rows = dataset.to_table(columns=["id"], with_row_address=True)
    return dict(zip(rows["id"].to_pylist(), rows["_rowaddr"].to_pylist(), strict=True))


@pytest.fixture
def table(tmp_path) -> tuple[TableStorage, lance.LanceDataset]:
    """3,000 rows in 15 fragments of 200, with a BTREE on ``id`` (every rewrite remaps it)."""
    uri = str(tmp_path / "t.lance")
    dataset = lance.write_dataset(pa.table({"id": np.arange(3000)}), uri, max_rows_per_file=200)
    dataset.create_scalar_index("id", "BTREE")
    return TableStorage(uri), dataset


def test_rows_are_followed_through_two_rewrites_of_several_groups_and_deleted_ones_are_not(table):
    storage, dataset = table
    first = _addresses_by_id(dataset)
    # Fragment 7 keeps all its rows: it splits the first rewrite into two groups.
    dataset.delete("(id % 7 = 3 AND (id < 1400 OR id >= 1600)) OR id < 150 OR (id > 2420 AND id < 2433)")
    compact_recording_moves(storage, dataset, target_rows_per_fragment=200, materialize_deletions_threshold=0.05)
    assert 7 in {f.fragment_id for f in dataset.get_fragments()}
    dataset.delete("id % 11 = 5")
    compact_recording_moves(storage, dataset, target_rows_per_fragment=1000, materialize_deletions_threshold=0.05)
    records = sorted(entry.name for entry in storage.list_files(REWRITES_DIR))
    assert len(records) == 2
    assert len(json.loads(storage.read_bytes(f"{REWRITES_DIR}/{records[0]}"))["groups"]) > 1

    now = _addresses_by_id(dataset)
    followed = follow_moved_rows(
        storage, dataset, fragment_ids(dataset), np.array(list(first.values()), dtype=np.uint64)
    )

    assert followed.to_pylist() == [now.get(key) for key in first]  # null: deleted before a rewrite read it
    assert 0 < followed.null_count == len(first) - len(now)


def test_a_bounded_rewrite_takes_the_first_groups_and_the_next_one_goes_on_where_it_stopped(table):
    storage, dataset = table
    first = _addresses_by_id(dataset)
    dataset.delete("id % 7 = 3")  # every fragment past the threshold: one group each
    untouched = fragment_ids(dataset)

    metrics = compact_recording_moves(
        storage, dataset, target_rows_per_fragment=200, materialize_deletions_threshold=0.05, max_rows_rewritten=450
    )

    assert metrics is not None and metrics.fragments_removed == 2  # two 200-row groups fit 450 rows
    assert len(untouched - fragment_ids(dataset)) == 2
    compact_recording_moves(
        storage, dataset, target_rows_per_fragment=200, materialize_deletions_threshold=0.05, max_rows_rewritten=1
    )
    newest = sorted(entry.name for entry in storage.list_files(REWRITES_DIR))[-1]
    assert len(json.loads(storage.read_bytes(f"{REWRITES_DIR}/{newest}"))["groups"]) == 1  # one, whatever the bound
    assert len(untouched - fragment_ids(dataset)) > 2
    now = _addresses_by_id(dataset)
    followed = follow_moved_rows(
        storage, dataset, fragment_ids(dataset), np.array(list(first.values()), dtype=np.uint64)
    )
    followed_to = dict(zip(first, followed.to_pylist(), strict=True))
    assert all(followed_to[key] == address for key, address in now.items())  # moved or not, every live row
    assert followed.null_count > 0  # deleted rows a rewrite dropped; those still in place are Lance's to skip


def test_nothing_to_rewrite_commits_nothing(table):
    storage, dataset = table
    version = dataset.version

    assert compact_recording_moves(storage, dataset, 200, 0.05, max_rows_rewritten=450) is None
    assert lance.dataset(storage.location).version == version and storage.list_files(REWRITES_DIR) == []


def test_only_the_newest_records_are_kept(table, monkeypatch):
    storage, dataset = table
    monkeypatch.setattr(rewrites, "REWRITES_FOLLOWED", 1)
    first = _addresses_by_id(dataset)
    for deleted in ("id < 150", "id % 11 = 5"):
        dataset.delete(deleted)
        compact_recording_moves(storage, dataset, target_rows_per_fragment=200, materialize_deletions_threshold=0.05)

    assert [entry.name for entry in storage.list_files(REWRITES_DIR)] == [f"{dataset.version:020d}.json"]
    followed = follow_moved_rows(
        storage, dataset, fragment_ids(dataset), np.array(list(first.values()), dtype=np.uint64)
    )
    now = _addresses_by_id(dataset)
    followed_to = dict(zip(first, followed.to_pylist(), strict=True))
    assert all(now[key] == address for key, address in followed_to.items() if address is not None)
    # The first rewrite's record is gone: the rows it moved are lost along with the deleted ones.
    assert followed.null_count > len(first) - len(now)


def test_rows_of_a_rewrite_not_recorded_are_not_followed(table):
    storage, dataset = table
    first = _addresses_by_id(dataset)
    dataset.delete("id < 150")
    dataset.optimize.compact_files(materialize_deletions_threshold=0.05)  # Lance's own: no record

    followed = follow_moved_rows(
        storage, dataset, fragment_ids(dataset), np.array(list(first.values()), dtype=np.uint64)
    )

    assert followed.null_count == len(first)


def test_a_rewrite_beside_another_writers_append_is_not_recorded(table, monkeypatch):
    storage, dataset = table
    dataset.delete("id < 150")
    plan = rewrites.Compaction.plan

    def plan_then_append(*args):
        """Another writer appends between the plan and the rewrite's commit: its fragment is not the rewrite's."""
        planned = plan(*args)
        lance.write_dataset(pa.table({"id": np.arange(5000, 5100)}), storage.location, mode="append")
        return planned

    monkeypatch.setattr(
        rewrites, "Compaction", SimpleNamespace(plan=plan_then_append, commit=rewrites.Compaction.commit)
    )
    compact_recording_moves(storage, dataset, target_rows_per_fragment=200, materialize_deletions_threshold=0.05)

    assert 5000 in _addresses_by_id(lance.dataset(storage.location))  # both commits landed
    assert storage.list_files(REWRITES_DIR) == []
