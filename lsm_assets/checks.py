"""Data-quality checks: primary-key uniqueness, schema conformance, WAL-replay recovery.

Which asset each check guards, and why:

* ``ingested_changes`` — the merged view after an ingestion. Blocking: a run
  that continues to ``flushed_generations`` / ``merged_base`` stops here.
* ``flushed_generations`` — the base table and the shard state a merge will
  read. Blocking: a failed check stops ``merged_base`` in the same run, so a
  broken shard or a base with duplicate keys is never merged into.
  Partitioned runs check only their shard's recovery state.
* ``merged_base`` — probes on a scratch table seeded with a bounded sample
  of the merged view (row-count reconciliation, the SIGKILL recovery drill). Not blocking: they test the
  write path, not the data a downstream asset would read.

The checks are unpartitioned (the base table and the merged view are not per
shard), so ``quality_job`` runs them all. The engine modules they call are
imported when a check runs, not with the definitions.
"""

import secrets
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    Config,
    Failure,
    MetadataValue,
    multi_asset_check,
)
from pydantic import Field

from resources.declared_table import DeclaredTable
from resources.gx_resource import GreatExpectationsResource

from .table_context import DEFAULT_TABLE, GX_RESOURCE, StepConfig, open_table

if TYPE_CHECKING:
    import pandas as pd

    from resources.lsm import LsmTable

INGESTED = "ingested_changes"
FLUSHED = "flushed_generations"
MERGED = "merged_base"
CHECKED_ASSETS = (INGESTED, FLUSHED, MERGED)
"""The assets a table's checks are on (``quality_job`` selects their checks)."""


# ------------------------------------------------------------ primary keys


@dataclass(frozen=True)
class KeyCheck:
    """A GX expectation on the primary-key columns of one level of the table."""

    name: str
    asset: str
    level: Literal["merged_view", "base"]
    expectation: Literal["keys_unique", "keys_not_null"]
    description: str

    def evaluate(self, table: "LsmTable", gx: GreatExpectationsResource) -> AssetCheckResult:
        """The check's result on ``table``'s level."""
        streamed = self._streamed(table, gx)
        if streamed is not None:
            return streamed
        frame = getattr(gx, f"{self.level}_frame")(table, table.primary_key)
        outcome = getattr(gx, self.expectation)(frame, table.primary_key)
        return AssetCheckResult(passed=outcome.success, metadata=outcome.metadata())

    def _streamed(self, table: "LsmTable", gx: GreatExpectationsResource) -> AssetCheckResult | None:
        """The result from the key column streamed through a bitmap, for a large level with a
        single integer key (``None``: validate with GX)."""
        import pyarrow as pa

        from resources.lsm.quality.key_stats import integer_key_stats

        key_type = table.schema.field(table.primary_key[0]).type
        if (
            not gx.stream_integer_keys
            or len(table.primary_key) > 1
            or not pa.types.is_integer(key_type)
            or key_type == pa.uint64()  # values past int64 would wrap
            or table.dataset().count_rows() <= gx.spark_row_threshold
        ):
            return None
        batches = (
            table.scanner(table.primary_key)
            if self.level == "merged_view"
            else table.dataset().to_batches(columns=table.primary_key)
        )
        stats = integer_key_stats(batches, sample_size=gx.sample_size)
        if stats is None:
            return None
        unique = self.expectation == "keys_unique"
        return AssetCheckResult(
            passed=stats.unique if unique else stats.not_null,
            metadata={
                "backend": "arrow",
                "rows": stats.rows,
                "duplicate_keys" if unique else "null_keys": stats.duplicates if unique else stats.nulls,
                "offending_keys_sample": MetadataValue.json(stats.sample if unique else []),
            },
        )


