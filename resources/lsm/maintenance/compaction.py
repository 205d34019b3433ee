"""Merge flushed generations into the base table (LSM compaction).

One pass over the shards being merged, top to bottom:

1. Pin the latest base version. If a data commit there claims generations
   its marker does not record yet (a merge stopped between its two
   commits), move the marker first: nothing else happens until it is settled.
2. Per shard, take the generations the shard manifest listed *when the merge
   started* above its merged-through generation (the newer of marker and
   claim), in ascending order. A shard whose stored pending run starts at
   the first of them, with a deletion vector that still holds in the base,
   takes exactly the run's generations (a keeper may have extended it past
   them: those generations, flushed meanwhile, merge with it); the others
   take generations shard after shard until ``max_rows_per_pass`` rows are
   collected (always at least one generation). Directory listings are never
   used, so orphan directories are never read, and other generations
   flushed while we merge wait for the next call. With ``runs_only``
   (beside live writers, whose keeper builds runs), once a run is merged,
   generations without one wait for the next call too: every merge stays
   join-free.
3. Resolve newest-wins per key: later generations win; within a generation
   the later row wins (a run is already resolved). ``_tombstone`` rows
   become deletes. A key lives in one shard, so shards never compete for a key.
4. Commit (:mod:`~resources.lsm.maintenance.base_commits`): the data in one
   ``Update`` that claims, per shard, the pass's last generation, then the
   marker in a data-free commit. Passes over runs are *join-free*: their
   deletion vector names the base rows to delete, so the commit costs one
   deletion file per touched fragment plus the new rows, whatever the base's
   size. Other passes let ``merge_insert`` compute the ``Update`` with its join
   (a hash join against a scan of the base, or key-index probes for very
   few rows: ``_INDEX_JOIN_MAX_FRACTION``). An empty base has no fragment to
   serialize data commits on: there one ``merge_insert`` commits the data and
   the marker together, one generation per shard.

Expressing upserts and deletes in one ``merge_insert`` (pylance 14.0.2): the
source must have exactly the table's columns (an extra ``_tombstone`` column
is refused by every clause), and the builder holds one when-matched action
(``when_matched_delete()`` after ``when_matched_update_all()`` replaces it).
So the source carries the upserts only, and deletes ride on
``when_not_matched_by_source_delete("<key> IN (...)")``: a deleted key is
never in the source, so its base row is exactly a "not matched by source"
row the predicate selects. The price: a pass with deletes joins against the
whole base table.

Safety:

* Crash before a data commit: nothing changed. Crash after it: the claim
  says the generations are merged, so a re-run only moves the marker.
* Two merges never both commit data for a generation: concurrent data
  commits conflict on the lock fragment (see ``base_commits``), and on an
  empty base Lance refuses a marker that does not increase ("Stale SSTable
  compaction"); one generation per shard per commit makes that refusal cover
  every overlap.
* No commit is retried by Lance (``conflict_retries(0)``, ``max_retries=0``):
  a retry would re-apply changes planned against an older base. Instead we
  re-read markers and claims and plan again from them, so a merge that lost
  a race skips what the winner merged.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.dataset import MergeInsertBuilder
from lance.mem_wal import CompactedSsTable

from ..format.schema import TOMBSTONE_COLUMN, conform, empty_tail, primary_key_of
from ..format.shard_state import ShardState
from ..format.storage import TableStorage
from ..handle import TableHandle
from ..read.dedup import keep_last_per_key
from ..read.deletion_vector import fragment_ids
from ..read.filter_text import in_list, sql_literal
from ..read.generations import generation_rows, open_generation
from ..read.key_hash_files import key_files, write_key_hashes_of_written, write_missing_key_hashes
from ..read.pending_run import NOT_IN_BASE, PendingRun
from ..read.rewrites import compact_recording_moves
from .base_commits import commit_data, commit_marker, data_from_merge_insert, data_from_runs
from .policy import DEFAULT_MAX_DELETED_FRACTION, DEFAULT_MAX_ROWS_PER_PASS, DEFAULT_MAX_ROWS_REWRITTEN_PER_PASS

MAX_CONFLICTS_PER_SHARD = 8
"""Lost commits holding a shard that a merge tolerates (re-planning each time) before giving up."""

# A merge either probes the primary-key BTREE once per source row or hash-joins
# the source against a scan of the base; the probes cost more than the scan from
# about 0.01% of the base's rows upward (benchmarks/results/design-choices.md).
_INDEX_JOIN_MAX_FRACTION = 1e-4
# Messages of the OSErrors pylance raises when a commit loses to a concurrent one.
_CONFLICT_MESSAGES = ("Stale SSTable compaction", "Too many concurrent writers", "commit conflict")


@dataclass(frozen=True)
class MaintenancePolicy:
    """When :func:`compact` tidies the base table after merging.

    Attributes
    ----------
    max_small_fragments
        Run ``compact_files`` when more fragments than this hold fewer than
        ``small_fragment_rows`` rows (every merge pass adds a fragment).
    small_fragment_rows
        Physical rows below which a fragment counts as small.
    target_fragment_rows
        Rows ``compact_files`` writes per fragment (Lance's
        ``target_rows_per_fragment``); once it runs, it also merges every run
        of neighbouring fragments with fewer physical rows than this.
    max_deleted_fraction
        Run ``compact_files`` when more than this fraction of the base's
        physical rows are deleted (updates delete the old row too); it then
        rewrites the fragments past this fraction (and only those, when small
        fragments started it). A rewrite costs about ``1 / max_deleted_fraction``
        base rows per changed row; an unfiltered merged scan reads the deleted
        rows and drops them by position, a cost in the rows it reads.
    max_rows_rewritten_per_pass
        Physical rows one tidy-up rewrites at most: the first groups Lance
        plans up to this many (at least one group); the rest wait for the
        next merge's tidy-up. Under random upserts every fragment crosses
        ``max_deleted_fraction`` at about the same time, and rewriting them
        all at once (64Mi rows beside a live writer: 130-200 s) holds the
        merges, and the writers waiting on them, for as long.
    min_unindexed_rows
        Run ``optimize_indices`` when an index misses at least this many rows.
        0 (default) optimizes after every merge: cheap when nothing is
        unindexed, and it records the index catch-up that garbage collection
        waits for before deleting merged generations.
    max_index_deltas
        Each optimization indexes only the rows the index misses, as a new
        delta segment (its cost follows the change, not the base). Once an
        index has this many delta segments, they are merged into one with
        the new rows (a cost in the delta rows). Every segment costs a point
        query about 0.1 ms more (``benchmarks/scale.py``).
    max_index_delta_fraction
        Merge every segment of an index into one (a rebuild, a cost in the
        base rows) once its delta segments hold more than this fraction of
        its indexed rows. The base grows by that fraction between rebuilds,
        so their cost per merged row stays bounded.
    """

    max_small_fragments: int = 8
    small_fragment_rows: int = 256 * 1024
    target_fragment_rows: int = 1024 * 1024
    max_deleted_fraction: float = DEFAULT_MAX_DELETED_FRACTION
    max_rows_rewritten_per_pass: int = DEFAULT_MAX_ROWS_REWRITTEN_PER_PASS
    min_unindexed_rows: int = 0
    max_index_deltas: int = 4
    max_index_delta_fraction: float = 0.25


@dataclass(frozen=True)
class ShardCompaction:
    """What merging one shard did, and the lag it left behind.

    Attributes
    ----------
    generations_merged
        Generations this call committed into the base, ascending.
    passes
        Data commits that merged some of the shard's generations (each bounded
        by ``max_rows_per_pass`` or by the shard's pending run; a commit may
        carry other shards too).
    join_free_passes
        Those of ``passes`` that took the shard's pending run: no join with the base.
    rows_upserted
        Base rows inserted or updated with the shard's rows.
    deletes_applied
        The shard's deletes (one per key) applied to the base; deleting a key
        the base does not hold removes nothing (base rows actually removed:
        :attr:`CompactionResult.rows_deleted`).
    conflicts
        Commits holding the shard that lost to a concurrent commit; each was
        re-planned from the markers the winner left, never re-applied.
    base_version
        Base version of the last commit holding the shard (``None``: none).
    compacted_generation
        The shard's marker after the call.
    pending_generations, oldest_pending_age_seconds
        Compaction lag after the call: flushed generations still above the
        marker (including ones flushed during the merge) and the age of the
        oldest of them (``None`` when nothing is pending or the store keeps no
        modification times).
    """

    shard_id: str
    generations_merged: tuple[int, ...]
    passes: int
    join_free_passes: int
    rows_upserted: int
    deletes_applied: int
    conflicts: int
    base_version: int | None
    compacted_generation: int
    pending_generations: int
    oldest_pending_age_seconds: float | None
    elapsed_seconds: float


@dataclass(frozen=True)
class BaseMaintenance:
    """What :func:`maintain_base` ran on the base table after merging.

    ``skipped_by_conflict`` is True when a concurrent commit pre-empted it; the
    next compaction tries again. ``elapsed_seconds`` is the whole of it: on a
    large base, a rewrite of deletion-heavy fragments or an index rebuild can
    take longer than the merge before it.
    """

    files_compacted: bool
    fragments_removed: int
    fragments_added: int
    indices_optimized: bool
    skipped_by_conflict: bool
    base_version: int
    elapsed_seconds: float
    deleted_fraction: float = 0.0
    """The share of the base's physical rows left deleted (:func:`deleted_fraction`), after it."""


