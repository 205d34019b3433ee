"""``LsmTableResource``: the LSM table a run works on, opened as its declaration says."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dagster import ConfigurableResource
from pydantic import Field

from .declared_table import DeclaredTable
from .settings import num_shards, table_uri

if TYPE_CHECKING:
    from .lsm import LsmTable


class TableDeclarationError(ValueError):
    """An existing table contradicts its declaration; nothing was written to it."""


class LsmTableResource(ConfigurableResource):
    """Opens one LSM table, creating it from its declaration on first use if allowed.

    ``declaration`` is the table's :class:`~resources.declared_table.DeclaredTable`
    as JSON (unset: the default table, whose existing schema is used as it is
    and which is created with ``DEFAULT_TABLE_COLUMNS``). ``storage_options``
    (Lance's object-store options, e.g. ``aws_endpoint``) reach every engine
    call on the table, ingestion's landing directory and quarantine included;
    unset, the ``AWS_*`` environment variables configure an object store.
    """

    uri: str = Field(default_factory=table_uri, description="Table URI (env LSM_TABLE_URI).")
    num_shards: int = Field(
        default_factory=num_shards, description="Shards (MemWAL buckets) of a new table (env LSM_NUM_SHARDS)."
    )
    storage_options: dict[str, str] | None = Field(
        default=None, description="Lance object-store options (default: from the AWS_* environment variables)."
    )
    create_if_missing: bool | None = Field(
        default=None,
        description=(
            "Create the table if the URI holds none. Default (unset): as declared; for the default table "
            "env LSM_CREATE_TABLE, else only the embedded default data/table.lance, so a mistyped URI fails "
            "instead of creating a new table."
        ),
    )
    declaration: str | None = Field(
        default=None, description="The table's declaration (JSON of DeclaredTable); unset: the default table."
    )

    @classmethod
    def for_table(cls, table: DeclaredTable) -> LsmTableResource:
        """The resource of a declared table: its URI, shards, storage options and declaration."""
        return cls(
            uri=table.table_uri,
            num_shards=table.num_shards,
            storage_options=table.storage_options,
            create_if_missing=table.create,
            declaration=table.model_dump_json(),
        )

    @property
    def declared(self) -> DeclaredTable:
        """The table's declaration (the default table's, built from the environment, when unset)."""
        if self.declaration is None:
            return DeclaredTable.from_environment().model_copy(update={"uri": self.uri})
        return DeclaredTable.model_validate_json(self.declaration)

    def open(self) -> LsmTable:
        """Open the table; create it from its declaration only if it is missing and creation is allowed.

        A declared table (``conform``) must match its declaration: the same
        key and merge engine, the same type for every declared column, no
        column the declaration dropped. Declared nullable columns the table lacks are
        added when the declaration opts in (``evolve``).

        Raises
        ------
        TableNotFoundError
            If the URI holds no table and creation is not allowed.
        TableDeclarationError
            If the existing table contradicts its declaration, naming the file and each difference.
        FileExistsError
            If creating, and the URI is a non-empty folder that is not a table.
        """
        from .lsm import LsmTable, TableNotFoundError

        declared = self.declared
        try:
            table = LsmTable.open(self.uri, storage_options=self.storage_options)
        except TableNotFoundError as missing:
            create = declared.create_if_missing if self.create_if_missing is None else self.create_if_missing
            if not create:
                raise TableNotFoundError(
                    f"{missing}; set create_if_missing (or LSM_CREATE_TABLE=true) to create it"
                ) from missing
            return self._create(declared)
        if declared.conform:
            self._conform(table, declared)
        return table

    def _create(self, declared: DeclaredTable) -> LsmTable:
        from .lsm import LsmTable

        return LsmTable.create(
            self.uri,
            _schema(declared),
            declared.primary_key,
            num_shards=self.num_shards,
            storage_options=self.storage_options,
            vector_index=_vector_index(declared),
            merge_engine=declared.merge_engine,
        )

    @staticmethod
    def _conform(table: LsmTable, declared: DeclaredTable) -> None:
        """Check ``table`` against ``declared``; add declared columns it lacks if ``evolve`` allows."""
        from .lsm.declared_schema import compare

        comparison = compare(_schema(declared), declared.primary_key, table.schema, table.primary_key)
        problems = list(comparison.conflicts)
        if table.merge_engine != declared.merge_engine:
            problems.append(f"merge_engine is {table.merge_engine!r} in the table, {declared.merge_engine!r} declared")
        if comparison.added and not declared.evolve:
            names = [f.name for f in comparison.added]
            problems.append(f"columns {names} are declared but not in the table (set evolve: true to add them)")
        if problems:
            raise TableDeclarationError(
                f"table {declared.name!r} at {table.uri} differs from its declaration in {declared.source}: "
                + "; ".join(problems)
                + ". Nothing was written to it."
            )
        if comparison.added:
            table.add_columns(list(comparison.added))


def _schema(declared: DeclaredTable):
    from .lsm.declared_schema import declared_schema

    return declared_schema([(c.name, c.type, c.nullable) for c in declared.columns], declared.primary_key)


def _vector_index(declared: DeclaredTable):
    if declared.vector_index is None:
        return None
    from .lsm.read.vector_search import VectorIndex

    return VectorIndex(**declared.vector_index.model_dump())


class DeclaredTables:
    """Every declared table's :class:`LsmTableResource`, by table name: the ``lsm_tables`` resource.

    One resource for all declared tables, bound without config: each job's
    run config then lists one resource, not one per table (with a resource
    per table, the code location's snapshot grew with tables x jobs).
    """

    def __init__(self, tables: list[DeclaredTable]) -> None:
        self._resources = {t.name: LsmTableResource.for_table(t) for t in tables}

    def __getitem__(self, name: str) -> LsmTableResource:
        return self._resources[name]

    def get(self, name: str) -> LsmTableResource | None:
        """The resource of the table ``name``, or ``None`` if no such table is declared."""
        return self._resources.get(name)
