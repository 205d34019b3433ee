"""Garbage collection: what flushing and merging leave behind.

Six kinds of garbage, each with the rule that makes deleting it safe. Base
versions go first, so the generation rule sees exactly what is retained.

Old base versions
    ``cleanup_old_versions(older_than, retain_versions)``. A reader pinned to
    a removed version loses its base files, so the retention window must
    outlast the longest read.

Compacted generations
    Generation ``g`` of shard ``s`` is deleted only when

    1. ``g`` is at or below the compacted marker of ``s`` at *every* retained
       base version. A reader lists the generations above the marker of the
       base version it pinned; every pinnable version has a marker >= ``g``,
       so no reader, in flight or future, can list ``g`` as pending. (Markers
       only grow, but a restore can bring an old manifest back, so we take
       the minimum over all retained versions rather than the oldest.)
    2. every index MemWAL maintains (all user indexes when
       ``maintain_all_indexes``) has caught up to ``g`` for ``s``, per the
       ``index_catchup`` record of the latest base version. An index without
       a record has not caught up. ``optimize_indices`` writes the record;
       ``compact_files`` clears it.

Consumed WAL entries
    Entries at or below ``replay_after_wal_position`` of the newest shard
    manifest version that is at least ``wal_grace_seconds`` old, and at
    least as old as the base-version retention (``older_than``). Manifest
    versions are immutable files, so their modification time says when a
    position became covered by a generation. The grace protects

    * readers in flight: a read started less than the grace ago saw a replay
      position at least that high, so it never needs a deleted entry;
    * fencing: a stale writer detects it is fenced when its put-if-not-exists
      hits an entry another writer wrote. Deleting that entry would let the
      stale writer "succeed" at a consumed position and lose the write. The
      entry at its next position is older than the grace, so the stale
      writer has been stalled longer than the grace; we assume none is.

    The retention keeps what time travel needs: a table version read again
    later (``as_of``) lists the WAL entries its shards had not flushed yet.
    Their storage cost: within the retention window, the WAL holds a second
    copy of what the generations flushed in that window hold.

Orphan generation directories
    Directories the shard manifest does not list whose newest file is older
    than ``orphan_grace_seconds``. A flush writes its directory before it
    publishes it in the manifest, so a young unlisted directory may be a
    flush in progress. Spark ingestion's staging directories
    (``_lsm_ingest/staging/``) count here too: an ingestion deletes its own
    when it ends, so one older than the grace was left by a crash.

Pending runs (``_lsm_runs/<shard>/``)
    A run covering generations ``f`` and later is used only above a base
    version whose marker is ``f - 1``. Once ``f`` is at or below the bound of
    rule 1, no reader can use it, and it is deleted. A run shorter than
    another stored run from the same ``f`` serves only readers that listed
    fewer generations: it goes once older than ``orphan_grace_seconds``, as
    do temporary files of interrupted writes.

Key hashes and key indexes of base fragments (``_lsm_key_hashes/``)
    A fragment's key files are named after its first data file. Lance
    deletes that file with the last retained version holding the fragment,
    and the key files go with it: no version a reader can pin holds the
    fragment any more. Temporary files of interrupted writes go once older
    than ``orphan_grace_seconds``.

Deletions go through ``pyarrow.fs`` (the table's :class:`TableStorage`), so
the same code runs against object stores. A crash midway leaves only
garbage that the next run collects.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import timedelta
from pathlib import PurePosixPath

import lance
import pyarrow.fs as pafs

from ..format.compaction_marker import read_compacted_generations, read_mem_wal_index_details, shard_generations
from ..format.layout import (
    DATA_DIR,
    KEY_HASHES_DIR,
    KEY_INDEX_DIR,
    STAGING_DIR,
    generation_dir,
    run_dir,
    wal_entry_path,
)
from ..format.shard_manifest import (
    decode_shard_manifest,
    list_generation_dirs,
    list_manifest_versions,
    list_wal_entries,
    manifest_path,
    read_shard_manifest,
)
from ..format.storage import TableStorage
from ..handle import TableHandle
from ..read.key_hash_files import hashed_data_file
from ..read.pending_run import covered_generations
from .compaction import settle_claims
from .policy import DEFAULT_GRACE_SECONDS, DEFAULT_VERSION_RETENTION

GenerationDirs = Sequence[tuple[int, str]]
"""``(generation, directory)`` pairs."""


# lance.table.MemWalIndexDetails.index_catchup and IndexCatchupProgress (protos/table.proto)
_DETAILS_INDEX_CATCHUP = 10
_CATCHUP_INDEX_NAME = 1
_CATCHUP_GENERATIONS = 2


@dataclass(frozen=True)
class Reclaimed:
    """How many things of one kind were deleted and the bytes they held."""

    count: int = 0
    bytes: int = 0

    def __add__(self, other: Reclaimed) -> Reclaimed:
        return Reclaimed(self.count + other.count, self.bytes + other.bytes)


@dataclass(frozen=True)
class GcResult:
    """What one :func:`collect_garbage` call deleted, per kind of garbage."""

    compacted_generations: Reclaimed
    wal_entries: Reclaimed
    orphan_directories: Reclaimed
    base_versions: Reclaimed
    pending_runs: Reclaimed
    key_hashes: Reclaimed
    elapsed_seconds: float

    @property
    def by_kind(self) -> dict[str, Reclaimed]:
        """What was deleted of each kind of garbage, by kind (the field names)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "elapsed_seconds"}

    @property
    def bytes_reclaimed(self) -> int:
        return sum(r.bytes for r in self.by_kind.values())