@dataclass(frozen=True)
class CompactionResult:
    """One :func:`compact` call: a result per shard plus base-table maintenance.

    ``rows_deleted`` counts base rows the call's commits removed (deletes of
    keys the base did not hold remove nothing).
    """

    shards: tuple[ShardCompaction, ...]
    maintenance: BaseMaintenance | None
    elapsed_seconds: float
    rows_deleted: int = 0

    @property
    def generations_merged(self) -> int:
        return sum(len(s.generations_merged) for s in self.shards)

    @property
    def rows_upserted(self) -> int:
        return sum(s.rows_upserted for s in self.shards)


@dataclass(frozen=True)
class _ShardPass:
    """The resolved changes of consecutive generations of one shard."""

    shard_id: str
    generations: tuple[int, ...]
    upserts: pa.Table
    deletes: pa.Table
    superseded: np.ndarray | None = None
    """From a pending run: the addresses of the base rows the changes supersede (``None``: join to find them)."""
    base_rows_deleted: int = 0
    """From a pending run: the base rows its deletes remove."""


@dataclass
class _ShardTally:
    """What the commits of one :func:`compact` call did to one shard so far."""

    generations: list[int] = field(default_factory=list)
    passes: int = 0
    join_free_passes: int = 0
    rows_upserted: int = 0
    deletes_applied: int = 0
    conflicts: int = 0
    base_version: int | None = None

    def committed(self, shard_pass: _ShardPass, version: int) -> None:
        self.generations += shard_pass.generations
        self.passes += 1
        self.join_free_passes += shard_pass.superseded is not None
        self.rows_upserted += shard_pass.upserts.num_rows
        self.deletes_applied += shard_pass.deletes.num_rows
        self.base_version = version


