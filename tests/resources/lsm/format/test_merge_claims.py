"""Merge claims: what a data commit merged before the marker caught up, as every reader sees it."""

from __future__ import annotations

import contextlib
import shutil
from unittest.mock import patch

import pytest

from resources.lsm import LsmTable
from resources.lsm.format.merge_claims import CLAIM_PROPERTY, merged_through, read_claims, unsettled
from resources.lsm.maintenance import compaction
from resources.lsm.testing.changegen import EVENTS_SCHEMA, ChangeStreamSpec, generate_changes, replay
from tests.helpers import rows_by_key


class _Stopped(Exception):
    pass


def _table_with_runs(uri: str, seed: int) -> tuple[LsmTable, list]:
    batches = list(generate_changes(ChangeStreamSpec(num_keys=800, num_batches=4, batch_size=200, seed=seed)))
    table = LsmTable.create(uri, EVENTS_SCHEMA, ["id"], num_shards=2)
    table.write(batches[0])
    table.close()
    table.compact()  # the base has fragments: later merges take two commits
    for batch in batches[1:]:
        table.write(batch)
        table.close()
    table.build_pending_runs()
    return table, batches


def _view(table: LsmTable) -> dict:
    return {k[0]: v for k, v in rows_by_key(table.read()).items()}


def test_a_claim_counts_as_merged_until_the_marker_catches_up(tmp_path):
    uri = str(tmp_path / "t.lance")
    table, batches = _table_with_runs(uri, seed=3)
    pending = {s.shard_id: s.pending_generations[-1][0] for s in table.shards()}
    with patch.object(compaction, "commit_marker", side_effect=_Stopped), contextlib.suppress(_Stopped):
        table.compact()

    reader = LsmTable.open(uri)
    version = reader.dataset().version
    assert CLAIM_PROPERTY in reader.dataset().read_transaction(version).transaction_properties
    assert reader.handle.unsettled_claims(version) == pending
    assert reader.handle.compacted_generations(version) == pending
    assert all(not s.pending_generations for s in reader.shards())  # merged through the claim
    assert _view(reader) == replay(batches)

    reader.compact()  # settles: one marker commit, no data
    settled = reader.dataset().version
    assert settled == version + 1 and reader.handle.unsettled_claims(settled) == {}
    assert read_claims(reader.dataset(), settled) == {}
    assert _view(LsmTable.open(uri)) == replay(batches)


def test_a_table_created_again_at_the_same_location_does_not_see_its_predecessors_claims(tmp_path):
    uri = str(tmp_path / "t.lance")
    first, _ = _table_with_runs(uri, seed=5)
    with patch.object(compaction, "commit_marker", side_effect=_Stopped), contextlib.suppress(_Stopped):
        first.compact()
    stale = LsmTable.open(uri)
    version = stale.dataset().version
    assert stale.handle.unsettled_claims(version)  # cached for (location, version, manifest)

    shutil.rmtree(uri)
    second, batches = _table_with_runs(uri, seed=6)
    while second.dataset().version < version:  # reach the same version number with no claim outstanding
        second.dataset().update_config({"test.padding": str(second.dataset().version)})
    assert second.dataset().version == version
    again = LsmTable.open(uri)
    assert again.handle.unsettled_claims(version) == {}
    assert _view(again) == replay(batches)


@pytest.mark.parametrize(
    ("markers", "claims", "merged", "open_"),
    [
        ({}, {}, {}, {}),
        ({"a": 3}, {"a": 2}, {"a": 3}, {}),
        ({"a": 1}, {"a": 4, "b": 2}, {"a": 4, "b": 2}, {"a": 4, "b": 2}),
    ],
)
def test_merged_through_is_the_newer_of_marker_and_claim(markers, claims, merged, open_):
    assert merged_through(markers, claims) == merged
    assert unsettled(markers, claims) == open_
