"""Merge flushed generations into the base table (LSM compaction).

One pass over one shard, top to bottom:

1. Pin the latest base version and read the shard's compacted marker from
   that version's manifest.
2. Take the generations the shard manifest listed *when the merge started*
   above the marker, in ascending order, until ``max_rows_per_pass`` rows are
   collected (always at least one generation). Directory listings are never
   used, so orphan directories are never read, and generations flushed while
   we merge wait for the next call.
3. Resolve newest-wins per key: later generations win; within a generation
   the later row wins. (A flush hides older duplicates of a key behind a
   deletion vector, so a generation normally yields each key once; we do not
   rely on it.) ``_tombstone`` rows become deletes.
4. Commit everything with ONE ``merge_insert`` that also records the highest
   merged generation as the shard's compacted marker.

Expressing upserts and deletes in one ``merge_insert`` (pylance 14.0.2): the
source must have exactly the table's columns (an extra ``_tombstone`` column
is refused by every clause), and the builder holds one when-matched action
(``when_matched_delete()`` after ``when_matched_update_all()`` replaces it).
So the source carries the upserts only, and deletes ride on
``when_not_matched_by_source_delete("<key> IN (...)")``: a deleted key is
never in the source, so its base row is exactly a "not matched by source"
row the predicate selects. The price: a pass with deletes joins against the
whole base table. Without deletes the merge hash-joins the source against
a scan of the base rather than probing the key index per row (see
``_INDEX_JOIN_MAX_FRACTION``): each shard's commit costs about one scan of
the base.

Safety:

* Crash before the commit: nothing changed. Crash after it: the marker says
  the generations are merged, so a re-run finds nothing to do.
* Lance refuses a marker that does not strictly increase ("Stale SSTable
  compaction"), even after rebasing onto a concurrent commit. Every pass
  covers the contiguous generations right above the marker it read, so a
  pass that does commit is never older than what the base already holds.
* ``conflict_retries(0)``: Lance would otherwise re-execute a conflicting
  pass against the new base, re-applying generations a concurrent merge may
  have covered already. Instead we re-read the marker and plan again from
  it, so a merge that lost a race skips what the winner merged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import lance
import pyarrow as pa
import pyarrow.compute as pc
from lance.mem_wal import CompactedSsTable

from .compaction_marker import read_compacted_generations
from .dedup import keep_last_per_key
from .generations import generation_rows, open_generation
from .schema import TOMBSTONE_COLUMN, empty_tail
from .shard_state import ShardState, load_shard_state

if TYPE_CHECKING:
    from .table import LsmTable

DEFAULT_MAX_ROWS_PER_PASS = 1_000_000
MAX_CONFLICTS_PER_SHARD = 8
"""Commit conflicts one shard's merge tolerates (re-planning each time) before giving up."""

