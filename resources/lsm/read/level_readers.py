"""The process's threads for reading levels (run files, generations), which mostly waits on storage."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

_READERS = 8
"""Threads reading levels at once (opening a generation is mostly waiting on storage)."""
_pool: ThreadPoolExecutor | None = None


def level_readers() -> ThreadPoolExecutor:
    """The process's level-reading threads, started on first use (starting threads per read costs ms).

    Their tasks never wait on this pool themselves (that could deadlock it).
    """
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=_READERS, thread_name_prefix="lsm-level-read")
    return _pool


def _forget_pool() -> None:
    # A forked child inherits the pool but not its threads: it starts its own.
    global _pool
    _pool = None


os.register_at_fork(after_in_child=_forget_pool)
