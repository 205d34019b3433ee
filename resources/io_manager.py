"""``LsmTableIOManager``: downstream assets read the merged view of an LSM table asset.

Upstream assets write through the engine themselves (ingestion, flush, merge),
so :meth:`LsmTableIOManager.handle_output` stores nothing. Loading an input
reads the merged view (fresh: including rows only in a WAL) of the upstream
asset's table: a declared table's for its assets (``orders/ingested_changes``
reads ``orders``), else the default table at ``uri``, and hands it over as
the type named by the input's ``lsm/format``
metadata (``AssetIn(..., metadata={"lsm/format": "pandas"})``) or, without
it, the type the input is annotated with:

================================  =============================================
format / annotation               value
================================  =============================================
``arrow``, ``pyarrow.Table``  ``LsmTable.read()`` (also without annotation)
``pandas``, ``pandas.DataFrame``  the same, converted to pandas
``spark``, ``pyspark...DataFrame``  ``spark.read.format("lance_lsm").load(uri)``
================================  =============================================

The format key keeps pandas out of the code location's import: an annotation
must be a real type when Dagster loads the definitions.

Asset metadata can narrow a read: ``{"lsm/columns": [...], "lsm/filter": "..."}``
on the upstream asset's definition.

Incremental consumers: an input with ``{"lsm/read": "changes"}`` metadata (or
annotated :class:`TableChanges`) gets only what changed since the consuming
asset last materialized, as a :class:`TableChanges` (the change feed,
``LsmTable.changes``). The cursor is the table version the consumer last read
up to, kept in the consumer's own materialization metadata
(:meth:`TableChanges.cursor_metadata`, which the asset must return): a run
that fails records nothing, so its re-run reads the same changes again. The
first run gets the whole view, as upserts.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dagster import AssetKey, ConfigurableIOManager, DagsterInstance, InputContext, OutputContext, ResourceDependency
from pydantic import Field

from .settings import table_uri
from .spark import spark_session
from .table_resource import DeclaredTables

if TYPE_CHECKING:
    import pyarrow as pa

    from .lsm import LsmTable

COLUMNS_METADATA = "lsm/columns"
FILTER_METADATA = "lsm/filter"
FORMAT_METADATA = "lsm/format"
FORMATS = ("arrow", "pandas", "spark")
READ_METADATA = "lsm/read"
"""``"view"`` (default: the merged view) or ``"changes"`` (:class:`TableChanges`)."""
CHANGES_CURSOR = "lsm/changes_until"
"""The consumer's materialization metadata: the table version its last read of changes went up to."""


@dataclass(frozen=True)
class TableChanges:
    """What changed in a table since the consuming asset last materialized.

    ``rows`` is the net change per key (the table's columns plus ``_op``:
    ``upsert`` with the newest values, ``delete`` with the key), as Arrow or
    pandas. ``since`` is the version read from (``None`` on the first run:
    ``rows`` is then the whole view, as upserts), ``until`` the version read
    up to. Return :meth:`cursor_metadata` in the consumer's materialization.
    """

    rows: Any
    since: str | None
    until: str
    table: "LsmTable"

    def previous(self, columns: list[str] | None = None) -> "pa.Table":
        """The rows the changed keys had at ``since`` (their previous values; empty on the first run)."""
        table = self.table
        keys = self.rows[table.primary_key] if hasattr(self.rows, "iloc") else self.rows.select(table.primary_key)
        if self.since is None or len(keys) == 0:
            return table.schema.empty_table().select(columns or table.schema.names)
        return table.lookup(keys, columns, as_of=self.since)

    def cursor_metadata(self) -> dict[str, str]:
        """The metadata the consuming asset returns, so that its next run reads on from ``until``."""
        return {CHANGES_CURSOR: self.until}


