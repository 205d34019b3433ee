"""Retrying transient object-store errors, and telling them apart from everything else.

Two clients talk to the store: Lance's (Rust ``object_store``) and pyarrow's
(the AWS SDK), each with its own request-level retries. Neither retries
everything: a conditional PUT whose connection broke, a response body cut
short, or (in pyarrow) a failed body read are handed to the caller. The
engine's idempotent steps (reading and listing metadata, a shard's put, a
flush, a merge, a GC run) are therefore retried as a whole by
:func:`retrying`, with exponential backoff, until ``client_retry_timeout``
has passed; then :class:`~resources.lsm.errors.StorageUnavailableError`
names the location. Only errors :func:`is_transient` recognises are retried:
a missing file, a fence, a lost commit race or bad content never are.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar, cast

from ..errors import StorageUnavailableError

_T = TypeVar("_T")

DEFAULT_MAX_RETRIES = 10
"""Lance's default for ``client_max_retries`` (request-level retries)."""
DEFAULT_RETRY_TIMEOUT_SECONDS = 180.0
"""Lance's default for ``client_retry_timeout``; also the engine's retry deadline."""
DEFAULT_CONNECT_TIMEOUT_SECONDS = 5.0
"""object_store's default ``connect_timeout``; given to pyarrow too."""

# Errors that say nothing about the store's health: never retried.
_PERMANENT = re.compile(
    r"fenced|another writer claimed|was taken|commit conflict|stale sstable|too many concurrent writers"
    r"|access.?denied|no.?such.?bucket|invalid.?access.?key|signature|not.?found",
    re.IGNORECASE,
)
# What Lance's object_store and pyarrow's AWS SDK say when a request failed on the way.
_TRANSIENT = re.compile(
    r"error sending request|body error|http error|generic s3 error|timed? ?out|connection|broken pipe"
    r"|reset by peer|slow.?down|service.?unavailable|internal.?(failure|error)|network|throttl|curl"
    r"|aws error (unknown|internal|slow|service|network|request_timeout)|\b50[0-4]\b",
    re.IGNORECASE,
)


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is an object-store request that failed on the way (so a retry may succeed).

    ``FileNotFoundError`` and the like, fences, lost commit races, and
    anything that is not an ``OSError`` (or pylance's ``ValueError`` for an
    I/O error) are not transient.
    """
    if isinstance(exc, StorageUnavailableError):
        return False  # a deadline already passed below
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    message = str(exc)
    # pylance raises some store errors (opening a dataset) as ValueError("LanceError(IO): ...").
    lance_io = isinstance(exc, ValueError) and "LanceError(IO)" in message
    if not (isinstance(exc, OSError) or lance_io) or isinstance(
        exc, (FileNotFoundError, FileExistsError, PermissionError)
    ):
        return False
    if "persistence failure" in message:
        # Lance's writer fenced itself after its own PUT failed: the position
        # may hold its own entry. A new writer replays the WAL and resolves it.
        return True
    return _PERMANENT.search(message) is None and _TRANSIENT.search(message) is not None


@dataclass(frozen=True)
class RetryPolicy:
    """How long the engine retries a transient error: backoff from ``initial`` doubling to ``ceiling``
    seconds (with jitter), for at most ``timeout`` seconds after the first failure."""

    timeout: float = DEFAULT_RETRY_TIMEOUT_SECONDS
    initial: float = 0.1
    ceiling: float = 5.0

    @classmethod
    def from_options(cls, storage_options: Mapping[str, str] | None) -> RetryPolicy:
        """The policy a table's storage options set: ``client_retry_timeout`` (seconds), else the
        ``OBJECT_STORE_CLIENT_RETRY_TIMEOUT`` environment variable (as for Lance), else 180 s."""
        value = option(storage_options, "client_retry_timeout", "OBJECT_STORE_CLIENT_RETRY_TIMEOUT")
        return cls(timeout=float(value)) if value is not None else cls()


def option(storage_options: Mapping[str, str] | None, key: str, env: str) -> str | None:
    """``key`` from ``storage_options`` (keys are case-insensitive), else the variable ``env``."""
    for name, value in (storage_options or {}).items():
        if name.lower() == key:
            return value
    return os.environ.get(env)


def duration_seconds(value: str) -> float:
    """An object_store duration (``"30s"``, ``"500ms"``, ``"2m"``; a bare number is seconds) in seconds."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*(ms|s|m|h)?\s*", value)
    if match is None:
        raise ValueError(f"not a duration: {value!r} (use e.g. '30s' or '500ms')")
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[match.group(2) or "s"]
    return float(match.group(1)) * scale


