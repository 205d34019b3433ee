"""Generate realistic change streams (upserts, deletes, re-inserts) and their oracle.

Used by the demo job, the tests and the benchmarks. Deterministic for a seed.
``scripts/generate_changes.py`` writes landing files from the command line.
"""

from __future__ import annotations

import argparse
import decimal
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ..format.schema import DELETE, OP_COLUMN, SEQ_COLUMN, UNSET_COLUMN, UPSERT
from ..format.storage import TableStorage


def events_schema(vector_dim: int = 0, with_text: bool = False) -> pa.Schema:
    """The generated table: one row per order ``id``, optionally with an
    ``embedding`` vector (fixed-size float32 list) and a ``description`` text."""
    fields = [("id", pa.int64()), ("customer", pa.string()), ("amount", pa.float64()), ("status", pa.string())]
    if vector_dim:
        fields.append(("embedding", pa.list_(pa.float32(), vector_dim)))
    if with_text:
        fields.append(("description", pa.string()))
    return pa.schema(fields)


EVENTS_SCHEMA = events_schema()
"""The platform's default table."""

_STATUSES = np.array(["new", "paid", "shipped", "returned"])


@dataclass(frozen=True)
class ChangeStreamSpec:
    """Shape of a generated change stream.

    ``update_ratio`` of each batch rewrites existing keys, ``delete_ratio``
    deletes existing keys, ``reinsert_ratio`` brings deleted keys back; the
    rest inserts new keys. ``_seq`` is shuffled within a batch (out of order).
    ``partial_ratio`` of the upserts (for partial-update tables) leave some
    non-key columns unset: they are listed in ``_unset`` and null in the batch.
    """

    num_keys: int = 10_000
    num_batches: int = 10
    batch_size: int = 1_000
    update_ratio: float = 0.5
    delete_ratio: float = 0.1
    reinsert_ratio: float = 0.05
    seed: int = 7
    vector_dim: int = 0
    with_text: bool = False
    partial_ratio: float = 0.0

    @property
    def schema(self) -> pa.Schema:
        return events_schema(self.vector_dim, self.with_text)


def generate_changes(spec: ChangeStreamSpec) -> Iterator[pa.Table]:
    """Yield ``spec.num_batches`` change batches of ``spec.schema`` + ``_op``/``_seq`` (+ ``_unset``)."""
    partial = np.random.default_rng(spec.seed + 1)  # its own draws: the stream is the same with or without
    for rng, keys, ops, seqs in _key_stream(spec):
        yield _leave_unset(_batch(spec, rng, keys, ops, seqs), ["id"], spec.partial_ratio, partial)


def generate_table_changes(schema: pa.Schema, primary_key: Sequence[str], spec: ChangeStreamSpec) -> Iterator[pa.Table]:
    """Yield change batches of any table: ``schema``'s columns + ``_op``/``_seq``, the stream shape of ``spec``.

    Keys follow the same upsert/delete/re-insert draws as :func:`generate_changes`;
    key ``n`` becomes one value per key column (:func:`key_values`), other
    columns get random values of their type (nullable ones 5% null).

    Raises
    ------
    ValueError
        Naming a column whose type has no generator.
    """
    partial = np.random.default_rng(spec.seed + 1)
    for rng, keys, ops, seqs in _key_stream(spec):
        columns = {**key_values(schema, primary_key, keys), **_random_values(schema, primary_key, rng, len(keys))}
        columns[OP_COLUMN] = pa.array(ops)
        columns[SEQ_COLUMN] = pa.array(seqs, pa.int64())
        batch = pa.table({name: columns[name] for name in [*schema.names, OP_COLUMN, SEQ_COLUMN]})
        yield _leave_unset(batch, primary_key, spec.partial_ratio, partial)


def _leave_unset(batch: pa.Table, primary_key: Sequence[str], ratio: float, rng: np.random.Generator) -> pa.Table:
    """``batch`` with ``ratio`` of its upserts leaving a random non-empty set of non-key columns unset."""
    if not ratio:
        return batch
    settable = [c for c in batch.column_names if c not in primary_key and c not in (OP_COLUMN, SEQ_COLUMN)]
    chosen = (rng.random(batch.num_rows) < ratio) & (batch[OP_COLUMN].to_numpy(zero_copy_only=False) == UPSERT)
    unset_mask = rng.random((batch.num_rows, len(settable))) < 0.5
    unset_mask[np.arange(batch.num_rows), rng.integers(0, len(settable), batch.num_rows)] = True
    unset_mask &= chosen[:, None]
    for i, name in enumerate(settable):
        column = batch[name]
        nulls = pa.nulls(len(column), column.type)
        batch = batch.set_column(
            batch.schema.get_field_index(name), name, pa.compute.if_else(unset_mask[:, i], nulls, column)
        )
    unset = [[settable[i] for i in np.flatnonzero(row)] for row in unset_mask]
    return batch.append_column(UNSET_COLUMN, pa.array(unset, pa.list_(pa.string())))


