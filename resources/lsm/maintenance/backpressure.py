"""Backpressure: stop ingestion while merging into the base falls behind.

Every un-merged generation is one more level each read has to merge, so a
shard's pending-generation count bounds read amplification. When a shard
reaches ``stop_generations``, ingestion either waits for the merge to catch up
(saying why) or fails fast with :class:`BackpressureError`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..handle import TableHandle
from .policy import BackpressureError, BackpressurePolicy


def await_merge_capacity(
    table: TableHandle,
    policy: BackpressurePolicy,
    log: Callable[[str], None] = print,
    stopped: Callable[[], bool] = lambda: False,
) -> float:
    """Return once every shard is below ``policy.stop_generations``, or once ``stopped()`` (asked at each poll)
    says the caller has nothing more to write; seconds waited.

    Raises
    ------
    BackpressureError
        In ``"fail"`` mode when a shard is at the threshold, or in ``"wait"``
        mode when merging has not caught up within ``max_wait_seconds``.
    """
    started = time.monotonic()
    while True:
        behind = {
            s.bucket: len(s.pending_generations)
            for s in table.shard_states()
            if len(s.pending_generations) >= policy.stop_generations
        }
        if not behind or stopped():
            return time.monotonic() - started
        message = (
            f"backpressure: shards {sorted(behind)} have {behind} generations awaiting merge "
            f"(stop threshold {policy.stop_generations})"
        )
        waited = time.monotonic() - started
        if policy.mode == "fail" or waited >= policy.max_wait_seconds:
            raise BackpressureError(
                f"{message}; run merge_job or let the merge sensor catch up"
                + (f" (waited {waited:.0f}s)" if waited else "")
            )
        log(f"{message}; waiting for merges ({waited:.0f}s so far)")
        table.write_activity.held()  # merges bound the writers: a pending-run keeper may take the cores
        time.sleep(policy.poll_seconds)