def compact(
    table: TableHandle,
    shard_ids: Sequence[str],
    *,
    max_rows_per_pass: int = DEFAULT_MAX_ROWS_PER_PASS,
    maintenance: MaintenancePolicy | None = MaintenancePolicy(),
    runs_only: bool = False,
) -> CompactionResult:
    """Merge every generation pending at the start into the base, all shards per commit.

    With ``runs_only``, once the call merged a pending run, generations no
    run covers are left for a later call: beside live writers, whose keeper
    builds their runs within seconds, every merge stays join-free (a pass
    that joins the base costs seconds on a large one, and the keeper's runs
    over the generations it would merge are lost to it). A call that finds
    no run to merge merges as without it, so generations never wait for a
    keeper that is not there.

    Guarantees: the merged view (``LsmTable.read()``) is the same before, during
    and after the call, and after a crash at any point; each generation is
    applied to the base exactly once. Base maintenance runs once at the end
    if anything was merged (``maintenance=None`` disables it); fragments it
    rewrote get their key files (:mod:`~resources.lsm.read.key_hash_files`) at once.

    Raises
    ------
    ValueError
        For an unknown shard or a non-positive ``max_rows_per_pass``.
    OSError
        If passes holding a shard keep losing commit races (more than
        ``MAX_CONFLICTS_PER_SHARD`` times), or on storage errors.
    """
    if max_rows_per_pass < 1:
        raise ValueError(f"max_rows_per_pass must be positive, got {max_rows_per_pass}")
    unknown = set(shard_ids) - set(table.shard_ids)
    if unknown:
        raise ValueError(f"unknown shards {sorted(unknown)}; the table has {table.shard_ids}")
    started = time.monotonic()
    # Targets are fixed now: generations flushed during the call wait for the next one.
    targets = {s: state.pending_generations for s, state in _shard_states(table, shard_ids).items()}
    tallies = {s: _ShardTally() for s in shard_ids}
    rows_deleted = 0

    # Each round's commits are durable, so a store fault repeats only its round (re-planned from the base).
    def merge_round() -> int:
        after_runs = runs_only and any(tally.join_free_passes for tally in tallies.values())
        return _merge_round(table, targets, tallies, max_rows_per_pass, runs_only=after_runs)

    while (deleted := table.retrying(merge_round, "merge")) >= 0:
        rows_deleted += deleted
    after = _shard_states(table, shard_ids)
    shards = tuple(_shard_result(s, tallies[s], after[s], started) for s in shard_ids)
    merged = any(s.passes for s in shards)
    tidy = (
        maintain_base(table.storage, table.dataset(), maintenance, table.primary_key)
        if merged and maintenance
        else None
    )
    return CompactionResult(shards, tidy, time.monotonic() - started, rows_deleted)


