"""What every per-table factory needs: the table's resource, its decorators, and step config shared by every table."""

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from dagster import Config, Field, OpExecutionContext, asset

from resources.declared_table import DeclaredTable
from resources.table_resource import LsmTableResource

if TYPE_CHECKING:
    from resources.lsm import LsmTable

ConfigT = TypeVar("ConfigT", bound=Config)

SPARK_RESOURCE = "spark"
GX_RESOURCE = "gx"

DEFAULT_TABLE = DeclaredTable.from_environment()
"""The environment's table (its locations are read from the environment when asked for)."""


def table_resource(context: Any, table: DeclaredTable) -> LsmTableResource:
    """``table``'s :class:`LsmTableResource` in a step's (or check's, or sensor's) resources."""
    resource = getattr(context.resources, table.resource_key)
    return resource if table.is_default else resource[table.name]


def open_table(context: OpExecutionContext, table: DeclaredTable):
    """Open ``table`` through its resource (created or checked against its declaration)."""
    return table_resource(context, table).open()


TABLE_VERSION_METADATA = "table_version"
"""Metadata of every ingestion, flush and merge: the merged view's version after it (``LsmTable.version``)."""


def version_metadata(table: "LsmTable") -> dict[str, str]:
    """The :data:`TABLE_VERSION_METADATA` entry for ``table`` now: a point to read it again (``as_of``) or
    to read what changed after it (``changes``)."""
    return {TABLE_VERSION_METADATA: str(table.version())}


def table_asset(table: DeclaredTable, name: str, *, resources: Iterable[str] = (), **kwargs: Any) -> Any:
    """``@asset`` for ``table``'s asset ``name``: its key, its group, its table's resource (and ``resources``)."""
    return asset(
        key=table.asset_key(name),
        group_name=table.group,
        required_resource_keys={table.resource_key, *resources},
        **kwargs,
    )


class StepConfig(Generic[ConfigT]):
    """A step's config class as every table's step of that kind takes it.

    Dagster infers a config schema for each decorated function (~3 ms each,
    ~15 ms a table); built once here, the schema costs nothing per table.
    Fields a table declares (``declared``: the table → those fields' values)
    have no default in it: a run that leaves them unset takes them from its
    own table's declaration, so one schema serves every table. The launchpad
    shows them empty; a run may still set them.
    """

    def __init__(self, cls: type[ConfigT], declared: Callable[[DeclaredTable], dict[str, Any]] | None = None) -> None:
        self.cls = cls
        self.declared = declared or (lambda table: {})
        self._schema: dict[str, Field] | None = None

    def schema(self, table: DeclaredTable) -> dict[str, Field]:
        """The ``config_schema`` of ``table``'s step: its fields (the same for every table)."""
        if self._schema is None:
            fields = dict(self.cls.to_config_schema().config_type.fields)
            for name in self.declared(table):
                fields[name] = Field(
                    fields[name].config_type,
                    is_required=False,
                    description=f"{fields[name].description} Unset: the table's declaration.",
                )
            self._schema = fields
        return self._schema

    def resolve(self, context: Any, table: DeclaredTable) -> ConfigT:
        """The step's config: what the run set, over ``table``'s declaration for the declared fields it left unset."""
        given = getattr(context, "op_execution_context", context).op_config or {}
        return self.cls(**{**self.declared(table), **given})
