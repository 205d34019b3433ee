"""When a process's writers last wrote: lets background work wait for their pauses."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class WriteActivity:
    """Counts the puts in flight and remembers when the last one ended.

    A writer going as fast as the cores let it is slowed by anything running
    beside it, however low its priority (the cores' caches are shared), so
    work that can wait a little, such as building pending runs, waits for the
    writers to pause (:meth:`quiet_seconds`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in_flight = 0
        self._last_ended = time.monotonic()

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

    def quiet_seconds(self) -> float:
        """Seconds since the last put ended (since creation before any): 0 while a put is in flight."""
        with self._lock:
            return 0.0 if self._in_flight else time.monotonic() - self._last_ended