def _merge_round(
    table: TableHandle,
    targets: Mapping[str, Sequence[tuple[int, str]]],
    tallies: dict[str, _ShardTally],
    max_rows: int,
    *,
    runs_only: bool = False,
) -> int:
    """Settle an outstanding claim, or plan and commit the next pass; the base rows it deleted (-1: all merged,
    or, with ``runs_only``, no run left to merge).

    A lost race is counted and left to the next round, which re-reads the base.
    """
    base = table.dataset()
    if _settle_claims(table, base, tallies):
        return 0
    merged_through = table.compacted_generations(base.version)
    todo = {s: [g for g in targets[s] if g[0] > merged_through.get(s, 0)] for s in tallies}
    present = fragment_ids(base)
    passes = _plan_passes(table, base, present, {s: t for s, t in todo.items() if t}, max_rows, runs_only=runs_only)
    if not passes:
        return -1
    try:
        version, deleted = _commit_passes(table, base, present, passes)
    except OSError as exc:
        _count_conflict(exc, [tallies[p.shard_id] for p in passes])
        return 0
    for shard_pass in passes:
        tallies[shard_pass.shard_id].committed(shard_pass, version)
    return deleted


def _count_conflict(exc: OSError, tallies: list[_ShardTally]) -> None:
    """Record a lost commit on the shards it held; re-raise anything else, or too many losses."""
    if not _is_commit_conflict(exc) or any(t.conflicts >= MAX_CONFLICTS_PER_SHARD for t in tallies):
        raise exc
    for tally in tallies:
        tally.conflicts += 1


