"""Ingestion: landing files → Spark → shard writers (WAL + MemTable)."""

import time

from dagster import (AssetExecutionContext, AssetMaterialization, Config, MaterializeResult, MetadataValue, OpExecutionContext,
                     asset, op)
from dagster_pyspark import PySparkResource
from pydantic import Field

from resources.lsm import LsmTable
from resources.lsm.maintenance.backpressure import BackpressurePolicy, await_merge_capacity
from resources.lsm.testing.changegen import ChangeStreamSpec, write_landing_files
from resources.lsm.spark.ingest import IngestReport, ingest_landing_files
from resources.region_writer import RegionWriterResource
from resources.settings import landing_dir, quarantine_dir
from resources.table_resource import LsmTableResource


class LandingChangesConfig(Config):
    num_keys: int = Field(default=20_000, description="Distinct keys in the stream.")
    num_batches: int = Field(default=10, description="Files to write (one batch each).")
    batch_size: int = Field(default=10_000, description="Change rows per file.")
    update_ratio: float = Field(default=0.5, description="Share of rows rewriting existing keys.")
    delete_ratio: float = Field(default=0.1, description="Share of rows deleting existing keys.")
    reinsert_ratio: float = Field(default=0.05, description="Share of rows bringing deleted keys back.")
    malformed_rows: int = Field(default=0, description="Rows per file that ingestion must quarantine.")
    file_format: str = Field(default="parquet", description="parquet, jsonl or csv.")
    seed: int = Field(default=7, description="Random seed.")


class IngestConfig(Config):
    landing_dir: str = Field(default_factory=landing_dir, description="Landing files (env LSM_LANDING_DIR).")
    quarantine_dir: str = Field(default_factory=quarantine_dir,
                                description="Rejected rows (env LSM_QUARANTINE_DIR).")
    stop_generations: int = Field(default=BackpressurePolicy.stop_generations, description=(
        "Backpressure: stop ingesting while a shard has this many generations awaiting merge."))
    backpressure: str = Field(default=BackpressurePolicy.mode,
                              description="'wait' for merges to catch up, or 'fail' fast.")
    max_wait_seconds: float = Field(default=BackpressurePolicy.max_wait_seconds,
                                    description="Longest backpressure wait before failing.")

    def backpressure_policy(self) -> BackpressurePolicy:
        if self.backpressure not in ("wait", "fail"):
            raise ValueError(f"backpressure must be 'wait' or 'fail', not {self.backpressure!r}")
        return BackpressurePolicy(self.stop_generations, self.backpressure, self.max_wait_seconds)


def write_landing(context, config: LandingChangesConfig) -> dict:
    """Write the configured change stream into the landing directory; return its metadata."""
    spec = ChangeStreamSpec(num_keys=config.num_keys, num_batches=config.num_batches,
                            batch_size=config.batch_size, update_ratio=config.update_ratio,
                            delete_ratio=config.delete_ratio, reinsert_ratio=config.reinsert_ratio,
                            seed=config.seed)
    prefix = f"changes-{time.time_ns()}"
    batches = write_landing_files(spec, landing_dir(), config.file_format, config.malformed_rows, prefix)
    rows = sum(b.num_rows for b in batches)
    context.log.info(f"wrote {len(batches)} {config.file_format} files ({rows} rows) to {landing_dir()}")
    return {"files": len(batches), "rows": rows, "malformed_rows": config.malformed_rows * len(batches),
            "landing_dir": MetadataValue.path(landing_dir())}


def ingest(context, config: IngestConfig, spark, table: LsmTable) -> dict:
    """Ingest every pending landing file with Spark (after backpressure); return the metadata."""
    waited = await_merge_capacity(table, config.backpressure_policy(), context.log.warning)
    report = ingest_landing_files(spark, table.uri, config.landing_dir, config.quarantine_dir,
                                  run_id=context.run.run_id)
    log_report(context, report, table.shard_ids)
    return {**report_metadata(report, table.shard_ids), "backpressure_wait_s": round(waited, 1)}