def collect_garbage(
    table: TableHandle,
    *,
    orphan_grace_seconds: float = DEFAULT_GRACE_SECONDS,
    wal_grace_seconds: float = DEFAULT_GRACE_SECONDS,
    retain_versions: int | None = None,
    older_than: timedelta | None = DEFAULT_VERSION_RETENTION,
) -> GcResult:
    """Delete what is compacted, consumed or orphaned (rules in the module docstring).

    Never changes the merged view, for readers in flight or to come (within
    the version-retention and grace windows). Safe to run concurrently with
    writers, flushes and merges, and to re-run after a crash.
    """
    started = time.monotonic()
    storage = table.storage
    wal_keep_seconds = max(wal_grace_seconds, older_than.total_seconds() if older_than is not None else 0.0)
    versions = _cleanup_base_versions(table, older_than, retain_versions)
    merged = _merged_in_every_retained_version(storage, table.dataset(), table.shard_ids)
    bounds = _collectable_generations(storage, table.dataset(), merged)
    now_ns = time.time_ns()
    generations = wal = orphans = runs = Reclaimed()
    for shard_id in table.shard_ids:
        # Manifest before listing: a generation published in between looks
        # like a young orphan, which the grace keeps.
        manifest = read_shard_manifest(storage, shard_id)
        listed = manifest.flushed_generations if manifest else ()
        present = list_generation_dirs(storage, shard_id)
        generations += _delete_compacted_generations(storage, shard_id, listed, present, bounds[shard_id])
        orphans += _delete_orphans(storage, shard_id, listed, present, now_ns - int(orphan_grace_seconds * 1e9))
        wal += _delete_consumed_wal(storage, shard_id, now_ns - int(wal_keep_seconds * 1e9))
        runs += _delete_retired_runs(storage, shard_id, merged[shard_id], now_ns - int(orphan_grace_seconds * 1e9))
    orphans += _delete_stale_staging(storage, now_ns - int(orphan_grace_seconds * 1e9))
    hashes = _delete_unused_key_hashes(storage, now_ns - int(orphan_grace_seconds * 1e9))
    return GcResult(generations, wal, orphans, versions, runs, hashes, time.monotonic() - started)


