"""The engine's bounded cache: computes a value once, keeps the most recently used."""

from __future__ import annotations

from resources.lsm.lru_cache import LruCache


def test_a_value_is_computed_once_and_the_least_recently_used_is_dropped_first():
    computed: list[str] = []
    cache: LruCache[str, str] = LruCache(max_entries=2)

    def value(key: str) -> str:
        return cache.get(key, lambda: computed.append(key) or key.upper())

    assert [value("a"), value("b"), value("a")] == ["A", "B", "A"]
    assert computed == ["a", "b"]  # "a" came from the cache
    value("c")  # evicts "b", the least recently used
    assert [value("a"), value("b")] == ["A", "B"]
    assert computed == ["a", "b", "c", "b"]
