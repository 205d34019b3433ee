"""WAL-replay recovery checks: can every shard be reopened, replayed and merged?

A new writer recovers a shard from three things: the shard manifest (which
generations exist, where replay starts), the generation directories it lists
and the WAL entries after the replay position. :func:`verify_shards` reads
all three the way replay does and reports what would make recovery lose or
misread data, as typed :class:`Finding` records:

``manifest``
    Manifest versions are contiguous (a prefix may be gone), each file holds
    the version its name says, and epoch, replay position and current
    generation never go backwards. The latest file is the one readers find.
``generations``
    Listed generations strictly increase and stay below the current
    generation; every generation above the compacted marker is listed
    (Lance's known bug: a failed flush of N followed by N+1 makes replay skip
    N), opens as a Lance dataset, has the manifest's ``physical_rows`` and the
    table's columns plus ``_tombstone``. Generations at or below the marker
    are in the base table and may already be collected, so they are not read.
``wal``
    Entries after the replay position are contiguous, readable Arrow IPC,
    written with an epoch no newer than the shard's, carry the table's
    columns plus ``_tombstone`` and no null primary key (Lance refuses null
    keys in the base and in generations; only a forged entry can hold one,
    and replay would fail on it).
``orphans``
    Generation directories the manifest does not list: a warning, never
    opened (they are leftovers of failed or fenced flushes).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

import pyarrow as pa

from ..format.schema import empty_tail
from ..format.shard_manifest import (
    ShardManifest,
    decode_shard_manifest,
    list_generation_dirs,
    list_manifest_versions,
    list_wal_entries,
    manifest_path,
    read_shard_manifest,
)
from ..format.storage import TableStorage
from ..format.wal import CorruptWalEntryError, read_wal_entry
from ..handle import TableHandle, added_columns
from ..read.generations import open_generation


class Severity(str, Enum):
    ERROR = "error"
    """Recovery would lose, skip or misread data."""
    WARNING = "warning"
    """Worth an operator's look; recovery is unaffected."""


@dataclass(frozen=True)
class Finding:
    """One problem found in one shard; ``check`` is the area named in the module docs."""

    shard_id: str
    check: str
    severity: Severity
    message: str


@dataclass(frozen=True)
class ShardRecovery:
    """What :func:`verify_shards` found for one shard.

    Attributes
    ----------
    manifest_versions
        Manifest version files read.
    generations_verified
        Generations above the compacted marker that opened with the expected rows.
    wal_entries_verified, wal_rows
        Readable WAL entries after the replay position, and the rows replay
        would apply from them (fence sentinels and fenced writers' entries excluded).
    orphan_directories
        Unlisted generation directories (reported, never read).
    """

    shard_id: str
    bucket: int
    manifest_versions: int
    compacted_generation: int
    generations_verified: int
    wal_entries_verified: int
    wal_rows: int
    orphan_directories: tuple[str, ...]
    findings: tuple[Finding, ...]

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity is Severity.ERROR)

    @property
    def passed(self) -> bool:
        """True when no finding is an error (orphan warnings do not fail a shard)."""
        return not self.errors


def verify_shards(table: TableHandle, buckets: Iterable[int] | None = None) -> list[ShardRecovery]:
    """Verify the recovery state of the given shards (default: all), in bucket order.

    Reads only; never opens a writer, so it neither claims nor fences a shard.
    """
    # Markers only: a shard's full state would read the WAL entries this check
    # must be able to report as unreadable.
    base = table.dataset()
    compacted = table.compacted_generations(base.version)
    expected = _Expected(
        [(f.name, f.type) for f in empty_tail(base.schema).schema], table.primary_key, added_columns(base.schema)
    )
    return [
        _verify_shard(table.storage, table.shard_ids[b], b, compacted.get(table.shard_ids[b], 0), expected)
        for b in (range(len(table.shard_ids)) if buckets is None else buckets)
    ]


@dataclass(frozen=True)
class _Expected:
    """What every generation and WAL entry must look like."""

    columns: list[tuple[str, pa.DataType]]
    primary_key: tuple[str, ...]
    added: frozenset[str] = frozenset()
    """Columns added to the live table: levels written before lack them (readers return null)."""

    def conforms(self, columns: list[tuple[str, pa.DataType]]) -> bool:
        """Whether a level with ``columns`` has the expected ones, in order (added columns may be missing)."""
        names = {name for name, _ in columns}
        return columns == [c for c in self.columns if c[0] in names or c[0] not in self.added]


class _Collector:
    """Accumulates one shard's findings."""

    def __init__(self, shard_id: str) -> None:
        self.shard_id = shard_id
        self.findings: list[Finding] = []

    def error(self, check: str, message: str) -> None:
        self.findings.append(Finding(self.shard_id, check, Severity.ERROR, message))

    def warning(self, check: str, message: str) -> None:
        self.findings.append(Finding(self.shard_id, check, Severity.WARNING, message))


def _verify_shard(
    storage: TableStorage, shard_id: str, bucket: int, compacted: int, expected: _Expected
) -> ShardRecovery:
    found = _Collector(shard_id)
    history = _manifest_history(storage, shard_id, found)
    latest = read_shard_manifest(storage, shard_id)
    if history and (latest is None or latest.version != history[-1].version):
        found.error(
            "manifest",
            f"readers find manifest version {latest.version if latest else 0} but version {history[-1].version} exists",
        )
    verified = _verify_generations(storage, shard_id, latest, compacted, expected, found) if latest else 0
    wal_entries, wal_rows = _verify_wal(storage, shard_id, latest, expected, found)
    listed = {path for _, path in (latest.flushed_generations if latest else ())}
    orphans = tuple(d for _, d in list_generation_dirs(storage, shard_id) if d not in listed)
    for directory in orphans:
        found.warning("orphans", f"generation directory {directory} is not in the manifest (never read)")
    return ShardRecovery(
        shard_id, bucket, len(history), compacted, verified, wal_entries, wal_rows, orphans, tuple(found.findings)
    )


