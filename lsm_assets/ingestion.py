"""Ingestion: landing files → Spark → shard writers (WAL + MemTable)."""

import time
from typing import TYPE_CHECKING, Any

from dagster import AssetExecutionContext, Config, MaterializeResult, MetadataValue, OpExecutionContext, asset
from pydantic import Field

from resources.lsm.maintenance.policy import BackpressurePolicy
from resources.settings import landing_dir, quarantine_dir
from resources.spark import SparkResource
from resources.table_resource import LsmTableResource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from resources.lsm import LsmTable
    from resources.lsm.ingest.cdc import CdcFormat
    from resources.lsm.ingest.landing import LandingPolicy
    from resources.lsm.spark.ingest import IngestReport


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


class CdcFormatConfig(Config):
    """Landing files holding CDC records (see ``resources/lsm/ingest/cdc.py``)."""

    suffix: str = Field(
        default="", description="File-name suffix these files end with; '' for every file of the landing directory."
    )
    kind: str = Field(default="debezium", description="'debezium' (envelopes) or 'generic' (flat rows).")
    order_by: str = Field(
        default="source.lsn", description="Debezium: dotted path ordering the changes (source.lsn, ts_ms...)."
    )
    op_column: str = Field(default="op", description="Generic: the column holding the operation.")
    delete_values: list[str] = Field(
        default=["d", "D", "delete", "DELETE"], description="Generic: op values meaning delete."
    )
    upsert_values: list[str] = Field(
        default=[], description="Generic: op values meaning upsert (empty: every other value)."
    )
    order_columns: list[str] = Field(default=[], description="Generic: columns ordering the changes.")
    drop_columns: list[str] = Field(default=[], description="Generic: the CDC tool's own columns, dropped.")

    def cdc_format(self) -> "tuple[str, CdcFormat]":
        from resources.lsm.ingest.cdc import CdcFormat

        fmt = CdcFormat(
            self.kind,  # type: ignore[arg-type]  # checked by CdcFormat
            self.order_by,
            self.op_column,
            tuple(self.delete_values),
            tuple(self.upsert_values),
            tuple(self.order_columns),
            tuple(self.drop_columns),
        )
        return self.suffix, fmt


class IngestConfig(Config):
    landing_dir: str = Field(default_factory=landing_dir, description="Landing files (env LSM_LANDING_DIR).")
    quarantine_dir: str = Field(default_factory=quarantine_dir, description="Rejected rows (env LSM_QUARANTINE_DIR).")
    stop_generations: int = Field(
        default=BackpressurePolicy.stop_generations,
        description=("Backpressure: stop ingesting while a shard has this many generations awaiting merge."),
    )
    backpressure: str = Field(
        default=BackpressurePolicy.mode, description="'wait' for merges to catch up, or 'fail' fast."
    )
    max_wait_seconds: float = Field(
        default=BackpressurePolicy.max_wait_seconds, description="Longest backpressure wait before failing."
    )
    landing_retention: str = Field(
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
    changed_files: str = Field(
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

    def backpressure_policy(self) -> BackpressurePolicy:
        if self.backpressure not in ("wait", "fail"):
            raise ValueError(f"backpressure must be 'wait' or 'fail', not {self.backpressure!r}")
        return BackpressurePolicy(self.stop_generations, self.backpressure, self.max_wait_seconds)

    def landing_policy(self) -> "LandingPolicy":
        from resources.lsm.ingest.landing import LandingPolicy

        if self.changed_files not in ("skip", "ingest"):
            raise ValueError(f"changed_files must be 'skip' or 'ingest', not {self.changed_files!r}")
        return LandingPolicy(
            tuple(self.csv_null_markers),
            self.changed_files,  # type: ignore[arg-type]
            self.settle_seconds,
            tuple(c.cdc_format() for c in self.cdc_formats),
            self.auto_evolve,
        )


def write_landing(context: AssetExecutionContext, config: LandingChangesConfig) -> dict[str, Any]:
    """Write the configured change stream into the landing directory; return its metadata."""
    from resources.lsm.testing.changegen import ChangeStreamSpec, write_landing_files

    spec = ChangeStreamSpec(
        num_keys=config.num_keys,
        num_batches=config.num_batches,
        batch_size=config.batch_size,
        update_ratio=config.update_ratio,
        delete_ratio=config.delete_ratio,
        reinsert_ratio=config.reinsert_ratio,
        seed=config.seed,
    )
    prefix = f"changes-{time.time_ns()}"
    batches = write_landing_files(spec, landing_dir(), config.file_format, config.malformed_rows, prefix)
    rows = sum(b.num_rows for b in batches)
    context.log.info(f"wrote {len(batches)} {config.file_format} files ({rows} rows) to {landing_dir()}")
    return {
        "files": len(batches),
        "rows": rows,
        "malformed_rows": config.malformed_rows * len(batches),
        "landing_dir": MetadataValue.path(landing_dir()),
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

    waited = await_merge_capacity(table, config.backpressure_policy(), context.log.warning)
    from resources.lsm.ingest.landing import LandingRetention

    if config.landing_retention not in ("archive", "delete", "keep"):
        raise ValueError(f"landing_retention must be 'archive', 'delete' or 'keep', not {config.landing_retention!r}")
    retention = LandingRetention(config.landing_retention, config.archive_max_age_hours * 3600)  # type: ignore[arg-type]
    report = ingest_landing_files(
        spark,
        table.uri,
        config.landing_dir,
        config.quarantine_dir,
        run_id=context.run.run_id,
        writers=writers,
        max_files=max_files,
        retention=retention,
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
    return {**metadata, **report_metadata(report, table.shard_ids), "backpressure_wait_s": round(waited, 1)}


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


@asset(group_name="ingestion", kinds={"python", "parquet"})
def landing_changes(context: AssetExecutionContext, config: LandingChangesConfig) -> MaterializeResult:
    """A generated change stream written as landing files (upserts, deletes, re-inserts,
    out-of-order ``_seq``, optionally malformed rows), named to sort after earlier ones."""
    return MaterializeResult(metadata=write_landing(context, config))


@asset(group_name="ingestion", deps=[landing_changes], kinds={"spark", "lance"})
def ingested_changes(
    context: AssetExecutionContext, config: IngestConfig, spark: SparkResource, lsm_table: LsmTableResource
) -> MaterializeResult:
    """Every pending landing file, validated, routed by Lance's hash and made durable in
    the shard WALs by Spark tasks (one writer per shard). Bad rows are quarantined with
    file, row and reason; a file is recorded as ingested only after its rows are durable."""
    metadata = ingest(context, config, spark.spark_session, lsm_table.open())
    if not metadata["files"]:
        context.log.info(f"no pending landing files in {config.landing_dir}")
    return MaterializeResult(metadata=metadata)


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
