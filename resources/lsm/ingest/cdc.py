"""CDC envelopes: turn Debezium (or any CDC tool's) change records into the engine's change layout.

The engine's change layout is the table's columns plus ``_op`` ('upsert' |
'delete') and ``_seq`` (int64, higher wins per key within one write; see
:mod:`resources.lsm.write.changes`). :func:`to_changes` (Arrow rows) and
:func:`records_to_changes` (Python records, as JSON Lines parse) map envelope
records to that layout and reject malformed envelopes one by one, with a
reason, so a caller can quarantine them like any other bad row.

Debezium
    A record is a Debezium envelope (``op``, ``before``, ``after``,
    ``source``, ``ts_ms``), optionally wrapped as ``{"schema": ..., "payload":
    envelope}`` (the JSON converter with schemas enabled), or a Kafka
    ``{"key": ..., "value": ...}`` pair whose value is one of those.
    ``op`` ``c`` (create), ``r`` (snapshot read) and ``u`` (update) upsert
    ``after``; ``d`` deletes the key found in ``before`` (or in the record's
    ``key``). A tombstone (a null record, a null ``payload``, a null
    ``value``) is what Kafka log compaction leaves after a delete: with a key
    it is a delete of that key (idempotent after the ``d`` it follows), without
    one it is skipped. Any other ``op`` (``t`` truncate, ``m`` message) or a
    missing ``after``/``before`` rejects the record.
Generic
    Records are flat rows: the table's columns, an op column whose values in
    ``delete_values`` mark deletes (every other value is an upsert, unless
    ``upsert_values`` lists the accepted ones), and ``order_columns``.

Ordering: ``_seq`` is each record's rank in the order of its ordering values
(Debezium: ``order_by``, a dotted path into the envelope such as
``source.lsn`` or ``ts_ms``; generic: ``order_columns``, compared as a
tuple), ties kept in record order. So within one batch (one landing file)
the newest change per key is the one with the highest ordering value, the
later record on ties ("ts_ms plus position"). Across landing files, file-name
order decides, as for every landing file. Ranks work for any comparable
ordering type (integer LSNs, SQL Server's ``"00000027:00000758:0003"``
strings, timestamps).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, cast

import numpy as np
import pyarrow as pa

from ..errors import Rejection
from ..format.schema import DELETE, OP_COLUMN, SEQ_COLUMN, UPSERT
from ..write.changes import records_table

DEBEZIUM_UPSERT_OPS = frozenset({"c", "r", "u"})
DEBEZIUM_DELETE_OP = "d"
_Record = dict[str, object]


_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class CdcFormat:
    """How to read one CDC tool's change records.

    Attributes
    ----------
    kind
        ``"debezium"`` (envelopes, see the module doc) or ``"generic"`` (flat rows).
    order_by
        Debezium: dotted path into the envelope whose value orders the changes
        (``"source.lsn"``, default; ``"ts_ms"``, ``"source.ts_ms"``...). A
        record without it is rejected.
    op_column
        Generic: the column holding the operation (dropped from the changes).
    delete_values
        Generic: op values that mean delete (compared as text, case-sensitive).
    upsert_values
        Generic: op values that mean upsert; empty means every value not in
        ``delete_values``. With it, other values reject their row.
    order_columns
        Generic: columns ordering the changes (compared as a tuple); empty
        means record order. They stay in the changes (they may be table
        columns, such as ``updated_at``) unless listed in ``drop_columns``.
    drop_columns
        Generic: the CDC tool's own columns (commit ids, positions...),
        dropped from the changes, so they do not count as unknown columns.
    sequence
        ``"rank"`` (default): ``_seq`` is each record's rank within the batch,
        for any comparable ordering type. ``"value"``: ``_seq`` is the
        ordering value itself, which must be one integer per record (an LSN,
        ``ts_ms``; others are rejected, a keyed tombstone's absent value
        sorts first), so that changes order across batches: the Spark
        writer's partitions and micro-batches.
    """

    kind: Literal["debezium", "generic"] = "debezium"
    order_by: str = "source.lsn"
    op_column: str = "op"
    delete_values: tuple[str, ...] = ("d", "D", "delete", "DELETE")
    upsert_values: tuple[str, ...] = ()
    order_columns: tuple[str, ...] = ()
    drop_columns: tuple[str, ...] = ()
    sequence: Literal["rank", "value"] = "rank"

    def __post_init__(self) -> None:
        if self.sequence not in ("rank", "value"):
            raise ValueError(f"CDC sequence must be 'rank' or 'value', got {self.sequence!r}")
        if self.kind not in ("debezium", "generic"):
            raise ValueError(f"CDC format kind must be 'debezium' or 'generic', got {self.kind!r}")
        if self.kind == "generic" and not self.op_column:
            raise ValueError("a generic CDC format needs an op_column")


@dataclass(frozen=True)
class CdcChanges:
    """Records mapped to the change layout.

    ``changes`` holds the table's columns as found in the records (types as
    inferred; ``validate_changes`` casts them), ``_op`` and ``_seq``; its row
    ``i`` came from record ``record_numbers[i]``. ``rejections`` name
    malformed records by record number; ``skipped`` counts keyless
    tombstones, which change nothing.
    """

    changes: pa.Table
    record_numbers: np.ndarray
    rejections: list[Rejection]
    skipped: int = 0


def to_changes(rows: pa.Table, fmt: CdcFormat, unset_absent: bool = False) -> CdcChanges:
    """Map a table of CDC records (one envelope or flat row each) to the change layout.

    Guarantees: every input row is either in ``changes`` (in input order),
    in ``rejections`` with a reason, or a skipped keyless tombstone; nothing
    raises for content. Debezium rows may carry the envelope as struct
    columns (``op``, ``before``, ``after``, ``source``...) or wrapped in a
    ``payload`` or ``value`` column.
    """
    return records_to_changes(rows.to_pylist(), fmt, unset_absent)


def records_to_changes(records: Sequence[object], fmt: CdcFormat, unset_absent: bool = False) -> CdcChanges:
    """:func:`to_changes` for Python records (parsed JSON lines; ``None`` is a tombstone).

    A Debezium record or its ``key``/``value`` may also be JSON text (a Kafka
    message read as a string or binary column); text that does not parse
    rejects its record. With ``unset_absent`` (a partial-update table), a
    column a change lacks (a field missing from a Debezium ``after``, or from
    a generic record) is listed in its row's ``_unset``: the upsert leaves
    that column as it is. Otherwise it is null.
    """
    if fmt.kind == "debezium":
        return _debezium(records, fmt, unset_absent)
    return _generic(records, fmt, unset_absent)


def _debezium(records: Sequence[object], fmt: CdcFormat, unset_absent: bool) -> CdcChanges:
    rows: list[_Record] = []
    numbers: list[int] = []
    orders: list[object] = []
    rejections: list[Rejection] = []
    skipped = 0
    for number, record in enumerate(records):
        change, order, reason = _debezium_change(record, fmt.order_by)
        if reason is not None:
            rejections.append(Rejection(number, reason))
        elif change is None:
            skipped += 1
        else:
            rows.append(change)
            numbers.append(number)
            orders.append(order)
    return _assemble(rows, numbers, [(o,) for o in orders], rejections, skipped, fmt.sequence, unset_absent)


def _debezium_change(record: object, order_by: str) -> tuple[_Record | None, object, str | None]:
    """One record's change (``None`` for a keyless tombstone), its ordering value, or why it is malformed."""
    try:
        key, envelope = _unwrap(record)
    except ValueError as exc:  # JSON text that does not parse
        return None, None, f"Debezium record is not valid JSON: {exc}"
    if envelope is None:
        if key is None:
            return None, None, None
        return {**key, OP_COLUMN: DELETE}, None, None  # a keyed tombstone sorts first: rank ties keep order
    if not isinstance(envelope, dict):
        return None, None, f"Debezium envelope is a {type(envelope).__name__}, not an object"
    op = envelope.get("op")
    order = _path(envelope, order_by)
    if (op in DEBEZIUM_UPSERT_OPS or op == DEBEZIUM_DELETE_OP) and order is None:
        return None, None, f"Debezium record has no {order_by} to order it by"
    if op in DEBEZIUM_UPSERT_OPS:
        after = envelope.get("after")
        if not isinstance(after, dict):
            return None, None, f"Debezium op {op!r} without an 'after' object"
        return {**after, OP_COLUMN: UPSERT}, order, None
    if op == DEBEZIUM_DELETE_OP:
        before = envelope.get("before") or key
        if not isinstance(before, dict):
            return None, None, "Debezium op 'd' without a 'before' object or record key"
        return {**before, OP_COLUMN: DELETE}, order, None
    return None, None, f"Debezium op {op!r} is not one of c, r, u, d"


