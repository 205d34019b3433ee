"""``TableVersion``: the identity of one merged view, for time travel and the change feed.

The merged view is the base table at one version plus, per shard, the
generations one shard-manifest version lists above the base's compacted
marker and the WAL entries after that manifest's replay position up to one
WAL position. All three only grow, and every file they name is immutable, so
the triple per shard (with the base version) pins the view exactly: reading
it again later, across flushes, merges and garbage collection, gives the same
rows, as long as those files are retained.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TEXT = re.compile(r"^(\d+)@((?:\d+\.\d+)(?:,\d+\.\d+)*)$")


@dataclass(frozen=True, order=True)
class ShardPosition:
    """Where one shard stood: its manifest version and the newest WAL entry position durable then."""

    manifest_version: int
    wal_position: int


@dataclass(frozen=True, order=True)
class TableVersion:
    """One merged view of a table: opaque, orderable, ``str()``-able and parseable back.

    ``base`` is the base table's Lance version, ``shards`` each shard's
    position in bucket order. Versions taken one after the other compare in
    that order (each part only grows). The text form is
    ``<base>@<manifest>.<wal>,<manifest>.<wal>,...``.
    """

    base: int
    shards: tuple[ShardPosition, ...]

    def __str__(self) -> str:
        return f"{self.base}@" + ",".join(f"{s.manifest_version}.{s.wal_position}" for s in self.shards)

    @classmethod
    def parse(cls, text: str | TableVersion) -> TableVersion:
        """The version ``str(version)`` printed (a version is returned as is).

        Raises
        ------
        ValueError
            If ``text`` is not a table version.
        """
        if isinstance(text, TableVersion):
            return text
        match = _TEXT.match(text.strip())
        if match is None:
            raise ValueError(f"{text!r} is not a table version (<base>@<manifest>.<wal>,...)")
        positions = (part.split(".") for part in match.group(2).split(","))
        return cls(int(match.group(1)), tuple(ShardPosition(int(m), int(w)) for m, w in positions))
