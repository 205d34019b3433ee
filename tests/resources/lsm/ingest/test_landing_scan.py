"""One look at the landing directory per poll: each location listed once, whatever the directory holds."""

from __future__ import annotations

import os
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq

from resources.lsm.format.layout import ARCHIVE_DIR, LEDGER_DIR
from resources.lsm.format.storage import TableStorage
from resources.lsm.ingest.landing import (
    IngestLedger,
    LandingLocation,
    LandingPolicy,
    LandingRetention,
    new_ledger_entry,
)
from resources.lsm.ingest.landing_scan import scan_landing
from resources.lsm.testing.changegen import EVENTS_SCHEMA


def _listings(monkeypatch) -> Counter[tuple[str, str]]:
    """Every directory listing made through ``TableStorage`` from now on, by (location, directory)."""
    listed: Counter[tuple[str, str]] = Counter()
    children = TableStorage._children

    def counted(self, relative, recursive=False):
        listed[(self.location, relative)] += 1
        return children(self, relative, recursive)

    monkeypatch.setattr(TableStorage, "_children", counted)
    return listed


def _parquet(path, key: int) -> None:
    pq.write_table(pa.table({"id": pa.array([key], pa.int64())}), path)


def test_a_poll_lists_the_landing_directory_and_the_ledger_once_each(make_table, tmp_path, monkeypatch):
    table = make_table(EVENTS_SCHEMA)
    landing_dir = tmp_path / "landing"
    landing_dir.mkdir()
    _parquet(landing_dir / "a.parquet", 1)
    _parquet(landing_dir / "b.parquet", 2)
    for name in ["c.csv", "d.jsonl"]:
        (landing_dir / name).write_text("id\n1\n")
    (landing_dir / "notes.txt").write_text("not a landing file")
    (landing_dir / "nested").mkdir()
    ledger = IngestLedger(table.handle.storage)
    landing = LandingLocation(str(landing_dir))
    ledger.record(new_ledger_entry(landing.files()[1], 1, 0, "earlier"))  # b.parquet: recorded, not retired

    listed = _listings(monkeypatch)
    scan = scan_landing(ledger, landing, LandingRetention("archive"), LandingPolicy(formats=("parquet", "csv")))

    assert [f.name for f in scan.pending] == ["a.parquet", "c.csv"]
    assert set(scan.unsupported) == {"d.jsonl", "notes.txt", "nested"}
    assert os.listdir(landing_dir / ARCHIVE_DIR) == ["b.parquet"]  # the crash's leftover, retired
    landing_lists = listed[(landing.uri, "")]
    assert landing_lists == 1 and listed[(table.uri, LEDGER_DIR)] == 1
    assert listed[(landing.uri, ARCHIVE_DIR)] == 1  # expiry looks at the archive because a file was archived
    assert sum(listed.values()) == 3, listed


def test_an_idle_poll_never_lists_the_archive(make_table, tmp_path, monkeypatch):
    table = make_table(EVENTS_SCHEMA)
    landing = LandingLocation(str(tmp_path / "landing"))
    listed = _listings(monkeypatch)

    scan = scan_landing(IngestLedger(table.handle.storage), landing)

    assert scan.pending == [] and scan.landing_dir_missing
    assert sum(listed.values()) == 2 and listed[(landing.uri, ARCHIVE_DIR)] == 0, listed
