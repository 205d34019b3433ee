"""Generate realistic change streams (upserts, deletes, re-inserts) and their oracle.

Used by the demo job, the tests and the benchmarks. Deterministic for a seed.
``scripts/generate_changes.py`` writes landing files from the command line.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ..format.schema import DELETE, OP_COLUMN, SEQ_COLUMN, UPSERT
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

    @property
    def schema(self) -> pa.Schema:
        return events_schema(self.vector_dim, self.with_text)


def generate_changes(spec: ChangeStreamSpec) -> Iterator[pa.Table]:
    """Yield ``spec.num_batches`` change batches of ``spec.schema`` + ``_op``/``_seq``."""
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
        yield _batch(spec, rng, np.array(keys)[order], np.array(ops)[order], seqs[order])


def replay(batches: list[pa.Table], key: str = "id") -> dict[object, dict[str, object]]:
    """The oracle: apply batches in order, highest ``_seq`` wins within a batch."""
    state: dict[object, dict[str, object]] = {}
    for batch in batches:
        for row in sorted(batch.to_pylist(), key=lambda r: r[SEQ_COLUMN]):
            if row[OP_COLUMN] == DELETE:
                state.pop(row[key], None)
            else:
                state[row[key]] = {k: v for k, v in row.items() if k not in (OP_COLUMN, SEQ_COLUMN)}
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
    if fmt not in _EXTENSIONS:
        raise ValueError(f"unknown landing format {fmt!r}; use one of {sorted(_EXTENSIONS)}")
    batches = list(generate_changes(spec))
    for number, batch in enumerate(batches):
        write_landing_file(batch, landing_dir, number, fmt, malformed_per_file, prefix)
    return batches


def write_landing_file(
    batch: pa.Table,
    landing_dir: str,
    number: int,
    fmt: str = "parquet",
    malformed_per_file: int = 0,
    prefix: str = "changes",
) -> str:
    """Write one batch as landing file ``{prefix}-{number:06d}.<ext>``, atomically; return its name.

    For streams that arrive over time (a soak test feeding a continuous ingestion).
    """
    bad = malformed_rows(malformed_per_file, next_key=10**12 + number * 1000)
    name = f"{prefix}-{number:06d}.{_EXTENSIONS[fmt]}"
    TableStorage(landing_dir).write_bytes_atomic(name, _file_bytes(batch, bad, fmt))
    return name


_EXTENSIONS = {"parquet": "parquet", "jsonl": "jsonl", "csv": "csv"}


def _file_bytes(batch: pa.Table, bad: list[dict[str, object]], fmt: str) -> bytes:
    """One landing file's content: ``batch`` then the malformed rows ``bad``, in format ``fmt``."""
    rows = batch.to_pylist() + bad
    if fmt == "jsonl":
        return "".join(json.dumps(row) + "\n" for row in rows).encode()
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
    )
    batches = write_landing_files(spec, args.landing_dir, args.format, args.malformed_rows, args.prefix)
    print(
        f"wrote {len(batches)} {args.format} files ({sum(b.num_rows for b in batches)} change rows) "
        f"to {args.landing_dir}"
    )


if __name__ == "__main__":
    main()
