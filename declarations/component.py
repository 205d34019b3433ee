"""``LsmTableComponent``: a table declared in YAML, one ``defs.yaml`` per table.

Example (``tables/orders/defs.yaml``)::

    type: declarations.LsmTableComponent
    attributes:
      name: orders
      columns:
        - {name: order_id, type: int64}
        - {name: customer, type: string}
        - {name: amount, type: "decimal128(12, 2)"}
      primary_key: [order_id]
      landing: {directory: "{{ env('ORDERS_LANDING', 'data/landing/orders') }}"}

Every attribute is a field of :class:`~resources.declared_table.DeclaredTable`;
strings may use Dagster's templating (``{{ env.NAME }}``, ``{{ env('NAME', 'default') }}``).
"""

from pathlib import Path

from dagster import Definitions
from dagster.components import Component, ComponentLoadContext, Resolvable

from resources.declared_table import DeclaredTable

from .table_definitions import declared_tables_resource, table_definitions


class LsmTableComponent(Component, Resolvable, DeclaredTable):
    """An LSM upsert table on Lance: its assets, checks, jobs, schedules and resources."""

    def declared(self, file: str) -> DeclaredTable:
        """The declaration as data, naming ``file``, the YAML it came from."""
        fields = {name: getattr(self, name) for name in DeclaredTable.model_fields}
        return DeclaredTable(**{**fields, "declaration_file": file})

    def build_defs(self, context: ComponentLoadContext) -> Definitions:
        """The table's definitions with its own ``lsm_tables`` resource (``definitions.py`` binds one for all)."""
        table = self.declared(str(Path(context.path) / "defs.yaml"))
        return Definitions.merge(table_definitions(table), Definitions(resources=declared_tables_resource([table])))
