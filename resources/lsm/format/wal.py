"""WAL entry files: one Arrow IPC stream per entry.

Every WAL entry holds the table's columns plus ``_tombstone``; its schema
metadata names the ``writer_epoch``. A writer that claims a shard first
appends an empty *fence sentinel* entry with its epoch.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.ipc as ipc

from .layout import wal_entry_path
from .shard_manifest import WalEntryFile
from .storage import TableStorage


class CorruptWalEntryError(IOError):
    """A WAL entry file exists but is not a readable Arrow IPC stream."""


def read_wal_entry(storage: TableStorage, shard_id: str, entry: WalEntryFile) -> tuple[dict[str, str], pa.Table]:
    """Schema metadata and rows of one WAL entry.

    Raises
    ------
    CorruptWalEntryError
        If the file is truncated or not Arrow IPC.
    """
    path = wal_entry_path(shard_id, entry.name)
    data = storage.read_bytes(path)  # a store error is not corruption: it propagates as it is
    try:
        reader = ipc.open_stream(data)
        table = reader.read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise CorruptWalEntryError(
            f"WAL entry {storage.path(path)} (position {entry.position}) is unreadable: {exc}"
        ) from exc
    metadata = {k.decode(): v.decode() for k, v in (reader.schema.metadata or {}).items()}
    return metadata, table


# A fence sentinel is an Arrow IPC stream with an empty schema: a few hundred
# bytes. Any entry holding rows carries the table schema and is larger.
_SENTINEL_MAX_BYTES = 1024


def sentinel_epoch(storage: TableStorage, shard_id: str, entry: WalEntryFile) -> int | None:
    """The writer epoch of a fence sentinel entry, or ``None`` for an entry of changes (read only if small)."""
    if entry.size >= _SENTINEL_MAX_BYTES:
        return None
    metadata, _ = read_wal_entry(storage, shard_id, entry)
    return int(metadata.get("writer_epoch", 0)) if metadata.get("fence_sentinel") == "true" else None
