"""Rejected rows: how a file's rows are judged, and the one writer of quarantine files.

Landing ingestion and the ``lance_lsm`` DataFrame writer judge rows alike:
lines that do not parse, then rows :func:`~resources.lsm.write.changes.validate_changes`
refuses (a column the table lacks rejects the rows holding a value in it).
Each becomes a :class:`~resources.lsm.errors.Rejection` naming its file, row,
reason and the row as read, and lands in a quarantine directory as JSON
Lines, one object per row: ``{"file", "row", "reason", "record"}``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from ..errors import InvalidChangesError, Rejection
from ..format.storage import StorageOptions, TableStorage, join
from ..write.changes import ChangeRules, ValidatedChanges
from .landing import LandingRows


def validate_rows(read: LandingRows, rules: ChangeRules) -> ValidatedChanges:
    """A file's parsed rows validated for a table; a batch-level problem rejects every row with its reason."""
    try:
        return rules.validate(read.table, reject_unknown_columns=True)
    except InvalidChangesError as exc:
        if exc.problem is None or not read.table.num_rows:
            raise
        everyone = [Rejection(r, exc.problem) for r in range(read.table.num_rows)]
        return ValidatedChanges(read.table.slice(0, 0), everyone)


def rejected_rows(file: str, read: LandingRows, invalid: list[Rejection]) -> list[Rejection]:
    """The file's rejected rows in file-row order: lines that did not parse (with their text), then invalid rows.

    An invalid row's record is the row as read, as JSON; its row is its file row.
    """
    lines = [Rejection(r.row, r.reason, r.record, file) for r in read.rejections]
    records = read.records([r.row for r in invalid])
    rows = [Rejection(read.file_row(r.row), r.reason, record, file) for r, record in zip(invalid, records, strict=True)]
    return sorted(lines + rows, key=lambda r: r.row)


def whole_file_rejection(file: str, reason: str) -> Rejection:
    """A file refused as a whole (it cannot be read, or landed again changed): row -1, no record."""
    return Rejection(-1, reason, None, file)


class Quarantine:
    """A quarantine directory (root, filesystem, retry policy), built once per ingestion or write."""

    def __init__(self, directory: str, storage_options: StorageOptions | None = None) -> None:
        self.location = TableStorage(directory, storage_options)

    @property
    def uri(self) -> str:
        return self.location.location

    def run_dir(self, run_id: str) -> str:
        """Where one run's (or one write's) rejected rows go, below the quarantine."""
        return join(self.uri, f"run={run_id}")

    def write(self, rows: Sequence[Rejection], name: str) -> int:
        """Write ``rows`` as JSON Lines to ``name`` (relative to the quarantine), if any; return the count.

        Readers see the whole file or none of it; writing the same name again
        (a retried task) replaces it.
        """
        if rows:
            self.location.write_bytes_atomic(name, quarantine_lines(rows))
        return len(rows)

    def copy_in(self, name: str, data: bytes) -> None:
        """Place a quarantine file written elsewhere (staged by a task) under ``name``."""
        self.location.write_bytes_atomic(name, data)


def quarantine_lines(rows: Sequence[Rejection]) -> bytes:
    """The JSON Lines of a quarantine file: one ``{"file", "row", "reason", "record"}`` object per row."""
    return "".join(
        json.dumps({"file": r.file, "row": r.row, "reason": r.reason, "record": r.record}) + "\n" for r in rows
    ).encode()
