"""Maintenance assets: flush MemTables, merge generations into the base, collect garbage.

Each run works on the shards its config names (``shards``, default: every
shard the table has), in one process and one step, and records one
materialization with totals and per-shard numbers (``shard_<bucket>_<name>``,
so the UI plots each shard's lag). The shard list always comes from the table
itself, never from a setting that could disagree with it.
"""

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from dagster import AssetExecutionContext, AssetsDefinition, Config, MaterializeResult
from pydantic import Field

from resources.declared_table import DeclaredTable
from resources.lsm.maintenance.policy import (
    DEFAULT_GRACE_SECONDS,
    DEFAULT_MAX_DELETED_FRACTION,
    DEFAULT_MAX_ROWS_PER_PASS,
    DEFAULT_MAX_ROWS_REWRITTEN_PER_PASS,
)

from .checks import enforce_merge_guards
from .ingestion import ingested_changes
from .live_writers import live_writer_runs
from .table_context import DEFAULT_TABLE, StepConfig, open_table, table_asset, version_metadata

if TYPE_CHECKING:
    from resources.lsm import BaseMaintenance, LsmTable, ShardCompaction, ShardState


class ShardsConfig(Config):
    shards: list[int] | None = Field(
        default=None,
        description=(
            "Buckets to work on (default: every shard of the table). The sensors name the shards that need it."
        ),
    )


class FlushConfig(ShardsConfig):
    idle_seconds: float = Field(
        default=30.0, description="Skip a shard whose WAL was written this recently: a writer may be live."
    )


class MergeConfig(ShardsConfig):
    max_rows_per_pass: int = Field(
        default=DEFAULT_MAX_ROWS_PER_PASS, ge=1, description="Rows read from generations per merge commit."
    )
    max_deleted_fraction: float = Field(
        default=DEFAULT_MAX_DELETED_FRACTION,
        gt=0.0,
        lt=1.0,
        description="After merging, rewrite the base's fragments once more than this fraction of its rows are deleted.",
    )
    max_rows_rewritten_per_pass: int = Field(
        default=DEFAULT_MAX_ROWS_REWRITTEN_PER_PASS,
        ge=1,
        description="Physical rows one tidy-up rewrites at most (one group at least); the next merge goes on.",
    )


class GcConfig(Config):
    orphan_grace_seconds: float = Field(
        default=DEFAULT_GRACE_SECONDS, description="Keep orphan generation directories younger than this."
    )
    wal_grace_seconds: float = Field(
        default=DEFAULT_GRACE_SECONDS, description="Keep consumed WAL entries younger than this."
    )
    version_retention_hours: float = Field(default=1.0, description="Keep base versions newer than this.")


def _gc_defaults(table: DeclaredTable) -> dict[str, Any]:
    """``table``'s declared GC settings, as :class:`GcConfig` defaults."""
    gc = table.gc
    return {
        "orphan_grace_seconds": gc.orphan_grace_seconds,
        "wal_grace_seconds": gc.wal_grace_seconds,
        "version_retention_hours": gc.version_retention_hours,
    }


FLUSH_CONFIG = StepConfig(FlushConfig)
MERGE_CONFIG = StepConfig(
    MergeConfig,
    lambda table: {
        "max_deleted_fraction": table.tidy.max_deleted_fraction,
        "max_rows_rewritten_per_pass": table.tidy.max_rows_rewritten_per_pass,
    },
)
GC_CONFIG = StepConfig(GcConfig, _gc_defaults)


def selected_shards(table: "LsmTable", buckets: list[int] | None) -> list["ShardState"]:
    """The states of ``buckets`` (all shards when ``None``), read once.

    Raises
    ------
    ValueError
        For a bucket the table does not have.
    """
    unknown = sorted(set(buckets or ()) - set(range(table.num_shards)))
    if unknown:
        raise ValueError(f"buckets {unknown} do not exist; {table.uri} has {table.num_shards} shards")
    states = table.shards()
    return states if buckets is None else [s for s in states if s.bucket in set(buckets)]