@asset(group_name="ingestion", kinds={"python", "parquet"})
def landing_changes(context: AssetExecutionContext, config: LandingChangesConfig) -> MaterializeResult:
    """A generated change stream written as landing files (upserts, deletes, re-inserts,
    out-of-order ``_seq``, optionally malformed rows), named to sort after earlier ones."""
    return MaterializeResult(metadata=write_landing(context, config))


@asset(group_name="ingestion", deps=[landing_changes], kinds={"spark", "lance"})
def ingested_changes(context: AssetExecutionContext, config: IngestConfig, pyspark: PySparkResource,
                     lsm_table: LsmTableResource) -> MaterializeResult:
    """Every pending landing file, validated, routed by Lance's hash and made durable in
    the shard WALs by Spark tasks (one writer per shard). Bad rows are quarantined with
    file, row and reason; a file is recorded as ingested only after its rows are durable."""
    return MaterializeResult(metadata=ingest(context, config, pyspark.spark_session, lsm_table.open()))


class ContinuousIngestConfig(IngestConfig):
    poll_seconds: float = Field(default=5.0, description="Pause between looks at the landing directory.")
    max_files_per_batch: int = Field(default=20, description="Files per micro-batch.")
    stop_after_idle_polls: int = Field(default=0, description="Stop after this many empty polls (0: never).")


@op(required_resource_keys={"region_writers", "pyspark"})
def ingest_continuously(context: OpExecutionContext, config: ContinuousIngestConfig) -> None:
    """Ingest landing files as they arrive until the run is terminated.

    Spark stages each micro-batch (read, validate, route, sort); its rows are
    written here through region writers that stay open for the whole run, so no
    generation is cut per micro-batch. On termination or failure the resource
    flushes and closes them.
    """
    writers: RegionWriterResource = context.resources.region_writers
    spark = context.resources.pyspark.spark_session
    idle = batches = 0
    while not config.stop_after_idle_polls or idle < config.stop_after_idle_polls:
        await_merge_capacity(writers.table, config.backpressure_policy(), context.log.warning)
        report = ingest_landing_files(spark, writers.table.uri, config.landing_dir, config.quarantine_dir,
                                      run_id=context.run.run_id, writers=writers.table,
                                      max_files=config.max_files_per_batch)
        if not report.files:
            idle += 1
            time.sleep(config.poll_seconds)
            continue
        idle, batches = 0, batches + 1
        log_report(context, report, writers.table.shard_ids)
        # Each micro-batch shows up as a materialization of the ingested table.
        context.log_event(AssetMaterialization(asset_key=ingested_changes.key,
                                               metadata=report_metadata(report, writers.table.shard_ids)))
    context.log.info(f"stopping after {batches} micro-batches; closing writers")


def log_report(context, report: IngestReport, shard_ids: list[str]) -> None:
    """One line per shard plus a summary: progress an operator can follow."""
    bucket = {s: b for b, s in enumerate(shard_ids)}
    for shard in sorted(report.shards, key=lambda s: bucket[s.shard_id]):
        context.log.info(f"shard {bucket[shard.shard_id]}: {shard.upserts} upserts, {shard.deletes} deletes, "
                         f"{shard.wal_bytes} WAL bytes in {shard.write_seconds:.2f}s")
    context.log.info(f"{len(report.files)} files, {report.rows_read} rows read, {report.rows_quarantined} "
                     f"quarantined, {report.rows_per_second:,.0f} rows/s")


def report_metadata(report: IngestReport, shard_ids: list[str]) -> dict:
    """Numbers for the UI's plots, per shard and in total."""
    bucket = {s: b for b, s in enumerate(shard_ids)}
    metadata = {
        "files": len(report.files),
        "rows_read": report.rows_read,
        "upserts": report.upserts,
        "deletes": report.deletes,
        "rows_quarantined": report.rows_quarantined,
        "wal_bytes": sum(s.wal_bytes for s in report.shards),
        "elapsed_s": round(report.elapsed_seconds, 3),
        "rows_per_s": round(report.rows_per_second, 1),
    }
    for shard in report.shards:
        metadata[f"shard_{bucket[shard.shard_id]}_rows"] = shard.upserts + shard.deletes
    if report.quarantine_path:
        metadata["quarantine_path"] = MetadataValue.path(report.quarantine_path)
    return metadata
