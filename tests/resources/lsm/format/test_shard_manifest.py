"""Finding a shard's WAL entries: listed once per handle, then only the next positions looked for."""

import pyarrow as pa
import pytest

from resources.lsm import LsmTable
from resources.lsm.format import shard_manifest
from resources.lsm.format.layout import wal_dir
from resources.lsm.format.shard_manifest import KnownShardFiles, list_wal_entries, position_name
from resources.lsm.format.storage import TableStorage
from tests.conftest import ITEMS_SCHEMA

SHARD = "a-shard"


def _write_entries(storage: TableStorage, positions: range) -> None:
    for position in positions:
        storage.write_bytes_atomic(f"{wal_dir(SHARD)}/{position_name(position)}.arrow", b"entry")


def _counting_listings(storage: TableStorage, monkeypatch) -> list[str]:
    listed: list[str] = []
    list_files_named = storage.list_files_named
    monkeypatch.setattr(storage, "list_files_named", lambda *args: listed.append(args[0]) or list_files_named(*args))
    return listed


@pytest.mark.parametrize("where", ["local", "s3"])
def test_entries_written_after_a_listing_are_found_by_their_positions(where, tmp_path, monkeypatch, request):
    if where == "s3":
        storage = TableStorage(
            f"{request.getfixturevalue('s3_root')}/t", request.getfixturevalue("s3_server").storage_options()
        )
    else:
        storage = TableStorage(str(tmp_path / "t"))
    listed = _counting_listings(storage, monkeypatch)
    known = KnownShardFiles()
    _write_entries(storage, range(1, 4))
    storage.write_bytes_atomic(f"{wal_dir(SHARD)}/notes.txt", b"a stray file")

    def positions(after: int) -> list[int]:
        return [entry.position for entry in list_wal_entries(storage, SHARD, after=after, known=known)]

    assert positions(0) == [1, 2, 3] and len(listed) == 1
    assert positions(0) == [1, 2, 3] and len(listed) == 1  # nothing new: one stat, no listing
    _write_entries(storage, range(4, 6))
    assert positions(2) == [3, 4, 5] and len(listed) == 1  # the replay position moved on: entries below it go
    _write_entries(storage, range(6, 6 + 2 * shard_manifest._PROBES_BEFORE_LISTING))
    assert positions(2) == list(range(3, 6 + 2 * shard_manifest._PROBES_BEFORE_LISTING))
    assert len(listed) == 2  # many new entries: one listing costs less than a stat each
    assert positions(0)[:2] == [1, 2] and len(listed) == 3  # below what was listed: listed again


def test_a_reader_sees_every_write_another_handle_acknowledges_after_it_listed_the_wal(make_table, monkeypatch):
    writer = make_table(num_shards=2)
    reader = LsmTable.open(writer.uri)
    listed = _counting_listings(reader.handle.storage, monkeypatch)

    def row(key: int, value: str) -> pa.Table:
        return pa.table({"id": [key], "name": [value], "price": [1.0]}, schema=ITEMS_SCHEMA)

    expected = {}
    for round_ in range(3 * shard_manifest._PROBES_BEFORE_LISTING):
        writer.write(row(round_ % 5, f"v{round_}"))
        expected[round_ % 5] = f"v{round_}"
        assert reader.lookup([round_ % 5])["name"].to_pylist() == [f"v{round_}"]
        read = reader.read(columns=["id", "name"])
        assert dict(zip(read["id"].to_pylist(), read["name"].to_pylist(), strict=True)) == expected
    assert len(listed) <= len(reader.handle.shard_ids)  # each shard's WAL listed once, then probed