def _cleanup_base_versions(table: TableHandle, older_than: timedelta | None, retain_versions: int | None) -> Reclaimed:
    """Remove old base versions, once no merge claim lives in one of them.

    A claim is read from its data commit's transaction (see
    :mod:`~resources.lsm.format.merge_claims`): removing that version before
    the marker caught up would hide the claim and show its rows twice. So an
    outstanding claim is settled first, and if that fails every version stays.
    """
    dataset = table.dataset()
    try:
        settle_claims(table, dataset)  # a marker commit moves ``dataset`` to it
    except OSError:
        return Reclaimed()  # a concurrent merge is settling it: the next collection removes the versions
    # Tagged versions are kept (and keep their generations alive via rule 1).
    stats = dataset.cleanup_old_versions(
        older_than=older_than, retain_versions=retain_versions, error_if_tagged_old_versions=False
    )
    return Reclaimed(stats.old_versions, stats.bytes_removed)


def _merged_in_every_retained_version(
    storage: TableStorage, dataset: lance.LanceDataset, shard_ids: Sequence[str]
) -> dict[str, int]:
    """Per shard, the highest generation rule 1 allows deleting (the lowest marker of any retained version)."""
    markers = [m for m in (_markers_if_retained(storage, v["version"]) for v in dataset.versions()) if m is not None]
    return {s: min(m.get(s, 0) for m in markers) for s in shard_ids}


def _collectable_generations(
    storage: TableStorage, dataset: lance.LanceDataset, merged: dict[str, int]
) -> dict[str, int]:
    """Per shard, the highest generation that rules 1 (``merged``) and 2 allow deleting."""
    bounds = dict(merged)
    shard_ids = list(merged)
    maintained = _maintained_indexes(dataset)
    if maintained:
        caught_up = _index_catchup(storage, dataset.version)
        for s in shard_ids:
            bounds[s] = min(bounds[s], *(caught_up.get(i, {}).get(s, 0) for i in maintained))
    return bounds


def _markers_if_retained(storage: TableStorage, version: int) -> dict[str, int] | None:
    """The version's compacted markers, or ``None`` if a concurrent cleanup just removed it."""
    try:
        return read_compacted_generations(storage, version)
    except FileNotFoundError:
        return None


def _maintained_indexes(dataset: lance.LanceDataset) -> list[str]:
    """User indexes MemWAL keeps up to date: the listed ones, or all with ``maintain_all_indexes``."""
    existing = [d.name for d in dataset.describe_indices() if d.fields]
    details = dataset.mem_wal_index_details() or {}
    if details.get("maintain_all_indexes"):
        return existing
    return [name for name in details.get("maintained_indexes", []) if name in existing]


def _index_catchup(storage: TableStorage, version: int) -> dict[str, dict[str, int]]:
    """``{index name: {shard: caught-up generation}}`` from the base manifest at ``version``.

    pylance does not expose this record; it sits next to the compacted marker
    in ``MemWalIndexDetails`` (see :mod:`compaction_marker`).
    """
    details = read_mem_wal_index_details(storage, version)
    caught_up: dict[str, dict[str, int]] = {}
    for progress in details.messages(_DETAILS_INDEX_CATCHUP) if details else []:
        per_shard = caught_up.setdefault(progress.string(_CATCHUP_INDEX_NAME) or "", {})
        for shard_id, generation in shard_generations(progress.messages(_CATCHUP_GENERATIONS)).items():
            per_shard[shard_id] = max(per_shard.get(shard_id, 0), generation)
    return caught_up


def _delete_compacted_generations(
    storage: TableStorage, shard_id: str, listed: GenerationDirs, present: GenerationDirs, bound: int
) -> Reclaimed:
    """Delete the directories the manifest lists for generations <= ``bound``.

    The manifest keeps listing them afterwards (the writer owns it); readers
    never open a generation at or below their marker, so that is harmless.
    """
    doomed = {d for g, d in listed if g <= bound} & {d for _, d in present}
    return sum((delete_dir(storage, generation_dir(shard_id, d)) for d in sorted(doomed)), Reclaimed())


def _delete_consumed_wal(storage: TableStorage, shard_id: str, settled_before_ns: int) -> Reclaimed:
    bound = _settled_replay_position(storage, shard_id, settled_before_ns)
    reclaimed = Reclaimed()
    for entry in list_wal_entries(storage, shard_id):
        if entry.position <= bound:
            storage.delete_file(wal_entry_path(shard_id, entry.name))
            reclaimed += Reclaimed(1, entry.size)
    return reclaimed


