"""``LsmTableResource``: the LSM table a run works on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dagster import ConfigurableResource
from pydantic import Field

from .settings import create_table_if_missing, num_shards, table_uri

if TYPE_CHECKING:
    from .lsm import LsmTable


class LsmTableResource(ConfigurableResource):
    """Opens the platform's LSM table, creating it on first use if allowed.

    A new table gets the events schema of the change-stream generator, keyed by ``id``.
    ``storage_options`` (Lance's object-store options, e.g. ``aws_endpoint``)
    reach every engine call on the table, ingestion's landing directory and
    quarantine included; unset, the ``AWS_*`` environment variables configure
    an object store.
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
            "Create the table if the URI holds none. Default (unset): env LSM_CREATE_TABLE, else only for the "
            "embedded default data/table.lance, so a mistyped URI fails instead of creating a new table."
        ),
    )

    def open(self) -> LsmTable:
        """Open the table; create it with the events schema only if it is missing and creation is allowed.

        Raises
        ------
        TableNotFoundError
            If the URI holds no table and ``create_if_missing`` is false.
        FileExistsError
            If creating, and the URI is a non-empty folder that is not a table.
        """
        from .lsm import LsmTable, TableNotFoundError
        from .lsm.testing.changegen import EVENTS_SCHEMA

        try:
            return LsmTable.open(self.uri, storage_options=self.storage_options)
        except TableNotFoundError as missing:
            create = self.create_if_missing
            if not (create_table_if_missing(self.uri) if create is None else create):
                raise TableNotFoundError(
                    f"{missing}; set create_if_missing (or LSM_CREATE_TABLE=true) to create it"
                ) from missing
            return LsmTable.create(
                self.uri, EVENTS_SCHEMA, ["id"], num_shards=self.num_shards, storage_options=self.storage_options
            )
