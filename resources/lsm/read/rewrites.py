"""Where rewrites of the base (``compact_files``) moved rows: their addresses in the fragments they wrote.

Lance's compaction reads each group of fragments in order, skipping deleted
rows, and writes the live rows in that order into the group's new
fragments. So the i-th live row of a group's old fragments is the i-th row
of its new ones, and a row a pending run found can be followed to its new
address from the group alone (its old fragments, as of the version the
rewrite read, and the row counts of the new ones): no key is looked up; the
cost is a read of the row addresses of the old fragments that held such
rows (no column decoded, 6 ms a 1Mi-row fragment).

pylance 14.0.2 cannot read back the transaction of a rewrite that remapped
an index (every table here has its key's), so :func:`compact_recording_moves`
records the groups itself: it plans the compaction as ``compact_files``
does, rewrites the groups it takes (a bounded share of the plan) and
commits them, and stores the groups under ``_lsm_rewrites/``, named by the
version committed. A rewrite without a record (someone else's, or one whose
record was not written) moves rows that are then looked up again.
"""

from __future__ import annotations

import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import lance
import numpy as np
import pyarrow as pa
from lance.optimize import Compaction, CompactionMetrics, CompactionOptions, CompactionTask

from ..format.layout import REWRITES_DIR
from ..format.schema import ROW_ADDRESS
from ..format.storage import TableStorage
from ..lru_cache import LruCache

log = logging.getLogger(__name__)

REWRITES_FOLLOWED = 64
"""Newest rewrite records read, and kept (a run is rebuilt within minutes; a tidy-up rewrites at most every few)."""

_OFFSET_BITS = np.uint64(32)
_ADDRESS_BATCH_ROWS = 1 << 20
"""Row addresses read per batch: a whole 1Mi-row fragment's in 6 ms, against 10 ms in Lance's default batches."""
_RECORDS: LruCache[tuple[str, str], list[_RewriteGroup]] = LruCache(max_entries=1024)
"""Rewrite records read (table location, file name): a record never changes."""


@dataclass(frozen=True, eq=False)  # identity: each group is read from its record once
class _RewriteGroup:
    """Fragments one rewrite replaced, in the order it read them, and those it wrote."""

    read_version: int
    old_fragment_ids: np.ndarray
    old_live_rows: np.ndarray
    new_fragment_ids: np.ndarray
    new_fragment_ends: np.ndarray
    """Cumulative rows of the new fragments: the group's row ``i`` is in the first one whose end exceeds ``i``."""


def compact_recording_moves(
    storage: TableStorage,
    dataset: lance.LanceDataset,
    target_rows_per_fragment: int,
    materialize_deletions_threshold: float,
    max_rows_rewritten: int | None = None,
) -> CompactionMetrics | None:
    """Lance's compaction with these options (``compact_files``' plan), recording where it put the rows it moved.

    Rewrites the groups ``Compaction.plan`` plans, in order, as long as they
    hold at most ``max_rows_rewritten`` physical rows (default: all of them;
    the first group always), and commits those (``Compaction.commit`` takes
    any subset of a plan): the groups left stay as they are for a later
    call, so one call's cost is bounded whatever the base's size. The
    groups are matched, in order, with the fragments the commit added, by
    their row counts, and recorded. Nothing is recorded when they do not
    match (another writer's fragments committed in between): the rows are
    then looked up again. ``None`` when the plan holds nothing to rewrite.
    """
    options = CompactionOptions(
        target_rows_per_fragment=target_rows_per_fragment,
        materialize_deletions_threshold=materialize_deletions_threshold,
    )
    read_version = dataset.version
    tasks = _within(Compaction.plan(dataset, options).tasks, max_rows_rewritten)
    if not tasks:
        return None
    before = {fragment.fragment_id for fragment in dataset.get_fragments()}
    with ThreadPoolExecutor(max_workers=min(len(tasks), os.cpu_count() or 1)) as pool:
        rewritten = list(pool.map(lambda task: task.execute(dataset), tasks))
    metrics = Compaction.commit(dataset, rewritten, options)
    added = sorted(
        (f.fragment_id, f.metadata.physical_rows) for f in dataset.get_fragments() if f.fragment_id not in before
    )
    groups = _matched([list(task.fragments) for task in tasks], added)  # another writer's fragments left over: None
    if groups is None:
        log.warning("rewrite of version %d: the fragments it added do not match its plan; not recorded", read_version)
        return metrics
    record = {"read_version": read_version, "groups": groups}
    storage.write_bytes_atomic(f"{REWRITES_DIR}/{dataset.version:020d}.json", json.dumps(record).encode())
    for name in _record_names(storage)[:-REWRITES_FOLLOWED]:  # older than any a build reads
        storage.delete_file(f"{REWRITES_DIR}/{name}")
    return metrics


def _within(tasks: list[CompactionTask], max_rows: int | None) -> list[CompactionTask]:
    """The first of ``tasks`` whose fragments hold at most ``max_rows`` physical rows together (at least one)."""
    if max_rows is None:
        return tasks
    rows = np.cumsum([sum(f.physical_rows for f in task.fragments) for task in tasks])
    return tasks[: max(1, int(np.searchsorted(rows, max_rows, side="right")))] if tasks else []


def _record_names(storage: TableStorage) -> list[str]:
    """The rewrite records' file names, oldest first (named by the version the rewrite committed)."""
    return sorted(entry.name for entry in storage.list_files(REWRITES_DIR) if entry.name.endswith(".json"))