# A merge either probes the primary-key BTREE once per source row or hash-joins
# the source against a scan of the base. Measured with pylance 14.0.2 (1-3M base
# rows, 2 cores), the hash join wins from about 0.01% of the base's rows upward
# (50k rows into 1M: 0.07 s vs 0.20 s; 100 rows into 3M: 0.04 s vs 0.02 s).
_INDEX_JOIN_MAX_FRACTION = 1e-4
# Messages of the OSErrors pylance raises when a commit loses to a concurrent one.
_CONFLICT_MESSAGES = ("Stale SSTable compaction", "Too many concurrent writers", "commit conflict")
_I64_MIN = -(2**63)


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
    max_deleted_fraction
        Run ``compact_files`` when more than this fraction of the base's
        physical rows are deleted (updates delete the old row too).
    min_unindexed_rows
        Run ``optimize_indices`` when an index misses at least this many rows.
        0 (default) optimizes after every merge: cheap when nothing is
        unindexed, and it records the index catch-up that garbage collection
        waits for before deleting merged generations.
    """

    max_small_fragments: int = 8
    small_fragment_rows: int = 256 * 1024
    max_deleted_fraction: float = 0.1
    min_unindexed_rows: int = 0


@dataclass(frozen=True)
class ShardCompaction:
    """What merging one shard did, and the lag it left behind.

    Attributes
    ----------
    generations_merged
        Generations this call committed into the base, ascending.
    passes
        Commits made (each bounded by ``max_rows_per_pass``).
    rows_upserted, rows_deleted
        Base rows inserted or updated, and base rows deleted.
    conflicts
        Commits lost to a concurrent commit; each was re-planned from the
        marker the winner left, never re-applied.
    base_version
        Base version of this call's last commit (``None``: nothing committed).
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
    rows_upserted: int
    rows_deleted: int
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
    next compaction tries again.
    """

    files_compacted: bool
    fragments_removed: int
    fragments_added: int
    indices_optimized: bool
    skipped_by_conflict: bool
    base_version: int


@dataclass(frozen=True)
class CompactionResult:
    """One :func:`compact` call: a result per shard plus base-table maintenance."""

    shards: tuple[ShardCompaction, ...]
    maintenance: BaseMaintenance | None
    elapsed_seconds: float

    @property
    def generations_merged(self) -> int:
        return sum(len(s.generations_merged) for s in self.shards)

    @property
    def rows_upserted(self) -> int:
        return sum(s.rows_upserted for s in self.shards)

    @property
    def rows_deleted(self) -> int:
        return sum(s.rows_deleted for s in self.shards)


@dataclass(frozen=True)
class _Pass:
    """The resolved changes of consecutive generations of one shard."""

    generations: tuple[int, ...]
    upserts: pa.Table
    deletes: pa.Table


def compact(table: "LsmTable", shard_ids: Sequence[str], *,
            max_rows_per_pass: int = DEFAULT_MAX_ROWS_PER_PASS,
            maintenance: MaintenancePolicy | None = MaintenancePolicy()) -> CompactionResult:
    """Merge every generation pending at the start into the base, shard by shard.

    Guarantees: the merged view (``table.read()``) is the same before, during
    and after the call, and after a crash at any point; each generation is
    applied to the base exactly once. Base maintenance runs once at the end
    if anything was merged (``maintenance=None`` disables it).

    Raises
    ------
    ValueError
        For an unknown shard or a non-positive ``max_rows_per_pass``.
    OSError
        If a shard keeps losing commit races (more than
        ``MAX_CONFLICTS_PER_SHARD`` times), or on storage errors.
    """
    if max_rows_per_pass < 1:
        raise ValueError(f"max_rows_per_pass must be positive, got {max_rows_per_pass}")
    unknown = set(shard_ids) - set(table.shard_ids)
    if unknown:
        raise ValueError(f"unknown shards {sorted(unknown)}; the table has {table.shard_ids}")
    started = time.monotonic()
    # Targets are fixed now: generations flushed during the call wait for the next one.
    targets = {s: _shard_state(table, s).pending_generations for s in shard_ids}
    shards = tuple(compact_shard(table, s, targets[s], max_rows_per_pass) for s in shard_ids)
    merged = any(s.passes for s in shards)
    tidy = maintain_base(table.dataset(), maintenance) if merged and maintenance else None
    return CompactionResult(shards, tidy, time.monotonic() - started)


def compact_shard(table: "LsmTable", shard_id: str, targets: Sequence[tuple[int, str]],
                  max_rows_per_pass: int) -> ShardCompaction:
    """Merge the shard's ``targets`` (manifest entries, ascending) that are still
    above its marker, in bounded passes."""
    started = time.monotonic()
    merged: list[int] = []
    upserted = deleted = conflicts = passes = 0
    version = None
    while True:
        base = table.dataset()
        marker = read_compacted_generations(table._storage, base.version).get(shard_id, 0)
        todo = [g for g in targets if g[0] > marker]
        if not todo:
            break
        batch = _read_pass(table, shard_id, todo, max_rows_per_pass)
        try:
            stats = _commit_pass(base, table.primary_key, shard_id, batch)
        except OSError as exc:
            if not _is_commit_conflict(exc) or conflicts >= MAX_CONFLICTS_PER_SHARD:
                raise
            conflicts += 1
            continue
        merged += batch.generations
        upserted += stats["num_inserted_rows"] + stats["num_updated_rows"]
        deleted += stats["num_deleted_rows"]
        passes += 1
        version = base.version  # merge_insert moves the dataset object to its commit
    after = _shard_state(table, shard_id)
    return ShardCompaction(
        shard_id=shard_id, generations_merged=tuple(merged), passes=passes,
        rows_upserted=upserted, rows_deleted=deleted, conflicts=conflicts, base_version=version,
        compacted_generation=after.compacted_generation,
        pending_generations=len(after.pending_generations),
        oldest_pending_age_seconds=(time.time_ns() - after.oldest_pending_mtime_ns) / 1e9
        if after.oldest_pending_mtime_ns is not None else None,
        elapsed_seconds=time.monotonic() - started,
    )


def _shard_state(table: "LsmTable", shard_id: str) -> ShardState:
    """The shard's state against the marker of the latest base version."""
    compacted = read_compacted_generations(table._storage, table.dataset().version)
    return load_shard_state(table._storage, shard_id, table.shard_ids.index(shard_id),
                            compacted.get(shard_id, 0))


