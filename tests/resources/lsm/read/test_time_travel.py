"""Time travel: a table version read again later, across flushes, merges and garbage collection."""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa
import pytest

from resources.lsm import LsmTable, TableVersion, VersionNotRetainedError
from resources.lsm.testing.changegen import EVENTS_SCHEMA, ChangeStreamSpec, generate_changes
from tests.helpers import rows_by_key
from tests.resources.lsm.maintenance.maintenance_helpers import oracle_view

BATCHES = list(generate_changes(ChangeStreamSpec(num_keys=600, num_batches=6, batch_size=250, seed=11)))


def versioned_history(uri: str) -> tuple[LsmTable, list[tuple[TableVersion, dict]]]:
    """A table written batch by batch (:data:`BATCHES`), some batches flushed, one merge midway; each
    batch's version and view."""
    table = LsmTable.create(uri, EVENTS_SCHEMA, ["id"], num_shards=3)
    history = []
    for number, batch in enumerate(BATCHES):
        table.write(batch)
        if number % 2:
            table.close()  # a generation in every shard; the other batches wait in the WAL
        if number == 3:
            table.compact()
        history.append((table.version(), oracle_view(BATCHES[: number + 1])))
    return table, history


@pytest.fixture
def history(tmp_path):
    table, versions = versioned_history(str(tmp_path / "t.lance"))
    table.close()
    table.compact()
    table.gc(orphan_grace_seconds=0, wal_grace_seconds=0)  # within the default version retention
    return LsmTable.open(table.uri), versions


def test_every_version_reads_its_own_view_after_flushes_merges_and_gc(history):
    table, versions = history
    assert [v for v, _ in versions] == sorted(v for v, _ in versions)
    for version, expected in versions:
        assert rows_by_key(table.read(as_of=version)) == expected
        assert rows_by_key(pa.Table.from_batches(table.scanner(as_of=str(version)))) == expected
        assert table.count(as_of=version) == len(expected)
        probe = [k for (k,) in list(expected)[:20]] + [10**9]
        assert rows_by_key(table.lookup(probe, as_of=version)) == {(k,): expected[(k,)] for k in probe[:-1]}


def test_a_version_reads_with_a_filter_and_columns(history):
    table, versions = history
    version, expected = versions[2]
    read = table.read(columns=["id", "status"], filter="status = 'paid'", as_of=version)
    assert rows_by_key(read) == {
        k: {"id": r["id"], "status": "paid"} for k, r in expected.items() if r["status"] == "paid"
    }


def test_a_version_older_than_the_retention_is_refused_by_name(history):
    table, versions = history
    table.gc(orphan_grace_seconds=0, wal_grace_seconds=0, older_than=timedelta(0), retain_versions=1)
    with pytest.raises(VersionNotRetainedError, match="version_retention_hours") as raised:
        table.read(as_of=versions[0][0])
    assert raised.value.version == versions[0][0]
    now = table.version()
    assert rows_by_key(table.read(as_of=now)) == versions[-1][1]


def test_a_version_whose_wal_entries_were_collected_is_refused(tmp_path):
    table = LsmTable.create(str(tmp_path / "t.lance"), EVENTS_SCHEMA, ["id"], num_shards=1)
    table.write(pa.table({"id": [1], "customer": ["a"], "amount": [1.0], "status": ["new"]}))
    in_the_wal = table.version()
    table.close()  # flushed: the entries are consumed
    table.gc(wal_grace_seconds=0, older_than=timedelta(0))
    with pytest.raises(VersionNotRetainedError, match="WAL entries"):
        table.read(as_of=in_the_wal)
