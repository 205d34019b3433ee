"""When maintenance runs: flush and merge triggers, backpressure, and their defaults.

Plain data and decisions over :class:`~resources.lsm.format.shard_state.ShardState`,
with no I/O and no heavy import, so schedulers (the Dagster sensors) can load
them cheaply and tests can check every rule on made-up states.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ..format.shard_state import ShardState

DEFAULT_MAX_ROWS_PER_PASS = 1_000_000
"""Generation rows one merge commit reads at most."""

DEFAULT_MAX_DELETED_FRACTION = 0.1
DEFAULT_MAX_ROWS_REWRITTEN_PER_PASS = 8 * 1024 * 1024
"""Physical base rows one tidy-up rewrites at most (the rest wait for the next merge's)."""
"""Deleted share of the base's physical rows past which a merge's tidy-up rewrites the fragments holding them."""

DEFAULT_GRACE_SECONDS = 3600.0
"""How long GC keeps consumed WAL entries and orphan directories."""

DEFAULT_VERSION_RETENTION = timedelta(hours=1)
"""How long GC keeps old base versions (and so the generations they list as pending)."""


@dataclass(frozen=True)
class Decision:
    """Why a shard needs work, and a key naming the shard state that asked for it.

    The key changes only when the state does, so a scheduler that remembers
    keys never requests the same work twice.
    """

    reason: str
    key: str


@dataclass(frozen=True)
class FlushTrigger:
    """Flush a shard's unflushed WAL once it is old or big, and quiet.

    A shard with a live writer keeps appending; ``idle_seconds`` without a
    new WAL entry is the sign that its writer is gone (crashed, or an idle
    ingestion), so claiming the shard fences nobody who is working.
    """

    max_age_seconds: float = 300.0
    max_bytes: int = 64 << 20
    idle_seconds: float = 60.0

    def decide(self, state: ShardState, now: float) -> Decision | None:
        """A decision to flush ``state``'s shard at time ``now`` (seconds), or ``None``."""
        if not state.unflushed_wal_entries or state.unflushed_wal_first_mtime_ns is None:
            return None
        age = now - state.unflushed_wal_first_mtime_ns / 1e9
        quiet = now - (state.unflushed_wal_last_mtime_ns or 0) / 1e9
        if quiet < self.idle_seconds or (age < self.max_age_seconds and state.unflushed_wal_bytes < self.max_bytes):
            return None
        return Decision(
            f"{state.unflushed_wal_entries} WAL entries ({state.unflushed_wal_bytes} bytes, {age:.0f}s old)",
            f"flush-{state.shard_id}-epoch{state.writer_epoch}-after{state.replay_after_wal_position}",
        )


@dataclass(frozen=True)
class MergeTrigger:
    """Merge a shard into the base when its pending generations cost readers too much.

    Every pending generation is one more level a read merges, and its rows are
    keys every full scan must filter out of the base. Three limits, any of
    which triggers a merge:

    * ``generations``: read amplification (levels per lookup);
    * ``pending_rows``: the volume waiting, which rises with load: under a
      steady stream, generations grow large before they grow many, and this
      merges them well before ``max_age_seconds``;
    * ``max_age_seconds``: freshness of the base for readers that skip the
      LSM levels (``fresh=False`` consumers, Lance's own full-text search).

    Lower limits keep reads closer to base-scan speed at the price of more
    merge commits (each rewrites the touched base fragments and indexes).
    """

    generations: int = 4
    pending_rows: int = 1_000_000
    max_age_seconds: float = 600.0

    def decide(self, state: ShardState, now: float) -> Decision | None:
        """A decision to merge ``state``'s shard at time ``now`` (seconds), or ``None``."""
        pending = state.pending_generations
        if not pending:
            return None
        age = now - state.oldest_pending_mtime_ns / 1e9 if state.oldest_pending_mtime_ns else 0.0
        if len(pending) < self.generations and state.pending_rows < self.pending_rows and age < self.max_age_seconds:
            return None
        return Decision(
            f"{len(pending)} generations, {state.pending_rows} rows awaiting merge (oldest {age:.0f}s)",
            f"merge-{state.shard_id}-upto{pending[-1][0]}",
        )


class BackpressureError(RuntimeError):
    """Ingestion refused: some shards have too many generations awaiting merge."""


@dataclass(frozen=True)
class BackpressurePolicy:
    """When and how ingestion yields to merging.

    Attributes
    ----------
    stop_generations
        Pending (un-merged) generations in one shard at which ingestion stops.
    mode
        ``"wait"``: poll until every shard is below the threshold (at most
        ``max_wait_seconds``, then fail); ``"fail"``: fail at once.
    """

    stop_generations: int = 16
    mode: Literal["wait", "fail"] = "wait"
    max_wait_seconds: float = 900.0
    poll_seconds: float = 5.0
