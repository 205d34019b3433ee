"""Validate and normalize a batch of changes before anything is written.

A change batch has the table's columns plus optional ``_op`` ('upsert' |
'delete') and ``_seq`` (int64). :func:`validate_changes` finds every bad row
with a reason (so ingestion can quarantine them) and returns the good rows cast
to the table schema; :func:`resolve_changes` (or, for rows already in newest-wins order,
:func:`resolve_ordered_changes`) keeps the winning change per key and splits
upserts from deletes.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InvalidChangesError, Rejection
from ..format.schema import CHANGE_COLUMNS, CHANGE_OPS, DELETE, OP_COLUMN, SEQ_COLUMN, UNSET_COLUMN, UPSERT
from ..read.dedup import last_per_key
from .partial import fold_changes

if TYPE_CHECKING:
    import pandas as pd


class SupportsToArrow(Protocol):
    """An object that converts itself to a pyarrow Table with ``to_arrow()``."""

    def to_arrow(self) -> pa.Table: ...


ChangeData: TypeAlias = "pa.Table | pa.RecordBatch | pa.RecordBatchReader | pd.DataFrame | SupportsToArrow"
"""What :func:`to_arrow` accepts: the forms a change batch may be passed in."""


@dataclass(frozen=True)
class ValidatedChanges:
    """Rows that passed validation, cast to the table schema, plus rejections.

    ``valid`` keeps the input order and carries ``_op`` (string) and ``_seq``
    (int64; 0 when the input had none, so the later row wins) columns; for a
    partial-update table also ``_unset`` (list of the non-key columns the row
    does not set).
    """

    valid: pa.Table
    rejections: list[Rejection]


@dataclass(frozen=True)
class ResolvedChanges:
    """The winning change per key: rows to upsert, key rows to delete.

    In a partial-update table the upserts carry ``_unset``: the columns to
    read from the key's current row before the put.
    """

    upserts: pa.Table
    deletes: pa.Table


@dataclass(frozen=True)
class ChangeRules:
    """What a table accepts as changes: its columns and key, the columns added live, its merge engine."""

    schema: pa.Schema
    primary_key: list[str]
    optional_columns: frozenset[str] = frozenset()
    partial_update: bool = False

    def validate(self, data: ChangeData, *, reject_unknown_columns: bool = False) -> ValidatedChanges:
        """:func:`validate_changes` under these rules."""
        return validate_changes(
            data,
            self.schema,
            self.primary_key,
            reject_unknown_columns=reject_unknown_columns,
            optional_columns=self.optional_columns,
            partial_update=self.partial_update,
        )


def to_arrow(data: ChangeData) -> pa.Table:
    """Accept a pyarrow Table/RecordBatch/RecordBatchReader or a pandas DataFrame."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, pa.RecordBatchReader):
        return data.read_all()
    if hasattr(data, "to_arrow") and not hasattr(data, "columns"):
        return data.to_arrow()
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is a dependency
        pd = None
    if pd is not None and isinstance(data, pd.DataFrame):
        return _from_pandas(data)
    raise TypeError(f"cannot write {type(data).__name__}; pass a pyarrow Table or pandas DataFrame")


_CONVERSION_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError)
"""What Arrow raises for Python or pandas values it cannot convert to one column type."""


def loose_column(values: list[object]) -> pa.Array:
    """A column as Arrow infers it, or as text where it cannot (mixed types, an int beyond int64...).

    Text keeps every value, so casting to the table's type later rejects
    the offending rows instead of failing the whole batch.
    """
    try:
        return pa.array(values)
    except _CONVERSION_ERRORS:
        return pa.array([None if v is None else v if isinstance(v, str) else _as_json(v) for v in values], pa.string())


