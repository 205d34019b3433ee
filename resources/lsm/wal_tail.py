"""Read a shard's WAL tail: rows durable in the WAL but not yet flushed.

Every WAL entry is an Arrow IPC stream holding the table's columns plus
``_tombstone``; its schema metadata names the ``writer_epoch``. A writer that
claims a shard first appends an empty *fence sentinel* entry with its epoch;
entries from an older epoch that follow a sentinel come from a fenced writer
and were never acknowledged, so they are skipped (as replay does).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.ipc as ipc

from .dedup import keep_last_per_key
from .schema import empty_tail
from .shard_manifest import WalEntryFile, list_wal_entries, shard_dir
from .storage import TableStorage


class CorruptWalEntryError(IOError):
    """A WAL entry file exists but is not a readable Arrow IPC stream."""


def read_wal_entry(storage: TableStorage, shard_id: str, entry: WalEntryFile) -> tuple[dict, pa.Table]:
    """Schema metadata and rows of one WAL entry.

    Raises
    ------
    CorruptWalEntryError
        If the file is truncated or not Arrow IPC.
    """
    path = f"{shard_dir(shard_id)}/wal/{entry.name}"
    try:
        reader = ipc.open_stream(storage.read_bytes(path))
        table = reader.read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise CorruptWalEntryError(f"WAL entry {storage.path(path)} (position {entry.position}) "
                                   f"is unreadable: {exc}") from exc
    metadata = {k.decode(): v.decode() for k, v in (reader.schema.metadata or {}).items()}
    return metadata, table


def read_wal_tail(storage: TableStorage, shard_id: str, after_position: int,
                  schema: pa.Schema, primary_key: list[str], up_to_position: int | None = None) -> pa.Table:
    """The newest change per key among WAL entries after ``after_position``.

    Returns the table's columns plus ``_tombstone`` (True = deleted), one row
    per key, or an empty table when the tail is empty. ``up_to_position``
    (inclusive) pins the tail to the entries a reader planned with, so
    parallel readers of one snapshot see the same tail.
    """
    tail_schema = empty_tail(schema).schema
    fence_epoch = 0
    parts = []
    for entry in list_wal_entries(storage, shard_id):
        if entry.position <= after_position or (up_to_position is not None and entry.position > up_to_position):
            continue
        metadata, rows = read_wal_entry(storage, shard_id, entry)
        epoch = int(metadata.get("writer_epoch", 0))
        if metadata.get("fence_sentinel") == "true":
            fence_epoch = max(fence_epoch, epoch)
            continue
        if epoch < fence_epoch or rows.num_rows == 0:
            continue
        parts.append(rows.select(tail_schema.names).cast(tail_schema))
    if not parts:
        return empty_tail(schema)
    return keep_last_per_key(pa.concat_tables(parts), primary_key)
