"""``LsmTableResource``: the LSM table a run works on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dagster import ConfigurableResource
from pydantic import Field

from .settings import num_shards, table_uri

if TYPE_CHECKING:
    from .lsm import LsmTable


class LsmTableResource(ConfigurableResource):
    """Opens (creating on first use) the platform's LSM table.

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

    def open(self) -> LsmTable:
        """Open the table, creating it with the events schema if it does not exist."""
        from .lsm import LsmTable, TableNotFoundError
        from .lsm.testing.changegen import EVENTS_SCHEMA

        try:
            return LsmTable.open(self.uri, storage_options=self.storage_options)
        except TableNotFoundError:
            return LsmTable.create(
                self.uri, EVENTS_SCHEMA, ["id"], num_shards=self.num_shards, storage_options=self.storage_options
            )