def records_table(records: Sequence[Mapping[str, object]], columns: list[str], unset_absent: bool = False) -> pa.Table:
    """Records as a table of ``columns`` (types inferred, see :func:`loose_column`).

    A field a record lacks is null, and a record without ``_op`` is an
    upsert. With ``unset_absent`` (a partial-update table) a lacking column is
    listed in the row's ``_unset`` instead (after any names the record's own
    ``_unset`` gives), so that the row leaves that column as it is.
    """
    defaults: dict[str, object] = {OP_COLUMN: UPSERT}  # a record without ``_op`` is an upsert, as a batch without it
    table = pa.table(
        {c: loose_column([r.get(c, defaults.get(c)) for r in records]) for c in columns if c != UNSET_COLUMN}
    )
    settable = [c for c in columns if c not in CHANGE_COLUMNS]
    if not unset_absent or all(len(r) >= len(columns) for r in records):
        return table if UNSET_COLUMN not in columns else table.append_column(UNSET_COLUMN, _given_unset(records))
    unset = [[*_unset_names(r.get(UNSET_COLUMN)), *(c for c in settable if c not in r)] for r in records]
    return table.append_column(UNSET_COLUMN, pa.array(unset, pa.list_(pa.string())))


def _given_unset(records: Sequence[Mapping[str, object]]) -> pa.Array:
    return pa.array([_unset_names(r.get(UNSET_COLUMN)) for r in records], pa.list_(pa.string()))


def _as_json(value: object) -> str:
    return json.dumps(value, default=str)


def _from_pandas(frame: pd.DataFrame) -> pa.Table:
    """A DataFrame as Arrow; a column Arrow cannot convert becomes text (see :func:`loose_column`)."""
    try:
        return pa.Table.from_pandas(frame, preserve_index=False)
    except _CONVERSION_ERRORS:
        names = [str(c) for c in frame.columns]
        _refuse_duplicate_columns(names, len(frame))
        return pa.table({name: loose_column(frame[c].tolist()) for name, c in zip(names, frame.columns, strict=True)})


def _refuse_duplicate_columns(names: list[str], rows: int) -> None:
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InvalidChangesError.whole_batch(f"duplicate column names {duplicates}", rows)


def validate_changes(
    data: ChangeData,
    schema: pa.Schema,
    primary_key: list[str],
    *,
    reject_unknown_columns: bool = False,
    optional_columns: Collection[str] = (),
    partial_update: bool = False,
) -> ValidatedChanges:
    """Check every row of ``data`` against ``schema`` and the change-column rules.

    A row is rejected for a null key, a value not castable to its column type,
    an unknown ``_op``, a null ``_seq``, or (for upserts) a null in a
    non-nullable column. Columns the table does not have raise at once, or,
    with ``reject_unknown_columns``, reject the rows that hold a value in them
    (a landing file must not lose data silently).

    An upsert missing a non-key column is rejected (the column would be set
    to null), unless the column is in ``optional_columns`` (columns added to
    a live table: writers that predate them write null), or unless
    ``partial_update`` (the table's merge engine is ``partial-update``): then
    a missing column, and every column a row's ``_unset`` names (a list of
    names, or one string of comma-separated names), is not set by that row.
    A row of a last-write-wins table whose ``_unset`` names a column is
    rejected. Booleans are never accepted as numbers; NaN stays NaN.

    Raises
    ------
    InvalidChangesError
        (A ``ValueError``) with ``problem`` set if the batch as a whole is
        invalid: a key column missing, duplicate column names, or unknown
        columns while ``reject_unknown_columns`` is false.
    """
    table = to_arrow(data)
    _refuse_duplicate_columns(table.column_names, table.num_rows)
    missing_keys = [k for k in primary_key if k not in table.column_names]
    if missing_keys:
        raise InvalidChangesError.whole_batch(f"primary-key columns {missing_keys} are missing", table.num_rows)
    unknown = [c for c in table.column_names if c not in schema.names and c not in CHANGE_COLUMNS]
    if unknown and not reject_unknown_columns:
        raise InvalidChangesError.whole_batch(
            f"unknown columns {unknown}; the table has {schema.names} (+ optional _op, _seq)", table.num_rows
        )

    reasons: dict[int, str] = {}
    for name in unknown:
        for row in np.flatnonzero(table[name].is_valid().to_numpy(zero_copy_only=False)):
            reasons.setdefault(int(row), f"unknown column {name!r} holds {table[name][int(row)].as_py()!r}")
    ops = _ops_column(table, reasons)
    seqs = _seq_column(table, reasons)
    unset = (
        _unset_column(table, schema, primary_key, partial_update, reasons)
        if partial_update or UNSET_COLUMN in table.column_names
        else None
    )
    is_delete = pc.fill_null(pc.equal(ops, DELETE), False)
    columns = {}
    for target in schema:
        optional = partial_update or target.name in optional_columns
        required = pa.array(np.zeros(table.num_rows, dtype=bool)) if optional else pc.invert(is_delete)
        columns[target.name] = _cast_column(table, target, primary_key, is_delete, required, reasons)
    columns[OP_COLUMN] = ops
    columns[SEQ_COLUMN] = seqs
    if partial_update and unset is not None:
        columns[UNSET_COLUMN] = unset
    normalized = pa.table(columns)

    rejections = [Rejection(row, reason) for row, reason in sorted(reasons.items())]
    if rejections:
        keep = np.ones(table.num_rows, dtype=bool)
        keep[[r.row for r in rejections]] = False
        normalized = normalized.filter(pa.array(keep))
    return ValidatedChanges(normalized, rejections)


