"""Merge leases: the shards a merge is working on, so that a pending-run keeper leaves their runs to it.

A merge ends by building the runs of the generations flushed while it ran,
over the base it committed (:meth:`~resources.lsm.table.LsmTable.compact`).
A keeper round over the same shards meanwhile builds those runs against the
base the merge is about to change, and the merge's own build then redoes
much of it: beside merges running back to back (64Mi-row string base,
``benchmarks/keeper_cost.py``) ingestion wrote 0.78-0.84x the rows a second
with the keeper as without.

A lease is an empty file per shard, ``<shard>@<until>`` (unix milliseconds),
written when a merge starts and deleted when it ends. A merge that crashed
leaves its lease behind; it lapses at ``until``, and the next merge deletes
it. A lease is only a hint: a keeper that misses one builds a run the merge
rebuilds, one that heeds a stale one leaves readers the no-run path a
little longer. Neither changes what anybody reads.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence

from ..format.layout import MERGE_LEASES_DIR
from ..format.storage import TableStorage

MERGE_LEASE_SECONDS = 900.0
"""How long a lease holds: longer than a merge of a 64Mi-row table takes with its tidy-up (under 2 minutes)."""


@contextlib.contextmanager
def merge_leases(
    storage: TableStorage, shard_ids: Sequence[str], seconds: float = MERGE_LEASE_SECONDS
) -> Iterator[None]:
    """Hold a lease on each of ``shard_ids`` while the block runs (a merge and the runs it builds when it ends).

    Best effort: a lease the store refuses is left out (keepers then build
    those shards' runs too); the block runs either way.
    """
    now_ms = time.time() * 1000
    until_ms = int(now_ms + seconds * 1000)
    names, lapsed = [], []
    with contextlib.suppress(OSError):
        lapsed = [path for path, _, until in _leases(storage) if until <= now_ms]
        for name in (f"{MERGE_LEASES_DIR}/{shard}@{until_ms}" for shard in shard_ids):
            storage.write_bytes_atomic(name, b"")
            names.append(name)
    try:
        yield
    finally:
        for name in names + lapsed:
            with contextlib.suppress(OSError):  # gone already, or the store is down: the lease lapses
                storage.delete_file(name)


def leased_shards(storage: TableStorage) -> set[str]:
    """The shards a merge holds an unexpired lease on (one listing of the lease directory)."""
    now_ms = time.time() * 1000
    return {shard for _, shard, until in _leases(storage) if until > now_ms}


def _leases(storage: TableStorage) -> list[tuple[str, str, int]]:
    """Every lease file: its path, its shard and when it lapses (unix ms). A write's staging file
    (``<lease>.<hex>.tmp``, left behind by a crash) counts as its lease, so that it lapses and goes with it."""
    found = []
    for entry in storage.list_files(MERGE_LEASES_DIR):
        shard, _, rest = entry.name.partition("@")
        until = rest.partition(".")[0]
        if until.isdigit():
            found.append((f"{MERGE_LEASES_DIR}/{entry.name}", shard, int(until)))
    return found
