"""Keep every shard's pending run in step with its pending generations.

A pending run (:mod:`resources.lsm.read.pending_run`) resolves a shard's
pending generations into one file with the deletion vector of the base rows
they supersede. Finding those rows costs a key-index query or a key-column
scan of the base, so building runs is maintenance work, never the write
path's. A stored run that is current is kept; one over a prefix of the
pending generations is extended; one whose deletion vector a base rewrite
made stale is rebuilt.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..format.shard_state import ShardState
from ..handle import TableHandle
from ..read.deletion_vector import fragment_ids
from ..read.level_readers import level_readers
from ..read.pending_run import PendingRun, build_runs, run_path, store_run


def has_pending_run(handle: TableHandle, state: ShardState) -> bool:
    """Whether a run over all of ``state``'s pending generations is stored (``True`` if none is pending)."""
    pending = state.pending_generations
    return not pending or handle.storage.exists(run_path(state.shard_id, pending))


def build_pending_runs(handle: TableHandle, shard_ids: Sequence[str]) -> dict[str, int]:
    """(Re)build the runs of ``shard_ids`` that are missing or stale; return the changes stored per shard.

    Idempotent, and cheap when nothing changed: current runs are only checked.
    """
    if not shard_ids:
        return {}
    dataset = handle.dataset()
    present = fragment_ids(dataset)
    states = [s for s in handle.shard_states(dataset, shard_ids, for_read=True) if s.pending_generations]

    def stored_run(state: ShardState) -> tuple[PendingRun | None, bool]:
        """The shard's stored run over a prefix of its pending generations, and whether it is current."""
        run = handle.runs.find(state, quiet=True)
        if run is None or run.generations != state.pending_generations:
            return run, False
        if handle.storage.exists(run_path(state.shard_id, run.generations)) and run.superseded.holds_in(present):
            return run, True
        handle.runs.forget(run)
        return run, False

    # Run files and generations are read and written on the level readers' threads (none waits on them).
    pool = level_readers()
    found = list(pool.map(stored_run, states))
    previous = {state.shard_id: run for state, (run, _) in zip(states, found, strict=True)}
    stale = [state for state, (_, current) in zip(states, found, strict=True) if not current]
    runs = handle.retrying(
        lambda: build_runs(
            handle.storage,
            dataset,
            stale,
            list(handle.primary_key),
            previous,
            fragments=present,
            session=handle.session,
            map=pool.map,
        ),
        "build the pending runs",
    )

    def store(run: PendingRun) -> None:
        handle.retrying(lambda: store_run(handle.storage, run), f"store the pending run of shard {run.shard_id}")
        handle.runs.remember(run)

    list(pool.map(store, runs))
    return {run.shard_id: run.changes.num_rows for run in runs}
