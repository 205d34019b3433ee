"""What a process's writers are doing: lets background work keep off the cores they are bound by."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

PAUSE_SECONDS = 0.25
"""No put for this long is a pause (a writer going flat out starts its next put within milliseconds)."""
MERGE_BOUND_SECONDS = 60.0
"""Writers held for merge capacity this recently are bound by merges, not by the cores."""


class WriteActivity:
    """Counts the puts in flight, and remembers when the last one ended and when the writers last waited for merges.

    A writer going as fast as the cores let it is slowed by anything running
    beside it, however low its priority (the cores' caches are shared), so
    work that can wait a little, such as building pending runs, waits while
    the writers are :meth:`cores_bound`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in_flight = 0
        self._last_ended = time.monotonic()
        self._last_held = float("-inf")

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Marks the block as a put in flight (puts of several shards may overlap)."""
        with self._lock:
            self._in_flight += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1
                self._last_ended = time.monotonic()

    def held(self) -> None:
        """Records that the writers are waiting for merges to make room (backpressure)."""
        with self._lock:
            self._last_held = time.monotonic()

    def cores_bound(self) -> bool:
        """Whether the writers go as fast as the cores let them: a put in flight or ended within ``PAUSE_SECONDS``,
        and no wait for merges within ``MERGE_BOUND_SECONDS`` (merges bound them then, and work that spares a merge
        some of its own is worth the cores)."""
        now = time.monotonic()
        with self._lock:
            paused = not self._in_flight and now - self._last_ended >= PAUSE_SECONDS
            merge_bound = now - self._last_held < MERGE_BOUND_SECONDS
        return not paused and not merge_bound
