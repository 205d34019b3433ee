"""Keep every shard's pending run in step with its pending generations.

A pending run (:mod:`resources.lsm.read.pending_run`) resolves a shard's
pending generations into one file with the deletion vector of the base rows
they supersede. Finding those rows costs a key-index query or a key-column
scan of the base, so building runs is maintenance work, never the write
path's. A stored run that is current is kept; one over a prefix of the
pending generations is extended; one whose deletion vector a base rewrite
made stale is rebuilt.

Runs keep up with the generations whoever cuts them: a flush or a merge
builds them when it ends, a batch ingestion once its writers closed, and
while writers stay open (continuous ingestion) a :class:`PendingRunKeeper`
builds them on a thread of its own every few seconds, off the cores of
writers going flat out when it can (:mod:`~resources.lsm.write.activity`),
and leaving the shards a merge is working on to that merge
(:mod:`~resources.lsm.maintenance.merge_leases`).
Building a run never claims a shard: it reads generations and the base and
writes one file, so it never fences or waits for a writer.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..format.shard_state import ShardState, generation_flush_time_ns
from ..handle import TableHandle
from ..read.deletion_vector import fragment_ids
from ..read.key_hash_files import key_files, write_missing_key_hashes
from ..read.level_readers import level_readers
from ..read.pending_run import PendingRun, build_runs, run_path, store_run
from ..write.activity import PAUSE_SECONDS
from .merge_leases import leased_shards


def has_pending_run(handle: TableHandle, state: ShardState) -> bool:
    """Whether a run over all of ``state``'s pending generations is stored (``True`` if none is pending)."""
    pending = state.pending_generations
    return not pending or handle.storage.exists(run_path(state.shard_id, pending))


def build_pending_runs(
    handle: TableHandle, shard_ids: Sequence[str], *, store_key_files: bool = True
) -> list[PendingRun]:
    """(Re)build the runs of ``shard_ids`` that are missing or stale; return the runs stored.

    Then, with ``store_key_files``, stores the key files base fragments lack
    (:mod:`~resources.lsm.read.key_hash_files`, :func:`key_files`): after a
    merge, those of the fragments it wrote. Idempotent, and cheap when nothing
    changed: current runs are only checked.
    """
    if not shard_ids:
        return []
    dataset = handle.dataset()
    present = fragment_ids(dataset)
    states = [s for s in handle.shard_states(dataset, shard_ids, for_read=True) if s.pending_generations]

    def stored_run(state: ShardState) -> tuple[PendingRun | None, bool]:
        """The shard's stored run over a prefix of its pending generations, and whether it is current."""
        run = handle.runs.find(state, maintenance=True)
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
    # A shard a merge took part of has no run to extend: the run it merged from lends the base rows it found.
    lenders = {
        state.shard_id: lender
        for state in stale
        if previous[state.shard_id] is None and (lender := handle.runs.partly_merged(state)) is not None
    }
    runs = handle.retrying(
        lambda: build_runs(
            handle.storage,
            dataset,
            stale,
            list(handle.primary_key),
            previous,
            lenders=lenders,
            fragments=present,
            session=handle.session,
            map=pool.map,
        ),
        "build the pending runs",
    )

    def store(run: PendingRun) -> None:
        handle.retrying(lambda: store_run(handle.storage, run), f"store the pending run of shard {run.shard_id}")
        handle.runs.remember(run)
        _retire_extended(handle, previous[run.shard_id], run)

    list(pool.map(store, runs))
    # After the runs: a base's first key files (a read of every fragment's keys) must not delay them.
    if store_key_files:
        write_missing_key_hashes(handle.storage, dataset, list(handle.primary_key), key_files(handle.storage, dataset))
    return runs