def _read_pass(table: "LsmTable", shard_id: str, todo: Sequence[tuple[int, str]],
               max_rows: int) -> _Pass:
    """Read consecutive generations (at least one, at most ``max_rows`` rows unless
    the first alone is larger) and resolve them to one change per key."""
    columns = empty_tail(table.schema).schema
    generations: list[int] = []
    parts: list[pa.Table] = []
    rows = 0
    for generation, directory in todo:
        sstable = open_generation(table.uri, shard_id, directory, table.storage_options)
        count = sstable.count_rows()
        if generations and rows + count > max_rows:
            break
        parts.append(generation_rows(sstable, columns))
        generations.append(generation)
        rows += count
    changes = keep_last_per_key(pa.concat_tables(parts), table.primary_key)
    dead = changes[TOMBSTONE_COLUMN]
    return _Pass(
        generations=tuple(generations),
        upserts=changes.filter(pc.invert(dead)).drop_columns([TOMBSTONE_COLUMN]),
        deletes=changes.filter(dead).select(table.primary_key),
    )


def _commit_pass(base: lance.LanceDataset, primary_key: list[str], shard_id: str,
                 batch: _Pass) -> dict:
    """Apply one pass and advance the shard's marker to its last generation, atomically."""
    builder = (
        base.merge_insert(primary_key)
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .conflict_retries(0)
        .use_index(batch.upserts.num_rows < _INDEX_JOIN_MAX_FRACTION * base.count_rows())
        # One entry per shard and commit: Lance refuses several for one shard.
        .mark_sstables_as_compacted([CompactedSsTable(shard_id, batch.generations[-1])])
    )
    if batch.deletes.num_rows:
        builder = builder.when_not_matched_by_source_delete(key_in_predicate(batch.deletes, base.schema))
    return builder.execute(batch.upserts)


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
        return f"`{names[0]}` IN ({', '.join(_sql_literal(v) for v in values)})"
    string_columns = {n for n in names if pa.types.is_string(schema.field(n).type)
                      or pa.types.is_large_string(schema.field(n).type)}
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
    return f"concat({', '.join(parts)}) IN ({', '.join(_sql_literal(e) for e in encoded)})"


def _sql_literal(value: int | str) -> str:
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    # The parser reads "-9223372036854775808" as minus an out-of-range integer.
    return f"({_I64_MIN + 1} - 1)" if value == _I64_MIN else str(value)


def maintain_base(dataset: lance.LanceDataset, policy: MaintenancePolicy) -> BaseMaintenance:
    """Compact small or deletion-heavy fragments, then bring indexes up to date.

    Both steps are ordinary Lance commits that leave the table's rows (and the
    compacted markers) unchanged. ``compact_files`` drops the MemWAL index
    catch-up record, so indexes are always optimized after it.
    """
    try:
        files = None
        if _needs_file_compaction(dataset, policy):
            files = dataset.optimize.compact_files()
        optimize = files is not None or _max_unindexed_rows(dataset) >= policy.min_unindexed_rows
        if optimize:
            dataset.optimize.optimize_indices()
    except OSError as exc:
        if not _is_commit_conflict(exc):
            raise
        return BaseMaintenance(False, 0, 0, False, True, dataset.version)
    return BaseMaintenance(
        files_compacted=files is not None,
        fragments_removed=files.fragments_removed if files else 0,
        fragments_added=files.fragments_added if files else 0,
        indices_optimized=optimize, skipped_by_conflict=False,
        base_version=lance.dataset(dataset.uri).version,
    )


def _needs_file_compaction(dataset: lance.LanceDataset, policy: MaintenancePolicy) -> bool:
    fragments = [f.metadata for f in dataset.get_fragments()]
    small = sum(1 for f in fragments if f.physical_rows < policy.small_fragment_rows)
    physical = sum(f.physical_rows for f in fragments)
    deleted = sum(f.deletion_file.num_deleted_rows or 0 for f in fragments if f.deletion_file)
    return small > policy.max_small_fragments or (physical > 0 and deleted / physical > policy.max_deleted_fraction)


def _max_unindexed_rows(dataset: lance.LanceDataset) -> int:
    """Rows the most out-of-date user index misses (-1 without user indexes)."""
    names = [d.name for d in dataset.describe_indices() if d.fields]
    return max((dataset.stats.index_stats(n)["num_unindexed_rows"] for n in names), default=-1)


def _is_commit_conflict(exc: OSError) -> bool:
    message = str(exc).lower()
    return any(m.lower() in message for m in _CONFLICT_MESSAGES)