def _unwrap(record: object) -> tuple[_Record | None, object]:
    """``(record key, envelope)``: the key of a Kafka key/value pair, and the envelope with its wrappers removed."""
    key = None
    if isinstance(record, dict) and "value" in record and "op" not in record:
        key, record = _unwrap_payload(record.get("key")), record["value"]
    envelope = _unwrap_payload(record)
    return (key if isinstance(key, dict) else None), envelope


def _unwrap_payload(value: object) -> object:
    """The ``payload`` of a ``{"schema", "payload"}`` wrapper, or ``value`` itself; JSON text is parsed first.

    Raises
    ------
    ValueError
        If ``value`` is text (a Kafka message as a string or bytes column) that is not JSON.
    """
    if isinstance(value, (str, bytes)):
        value = json.loads(value)
    if isinstance(value, dict) and "payload" in value and "op" not in value:
        return value["payload"]
    return value


def _path(envelope: _Record, dotted: str) -> object:
    value: object = envelope
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _generic(records: Sequence[object], fmt: CdcFormat, unset_absent: bool) -> CdcChanges:
    rows: list[_Record] = []
    numbers: list[int] = []
    orders: list[tuple[object, ...]] = []
    rejections: list[Rejection] = []
    for number, record in enumerate(records):
        change, reason = _generic_change(record, fmt)
        if change is None:
            rejections.append(Rejection(number, reason or "empty record"))
            continue
        order = tuple(cast("_Record", record).get(c) for c in fmt.order_columns)
        if any(v is None for v in order):
            rejections.append(Rejection(number, f"ordering columns {list(fmt.order_columns)} hold a null"))
            continue
        rows.append(change)
        numbers.append(number)
        orders.append(order)
    return _assemble(rows, numbers, orders, rejections, 0, fmt.sequence, unset_absent)