def _shard_result(shard_id: str, tally: _ShardTally, after: ShardState, started: float) -> ShardCompaction:
    return ShardCompaction(
        shard_id=shard_id,
        generations_merged=tuple(tally.generations),
        passes=tally.passes,
        join_free_passes=tally.join_free_passes,
        rows_upserted=tally.rows_upserted,
        deletes_applied=tally.deletes_applied,
        conflicts=tally.conflicts,
        base_version=tally.base_version,
        compacted_generation=after.compacted_generation,
        pending_generations=len(after.pending_generations),
        oldest_pending_age_seconds=(time.time_ns() - after.oldest_pending_mtime_ns) / 1e9
        if after.oldest_pending_mtime_ns is not None
        else None,
        elapsed_seconds=time.monotonic() - started,
    )


def _shard_states(table: TableHandle, shard_ids: Sequence[str]) -> dict[str, ShardState]:
    """Each shard's state against the markers of the latest base version."""
    return {s.shard_id: s for s in table.shard_states(shard_ids=shard_ids)}


def settle_claims(table: TableHandle, base: lance.LanceDataset) -> dict[str, int]:
    """Move the marker up to the claims it lags behind at ``base`` (a merge stopped between its two commits).

    Returns the claims it settled (empty: none was outstanding). Raises
    ``OSError`` if the marker commit lost to a concurrent commit (which may
    have settled them) or failed.
    """
    claims = table.unsettled_claims(base.version)
    if claims:
        commit_marker(base, table.primary_key, claims)
    return claims


def _settle_claims(table: TableHandle, base: lance.LanceDataset, tallies: dict[str, _ShardTally]) -> bool:
    """:func:`settle_claims`; whether there were claims to settle (the caller then re-reads the base).

    Losing the marker commit is fine: the winner may have settled the claims already.
    """
    try:
        return bool(settle_claims(table, base))
    except OSError as exc:
        _count_conflict(exc, [tallies[s] for s in table.unsettled_claims(base.version) if s in tallies])
        return True


def _plan_passes(
    table: TableHandle,
    base: lance.LanceDataset,
    present: set[int],
    todo: dict[str, Sequence[tuple[int, str]]],
    max_rows: int,
    *,
    runs_only: bool = False,
) -> list[_ShardPass]:
    """The next commit's passes: every shard that has a usable pending run, else (unless ``runs_only``)
    generations read afresh.

    ``present`` holds ``base``'s fragment ids (none: an empty base).
    """
    if not todo:
        return []
    if present:
        passes = _run_passes(table, base, todo, present)
        if passes or runs_only:
            return passes
    # An empty base serializes merges on the marker alone: one generation per shard and commit.
    return _read_passes(table, base, todo, max_rows, generations_per_shard=None if present else 1)


def _run_passes(
    table: TableHandle, base: lance.LanceDataset, todo: dict[str, Sequence[tuple[int, str]]], present: set[int]
) -> list[_ShardPass]:
    """Passes over the shards whose stored run covers a prefix of their ``todo`` with a vector that holds."""
    columns = empty_tail(base.schema).schema
    passes = []
    for state in table.shard_states(base, todo, for_read=True):
        run = table.runs.find(state, maintenance=True)
        if run is not None and _run_is_usable(run, todo[state.shard_id], present):
            passes.append(_run_pass(run, columns, list(table.primary_key)))
    return passes


def _run_is_usable(run: PendingRun, todo: Sequence[tuple[int, str]], present: set[int]) -> bool:
    """The run starts at the first generation to merge, knows every key's base row, and its rows are still there.

    It may reach past the generations to merge: beside live writers, a keeper
    extends the runs every few seconds, so the stored run rarely ends where
    the call's targets do, and those flushed generations merge with it.
    """
    covered = min(len(todo), len(run.generations))
    return (
        tuple(todo[:covered]) == run.generations[:covered]
        and run.base_rows.null_count == 0
        and run.superseded.holds_in(present)
    )