KEY_CHECKS = [
    KeyCheck(
        "merged_view_primary_key_unique",
        INGESTED,
        "merged_view",
        "keys_unique",
        "Every primary key (single or composite) occurs exactly once in the merged view "
        "(base + pending generations + WAL tail). GX uniqueness expectation; Spark for large tables.",
    ),
    KeyCheck(
        "merged_view_primary_key_not_null",
        INGESTED,
        "merged_view",
        "keys_not_null",
        "No primary-key column of the merged view holds a null (GX not-null expectation).",
    ),
    KeyCheck(
        "base_primary_key_unique",
        FLUSHED,
        "base",
        "keys_unique",
        "Every primary key occurs exactly once in the base table, before generations are merged into it "
        "(GX; Spark reads the base fragments when the table is large).",
    ),
    KeyCheck(
        "base_primary_key_not_null",
        FLUSHED,
        "base",
        "keys_not_null",
        "No primary-key column of the base table holds a null (GX not-null expectation).",
    ),
]


def _conformance(table: "LsmTable", gx: GreatExpectationsResource) -> AssetCheckResult:
    """The ``schema_conforms`` result for ``table``."""
    from resources.lsm.quality.recovery_checks import verify_shards

    problems = _key_problems(table)
    columns = table.schema.names
    levels = [f.message for s in verify_shards(table.handle) for f in s.errors if "columns" in f.message]
    metadata = {
        "columns": MetadataValue.json(columns),
        "types": MetadataValue.json({f.name: str(f.type) for f in table.schema}),
        "primary_key": MetadataValue.json(table.primary_key),
        "key_problems": MetadataValue.json(problems),
        "level_problems": MetadataValue.json(levels),
    }
    try:
        outcome = gx.columns_match(_merged_view_head(table), columns)
    except (ValueError, OSError) as error:  # a level that does not conform can make the view unreadable
        return AssetCheckResult(passed=False, metadata={**metadata, "merged_view_error": str(error)})
    return AssetCheckResult(
        passed=outcome.success and not problems and not levels, metadata={**outcome.metadata(), **metadata}
    )


def _merged_view_head(table: "LsmTable") -> "pd.DataFrame":
    """The merged view's first batch as pandas: its columns in bounded memory.

    Reading it resolves every pending level, so a level that does not
    conform fails here as it would fail a reader.
    """
    import pyarrow as pa

    reader = table.scanner()
    try:
        head = [reader.read_next_batch()]
    except StopIteration:
        head = []
    finally:
        reader.close()
    return pa.Table.from_batches(head, schema=reader.schema).to_pandas()


def _key_problems(table: "LsmTable") -> list[str]:
    """How the base schema's key metadata differs from the key the table was created with."""
    from resources.lsm.format.schema import primary_key_of

    declared = primary_key_of(table.schema)
    problems = (
        []
        if declared == table.primary_key
        else [f"fields with primary-key metadata {declared} differ from the table's key {table.primary_key}"]
    )
    return problems + [
        f"key column {name!r} is nullable" for name in table.primary_key if table.schema.field(name).nullable
    ]


# ------------------------------------------------------------ shard state


def _recoverable(table: "LsmTable", buckets: list[int] | None = None) -> AssetCheckResult:
    """The ``shards_recoverable`` result for ``buckets`` (all shards when ``None``)."""
    from resources.lsm.quality.recovery_checks import Severity, verify_shards

    shards = verify_shards(table.handle, buckets)
    findings = [f for s in shards for f in s.findings]
    failed = any(f.severity is Severity.ERROR for f in findings)
    return AssetCheckResult(
        passed=not failed,
        severity=AssetCheckSeverity.ERROR if failed else AssetCheckSeverity.WARN,
        metadata={
            "shards": len(shards),
            "generations_verified": sum(s.generations_verified for s in shards),
            "wal_entries_verified": sum(s.wal_entries_verified for s in shards),
            "rows_to_replay": sum(s.wal_rows for s in shards),
            "orphan_directories": sum(len(s.orphan_directories) for s in shards),
            "findings": MetadataValue.json(
                [
                    {"bucket": s.bucket, "check": f.check, "severity": f.severity.value, "message": f.message}
                    for s in shards
                    for f in s.findings
                ]
            ),
        },
    )


