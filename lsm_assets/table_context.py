"""What every per-table factory needs: the table's resource, and config classes with its defaults."""

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from dagster import Config, OpExecutionContext, asset
from pydantic import BaseModel, Field, create_model

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


def config_with_defaults(cls: type[ConfigT], table: DeclaredTable, **defaults: Any) -> type[ConfigT]:
    """``cls`` with ``defaults`` from ``table``'s declaration (the launchpad shows them; a run may override).

    The default table keeps ``cls`` itself: its defaults are read from the
    environment when a run starts.
    """
    if table.is_default:
        return cls
    fields: dict[str, Any] = {
        name: (
            cls.model_fields[name].annotation,
            Field(default=_plain(value), description=cls.model_fields[name].description, validate_default=True),
        )
        for name, value in defaults.items()
    }
    return create_model(f"{_camel(table.name)}{cls.__name__}", __base__=cls, **fields)


def _plain(value: Any) -> Any:
    """A config default as Dagster wants it: nested config as dicts."""
    if isinstance(value, BaseModel):
        return value.model_dump()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))