def _generic_change(record: object, fmt: CdcFormat) -> tuple[_Record | None, str | None]:
    if not isinstance(record, dict):
        return None, f"CDC record is a {type(record).__name__}, not an object"
    op = record.get(fmt.op_column)
    text = None if op is None else str(op)
    if text in fmt.delete_values:
        kind = DELETE
    elif text is not None and (not fmt.upsert_values or text in fmt.upsert_values):
        kind = UPSERT
    else:
        return None, f"{fmt.op_column}={op!r} is not a delete {list(fmt.delete_values)} or upsert value"
    change = {k: v for k, v in record.items() if k != fmt.op_column and k not in fmt.drop_columns}
    return {**change, OP_COLUMN: kind}, None


def _assemble(
    rows: list[_Record],
    numbers: list[int],
    orders: list[tuple[object, ...]],
    rejections: list[Rejection],
    skipped: int,
    sequence: str,
    unset_absent: bool,
) -> CdcChanges:
    """The changes table, ``_seq`` being each row's rank by ordering value (record order on ties) or the value."""
    columns = list(dict.fromkeys(name for row in rows for name in row if name != OP_COLUMN))
    changes = [{k: v for k, v in row.items() if k != OP_COLUMN} for row in rows]
    table = records_table(changes, columns, unset_absent)
    table = table.append_column(OP_COLUMN, pa.array([row[OP_COLUMN] for row in rows], pa.string()))
    sequenced = _ranks if sequence == "rank" else _values
    table = table.append_column(SEQ_COLUMN, pa.array(sequenced(orders, rejections, numbers), pa.int64()))
    keep = np.ones(len(rows), dtype=bool)
    unordered = {r.row for r in rejections}
    keep[[i for i, n in enumerate(numbers) if n in unordered]] = False
    return CdcChanges(
        table.filter(pa.array(keep)), np.array(numbers, dtype=np.int64)[keep], sorted(rejections, key=_row), skipped
    )


def _values(orders: list[tuple[object, ...]], rejections: list[Rejection], numbers: list[int]) -> list[int]:
    """Each row's ordering value as its ``_seq`` (``sequence="value"``); rows without one integer are rejected."""
    values = []
    for order, number in zip(orders, numbers, strict=True):
        value = order[0] if len(order) == 1 else None
        if order == (None,):
            values.append(_I64_MIN)  # a keyed tombstone: first, as in rank order
        elif type(value) is int and _I64_MIN <= value <= _I64_MAX:
            values.append(value)
        else:
            rejections.append(Rejection(number, f"ordering value {list(order)!r} is not one 64-bit integer"))
            values.append(_I64_MIN)
    return values


def _row(rejection: Rejection) -> int:
    return rejection.row


def _ranks(orders: list[tuple[object, ...]], rejections: list[Rejection], numbers: list[int]) -> list[int]:
    """Each row's position in a stable sort by ordering value (``None``, a keyed tombstone's, first).

    Ordering values must compare: a row whose values are of other kinds
    (text, number) than the most common kind is rejected (and ranked last).
    """
    numbers_only = _as_numbers(orders)
    if numbers_only is not None:  # the usual case (an LSN, a timestamp): one vectorized stable sort
        positions = np.empty(len(orders), dtype=np.int64)
        positions[np.argsort(numbers_only, kind="stable")] = np.arange(len(orders))
        return positions.tolist()
    kinds = [tuple(_kind(v) for v in order) for order in orders]
    usual = Counter(k for k in kinds if None not in k).most_common(1)
    comparable = [i for i, k in enumerate(kinds) if None in k or not usual or k == usual[0][0]]
    rejections.extend(
        Rejection(numbers[i], f"ordering value {list(orders[i])!r} does not compare with the others")
        for i in sorted(set(range(len(orders))) - set(comparable))
    )
    ranked = sorted(comparable, key=lambda i: tuple((v is not None, v) for v in orders[i]))
    ranks = [len(orders)] * len(orders)
    for rank, i in enumerate(ranked):
        ranks[i] = rank
    return ranks


def _kind(value: object) -> str | None:
    """What an ordering value compares with: numbers with numbers, anything else with its own type."""
    if value is None:
        return None
    return "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value).__name__


def _as_numbers(orders: list[tuple[object, ...]]) -> np.ndarray | None:
    """One integer ordering value per row as an array, or ``None`` if they are anything else."""
    if not orders or any(len(order) != 1 for order in orders):
        return None
    values = [order[0] for order in orders]
    if not all(type(v) is int for v in values):
        return None
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return None