def resolve_changes(valid: pa.Table, schema: pa.Schema, primary_key: list[str]) -> ResolvedChanges:
    """Keep one change per key: the highest ``_seq``, later rows winning ties.

    Deletes of keys that do not exist are kept; applying them is a no-op.
    """
    # A stable sort by _seq keeps input order among equal _seq values, so the
    # last row of each key after sorting is the winner.
    by_seq = valid.take(pc.array_sort_indices(valid[SEQ_COLUMN], order="ascending"))
    return resolve_ordered_changes(by_seq, schema, primary_key)


def resolve_ordered_changes(ordered: pa.Table, schema: pa.Schema, primary_key: list[str]) -> ResolvedChanges:
    """Keep one change per key: the last row of the key (rows are in newest-wins order).

    ``ordered`` has the table's columns and ``_op``; any ``_seq`` is ignored.
    Deletes of keys that do not exist are kept; applying them is a no-op.
    Rows of a partial-update table (with ``_unset``) are folded per column
    instead (:func:`~resources.lsm.write.partial.fold_changes`).
    """
    if UNSET_COLUMN in ordered.column_names:
        return ResolvedChanges(*fold_changes(ordered, schema, primary_key))
    winners = last_per_key(ordered, primary_key)
    is_delete = pc.equal(ordered[OP_COLUMN], DELETE).to_numpy(zero_copy_only=False)
    # Each side is copied out once, and only with the columns it keeps.
    upserts = ordered.select(schema.names).filter(pa.array(winners & ~is_delete)).cast(schema)
    deletes = ordered.select(primary_key).filter(pa.array(winners & is_delete))
    return ResolvedChanges(upserts=upserts, deletes=deletes)


def _ops_column(table: pa.Table, reasons: dict[int, str]) -> pa.Array:
    if OP_COLUMN not in table.column_names:
        return pa.array([UPSERT] * table.num_rows, pa.string())
    ops = pc.utf8_lower(pc.utf8_trim_whitespace(_cast_values(table[OP_COLUMN], pa.string(), OP_COLUMN, reasons)))
    known = pc.fill_null(pc.is_in(ops, pa.array(CHANGE_OPS)), False)
    for row in np.flatnonzero(~known.to_numpy(zero_copy_only=False)):
        raw = table[OP_COLUMN][int(row)].as_py()
        reasons.setdefault(int(row), f"_op={raw!r} is not one of {list(CHANGE_OPS)}")
    return ops


def _seq_column(table: pa.Table, reasons: dict[int, str]) -> pa.Array:
    if SEQ_COLUMN not in table.column_names:
        return pa.array(np.zeros(table.num_rows, dtype=np.int64))
    cast = _cast_values(table[SEQ_COLUMN], pa.int64(), SEQ_COLUMN, reasons)
    for row in np.flatnonzero(cast.is_null().to_numpy(zero_copy_only=False)):
        reasons.setdefault(int(row), "_seq is null")
    return cast


