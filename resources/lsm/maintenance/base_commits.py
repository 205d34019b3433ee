"""The commits that merge generations into the base table, and why each is safe.

A merge whose base already has fragments commits twice:

1. **Data commit**: one Lance ``Update`` holding the pass's data — deletion
   files for the base rows the pass supersedes and new fragments for its
   upserted rows — and, in its transaction properties, the generation each
   shard is now merged through (:mod:`~resources.lsm.format.merge_claims`).
   With pending runs the superseded rows' addresses are already known, so
   nothing is joined (:func:`data_from_runs`); without, ``merge_insert``
   computes the same ``Update`` with its join and does not commit it
   (:func:`data_from_merge_insert`).
2. **Marker commit**: a ``merge_insert`` of no rows that only moves the MemWAL
   compacted marker up to the claim (:func:`commit_marker`). pylance offers
   no other way to move it.

Readers take the newer of marker and claim, so the view is the same before,
between and after the two commits; a crash between them leaves a claim that
the next merge settles with the marker commit alone, never re-applying data.

**Only one data commit per generation.** Two concurrent merges that planned
from the same state must not both commit their data. Lance refuses a commit
that updates a fragment a concurrent commit updated, so every data commit
lists the base's lowest-numbered fragment among its updated fragments (the
*lock fragment*, unchanged if the pass does not touch it). Fragment ids only
grow, so any two merges that could both have planned the same generations
name the same lock fragment unless a commit in between removed it, and such
a commit conflicts with the older merge itself. The loser re-plans from what
the winner claimed.

An empty base has no lock fragment; its first passes commit data and marker
together in one ``merge_insert`` that merges one generation per shard, so
Lance's refusal of a marker that does not increase decides races there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import lance
import numpy as np
import pyarrow as pa
from lance import LanceOperation
from lance.dataset import MergeInsertBuilder
from lance.fragment import FragmentMetadata, LanceFragment, write_fragments
from lance.mem_wal import CompactedSsTable

from ..format.merge_claims import claim_properties
from ..read.level_readers import level_readers

_OFFSET_BITS = np.uint64(32)
_OFFSET_MASK = np.uint64(0xFFFFFFFF)


def data_from_runs(
    base: lance.LanceDataset,
    superseded: np.ndarray,
    upserts: pa.Table,
    *,
    storage_options: Mapping[str, str] | None = None,
    session: lance.Session | None = None,
) -> LanceOperation.Update:
    """The ``Update`` that deletes the base rows at ``superseded`` (row addresses) and adds ``upserts``.

    Its cost follows the change: one deletion file per fragment holding a
    superseded row, and the upserted rows written once. Nothing reads the
    base's rows or key column.
    """
    addresses = np.sort(superseded.astype(np.uint64))
    fragments = addresses >> _OFFSET_BITS
    starts = np.flatnonzero(np.r_[True, fragments[1:] != fragments[:-1]]) if len(addresses) else np.array([], int)
    groups = np.split(addresses & _OFFSET_MASK, starts[1:])
    ids = [int(fragments[start]) for start in starts]

    def delete(fragment_id: int, offsets: np.ndarray) -> FragmentMetadata | None:
        return _fragment(base, fragment_id).delete_rows(offsets.tolist())

    deleted = list(level_readers().map(delete, ids, groups))
    new = (
        write_fragments(upserts.cast(base.schema), base, storage_options=dict(storage_options or {}), session=session)
        if upserts.num_rows
        else []
    )
    return LanceOperation.Update(
        removed_fragment_ids=[i for i, meta in zip(ids, deleted, strict=True) if meta is None],
        updated_fragments=[meta for meta in deleted if meta is not None],
        new_fragments=list(new),
    )


def data_from_merge_insert(builder: MergeInsertBuilder, upserts: pa.Table) -> tuple[LanceOperation.Update, int]:
    """The ``Update`` ``builder`` would commit for ``upserts``, uncommitted, and the base rows it deletes."""
    transaction, stats = builder.execute_uncommitted(upserts)
    operation = transaction.operation
    if not isinstance(operation, LanceOperation.Update):
        raise TypeError(f"merge_insert planned a {type(operation).__name__}, not an Update")
    return operation, int(stats["num_deleted_rows"])


def commit_data(base: lance.LanceDataset, operation: LanceOperation.Update, claims: Mapping[str, int]) -> int:
    """Commit ``operation`` against ``base``'s version, claiming ``claims``; the new base version.

    Raises
    ------
    OSError
        ``CommitConflictError`` if a concurrent commit touched a fragment this
        one updates (always the case for a concurrent data commit: see the
        lock fragment above).
    """
    transaction = lance.Transaction(
        read_version=base.version,
        operation=_with_lock_fragment(base, operation),
        transaction_properties=claim_properties(claims),
    )
    return lance.LanceDataset.commit(base, transaction, max_retries=0).version


def commit_marker(base: lance.LanceDataset, primary_key: Sequence[str], claims: Mapping[str, int]) -> None:
    """Move each shard's compacted marker up to its claim, committing no data (``base`` moves to that commit).

    Raises
    ------
    OSError
        "Stale SSTable compaction" if a concurrent commit moved a marker to or
        past its claim already, or another commit conflict.
    """
    builder = (
        base.merge_insert(list(primary_key))
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .conflict_retries(0)
        .use_index(True)  # no source rows: nothing to probe, and no scan of the base
        .mark_sstables_as_compacted([CompactedSsTable(shard, generation) for shard, generation in claims.items()])
    )
    builder.execute(base.schema.empty_table())


def _with_lock_fragment(base: lance.LanceDataset, operation: LanceOperation.Update) -> LanceOperation.Update:
    """``operation``, also updating the base's lowest-numbered fragment (unchanged if it does not touch it)."""
    lock = min(fragment.fragment_id for fragment in base.get_fragments())
    touched = set(operation.removed_fragment_ids) | {meta.id for meta in operation.updated_fragments}
    if lock in touched:
        return operation
    return replace(operation, updated_fragments=[*operation.updated_fragments, _fragment(base, lock).metadata])


def _fragment(base: lance.LanceDataset, fragment_id: int) -> LanceFragment:
    fragment = base.get_fragment(fragment_id)
    if fragment is None:
        raise ValueError(f"fragment {fragment_id} is not in base version {base.version}")
    return fragment
