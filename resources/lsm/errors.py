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
    """A write was refused because some rows are invalid; nothing was applied."""

    def __init__(self, rejections: list[Rejection], total_rows: int) -> None:
        self.rejections = rejections
        shown = "; ".join(str(r) for r in rejections[:5])
        more = f" (and {len(rejections) - 5} more)" if len(rejections) > 5 else ""
        super().__init__(f"{len(rejections)} of {total_rows} rows are invalid, nothing was written: {shown}{more}")


@dataclass(frozen=True)
class Rejection:
    """One invalid input row: its 0-based position in the batch and why."""

    row: int
    reason: str

    def __str__(self) -> str:
        return f"row {self.row}: {self.reason}"
