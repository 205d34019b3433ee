"""``DeclaredTable``: everything the platform knows about one table, before it opens it.

A table is declared in YAML (``tables/<name>/defs.yaml``, loaded by
:mod:`declarations`) or, for the *default table*, by the environment
(``LSM_TABLE_URI``, ``LSM_LANDING_DIR``, ...; :meth:`DeclaredTable.from_environment`).
Each declared table gets its own assets, checks, jobs, schedules, resources,
run tags and concurrency limits, all named from :attr:`DeclaredTable.name`
(:meth:`~DeclaredTable.asset_key`, :meth:`~DeclaredTable.job_name`). The default table keeps the names the
platform had before tables were declared (``ingested_changes``,
``ingest_job``, resource ``lsm_table``), so existing scripts keep working.

Nothing heavy is imported here: the definitions load it for every table.
"""

from __future__ import annotations

import os
import re
from typing import Literal

from dagster import Config
from pydantic import ConfigDict, Field, field_validator, model_validator

from .lsm.declared_schema import check_type_name
from .lsm.maintenance.policy import DEFAULT_MAX_DELETED_FRACTION, DEFAULT_MAX_ROWS_REWRITTEN_PER_PASS
from .settings import (
    DEFAULT_TABLE_URI,
    create_table_if_missing,
    landing_dir,
    num_shards,
    quarantine_dir,
    table_uri,
)

DEFAULT_TABLE_NAME = "default"
"""The environment's table: unprefixed asset keys, job names and resource keys."""

DEFAULT_TABLE_RESOURCE = "lsm_table"
DECLARED_TABLES_RESOURCE = "lsm_tables"

DEFAULT_TABLE_COLUMNS = (("id", "int64"), ("customer", "string"), ("amount", "double"), ("status", "string"))
"""The columns the default table is created with (an existing one keeps its own)."""

TABLE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
"""Table names: they become asset-key prefixes, job names, resource keys and run-tag values."""

LandingRetention = Literal["archive", "delete", "keep"]
ChangedFiles = Literal["skip", "ingest"]
CdcKind = Literal["debezium", "generic"]
BackpressureMode = Literal["wait", "fail"]
MergeEngine = Literal["last-write-wins", "partial-update"]
LANDING_FORMATS = ("parquet", "jsonl", "csv")


class _Section(Config):
    """A declaration section (also usable as run config): unknown fields are errors, so a typo never passes."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ColumnDeclaration(_Section):
    """One column: an Arrow type name (``int64``, ``string``, ``timestamp[us]``, ``float32[128]`` for a
    vector) and whether it may be null (key columns never are)."""

    name: str = Field(description="Column name.")
    type: str = Field(description="Arrow type name, e.g. int64, string, double, timestamp[us], float32[128].")
    nullable: bool = Field(default=True, description="Whether the column may hold nulls (ignored for key columns).")


class CdcFormatConfig(_Section):
    """Landing files holding CDC records instead of rows (see ``resources/lsm/ingest/cdc.py``)."""

    suffix: str = Field(default="", description="File-name suffix of such files; '' for every landing file.")
    kind: CdcKind = Field(default="debezium", description="'debezium' envelopes or 'generic' flat rows.")
    order_by: str = Field(default="source.lsn", description="Debezium: dotted path ordering the changes.")
    op_column: str = Field(default="op", description="Generic: the column holding the operation.")
    delete_values: list[str] = Field(default=["d", "D", "delete", "DELETE"], description="Generic: delete ops.")
    upsert_values: list[str] = Field(default=[], description="Generic: upsert ops (empty: every other value).")
    order_columns: list[str] = Field(default=[], description="Generic: columns ordering the changes.")
    drop_columns: list[str] = Field(default=[], description="Generic: the CDC tool's own columns, dropped.")


class LandingDeclaration(_Section):
    """Where the table's change files land and how they are read."""

    directory: str | None = Field(
        default=None, description="Landing directory (default: <LSM_WAREHOUSE>/<name>.landing)."
    )
    quarantine: str | None = Field(default=None, description="Rejected rows (default: <directory>/_quarantine).")
    formats: list[Literal["parquet", "jsonl", "csv"]] = Field(
        default=list(LANDING_FORMATS), description="File formats taken; other files are reported, never read."
    )
    cdc: list[CdcFormatConfig] = Field(default=[], description="CDC formats, by file-name suffix.")
    csv_null_markers: list[str] = Field(default=[""], description="Unquoted CSV fields read as null.")
    retention: LandingRetention = Field(default="archive", description="What happens to an ingested file.")
    archive_max_age_hours: float = Field(default=168.0, description="Archived files older than this are deleted.")
    changed_files: ChangedFiles = Field(default="skip", description="A file landed again with other content.")
    settle_seconds: float = Field(default=30.0, description="Wait for a CSV/JSONL file without a final newline.")


