"""The engine's error types: one per kind of failure a caller may handle."""

from __future__ import annotations

from dataclasses import dataclass


class TableNotFoundError(FileNotFoundError):
    """No Lance dataset exists at the URI."""


class WriterFencedError(RuntimeError):
    """Another process claimed the shard; this writer's un-acknowledged call failed.

    Everything acknowledged before is in the WAL and is replayed by the new
    writer. Retry the write with a fresh ``LsmTable``.
    """


class InvalidChangesError(ValueError):
    """A write was refused because its content is invalid; nothing was applied.

    ``rejections`` names each invalid row and why; ``problem`` is set instead
    when the batch as a whole is invalid (a key column missing, unknown or
    duplicate column names, values Arrow cannot convert at all).
    """

    def __init__(self, rejections: list[Rejection], total_rows: int, problem: str | None = None) -> None:
        self.rejections = rejections
        self.problem = problem
        if problem is not None:
            super().__init__(f"the batch of {total_rows} rows was refused, nothing was written: {problem}")
            return
        shown = "; ".join(str(r) for r in rejections[:5])
        more = f" (and {len(rejections) - 5} more)" if len(rejections) > 5 else ""
        super().__init__(f"{len(rejections)} of {total_rows} rows are invalid, nothing was written: {shown}{more}")

    @classmethod
    def whole_batch(cls, problem: str, total_rows: int) -> InvalidChangesError:
        """The error for a batch refused as a whole, for ``problem``."""
        return cls([], total_rows, problem)


@dataclass(frozen=True)
class Rejection:
    """One rejected input row: its 0-based row, why, and where known the row as read and its file.

    The one rejection type of the engine: a refused ``write`` lists these, a
    landing file's unparsable lines are these, and quarantine files hold
    them (one JSON object each: file, row, reason, record).
    """

    row: int
    """Its 0-based position in the batch, or its row in the file (CSV: counted from the line after the header)."""
    reason: str
    record: str | None = None
    """The row as read: a line's text, or the parsed row as JSON; ``None`` for a whole file refused."""
    file: str | None = None
    """The landing file (or DataFrame write partition) it came from."""

    def __str__(self) -> str:
        where = f"{self.file}: " if self.file else ""
        return f"{where}row {self.row}: {self.reason}"


class StorageUnavailableError(OSError):
    """The object store kept failing past the retry deadline; the operation did not complete.

    Raised instead of a transient ``OSError`` once ``client_retry_timeout``
    (a storage option, default 180 s) has passed since the first failure
    (see :mod:`resources.lsm.format.retry`). Nothing unacknowledged was
    promised: rows acknowledged before are durable, a write that raised this
    may or may not be applied and is safe to repeat, and maintenance re-runs
    pick up where the failed run stopped. ``location`` is the table (or
    other) URI, ``operation`` what was being done.
    """

    def __init__(self, location: str, operation: str, timeout: float, cause: BaseException) -> None:
        self.location, self.operation = location, operation
        super().__init__(
            f"storage at {location} unavailable: {operation} kept failing for {timeout:g} s "
            f"(client_retry_timeout); last error: {cause}"
        )


class VersionNotRetainedError(LookupError):
    """A read or change feed asked for a table version whose files are gone.

    A :class:`~resources.lsm.format.version.TableVersion` stays readable while
    garbage collection keeps its base version (``gc(older_than=...)``, the
    GC asset's ``version_retention_hours``) and what lay above it: the
    generations and WAL entries it listed (``wal_grace_seconds``, at least
    the version retention). ``version`` is the version asked for.
    """

    def __init__(self, version: object, missing: str) -> None:
        self.version = version
        super().__init__(
            f"table version {version} is no longer retained ({missing}); versions are kept for the GC "
            "retention setting (gc(older_than=...), the GC asset's version_retention_hours): read a newer version"
        )