def _matched(planned: list[list[Any]], added: list[tuple[int, int]]) -> list[dict[str, list[list[int]]]] | None:
    """Each planned group's old fragments (id, live rows) and the added fragments (id, rows) holding its rows."""
    groups, rest = [], list(added)
    for fragments in planned:
        old = [
            [f.id, f.physical_rows - ((f.deletion_file.num_deleted_rows or 0) if f.deletion_file else 0)]
            for f in fragments
        ]
        live, written, new = sum(rows for _, rows in old), 0, []
        while rest and written < live:
            fragment_id, rows = rest.pop(0)
            new.append([fragment_id, rows])
            written += rows
        if written != live:
            return None
        groups.append({"old": old, "new": new})
    return groups if not rest else None


def follow_moved_rows(
    storage: TableStorage, dataset: lance.LanceDataset, fragments: set[int], addresses: np.ndarray
) -> pa.Array:
    """The address in ``dataset`` (``fragments``: its fragment ids) of each row at ``addresses`` (``uint64``, of
    earlier base versions).

    A row in a fragment ``dataset`` still holds keeps its address; one in a
    fragment a recorded rewrite replaced is followed to where that rewrite
    (and any later one) put it. Null where a row cannot be followed: it was
    deleted before the rewrite read it, the rewrite was not recorded (or is
    older than the :data:`REWRITES_FOLLOWED` newest), the version it read is
    gone, or the base has stable row ids (addresses are then not what runs
    hold).
    """
    present = np.fromiter(fragments, dtype=np.uint64, count=len(fragments))
    followed = addresses.astype(np.uint64, copy=True)
    lost = np.zeros(len(followed), dtype=bool)
    groups: dict[int, _RewriteGroup] | None = None
    for _ in range(REWRITES_FOLLOWED):  # each pass follows the rows one rewrite further
        fragment_of = followed >> _OFFSET_BITS
        moved = ~lost & ~np.isin(fragment_of, present)
        if not moved.any():
            break
        if groups is None:
            groups = {} if dataset.has_stable_row_ids else _recorded_groups(storage)
        before = followed.copy()
        replaced_by = {groups[f] for f in map(int, np.unique(fragment_of[moved])) if f in groups}
        for group in replaced_by:
            rows = np.flatnonzero(moved & np.isin(fragment_of, group.old_fragment_ids))
            new, found = _in_new_fragments(dataset, group, followed[rows])
            followed[rows[found]] = new[found]
            lost[rows[~found]] = True
        lost |= moved & (followed == before)  # no recorded rewrite replaced their fragment
    return pa.array(followed, pa.uint64(), mask=lost)


def _recorded_groups(storage: TableStorage) -> dict[int, _RewriteGroup]:
    """The recorded rewrite group that replaced each fragment id, over the newest :data:`REWRITES_FOLLOWED`."""
    groups: dict[int, _RewriteGroup] = {}
    for name in _record_names(storage)[-REWRITES_FOLLOWED:]:
        for group in _RECORDS.get((storage.location, name), partial(_read_record, storage, name)):
            groups.update((int(fragment_id), group) for fragment_id in group.old_fragment_ids)
    return groups


def _read_record(storage: TableStorage, name: str) -> list[_RewriteGroup]:
    record = json.loads(storage.read_bytes(f"{REWRITES_DIR}/{name}"))
    groups = []
    for group in record["groups"]:
        old, new = np.array(group["old"], dtype=np.int64), np.array(group["new"], dtype=np.int64)
        groups.append(
            _RewriteGroup(
                read_version=int(record["read_version"]),
                old_fragment_ids=old[:, 0].astype(np.uint64),
                old_live_rows=old[:, 1],
                new_fragment_ids=new[:, 0].astype(np.uint64),
                new_fragment_ends=np.cumsum(new[:, 1]),
            )
        )
    return groups


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
    firsts = np.concatenate([[0], np.cumsum(group.old_live_rows)[:-1]])
    try:
        before = dataset.checkout_version(group.read_version)
        for fragment_id, first in zip(group.old_fragment_ids, firsts, strict=True):
            mine = np.flatnonzero(fragment_of == fragment_id)
            if not len(mine):
                continue
            old = before.get_fragment(int(fragment_id))
            if old is None:
                return addresses, np.zeros(len(addresses), dtype=bool)
            addresses_read = old.scanner(columns=[], with_row_address=True, batch_size=_ADDRESS_BATCH_ROWS)
            read = addresses_read.to_table().column(ROW_ADDRESS).to_numpy()
            at = np.minimum(np.searchsorted(read, addresses[mine]), max(len(read) - 1, 0))
            hit = read[at] == addresses[mine] if len(read) else np.zeros(len(mine), dtype=bool)
            ranks[mine[hit]] = first + at[hit]
    except (OSError, ValueError):  # the version or its files are gone (garbage collected)
        return addresses, np.zeros(len(addresses), dtype=bool)
    found = (ranks >= 0) & (ranks < group.new_fragment_ends[-1])
    rank = np.where(found, ranks, 0)
    fragment = np.searchsorted(group.new_fragment_ends, rank, side="right")
    first_row = np.where(fragment > 0, group.new_fragment_ends[fragment - 1], 0)
    new = (group.new_fragment_ids[fragment] << _OFFSET_BITS) | (rank - first_row).astype(np.uint64)
    return new, found