def _run_pass(run: PendingRun, columns: pa.Schema, primary_key: list[str]) -> _ShardPass:
    """The run's changes as a pass, with the addresses of the base rows they supersede."""
    changes = conform(run.changes, columns)
    dead = changes[TOMBSTONE_COLUMN].combine_chunks()
    addresses = run.base_rows.to_numpy()
    in_base = addresses != NOT_IN_BASE
    return _ShardPass(
        shard_id=run.shard_id,
        generations=tuple(generation for generation, _ in run.generations),
        upserts=changes.filter(pc.invert(dead)).drop_columns([TOMBSTONE_COLUMN]),
        deletes=changes.filter(dead).select(primary_key),
        superseded=addresses[in_base],
        base_rows_deleted=int(np.count_nonzero(in_base & dead.to_numpy(zero_copy_only=False))),
    )


def _read_passes(
    table: TableHandle,
    base: lance.LanceDataset,
    todo: dict[str, Sequence[tuple[int, str]]],
    max_rows: int,
    *,
    generations_per_shard: int | None = None,
) -> list[_ShardPass]:
    """One commit's worth of generations: shard after shard, each from its marker up.

    At most ``max_rows`` generation rows unless the first generation alone is
    larger (a pass always makes progress), and at most
    ``generations_per_shard`` per shard. Each shard's changes are resolved
    to one per key.
    """
    # The latest base's columns: they include any added after ``table`` was opened (older rows get nulls).
    columns = empty_tail(base.schema).schema
    passes: list[_ShardPass] = []
    rows = 0
    for shard_id, generations in todo.items():
        taken: list[int] = []
        parts: list[pa.Table] = []
        for generation, directory in generations[:generations_per_shard]:
            sstable = open_generation(table.storage, shard_id, directory)
            count = sstable.count_rows()
            if (passes or taken) and rows + count > max_rows:
                break
            parts.append(generation_rows(sstable, columns))
            taken.append(generation)
            rows += count
        if taken:
            passes.append(_resolve(shard_id, tuple(taken), pa.concat_tables(parts), list(table.primary_key)))
        if len(taken) < len(generations[:generations_per_shard]):
            break  # the budget is spent: the rest waits for the next pass
    return passes


def _resolve(shard_id: str, generations: tuple[int, ...], rows: pa.Table, primary_key: list[str]) -> _ShardPass:
    """Newest change per key of one shard's generations (``rows`` in ascending order)."""
    changes = keep_last_per_key(rows, primary_key)
    dead = changes[TOMBSTONE_COLUMN]
    return _ShardPass(
        shard_id=shard_id,
        generations=generations,
        upserts=changes.filter(pc.invert(dead)).drop_columns([TOMBSTONE_COLUMN]),
        deletes=changes.filter(dead).select(primary_key),
    )


def _commit_passes(
    table: TableHandle, base: lance.LanceDataset, present: set[int], passes: list[_ShardPass]
) -> tuple[int, int]:
    """Commit the passes' data, claiming each shard's last generation; the base version and rows deleted.

    The marker follows in the next round (:func:`_settle_claims`), except on
    an empty base, where it is committed with the data.
    """
    upserts = pa.concat_tables([p.upserts for p in passes])
    claims = {p.shard_id: p.generations[-1] for p in passes}
    if all(p.superseded is not None for p in passes):
        superseded = np.concatenate([p.superseded for p in passes if p.superseded is not None])
        operation = data_from_runs(
            base, superseded, upserts, storage_options=table.storage_options, session=table.session
        )
        version = commit_data(base, operation, claims)
        # Reads of the new version find its rows through the key index at once (the keeper would read them back).
        committed = base.checkout_version(version)
        write_key_hashes_of_written(table.storage, committed, operation.new_fragments, upserts, list(table.primary_key))
        return version, sum(p.base_rows_deleted for p in passes)
    builder = _merge_insert(base, list(table.primary_key), passes, upserts)
    if not present:
        builder = builder.mark_sstables_as_compacted([CompactedSsTable(s, g) for s, g in claims.items()])
        stats: dict[str, Any] = builder.execute(upserts)  # Lance's merge_insert counters
        return base.version, int(stats["num_deleted_rows"])  # merge_insert moved ``base`` to its commit
    operation, deleted = data_from_merge_insert(builder, upserts)
    return commit_data(base, operation, claims), deleted


