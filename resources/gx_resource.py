"""``GreatExpectationsResource``: Great Expectations 1.x validations of an LSM table.

An ephemeral GX context (nothing written to disk) holds a pandas and a Spark
data source. Small frames are validated with pandas; a level with more rows
than ``spark_row_threshold`` is read by Spark tasks and validated with GX's
Spark data source, so no process loads the whole table.

Great Expectations takes seconds to import, so it is imported by the first
validation, not with the code location's definitions.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dagster import ConfigurableResource, MetadataValue
from pydantic import Field, PrivateAttr

from .spark import spark_session

if TYPE_CHECKING:
    from .lsm import LsmTable


@dataclass(frozen=True)
class GxOutcome:
    """The result of one GX validation, reduced to what a check reports.

    ``offending`` samples the values (keys) that failed any expectation.
    """

    success: bool
    backend: str
    rows: int
    statistics: dict[str, Any]
    expectations: dict[str, dict[str, Any]]
    offending: list

    def metadata(self) -> dict[str, Any]:
        """Dagster metadata: GX statistics, per-expectation counts, a sample of offending keys."""
        return {
            "backend": self.backend,
            "rows": self.rows,
            **{f"gx_{k}": v for k, v in self.statistics.items()},
            "gx_results": MetadataValue.json(self.expectations),
            "offending_keys_sample": MetadataValue.json(self.offending),
        }


class GreatExpectationsResource(ConfigurableResource):
    """Validates LSM table levels with an ephemeral GX context."""

    spark_row_threshold: int = Field(
        default=1_000_000, description=("Levels with more rows than this are validated on Spark instead of pandas.")
    )
    sample_size: int = Field(default=20, description="Offending values reported per expectation.")
    stream_integer_keys: bool = Field(
        default=True,
        description=(
            "Check a single integer primary key of a level over spark_row_threshold rows by streaming it "
            "through a bitmap of seen keys (bounded memory, no Spark); keys spread too thinly for that, "
            "and other keys, are validated with GX on Spark."
        ),
    )
    _context: Any = PrivateAttr(default=None)
    _names: Any = PrivateAttr(default_factory=itertools.count)

    # ------------------------------------------------------------------ frames

    def base_frame(self, table: LsmTable, columns: list[str]):
        """``columns`` of the base table: pandas when small, else a Spark DataFrame."""
        if table.dataset().count_rows() <= self.spark_row_threshold:
            return table.dataset().to_table(columns=columns).to_pandas()
        from .lsm.spark.frames import base_frame

        return base_frame(self._spark(), table, columns)

    def merged_view_frame(self, table: LsmTable, columns: list[str]):
        """``columns`` of the merged view: pandas when small, else a Spark DataFrame.

        The size is estimated from the base and the pending generations; the
        unflushed WAL tail is bounded by the MemTable size.
        """
        pending = sum(len(s.pending_generations) for s in table.shards())
        estimate = table.dataset().count_rows() + pending * int(table.writer_config.get("max_memtable_rows", 0) or 0)
        if estimate <= self.spark_row_threshold:
            return table.read(columns=columns).to_pandas()
        from .lsm.spark.frames import merged_view_frame

        return merged_view_frame(self._spark(), table, columns)

    # ------------------------------------------------------------- validation

    def keys_unique(self, frame, primary_key: list[str]) -> GxOutcome:
        """Every primary key occurs once (compound-key expectation for composite keys)."""
        import great_expectations.expectations as gxe

        expectation = (
            gxe.ExpectColumnValuesToBeUnique(column=primary_key[0])
            if len(primary_key) == 1
            else gxe.ExpectCompoundColumnsToBeUnique(column_list=primary_key)
        )
        return self.validate(frame, [expectation])

    def keys_not_null(self, frame, primary_key: list[str]) -> GxOutcome:
        """No primary-key column holds a null."""
        import great_expectations.expectations as gxe

        return self.validate(frame, [gxe.ExpectColumnValuesToNotBeNull(column=c) for c in primary_key])

    def columns_match(self, frame, columns: list[str]) -> GxOutcome:
        """The frame has exactly ``columns``, in order."""
        import great_expectations.expectations as gxe

        return self.validate(frame, [gxe.ExpectTableColumnsToMatchOrderedList(column_list=columns)])

    def validate(self, frame, expectations: list) -> GxOutcome:
        """Run ``expectations`` on a pandas or Spark DataFrame in the ephemeral context."""
        import great_expectations as gx
        import pandas as pd

        spark = not isinstance(frame, pd.DataFrame)
        context = self._gx()
        name = f"v{next(self._names)}"
        source = self._source(context, "spark" if spark else "pandas")
        batch = source.add_dataframe_asset(name).add_batch_definition_whole_dataframe(name)
        suite = context.suites.add(gx.ExpectationSuite(name, expectations=expectations))
        validation = context.validation_definitions.add(gx.ValidationDefinition(name=name, data=batch, suite=suite))
        if spark:
            # GX computes each metric as its own Spark job; without a cache every
            # job would read the table again. Persisting spills to disk when large.
            frame = frame.persist()
        try:
            result = validation.run(
                batch_parameters={"dataframe": frame},
                result_format={"result_format": "SUMMARY", "partial_unexpected_count": self.sample_size},
            )
            rows = frame.count() if spark else len(frame)
        finally:
            if spark:
                frame.unpersist()
        outcomes = {
            f"{r.expectation_config.type}:{_target(r.expectation_config.kwargs)}": _summary(r) for r in result.results
        }
        offending = [v for r in result.results for v in _sample(r.result.get("partial_unexpected_counts") or [])]
        return GxOutcome(
            success=bool(result.success),
            backend="spark" if spark else "pandas",
            rows=rows,
            statistics={k: _plain(v) for k, v in result.statistics.items()},
            expectations=outcomes,
            offending=offending[: self.sample_size],
        )

    def _gx(self):
        if self._context is None:
            import great_expectations as gx
            from great_expectations.data_context.types.base import ProgressBarsConfig

            context = gx.get_context(mode="ephemeral")
            context.variables.progress_bars = ProgressBarsConfig(globally=False)
            self._context = context
        return self._context

    @staticmethod
    def _source(context, kind: str):
        """The context's pandas or Spark data source, added on first use.

        Added lazily because GX's Spark source starts a Spark session of its
        own when none exists, without this platform's settings.
        """
        if kind not in context.data_sources.all():
            (context.data_sources.add_spark if kind == "spark" else context.data_sources.add_pandas)(kind)
        return context.data_sources.get(kind)

    def _spark(self):
        """The process's Spark session (the one the run's Spark resource or a test started, if any)."""
        return spark_session()


def _target(kwargs: dict) -> str:
    columns = kwargs.get("column_list") or [kwargs.get("column")]
    return ",".join(str(c) for c in columns if c is not None) or "table"


def _summary(result) -> dict[str, Any]:
    keep = ("element_count", "unexpected_count", "unexpected_percent", "missing_count", "observed_value")
    return {"success": bool(result.success), **{k: _plain(result.result[k]) for k in keep if k in result.result}}


def _sample(counts: list[dict]) -> list:
    """Offending values from GX's ``partial_unexpected_counts`` (compound keys arrive as tuples)."""
    return [_plain(list(c["value"]) if isinstance(c["value"], tuple) else c["value"]) for c in counts]


def _plain(value):
    """JSON-safe Python values (GX returns numpy scalars and NaN for nulls)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and value != value:
        return None
    return value
