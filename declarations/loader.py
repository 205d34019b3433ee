"""Load every table declared in the tables folder, one at a time, so a broken one stops nothing else.

The folder (``LSM_TABLES_DIR``, default ``tables/`` in the project) holds one
subfolder per table with a ``defs.yaml`` of type
:class:`~declarations.component.LsmTableComponent`. Each declaration is
loaded with Dagster's component loader (templating, validation with file
and line), then checked against the others: two tables may not share a name
or a URI. A declaration that fails is reported — logged, and shown in the
UI as the asset ``<folder>/declaration_error`` whose description is the
error — and every other table loads as usual.
"""

import logging
import os
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

from dagster import AssetSpec, Definitions, MetadataValue

from resources.declared_table import DeclaredTable

from .component import LsmTableComponent
from .table_definitions import table_definitions

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DECLARATION_FILE = "defs.yaml"


def tables_dir() -> Path:
    """``LSM_TABLES_DIR``: the folder of table declarations (default: ``tables/`` in the project)."""
    return Path(os.environ.get("LSM_TABLES_DIR") or PROJECT_ROOT / "tables")


@dataclass
class LoadedTables:
    """The tables a folder declares: those that loaded, their definitions, and the broken declarations."""

    tables: list[DeclaredTable] = field(default_factory=list)
    definitions: list[Definitions] = field(default_factory=list)
    broken: dict[str, str] = field(default_factory=dict)
    """Declaration file → why it was not loaded."""

    def error_definitions(self) -> Definitions:
        """One asset per broken declaration, so the UI shows what is wrong where the table would be."""
        return Definitions(
            assets=[
                AssetSpec(
                    key=[Path(file).parent.name, "declaration_error"],
                    group_name=Path(file).parent.name,
                    description=f"This table's declaration did not load: {error}",
                    metadata={"declaration_file": MetadataValue.path(file), "error": MetadataValue.text(error)},
                )
                for file, error in self.broken.items()
            ]
        )


def load_tables(directory: Path, taken: list[DeclaredTable]) -> LoadedTables:
    """Load every declaration under ``directory``; ``taken``: tables declared elsewhere (the default one).

    Never raises for a declaration: each problem lands in ``LoadedTables.broken``.
    """
    loaded = LoadedTables()
    if not directory.is_dir():
        return loaded
    names = {t.name: t.source for t in taken}
    uris = {_location(t.table_uri): t.source for t in taken}
    for folder in sorted(p for p in directory.iterdir() if (p / DECLARATION_FILE).is_file()):
        file = str(folder / DECLARATION_FILE)
        try:
            table = _declared(folder, file)
            _refuse_clash(table, names, uris)
            loaded.definitions.append(table_definitions(table))
        except Exception as error:
            loaded.broken[file] = _explain(error, file)
            log.error("table declaration %s not loaded: %s", file, loaded.broken[file])
            continue
        loaded.tables.append(table)
        names[table.name], uris[_location(table.table_uri)] = file, file
    return loaded


def _declared(folder: Path, file: str) -> DeclaredTable:
    """The declaration in ``folder``, loaded by Dagster's component loader on its own.

    A tree per folder: the loader parses every YAML file of its tree first,
    so one unparsable file would otherwise fail every table.
    """
    from dagster.components.core.component_tree import ComponentTree

    name = f"lsm_declared_table_{folder.name}"
    module = types.ModuleType(name)
    module.__path__ = [str(folder)]
    module.__file__ = str(folder / "__init__.py")
    sys.modules[name] = module
    component = ComponentTree.from_module(defs_module=module, project_root=PROJECT_ROOT).load_component(folder)
    if not isinstance(component, LsmTableComponent):
        raise TypeError(f"{file} declares a {type(component).__name__}, not an LsmTableComponent")
    return component.declared(file)


def _refuse_clash(table: DeclaredTable, names: dict[str, str], uris: dict[str, str]) -> None:
    if table.name in names:
        raise ValueError(f"name: table {table.name!r} is already declared by {names[table.name]}")
    location = _location(table.table_uri)
    if location in uris:
        raise ValueError(f"uri: {table.table_uri} is already the table of {uris[location]}")


def _location(uri: str) -> str:
    """A URI compared as a location: local paths absolute, no trailing slash."""
    return uri.rstrip("/") if "://" in uri else os.path.abspath(uri)


def _explain(error: BaseException, file: str) -> str:
    """The innermost cause's message (Dagster's loader wraps it), naming ``file`` if it does not already."""
    while error.__cause__ is not None:
        error = error.__cause__
    message = f"{type(error).__name__}: {error}".strip()
    return message if file in message else f"{file}: {message}"