def _unset_column(
    table: pa.Table, schema: pa.Schema, primary_key: list[str], partial_update: bool, reasons: dict[int, str]
) -> pa.Array:
    """Each row's unset columns: those the batch lacks, plus those its ``_unset`` names (partial-update tables).

    A name that is no non-key column rejects its row; so does any name in a
    last-write-wins table, which has no partial updates.
    """
    missing = [f.name for f in schema if f.name not in table.column_names and f.name not in primary_key]
    if UNSET_COLUMN not in table.column_names:
        offsets = np.arange(table.num_rows + 1, dtype=np.int32) * len(missing)
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(missing * table.num_rows, pa.string()))
    settable = {f.name for f in schema if f.name not in primary_key}
    rows = []
    for row, listed in enumerate(table[UNSET_COLUMN].to_pylist()):
        names = _unset_names(listed)
        bad = [n for n in names if n not in settable]
        if bad:
            reasons.setdefault(row, f"_unset names {bad}, which are not non-key columns of the table")
        elif names and not partial_update:
            reasons.setdefault(
                row, f"_unset names {names}, but the table's merge engine is last-write-wins (no partial updates)"
            )
        rows.append(list(dict.fromkeys([*missing, *names])))
    return pa.array(rows, pa.list_(pa.string()))


def _unset_names(listed: object) -> list[str]:
    """``_unset`` as given: a list of names, a string of comma-separated names, or null."""
    if listed is None:
        return []
    if isinstance(listed, str):
        return [n.strip() for n in listed.split(",") if n.strip()]
    if isinstance(listed, list):
        return [str(n) for n in listed if n is not None]
    return [str(listed)]


def _cast_column(
    table: pa.Table,
    target: pa.Field,
    primary_key: list[str],
    is_delete: pa.Array,
    required: pa.Array,
    reasons: dict[int, str],
) -> pa.Array:
    """The column cast to ``target``; rows that miss it while ``required`` (or hold a bad value) are rejected."""
    if target.name not in table.column_names:
        if target.name in primary_key:  # checked by the caller; kept for clarity
            raise ValueError(f"primary-key column {target.name!r} is missing")
        values = pa.nulls(table.num_rows, target.type)
        for row in np.flatnonzero(required.to_numpy(zero_copy_only=False)):
            reasons.setdefault(int(row), f"column {target.name!r} is missing; an upsert must carry every column")
    else:
        values = _cast_values(table[target.name], target.type, target.name, reasons)
    nulls = values.is_null().to_numpy(zero_copy_only=False)
    if target.name in primary_key:
        for row in np.flatnonzero(nulls):
            reasons.setdefault(int(row), f"primary-key column {target.name!r} is null")
    elif not target.nullable:
        upsert_nulls = nulls & ~is_delete.to_numpy(zero_copy_only=False)
        for row in np.flatnonzero(upsert_nulls):
            reasons.setdefault(int(row), f"non-nullable column {target.name!r} is null")
    return values


def _cast_values(column: pa.ChunkedArray, target: pa.DataType, name: str, reasons: dict[int, str]) -> pa.Array:
    """Cast a column; values that do not cast become null and are rejected.

    Booleans never cast to numbers (``true`` is no key ``1``).
    """
    column = column.combine_chunks()
    if pa.types.is_boolean(column.type) and _is_numeric(target):
        for flagged in np.flatnonzero(column.is_valid().to_numpy(zero_copy_only=False)):
            reasons.setdefault(
                int(flagged), f"{name}={column[int(flagged)].as_py()!r} is a boolean, not a valid {target}"
            )
        return pa.nulls(len(column), target)
    try:
        return column.cast(target, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        pass
    values: list[object] = []
    for row, value in enumerate(column):
        if not value.is_valid:
            values.append(None)
            continue
        try:
            values.append(value.cast(target, safe=True).as_py())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            reasons.setdefault(row, f"{name}={value.as_py()!r} is not a valid {target}")
            values.append(None)
    return pa.array(values, target)


def _is_numeric(target: pa.DataType) -> bool:
    return bool(pa.types.is_integer(target) or pa.types.is_floating(target) or pa.types.is_decimal(target))
