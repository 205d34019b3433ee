"""Tables declared in YAML: the component type, and loading every declaration of the tables folder."""

from .component import LsmTableComponent
from .loader import LoadedTables, load_tables, tables_dir
from .table_definitions import declared_tables_resource, table_definitions

__all__ = [
    "LoadedTables",
    "LsmTableComponent",
    "declared_tables_resource",
    "load_tables",
    "table_definitions",
    "tables_dir",
]