class LsmTableIOManager(ConfigurableIOManager):
    """Loads the merged view of an upstream asset's LSM table into downstream assets."""

    uri: str = Field(default_factory=table_uri, description="The default table's URI (env LSM_TABLE_URI).")
    fresh: bool = Field(default=True, description="Include rows durable in a WAL but not yet flushed.")
    tables: ResourceDependency[DeclaredTables] = Field(
        default_factory=lambda: DeclaredTables([]),
        description="The declared tables (the lsm_tables resource): an asset prefixed by one reads that table.",
    )

    def handle_output(self, context: OutputContext, obj: Any) -> None:
        """Accept ``None`` (or a ``MaterializeResult``'s empty output): the data is already in the table.

        Raises
        ------
        TypeError
            If the asset returned data: write it through ``LsmTable.write`` instead.
        """
        if obj is not None:
            raise TypeError(
                f"{context.asset_key.to_user_string()} returned {type(obj).__name__}; assets of "
                "an LSM table write through LsmTable.write and return None or MaterializeResult"
            )

    def load_input(self, context: InputContext) -> Any:
        """The merged view in the requested format, with its row count as input metadata."""
        if _reads_changes(context):
            return self._changes(context)
        kind = context.definition_metadata.get(FORMAT_METADATA) or _kind(context.dagster_type.typing_type)
        if kind not in FORMATS:
            raise ValueError(f"{FORMAT_METADATA} must be one of {FORMATS}, not {kind!r}")
        metadata = context.upstream_output.definition_metadata if context.upstream_output else {}
        from .lsm.read.filter_text import checked_filter

        columns = _as_value(metadata.get(COLUMNS_METADATA))
        filter = checked_filter(_as_value(metadata.get(FILTER_METADATA)))
        table = self._open(context)
        if kind == "spark":
            value = self._spark_frame(table, columns, filter)
            rows = value.count()
        else:
            value = table.read(columns=columns, filter=filter, fresh=self.fresh)
            rows = value.num_rows
            if kind == "pandas":
                value = value.to_pandas()
        context.add_input_metadata({"row_count": rows, "table_uri": table.uri, "fresh": self.fresh})
        return value

    def _open(self, context: InputContext) -> "LsmTable":
        """The upstream asset's table: the declared table its key is prefixed by, else the default table."""
        path = context.asset_key.path if context.has_asset_key else []
        declared = self.tables.get(path[0]) if len(path) > 1 else None
        if declared is not None:
            return declared.open()
        from .lsm import LsmTable

        return LsmTable.open(self.uri)

    def _changes(self, context: InputContext) -> TableChanges:
        """The change feed since the consuming asset's cursor (the whole view as upserts without one)."""
        import pyarrow as pa

        kind = context.definition_metadata.get(FORMAT_METADATA) or "arrow"
        if kind not in ("arrow", "pandas"):
            raise ValueError(f"changes are read as arrow or pandas, not {kind!r}")
        consumer = context.step_context.assets_def
        if consumer is None:
            raise TypeError(f"{READ_METADATA}='changes' is for inputs of assets (the cursor is the asset's)")
        cursor = last_materialized_value(context.instance, consumer.key, CHANGES_CURSOR)
        since = None if cursor is None else str(cursor)
        table = self._open(context)
        until = table.version()
        if since is None:
            view = table.read(as_of=until)
            rows = view.append_column("_op", pa.array(["upsert"] * view.num_rows, pa.string()))
        else:
            rows = table.changes(since, until).read_all()
        context.add_input_metadata({"changed_rows": rows.num_rows, "since": since or "", "until": str(until)})
        return TableChanges(rows.to_pandas() if kind == "pandas" else rows, since, str(until), table)

    def _spark_frame(self, table: "LsmTable", columns: list[str] | None, filter: str | None):
        """A lazy Spark DataFrame of ``table``'s merged view on the process's Spark session."""
        reader = spark_session().read.format("lance_lsm").option("fresh", str(self.fresh).lower())
        for key, value in (table.storage_options or {}).items():
            reader = reader.option(f"storage.{key}", value)
        if columns:
            reader = reader.option("columns", ",".join(columns))
        frame = reader.load(table.uri)
        return frame.filter(filter) if filter else frame


def _reads_changes(context: InputContext) -> bool:
    """Whether the input asks for the change feed (by metadata, or by its :class:`TableChanges` annotation)."""
    wanted = _as_value(context.definition_metadata.get(READ_METADATA)) or "view"
    if wanted not in ("view", "changes"):
        raise ValueError(f"{READ_METADATA} must be 'view' or 'changes', not {wanted!r}")
    return wanted == "changes" or context.dagster_type.typing_type is TableChanges


def last_materialized_value(instance: DagsterInstance, asset: AssetKey, name: str) -> Any:
    """Metadata entry ``name`` of ``asset``'s latest materialization (``None``: none, or no such entry).

    What an incremental asset carries from run to run: the change feed's
    cursor, an aggregate's state. A failed run materializes nothing, so its
    re-run finds what the last successful one left.
    """
    event = instance.get_latest_materialization_event(asset)
    materialization = event.asset_materialization if event else None
    entry = materialization.metadata.get(name) if materialization else None
    return None if entry is None else _as_value(entry)


def _kind(annotation: Any) -> str:
    """``"arrow"``, ``"pandas"`` or ``"spark"`` for an input's Python type."""
    module = getattr(annotation, "__module__", "") or ""
    if module.startswith("pandas"):
        return "pandas"
    if module.startswith("pyspark"):
        return "spark"
    if module.startswith("pyarrow") and getattr(annotation, "__name__", "") == "Table":
        return "arrow"
    if annotation in (Any, object):
        return "arrow"
    raise TypeError(f"LsmTableIOManager cannot load an input of type {annotation!r}")


def _as_value(entry: Any) -> Any:
    """A definition-metadata entry's raw value (Dagster wraps dicts' values)."""
    return getattr(entry, "value", entry)