def shard_metadata(per_shard: dict[int, dict[str, float]], totals: dict[str, Any]) -> dict[str, Any]:
    """``totals`` plus every per-shard number as ``shard_<bucket>_<name>``."""
    return {
        **totals,
        "shards": len(per_shard),
        **{f"shard_{b}_{name}": value for b, numbers in sorted(per_shard.items()) for name, value in numbers.items()},
    }


# ------------------------------------------------------------------------- flush


def flush_shards(
    context: AssetExecutionContext, table: "LsmTable", config: FlushConfig, table_name: str
) -> dict[str, Any]:
    """Flush the selected shards' unflushed WAL into generations (in parallel), skipping live writers.

    Then store each selected shard's pending run (the read shortcut over its
    pending generations, rebuilt only if it changed), but for shards a merge
    is working on: that merge builds their runs as it ends.
    """
    live_runs = live_writer_runs(context.instance, table_name, exclude_run_id=context.run.run_id)
    to_flush = [
        s
        for s in selected_shards(table, config.shards)
        if s.unflushed_wal_entries and _quiet(context, s, live_runs, config)
    ]
    if to_flush:
        table.flush([s.shard_id for s in to_flush])
    flushed: dict[int, dict[str, float]] = {}
    for state in to_flush:
        context.log.info(
            f"shard {state.bucket}: flushed {state.unflushed_wal_entries} WAL entries "
            f"({state.unflushed_wal_bytes} bytes) into a new generation"
        )
        flushed[state.bucket] = {
            "wal_entries_flushed": state.unflushed_wal_entries,
            "wal_bytes_flushed": state.unflushed_wal_bytes,
        }
    after = {s.bucket: s for s in selected_shards(table, config.shards)}
    merging = table.merging_shards()
    runs = table.build_pending_runs([s.shard_id for s in after.values() if s.shard_id not in merging])
    for b, s in after.items():
        if s.shard_id in merging:
            context.log.info(f"shard {b}: pending run left to the merge working on it")
        elif s.shard_id in runs:
            context.log.info(f"shard {b}: pending run built over {runs[s.shard_id]} changes")
    per_shard = {
        b: {
            "flushed": int(b in flushed),
            **flushed.get(b, {"wal_entries_flushed": 0, "wal_bytes_flushed": 0}),
            "unflushed_wal_entries": s.unflushed_wal_entries,
            "pending_generations": len(s.pending_generations),
            "pending_run_changes": runs.get(s.shard_id, 0),
            "pending_run_left_to_merge": int(s.shard_id in merging),
        }
        for b, s in after.items()
    }
    return shard_metadata(per_shard, _sums(per_shard))


def _quiet(context: AssetExecutionContext, state: "ShardState", live_runs: list[str], config: FlushConfig) -> bool:
    """Whether no writer may be live on ``state``'s shard (logging why not): flushing claims the shard."""
    if live_runs:
        context.log.info(f"shard {state.bucket}: skipped, writer runs in progress: {live_runs}")
        return False
    last_write_age = _age_seconds(state.unflushed_wal_last_mtime_ns)
    if last_write_age is not None and last_write_age < config.idle_seconds:
        context.log.info(f"shard {state.bucket}: skipped, WAL written {last_write_age:.1f}s ago (writer may be live)")
        return False
    return True


def _flushed_generations(table: DeclaredTable, ingested: AssetsDefinition) -> AssetsDefinition:
    @table_asset(
        table, "flushed_generations", deps=[ingested], kinds={"lance"}, config_schema=FLUSH_CONFIG.schema(table)
    )
    def flushed_generations(context: AssetExecutionContext) -> MaterializeResult:
        """Shards' WAL data not yet in a generation (a crashed or idle writer's), replayed by
        a new writer and flushed into a generation, and each shard's pending generations
        resolved into a stored pending run for readers. Shards with a live writer are not flushed."""
        config = FLUSH_CONFIG.resolve(context, table)
        lsm = open_table(context, table)
        return MaterializeResult(metadata=flush_shards(context, lsm, config, table.name) | version_metadata(lsm))

    return flushed_generations


# ------------------------------------------------------------------------- merge