def _merge_insert(
    base: lance.LanceDataset, primary_key: list[str], passes: list[_ShardPass], upserts: pa.Table
) -> MergeInsertBuilder:
    """A ``merge_insert`` of the passes' upserts that also deletes their deleted keys."""
    deletes = pa.concat_tables([p.deletes for p in passes])
    builder = (
        base.merge_insert(primary_key)
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .conflict_retries(0)
        .use_index(upserts.num_rows < _INDEX_JOIN_MAX_FRACTION * base.count_rows())
    )
    if deletes.num_rows:
        builder = builder.when_not_matched_by_source_delete(key_in_predicate(deletes, base.schema))
    return builder


def key_in_predicate(keys: pa.Table, schema: pa.Schema) -> str:
    """A Lance SQL predicate matching exactly the rows whose key is in ``keys``.

    A single-column key becomes ``key IN (literals)``. A composite key is
    encoded as one string per row, ``concat`` of the columns with every string
    length-prefixed (``<len>:<value>``) and ``|`` between columns, so that the
    encoding is injective and still one hash-set ``IN`` (an ``OR`` of ``AND``s
    costs time proportional to rows x keys).
    """
    names = keys.column_names
    if len(names) == 1:
        values = keys.column(0).to_pylist()
        return in_list(names[0], values)
    string_columns = {
        n for n in names if pa.types.is_string(schema.field(n).type) or pa.types.is_large_string(schema.field(n).type)
    }
    parts = []
    for name in names:
        if name in string_columns:
            parts += [f"CAST(character_length(`{name}`) AS STRING)", "':'", f"`{name}`"]
        else:
            parts.append(f"CAST(`{name}` AS STRING)")
        parts.append("'|'")
    encoded = [
        "".join(f"{len(row[n])}:{row[n]}|" if n in string_columns else f"{row[n]}|" for n in names)
        for row in keys.to_pylist()
    ]
    return f"concat({', '.join(parts)}) IN ({', '.join(sql_literal(e) for e in encoded)})"


def maintain_base(
    storage: TableStorage,
    dataset: lance.LanceDataset,
    policy: MaintenancePolicy,
    primary_key: Sequence[str] | None = None,
) -> BaseMaintenance:
    """Compact small or deletion-heavy fragments, then bring indexes up to date.

    Both steps are ordinary Lance commits that leave the table's rows (and the
    compacted markers) unchanged; where the rewrite put the rows it moved
    is recorded for the next build of pending runs
    (:mod:`~resources.lsm.read.rewrites`). With ``primary_key`` the
    rewritten fragments' key files are read back at once, before the
    indexes are brought up to date: reads and run builds search them, not
    Lance's query (which scans the new fragments until ``optimize_indices``
    ends). ``compact_files`` drops the MemWAL index catch-up record, so
    indexes are always optimized after it.
    """
    started = time.monotonic()
    try:
        index_key_columns(dataset)
        files = None
        if _needs_file_compaction(dataset, policy):
            files = compact_recording_moves(
                storage,
                dataset,
                target_rows_per_fragment=policy.target_fragment_rows,
                materialize_deletions_threshold=policy.max_deleted_fraction,
                max_rows_rewritten=policy.max_rows_rewritten_per_pass,
            )
            if files is not None and primary_key is not None:
                write_missing_key_hashes(storage, dataset, list(primary_key), key_files(storage, dataset))
        optimize = files is not None or _max_unindexed_rows(dataset) >= policy.min_unindexed_rows
        if optimize:
            _optimize_indices(dataset, policy)
    except OSError as exc:
        if not _is_commit_conflict(exc):
            raise
        return BaseMaintenance(
            False, 0, 0, False, True, dataset.version, time.monotonic() - started, deleted_fraction(dataset)
        )
    return BaseMaintenance(
        files_compacted=files is not None,
        fragments_removed=files.fragments_removed if files else 0,
        fragments_added=files.fragments_added if files else 0,
        indices_optimized=optimize,
        skipped_by_conflict=False,
        base_version=dataset.latest_version,  # the dataset's own store: no storage options lost
        elapsed_seconds=time.monotonic() - started,
        deleted_fraction=deleted_fraction(dataset),  # Lance moved the dataset to the versions it committed
    )


