"""Read the compacted-generation marker that merge-into-base commits.

``merge_insert(...).mark_sstables_as_compacted([...])`` records, in the same
commit as the data, which shard generations are now part of the base table.
pylance does not expose the record (``mem_wal_index_details()`` omits it), so
we decode it from the base table's manifest for the exact version a reader
uses. Readers must skip generations at or below the marker: ``LsmScanner``
would otherwise return values older than the base table's.

Manifest file layout (``_versions/*.manifest``)::

    ... | IndexSection (u32 length + protobuf) | ... | Manifest (u32 length + protobuf)
    | u64 manifest position | u16 major | u16 minor | b"LANC"

``Manifest.index_section`` holds the IndexSection's offset; its
``IndexMetadata`` named ``__lance_mem_wal`` carries a ``google.protobuf.Any``
of type ``/lance.table.MemWalIndexDetails``.
"""

from __future__ import annotations

import struct
import uuid

from . import protowire
from .layout import VERSIONS_DIR
from .storage import TableStorage

MEM_WAL_INDEX_NAME = "__lance_mem_wal"
_FOOTER = struct.Struct("<QHH4s")
_MAGIC = b"LANC"
_U64_MAX = 2**64 - 1

# lance.table.Manifest (protos/table.proto)
_MANIFEST_INDEX_SECTION = 6
# IndexSection / IndexMetadata (protos/table.proto)
_INDEX_SECTION_INDICES = 1
_INDEX_NAME = 3
_INDEX_DETAILS = 6
# google.protobuf.Any
_ANY_VALUE = 2
# lance.table.MemWalIndexDetails and its CompactedSsTable entries (protos/table.proto)
_DETAILS_COMPACTED = 9
_COMPACTED_SHARD_ID = 1
_COMPACTED_GENERATION = 2
_UUID_BYTES = 1


def read_compacted_generations(storage: TableStorage, version: int) -> dict[str, int]:
    """Highest generation merged into the base table, per shard, at ``version``.

    Shards that were never merged are absent (treat as generation 0).

    Raises
    ------
    FileNotFoundError
        If no manifest exists for ``version``.
    protowire.ProtobufDecodeError
        If the manifest is not a Lance manifest.
    """
    return compacted_generations_in(read_manifest(storage, version))


def compacted_generations_in(manifest: bytes) -> dict[str, int]:
    """:func:`read_compacted_generations` of a manifest already read (:func:`read_manifest`)."""
    details = _mem_wal_index_details(manifest)
    return shard_generations(details.messages(_DETAILS_COMPACTED)) if details else {}


def read_mem_wal_index_details(storage: TableStorage, version: int) -> protowire.Message | None:
    """The decoded ``MemWalIndexDetails`` of the base table at ``version`` (``None``: no MemWAL)."""
    return _mem_wal_index_details(read_manifest(storage, version))


def shard_generations(entries: list[protowire.Message]) -> dict[str, int]:
    """Highest generation per shard in a list of ``(UUID shard_id = 1, uint64 generation = 2)``
    entries, the shape of both ``CompactedSsTable`` and the index catch-up records."""
    generations: dict[str, int] = {}
    for entry in entries:
        shard_uuid = entry.message(_COMPACTED_SHARD_ID)
        raw = shard_uuid.bytes(_UUID_BYTES) if shard_uuid else None
        if raw is None or len(raw) != 16:
            raise protowire.ProtobufDecodeError("shard generation entry without a 16-byte shard UUID")
        shard_id = str(uuid.UUID(bytes=raw))
        generations[shard_id] = max(generations.get(shard_id, 0), entry.int(_COMPACTED_GENERATION))
    return generations


def read_manifest(storage: TableStorage, version: int) -> bytes:
    """The bytes of the base manifest of ``version`` (``FileNotFoundError`` if there is none)."""
    # Lance names manifests "{u64::MAX - version:020}.manifest" (V2 scheme) or
    # "{version}.manifest" (V1 scheme, older tables).
    for name in (f"{_U64_MAX - version:020d}.manifest", f"{version}.manifest"):
        try:
            return storage.read_bytes(f"{VERSIONS_DIR}/{name}")
        except FileNotFoundError:
            continue
    raise FileNotFoundError(f"no manifest for version {version} under {storage.path('_versions')}")


def _mem_wal_index_details(data: bytes) -> protowire.Message | None:
    manifest_pos, _, _, magic = _FOOTER.unpack(data[-_FOOTER.size :])
    if magic != _MAGIC:
        raise protowire.ProtobufDecodeError("not a Lance manifest (bad magic)")
    manifest = protowire.decode(_length_prefixed(data, manifest_pos))
    section_pos = manifest.optional_int(_MANIFEST_INDEX_SECTION)
    if section_pos is None:
        return None
    section = protowire.decode(_length_prefixed(data, section_pos))
    for index in section.messages(_INDEX_SECTION_INDICES):
        if index.string(_INDEX_NAME) == MEM_WAL_INDEX_NAME:
            details_any = index.message(_INDEX_DETAILS)
            value = details_any.bytes(_ANY_VALUE) if details_any else None
            return protowire.decode(value or b"")
    return None


def _length_prefixed(data: bytes, pos: int) -> bytes:
    (length,) = struct.unpack_from("<I", data, pos)
    return data[pos + 4 : pos + 4 + length]
