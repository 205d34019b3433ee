"""Ingestion: landing files → Spark → shard writers (WAL + MemTable)."""

import time
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Literal

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetsDefinition,
    Config,
    MaterializeResult,
    MetadataValue,
    OpExecutionContext,
)
from dagster._core.errors import DagsterExecutionInterruptedError
from pydantic import Field

from resources.declared_table import (
    LANDING_FORMATS,
    BackpressureMode,
    CdcFormatConfig,
    ChangedFiles,
    DeclaredTable,
    DemoDeclaration,
    LandingRetention,
)
from resources.lsm.maintenance.policy import BackpressurePolicy
from resources.region_writer import WriterSession, claimed_writers
from resources.settings import landing_dir, quarantine_dir

from .table_context import (
    DEFAULT_TABLE,
    SPARK_RESOURCE,
    StepConfig,
    open_table,
    table_asset,
    table_resource,
    version_metadata,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from resources.lsm import LsmTable
    from resources.lsm.ingest.landing import LandingPolicy, LandingRetention as LandingRetentionPolicy
    from resources.lsm.maintenance.pending_runs import KeeperStats
    from resources.lsm.spark.ingest import IngestReport


class LandingChangesConfig(Config):
    num_keys: int = Field(default=20_000, description="Distinct keys in the stream.")
    num_batches: int = Field(default=10, description="Files to write (one batch each).")
    batch_size: int = Field(default=10_000, description="Change rows per file.")
    update_ratio: float = Field(default=0.5, description="Share of rows rewriting existing keys.")
    delete_ratio: float = Field(default=0.1, description="Share of rows deleting existing keys.")
    reinsert_ratio: float = Field(default=0.05, description="Share of rows bringing deleted keys back.")
    malformed_rows: int = Field(default=0, description="Rows per file that ingestion must quarantine.")
    partial_ratio: float = Field(
        default=0.25, description="Share of upserts that set only some columns (partial-update tables only)."
    )
    file_format: Literal["parquet", "jsonl", "csv", "debezium"] = Field(
        default="parquet", description="parquet, jsonl, csv, or debezium (JSON Lines of Debezium envelopes)."
    )
    seed: int = Field(default=7, description="Random seed.")


class IngestConfig(Config):
    landing_dir: str = Field(default_factory=landing_dir, description="Landing files (env LSM_LANDING_DIR).")
    quarantine_dir: str = Field(default_factory=quarantine_dir, description="Rejected rows (env LSM_QUARANTINE_DIR).")
    stop_generations: int = Field(
        default=BackpressurePolicy.stop_generations,
        description=("Backpressure: stop ingesting while a shard has this many generations awaiting merge."),
    )
    backpressure: BackpressureMode = Field(
        default=BackpressurePolicy.mode, description="'wait' for merges to catch up, or 'fail' fast."
    )
    max_wait_seconds: float = Field(
        default=BackpressurePolicy.max_wait_seconds, description="Longest backpressure wait before failing."
    )
    landing_retention: LandingRetention = Field(
        default="archive",
        description=(
            "What happens to a landing file once its rows are durable and it is recorded: 'archive' (moved to "
            "_archive/ in the landing directory), 'delete', or 'keep'."
        ),
    )
    archive_max_age_hours: float = Field(
        default=168.0, description="Archived landing files older than this are deleted."
    )
    csv_null_markers: list[str] = Field(
        default=[""],
        description="Unquoted CSV fields read as null (default: the empty field only; NA, null, nan stay text).",
    )
    changed_files: ChangedFiles = Field(
        default="skip",
        description=(
            "A file landed again under an ingested name with another size is always reported; 'skip' leaves it "
            "in place, 'ingest' ingests it again."
        ),
    )
    settle_seconds: float = Field(
        default=30.0,
        description="A CSV/JSONL file not ending with a newline is taken once unmodified this long.",
    )
    formats: list[str] = Field(
        default=list(LANDING_FORMATS),
        description="Landing file formats taken (parquet, jsonl, csv); files of another format are reported as "
        "unsupported, never read.",
    )
    cdc_formats: list[CdcFormatConfig] = Field(
        default=[],
        description="Landing files of CDC records (Debezium, generic), by file-name suffix ('' = all files).",
    )
    auto_evolve: bool = Field(
        default=False,
        description=(
            "Add columns landing files hold and the table lacks (nullable; fences writers, flushes and merges "
            "first) instead of quarantining the rows that hold values in them."
        ),
    )
    continuous: bool = Field(
        default=False,
        description=(
            "Keep the shard writers open and ingest landing files as they arrive, in micro-batches, until the "
            "run is terminated (or idle `stop_after_idle_polls` polls); then flush and close the writers."
        ),
    )
    poll_seconds: float = Field(default=5.0, description="Continuous: pause between looks at the landing directory.")
    max_files_per_batch: int = Field(default=20, description="Continuous: files per micro-batch.")
    stop_after_idle_polls: int = Field(
        default=0, description="Continuous: stop after this many empty polls in a row (0: never)."
    )

    def backpressure_policy(self) -> BackpressurePolicy:
        return BackpressurePolicy(self.stop_generations, self.backpressure, self.max_wait_seconds)

    def landing_policy(self) -> "LandingPolicy":
        from resources.lsm.ingest.cdc import CdcFormat
        from resources.lsm.ingest.landing import LandingPolicy

        unknown = sorted(set(self.formats) - set(LANDING_FORMATS))
        if unknown:
            raise ValueError(f"formats: {unknown} are not landing formats; use some of {list(LANDING_FORMATS)}")
        cdc_formats = tuple(
            (
                c.suffix,
                CdcFormat(
                    c.kind,
                    c.order_by,
                    c.op_column,
                    tuple(c.delete_values),
                    tuple(c.upsert_values),
                    tuple(c.order_columns),
                    tuple(c.drop_columns),
                ),
            )
            for c in self.cdc_formats
        )
        return LandingPolicy(
            tuple(self.csv_null_markers),
            self.changed_files,
            self.settle_seconds,
            cdc_formats,
            self.auto_evolve,
            tuple(self.formats),
        )

    def landing_retention_policy(self) -> "LandingRetentionPolicy":
        from resources.lsm.ingest.landing import LandingRetention as LandingRetentionPolicy

        return LandingRetentionPolicy(self.landing_retention, self.archive_max_age_hours * 3600)


def ingest_defaults(table: DeclaredTable) -> dict[str, Any]:
    """``table``'s declared landing settings, as :class:`IngestConfig` defaults."""
    landing = table.landing
    return {
        "landing_dir": table.landing_dir,
        "quarantine_dir": table.quarantine_dir,
        "landing_retention": landing.retention,
        "archive_max_age_hours": landing.archive_max_age_hours,
        "csv_null_markers": landing.csv_null_markers,
        "changed_files": landing.changed_files,
        "settle_seconds": landing.settle_seconds,
        "cdc_formats": landing.cdc,
        "formats": landing.formats,
    }


def write_landing(
    context: AssetExecutionContext, config: LandingChangesConfig, directory: str, table: "LsmTable"
) -> dict[str, Any]:
    """Write the configured change stream of ``table``'s columns into ``directory``; return its metadata."""
    from resources.lsm.testing.changegen import ChangeStreamSpec, write_table_landing_files

    spec = ChangeStreamSpec(
        num_keys=config.num_keys,
        num_batches=config.num_batches,
        batch_size=config.batch_size,
        update_ratio=config.update_ratio,
        delete_ratio=config.delete_ratio,
        reinsert_ratio=config.reinsert_ratio,
        seed=config.seed,
        partial_ratio=config.partial_ratio if table.merge_engine == "partial-update" else 0.0,
    )
    batches = write_table_landing_files(
        table.schema,
        table.primary_key,
        spec,
        directory,
        config.file_format,
        malformed_per_file=config.malformed_rows,
        prefix=f"changes-{time.time_ns()}",
        storage_options=table.storage_options,
    )
    rows = sum(b.num_rows for b in batches)
    context.log.info(f"wrote {len(batches)} {config.file_format} files ({rows} rows) to {directory}")
    return {
        "files": len(batches),
        "rows": rows,
        "malformed_rows": config.malformed_rows * len(batches),
        "landing_dir": MetadataValue.path(directory),
    }


def ingest(
    context: AssetExecutionContext | OpExecutionContext,
    config: IngestConfig,
    spark: "SparkSession",
    table: "LsmTable",
    max_files: int | None = None,
    writers: "LsmTable | None" = None,
) -> dict[str, Any]:
    """Ingest pending landing files with Spark after backpressure; log per shard and return the metadata.

    ``files`` in the metadata is 0 when no file was pending; files rejected
    whole, changed, incomplete or unsupported files and a missing landing
    directory are logged as warnings and listed in the metadata.

    ``writers``: a table object whose open writers the rows go through (a
    continuous run's); by default Spark's write tasks open their own.
    """
    from resources.lsm.maintenance.backpressure import await_merge_capacity
    from resources.lsm.spark.ingest import ingest_landing_files

    waited = await_merge_capacity(table.handle, config.backpressure_policy(), context.log.warning)
    # Staging is the writers' work too: their keeper builds runs in the pauses between micro-batches.
    with writers.handle.write_activity.writing() if writers is not None else nullcontext():
        report = ingest_landing_files(
            spark,
            table.uri,
            config.landing_dir,
            config.quarantine_dir,
            run_id=context.run.run_id,
            writers=writers,
            max_files=max_files,
            retention=config.landing_retention_policy(),
            storage_options=table.storage_options,
            policy=config.landing_policy(),
        )
    problems = landing_problems(report, config.landing_dir)
    for problem in problems.values():
        context.log.warning(problem)
    metadata = {"files": 0, **_problem_metadata(report)}
    if report.columns_added:
        context.log.warning(f"auto_evolve added columns {list(report.columns_added)} to the table")
        metadata["columns_added"] = MetadataValue.json(list(report.columns_added))
    if report.quarantine_path:
        metadata["quarantine_path"] = MetadataValue.path(report.quarantine_path)
    if not report.files:
        return metadata
    log_report(context, report, table.shard_ids)
    if writers is None:  # the write tasks closed their writers: each cut a generation
        metadata |= _build_pending_runs(context, table)
    return {**metadata, **report_metadata(report, table.shard_ids), "backpressure_wait_s": round(waited, 1)}


def ingest_until_stopped(
    context: AssetExecutionContext | OpExecutionContext, config: IngestConfig, table: DeclaredTable
) -> dict[str, Any]:
    """Ingest landing files as they arrive through shard writers held open for the whole run; the run's totals.

    Spark stages each micro-batch (read, validate, route, sort); its rows are
    written here through region writers that stay open for the whole run, so no
    generation is cut per micro-batch. Each micro-batch is recorded as a
    materialization of the table's ``ingested_changes``. The generations the
    writers cut get their pending runs within seconds, built beside the writers
    (never fencing them). Terminating the run is a planned stop: the current
    micro-batch is either recorded or left for the next run, the writers are
    flushed and closed, and this returns normally.
    """
    ingested = AssetKey(table.asset_key("ingested_changes"))
    with claimed_writers(table_resource(context, table), context.log) as session:
        totals = _micro_batches(context, config, context.resources.spark.spark_session, session, ingested)
    return totals | pending_run_metadata(session.runs)


_TOTALS = ("files", "rows_read", "upserts", "deletes", "rows_quarantined", "wal_bytes")
"""The numbers of a micro-batch's metadata that a continuous run sums."""


def _micro_batches(
    context: AssetExecutionContext | OpExecutionContext,
    config: IngestConfig,
    spark: "SparkSession",
    session: WriterSession,
    ingested: AssetKey,
) -> dict[str, int]:
    table = session.table
    totals = dict.fromkeys(("micro_batches", *_TOTALS), 0)
    idle = 0
    try:
        while not config.stop_after_idle_polls or idle < config.stop_after_idle_polls:
            metadata = ingest(context, config, spark, table, max_files=config.max_files_per_batch, writers=table)
            if not metadata["files"]:
                idle += 1
                time.sleep(config.poll_seconds)
                continue
            idle = 0
            totals["micro_batches"] += 1
            for key in _TOTALS:
                totals[key] += metadata[key]
            metadata |= pending_run_metadata(session.runs) | version_metadata(table)
            context.log_event(AssetMaterialization(asset_key=ingested, metadata=metadata))
    except (DagsterExecutionInterruptedError, KeyboardInterrupt):
        # Terminate in the UI raises the first, Ctrl-C on the CLI the second:
        # both are an operator's planned stop, not a failure.
        context.log.info(f"stop requested after {totals['micro_batches']} micro-batches; closing writers")
        return totals
    context.log.info(f"idle for {idle} polls after {totals['micro_batches']} micro-batches; closing writers")
    return totals


def _build_pending_runs(context: AssetExecutionContext | OpExecutionContext, table: "LsmTable") -> dict[str, Any]:
    """Build the runs of the generations the ingestion cut, so reads never join keys for them.

    A shard a merge holds a lease on is left to that merge, which builds its
    runs as it ends. The rows are durable and recorded already: a failure
    here is logged, and the flush sensor builds the runs at its next tick.
    """
    from resources.lsm.maintenance.pending_runs import PendingRunKeeper

    keeper = PendingRunKeeper(table.handle, report=context.log.warning)
    keeper.keep_up()
    return {} if keeper.stats.errors else pending_run_metadata(keeper.stats)


def pending_run_metadata(stats: "KeeperStats") -> dict[str, Any]:
    """What building the pending runs of a run's generations did, as materialization metadata."""
    return {
        "pending_runs_built": stats.runs_built,
        "pending_run_build_s": round(stats.busy_seconds, 2),
        "pending_run_max_delay_s": round(stats.max_delay_seconds, 2),
        "pending_run_longest_round_s": round(stats.longest_round_seconds, 2),
        "pending_run_rounds_beside_writes": stats.rounds_beside_writes,
        "pending_run_shards_left_to_merges": stats.shards_left_to_merges,
    }


def landing_problems(report: "IngestReport", landing_dir: str) -> dict[str, str]:
    """One warning per kind of landing problem the report holds (empty when there is none)."""
    scan = report.scan
    lines = {
        "landing_dir_missing": f"landing directory {landing_dir} does not exist; nothing to ingest"
        if scan.landing_dir_missing
        else "",
        "files_rejected": _listing("files rejected whole (quarantined, recorded)", report.files_rejected),
        "files_changed": _listing("files landed again with other content", scan.changed),
        "files_incomplete": _listing(
            "files still being written, left for the next run", dict.fromkeys(scan.incomplete, "incomplete")
        ),
        "files_unsupported": _listing("entries in the landing directory that are not ingested", scan.unsupported),
    }
    return {key: line for key, line in lines.items() if line}


def _listing(title: str, reasons: dict[str, str]) -> str:
    return f"{len(reasons)} {title}: " + "; ".join(f"{n}: {r}" for n, r in reasons.items()) if reasons else ""


def _problem_metadata(report: "IngestReport") -> dict[str, Any]:
    scan = report.scan
    metadata: dict[str, Any] = {}
    if scan.landing_dir_missing:
        metadata["landing_dir_missing"] = True
    for key, reasons in (
        ("files_rejected", report.files_rejected),
        ("files_changed", scan.changed),
        ("files_incomplete", dict.fromkeys(scan.incomplete, "still being written")),
        ("files_unsupported", scan.unsupported),
    ):
        if reasons:
            metadata[key] = MetadataValue.json(reasons)
    return metadata


def ingestion_assets(table: DeclaredTable) -> list[AssetsDefinition]:
    """``table``'s ingestion assets: ``ingested_changes``, after ``landing_changes`` when it has demo data."""
    landing = [_landing_changes(table)] if table.demo else []
    return [*landing, _ingested_changes(table, deps=landing)]


def _demo_defaults(table: DeclaredTable) -> dict[str, Any]:
    """``table``'s declared demo stream, as :class:`LandingChangesConfig` defaults."""
    demo = table.demo or DemoDeclaration()
    return {
        "num_keys": demo.num_keys,
        "num_batches": demo.num_batches,
        "batch_size": demo.batch_size,
        "file_format": demo.format,
    }


LANDING_CHANGES_CONFIG = StepConfig(LandingChangesConfig, _demo_defaults)
INGEST_CONFIG = StepConfig(IngestConfig, ingest_defaults)


def _landing_changes(table: DeclaredTable) -> AssetsDefinition:
    @table_asset(
        table, "landing_changes", kinds={"python", "parquet"}, config_schema=LANDING_CHANGES_CONFIG.schema(table)
    )
    def landing_changes(context: AssetExecutionContext) -> MaterializeResult:
        """A generated change stream of the table's columns written as landing files (upserts, deletes,
        re-inserts, out-of-order ``_seq``, optionally malformed rows), named to sort after earlier ones."""
        config = LANDING_CHANGES_CONFIG.resolve(context, table)
        return MaterializeResult(metadata=write_landing(context, config, table.landing_dir, open_table(context, table)))

    return landing_changes


def _ingested_changes(table: DeclaredTable, deps: list[AssetsDefinition]) -> AssetsDefinition:
    @table_asset(
        table,
        "ingested_changes",
        deps=deps,
        kinds={"spark", "lance"},
        resources=[SPARK_RESOURCE],
        config_schema=INGEST_CONFIG.schema(table),
    )
    def ingested_changes(context: AssetExecutionContext) -> MaterializeResult:
        """Every pending landing file, validated, routed by Lance's hash and made durable in
        the shard WALs by Spark tasks (one writer per shard). Bad rows are quarantined with
        file, row and reason; a file is recorded as ingested only after its rows are durable.
        With ``continuous: true`` the run keeps the writers open and ingests files as they
        land, a materialization per micro-batch, until it is terminated; its last
        materialization sums the run."""
        config = INGEST_CONFIG.resolve(context, table)
        if config.continuous:
            metadata = ingest_until_stopped(context, config, table)
            return MaterializeResult(metadata=metadata | version_metadata(open_table(context, table)))
        lsm = open_table(context, table)
        metadata = ingest(context, config, context.resources.spark.spark_session, lsm)
        if not metadata["files"]:
            context.log.info(f"no pending landing files in {config.landing_dir}")
        return MaterializeResult(metadata=metadata | version_metadata(lsm))

    return ingested_changes


landing_changes, ingested_changes = ingestion_assets(DEFAULT_TABLE)


def log_report(
    context: AssetExecutionContext | OpExecutionContext, report: "IngestReport", shard_ids: list[str]
) -> None:
    """One line per shard plus a summary: progress an operator can follow."""
    bucket = {s: b for b, s in enumerate(shard_ids)}
    for shard in sorted(report.shards, key=lambda s: bucket[s.shard_id]):
        context.log.info(
            f"shard {bucket[shard.shard_id]}: {shard.upserts} upserts, {shard.deletes} deletes, "
            f"{shard.wal_bytes} WAL bytes in {shard.write_seconds:.2f}s"
        )
    context.log.info(
        f"{len(report.files)} files, {report.rows_read} rows read, {report.rows_quarantined} "
        f"quarantined, {report.rows_per_second:,.0f} rows/s"
    )


def report_metadata(report: "IngestReport", shard_ids: list[str]) -> dict[str, Any]:
    """Numbers for the UI's plots, per shard and in total."""
    bucket = {s: b for b, s in enumerate(shard_ids)}
    metadata: dict[str, Any] = {
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
    return metadata
