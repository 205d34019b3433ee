"""Maintenance: flush MemTables, merge generations into the base, collect garbage.

``flushed_generations`` and ``merged_base`` are partitioned by shard (bucket
number), so sensors request exactly the shards that need work and the UI plots
lag per shard. ``flush_all_shards`` / ``merge_all_shards`` do the same work for
every shard in one run (``flush_job`` / ``merge_job``, e.g. from the CLI) and
record it as materializations of the same partitions.
"""

import time
from datetime import timedelta
from typing import Callable

from dagster import (AssetExecutionContext, AssetKey, AssetMaterialization, Config, In, MaterializeResult, Nothing,
                     OpExecutionContext,
                     StaticPartitionsDefinition, asset, op)
from pydantic import Field

from resources.lsm import LsmTable
from resources.lsm.maintenance.compaction import DEFAULT_MAX_ROWS_PER_PASS, ShardCompaction
from resources.lsm.maintenance.gc import DEFAULT_GRACE_SECONDS
from resources.settings import num_shards
from resources.table_resource import LsmTableResource

from .ingestion import ingested_changes
from .live_writers import live_writer_runs

shard_partitions = StaticPartitionsDefinition([str(bucket) for bucket in range(num_shards())])


class FlushConfig(Config):
    idle_seconds: float = Field(default=30.0, description=(
        "Skip a shard whose WAL was written this recently: a writer may be live."))


class MergeConfig(Config):
    max_rows_per_pass: int = Field(default=DEFAULT_MAX_ROWS_PER_PASS,
                                   description="Rows read from generations per merge commit.")


class GcConfig(Config):
    orphan_grace_seconds: float = Field(default=DEFAULT_GRACE_SECONDS,
                                        description="Keep orphan generation directories younger than this.")
    wal_grace_seconds: float = Field(default=DEFAULT_GRACE_SECONDS,
                                     description="Keep consumed WAL entries younger than this.")
    version_retention_hours: float = Field(default=1.0, description="Keep base versions newer than this.")


# ------------------------------------------------------------------------- flush

def flush_shard(context, table: LsmTable, bucket: int, config: FlushConfig) -> dict:
    """Flush one shard's unflushed WAL into a generation unless a writer may be live.

    Returns the metadata to record (``flushed`` is 0 when the shard was skipped).
    """
    state = table.shards()[bucket]
    live_runs = live_writer_runs(context.instance, exclude_run_id=context.run.run_id)
    last_write_age = _age_seconds(state.unflushed_wal_last_mtime_ns)
    if live_runs:
        context.log.info(f"shard {bucket}: skipped, writer runs in progress: {live_runs}")
        skipped = True
    elif last_write_age is not None and last_write_age < config.idle_seconds:
        context.log.info(f"shard {bucket}: skipped, WAL written {last_write_age:.1f}s ago (writer may be live)")
        skipped = True
    else:
        skipped = False
        if state.unflushed_wal_entries:
            table.flush(state.shard_id)
            context.log.info(f"shard {bucket}: flushed {state.unflushed_wal_entries} WAL entries "
                             f"({state.unflushed_wal_bytes} bytes) into a new generation")
    after = table.shards()[bucket]
    return {
        "flushed": int(not skipped and state.unflushed_wal_entries > 0),
        "wal_entries_flushed": 0 if skipped else state.unflushed_wal_entries,
        "wal_bytes_flushed": 0 if skipped else state.unflushed_wal_bytes,
        "unflushed_wal_entries": after.unflushed_wal_entries,
        "pending_generations": len(after.pending_generations),
    }


@asset(partitions_def=shard_partitions, group_name="maintenance", deps=[ingested_changes], kinds={"lance"})
def flushed_generations(context: AssetExecutionContext, config: FlushConfig,
                        lsm_table: LsmTableResource) -> MaterializeResult:
    """A shard's WAL data not yet in a generation (a crashed or idle writer's), replayed by
    a new writer and flushed into a generation. Shards with a live writer are skipped."""
    return MaterializeResult(metadata=flush_shard(context, lsm_table.open(), int(context.partition_key), config))


@op(required_resource_keys={"lsm_table"}, ins={"after": In(Nothing)})
def flush_all_shards(context: OpExecutionContext, config: FlushConfig) -> None:
    """Flush every shard (skipping live writers), recorded per shard partition."""
    _for_every_shard(context, flushed_generations.key, lambda table, bucket: flush_shard(context, table, bucket, config))


# ------------------------------------------------------------------------- merge

