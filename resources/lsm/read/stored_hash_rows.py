"""The base rows holding pending keys, found ahead of a scan through the fragments' stored key hashes.

Per-row hashes joined with the keys', or key indexes searched for them. The
scan then compares the keys of those rows only: two keys may share a hash,
so a row is dropped when its key is one of the pending keys, never for its
hash alone (:mod:`~resources.lsm.read.key_hash_files` stores the hashes).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial

import lance
import numpy as np
import pyarrow as pa
import pyarrow.acero as acero

from ..format.schema import ROW_ADDRESS
from ..format.storage import TableStorage
from .base_key_index import BaseKeyIndex
from .deletion_vector import RowsFoundAhead, consecutive_groups
from .key_hash_files import computed_key_hashes, key_hash_file, read_key_hashes, stored_key_hash_files
from .key_hashes import key_hashes
from .key_sets import same_keys
from .level_readers import level_readers

log = logging.getLogger(__name__)

_HASH, _PENDING = "__lsm_key_hash", "__lsm_pending_row"
_GROUPS = 4
"""Joins a scan's lookup makes, each over a quarter of its fragments in scan order: the first batches wait for
a quarter of the lookup (each join builds the keys' hash table again)."""


@dataclass(frozen=True)
class _Pairs:
    """A group's rows whose stored hash is a pending key's: ascending addresses, and that key's row for each
    (an address twice when two pending keys share its hash)."""

    addresses: np.ndarray
    pending_rows: np.ndarray


_Finder = Callable[[np.ndarray], Callable[[list[lance.LanceFragment]], _Pairs]]
"""Given the keys' hashes, once: what pairs a group of fragments' rows with the keys of the same hash."""


class StoredHashRows(RowsFoundAhead):
    """The base rows of ``fragments`` whose key is one of ``keys``, for a scan that drops them.

    On a level reader's thread, group of consecutive fragments by group, in
    scan order, every row holding a key, and rarely a row whose other key
    shares a hash, is paired with that key: through the fragments' stored
    per-row hashes, streamed through one hash join with the keys' hashes
    (:meth:`of`: 8-byte words, no key column read), or by searching their
    key indexes (:meth:`indexed`). :meth:`keep_mask` compares each pair's
    keys in the batch the scan read, and drops a row only for an equal key.
    """

    @classmethod
    def of(
        cls,
        storage: TableStorage,
        dataset: lance.LanceDataset,
        keys: pa.Table,
        primary_key: list[str],
        fragments: list[lance.LanceFragment] | None = None,
    ) -> StoredHashRows | None:
        """The rows of ``keys`` in ``fragments`` (default: all of ``dataset``'s), if every one has stored hashes."""
        fragments = dataset.get_fragments() if fragments is None else fragments
        stored = stored_key_hash_files(storage)
        if not fragments or any(key_hash_file(fragment) not in stored for fragment in fragments):
            return None
        return cls(keys, primary_key, fragments, partial(_HashJoin, storage, dataset, primary_key))

    @classmethod
    def indexed(
        cls, index: BaseKeyIndex, keys: pa.Table, primary_key: list[str], fragments: list[lance.LanceFragment]
    ) -> StoredHashRows:
        """The rows of ``keys`` in ``fragments``, found through ``index`` (the key index of their base version)."""

        def searched(hashes: np.ndarray) -> Callable[[list[lance.LanceFragment]], _Pairs]:
            search = index.search(hashes)
            return lambda group: _Pairs(*search.pairs({fragment.fragment_id for fragment in group}))

        return cls(keys, primary_key, fragments, searched)

    def __init__(
        self,
        keys: pa.Table,
        primary_key: list[str],
        fragments: list[lance.LanceFragment],
        finder: _Finder,
    ) -> None:
        """``finder(hashes)`` prepares, once, what pairs the rows of each group of ``fragments`` with the
        ``keys`` of the same hash (``hashes`` are the keys')."""
        groups = consecutive_groups(fragments, _GROUPS)
        super().__init__(groups)
        self._keys = keys.select(primary_key).combine_chunks()
        self._found: list[Future[_Pairs]] = [Future() for _ in groups]
        level_readers().submit(self._look_up, groups, finder)

    def _look_up(self, groups: list[list[lance.LanceFragment]], finder: _Finder) -> None:
        """Each group in turn, in scan order (the scan raises a failure when it needs the group)."""
        try:
            pairs_in = finder(key_hashes(self._keys, self._keys.column_names))
        except BaseException as exc:
            for found in self._found:
                found.set_exception(exc)
            return
        for group, found in zip(groups, self._found, strict=True):
            try:
                found.set_result(pairs_in(group))
            except BaseException as exc:
                found.set_exception(exc)

    def keep_mask(self, addresses: np.ndarray, batch: pa.RecordBatch, live: np.ndarray | None) -> np.ndarray:
        """For each of ``batch``'s rows at positions ``live`` (``None``: every row), at ``addresses``, whether its
        key is none of the keys: only the keys of the rows paired with one are taken from ``batch``."""
        keep = np.ones(len(addresses), dtype=bool)
        if not len(addresses):
            return keep
        order = None if bool((addresses[1:] >= addresses[:-1]).all()) else np.argsort(addresses, kind="stable")
        ascending = addresses if order is None else addresses[order]
        for group in self._groups_of(addresses):
            found = self._found[group].result()
            first = np.searchsorted(found.addresses, ascending[0])
            last = np.searchsorted(found.addresses, ascending[-1], side="right")
            inside, pending = found.addresses[first:last], found.pending_rows[first:last]
            at = np.minimum(np.searchsorted(ascending, inside), len(ascending) - 1)
            read = ascending[at] == inside  # a row the scan skipped (deleted, filtered out) is not in the batch
            rows = at[read] if order is None else order[at[read]]
            # Each row holds the pending key paired with it, or only that key's hash.
            key = self._keys.column_names
            in_batch = pa.array(rows if live is None else live[rows])
            equal = same_keys(batch.select(key).take(in_batch), self._keys.take(pa.array(pending[read])), key)
            keep[rows[equal]] = False
        return keep


class _HashJoin:
    """The rows of fragments whose stored hash is one of ``hashes``, each with the position of its hash."""

    def __init__(
        self, storage: TableStorage, dataset: lance.LanceDataset, primary_key: list[str], hashes: np.ndarray
    ) -> None:
        self._storage, self._dataset, self._primary_key = storage, dataset, primary_key
        self._wanted = pa.table({_HASH: hashes, _PENDING: np.arange(len(hashes), dtype=np.int64)})

    def __call__(self, fragments: list[lance.LanceFragment]) -> _Pairs:
        pairs = _rows_hashed_like(self._storage, self._dataset, fragments, self._wanted, self._primary_key)
        addresses = pairs.column(ROW_ADDRESS).to_numpy()
        order = np.argsort(addresses, kind="stable")
        return _Pairs(addresses[order], pairs.column(_PENDING).to_numpy()[order])


def _rows_hashed_like(
    storage: TableStorage,
    dataset: lance.LanceDataset,
    fragments: list[lance.LanceFragment],
    wanted: pa.Table,
    primary_key: list[str],
) -> pa.Table:
    """Each row of ``fragments`` whose stored key hash is in ``wanted``: its address, and ``wanted``'s row.

    The fragments' hashes stream through one join, a fragment at a time.
    """
    schema = pa.schema([(_HASH, pa.uint64()), (ROW_ADDRESS, pa.uint64())])

    def fragment_rows() -> Iterator[pa.RecordBatch]:
        for fragment in fragments:
            hashes = read_key_hashes(storage, fragment)
            if hashes is None:  # gone or damaged since the scan found it: hash the key columns instead
                log.warning("the key hashes of fragment %d are not readable; hashing its keys", fragment.fragment_id)
                hashes = computed_key_hashes(dataset, fragment, primary_key)
            if hashes is None:
                raise RuntimeError(f"the rows of base fragment {fragment.fragment_id} could not all be read")
            offsets = np.arange(len(hashes), dtype=np.uint64)
            addresses = (np.uint64(fragment.fragment_id) << np.uint64(32)) | offsets
            yield pa.record_batch([pa.array(hashes), pa.array(addresses)], schema=schema)

    source = acero.Declaration(
        "record_batch_reader_source",
        acero.RecordBatchReaderSourceNodeOptions(pa.RecordBatchReader.from_batches(schema, fragment_rows())),
    )
    options = acero.HashJoinNodeOptions(
        "inner", left_keys=[_HASH], right_keys=[_HASH], left_output=[ROW_ADDRESS], right_output=[_PENDING]
    )
    return acero.Declaration(
        "hashjoin", options, inputs=[source, acero.Declaration("table_source", acero.TableSourceNodeOptions(wanted))]
    ).to_table()
