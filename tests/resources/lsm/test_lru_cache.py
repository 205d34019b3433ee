"""The engine's bounded cache: computes a value once, keeps the most recently used."""

from __future__ import annotations

import os
import signal
import time

import pytest

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


def test_values_are_kept_within_max_bytes_and_one_larger_is_never_kept():
    computed: list[str] = []
    cache: LruCache[str, str] = LruCache(max_entries=10, max_bytes=5, size_of=len)

    def value(key: str) -> str:
        return cache.get(key, lambda: computed.append(key) or key * 2)

    value("a"), value("b")  # 2 bytes each
    value("c")  # 6 bytes in all: evicts "a"
    value("toolong")  # 14 bytes: returned, never kept
    assert [value("b"), value("c"), value("toolong"), value("a")] == ["bb", "cc", "toolongtoolong", "aa"]
    assert computed == ["a", "b", "c", "toolong", "toolong", "a"]


def test_a_compute_that_raises_keeps_nothing():
    cache: LruCache[str, str] = LruCache(max_entries=2)
    attempts: list[str] = []

    def not_written_yet() -> str:
        attempts.append("missing")
        raise FileNotFoundError("not written yet")

    for _ in range(2):
        with pytest.raises(FileNotFoundError):
            cache.get("a", not_written_yet)
    assert attempts == ["missing", "missing"] and "a" not in cache
    assert cache.get("a", lambda: "written") == "written" and "a" in cache


@pytest.mark.filterwarnings("ignore:lance is not fork-safe")  # the child never touches Lance
def test_a_forked_child_uses_a_cache_whose_lock_the_parent_held_at_the_fork():
    """Module-level caches outlive a fork; a parent thread may be inside the cache's lock at that moment."""
    cache: LruCache[str, str] = LruCache(max_entries=2)
    cache.get("a", lambda: "A")
    with cache._lock:  # as a parent thread mid-``get`` would
        child = os.fork()
        if child == 0:  # the child: reads the inherited entry and adds one, or hangs on the inherited lock
            os._exit(0 if (cache.get("a", lambda: "?"), cache.get("b", lambda: "B")) == ("A", "B") else 1)
    deadline = time.monotonic() + 30
    while (done := os.waitpid(child, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        pytest.fail("the child hung on the lock it inherited")
    assert os.waitstatus_to_exitcode(done[1]) == 0


def test_values_put_found_and_discarded_keep_the_byte_budget():
    cache: LruCache[str, str] = LruCache(max_entries=10, max_bytes=6, size_of=len)
    cache.put("a", "aaa")
    cache.put("b", "bb")
    assert cache.find("a") == "aaa" and cache.find("zz") is None
    cache.put("c", "cc")  # 7 bytes: drops "b", the least recently used since "a" was found
    assert [cache.find(k) for k in "abc"] == ["aaa", None, "cc"]
    cache.discard("a")
    cache.put("d", "dddd")  # fits only because "a" no longer counts
    assert [cache.find(k) for k in "acd"] == [None, "cc", "dddd"]
    cache.put("d", "d")  # a replaced value's bytes are released too
    cache.put("e", "eee")  # 6 bytes with "c" and "d"
    assert [cache.find(k) for k in "cde"] == ["cc", "d", "eee"]


def test_a_cleared_cache_holds_nothing_and_its_byte_budget_is_whole_again():
    cache: LruCache[str, bytes] = LruCache(max_entries=4, max_bytes=10, size_of=len)
    for key in "abc":
        cache.put(key, b"xxx")
    cache.clear()
    assert all(cache.find(key) is None for key in "abc")
    cache.put("d", b"x" * 10)  # fits only if the cleared values no longer count
    assert cache.find("d") == b"x" * 10