# ------------------------------------------------- probes on a scratch sample


class ScratchConfig(Config):
    scratch_dir: str | None = Field(default=None, description="Where to build the scratch table (default: a temp dir).")
    seed: int | None = Field(default=None, description="Random seed (default: a fresh one, reported).")
    # resources.lsm.quality.scratch.DEFAULT_SAMPLE_ROWS (a test keeps them equal).
    sample_rows: int = Field(
        default=10_000,
        description="Rows of the merged view the scratch table starts from: the probe's memory and time "
        "follow this, not the table's size.",
    )


class DrillCheckConfig(ScratchConfig):
    # The defaults of resources.lsm.quality.recovery_drill.DrillConfig (a test
    # keeps them equal); not imported from there, as that module loads Lance.
    batches: int = Field(default=24, description="Change batches the killed writer is given.")
    batch_size: int = Field(default=40, description="Keys per batch.")
    batches_per_generation: int = Field(default=3, description="Batches between the writer's flushes.")


DRILL_CHECK_CONFIG = StepConfig(DrillCheckConfig, lambda table: {"sample_rows": table.quality.sample_rows})


def _reconciliation(table: "LsmTable", config: ScratchConfig) -> AssetCheckResult:
    """The ``row_count_reconciles`` result for ``table``."""
    from resources.lsm.quality.reconciliation import probe_reconciliation
    from resources.lsm.quality.scratch import scratch_sample

    seed = _seed(config.seed)
    with tempfile.TemporaryDirectory(dir=config.scratch_dir, prefix="lsm-reconcile-") as scratch:
        sample = scratch_sample(table, f"{scratch}/table.lance", config.sample_rows)
        steps = probe_reconciliation(sample, seed=seed)
    metadata = {"seed": seed, "sample_rows": config.sample_rows}
    for step in steps:
        metadata.update(
            {
                f"{step.step}_rows_before": step.rows_before,
                f"{step.step}_rows_after": step.rows_after,
                f"{step.step}_expected_change": step.expected_change,
                f"{step.step}_actual_change": step.actual_change,
            }
        )
    return AssetCheckResult(passed=all(s.passed for s in steps), metadata=metadata)


def _drill(table: "LsmTable", config: DrillCheckConfig) -> AssetCheckResult:
    """The ``recovery_drill`` result for ``table``."""
    from resources.lsm.quality.recovery_drill import DrillConfig, run_drill

    drill = DrillConfig(
        batches=config.batches,
        batch_size=config.batch_size,
        batches_per_generation=config.batches_per_generation,
        seed=_seed(config.seed),
        sample_rows=config.sample_rows,
    )
    with tempfile.TemporaryDirectory(dir=config.scratch_dir, prefix="lsm-drill-") as scratch:
        report = run_drill(table, scratch, drill)
    return AssetCheckResult(
        passed=report.passed,
        metadata={
            "seed": report.seed,
            "sample_rows": config.sample_rows,
            "killed": report.killed,
            "killed_after_s": report.killed_after_seconds,
            "batches_acknowledged": report.batches_acknowledged,
            "batches_total": report.batches_total,
            "in_flight_batch": -1 if report.in_flight_batch is None else report.in_flight_batch,
            "in_flight_keys_applied": report.in_flight_keys_applied,
            "rows_replayed": report.rows_replayed,
            "batches_only_in_wal": report.batches_only_in_wal,
            "generations_merged": report.generations_merged,
            "keys_verified": report.keys_verified,
            "deleted_keys_verified": report.deleted_keys_verified,
            "rows_before": report.rows_before,
            "rows_after": report.rows_after,
            "verdict": "passed" if report.passed else "failed",
            "findings_before_recovery": MetadataValue.json(list(report.findings_before_recovery)),
            "violations": MetadataValue.json(list(report.violations[:50])),
        },
    )