def _retire_extended(handle: TableHandle, extended: PendingRun | None, run: PendingRun) -> None:
    """Delete ``extended``, the stored run ``run`` (just stored) extends over more generations.

    Beside live writers a keeper stores a longer run every few seconds, each
    a rewrite of the shard's whole run (a 64Mi-row table under 50k changes a
    second filled 17 GB with them in 20 minutes), so the run it extended goes
    at once rather than after GC's orphan grace. A reader that holds it keeps
    its copy in memory; one that listed it and finds it gone reads the
    generations instead (:meth:`~resources.lsm.read.pending_run.PendingRuns.find`).
    """
    if extended is None or extended.generations == run.generations:
        return
    with contextlib.suppress(FileNotFoundError):  # retired by another build, or by GC
        handle.storage.delete_file(run_path(extended.shard_id, extended.generations))
    handle.runs.forget(extended)


DEFAULT_KEEPER_INTERVAL_SECONDS = 2.0
DEFAULT_KEEPER_BUSY_SHARE = 0.25
"""The share of the time a keeper spends building runs, at most: after a round of ``t`` seconds it waits
``t * (1 - share) / share`` (at least its interval). Beside a writer putting rows as fast as 2 cores take them
(64Mi-row base, 4 shards), rounds take 7-10 s and back to back cost the writer a fifth of its rows a second;
fewer, longer rounds also rewrite each shard's run fewer times for the same generations."""

DEFAULT_KEEPER_PATIENCE_SECONDS = 20.0
"""How long after its last round a keeper waits, at most, while the writers are bound by the cores.

A writer going flat out on 2 cores is slowed by anything beside it, however niced (its own CPU rises). With no
merger (64Mi-row base, string keys, ``benchmarks/keeper_cost.py --alone``), 15 s flat out wrote 0.79x the rows a
second with rounds that never waited as without, 1.13x with rounds that waited (none ran); 60 s flat out 0.86x
against 0.85-0.96x (waiting defers a round, it does not shrink it). Writers held for merge capacity
are bound by merges instead, and a round that waited for their pause would start with the merge it should have
fed (its runs lost to the merge's join): there rounds never wait."""

log = logging.getLogger(__name__)


@dataclass
class KeeperStats:
    """What a :class:`PendingRunKeeper` did."""

    rounds: int = 0
    runs_built: int = 0
    changes_resolved: int = 0
    busy_seconds: float = 0.0
    """Time spent building runs (on the keeper's thread, not the writer's)."""
    longest_round_seconds: float = 0.0
    """The longest round: what a generation flushed just after a round started waits for, besides the interval."""
    max_delay_seconds: float = 0.0
    """The longest time from a generation's flush to the first run over it being stored (a run rebuilt over
    generations a run already covered, one a rewrite of the base made stale, does not count)."""
    errors: int = 0
    rounds_beside_writes: int = 0
    """Rounds started while the writers were bound by the cores: they had not paused within the keeper's patience."""
    shards_left_to_merges: int = 0
    """Shards passed over by a round because a merge held them (:mod:`~resources.lsm.maintenance.merge_leases`),
    counted once per round: the merge builds their runs as it ends."""