def merge_shards(context, table: LsmTable, shard: str | None, config: MergeConfig) -> dict[int, dict]:
    """Merge one shard's (or every shard's) pending generations into the base; metadata by bucket.

    One ``compact`` call: each commit carries every shard it merges, so the
    base is joined against once per pass, not once per shard.
    """
    result = table.compact(shard, max_rows_per_pass=config.max_rows_per_pass)
    bucket = {shard_id: b for b, shard_id in enumerate(table.shard_ids)}
    for merged in result.shards:
        context.log.info(
            f"shard {bucket[merged.shard_id]}: merged generations {list(merged.generations_merged)} "
            f"in {merged.passes} commits ({merged.rows_upserted} upserted, {merged.deletes_applied} deletes "
            f"applied); {merged.pending_generations} pending")
    context.log.info(f"{result.rows_deleted} base rows deleted in {result.elapsed_seconds:.2f}s")
    return {bucket[merged.shard_id]: _merge_metadata(merged) for merged in result.shards}


def _merge_metadata(shard: ShardCompaction) -> dict:
    rows = shard.rows_upserted + shard.deletes_applied
    return {
        "generations_merged": len(shard.generations_merged),
        "rows_upserted": shard.rows_upserted,
        "deletes_applied": shard.deletes_applied,
        "rows_per_s": round(rows / shard.elapsed_seconds, 1) if shard.elapsed_seconds else 0.0,
        "commits": shard.passes,
        "conflicts": shard.conflicts,
        "compacted_generation": shard.compacted_generation,
        "lag_generations": shard.pending_generations,
        "lag_seconds": round(shard.oldest_pending_age_seconds or 0.0, 1),
        "elapsed_s": round(shard.elapsed_seconds, 3),
    }


@asset(partitions_def=shard_partitions, group_name="maintenance", deps=[flushed_generations],
       kinds={"lance"}, pool="lsm_merge")
def merged_base(context: AssetExecutionContext, config: MergeConfig,
                lsm_table: LsmTableResource) -> MaterializeResult:
    """The base table with a shard's flushed generations merged in: newest wins, tombstones
    become deletes, data and the compacted marker in one commit (idempotent, crash-safe)."""
    table = lsm_table.open()
    bucket = int(context.partition_key)
    return MaterializeResult(metadata=merge_shards(context, table, table.shard_ids[bucket], config)[bucket])


@op(required_resource_keys={"lsm_table"}, ins={"after": In(Nothing)})
def merge_all_shards(context: OpExecutionContext, config: MergeConfig) -> None:
    """Merge every shard into the base, recorded per shard partition."""
    metadata = merge_shards(context, context.resources.lsm_table.open(), None, config)
    for bucket, shard_metadata in sorted(metadata.items()):
        context.log_event(AssetMaterialization(merged_base.key, partition=str(bucket), metadata=shard_metadata))


# ---------------------------------------------------------------------------- gc

def collect_garbage(context, table: LsmTable, config: GcConfig) -> dict:
    """Run GC on the table; return bytes and counts reclaimed per kind."""
    result = table.gc(orphan_grace_seconds=config.orphan_grace_seconds,
                      wal_grace_seconds=config.wal_grace_seconds,
                      older_than=timedelta(hours=config.version_retention_hours))
    metadata: dict = {"bytes_reclaimed": result.bytes_reclaimed, "elapsed_s": round(result.elapsed_seconds, 3)}
    for kind in ("compacted_generations", "wal_entries", "orphan_directories", "base_versions"):
        reclaimed = getattr(result, kind)
        metadata[f"{kind}_deleted"] = reclaimed.count
        metadata[f"{kind}_bytes"] = reclaimed.bytes
        context.log.info(f"{kind}: {reclaimed.count} deleted, {reclaimed.bytes} bytes")
    return metadata


@asset(group_name="maintenance", deps=[merged_base], kinds={"lance"})
def garbage_collected(context: AssetExecutionContext, config: GcConfig,
                      lsm_table: LsmTableResource) -> MaterializeResult:
    """Storage reclaimed: merged generations no retained base version needs, consumed WAL
    entries, orphan generation directories past their grace period, old base versions."""
    return MaterializeResult(metadata=collect_garbage(context, lsm_table.open(), config))


def _for_every_shard(context: OpExecutionContext, asset_key: AssetKey,
                     work: Callable[[LsmTable, int], dict]) -> None:
    """Run ``work`` on each shard in turn, recording its metadata on that shard's partition."""
    table = context.resources.lsm_table.open()
    for bucket in range(table.num_shards):
        context.log_event(AssetMaterialization(asset_key, partition=str(bucket), metadata=work(table, bucket)))


def _age_seconds(mtime_ns: int | None) -> float | None:
    return None if mtime_ns is None else (time.time_ns() - mtime_ns) / 1e9