def _manifest_history(storage: TableStorage, shard_id: str, found: _Collector) -> list[ShardManifest]:
    """Every manifest version on storage, ascending, with continuity findings."""
    versions = sorted(list_manifest_versions(storage, shard_id))
    missing = sorted(set(range(versions[0], versions[-1] + 1)) - set(versions)) if versions else []
    if missing:
        found.error("manifest", f"manifest versions {missing} are missing between {versions[0]} and {versions[-1]}")
    history = []
    for version in versions:
        manifest = decode_shard_manifest(storage.read_bytes(manifest_path(shard_id, version)))
        if manifest.version != version:
            found.error("manifest", f"manifest file for version {version} holds version {manifest.version}")
        history.append(manifest)
    for older, newer in itertools.pairwise(history):
        for name in ("writer_epoch", "replay_after_wal_position", "current_generation"):
            if getattr(newer, name) < getattr(older, name):
                found.error(
                    "manifest",
                    f"{name} goes back from {getattr(older, name)} (version {older.version}) "
                    f"to {getattr(newer, name)} (version {newer.version})",
                )
    return history


def _verify_generations(
    storage: TableStorage,
    shard_id: str,
    manifest: ShardManifest,
    compacted: int,
    expected: _Expected,
    found: _Collector,
) -> int:
    """Check the listed generations; return how many above the marker verified cleanly."""
    generations = [t.generation for t in manifest.sstables]
    if len(set(generations)) != len(generations) or (generations and generations[-1] >= manifest.current_generation):
        found.error(
            "generations",
            f"listed generations {generations} do not strictly increase below the "
            f"current generation {manifest.current_generation}",
        )
    unlisted = sorted(set(range(compacted + 1, manifest.current_generation)) - set(generations))
    if unlisted:
        found.error(
            "generations",
            f"generations {unlisted} above the compacted marker {compacted} are "
            "missing from the manifest (replay would skip them)",
        )
    verified = 0
    for sstable in manifest.sstables:
        if sstable.generation <= compacted:
            continue
        problem = _generation_problem(storage, shard_id, sstable.path, sstable.physical_rows, expected)
        if problem:
            found.error("generations", f"generation {sstable.generation} ({sstable.path}): {problem}")
        else:
            verified += 1
    return verified


def _generation_problem(
    storage: TableStorage, shard_id: str, path: str, physical_rows: int | None, expected: _Expected
) -> str | None:
    """Why one listed generation cannot be used as recorded, or ``None``."""
    try:
        dataset = open_generation(storage, shard_id, path)
        rows = sum(fragment.physical_rows for fragment in dataset.get_fragments())
    except (ValueError, OSError) as exc:
        return f"does not open: {exc}"
    if physical_rows is not None and rows != physical_rows:
        return f"holds {rows} physical rows, the manifest records {physical_rows}"
    columns = [(f.name, f.type) for f in dataset.schema]
    if not expected.conforms(columns):
        return f"has columns {_described(columns)}, expected {_described(expected.columns)}"
    return None


def _described(columns: list[tuple[str, pa.DataType]]) -> str:
    return "(" + ", ".join(f"{name} {data_type}" for name, data_type in columns) + ")"


def _verify_wal(
    storage: TableStorage, shard_id: str, manifest: ShardManifest | None, expected: _Expected, found: _Collector
) -> tuple[int, int]:
    """Check the entries replay would read; return (entries verified, rows replay would apply)."""
    replay_after = manifest.replay_after_wal_position if manifest else 0
    epoch = manifest.writer_epoch if manifest else 0
    entries = list_wal_entries(storage, shard_id, after=replay_after)
    gaps = [
        e.position
        for prev, e in zip([None, *entries], entries, strict=False)
        if e.position != (prev.position if prev else replay_after) + 1
    ]
    if gaps:
        found.error("wal", f"WAL entries {gaps} follow a missing position (replay starts after {replay_after})")
    verified = rows = fence_epoch = 0
    for entry in entries:
        try:
            metadata, batch = read_wal_entry(storage, shard_id, entry)
        except CorruptWalEntryError as exc:
            found.error("wal", str(exc))
            continue
        entry_epoch = int(metadata.get("writer_epoch", 0))
        verified += 1
        if entry_epoch > epoch:
            found.error("wal", f"WAL entry {entry.position} has epoch {entry_epoch}, newer than the shard's {epoch}")
        if metadata.get("fence_sentinel") == "true":
            fence_epoch = max(fence_epoch, entry_epoch)
            continue
        columns = [(f.name, f.type) for f in batch.schema]
        if batch.num_rows and not expected.conforms(columns):
            found.error(
                "wal",
                f"WAL entry {entry.position} has columns {_described(columns)}, "
                f"expected {_described(expected.columns)}",
            )
        null_keys = sum(batch[k].null_count for k in expected.primary_key if k in batch.column_names)
        if null_keys:
            found.error("wal", f"WAL entry {entry.position} holds {null_keys} null primary-key values")
        # Entries of a writer fenced by a sentinel were never acknowledged; replay skips them.
        rows += batch.num_rows if entry_epoch >= fence_epoch else 0
    return verified, rows