def _key_stream(spec: ChangeStreamSpec) -> Iterator[tuple[np.random.Generator, np.ndarray, np.ndarray, np.ndarray]]:
    """Per batch: the generator, then keys, ops and ``_seq`` (out of order), drawn as ``spec`` says."""
    rng = np.random.default_rng(spec.seed)
    live, deleted = _KeyPool(), _KeyPool()
    next_new = seq = 0
    for _ in range(spec.num_batches):
        ops, keys = [], []
        for _ in range(spec.batch_size):
            draw = rng.random()
            if live and draw < spec.delete_ratio:
                key, op = live.take(rng), DELETE
                deleted.add(key)
            elif deleted and draw < spec.delete_ratio + spec.reinsert_ratio:
                key, op = deleted.take(rng), UPSERT
                live.add(key)
            elif live and (
                draw < spec.delete_ratio + spec.reinsert_ratio + spec.update_ratio or next_new >= spec.num_keys
            ):
                key, op = live.pick(rng), UPSERT
            else:
                key, op, next_new = next_new, UPSERT, next_new + 1
                live.add(key)
            keys.append(key)
            ops.append(op)
        seqs = np.arange(seq, seq + len(keys), dtype=np.int64)
        seq += len(keys)
        order = rng.permutation(len(keys))  # rows arrive out of _seq order
        yield rng, np.array(keys)[order], np.array(ops)[order], seqs[order]


_EPOCH = np.datetime64("2026-01-01T00:00:00", "s")
_COMPOSITE_SPREAD = 97
"""Key ``n`` of a composite key: ``n // 97`` in the first column, ``n % 97`` in the next."""


def key_values(schema: pa.Schema, primary_key: Sequence[str], keys: np.ndarray) -> dict[str, pa.Array]:
    """The key columns for integer keys ``keys``: each ``n`` a distinct key (tuple), deterministically."""
    parts, rest = [], np.asarray(keys, dtype=np.int64)
    for _ in primary_key[1:]:
        parts.append(rest % _COMPOSITE_SPREAD)
        rest = rest // _COMPOSITE_SPREAD
    parts.append(rest)
    return {
        name: _key_column(name, schema.field(name).type, part)
        for name, part in zip(primary_key, reversed(parts), strict=True)
    }


def _key_column(name: str, kind: pa.DataType, values: np.ndarray) -> pa.Array:
    if pa.types.is_integer(kind):
        return pa.array(values, kind)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return pa.array([f"{name}-{v:09d}" for v in values], kind)
    if pa.types.is_date(kind) or pa.types.is_timestamp(kind):
        return pa.array(_EPOCH + values.astype("timedelta64[D]")).cast(kind)
    raise ValueError(f"key column {name!r}: no generator for type {kind}")


