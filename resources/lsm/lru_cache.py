"""A bounded, thread-safe cache of values that never change once computed, least recently used dropped first."""

from __future__ import annotations

import math
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """At most ``max_entries`` values by key (and ``max_bytes`` of them by ``size_of``); safe to share between threads.

    A value is computed outside the lock, so two threads missing the same
    key at once may both compute it (the values are equal: the last one is
    kept). A value larger than ``max_bytes`` is returned but not kept: it
    would evict every other entry and then itself. A ``compute`` that raises
    keeps nothing: the next ``get`` computes again. Safe across ``fork``: a
    child keeps the entries with a lock of its own (a thread of the parent may
    have held it), so a cache may live at module level.
    """

    def __init__(
        self, max_entries: int, max_bytes: float = math.inf, size_of: Callable[[V], int] = lambda _: 0
    ) -> None:
        self._values: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._max_entries, self._max_bytes, self._size_of = max_entries, max_bytes, size_of
        self._bytes = 0
        self._lock = threading.Lock()
        _CACHES.add(self)

    def __contains__(self, key: K) -> bool:
        with self._lock:
            return key in self._values

    def get(self, key: K, compute: Callable[[], V]) -> V:
        """The value cached under ``key``, or ``compute()``'s, cached."""
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                return self._values[key][0]
        value = compute()
        self.put(key, value)
        return value

    def find(self, key: K) -> V | None:
        """The value cached under ``key`` (now the most recently used), or ``None`` if there is none."""
        with self._lock:
            entry = self._values.get(key)
            if entry is None:
                return None
            self._values.move_to_end(key)
            return entry[0]

    def put(self, key: K, value: V) -> None:
        """Cache ``value`` under ``key`` (replacing any), dropping the least recently used beyond the bounds."""
        size = self._size_of(value)
        if size > self._max_bytes:
            return
        with self._lock:
            self._drop(key)
            self._values[key] = (value, size)
            self._bytes += size
            while len(self._values) > self._max_entries or self._bytes > self._max_bytes:
                self._bytes -= self._values.popitem(last=False)[1][1]

    def discard(self, key: K) -> None:
        """Drop the value cached under ``key``, if any."""
        with self._lock:
            self._drop(key)

    def clear(self) -> None:
        """Drop every value."""
        with self._lock:
            self._values.clear()
            self._bytes = 0

    def _drop(self, key: K) -> None:
        if (dropped := self._values.pop(key, None)) is not None:
            self._bytes -= dropped[1]


_CACHES: weakref.WeakSet[LruCache[Any, Any]] = weakref.WeakSet()
"""Every cache alive in the process: a forked child gives each a lock of its own."""


def _unlock_after_fork() -> None:
    for cache in list(_CACHES):
        cache._lock = threading.Lock()


os.register_at_fork(after_in_child=_unlock_after_fork)
