"""``LsmTableIOManager``: downstream assets read the merged view of an LSM table asset.

Upstream assets write through the engine themselves (ingestion, flush, merge),
so :meth:`LsmTableIOManager.handle_output` stores nothing. Loading an input
reads the merged view (fresh: including rows only in a WAL) of the table at
``uri`` and hands it over as the type named by the input's ``lsm/format``
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
"""

from __future__ import annotations

from typing import Any

from dagster import ConfigurableIOManager, InputContext, OutputContext
from pydantic import Field

from .settings import table_uri
from .spark import spark_session

COLUMNS_METADATA = "lsm/columns"
FILTER_METADATA = "lsm/filter"
FORMAT_METADATA = "lsm/format"
FORMATS = ("arrow", "pandas", "spark")


class LsmTableIOManager(ConfigurableIOManager):
    """Loads the merged view of the LSM table at ``uri`` into downstream assets."""

    uri: str = Field(default_factory=table_uri, description="Table URI (env LSM_TABLE_URI).")
    fresh: bool = Field(default=True, description="Include rows durable in a WAL but not yet flushed.")

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
        kind = context.definition_metadata.get(FORMAT_METADATA) or _kind(context.dagster_type.typing_type)
        if kind not in FORMATS:
            raise ValueError(f"{FORMAT_METADATA} must be one of {FORMATS}, not {kind!r}")
        metadata = context.upstream_output.definition_metadata if context.upstream_output else {}
        from .lsm.read.filter_text import checked_filter

        columns = _as_value(metadata.get(COLUMNS_METADATA))
        filter = checked_filter(_as_value(metadata.get(FILTER_METADATA)))
        if kind == "spark":
            value = self._spark_frame(context, columns, filter)
            rows = value.count()
        else:
            from .lsm import LsmTable

            value = LsmTable.open(self.uri).read(columns=columns, filter=filter, fresh=self.fresh)
            rows = value.num_rows
            if kind == "pandas":
                value = value.to_pandas()
        context.add_input_metadata({"row_count": rows, "table_uri": self.uri, "fresh": self.fresh})
        return value

    def _spark_frame(self, context: InputContext, columns: list[str] | None, filter: str | None):
        """A lazy Spark DataFrame of the merged view on the process's Spark session."""
        reader = spark_session().read.format("lance_lsm").option("fresh", str(self.fresh).lower())
        if columns:
            reader = reader.option("columns", ",".join(columns))
        frame = reader.load(self.uri)
        return frame.filter(filter) if filter else frame


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