_WORDS_AS_TEXT = np.array(["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "zeta"])


def _random_values(
    schema: pa.Schema, primary_key: Sequence[str], rng: np.random.Generator, n: int
) -> dict[str, pa.Array]:
    columns = {}
    for field in schema:
        if field.name in primary_key:
            continue
        values = _random_column(field, rng, n)
        if field.nullable:
            values = pa.compute.if_else(pa.array(rng.random(n) < 0.05), pa.nulls(n, field.type), values)
        columns[field.name] = values
    return columns


def _random_column(field: pa.Field, rng: np.random.Generator, n: int) -> pa.Array:
    kind = field.type
    if pa.types.is_integer(kind):
        return pa.array(rng.integers(0, 100, n), kind)
    if pa.types.is_floating(kind):
        return pa.array(np.round(rng.random(n) * 1000, 2)).cast(kind)
    if pa.types.is_decimal(kind):
        cents = rng.integers(0, 10 ** min(kind.precision, 15), n)
        return pa.array([decimal.Decimal(int(c)).scaleb(-kind.scale) for c in cents], kind)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return pa.array(_WORDS_AS_TEXT[rng.integers(0, len(_WORDS_AS_TEXT), n)], kind)
    if pa.types.is_boolean(kind):
        return pa.array(rng.random(n) < 0.5)
    if pa.types.is_date(kind) or pa.types.is_timestamp(kind):
        return pa.array(_EPOCH + rng.integers(0, 86_400 * 365, n).astype("timedelta64[s]")).cast(kind)
    if pa.types.is_fixed_size_list(kind) and pa.types.is_floating(kind.value_type):
        vectors = rng.standard_normal(n * kind.list_size).astype(np.float32)
        return pa.FixedSizeListArray.from_arrays(pa.array(vectors).cast(kind.value_type), kind.list_size)
    raise ValueError(f"column {field.name!r}: no generator for type {kind}")


def replay(batches: list[pa.Table], key: str = "id") -> dict[object, dict[str, object]]:
    """The oracle: apply batches in order, highest ``_seq`` wins within a batch."""
    return _apply(batches, lambda row: row[key])


def replay_table(batches: list[pa.Table], primary_key: Sequence[str]) -> dict[tuple[object, ...], dict[str, object]]:
    """:func:`replay` for any key: the live rows by key tuple."""
    return _apply(batches, lambda row: tuple(row[k] for k in primary_key))


def _apply(batches: list[pa.Table], key_of: Callable[[dict[str, object]], Any]) -> dict[Any, dict[str, object]]:
    """Rows applied one by one in ``_seq`` order; a column a row's ``_unset`` names keeps its value (null if new)."""
    state: dict[Any, dict[str, object]] = {}
    for batch in batches:
        for row in sorted(batch.to_pylist(), key=lambda r: r[SEQ_COLUMN]):
            key = key_of(row)
            if row[OP_COLUMN] == DELETE:
                state.pop(key, None)
                continue
            unset = set(row.get(UNSET_COLUMN) or ())
            given = {k: v for k, v in row.items() if k not in (OP_COLUMN, SEQ_COLUMN, UNSET_COLUMN) and k not in unset}
            state[key] = {**dict.fromkeys(unset), **state.get(key, {}), **given}
    return state


class _KeyPool:
    """A set of keys with O(1) uniform random pick and removal."""

    def __init__(self) -> None:
        self._keys: list[int] = []
        self._index: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, key: int) -> None:
        if key not in self._index:
            self._index[key] = len(self._keys)
            self._keys.append(key)

    def pick(self, rng: np.random.Generator) -> int:
        return self._keys[int(rng.integers(len(self._keys)))]

    def take(self, rng: np.random.Generator) -> int:
        key = self.pick(rng)
        position, last = self._index.pop(key), self._keys.pop()
        if last != key:
            self._keys[position], self._index[last] = last, position
        return key


def _batch(
    spec: ChangeStreamSpec, rng: np.random.Generator, keys: np.ndarray, ops: np.ndarray, seqs: np.ndarray
) -> pa.Table:
    n = len(keys)
    columns = {
        "id": pa.array(keys, pa.int64()),
        "customer": pa.array([f"c{k % 997}" for k in keys]),
        "amount": pa.array(np.round(rng.random(n) * 1000, 2)),
        "status": pa.array(_STATUSES[rng.integers(0, len(_STATUSES), n)]),
    }
    if spec.vector_dim:
        vectors = rng.standard_normal((n, spec.vector_dim), dtype=np.float32)
        columns["embedding"] = pa.FixedSizeListArray.from_arrays(vectors.ravel(), spec.vector_dim)
    if spec.with_text:
        words = _WORDS[rng.integers(0, len(_WORDS), (n, 6))]
        columns["description"] = pa.array([" ".join(w) for w in words])
    columns[OP_COLUMN] = pa.array(ops)
    columns[SEQ_COLUMN] = pa.array(seqs, pa.int64())
    return pa.table(columns)


_WORDS = np.array(
    ["express", "parcel", "fragile", "refund", "priority", "gift", "bulk", "order", "late", "early", "damaged", "green"]
)

# Each kind of malformed row, and the reason ingestion must quarantine it for.
MALFORMED_KINDS = ("null key", "bad type", "unknown _op", "unknown column")


def malformed_rows(count: int, next_key: int) -> list[dict[str, object]]:
    """``count`` rows that ingestion must quarantine, cycling through ``MALFORMED_KINDS``."""
    rows: list[dict[str, object]] = []
    for i in range(count):
        kind = MALFORMED_KINDS[i % len(MALFORMED_KINDS)]
        row = {
            "id": next_key + i,
            "customer": "bad",
            "amount": "12.5",
            "status": "new",
            OP_COLUMN: "upsert",
            SEQ_COLUMN: i,
        }
        if kind == "null key":
            row["id"] = None
        elif kind == "bad type":
            row["amount"] = "twelve"
        elif kind == "unknown _op":
            row[OP_COLUMN] = "upsert-please"
        else:
            row["colour"] = "red"
        rows.append(row)
    return rows


def write_landing_files(
    spec: ChangeStreamSpec, landing_dir: str, fmt: str = "parquet", malformed_per_file: int = 0, prefix: str = "changes"
) -> list[pa.Table]:
    """Write each generated batch as one landing file; return the clean batches.

    ``landing_dir`` is a local path or a URI (``s3://...``, configured by
    the environment). Files are named ``{prefix}-{n:06d}.{parquet|jsonl|csv}``
    and appear atomically (a ``.tmp`` name, never listed, is renamed; a single
    PUT on an object store). Malformed rows use keys no clean row uses, so the
    clean batches are the oracle's input.
    """
    return write_table_landing_files(
        spec.schema, ["id"], spec, landing_dir, fmt, malformed_per_file=malformed_per_file, prefix=prefix
    )


def write_table_landing_files(
    schema: pa.Schema,
    primary_key: Sequence[str],
    spec: ChangeStreamSpec,
    landing_dir: str,
    fmt: str = "parquet",
    *,
    malformed_per_file: int = 0,
    prefix: str = "changes",
    storage_options: dict[str, str] | None = None,
) -> list[pa.Table]:
    """Write a generated change stream of any table as landing files; return the clean batches.

    The events table (``spec.schema`` keyed by ``id``) gets :func:`generate_changes`'
    stream, any other table :func:`generate_table_changes`'. ``fmt`` is a landing
    format or ``"debezium"`` (JSON Lines of Debezium envelopes, see
    :func:`debezium_records`). Malformed rows exist for the events table only.

    Raises
    ------
    ValueError
        For an unknown format, or malformed rows asked of another table.
    """
    events = _columns(schema) == _columns(spec.schema) and list(primary_key) == ["id"]
    if malformed_per_file and not events:
        raise ValueError("malformed rows are generated for the events table (id, customer, amount, status) only")
    batches = list(generate_changes(spec) if events else generate_table_changes(schema, primary_key, spec))
    storage = TableStorage(landing_dir, storage_options)
    for number, batch in enumerate(batches):
        if fmt == "debezium":
            lines = "".join(json.dumps(r, default=str) + "\n" for r in debezium_records(batch, primary_key))
            storage.write_bytes_atomic(f"{prefix}-{number:06d}.jsonl", lines.encode())
        else:
            write_landing_file(batch, landing_dir, number, fmt, malformed_per_file, prefix, storage_options)
    return batches


def _columns(schema: pa.Schema) -> list[tuple[str, pa.DataType]]:
    """Names and types (a table's schema also carries key metadata and non-null keys)."""
    return [(f.name, f.type) for f in schema]


def debezium_records(batch: pa.Table, primary_key: Sequence[str]) -> list[dict[str, object]]:
    """``batch``'s changes as Debezium envelopes: ``u`` with ``after`` for an upsert, ``d`` with the key
    in ``before`` for a delete, ``source.lsn`` = ``_seq`` (so ``order_by: source.lsn`` keeps the order).
    An ``after`` leaves out the fields its row does not set (``_unset``)."""
    records: list[dict[str, object]] = []
    for row in _records(batch):
        values = {k: v for k, v in row.items() if k not in (OP_COLUMN, SEQ_COLUMN)}
        deleted = row[OP_COLUMN] == DELETE
        records.append(
            {
                "op": "d" if deleted else "u",
                "before": {k: values[k] for k in primary_key} if deleted else None,
                "after": None if deleted else values,
                "source": {"lsn": row[SEQ_COLUMN]},
                "ts_ms": int(row[SEQ_COLUMN]),
            }
        )
    return records


def write_landing_file(
    batch: pa.Table,
    landing_dir: str,
    number: int,
    fmt: str = "parquet",
    malformed_per_file: int = 0,
    prefix: str = "changes",
    storage_options: dict[str, str] | None = None,
) -> str:
    """Write one batch as landing file ``{prefix}-{number:06d}.<ext>``, atomically; return its name.

    For streams that arrive over time (a soak test feeding a continuous ingestion).
    """
    if fmt not in _EXTENSIONS:
        raise ValueError(f"unknown landing format {fmt!r}; use one of {sorted(_EXTENSIONS)}")
    bad = malformed_rows(malformed_per_file, next_key=10**12 + number * 1000)
    name = f"{prefix}-{number:06d}.{_EXTENSIONS[fmt]}"
    TableStorage(landing_dir, storage_options).write_bytes_atomic(name, _file_bytes(batch, bad, fmt))
    return name


_EXTENSIONS = {"parquet": "parquet", "jsonl": "jsonl", "csv": "csv"}


def _file_bytes(batch: pa.Table, bad: list[dict[str, object]], fmt: str) -> bytes:
    """One landing file's content: ``batch`` then the malformed rows ``bad``, in format ``fmt``."""
    if fmt == "jsonl":  # a field a row does not set is left out of its record
        return "".join(json.dumps(row) + "\n" for row in _records(batch) + bad).encode()
    if UNSET_COLUMN in batch.column_names and fmt == "csv":  # text: the names, comma-separated
        unset = pa.array([",".join(names) for names in batch[UNSET_COLUMN].to_pylist()])
        batch = batch.set_column(batch.schema.get_field_index(UNSET_COLUMN), UNSET_COLUMN, unset)
    rows = batch.to_pylist() + bad
    if bad:
        # Values as text, so a file can carry the malformed ones; the table
        # schema's types are restored by casting at ingestion.
        columns = sorted({k for row in rows for k in row}, key=[*batch.column_names, "colour"].index)
        batch = pa.table(
            {c: pa.array([None if r.get(c) is None else _text(r.get(c)) for r in rows], pa.string()) for c in columns}
        )
    sink = pa.BufferOutputStream()
    if fmt == "parquet":
        pq.write_table(batch, sink)
    else:
        pacsv.write_csv(batch, sink)
    return bytes(sink.getvalue().to_pybytes())


def _records(batch: pa.Table) -> list[dict[str, Any]]:
    """``batch``'s rows as records, each without the fields its ``_unset`` names (nor ``_unset`` itself)."""
    rows: list[dict[str, Any]] = batch.to_pylist()
    if UNSET_COLUMN not in batch.column_names:
        return rows
    return [{k: v for k, v in r.items() if k != UNSET_COLUMN and k not in (r[UNSET_COLUMN] or ())} for r in rows]


def _text(value: object) -> str:
    return json.dumps(value) if isinstance(value, list) else str(value)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write a generated change stream as landing files.")
    parser.add_argument("--landing-dir", default=os.environ.get("LSM_LANDING_DIR", "data/landing"))
    parser.add_argument("--format", choices=sorted(_EXTENSIONS), default="parquet")
    parser.add_argument("--num-keys", type=int, default=ChangeStreamSpec.num_keys)
    parser.add_argument("--num-batches", type=int, default=ChangeStreamSpec.num_batches)
    parser.add_argument("--batch-size", type=int, default=ChangeStreamSpec.batch_size)
    parser.add_argument("--update-ratio", type=float, default=ChangeStreamSpec.update_ratio)
    parser.add_argument("--delete-ratio", type=float, default=ChangeStreamSpec.delete_ratio)
    parser.add_argument("--reinsert-ratio", type=float, default=ChangeStreamSpec.reinsert_ratio)
    parser.add_argument("--vector-dim", type=int, default=0, help="add an embedding column of this size")
    parser.add_argument("--with-text", action="store_true", help="add a description text column")
    parser.add_argument(
        "--partial-ratio", type=float, default=0.0, help="share of upserts setting only some columns (partial-update)"
    )
    parser.add_argument("--malformed-rows", type=int, default=0, help="bad rows per file (quarantined)")
    parser.add_argument("--prefix", default="changes", help="file-name prefix (files sort by name)")
    parser.add_argument("--seed", type=int, default=ChangeStreamSpec.seed)
    args = parser.parse_args(argv)
    spec = ChangeStreamSpec(
        num_keys=args.num_keys,
        num_batches=args.num_batches,
        batch_size=args.batch_size,
        update_ratio=args.update_ratio,
        delete_ratio=args.delete_ratio,
        reinsert_ratio=args.reinsert_ratio,
        seed=args.seed,
        vector_dim=args.vector_dim,
        with_text=args.with_text,
        partial_ratio=args.partial_ratio,
    )
    batches = write_landing_files(spec, args.landing_dir, args.format, args.malformed_rows, args.prefix)
    print(
        f"wrote {len(batches)} {args.format} files ({sum(b.num_rows for b in batches)} change rows) "
        f"to {args.landing_dir}"
    )


if __name__ == "__main__":
    main()