def deleted_fraction(dataset: lance.LanceDataset) -> float:
    """The share of ``dataset``'s physical rows that are deleted (updates delete the old row too)."""
    fragments = [f.metadata for f in dataset.get_fragments()]
    physical = sum(f.physical_rows for f in fragments)
    deleted = sum(f.deletion_file.num_deleted_rows or 0 for f in fragments if f.deletion_file)
    return deleted / physical if physical else 0.0


def index_key_columns(dataset: lance.LanceDataset) -> list[str]:
    """Create a BTREE index on every primary-key column that has none; the columns indexed.

    Point lookups, the deletion vectors' base probes and the merge guards
    query the key with ``IN`` lists. Lance answers those through a BTREE per
    column, and combines them for a composite key (300k rows, two-column key:
    1.6 ms with both columns indexed vs 8.4 ms scanning). Tables created
    before composite keys were indexed gain their indexes here.
    """
    indexed = {name for d in dataset.describe_indices() for name in d.field_names if len(d.field_names) == 1}
    missing = [column for column in primary_key_of(dataset.schema) if column not in indexed]
    for column in missing:
        dataset.create_scalar_index(column, "BTREE")
    return missing


def _needs_file_compaction(dataset: lance.LanceDataset, policy: MaintenancePolicy) -> bool:
    small = sum(1 for f in dataset.get_fragments() if f.metadata.physical_rows < policy.small_fragment_rows)
    return small > policy.max_small_fragments or deleted_fraction(dataset) > policy.max_deleted_fraction


def _user_indices(dataset: lance.LanceDataset) -> list[str]:
    """Names of the indexes on columns (the MemWAL index has none)."""
    return [d.name for d in dataset.describe_indices() if d.fields]


def _max_unindexed_rows(dataset: lance.LanceDataset) -> int:
    """Rows the most out-of-date user index misses (-1 without user indexes)."""
    return max((dataset.stats.index_stats(n)["num_unindexed_rows"] for n in _user_indices(dataset)), default=-1)


def _optimize_indices(dataset: lance.LanceDataset, policy: MaintenancePolicy) -> None:
    """Index the rows every user index misses, in a cost that follows them (see :class:`MaintenancePolicy`).

    Without user indexes, one plain ``optimize_indices`` still records the
    MemWAL index catch-up.
    """
    names = _user_indices(dataset)
    if not names:
        dataset.optimize.optimize_indices()
    for name in names:
        dataset.optimize.optimize_indices(
            index_names=[name], num_indices_to_merge=_segments_to_merge(dataset.stats.index_stats(name), policy)
        )


def _segments_to_merge(stats: dict[str, Any], policy: MaintenancePolicy) -> int:
    """Newest segments to merge with the unindexed rows: 0 (a new delta), the deltas, or all."""
    # Lance lists the segments oldest first; the first is the base-sized one.
    rows = stats["num_indexed_rows_per_delta"]
    deltas = rows[1:]
    if sum(deltas) > policy.max_index_delta_fraction * sum(rows):
        return len(rows)
    return len(deltas) if len(deltas) >= policy.max_index_deltas else 0


def _is_commit_conflict(exc: OSError) -> bool:
    message = str(exc).lower()
    return any(m.lower() in message for m in _CONFLICT_MESSAGES)
