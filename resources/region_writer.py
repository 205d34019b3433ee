"""``RegionWriterResource``: shard writers held open for the duration of a run."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dagster import ConfigurableResource, InitResourceContext
from pydantic import Field, PrivateAttr

from .settings import run_keeper_patience_seconds, run_keeper_seconds
from .table_resource import LsmTableResource

if TYPE_CHECKING:
    import pyarrow as pa

    from .lsm import LsmTable, WriteResult
    from .lsm.maintenance.pending_runs import KeeperStats


@dataclass(frozen=True)
class WriterSession:
    """A table whose shard writers this process holds, and the keeper building their generations' runs."""

    table: LsmTable
    runs: KeeperStats
    """What the pending-run keeper did so far (runs built, how long after their generations were cut)."""


@contextmanager
def claimed_writers(
    resource: LsmTableResource, log: logging.Logger | None = None, buckets: list[int] | None = None
) -> Iterator[WriterSession]:
    """The table with the writers of ``buckets`` (default: every shard) claimed; on exit (success *or*
    failure) the writers are closed.

    Opening a writer claims its shard (epoch + 1, fencing any other writer)
    and replays the shard's WAL tail. Closing flushes each MemTable into a
    new generation. A writer fenced by another process raises
    ``WriterFencedError``: rows acknowledged before are safe in the WAL, so
    the run can simply be retried.

    While the writers are open, a ``PendingRunKeeper`` builds the runs of
    the generations they cut on a thread of its own (it never claims a
    shard): every ``LSM_RUN_KEEPER_SECONDS`` (default 2 s), waiting for
    writers bound by the cores to pause for at most
    ``LSM_RUN_KEEPER_PATIENCE_SECONDS`` (default 20 s), and leaving shards
    a merge holds a lease on to that merge. After they closed, the runs of
    the generations the close cut are built once more (but those of shards
    under merge), so readers do not fall back to joining keys for what this
    session wrote.
    """
    from .lsm.maintenance.pending_runs import PendingRunKeeper

    table = resource.open()
    shard_ids = table.shard_ids if buckets is None else [table.shard_ids[b] for b in buckets]
    table.claim(shard_ids)
    if log:
        log.info(f"claimed {len(shard_ids)} shard writers of {table.uri}")
    keeper = PendingRunKeeper(
        table.handle,
        run_keeper_seconds(),
        report=log.warning if log else None,
        patience_seconds=run_keeper_patience_seconds(),
    )
    try:
        with keeper:
            yield WriterSession(table, keeper.stats)
    finally:
        fenced = table.close()
        if log:
            log.info(f"closed the shard writers of {table.uri} (MemTables flushed)")
            if fenced:
                log.warning(
                    f"shards {fenced} were fenced by another writer; their acknowledged rows stay in the WAL "
                    "for the new owner"
                )
        keeper.keep_up()  # the generations the close cut
        if log:
            log.info(f"pending runs kept up while writing: {keeper.stats}")


class RegionWriterResource(ConfigurableResource):
    """Claims shard writers when a run starts and closes them when it ends.

    Opening a writer claims its shard (epoch + 1, fencing any other writer)
    and replays the shard's WAL tail. Teardown — after success *or* failure —
    closes every writer, flushing its MemTable into a new generation. A writer
    fenced by another process raises ``WriterFencedError``: rows acknowledged
    before are safe in the WAL, so the run can simply be retried.
    """

    lsm_table: LsmTableResource = Field(default_factory=LsmTableResource, description="The table to write.")
    buckets: list[int] | None = Field(default=None, description="Buckets to claim at start (default: all).")
    _table: LsmTable | None = PrivateAttr(default=None)

    @contextmanager
    def yield_for_execution(self, context: InitResourceContext) -> Iterator[RegionWriterResource]:
        with claimed_writers(self.lsm_table, context.log, self.buckets) as session:
            self._table = session.table
            try:
                yield self
            finally:
                self._table = None

    @property
    def table(self) -> LsmTable:
        """The table whose writers this run holds (only inside a run)."""
        if self._table is None:
            raise RuntimeError("RegionWriterResource is only usable while a run holds it")
        return self._table

    def put(self, rows: pa.Table) -> WriteResult:
        """Upsert rows; returns once they are durable."""
        return self.table.write(rows)

    def delete(self, keys: pa.Table) -> WriteResult:
        """Delete by primary key; returns once the deletes are durable."""
        import pyarrow as pa

        from .lsm.format.schema import DELETE, OP_COLUMN

        return self.table.write(keys.append_column(OP_COLUMN, pa.array([DELETE] * keys.num_rows)))

    def stats(self) -> dict[str, dict]:
        """Writer statistics (puts, WAL flushes and bytes, MemTable flushes) by shard."""
        return self.table.writer_stats()
