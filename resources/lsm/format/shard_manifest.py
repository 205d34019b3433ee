"""Read a shard's state from its MemWAL manifest and WAL directory.

Where the files are: :mod:`resources.lsm.format.layout` (Lance's MemWAL spec).
The version hint (``{"version": N}``) may lag behind the manifests. ``<bits>``
is the 64-bit number written in binary, least significant bit first. The
manifest is the only authority on which generations exist: a generation
directory it does not list is an orphan of a failed or fenced flush and must
never be read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache

import pyarrow.fs as pafs

from ..lru_cache import LruCache
from . import protowire
from .layout import manifest_dir, shard_dir, wal_dir, wal_entry_path
from .storage import FileEntry, TableStorage

# Field numbers of lance.table.ShardManifest (protos/table.proto).
_MANIFEST_VERSION = 1
_WRITER_EPOCH = 2
_REPLAY_AFTER_WAL_ENTRY_POSITION = 3
_WAL_ENTRY_POSITION_LAST_SEEN = 4
_CURRENT_GENERATION = 6
_SSTABLES = 8
# lance.table.SsTable: one flushed generation.
_SSTABLE_GENERATION = 1
_SSTABLE_PATH = 2
_SSTABLE_PHYSICAL_ROWS = 4

_GENERATION_DIR = re.compile(r"^[0-9a-f]+_gen_(\d+)$")
_WAL_ENTRY = re.compile(r"^([01]+)\.arrow$")


def position_name(position: int) -> str:
    """File stem for a manifest version or WAL position (bit-reversed binary)."""
    return format(position, "064b")[::-1]


def parse_position(stem: str) -> int:
    return int(stem[::-1], 2)


def manifest_path(shard_id: str, version: int) -> str:
    """The file of one shard manifest version."""
    return f"{manifest_dir(shard_id)}/{position_name(version)}.binpb"


@dataclass(frozen=True)
class SsTable:
    """One flushed generation as the manifest records it.

    ``physical_rows`` counts every row written, including older duplicates the
    generation hides behind a deletion vector; ``None`` if the writer left it out.
    """

    generation: int
    path: str
    physical_rows: int | None


@dataclass(frozen=True)
class ShardManifest:
    """The decoded fields of one ShardManifest version."""

    version: int
    writer_epoch: int
    replay_after_wal_position: int
    wal_position_last_seen: int
    current_generation: int
    flushed_generations: tuple[tuple[int, str], ...]
    sstables: tuple[SsTable, ...] = ()


@dataclass(frozen=True)
class WalEntryFile:
    position: int
    name: str
    size: int
    mtime_ns: int | None


class KnownShardFiles:
    """The shard manifests and WAL entry files one table handle has read, so that reading them again costs less.

    A manifest version's file never changes once written, and versions only
    grow: the latest version found is where the next search starts (instead
    of the version hint), and a version read once is not read again. WAL
    entries never change once written either, and their positions have no
    gaps: once a shard's entries above a position were listed, only the
    positions after the newest are looked for (a local listing reads every
    name of the directory, hundreds beside a busy writer until GC, on every
    fresh read). Kept per handle, not per process: a table re-created at the
    same location starts its versions and positions over.
    """

    def __init__(self) -> None:
        self._latest: dict[str, int] = {}
        self._manifests: LruCache[tuple[str, int], ShardManifest] = LruCache(_KNOWN_MANIFESTS)
        self._wal_tails: dict[str, tuple[int, list[WalEntryFile]]] = {}
        """Each shard's WAL entries above a position, as last found: that position, and the entries."""

    def latest(self, shard_id: str) -> int | None:
        """The newest version of the shard's manifest seen so far (0: none yet; ``None``: never looked)."""
        return self._latest.get(shard_id)

    def saw(self, shard_id: str, version: int) -> None:
        self._latest[shard_id] = max(version, self._latest.get(shard_id, 0))

    def manifest(self, shard_id: str, version: int, read: Callable[[], ShardManifest]) -> ShardManifest:
        return self._manifests.get((shard_id, version), read)

    def wal_entries(self, shard_id: str, after: int) -> list[WalEntryFile] | None:
        """The shard's WAL entries above ``after`` seen last time (ascending); ``None`` unless they were
        listed (every entry above a position at most ``after``)."""
        seen = self._wal_tails.get(shard_id)
        if seen is None or after < seen[0]:
            return None
        return [entry for entry in seen[1] if entry.position > after]

    def saw_wal_entries(self, shard_id: str, after: int, entries: list[WalEntryFile]) -> None:
        """Remember ``entries`` (ascending): every WAL entry of the shard above ``after``, as found now."""
        self._wal_tails[shard_id] = (after, entries)


_KNOWN_MANIFESTS = 64
"""Manifest versions a handle keeps decoded: a few per shard."""
_PROBES_BEFORE_LISTING = 4
"""New WAL entries looked for one by one (a stat each) before listing the directory costs less."""


