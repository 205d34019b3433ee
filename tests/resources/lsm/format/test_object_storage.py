"""The engine on ``s3://`` (a real ``moto_server`` process): every level, every maintenance step, landing files.

Configured once from the ``AWS_*`` environment, once from ``storage_options``
with no ``AWS_*`` variable set at all (what a Spark executor without the
variables sees).
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from resources.lsm import LsmTable, VersionNotRetainedError
from resources.lsm.format.layout import ARCHIVE_DIR, KEY_INDEX_DIR
from resources.lsm.format.shard_manifest import list_generation_dirs
from resources.lsm.format.storage import TableStorage, filesystem, join
from resources.lsm.ingest.landing import (
    IngestLedger,
    LandingLocation,
    LandingRetention,
    new_ledger_entry,
    read_landing_file,
)
from resources.lsm.testing.changegen import EVENTS_SCHEMA, ChangeStreamSpec, generate_changes, replay
from tests.helpers import rows_by_key

EVERYTHING = {"orphan_grace_seconds": 0, "wal_grace_seconds": 0, "retain_versions": 1, "older_than": None}


@pytest.fixture(params=["environment", "storage_options"])
def configured(request, s3_root, s3_server, monkeypatch):
    """``(table URI, storage options)``: options ``None`` (the environment) or complete options and no ``AWS_*``."""
    if request.param == "environment":
        return f"{s3_root}/table.lance", None
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    return f"{s3_root}/table.lance", s3_server.storage_options()


def _view(table: LsmTable) -> dict:
    return {k[0]: v for k, v in rows_by_key(table.read()).items()}


def _generations(table: LsmTable) -> int:
    return sum(len(list_generation_dirs(table.handle.storage, s)) for s in table.shard_ids)


def test_write_read_lookup_flush_compact_gc_on_s3(configured):
    uri, options = configured
    batches = list(generate_changes(ChangeStreamSpec(num_keys=300, num_batches=3, batch_size=200, seed=5)))
    table = LsmTable.create(uri, EVENTS_SCHEMA, ["id"], num_shards=2, storage_options=options)
    for batch in batches[:-1]:
        table.write(batch)
        table.close()  # one generation per batch and shard
    table.write(batches[-1])  # left in the WAL tail
    table.detach_writers()

    reopened = LsmTable.open(uri, storage_options=options)
    expected = replay(batches)
    assert _view(reopened) == expected
    version = reopened.version()  # read again after the flush, merge and GC below
    some = sorted(expected)[:5]
    assert sorted(reopened.lookup(some)["id"].to_pylist()) == some  # bloom filters read from s3
    assert _generations(reopened) == 2 * (len(batches) - 1)

    assert reopened.flush() and all(s.unflushed_wal_entries == 0 for s in reopened.shards())
    merged = reopened.compact()
    assert merged.generations_merged == _generations(reopened)
    assert {k[0]: v for k, v in rows_by_key(reopened.read(as_of=version)).items()} == expected
    assert reopened.changes(since=version).read_all().num_rows == 0

    more = list(generate_changes(ChangeStreamSpec(num_keys=300, num_batches=2, batch_size=200, seed=6)))
    for batch in more:
        reopened.write(batch)
        reopened.close()
    reopened.build_pending_runs()
    join_free = reopened.compact()  # deletion files and new fragments written on s3, no join
    assert all(s.join_free_passes == s.passes == 1 for s in join_free.shards)
    assert not reopened.handle.storage.list_files(KEY_INDEX_DIR)  # lookups memory-map key indexes on local disk only
    expected = replay([*batches, *more])
    assert _view(LsmTable.open(uri, storage_options=options)) == expected

    reclaimed = reopened.gc(**EVERYTHING)
    merged_generations = merged.generations_merged + join_free.generations_merged
    assert reclaimed.compacted_generations.count == merged_generations and _generations(reopened) == 0
    assert _view(reopened) == expected
    assert reopened.dataset().count_rows() == len(expected)
    with pytest.raises(VersionNotRetainedError):  # GC kept one base version
        reopened.read(as_of=version)


def test_landing_files_ledger_and_retention_on_s3(configured):
    uri, options = configured
    landing = uri.replace("table.lance", "landing")
    assert LandingLocation(landing, options).files() == [], "a missing landing directory has no files"
    storage = TableStorage(landing, options)
    storage.write_bytes_atomic("b.csv", b"id,customer\n2,bob\n")
    storage.write_bytes_atomic("a.jsonl", b'{"id": 1, "customer": "ada"}\nnot json\n')
    storage.write_bytes_atomic("c.parquet", _parquet(pa.table({"id": [3]})))
    storage.write_bytes_atomic("notes.txt", b"ignored")
    storage.write_bytes_atomic("_quarantine/run=x/part.json", b"{}")

    files = LandingLocation(landing, options).files()
    assert [(f.name, f.order) for f in files] == [("a.jsonl", 0), ("b.csv", 1), ("c.parquet", 2)]
    assert all(f.path == f"{landing}/{f.name}" for f in files)
    jsonl = read_landing_file(files[0].path, storage_options=options)
    assert jsonl.table["customer"].to_pylist() == ["ada"] and [r.row for r in jsonl.rejections] == [1]
    csv = read_landing_file(files[1].path, storage_options=options)
    assert csv.table.to_pylist() == [{"id": "2", "customer": "bob"}]
    assert read_landing_file(files[2].path, storage_options=options).table["id"].to_pylist() == [3]

    ledger = IngestLedger(TableStorage(uri, options))
    ledger.record(new_ledger_entry(files[0], 2, 1, "run"))
    assert ledger.ingested_names() == {"a.jsonl"} and ledger.entry("a.jsonl").rejected == 1
    assert LandingLocation(landing, options).retire(["a.jsonl"], LandingRetention("archive")) == 1
    assert [f.name for f in LandingLocation(landing, options).files()] == ["b.csv", "c.parquet"]
    assert [e.name for e in storage.list_dir(ARCHIVE_DIR)] == ["a.jsonl"]


def test_filesystem_resolves_local_paths_and_uris(tmp_path, monkeypatch, s3_server):
    monkeypatch.chdir(tmp_path)
    fs, path = filesystem("landing")
    assert isinstance(fs, pafs.LocalFileSystem) and path == str(tmp_path / "landing")
    assert join("landing", "x.csv") == str(tmp_path / "landing" / "x.csv")
    assert join("s3://bucket/landing/", "x.csv") == "s3://bucket/landing/x.csv"
    fs, path = filesystem("s3://lsm-tests/some/dir/", s3_server.storage_options())
    assert isinstance(fs, pafs.S3FileSystem) and path == "lsm-tests/some/dir"
    assert fs.get_file_info("lsm-tests").type == pafs.FileType.Directory  # the options reach the server


def test_named_listing_is_the_same_on_a_local_disk_and_on_s3(tmp_path, s3_root, s3_server):
    """Locally only the wanted names are stat-ed; the answer must not depend on where the files are."""
    listings = []
    for storage in (TableStorage(str(tmp_path / "t")), TableStorage(f"{s3_root}/t", s3_server.storage_options())):
        assert storage.list_files_named("wal", lambda name: True) == []  # no directory yet
        for name, data in (("1.arrow", b"a"), ("2.arrow", b"bb"), ("3.arrow", b"ccc"), ("notes.txt", b"x")):
            storage.write_bytes_atomic(f"wal/{name}", data)
        storage.write_bytes_atomic("wal/sub/4.arrow", b"dddd")  # a directory's contents are not its files
        wanted = storage.list_files_named("wal", lambda name: name.endswith(".arrow") and name != "1.arrow")
        listings.append(sorted((entry.name, entry.size, entry.mtime_ns is not None) for entry in wanted))
    assert listings[0] == listings[1] == [("2.arrow", 2, True), ("3.arrow", 3, True)]


def _parquet(table: pa.Table) -> bytes:
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return bytes(sink.getvalue().to_pybytes())


def test_recovery_checks_and_scratch_sample_on_s3(configured, tmp_path):
    from resources.lsm.quality.recovery_checks import verify_shards
    from resources.lsm.quality.scratch import scratch_sample

    uri, options = configured
    batches = list(generate_changes(ChangeStreamSpec(num_keys=100, num_batches=2, batch_size=80, seed=3)))
    table = LsmTable.create(uri, EVENTS_SCHEMA, ["id"], num_shards=2, storage_options=options)
    table.write(batches[0])
    table.close()
    table.write(batches[1])
    table.detach_writers()

    reports = verify_shards(table.handle)
    assert [f for r in reports for f in r.findings] == [] and sum(r.generations_verified for r in reports) == 2
    copy = scratch_sample(table, str(tmp_path / "copy.lance"), rows=1000)
    assert _view(copy) == _view(table) == replay(batches)  # the sample holds the whole (small) view


def test_a_vector_tables_stored_key_hashes_on_s3(s3_root):
    """Hashes are written, found and collected on s3:// as on a local disk; scans read through them."""
    vector = pa.list_(pa.float32(), 2)
    schema = pa.schema([pa.field("id", pa.string(), nullable=False), ("v", pa.int64()), ("vec", vector)])
    table = LsmTable.create(f"{s3_root}/vectors.lance", schema, ["id"], num_shards=2)

    def rows(ids: range, value: int) -> pa.Table:
        keys = [f"k{i}" for i in ids]
        return pa.table({"id": keys, "v": [value] * len(keys), "vec": [[1.0, 0.0]] * len(keys)}, schema=schema)

    table.write(rows(range(300), 0))
    table.close()
    table.compact(max_rows_per_pass=10**9)  # the base's first fragment and its hashes
    table.write(rows(range(0, 300, 3), 1))
    table.close()
    table.handle.storage.delete_dir("_lsm_runs")  # keys without a run: found through the hashes
    hashes = table.handle.storage.list_files("_lsm_key_hashes/v1")
    assert len(hashes) == len(table.dataset().get_fragments()) == 1
    assert {k: row["v"] for k, row in _view(table).items()} == {f"k{i}": int(i % 3 == 0) for i in range(300)}
    table.compact(max_rows_per_pass=10**9)
    table.dataset().optimize.compact_files(target_rows_per_fragment=10_000)  # rewrites: new fragment, new hashes
    table.build_pending_runs()
    assert table.gc(**EVERYTHING).key_hashes.count >= 1
    assert len(table.handle.storage.list_files("_lsm_key_hashes/v1")) == len(table.dataset().get_fragments())
