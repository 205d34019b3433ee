"""Where rewrites of the base (``compact_files``) moved rows: their addresses in the fragments they wrote.

Lance's compaction reads each group of fragments in order, skipping deleted
rows, and writes the live rows in that order into the group's new
fragments. So the i-th live row of a group's old fragments is the i-th row
of its new ones, and a row a pending run found can be followed to its new
address from the rewrite's transaction alone (the group's old fragments, as
of the version it read, and the row counts of the new ones): no key is
looked up, and the cost follows the rows followed, not the base.
"""

from __future__ import annotations

from dataclasses import dataclass

import lance
import numpy as np
import pyarrow as pa
from lance.dataset import LanceOperation

from ..format.schema import ROW_ADDRESS

TRANSACTIONS_SEARCHED = 64
"""Base versions, newest first, searched for the rewrites that moved rows (a run is rebuilt within minutes;
merges and index updates commit a few versions a minute)."""

_OFFSET_BITS = np.uint64(32)


@dataclass(frozen=True, eq=False)  # identity: each group is read from its transaction once
class _RewriteGroup:
    """Fragments one rewrite replaced, in the order it read them, and those it wrote."""

    read_version: int
    old_fragment_ids: np.ndarray
    old_live_rows: list[int | None]
    """Each old fragment's rows the rewrite read (``None``: its deletion file did not say)."""
    new_fragment_ids: np.ndarray
    new_fragment_ends: np.ndarray
    """Cumulative rows of the new fragments: the group's row ``i`` is in the first one whose end exceeds ``i``."""


def follow_moved_rows(dataset: lance.LanceDataset, addresses: np.ndarray) -> pa.Array:
    """The address in ``dataset`` of each row at ``addresses`` (``uint64``, of earlier base versions).

    A row in a fragment ``dataset`` still holds keeps its address; one in a
    fragment a rewrite replaced is followed to where that rewrite (and any
    later one) put it. Null where a row cannot be followed: it was deleted
    before the rewrite read it, the rewrite is older than the versions
    searched (:data:`TRANSACTIONS_SEARCHED`) or its old version is gone, or
    the base has stable row ids (addresses are then not what runs hold).
    """
    present = np.fromiter((f.fragment_id for f in dataset.get_fragments()), dtype=np.uint64)
    followed = addresses.astype(np.uint64, copy=True)
    lost = np.zeros(len(followed), dtype=bool)
    groups: dict[int, _RewriteGroup] | None = None
    for _ in range(TRANSACTIONS_SEARCHED):  # each pass follows the rows one rewrite further
        fragment_of = followed >> _OFFSET_BITS
        moved = ~lost & ~np.isin(fragment_of, present)
        if not moved.any():
            break
        if groups is None:
            groups = {} if dataset.has_stable_row_ids else _rewrite_groups(dataset)
        before = followed.copy()
        replaced_by = {groups[f] for f in map(int, np.unique(fragment_of[moved])) if f in groups}
        for group in replaced_by:
            rows = np.flatnonzero(moved & np.isin(fragment_of, group.old_fragment_ids))
            new, found = _in_new_fragments(dataset, group, followed[rows])
            followed[rows[found]] = new[found]
            lost[rows[~found]] = True
        lost |= moved & (followed == before)  # no rewrite searched replaced their fragment
    return pa.array(followed, pa.uint64(), mask=lost)


def _rewrite_groups(dataset: lance.LanceDataset) -> dict[int, _RewriteGroup]:
    """The rewrite group that replaced each fragment id, over the latest :data:`TRANSACTIONS_SEARCHED` versions."""
    groups: dict[int, _RewriteGroup] = {}
    for transaction in dataset.get_transactions(TRANSACTIONS_SEARCHED):
        if transaction is None or not isinstance(transaction.operation, LanceOperation.Rewrite):
            continue
        for replaced in transaction.operation.groups:
            group = _RewriteGroup(
                read_version=transaction.read_version,
                old_fragment_ids=np.array([f.id for f in replaced.old_fragments], dtype=np.uint64),
                old_live_rows=[_live_rows(f) for f in replaced.old_fragments],
                new_fragment_ids=np.array([f.id for f in replaced.new_fragments], dtype=np.uint64),
                new_fragment_ends=np.cumsum([f.physical_rows for f in replaced.new_fragments], dtype=np.int64),
            )
            groups.update((int(fragment_id), group) for fragment_id in group.old_fragment_ids)
    return groups


def _live_rows(fragment: lance.FragmentMetadata) -> int | None:
    deleted = fragment.deletion_file.num_deleted_rows if fragment.deletion_file else 0
    return None if deleted is None else fragment.physical_rows - deleted


def _in_new_fragments(
    dataset: lance.LanceDataset, group: _RewriteGroup, addresses: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Where ``group``'s rewrite put the rows at ``addresses`` (in its old fragments), and which of them it read.

    A row's rank among the rows the rewrite read is its row in the new
    fragments: the live rows of the old fragments before its own, plus its
    rank in its fragment, read from that fragment's row addresses as the
    rewrite read them (no column decoded, one fragment at a time).
    """
    ranks = np.full(len(addresses), -1, dtype=np.int64)
    fragment_of = addresses >> _OFFSET_BITS
    try:
        before = dataset.checkout_version(group.read_version)
        first = 0
        for fragment_id, live_rows in zip(group.old_fragment_ids, group.old_live_rows, strict=True):
            mine = np.flatnonzero(fragment_of == fragment_id)
            if len(mine) or live_rows is None:
                old = before.get_fragment(int(fragment_id))
                if old is None:
                    return addresses, np.zeros(len(addresses), dtype=bool)
                read = old.scanner(columns=[], with_row_address=True).to_table().column(ROW_ADDRESS).to_numpy()
                at = np.minimum(np.searchsorted(read, addresses[mine]), max(len(read) - 1, 0))
                hit = (at < len(read)) & (read[at] == addresses[mine]) if len(read) else np.zeros(len(mine), bool)
                ranks[mine[hit]] = first + at[hit]
                live_rows = len(read)
            first += live_rows
    except (OSError, ValueError):  # the version or its files are gone (garbage collected)
        return addresses, np.zeros(len(addresses), dtype=bool)
    found = (ranks >= 0) & (ranks < group.new_fragment_ends[-1])
    rank = np.where(found, ranks, 0)
    fragment = np.searchsorted(group.new_fragment_ends, rank, side="right")
    first_row = np.where(fragment > 0, group.new_fragment_ends[fragment - 1], 0)
    new = (group.new_fragment_ids[fragment] << _OFFSET_BITS) | (rank - first_row).astype(np.uint64)
    return new, found
