"""Ingestion yields to merging once a shard has too many pending generations."""

from __future__ import annotations

import threading

import pytest

from resources.lsm.maintenance.backpressure import BackpressureError, BackpressurePolicy, await_merge_capacity
from resources.lsm.testing.changegen import EVENTS_SCHEMA
from tests.helpers import keys_in_bucket, write_generation


@pytest.fixture
def behind_table(make_table):
    """Shard 2 has three pending generations, every other shard at most one."""
    table = make_table(EVENTS_SCHEMA, num_shards=4)
    for generation in range(3):
        write_generation(table, keys_in_bucket(table, 2, 4, start=generation * 1000), f"g{generation}")
    write_generation(table, keys_in_bucket(table, 0, 4), "other")
    return table


def test_fail_mode_refuses_at_the_threshold_and_names_the_shard(behind_table):
    with pytest.raises(BackpressureError, match=r"shards \[2\] have \{2: 3\} generations"):
        await_merge_capacity(behind_table.handle, BackpressurePolicy(stop_generations=3, mode="fail"))
    assert await_merge_capacity(behind_table.handle, BackpressurePolicy(stop_generations=4, mode="fail")) < 1


def test_wait_mode_waits_for_the_merge_and_says_why(behind_table):
    messages: list[str] = []
    merger = threading.Timer(1.0, lambda: behind_table.compact(behind_table.shard_ids[2]))
    merger.start()
    waited = await_merge_capacity(
        behind_table.handle, BackpressurePolicy(stop_generations=3, poll_seconds=0.2), log=messages.append
    )
    merger.join()
    assert waited >= 0.9
    assert messages and "waiting for merges" in messages[0] and "shards [2]" in messages[0]
    with behind_table.handle.write_activity.writing():
        assert not behind_table.handle.write_activity.cores_bound(), "merges bound the writers it held"


def test_wait_mode_gives_up_after_max_wait(behind_table):
    policy = BackpressurePolicy(stop_generations=2, poll_seconds=0.1, max_wait_seconds=0.3)
    with pytest.raises(BackpressureError, match="waited"):
        await_merge_capacity(behind_table.handle, policy, log=lambda _: None)


def test_a_wait_ends_without_error_once_the_caller_has_nothing_more_to_write(behind_table):
    """A stream that stopped while waiting: no merge made room, yet the wait returns before its limit."""
    stream_ended = threading.Event()
    ender = threading.Timer(0.5, stream_ended.set)
    ender.start()
    policy = BackpressurePolicy(stop_generations=3, poll_seconds=0.1, max_wait_seconds=30.0)
    waited = await_merge_capacity(behind_table.handle, policy, log=lambda _: None, stopped=stream_ended.is_set)
    ender.join()
    assert 0.4 <= waited < 30.0
    assert len(behind_table.handle.shard_states()[2].pending_generations) == 3  # still behind: not a merge