class FlushDeclaration(_Section):
    """When the flush sensor flushes a shard's WAL (defaults: env ``LSM_FLUSH_TRIGGER_*``, else the engine's)."""

    max_age_seconds: float | None = Field(default=None, description="Flush WAL data older than this.")
    idle_seconds: float | None = Field(default=None, description="...once no write came for this long.")


class MergeDeclaration(_Section):
    """When the merge sensor merges a shard (defaults: env ``LSM_MERGE_TRIGGER_*``, else the engine's)."""

    generations: int | None = Field(default=None, description="Merge at this many pending generations.")
    pending_rows: int | None = Field(default=None, description="...or this many pending rows.")
    max_age_seconds: float | None = Field(default=None, description="...or a generation this old.")


class TriggersDeclaration(_Section):
    flush: FlushDeclaration = FlushDeclaration()
    merge: MergeDeclaration = MergeDeclaration()


class TidyDeclaration(_Section):
    """How a merge tidies the base after merging (``MaintenancePolicy``)."""

    max_deleted_fraction: float = Field(
        default=DEFAULT_MAX_DELETED_FRACTION,
        description=(
            "Rewrite the base's fragments once more than this fraction (0 to 1) of its rows are deleted (every "
            "update deletes its old row). A rewrite costs about 1/fraction base rows per changed row; scans read "
            "the deleted rows until then."
        ),
    )
    max_rows_rewritten_per_pass: int = Field(
        default=DEFAULT_MAX_ROWS_REWRITTEN_PER_PASS,
        description=(
            "Physical rows one tidy-up rewrites at most (at least one group of fragments); the rest wait for the "
            "next merge, so no merge holds the writers for a rewrite of the whole base."
        ),
    )

    @field_validator("max_deleted_fraction")
    @classmethod
    def _a_fraction(cls, fraction: float) -> float:
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"max_deleted_fraction {fraction} must be between 0 and 1 (exclusive)")
        return fraction

    @field_validator("max_rows_rewritten_per_pass")
    @classmethod
    def _some_rows(cls, rows: int) -> int:
        if rows < 1:
            raise ValueError(f"max_rows_rewritten_per_pass {rows} must be at least 1")
        return rows


class GcDeclaration(_Section):
    """Garbage collection: when, and what it keeps."""

    schedule: str | None = Field(default="*/30 * * * *", description="Cron of the GC schedule; null: no schedule.")
    orphan_grace_seconds: float = Field(default=3600.0, description="Keep orphan generations younger than this.")
    wal_grace_seconds: float = Field(default=3600.0, description="Keep consumed WAL entries younger than this.")
    version_retention_hours: float = Field(default=1.0, description="Keep base versions newer than this.")


class QualityDeclaration(_Section):
    """Data-quality checks."""

    schedule: str | None = Field(default=None, description="Cron of the quality schedule; null: checks on demand.")
    sample_rows: int = Field(default=10_000, description="Rows of the merged view the scratch probes start from.")


class DemoDeclaration(_Section):
    """A generated change stream for this table (the ``landing_changes`` asset)."""

    format: Literal["parquet", "jsonl", "csv", "debezium"] = Field(default="parquet", description="File format.")
    num_keys: int = Field(default=20_000, description="Distinct keys in the stream.")
    num_batches: int = Field(default=10, description="Files to write (one batch each).")
    batch_size: int = Field(default=10_000, description="Change rows per file.")


class VectorIndexDeclaration(_Section):
    """An IVF-PQ index on a float32 vector column, for ``LsmTable.search``."""

    column: str
    num_partitions: int = 16
    num_sub_vectors: int = 8
    metric: Literal["l2", "cosine", "dot"] = "l2"