def read_shard_manifest(
    storage: TableStorage, shard_id: str, version: int | None = None, known: KnownShardFiles | None = None
) -> ShardManifest | None:
    """A shard's manifest at ``version`` (default: the latest), or ``None`` at version 0 (never written).

    The version hint may lag behind (it is written after the manifest), so the
    latest is found by probing forward from it until a version is missing;
    with ``known``, from the latest version it saw instead (one probe when
    nothing changed), and a version it read is not read again.
    """
    if version is None:
        seen = known.latest(shard_id) if known else None
        version = _hinted_version(storage, shard_id) if seen is None else seen
        while storage.exists(manifest_path(shard_id, version + 1)):
            version += 1
        if known is not None:
            known.saw(shard_id, version)
    if version == 0:
        return None
    path = manifest_path(shard_id, version)
    if known is None:
        return decode_shard_manifest(storage.read_bytes(path))
    return known.manifest(shard_id, version, lambda: decode_shard_manifest(storage.read_bytes(path)))


@lru_cache(maxsize=1024)
def decode_shard_manifest(data: bytes) -> ShardManifest:
    """Decode a manifest file (cached by content: every read of a busy shard decodes the same bytes)."""
    message = protowire.decode(data)
    sstables = tuple(
        sorted(
            (
                SsTable(
                    g.int(_SSTABLE_GENERATION), g.string(_SSTABLE_PATH) or "", g.optional_int(_SSTABLE_PHYSICAL_ROWS)
                )
                for g in message.messages(_SSTABLES)
            ),
            key=lambda t: t.generation,
        )
    )
    return ShardManifest(
        version=message.int(_MANIFEST_VERSION),
        writer_epoch=message.int(_WRITER_EPOCH),
        replay_after_wal_position=message.int(_REPLAY_AFTER_WAL_ENTRY_POSITION),
        wal_position_last_seen=message.int(_WAL_ENTRY_POSITION_LAST_SEEN),
        current_generation=message.int(_CURRENT_GENERATION),
        flushed_generations=tuple((t.generation, t.path) for t in sstables),
        sstables=sstables,
    )


def list_manifest_versions(storage: TableStorage, shard_id: str) -> dict[int, FileEntry]:
    """Every manifest version file on storage, by version."""
    return {
        parse_position(f.name[: -len(".binpb")]): f
        for f in storage.list_dir(manifest_dir(shard_id))
        if f.name.endswith(".binpb")
    }


def list_wal_entries(
    storage: TableStorage, shard_id: str, after: int = -1, known: KnownShardFiles | None = None
) -> list[WalEntryFile]:
    """The WAL entry files of a shard above position ``after`` (default: all), in ascending position.

    Entries at or below a shard's replay position stay until GC removes them:
    pass it as ``after`` and they cost only their names. With ``known`` (the
    handle's), a shard whose entries above ``after`` were listed before is not
    listed again: positions have no gaps, so the next positions are looked
    for one by one until one is missing (one stat when nothing was written
    since), the directory listed again only when many are new.
    """
    seen = known.wal_entries(shard_id, after) if known is not None else None
    newer = None if seen is None else _next_wal_entries(storage, shard_id, seen[-1].position if seen else after)
    entries = _listed_wal_entries(storage, shard_id, after) if seen is None or newer is None else seen + newer
    if known is not None:
        known.saw_wal_entries(shard_id, after, entries)
    return entries


def _listed_wal_entries(storage: TableStorage, shard_id: str, after: int) -> list[WalEntryFile]:
    files = storage.list_files_named(wal_dir(shard_id), lambda name: _wal_position(name) > after)
    entries = [WalEntryFile(_wal_position(f.name), f.name, f.size, f.mtime_ns) for f in files]
    return sorted(entries, key=lambda e: e.position)


def _next_wal_entries(storage: TableStorage, shard_id: str, newest: int) -> list[WalEntryFile] | None:
    """The WAL entries after position ``newest``, found one stat each; ``None`` if there are many (list them)."""
    found: list[WalEntryFile] = []
    while len(found) < _PROBES_BEFORE_LISTING:
        position = newest + 1 + len(found)
        name = f"{position_name(position)}.arrow"
        info = storage.info(wal_entry_path(shard_id, name))
        if info.type != pafs.FileType.File:
            return found
        found.append(WalEntryFile(position, name, info.size or 0, info.mtime_ns))
    return None


def wal_entries_complete(listed: Iterable[WalEntryFile], after: int, up_to: int) -> bool:
    """Whether ``listed`` (a listing of a shard's WAL entries) holds every position after ``after`` up to ``up_to``.

    Positions are numbered without gaps, so a count of the listed entries tells.
    """
    return sum(1 for e in listed if after < e.position <= up_to) >= up_to - after


@lru_cache(maxsize=1 << 14)
def _wal_position(name: str) -> int:
    """The position a WAL file name holds; -1 for any other file (a stray file never breaks a read).

    Cached: a busy shard's WAL directory holds hundreds of names until GC,
    listed again by every handle that reads it, and they cost 10x more to
    parse than to look up.
    """
    match = _WAL_ENTRY.match(name)
    return parse_position(match.group(1)) if match else -1


def list_generation_dirs(storage: TableStorage, shard_id: str) -> list[tuple[int, str]]:
    """Every ``*_gen_N`` directory present on storage, listed or not."""
    found = []
    for f in storage.list_dir(shard_dir(shard_id)):
        match = _GENERATION_DIR.match(f.name)
        if match:
            found.append((int(match.group(1)), f.name))
    return sorted(found)


def _hinted_version(storage: TableStorage, shard_id: str) -> int:
    try:
        return int(json.loads(storage.read_bytes(f"{manifest_dir(shard_id)}/version_hint.json"))["version"])
    except (FileNotFoundError, KeyError, ValueError):
        return 0
