"""The process's threads for reading levels (run files, generations), which mostly waits on storage."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

log = logging.getLogger(__name__)

_READERS = 8
"""Threads reading levels at once (opening a generation is mostly waiting on storage)."""
_pool: ThreadPoolExecutor | None = None
_BUILDING: set[Future[None]] = set()
"""Builds under way (:func:`build_in_background`)."""
_BUILDING_LOCK = threading.Lock()


def level_readers() -> ThreadPoolExecutor:
    """The process's level-reading threads, started on first use (starting threads per read costs ms).

    Their tasks never wait on this pool themselves (that could deadlock it).
    """
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=_READERS, thread_name_prefix="lsm-level-read")
    return _pool


def build_in_background(build: Callable[[], None], what: str) -> Future[None]:
    """Run ``build`` (an index lookups will use once it is there) on the level readers, off the read path.

    A build that fails is logged (``what`` names it) and leaves readers on their slower path.
    """

    def logged() -> None:
        try:
            build()
        except Exception:
            log.exception("building %s failed", what)

    future = level_readers().submit(logged)
    with _BUILDING_LOCK:
        _BUILDING.add(future)
    future.add_done_callback(_built)
    return future


def builds_done(timeout: float | None = None) -> bool:
    """Wait up to ``timeout`` seconds (``None``: for ever) for the builds under way; whether all ended."""
    with _BUILDING_LOCK:
        building = list(_BUILDING)
    return not wait(building, timeout).not_done


def _built(build: Future[None]) -> None:
    with _BUILDING_LOCK:
        _BUILDING.discard(build)


def _forget_pool() -> None:
    # A forked child inherits the pool but not its threads: it starts its own.
    global _pool
    _pool = None


os.register_at_fork(after_in_child=_forget_pool)