class PendingRunKeeper:
    """Builds the runs of generations live writers cut, every ``interval_seconds``, on a thread of its own.

    While this process's writers of the table are bound by the cores
    (:meth:`~resources.lsm.write.activity.WriteActivity.cores_bound`: no
    pause, no recent wait for merge capacity), a round waits for them to
    pause, for at most ``patience_seconds`` after the last round (0: never).
    A generation gets its run within about ``interval_seconds``
    plus one build after it is flushed while rounds are short and the
    writers pause, and within ``patience_seconds`` plus one build while they
    do not; a generation of a shard a merge holds a lease on gets its run
    when that merge ends (it builds the runs of what was flushed meanwhile).
    A round that took long (a writer cutting generations faster than
    they are built, cores taken by a merge) is followed by a longer wait, so
    that building takes at most ``busy_share`` of the time; that wait, when
    longer, stands for the interval and the patience. A round builds
    runs only: the key files of fragments a merge or rewrite added are the
    merge's to store (it does so as it commits), and reading back a
    rewritten base's keys here (64Mi rows: tens of seconds on busy cores)
    held every run behind it. A failed
    round (a store outage, a merge racing it) is logged and retried at the
    next one; it never reaches the writers. Use as a context manager around
    the writes: leaving it stops the thread (after its current round).
    """

    def __init__(
        self,
        handle: TableHandle,
        interval_seconds: float = DEFAULT_KEEPER_INTERVAL_SECONDS,
        report: Callable[[str], None] | None = None,
        busy_share: float = DEFAULT_KEEPER_BUSY_SHARE,
        patience_seconds: float = DEFAULT_KEEPER_PATIENCE_SECONDS,
    ) -> None:
        if not 0 < busy_share <= 1:
            raise ValueError(f"busy_share must be in (0, 1], not {busy_share}")
        self._handle, self._interval, self._busy_share = handle, interval_seconds, busy_share
        self._patience = patience_seconds
        self._report = report or log.warning
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lsm-run-keeper", daemon=True)
        self._newest_covered: dict[str, str] = {}
        """Each shard's newest generation (directory) a run this keeper built covers."""
        self.stats = KeeperStats()

    def __enter__(self) -> PendingRunKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopped.set()
        self._thread.join()

    def _loop(self) -> None:
        pause = self._interval
        while True:
            ended = time.monotonic()
            if self._stopped.wait(pause) or not self._await_cores(ended + max(pause, self._patience)):
                return
            before = self.stats.busy_seconds
            self.keep_up()
            took = self.stats.busy_seconds - before  # the round's seconds, as keep_up counted them
            pause = max(self._interval, took * (1 - self._busy_share) / self._busy_share)

    def _await_cores(self, deadline: float) -> bool:
        """Wait while the writers are bound by the cores, until ``deadline`` (monotonic) at most; ``False`` if the
        keeper was stopped."""
        writes = self._handle.write_activity
        while writes.cores_bound():
            left = deadline - time.monotonic()
            if left <= 0:
                self.stats.rounds_beside_writes += 1
                return True
            if self._stopped.wait(min(left, PAUSE_SECONDS)):
                return False
        return True

    def keep_up(self) -> None:
        """One round: build the runs missing now, but those of shards a merge holds, adding what it did to
        :attr:`stats`.

        A failure is counted and reported, never raised: readers join keys
        for those generations until a later round (or the flush sensor) builds
        their runs.
        """
        started = time.monotonic()
        try:
            merging = leased_shards(self._handle.storage)
            shard_ids = [shard for shard in self._handle.shard_ids if shard not in merging]
            self.stats.shards_left_to_merges += len(self._handle.shard_ids) - len(shard_ids)
            built = build_pending_runs(self._handle, shard_ids, store_key_files=False)
            done_ns = time.time_ns()
            delays = [done_ns - flushed for flushed in self._first_covered_flushes(built)]
        except Exception as exc:  # a round is only a shortcut for readers
            self.stats.errors += 1
            self._report(f"building pending runs failed (readers join keys until a later build): {exc!r}")
            return
        finally:
            took = time.monotonic() - started
            self.stats.rounds += 1
            self.stats.busy_seconds += took
            self.stats.longest_round_seconds = max(self.stats.longest_round_seconds, took)
        self.stats.runs_built += len(built)
        self.stats.changes_resolved += sum(run.changes.num_rows for run in built)
        self.stats.max_delay_seconds = max([self.stats.max_delay_seconds, *(d / 1e9 for d in delays)])

    def _first_covered_flushes(self, built: list[PendingRun]) -> list[int]:
        """When the newest generation each run just built covers was flushed, for those no earlier run of this
        keeper covered (and records them as covered now)."""
        newest = {run.shard_id: run.generations[-1][1] for run in built}
        first = {shard: name for shard, name in newest.items() if self._newest_covered.get(shard) != name}
        self._newest_covered.update(newest)
        times = [generation_flush_time_ns(self._handle.storage, shard, name) for shard, name in first.items()]
        return [t for t in times if t is not None]