def _seed(seed: int | None) -> int:
    return secrets.randbelow(2**31) if seed is None else seed


# ------------------------------------------------------------ per table


@dataclass(frozen=True)
class TableCheck:
    """One data-quality check of a table: the asset it guards, whether it blocks, how it is evaluated.

    ``evaluate`` takes the opened table, the GX resource and the probes' config
    (run config of the step, for checks that are ``configured``).
    """

    name: str
    asset: str
    description: str
    evaluate: Callable[["LsmTable", GreatExpectationsResource, DrillCheckConfig], AssetCheckResult]
    blocking: bool = False
    configured: bool = False


def _key_check(check: KeyCheck) -> TableCheck:
    return TableCheck(check.name, check.asset, check.description, lambda t, gx, _: check.evaluate(t, gx), True)


CHECKS = [
    *map(_key_check, KEY_CHECKS[:2]),
    TableCheck(
        "schema_conforms",
        INGESTED,
        "The table's declared key is exactly the fields with Lance primary-key metadata, non-nullable; "
        "the merged view has the table's columns in order (GX); every pending generation and unflushed "
        "WAL entry has the table's columns and types plus _tombstone.",
        lambda table, gx, _: _conformance(table, gx),
        blocking=True,
    ),
    *map(_key_check, KEY_CHECKS[2:]),
    TableCheck(
        "shards_recoverable",
        FLUSHED,
        "WAL-replay recovery per shard: manifest versions contiguous and increasing; every generation "
        "above the compacted marker listed, opening, with the manifest's physical row count; WAL entries "
        "after the replay position contiguous, readable Arrow IPC, epochs <= the shard's. Orphan "
        "directories warn.",
        lambda table, _gx, _config: _recoverable(table),
        blocking=True,
    ),
    TableCheck(
        "row_count_reconciles",
        MERGED,
        "Row-count reconciliation on a scratch table seeded with a sample of the merged view: its view "
        "grows by exactly inserted - deleted keys when a generated change batch is ingested, and does not "
        "change when it is flushed and merged.",
        lambda table, _gx, config: _reconciliation(table, config),
        configured=True,
    ),
    TableCheck(
        "recovery_drill",
        MERGED,
        "Recovery drill on a scratch table seeded with a sample of the merged view: a writer process is "
        "SIGKILLed at a random moment; the shards are replayed, flushed and merged across at least three "
        "generations; every acknowledged change is present exactly once, deleted keys stay deleted, the "
        "in-flight batch is applied atomically per key or not at all.",
        lambda table, _gx, config: _drill(table, config),
        configured=True,
    ),
]
"""Every table's checks, in the order a quality run evaluates them."""


def table_checks(table: DeclaredTable) -> list[AssetChecksDefinition]:
    """``table``'s data-quality checks: one definition (one step) per checked asset.

    A step per asset, not per check, keeps a table's definitions few (each
    costs the code location's load time); a run may still select single
    checks, and a blocking check still stops its asset's downstream steps.
    """
    return [_asset_checks(table, asset) for asset in CHECKED_ASSETS]


def _asset_checks(table: DeclaredTable, asset: str) -> AssetChecksDefinition:
    """The step evaluating ``table``'s checks on ``asset`` (those a run selected)."""
    key = AssetKey(table.asset_key(asset))
    checks = {c.name: c for c in CHECKS if c.asset == asset}
    specs = [AssetCheckSpec(c.name, asset=key, description=c.description, blocking=c.blocking) for c in checks.values()]
    configured = any(c.configured for c in checks.values())

    @multi_asset_check(
        name=table.job_name(f"{asset}_checks"),
        specs=specs,
        can_subset=True,
        required_resource_keys={table.resource_key, GX_RESOURCE},
        config_schema=DRILL_CHECK_CONFIG.schema(table) if configured else None,
    )
    def asset_checks(context: AssetCheckExecutionContext) -> Iterator[AssetCheckResult]:
        config = DRILL_CHECK_CONFIG.resolve(context, table)
        lsm = open_table(context, table)
        for name in (n for n in checks if AssetCheckKey(key, n) in context.selected_asset_check_keys):
            yield checks[name].evaluate(lsm, context.resources.gx, config)._replace(asset_key=key, check_name=name)

    return asset_checks