class DeclaredTable(_Section):
    """One table as declared: its location, schema, key and how the platform runs it.

    ``columns`` and ``primary_key`` create the table on first use; with
    ``conform`` an existing table must match them (see
    ``LsmTableResource.open``). The default table does not conform: an
    existing table there keeps its own schema.
    """

    name: str = Field(description="Table name: prefix of its asset keys, job names and tags.")
    uri: str | None = Field(default=None, description="Table URI (default: <LSM_WAREHOUSE>/<name>.lance).")
    columns: list[ColumnDeclaration] = Field(description="The table's columns, in order.")
    primary_key: list[str] = Field(description="Key columns (one or more).")
    shards: int | None = Field(default=None, description="Shards of a new table (default: env LSM_NUM_SHARDS, 4).")
    merge_engine: MergeEngine = Field(
        default="last-write-wins",
        description="last-write-wins: an upsert replaces the row; partial-update: it sets only the columns it gives.",
    )
    vector_index: VectorIndexDeclaration | None = Field(default=None, description="An IVF-PQ vector index.")
    evolve: bool = Field(
        default=False, description="Add nullable columns declared later to the existing table (else: refuse)."
    )
    create: bool | None = Field(default=None, description="Create the table on first use (declared tables: yes).")
    storage_options: dict[str, str] | None = Field(default=None, description="Lance object-store options.")
    landing: LandingDeclaration = LandingDeclaration()
    triggers: TriggersDeclaration = TriggersDeclaration()
    tidy: TidyDeclaration = TidyDeclaration()
    gc: GcDeclaration = GcDeclaration()
    quality: QualityDeclaration = QualityDeclaration()
    demo: DemoDeclaration | None = Field(default=None, description="Add a generated change stream (demo data).")
    conform: bool = Field(
        default=True, description="Refuse an existing table whose schema or key differs from the declaration."
    )
    declaration_file: str | None = Field(default=None, description="The YAML file this came from (set by loading).")

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        if not TABLE_NAME.match(name):
            raise ValueError(f"table name {name!r} must match {TABLE_NAME.pattern} (lower case, digits, _)")
        return name

    @model_validator(mode="after")
    def _valid_schema(self) -> DeclaredTable:
        names = [c.name for c in self.columns]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"columns: duplicate column names {duplicates}")
        if not self.primary_key:
            raise ValueError("primary_key: name at least one column")
        missing = [k for k in self.primary_key if k not in names]
        if missing:
            raise ValueError(f"primary_key: {missing} are not among the declared columns {names}")
        if len(set(self.primary_key)) != len(self.primary_key):
            raise ValueError(f"primary_key: a column is named twice in {self.primary_key}")
        for column in self.columns:
            try:
                check_type_name(column.type)
            except ValueError as error:
                raise ValueError(f"columns: column {column.name!r}: {error}") from None
        required = [c.name for c in self.columns if not c.nullable and c.name not in self.primary_key]
        if self.merge_engine == "partial-update" and required:
            raise ValueError(f"merge_engine: partial-update needs nullable non-key columns; {required} are not")
        return self

    # ------------------------------------------------------------ the default table

    @classmethod
    def from_environment(cls) -> DeclaredTable:
        """The default table: ``LSM_TABLE_URI`` with its own schema, landing in ``LSM_LANDING_DIR``.

        Its locations are read from the environment whenever they are asked for.
        """
        return cls(
            name=DEFAULT_TABLE_NAME,
            columns=[ColumnDeclaration(name=n, type=t) for n, t in DEFAULT_TABLE_COLUMNS],
            primary_key=["id"],
            conform=False,
            demo=DemoDeclaration(),
        )

    @property
    def is_default(self) -> bool:
        return self.name == DEFAULT_TABLE_NAME

    # ------------------------------------------------------------ resolved settings

    @property
    def table_uri(self) -> str:
        if self.uri:
            return self.uri
        return table_uri() if self.is_default else f"{warehouse()}/{self.name}.lance"

    @property
    def num_shards(self) -> int:
        return self.shards or num_shards()

    @property
    def landing_dir(self) -> str:
        if self.landing.directory:
            return self.landing.directory
        return landing_dir() if self.is_default else f"{warehouse()}/{self.name}.landing"

    @property
    def quarantine_dir(self) -> str:
        if self.landing.quarantine:
            return self.landing.quarantine
        return quarantine_dir() if self.is_default else f"{self.landing_dir}/_quarantine"

    @property
    def create_if_missing(self) -> bool:
        """Declared tables are created on first use; the default table under ``LSM_CREATE_TABLE``'s policy."""
        if self.create is not None:
            return self.create
        return create_table_if_missing(self.table_uri) if self.is_default else True

    @property
    def source(self) -> str:
        """Where the declaration comes from, for error messages."""
        return self.declaration_file or f"the environment (LSM_TABLE_URI={self.table_uri})"

    # ------------------------------------------------------------ names

    def asset_key(self, name: str) -> list[str]:
        """The asset key path of this table's asset ``name`` (unprefixed for the default table)."""
        return [name] if self.is_default else [self.name, name]

    @property
    def resource_key(self) -> str:
        """The key of the resource that opens this table: ``lsm_table`` (the default table's own) or
        ``lsm_tables`` (one resource for every declared table, so that a job's run config lists one
        resource, not one per table)."""
        return DEFAULT_TABLE_RESOURCE if self.is_default else DECLARED_TABLES_RESOURCE

    def job_name(self, kind: str) -> str:
        """The name of this table's ``kind`` job (``ingest_job``, ...): ``<name>_<kind>``."""
        return kind if self.is_default else f"{self.name}_{kind}"

    @property
    def group(self) -> str:
        return self.name


def warehouse() -> str:
    """``LSM_WAREHOUSE``: where declared tables without a URI live (default: next to the default table)."""
    return os.environ.get("LSM_WAREHOUSE") or os.path.dirname(DEFAULT_TABLE_URI) + "/tables"
