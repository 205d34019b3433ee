"""Generate realistic change streams (upserts, deletes, re-inserts) and their oracle.

Used by the demo job, the tests and the benchmarks. Deterministic for a seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa

from .schema import DELETE, OP_COLUMN, SEQ_COLUMN, UPSERT

EVENTS_SCHEMA = pa.schema([
    ("id", pa.int64()),
    ("customer", pa.string()),
    ("amount", pa.float64()),
    ("status", pa.string()),
])
"""The platform's default table: one row per order id."""

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


def generate_changes(spec: ChangeStreamSpec) -> Iterator[pa.Table]:
    """Yield ``spec.num_batches`` change batches of ``EVENTS_SCHEMA`` + ``_op``/``_seq``."""
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
            elif live and (draw < spec.delete_ratio + spec.reinsert_ratio + spec.update_ratio
                           or next_new >= spec.num_keys):
                key, op = live.pick(rng), UPSERT
            else:
                key, op, next_new = next_new, UPSERT, next_new + 1
                live.add(key)
            keys.append(key)
            ops.append(op)
        seqs = np.arange(seq, seq + len(keys), dtype=np.int64)
        seq += len(keys)
        order = rng.permutation(len(keys))  # rows arrive out of _seq order
        yield _batch(rng, np.array(keys)[order], np.array(ops)[order], seqs[order])


def replay(batches: list[pa.Table], key: str = "id") -> dict:
    """The oracle: apply batches in order, highest ``_seq`` wins within a batch."""
    state: dict = {}
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


def _batch(rng: np.random.Generator, keys: np.ndarray, ops: np.ndarray, seqs: np.ndarray) -> pa.Table:
    n = len(keys)
    return pa.table({
        "id": pa.array(keys, pa.int64()),
        "customer": pa.array([f"c{k % 997}" for k in keys]),
        "amount": pa.array(np.round(rng.random(n) * 1000, 2)),
        "status": pa.array(_STATUSES[rng.integers(0, len(_STATUSES), n)]),
        OP_COLUMN: pa.array(ops),
        SEQ_COLUMN: pa.array(seqs, pa.int64()),
    })