def merge_shards(
    context: AssetExecutionContext,
    table: "LsmTable",
    shards: list["ShardState"],
    config: MergeConfig,
    table_name: str,
) -> dict[str, Any]:
    """Merge ``shards``' pending generations into the base in one ``compact`` call, then tidy the base.

    Each commit carries every shard it merges; a shard with a pending run is
    merged without joining the base (``join_free_commits``). While a run
    holds the table's writers, their keeper builds runs within seconds: once
    a run is merged, generations still without one wait for the next merge
    (``runs_only``), so merges beside live writers stay join-free.
    """
    from resources.lsm import MaintenancePolicy  # the engine loads when a merge runs, not with the definitions

    live_runs = live_writer_runs(context.instance, table_name, exclude_run_id=context.run.run_id)
    if live_runs:
        context.log.info(f"writer runs in progress {live_runs}: generations without a pending run wait for it")
    shard_ids = [s.shard_id for s in shards]
    result = table.compact(
        shard_ids,
        max_rows_per_pass=config.max_rows_per_pass,
        runs_only=bool(live_runs),
        maintenance=MaintenancePolicy(
            max_deleted_fraction=config.max_deleted_fraction,
            max_rows_rewritten_per_pass=config.max_rows_rewritten_per_pass,
        ),
    )
    bucket = {shard_id: b for b, shard_id in enumerate(table.shard_ids)}
    per_shard = {}
    for merged in result.shards:
        context.log.info(
            f"shard {bucket[merged.shard_id]}: merged generations {list(merged.generations_merged)} "
            f"in {merged.passes} commits, {merged.join_free_passes} join-free ({merged.rows_upserted} upserted, "
            f"{merged.deletes_applied} deletes applied); {merged.pending_generations} pending"
        )
        per_shard[bucket[merged.shard_id]] = _merge_numbers(merged)
    context.log.info(f"{result.rows_deleted} base rows deleted in {result.elapsed_seconds:.2f}s")
    rows = sum(n["rows_upserted"] + n["deletes_applied"] for n in per_shard.values())
    totals = {
        **_sums(per_shard, exclude=("lag_seconds", "compacted_generation", "elapsed_s")),
        "lag_seconds": max((n["lag_seconds"] for n in per_shard.values()), default=0.0),
        "rows_deleted": result.rows_deleted,
        "writer_runs_live": len(live_runs),
        "elapsed_s": round(result.elapsed_seconds, 3),
        "rows_per_s": round(rows / result.elapsed_seconds, 1) if result.elapsed_seconds else 0.0,
        **_maintenance_numbers(context, result.maintenance),
    }
    return shard_metadata(per_shard, totals)


def _maintenance_numbers(context: AssetExecutionContext, done: "BaseMaintenance | None") -> dict[str, float]:
    """What tidying the base after the merge did and took (part of ``elapsed_s``), and the share of the base's
    rows it left deleted (which ``max_deleted_fraction`` bounds); zeros when it did not run."""
    if done is None:
        return {"maintenance_s": 0.0, "fragments_rewritten": 0, "indexes_optimized": 0}
    context.log.info(
        f"base maintenance in {done.elapsed_seconds:.2f}s: {done.fragments_removed} fragments rewritten into "
        f"{done.fragments_added}, indexes {'optimized' if done.indices_optimized else 'up to date'}, "
        f"{done.deleted_fraction:.1%} of the base's rows left deleted"
        + (" (pre-empted by a concurrent commit: the next merge tries again)" if done.skipped_by_conflict else "")
    )
    return {
        "maintenance_s": round(done.elapsed_seconds, 3),
        "fragments_rewritten": done.fragments_removed,
        "indexes_optimized": int(done.indices_optimized),
        "base_deleted_fraction": round(done.deleted_fraction, 4),
    }


