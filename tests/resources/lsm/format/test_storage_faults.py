"""Object-store faults below the engine: a real ``moto_server`` behind the fault-injecting proxy.

Each kind of fault is injected into real requests and must be survived by
the retries (nothing lost, nothing doubled); a persistent outage must end in
:class:`StorageUnavailableError` naming the table, and leave every
acknowledged row in place.
"""

from __future__ import annotations

import threading
import time

import pytest

from resources.lsm import LsmTable, StorageUnavailableError, WriterFencedError
from resources.lsm.format.retry import RETRY_COUNTS, RetryPolicy, duration_seconds, is_transient, retrying
from resources.lsm.format.storage import TableStorage
from resources.lsm.testing.changegen import EVENTS_SCHEMA, ChangeStreamSpec, generate_changes, replay
from tests.faulty_s3 import KINDS, FaultPlan
from tests.helpers import rows_by_key

OUTAGE_OPTIONS = {"client_retry_timeout": "2", "client_max_retries": "1"}


def _view(table: LsmTable) -> dict:
    return {k[0]: v for k, v in rows_by_key(table.read()).items()}


def _abandoned_calls_finish(patience: float = 60.0) -> bool:
    """Whether every call ``retry.bounded`` gave up on has returned within ``patience`` seconds."""
    deadline = time.monotonic() + patience
    while any(t.name.startswith("lsm-bounded-") for t in threading.enumerate()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


@pytest.mark.parametrize("kind", KINDS)
def test_each_fault_kind_is_injected_once_and_survived_by_file_access(faulty_s3, kind):
    proxy, root, options = faulty_s3
    storage = TableStorage(f"{root}/files", options)
    data = bytes(range(256)) * 64
    storage.write_bytes_atomic("ledger/a.json", data)

    # The read's first two requests (its HEAD and GET) fail: pyarrow's own retry or the engine's recovers.
    proxy.set_plan(FaultPlan(schedule=[kind, kind], delay_seconds=3.0))
    assert storage.read_bytes("ledger/a.json") == data
    assert proxy.faults() == {kind: 2}

    # A write whose first requests fail (a reset after the PUT applied included) lands once.
    proxy.set_plan(FaultPlan(schedule=[kind, kind], delay_seconds=3.0))
    storage.write_bytes_atomic("ledger/b.json", data)
    assert storage.read_bytes("ledger/b.json") == data
    assert [e.name for e in storage.list_files("ledger")] == ["a.json", "b.json"]


def test_table_under_random_faults_acknowledges_only_what_it_keeps(faulty_s3):
    """Writes, flushes, merges, GC and reads with 5% of requests failing (every kind but delays).

    Which layer absorbs a fault (the object-store client's own retries, the engine's retries, a
    fenced writer reopened) depends on which requests it hits, so only the outcome is asserted.
    """
    proxy, root, options = faulty_s3
    table = LsmTable.create(f"{root}/table.lance", EVENTS_SCHEMA, ["id"], num_shards=2, storage_options=options)
    batches = list(generate_changes(ChangeStreamSpec(num_keys=300, num_batches=12, batch_size=100, seed=11)))
    proxy.set_plan(FaultPlan(probability=0.05, kinds=[k for k in KINDS if k != "delay"], seed=3))
    fenced = 0
    for number, batch in enumerate(batches):
        while True:  # the documented contract: a fenced write is retried by the caller
            try:
                table.write(batch)
                break
            except WriterFencedError:
                fenced += 1
        if number % 3 == 2:
            table.flush()
            table.compact()
            table.gc(orphan_grace_seconds=0, wal_grace_seconds=0, older_than=None, retain_versions=1)
            assert _view(table) == replay(batches[: number + 1])
    faults = proxy.faults()
    proxy.set_plan(FaultPlan())

    assert sum(faults.values()) >= 20, faults  # the run was really under fire
    reopened = LsmTable.open(table.uri, storage_options=options)
    assert _view(reopened) == replay(batches)
    print(f"\nrequests {proxy.counts['requests']}, faults {faults}, fenced writes retried {fenced}")


def test_persistent_outage_is_storage_unavailable_naming_the_table_and_loses_nothing(faulty_s3):
    proxy, root, options = faulty_s3
    options = {**options, **OUTAGE_OPTIONS}
    table = LsmTable.create(f"{root}/table.lance", EVENTS_SCHEMA, ["id"], num_shards=2, storage_options=options)
    first, second = generate_changes(ChangeStreamSpec(num_keys=200, num_batches=2, batch_size=100, seed=2))
    table.write(first)  # acknowledged before the outage

    operations = {
        "write": lambda: table.write(second),
        "flush": table.flush,
        "compact": table.compact,
        "gc": table.gc,
        "read": table.shards,
    }
    with proxy.outage():
        for name, operation in operations.items():
            started = time.monotonic()
            with pytest.raises(StorageUnavailableError) as raised:
                operation()
            # Not a hang: the engine's 2 s deadline, plus at most one attempt's own client retries.
            assert time.monotonic() - started < 30, name
            assert table.uri in str(raised.value) and raised.value.location == table.uri, name
    assert proxy.faults()["outage"] > len(operations)
    # Memory stays bounded: the puts given up on in the outage finish once the store answers again.
    assert _abandoned_calls_finish(), [t.name for t in threading.enumerate()]

    # Once the store is back: everything acknowledged is there; the failed write may or may not have
    # been applied (a put abandoned in the outage can complete after it), key by key, and can be repeated.
    reopened = LsmTable.open(table.uri, storage_options=options)
    view, before, after = _view(reopened), replay([first]), replay([first, second])
    assert view.keys() <= before.keys() | after.keys()
    for key in before.keys() | after.keys():
        assert view.get(key) in (before.get(key), after.get(key)), key
    reopened.write(second)
    assert _view(reopened) == replay([first, second])


def test_open_of_a_table_in_an_outage_is_storage_unavailable(faulty_s3):
    proxy, root, options = faulty_s3
    options = {**options, **OUTAGE_OPTIONS}
    uri = f"{root}/table.lance"
    LsmTable.create(uri, EVENTS_SCHEMA, ["id"], num_shards=1, storage_options=options)
    with proxy.outage(), pytest.raises(StorageUnavailableError, match=uri):
        LsmTable.open(uri, storage_options=options)


@pytest.mark.parametrize(
    "message",
    [
        "AWS Error INTERNAL_FAILURE during GetObject operation: Failed to flush response stream (eof: 0, bad: 1)",
        "When listing objects under key 'k' in bucket 'b': AWS Error SLOW_DOWN during ListObjectsV2 operation",
        "LanceError(IO): Generic S3 error: Error performing PUT http://h/k in 1ms - HTTP error: error sending request",
        "LanceError(IO): Generic S3 error: Error getting list response body: HTTP error: request or response body "
        "error",
        "Writer fenced (persistence failure): WAL position 10 for shard s was taken after a failed PUT",
    ],
)
def test_store_request_failures_are_transient(message):
    assert is_transient(OSError(message))
    assert is_transient(ValueError(f"LanceError(IO): {message}"))  # pylance's form when opening a dataset


@pytest.mark.parametrize(
    "error",
    [
        FileNotFoundError("no such file"),
        OSError("Writer fenced: another writer claimed epoch 3"),
        OSError("LanceError(IO): Failed to claim shard s (version 1): another writer claimed epoch 1"),
        OSError("Commit conflict for version 7: Stale SSTable compaction"),
        OSError("AWS Error ACCESS_DENIED during GetObject operation: Access Denied"),
        ValueError("a bad value, HTTP error in its text"),
        ValueError("Dataset at path t was not found: LanceError(IO): Generic S3 error: 404"),
        StorageUnavailableError("s3://b/t", "read", 1.0, OSError("SlowDown")),
    ],
)
def test_everything_else_is_not_transient(error):
    assert not is_transient(error)


def test_retrying_stops_at_the_deadline_and_names_the_location():
    attempts = []

    def failing() -> None:
        attempts.append(1)
        raise ConnectionResetError("connection reset by peer")

    with pytest.raises(StorageUnavailableError, match="s3://bucket/table") as raised:
        retrying(failing, "read x", "s3://bucket/table", RetryPolicy(timeout=0.5, initial=0.05))
    assert len(attempts) >= 3 and isinstance(raised.value.__cause__, ConnectionResetError)
    assert raised.value.operation == "read x"


def test_retrying_repeats_transient_errors_until_the_call_succeeds_and_counts_it():
    failures = [ConnectionResetError("connection reset by peer"), OSError("AWS Error SLOW_DOWN during GetObject")]
    dropped: list[int] = []

    def flaky() -> str:
        if failures:
            raise failures.pop(0)
        return "value"

    before = RETRY_COUNTS.snapshot()
    policy = RetryPolicy(timeout=5, initial=0.01)
    assert retrying(flaky, "merge x", "s3://b/t", policy, before_retry=lambda: dropped.append(1)) == "value"
    assert len(dropped) == 2  # the hook ran before each retry
    after = RETRY_COUNTS.snapshot()
    assert after["retries"].get("merge", 0) - before["retries"].get("merge", 0) == 2
    assert after["recovered"].get("merge", 0) - before["recovered"].get("merge", 0) == 1


def test_retry_options_are_read_as_lance_reads_them(monkeypatch):
    monkeypatch.delenv("OBJECT_STORE_CLIENT_RETRY_TIMEOUT", raising=False)
    assert RetryPolicy.from_options(None).timeout == 180
    assert RetryPolicy.from_options({"CLIENT_RETRY_TIMEOUT": "7"}).timeout == 7
    monkeypatch.setenv("OBJECT_STORE_CLIENT_RETRY_TIMEOUT", "9")
    assert RetryPolicy.from_options({"aws_region": "x"}).timeout == 9
    assert [duration_seconds(v) for v in ("30s", "500ms", "2m", "4")] == [30, 0.5, 120, 4]
    with pytest.raises(ValueError, match="duration"):
        duration_seconds("soon")
