"""The 64-bit key hash of every base row, stored once per base fragment.

A merged scan drops the base rows whose key has a pending change. Arrow's
hash join tests each base row's key as the scan reads it, but cannot carry
nested columns (vectors, lists); a scan of such a table finds the rows ahead
of the scan instead. With each row's key hash stored, it finds them from the
hashes alone (8-byte words; no key column read), and compares the keys of
those rows only as the scan reads them
(:mod:`~resources.lsm.read.stored_hash_rows`; 16Mi rows with a 32-d vector,
16 pending generations: 1.35 s against 1.71 s reading the key columns).

A fragment's rows never change: Lance records deletions in separate files
and a rewrite writes new fragments. So a fragment's hashes are written once,
named by its id and its first data file (unique to the fragment, a table
created again at the same location included), and hold one hash per
physical row in order, deleted rows too, so a read of an earlier version
finds the rows that were live then. Hashes are
:func:`~resources.lsm.read.key_hashes.key_hashes`, which must never change
for files of this layout (``KEY_HASHES_DIR`` names its version).

The same hashes, sorted, with each row's offset, are the fragment's *key
index* (``KEY_INDEX_DIR``, 12 bytes a row): point lookups find a key's base
rows through it instead of Lance's query planner
(:mod:`~resources.lsm.read.base_key_index`). Both kinds of file are named
and kept alike (:func:`key_hash_file` with the kind's directory).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import PurePosixPath

import lance
import numpy as np
import pyarrow as pa
from lance.fragment import FragmentMetadata

from ..format.layout import KEY_HASHES_DIR, KEY_INDEX_DIR
from ..format.storage import TableStorage
from .key_hashes import key_hashes
from .key_sets import joinable

log = logging.getLogger(__name__)

_SUFFIXES = {KEY_HASHES_DIR: ".u64", KEY_INDEX_DIR: ".idx"}
"""Each kind of key file by its directory, and the suffix of its files."""


def key_hash_file(fragment: lance.LanceFragment, directory: str = KEY_HASHES_DIR) -> str:
    """Where ``fragment``'s key file of a kind (``directory``: per-row hashes or key index) is, from the table root."""
    first_file = PurePosixPath(fragment.data_files()[0].path).stem
    return f"{directory}/{fragment.fragment_id}-{first_file}{_SUFFIXES[directory]}"


def hashed_data_file(name: str) -> str | None:
    """The data file (without its suffix) whose fragment a key file's name is for (``None``: not one)."""
    suffix = PurePosixPath(name).suffix
    fragment_id, _, data_file = name.removesuffix(suffix).partition("-")
    return data_file if suffix in _SUFFIXES.values() and fragment_id.isdigit() and data_file else None


def stored_key_hash_files(storage: TableStorage, directory: str = KEY_HASHES_DIR) -> set[str]:
    """The key files of a kind (``directory``) the table holds (paths relative to the table root)."""
    return {f"{directory}/{entry.name}" for entry in storage.list_files(directory)}


def key_files(storage: TableStorage, dataset: lance.LanceDataset) -> tuple[str, ...]:
    """The kinds of key file (directories) the base's fragments get: each kind where some read uses it.

    Lookups take the key index on local storage (memory-mapped); scans of a
    table with a nested column, which cannot join keys, take the per-row hashes.
    """
    kinds = (KEY_INDEX_DIR,) if storage.is_local else ()
    return kinds if joinable(dataset.schema) else (*kinds, KEY_HASHES_DIR)


def write_missing_key_hashes(
    storage: TableStorage,
    dataset: lance.LanceDataset,
    primary_key: list[str],
    directories: tuple[str, ...] = (KEY_HASHES_DIR,),
) -> int:
    """Store the key files of each kind (``directories``) every fragment of ``dataset`` lacks; return how many.

    Costs a read of those fragments' key columns, once for all kinds (64Mi
    string keys, all fragments: about 6 s; sorting them for the key index
    about as much again), so after the first call it follows what merges and
    rewrites added. Each file is written atomically.
    """
    stored = set().union(*(stored_key_hash_files(storage, directory) for directory in directories))
    written = 0
    for fragment in dataset.get_fragments():
        missing = tuple(d for d in directories if key_hash_file(fragment, d) not in stored)
        hashes = computed_key_hashes(dataset, fragment, primary_key) if missing else None
        if hashes is not None:
            written += _write_key_files(storage, fragment, hashes, missing)
    return written


