"""Schemas written as text: Arrow type names, and how a declared schema differs from a table's.

A declaration names each column's type as text (``int64``, ``string``,
``timestamp[us, tz=UTC]``, ``decimal128(12, 2)``, ``float32[128]`` for a
vector, ``list<string>``). :func:`check_type_name` validates one without
loading Arrow (the code location validates every declaration when it
loads), :func:`arrow_type` builds it, :func:`declared_schema` builds a table
schema, and :func:`compare` tells what an existing table lacks and what it
contradicts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

SCALAR_TYPES = {
    "bool": "bool_", "boolean": "bool_",
    "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
    "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
    "float16": "float16", "float32": "float32", "float": "float32", "float64": "float64", "double": "float64",
    "string": "string", "utf8": "string", "large_string": "large_string", "binary": "binary",
    "large_binary": "large_binary", "date32": "date32", "date64": "date64",
}  # fmt: skip
"""Scalar type names and the ``pyarrow`` factory each stands for."""

_FIXED_LIST = re.compile(r"^(?P<item>[a-z0-9_]+)\[(?P<size>[1-9]\d*)\]$", re.IGNORECASE)
_LIST = re.compile(r"^(?P<kind>list|large_list)<(?P<item>.+)>$", re.IGNORECASE)
_DECIMAL = re.compile(r"^decimal(?P<bits>128|256)\((?P<precision>\d+),\s*(?P<scale>-?\d+)\)$", re.IGNORECASE)
_TIMESTAMP = re.compile(r"^timestamp\[(?P<unit>s|ms|us|ns)(?:,\s*tz=(?P<tz>[^\]]+))?\]$", re.IGNORECASE)
_TYPE_HELP = "int64, string, double, bool, date32, timestamp[us], decimal128(12, 2), float32[128] or list<string>"


def check_type_name(text: str) -> None:
    """Raise ``ValueError`` unless ``text`` names a type :func:`arrow_type` builds (no Arrow import)."""
    _build(text, _TextTypes())


def arrow_type(text: str) -> pa.DataType:
    """The Arrow type a type name denotes.

    Accepts the names in :data:`SCALAR_TYPES`, ``timestamp[<unit>]`` and
    ``timestamp[<unit>, tz=<zone>]``, ``decimal128(<precision>, <scale>)``
    (or 256), ``<type>[<n>]`` (a fixed-size list, as vectors are stored) and
    ``list<<type>>``.

    Raises
    ------
    ValueError
        For a name that denotes no such type, quoting it.
    """
    import pyarrow as pa

    return _build(text, pa)


class _TextTypes:
    """Stands in for the ``pyarrow`` module when a name is only checked."""

    def __getattr__(self, name: str) -> object:
        return lambda *args, **kwargs: name


def _build(text: str, pa: Any) -> Any:  # ``pa``: the pyarrow module, or _TextTypes
    name = text.strip()  # a time zone keeps its case
    if name.lower() in SCALAR_TYPES:
        return getattr(pa, SCALAR_TYPES[name.lower()])()
    match = _FIXED_LIST.match(name)
    if match:
        return pa.list_(_build(match["item"], pa), int(match["size"]))
    match = _LIST.match(name)
    if match:
        return getattr(pa, "large_list" if match["kind"].lower() == "large_list" else "list_")(
            _build(match["item"], pa)
        )
    match = _DECIMAL.match(name)
    if match:
        return getattr(pa, f"decimal{match['bits']}")(int(match["precision"]), int(match["scale"]))
    match = _TIMESTAMP.match(name)
    if match:
        return pa.timestamp(match["unit"].lower(), tz=match["tz"])
    raise ValueError(f"unknown type {text!r}; use an Arrow type name such as {_TYPE_HELP}")


def declared_schema(columns: Sequence[tuple[str, str, bool]], primary_key: Sequence[str]) -> pa.Schema:
    """The schema of ``(name, type name, nullable)`` columns; key columns are never nullable.

    Raises
    ------
    ValueError
        Naming the column whose type is unknown.
    """
    import pyarrow as pa

    fields = []
    for name, type_name, nullable in columns:
        try:
            fields.append(pa.field(name, arrow_type(type_name), nullable and name not in primary_key))
        except ValueError as error:
            raise ValueError(f"column {name!r}: {error}") from None
    return pa.schema(fields)


@dataclass(frozen=True)
class SchemaComparison:
    """How a declared schema relates to an existing table's.

    ``added``: declared nullable columns the table lacks (``add_columns`` can
    add them). ``conflicts``: what no evolution reconciles (another key,
    another type, a column the declaration dropped, a new non-null column),
    each as a sentence.
    """

    added: tuple[pa.Field, ...]
    conflicts: tuple[str, ...]


def compare(
    declared: pa.Schema, declared_key: Sequence[str], existing: pa.Schema, existing_key: Sequence[str]
) -> SchemaComparison:
    """What the existing table lacks and contradicts, compared with the declaration (column order aside)."""
    conflicts = []
    if list(declared_key) != list(existing_key):
        conflicts.append(f"primary key {list(declared_key)} is declared, the table's is {list(existing_key)}")
    conflicts += [
        f"column {field.name!r} ({field.type}) is in the table but not declared"
        for field in existing
        if field.name not in declared.names
    ]
    added = []
    for field in declared:
        if field.name not in existing.names:
            if field.nullable:
                added.append(field)
            else:
                conflicts.append(f"column {field.name!r} is declared non-null, the table lacks it")
        elif not field.type.equals(existing.field(field.name).type):
            conflicts.append(
                f"column {field.name!r} is declared {field.type}, the table holds {existing.field(field.name).type}"
            )
    return SchemaComparison(tuple(added), tuple(conflicts))