def _settled_replay_position(storage: TableStorage, shard_id: str, settled_before_ns: int) -> int:
    """``replay_after_wal_position`` of the newest manifest version written before the cut-off (0 if none)."""
    settled = [
        version
        for version, f in list_manifest_versions(storage, shard_id).items()
        if f.mtime_ns is not None and f.mtime_ns <= settled_before_ns
    ]
    if not settled:
        return 0
    return decode_shard_manifest(storage.read_bytes(manifest_path(shard_id, max(settled)))).replay_after_wal_position


def _delete_orphans(
    storage: TableStorage, shard_id: str, listed: GenerationDirs, present: GenerationDirs, written_before_ns: int
) -> Reclaimed:
    """Delete unlisted generation directories last written before the cut-off."""
    listed_dirs = {d for _, d in listed}
    unlisted = [generation_dir(shard_id, d) for _, d in present if d not in listed_dirs]
    return _delete_dirs_written_before(storage, unlisted, written_before_ns)


def _delete_retired_runs(storage: TableStorage, shard_id: str, bound: int, written_before_ns: int) -> Reclaimed:
    """Delete the shard's pending runs no reader can use any more (rules in the module docstring)."""
    files = storage.list_files(run_dir(shard_id))
    longest: dict[int, int] = {}
    for f in files:
        if (span := covered_generations(f.name)) is not None:
            longest[span[0]] = max(longest.get(span[0], 0), span[1])
    reclaimed = Reclaimed()
    for f in files:
        span = covered_generations(f.name)
        settled = f.mtime_ns is not None and f.mtime_ns <= written_before_ns
        if (span is not None and span[0] <= bound) or (settled and (span is None or span[1] < longest[span[0]])):
            storage.delete_file(f"{run_dir(shard_id)}/{f.name}")
            reclaimed += Reclaimed(1, f.size)
    return reclaimed


def _delete_unused_key_hashes(storage: TableStorage, written_before_ns: int) -> Reclaimed:
    """Delete the key files (hashes, indexes) of fragments whose data file is gone (rules in the module docstring)."""
    data_files = {PurePosixPath(f.name).stem for f in storage.list_files(DATA_DIR)}
    reclaimed = Reclaimed()
    for directory, f in ((d, f) for d in (KEY_HASHES_DIR, KEY_INDEX_DIR) for f in storage.list_files(d)):
        settled = f.mtime_ns is not None and f.mtime_ns <= written_before_ns
        data_file = hashed_data_file(f.name)
        if (data_file is not None and data_file not in data_files) or (data_file is None and settled):
            storage.delete_file(f"{directory}/{f.name}")
            reclaimed += Reclaimed(1, f.size)
    return reclaimed


def _delete_stale_staging(storage: TableStorage, written_before_ns: int) -> Reclaimed:
    """Delete staging directories of ingestions that crashed (last written before the cut-off)."""
    runs = [f"{STAGING_DIR}/{entry.name}" for entry in storage.list_dir(STAGING_DIR)]
    return _delete_dirs_written_before(storage, runs, written_before_ns)


def _delete_dirs_written_before(storage: TableStorage, paths: list[str], written_before_ns: int) -> Reclaimed:
    """Delete each directory whose newest file (or itself, if empty) was written before the cut-off.

    A directory whose age cannot be told (a store without modification
    times) is kept.
    """
    reclaimed = Reclaimed()
    for path in paths:
        files = storage.files_below(path)
        mtimes = [storage.info(path).mtime_ns] + [f.mtime_ns for f in files]
        known = [m for m in mtimes if m is not None]
        if known and None not in mtimes[1:] and max(known) <= written_before_ns:
            reclaimed += delete_dir(storage, path, files)
    return reclaimed


def delete_dir(storage: TableStorage, relative: str, files: list[pafs.FileInfo] | None = None) -> Reclaimed:
    files = storage.files_below(relative) if files is None else files
    storage.delete_dir(relative)
    return Reclaimed(1, sum(f.size or 0 for f in files))