def write_key_hashes_of_written(
    storage: TableStorage,
    committed: lance.LanceDataset,
    written: Sequence[FragmentMetadata],
    rows: pa.Table,
    primary_key: list[str],
) -> int:
    """Store the key files of fragments just written from ``rows`` (in order), as ``committed`` numbered them.

    ``written`` are the fragments ``write_fragments`` made of ``rows``, whose
    rows they hold in that order; ``committed`` is a version that holds them.
    The hashes come from ``rows``, so no key column is read back: a merge
    that wrote them stores their key files at once, and reads of the new
    version find its rows through the key index
    (:mod:`~resources.lsm.read.base_key_index`) instead of Lance's query until
    the next build of pending runs read the keys back. Returns the files
    written (the kinds :func:`key_files` names).
    """
    directories = key_files(storage, committed)
    if not directories or not written:
        return 0
    by_first_file = {f.data_files()[0].path: f for f in committed.get_fragments()}
    stored_as = pa.schema([committed.schema.field(name) for name in primary_key])
    hashes = key_hashes(rows.select(primary_key).cast(stored_as), primary_key)
    files, start = 0, 0
    for metadata in written:
        end = start + metadata.physical_rows
        fragment = by_first_file.get(metadata.files[0].path)
        if fragment is not None:  # absent only from a version that does not hold it: nothing reads it there
            files += _write_key_files(storage, fragment, hashes[start:end], directories)
        start = end
    return files


def _write_key_files(
    storage: TableStorage, fragment: lance.LanceFragment, hashes: np.ndarray, directories: tuple[str, ...]
) -> int:
    """Store ``fragment``'s key files of each kind from ``hashes`` (one per physical row, in order), atomically."""
    for directory in directories:
        storage.write_bytes_atomic(key_hash_file(fragment, directory), _ENCODINGS[directory](hashes))
    return len(directories)


def _row_hashes(hashes: np.ndarray) -> bytes:
    return hashes.astype("<u8", copy=False).tobytes()


def _key_index(hashes: np.ndarray) -> bytes:
    """The hashes in ascending order, then each one's row offset (``<u8`` then ``<u4`` words)."""
    order = np.argsort(hashes, kind="stable")
    return hashes[order].astype("<u8", copy=False).tobytes() + order.astype("<u4").tobytes()


_ENCODINGS = {KEY_HASHES_DIR: _row_hashes, KEY_INDEX_DIR: _key_index}


def computed_key_hashes(
    dataset: lance.LanceDataset, fragment: lance.LanceFragment, primary_key: list[str]
) -> np.ndarray | None:
    """The key hash of each physical row of ``fragment``, deleted rows included, from its key columns."""
    keys = dataset.scanner(
        columns=primary_key, fragments=[fragment], include_deleted_rows=True, with_row_id=True, scan_in_order=True
    ).to_table()
    if keys.num_rows != fragment.physical_rows:  # never seen: the scan would not be every physical row
        log.warning("fragment %d: %d rows read of %d", fragment.fragment_id, keys.num_rows, fragment.physical_rows)
        return None
    return key_hashes(keys, primary_key)


def read_key_hashes(storage: TableStorage, fragment: lance.LanceFragment) -> np.ndarray | None:
    """``fragment``'s stored key hashes, one per physical row (``None`` if none are stored, or not all)."""
    path = key_hash_file(fragment)
    try:
        data = storage.read_buffer(path)
    except FileNotFoundError:
        return None
    if data.size != 8 * fragment.physical_rows:
        log.warning("%s holds %d bytes for %d rows; not used", path, data.size, fragment.physical_rows)
        return None
    hashes: np.ndarray = np.frombuffer(data, dtype="<u8")
    return hashes
