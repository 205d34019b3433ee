"""A bounded, thread-safe cache of values that never change once computed, least recently used dropped first."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """At most ``max_entries`` values by key; safe to share between threads.

    A value is computed outside the lock, so two threads missing the same
    key at once may both compute it (the values are equal: the last one is kept).
    """

    def __init__(self, max_entries: int) -> None:
        self._values: OrderedDict[K, V] = OrderedDict()
        self._max_entries = max_entries
        self._lock = threading.Lock()

    def get(self, key: K, compute: Callable[[], V]) -> V:
        """The value cached under ``key``, or ``compute()``'s, cached."""
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                return self._values[key]
        value = compute()
        with self._lock:
            self._values[key] = value
            while len(self._values) > self._max_entries:
                self._values.popitem(last=False)
        return value