def _merge_numbers(shard: "ShardCompaction") -> dict[str, float]:
    rows = shard.rows_upserted + shard.deletes_applied
    return {
        "generations_merged": len(shard.generations_merged),
        "rows_upserted": shard.rows_upserted,
        "deletes_applied": shard.deletes_applied,
        "commits": shard.passes,
        "join_free_commits": shard.join_free_passes,
        "conflicts": shard.conflicts,
        "compacted_generation": shard.compacted_generation,
        "lag_generations": shard.pending_generations,
        "lag_seconds": round(shard.oldest_pending_age_seconds or 0.0, 1),
        "elapsed_s": round(shard.elapsed_seconds, 3),
        "rows_per_s": round(rows / shard.elapsed_seconds, 1) if shard.elapsed_seconds else 0.0,
    }


def _merged_base(table: DeclaredTable, flushed: AssetsDefinition) -> AssetsDefinition:
    @table_asset(
        table,
        "merged_base",
        deps=[flushed],
        kinds={"lance"},
        pool=f"lsm_merge/{table.name}",
        config_schema=MERGE_CONFIG.schema(table),
    )
    def merged_base(context: AssetExecutionContext) -> MaterializeResult:
        """The base table with shards' flushed generations merged in: newest wins, tombstones
        become deletes; each pass a data commit claiming its generations, then the compacted markers
        (idempotent, crash-safe; join-free where pending runs hold the superseded rows).
        The merge guards run first; a failed guard stops the run before anything is merged."""
        config = MERGE_CONFIG.resolve(context, table)
        lsm = open_table(context, table)
        shards = selected_shards(lsm, config.shards)
        enforce_merge_guards(context, lsm, [s.bucket for s in shards], flushed.key)
        metadata = merge_shards(context, lsm, shards, config, table.name)
        return MaterializeResult(metadata=metadata | version_metadata(lsm))

    return merged_base


# ---------------------------------------------------------------------------- gc


def collect_garbage(context: AssetExecutionContext, table: "LsmTable", config: GcConfig) -> dict[str, Any]:
    """Run GC on the table; return bytes and counts reclaimed per kind."""
    result = table.gc(
        orphan_grace_seconds=config.orphan_grace_seconds,
        wal_grace_seconds=config.wal_grace_seconds,
        older_than=timedelta(hours=config.version_retention_hours),
    )
    metadata: dict[str, Any] = {
        "bytes_reclaimed": result.bytes_reclaimed,
        "elapsed_s": round(result.elapsed_seconds, 3),
    }
    for kind, reclaimed in result.by_kind.items():
        metadata[f"{kind}_deleted"] = reclaimed.count
        metadata[f"{kind}_bytes"] = reclaimed.bytes
        context.log.info(f"{kind}: {reclaimed.count} deleted, {reclaimed.bytes} bytes")
    return metadata


def _garbage_collected(table: DeclaredTable, merged: AssetsDefinition) -> AssetsDefinition:
    @table_asset(table, "garbage_collected", deps=[merged], kinds={"lance"}, config_schema=GC_CONFIG.schema(table))
    def garbage_collected(context: AssetExecutionContext) -> MaterializeResult:
        """Storage reclaimed: merged generations no retained base version needs, consumed WAL
        entries, orphan generation directories past their grace period, old base versions, retired pending runs."""
        config = GC_CONFIG.resolve(context, table)
        return MaterializeResult(metadata=collect_garbage(context, open_table(context, table), config))

    return garbage_collected


def maintenance_assets(table: DeclaredTable, ingested: AssetsDefinition) -> list[AssetsDefinition]:
    """``table``'s flush, merge and GC assets, downstream of its ``ingested`` asset."""
    flushed = _flushed_generations(table, ingested)
    merged = _merged_base(table, flushed)
    return [flushed, merged, _garbage_collected(table, merged)]


flushed_generations, merged_base, garbage_collected = maintenance_assets(DEFAULT_TABLE, ingested_changes)


def _sums(per_shard: dict[int, dict[str, float]], exclude: tuple[str, ...] = ()) -> dict[str, float]:
    """Each number summed over the shards (except ``exclude``)."""
    names = [n for numbers in per_shard.values() for n in numbers if n not in exclude]
    return {n: sum(numbers.get(n, 0) for numbers in per_shard.values()) for n in dict.fromkeys(names)}


def _age_seconds(mtime_ns: int | None) -> float | None:
    return None if mtime_ns is None else (time.time_ns() - mtime_ns) / 1e9