class RetryCounts:
    """Retries made in this process, by operation, and operations that failed for good (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.retries: Counter[str] = Counter()
        self.recovered: Counter[str] = Counter()
        self.unavailable: Counter[str] = Counter()

    def add(self, counter: Counter[str], operation: str) -> None:
        """Count one for ``operation``'s kind: its first word (``read``, ``write``, ``compact``, ...)."""
        with self._lock:
            counter[operation.split(" ", 1)[0]] += 1

    def snapshot(self) -> dict[str, dict[str, int]]:
        """``{"retries": {...}, "recovered": {...}, "unavailable": {...}}`` by operation, copied."""
        with self._lock:
            return {
                "retries": dict(self.retries),
                "recovered": dict(self.recovered),
                "unavailable": dict(self.unavailable),
            }


RETRY_COUNTS = RetryCounts()
"""What :func:`retrying` did in this process (reported by the fault soak; cheap to keep)."""


def bounded(call: Callable[[threading.Event], _T], operation: str, location: str, seconds: float) -> _T:
    """``call(abandoned)``, waited for at most ``seconds``, on a thread of its own.

    For calls into Lance that wait on storage without a deadline of their
    own: in pylance 14.0.2 a durable ``ShardWriter.put`` (and ``close``)
    waits for its WAL flush, which Lance retries for as long as the store
    fails. On timeout the call is abandoned: ``abandoned`` is set, and its
    thread runs on (it may still complete: the write may or may not be
    applied), so ``call`` checks the event before it changes shared state.

    Raises
    ------
    StorageUnavailableError
        If ``call`` has not returned within ``seconds``.
    """
    outcome: list[tuple[bool, object]] = []
    done, abandoned = threading.Event(), threading.Event()

    def run() -> None:
        try:
            outcome.append((True, call(abandoned)))
        except BaseException as exc:  # handed to the waiting caller
            outcome.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=run, name=f"lsm-bounded-{operation}", daemon=True).start()
    if not done.wait(seconds):
        abandoned.set()
        RETRY_COUNTS.add(RETRY_COUNTS.unavailable, operation)
        raise StorageUnavailableError(location, operation, seconds, TimeoutError(f"no answer in {seconds:g} s"))
    succeeded, value = outcome[0]
    if not succeeded:
        raise cast(BaseException, value)
    return cast(_T, value)


def retrying(
    call: Callable[[], _T],
    operation: str,
    location: str,
    policy: RetryPolicy,
    before_retry: Callable[[], object] | None = None,
) -> _T:
    """``call()``, re-run after each transient error until ``policy.timeout`` has passed.

    ``call`` must be safe to repeat after a failure (idempotent, or resolved
    by the engine's epochs, markers and ledger): a failed request may have
    been applied. ``before_retry`` runs before each retry (e.g. to drop a
    writer the error left unusable). Any other error propagates unchanged.

    Raises
    ------
    StorageUnavailableError
        When transient errors last past the deadline; names ``location`` and
        ``operation``, and chains the last error.
    """
    deadline, delay, failed = time.monotonic() + policy.timeout, policy.initial, False
    while True:
        try:
            result = call()
        except Exception as exc:
            if not is_transient(exc):
                raise
            if time.monotonic() + delay > deadline:
                RETRY_COUNTS.add(RETRY_COUNTS.unavailable, operation)
                raise StorageUnavailableError(location, operation, policy.timeout, exc) from exc
            time.sleep(delay * random.uniform(0.5, 1.0))  # jitter: writers do not retry in lockstep
            delay = min(delay * 2, policy.ceiling)
            RETRY_COUNTS.add(RETRY_COUNTS.retries, operation)
            failed = True
            if before_retry is not None:
                before_retry()
            continue
        if failed:
            RETRY_COUNTS.add(RETRY_COUNTS.recovered, operation)
        return result