def _check_key(name: str) -> AssetCheckKey:
    """The default table's check ``name``."""
    (check,) = (c for c in CHECKS if c.name == name)
    return AssetCheckKey(AssetKey(DEFAULT_TABLE.asset_key(check.asset)), name)


all_checks = table_checks(DEFAULT_TABLE)
"""The default table's checks."""
merged_view_primary_key_unique = _check_key("merged_view_primary_key_unique")
merged_view_primary_key_not_null = _check_key("merged_view_primary_key_not_null")
schema_conforms = _check_key("schema_conforms")
base_primary_key_unique = _check_key("base_primary_key_unique")
base_primary_key_not_null = _check_key("base_primary_key_not_null")
shards_recoverable = _check_key("shards_recoverable")
row_count_reconciles = _check_key("row_count_reconciles")
recovery_drill = _check_key("recovery_drill")

# ------------------------------------------------------------- merge guards

MERGE_GUARDS = ("base_primary_key_unique", "base_primary_key_not_null", "shards_recoverable")
"""Blocking checks that must pass before a merge into the base."""


def enforce_merge_guards(
    context: AssetExecutionContext, table: "LsmTable", buckets: list[int] | None, flushed: AssetKey
) -> None:
    """Evaluate the :data:`MERGE_GUARDS`, scoped to the change, and record them on ``flushed_generations``.

    The key checks cover the rows appended to the base since the last merge
    (:mod:`resources.lsm.quality.base_guard`: the base is probed through its
    key index, never scanned, and GX is not loaded); recovery covers
    ``buckets``. They show in the UI like any other evaluation of those checks.

    Raises
    ------
    Failure
        If a guard failed: nothing may be merged.
    """
    results = {**_appended_key_guards(table), "shards_recoverable": _recoverable(table, buckets)}
    for name, result in results.items():
        context.log_event(
            AssetCheckEvaluation(
                asset_key=flushed,
                check_name=name,
                passed=result.passed,
                metadata=result.metadata,
                severity=result.severity,
                blocking=True,
            )
        )
    failed = sorted(name for name, result in results.items() if not result.passed)
    if failed:
        raise Failure(
            description=f"merge guards failed: {', '.join(failed)}; nothing was merged "
            "(see the check evaluations on flushed_generations)"
        )


def _appended_key_guards(table: "LsmTable") -> dict[str, AssetCheckResult]:
    """The base key checks over the rows appended since the last merge."""
    from resources.lsm.quality.base_guard import verify_appended_keys

    found = verify_appended_keys(table.handle)
    scope = {
        "scope": "rows appended to the base since the last merge",
        "versions_read": found.versions,
        "rows_checked": found.rows_checked,
        "rows_left_to_quality_job": found.rows_unchecked,
    }
    return {
        "base_primary_key_unique": AssetCheckResult(
            passed=found.keys_unique,
            metadata={
                **scope,
                "duplicate_keys": found.duplicate_keys,
                "offending_keys_sample": MetadataValue.json([list(k) for k in found.duplicate_sample]),
            },
        ),
        "base_primary_key_not_null": AssetCheckResult(
            passed=found.keys_not_null,
            metadata={
                **scope,
                "null_keys": found.null_keys,
                "nullable_key_columns": MetadataValue.json(list(found.nullable_key_columns)),
            },
        ),
    }
