"""Shared set-up for the compaction and GC tests, and a crash worker.

As a program, it runs one maintenance step on a table and SIGKILLs itself at
a chosen point (a real process kill, nothing gets to clean up)::

    python -m tests.resources.lsm.maintenance.maintenance_helpers URI compact before-commit N
    python -m tests.resources.lsm.maintenance.maintenance_helpers URI compact during-commit N DELAY
    python -m tests.resources.lsm.maintenance.maintenance_helpers URI compact after-commit N
    python -m tests.resources.lsm.maintenance.maintenance_helpers URI gc after-delete N

``N`` counts base commits (data commits, marker commits, or a first merge's
data-and-marker commits; or GC directory deletions) from 1; a compaction
commits at most ``CRASH_PASS_ROWS`` generation rows at a time (a pending run
whole), so it makes several commits, some holding more than one shard;
``during-commit`` kills DELAY seconds after the N-th commit started, wherever
it is by then (still writing, committing, or just done).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import lance
import pyarrow as pa
from lance.dataset import MergeInsertBuilder

from resources.lsm import LsmTable
from resources.lsm.format.compaction_marker import read_compacted_generations
from resources.lsm.format.merge_claims import CLAIM_PROPERTY
from resources.lsm.format.schema import TOMBSTONE_COLUMN
from resources.lsm.maintenance import compaction, gc as lsm_gc
from resources.lsm.testing.changegen import EVENTS_SCHEMA, ChangeStreamSpec, generate_changes, replay
from tests.helpers import rows_by_key

REPO_ROOT = Path(__file__).resolve().parents[4]
UNFLUSHED_BATCHES = 1
CRASH_PASS_ROWS = 400


def build_change_table(
    uri: str, *, num_shards: int = 3, num_batches: int = 6, batch_size: int = 500, num_keys: int = 2500, seed: int = 7
) -> tuple[LsmTable, list[pa.Table]]:
    """A table fed by the change generator (updates, deletes, re-inserts).

    Every batch but the last is flushed into its own generation in every
    shard; the last stays in the WAL. Returns the table and the batches.
    """
    spec = ChangeStreamSpec(num_keys=num_keys, num_batches=num_batches, batch_size=batch_size, seed=seed)
    batches = list(generate_changes(spec))
    table = LsmTable.create(uri, EVENTS_SCHEMA, ["id"], num_shards=num_shards)
    for batch in batches[:-UNFLUSHED_BATCHES]:
        table.write(batch)
        table.close()
    for batch in batches[-UNFLUSHED_BATCHES:]:
        table.write(batch)
    table.detach_writers()  # leave the tail in the WAL, as a crashed writer does
    return LsmTable.open(uri), batches


def oracle_view(batches: list[pa.Table]) -> dict:
    """The expected merged view, keyed like :func:`rows_by_key`."""
    return {(k,): row for k, row in replay(batches).items()}


def assert_view(table: LsmTable, batches: list[pa.Table]) -> None:
    """The merged view equals the oracle of ``batches``."""
    assert rows_by_key(table.read()) == oracle_view(batches)


def assert_base_sane(uri: str) -> None:
    """The base table has unique keys and no MemWAL bookkeeping column."""
    base = lance.dataset(uri).to_table()
    assert TOMBSTONE_COLUMN not in base.column_names
    keys = base["id"].to_pylist()
    assert len(keys) == len(set(keys)), "duplicate keys in the base table"


def _marker_history(table: LsmTable) -> list[dict[str, int]]:
    return [read_compacted_generations(table.handle.storage, v["version"]) for v in table.dataset().versions()]


def marker_advances(table: LsmTable) -> dict[str, int]:
    """Per shard, how many base versions moved its compacted marker."""
    history = _marker_history(table)
    return {
        s: sum(1 for before, after in itertools.pairwise(history) if after.get(s, 0) != before.get(s, 0))
        for s in table.shard_ids
    }


def merge_commits(table: LsmTable) -> int:
    """How many base versions moved some shard's compacted marker (merge commits)."""
    history = _marker_history(table)
    return sum(1 for before, after in itertools.pairwise(history) if after != before)


def data_commits(table: LsmTable) -> int:
    """How many base versions are data commits that claimed generations (their markers followed separately)."""
    base = table.dataset()
    return sum(
        1
        for v in base.versions()
        if v["version"] > 1 and CLAIM_PROPERTY in (_transaction_properties(base, v["version"]))
    )


def _transaction_properties(base: lance.LanceDataset, version: int) -> dict[str, str]:
    try:
        transaction = base.read_transaction(version)
    except TypeError:  # pylance 14.0.2 cannot decode index rewrites (file compaction)
        return {}
    return dict(transaction.transaction_properties or {}) if transaction else {}


def markers_only_advance(table: LsmTable) -> bool:
    """No base version moved a shard's compacted marker backwards (nothing merged twice)."""
    history = _marker_history(table)
    return all(
        after.get(s, 0) >= before.get(s, 0) for before, after in itertools.pairwise(history) for s in table.shard_ids
    )


def run_worker(uri: str, *args: object) -> int:
    """Run this module as a subprocess; return its exit code (-SIGKILL when it killed itself)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", __name__, uri, *map(str, args)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode in (0, -signal.SIGKILL), proc.stderr
    return proc.returncode


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_at_commit(mode: str, nth: int, delay: float) -> None:
    """Kill at the ``nth`` base commit of a merge: data commits and marker (or whole) commits alike."""
    calls = 0

    def killing(original):
        def commit(*args, **kwargs):
            nonlocal calls
            calls += 1
            if calls != nth:
                return original(*args, **kwargs)
            if mode == "before-commit":
                _kill_self()
            if mode == "during-commit":
                threading.Timer(delay, _kill_self).start()
            result = original(*args, **kwargs)
            if mode == "during-commit":
                time.sleep(delay + 5)  # the timer fires after the commit finished
            _kill_self()
            return result

        return commit

    MergeInsertBuilder.execute = killing(MergeInsertBuilder.execute)
    compaction.commit_data = killing(compaction.commit_data)


def _kill_after_delete(nth: int) -> None:
    original = lsm_gc.delete_dir
    calls = 0

    def killing_delete_dir(*args, **kwargs):
        nonlocal calls
        calls += 1
        result = original(*args, **kwargs)
        if calls == nth:
            _kill_self()
        return result

    lsm_gc.delete_dir = killing_delete_dir


def main(argv: list[str]) -> None:
    uri, step, mode, nth = argv[0], argv[1], argv[2], int(argv[3])
    table = LsmTable.open(uri)
    if step == "compact":
        _kill_at_commit(mode, nth, float(argv[4]) if len(argv) > 4 else 0.0)
        table.compact(max_rows_per_pass=CRASH_PASS_ROWS)
    else:
        _kill_after_delete(nth)
        table.gc(orphan_grace_seconds=0, wal_grace_seconds=0, retain_versions=1, older_than=None)


if __name__ == "__main__":
    main(sys.argv[1:])
