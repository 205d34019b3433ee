"""``LsmTable``: a Lance table with a primary key and an LSM write path.

Writes go through pylance's MemWAL (one ``ShardWriter`` per shard: WAL +
MemTable, flushed into generations); reads merge the base table, pending
generations and the WAL tail. This is the user's façade: each verb delegates
to the module that does the work, through the table's
:class:`~resources.lsm.handle.TableHandle`. See docs/architecture.md for the
whole design.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeAlias

import lance
import numpy as np
import pyarrow as pa

from .errors import InvalidChangesError
from .format.routing import shard_ids_for
from .format.schema import (
    ADDED_COLUMN_METADATA,
    CHANGE_COLUMN_TYPES,
    CHANGE_COLUMNS,
    INTERNAL_COLUMNS,
    LAST_WRITE_WINS,
    MERGE_ENGINES,
    OP_COLUMN,
    PARTIAL_UPDATE,
    SEQ_COLUMN,
    UNSET_COLUMN,
    with_primary_key,
)
from .format.shard_state import ShardState
from .format.storage import StorageOptions, TableStorage
from .format.version import TableVersion
from .handle import (
    CONFIG_MERGE_ENGINE,
    CONFIG_PRIMARY_KEY,
    CONFIG_SHARD_IDS,
    CONFIG_TABLE_ID,
    WRITER_CONFIG_KEYS,
    TableHandle,
    absolute_uri,
    added_columns,
)
from .maintenance import compaction
from .maintenance.compaction import CompactionResult, MaintenancePolicy
from .maintenance.gc import GcResult, collect_garbage
from .maintenance.merge_leases import leased_shards, merge_leases
from .maintenance.pending_runs import build_pending_runs
from .maintenance.policy import DEFAULT_GRACE_SECONDS, DEFAULT_MAX_ROWS_PER_PASS, DEFAULT_VERSION_RETENTION
from .read import change_feed, merged_read, vector_search
from .read.filter_text import checked_filter
from .write.changes import ChangeData, ChangeRules, resolve_changes, resolve_ordered_changes, to_arrow
from .write.shard_writers import ShardWriteCount, ShardWriters, WriteResult, for_each_shard

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Keys", "LsmTable", "ShardWriteCount", "WriteResult", "for_each_shard"]

Keys: TypeAlias = "pa.Table | pa.RecordBatch | pd.DataFrame | Iterable[object]"
"""What :meth:`LsmTable.lookup` accepts: a table of key columns, or key values, tuples or dicts."""

DEFAULT_WRITER_CONFIG: dict[str, Any] = {
    "durable_write": True,
    # A durable put waits for the WAL flush timer: 5 ms beats Lance's 100 ms several
    # times over for small puts and costs no extra files (benchmarks/results/design-choices.md).
    "max_wal_flush_interval_ms": 5,
}


class LsmTable:
    """A primary-keyed Lance table written through MemWAL shard writers.

    Obtain one with :meth:`create` or :meth:`open`. A table object lazily
    claims the shards it writes to and keeps their writers open until
    :meth:`close` (or the end of a ``with`` block), which flushes every
    MemTable into a new generation.
    """

    def __init__(self, handle: TableHandle) -> None:
        self.handle = handle
        """The table's plumbing (location, router, read caches), for the engine's own modules."""
        self.schema: pa.Schema = handle.schema
        """The columns this object writes and reads by default (as opened; :meth:`add_columns` updates it)."""
        self._writers = ShardWriters(handle)

    # ------------------------------------------------------------------ set-up

    @classmethod
    def create(
        cls,
        uri: str,
        schema: pa.Schema,
        primary_key: list[str],
        num_shards: int = 4,
        *,
        bucket_column: str | None = None,
        storage_options: dict[str, str] | None = None,
        vector_index: vector_search.VectorIndex | None = None,
        fts_column: str | None = None,
        merge_engine: str = LAST_WRITE_WINS,
        **writer_config: Any,
    ) -> LsmTable:
        """Create an empty LSM table.

        Declares ``primary_key`` in the schema, creates the base table (plus a
        BTREE index on each key column), and initializes MemWAL with
        Lance's bucket sharding over ``bucket_column`` (default: the first key
        column, so all versions of a key share a shard). ``writer_config``
        (``max_wal_flush_interval_ms``, ``max_memtable_rows``, ...) is recorded
        in the table and used by every writer. ``vector_index`` declares an
        IVF-PQ index for :meth:`search`. ``fts_column`` (a string column)
        gets a full-text (``INVERTED``) index, kept in every generation and
        caught up in the base by :meth:`compact`; full-text queries run on
        the base only (``dataset().to_table(full_text_query=...)``: merged
        rows, not generations or WAL), as pylance has no MemWAL text-search
        planner. See :mod:`resources.lsm.read.vector_search`.

        ``merge_engine`` says what an upsert does to the row it replaces:
        ``"last-write-wins"`` replaces it whole (an upsert must give every
        column); ``"partial-update"`` sets only the columns the upsert gives
        and keeps the others (see :meth:`write`). A partial-update table needs
        nullable non-key columns (a new key's unset columns are null) and
        durable writes (a partial upsert reads the acknowledged row it updates).

        Raises
        ------
        ValueError
            For an invalid key, shard count, bucket column, writer setting,
            index or merge engine.
        OSError
            If a dataset already exists at ``uri``; ``FileExistsError`` if ``uri``
            is a non-empty folder that is not a table (nothing is written there).
        """
        if num_shards < 1:
            raise ValueError(f"num_shards must be at least 1, got {num_shards}")
        unknown = set(writer_config) - WRITER_CONFIG_KEYS
        if unknown:
            raise ValueError(f"unknown writer settings {sorted(unknown)}; known: {sorted(WRITER_CONFIG_KEYS)}")
        keyed = with_primary_key(schema, primary_key)
        bucket_column = bucket_column or primary_key[0]
        if bucket_column not in primary_key:
            raise ValueError(f"bucket_column {bucket_column!r} must be a primary-key column")
        vector_search.validate_search_indexes(keyed, vector_index, fts_column)
        _check_merge_engine(merge_engine, keyed, primary_key, {**DEFAULT_WRITER_CONFIG, **writer_config})

        uri = absolute_uri(uri)
        _refuse_foreign_folder(uri, storage_options)
        dataset = lance.write_dataset(keyed.empty_table(), uri, storage_options=storage_options)
        compaction.index_key_columns(dataset)
        search_config = vector_search.create_search_indexes(dataset, vector_index, fts_column)
        dataset.initialize_mem_wal(
            bucket_column=bucket_column, num_buckets=num_shards, **{**DEFAULT_WRITER_CONFIG, **writer_config}
        )
        dataset.update_config(
            {
                CONFIG_PRIMARY_KEY: json.dumps(primary_key),
                CONFIG_SHARD_IDS: json.dumps(shard_ids_for(num_shards)),
                CONFIG_TABLE_ID: uuid.uuid4().hex,
                **({CONFIG_MERGE_ENGINE: merge_engine} if merge_engine != LAST_WRITE_WINS else {}),
                **search_config,
            }
        )
        return cls.open(uri, storage_options=storage_options)

    @classmethod
    def open(cls, uri: str, *, storage_options: StorageOptions | None = None) -> LsmTable:
        """Open an existing LSM table with the settings it was created with.

        Raises
        ------
        TableNotFoundError
            If no Lance dataset exists at ``uri``.
        ValueError
            If the dataset exists but was not created as an LSM table.
        """
        return cls(TableHandle.open(uri, storage_options))

    @property
    def uri(self) -> str:
        return self.handle.uri

    @property
    def storage_options(self) -> StorageOptions | None:
        """The object-store options the table was opened with."""
        return self.handle.storage_options

    @property
    def primary_key(self) -> list[str]:
        return list(self.handle.primary_key)

    @property
    def shard_ids(self) -> list[str]:
        """The shards' ids, in bucket order."""
        return list(self.handle.shard_ids)

    @property
    def num_shards(self) -> int:
        return len(self.handle.shard_ids)

    @property
    def merge_engine(self) -> str:
        """``"last-write-wins"`` or ``"partial-update"``, as set at :meth:`create`."""
        return self.handle.merge_engine

    @property
    def writer_config(self) -> dict[str, str]:
        """The writer settings recorded at creation (as Lance stores them: strings)."""
        return self.handle.writer_config

    def dataset(self) -> lance.LanceDataset:
        """The base table at its latest version (as committed by any process when called).

        Every call opens the latest version anew, through the process's shared
        Lance session (see :meth:`TableHandle.dataset`).
        """
        return self.handle.dataset()

    # ------------------------------------------------------------------ writes

    def write(self, data: ChangeData) -> WriteResult:
        """Apply a batch of changes; return once every row is durable in a WAL.

        ``data`` (pyarrow or pandas) has the table's columns plus optional
        ``_op`` ('upsert' | 'delete', default upsert) and ``_seq`` (int64).
        Per key, the row with the highest ``_seq`` wins (the later row on
        ties). A delete needs only the key columns; deleting a missing key is
        a no-op. Shards are written in parallel.

        In a ``partial-update`` table an upsert may leave out non-key columns:
        a column ``data`` lacks, or one its optional ``_unset`` column names
        for that row (a list of names, or comma-separated names), is not set,
        and the key keeps its current value there (null for a new key). An
        explicit null is a value. Per column, the highest ``_seq`` that sets
        it wins; a delete clears the row, so a later upsert in the same call
        starts from nulls.

        Raises
        ------
        InvalidChangesError
            For any content problem: a row invalid (null key, value of the
            wrong type, unknown ``_op``, an upsert missing a column; see
            ``rejections``) or the batch as a whole (key column missing,
            unknown or duplicate columns; see ``problem``). The whole call is
            refused; nothing is written.
        WriterFencedError
            If another writer claimed a shard. Shards written before the fence
            keep their rows; the call can be retried (writes are idempotent
            upserts/deletes).
        StorageUnavailableError
            If the store kept failing past ``client_retry_timeout`` (transient
            errors are retried until then). The call may or may not have been
            applied, key by key; it can be repeated.
        """
        validated = self.change_rules.validate(data)
        if validated.rejections:
            raise InvalidChangesError(validated.rejections, validated.valid.num_rows + len(validated.rejections))
        return self.write_validated(validated.valid)

    def write_validated(self, changes: pa.Table) -> WriteResult:
        """:meth:`write` for rows that already passed ``validate_changes`` for this table.

        Skips the second validation pass (a cast and null check per column).
        ``changes`` must be ``ValidatedChanges.valid``-shaped: the table's
        columns with its types, then ``_op`` (string) and ``_seq`` (int64),
        then in a partial-update table ``_unset`` (list of strings).
        Nothing else is checked, so a row that was never validated (a null
        key, an unknown ``_op``) is written as it is.

        Raises
        ------
        ValueError
            If ``changes`` does not have exactly that schema.
        WriterFencedError
            As for :meth:`write`.
        """
        self._check_change_columns(changes, "write_validated", OP_COLUMN, SEQ_COLUMN)
        resolved = resolve_changes(changes, self.schema, self.primary_key)
        upserts = self.handle.router.split(resolved.upserts)
        deletes = self.handle.router.split(resolved.deletes)
        shard_ids = sorted(set(upserts) | set(deletes))
        return WriteResult(
            tuple(
                for_each_shard(
                    lambda shard_id: self._writers.put(shard_id, upserts.get(shard_id), deletes.get(shard_id)),
                    shard_ids,
                )
            )
        )

    def write_shard_ordered(self, shard_id: str, changes: pa.Table) -> ShardWriteCount:
        """Write one shard's validated changes, given in newest-wins order; return once durable.

        For callers that validated (``validate_changes``) and routed
        (:meth:`buckets`) the rows already and put them in order, such as a
        Spark write task that owns the shard: no ``_seq`` sort, no split by
        shard. Per key the last row wins. ``changes`` has the table's columns
        with its types, then ``_op`` (string) and, in a partial-update table,
        ``_unset`` (list of strings); values are not re-validated.
        Every row's bucket is recomputed (Lance's hash of the key columns,
        cheap next to the put), so a row of another shard is refused, never
        written here.

        Raises
        ------
        ValueError
            If ``changes`` does not have exactly those columns, or holds a row of another shard.
        WriterFencedError
            As for :meth:`write`.
        """
        self._check_change_columns(changes, "write_shard_ordered", OP_COLUMN)
        if np.any(self.handle.router.buckets(changes.select(self.primary_key)) != self.shard_ids.index(shard_id)):
            raise ValueError(f"write_shard_ordered({shard_id!r}) got rows of other shards")
        resolved = resolve_ordered_changes(changes, self.schema, self.primary_key)
        return self._writers.put(shard_id, resolved.upserts, resolved.deletes)

    @property
    def max_rows_per_put(self) -> int:
        """Most rows one ``put`` or ``delete`` may carry: a MemTable's row cap.

        Lance refuses (never splits) a larger write, so :meth:`write` slices
        each shard's rows to this size; callers that batch for throughput
        should batch up to it.
        """
        return self._writers.max_rows_per_put

    def claim(self, shard_ids: Iterable[str] | None = None) -> None:
        """Open writers now (claim epoch, replay the WAL tail) instead of on first write.

        Claiming fences any other writer of those shards.
        """
        self._writers.claim(shard_ids if shard_ids is not None else self.handle.shard_ids)

    @property
    def change_rules(self) -> ChangeRules:
        """What :meth:`write` accepts: this object's columns and key, the columns added live, the merge engine."""
        return ChangeRules(self.schema, self.primary_key, self.added_columns, self.merge_engine == PARTIAL_UPDATE)

    @property
    def added_columns(self) -> frozenset[str]:
        """Columns added to the live table by :meth:`add_columns`: an upsert may leave them out (null)."""
        return added_columns(self.schema)

    def add_columns(
        self, fields: pa.Field | Sequence[pa.Field], *, on_step: Callable[[str], None] | None = None
    ) -> list[str]:
        """Add nullable columns to the live table; return the names it added (none on a re-run).

        Afterwards every read returns them (null for rows written before) and
        writes may carry them; an upsert without them writes null. The
        procedure (docs/architecture.md §7), each step
        named to ``on_step`` once done:

        1. ``fenced``: claim every shard, so writers opened before the change stop;
        2. ``flushed``: flush every MemTable and WAL tail into generations;
        3. ``merged``: merge every generation into the base;
        4. ``evolved``: add the columns to the base, in one metadata-only
           commit (Lance's ``add_columns``), marked as added;
        5. ``reopened``: this object reads and writes the new schema.

        Readers are correct after any step, even if a writer opened before the
        change keeps writing (a pylance 14.0.2 writer keeps the schema it was
        opened with; its rows read as null in the new columns). A crash at any
        point leaves a table a re-run completes; columns already there with
        the same type are not added again.

        Raises
        ------
        ValueError
            If a field is not nullable, reuses a reserved name, or names an
            existing column with another type.
        WriterFencedError
            If another writer claimed a shard during the procedure (re-run it).
        """
        wanted = [fields] if isinstance(fields, pa.Field) else list(fields)
        _check_new_columns(self.dataset().schema, wanted)
        step = on_step or (lambda name: None)
        self.claim()
        step("fenced")
        self.flush()
        step("flushed")
        self.compact()
        step("merged")
        dataset = self.dataset()
        missing = [_as_added(f) for f in wanted if f.name not in dataset.schema.names]
        if missing:
            dataset.add_columns(missing)
        step("evolved")
        self.schema = self.dataset().schema
        step("reopened")
        return [f.name for f in missing]

    def writer_stats(self) -> dict[str, dict[str, Any]]:
        """``ShardWriter.stats()`` of every writer this object holds open, by shard."""
        return self._writers.stats()

    def detach_writers(self) -> None:
        """Forget this object's writers without closing them, as a crashed process would.

        Their MemTables are not flushed: the rows stay in the WAL, replayed by
        the next writer of each shard (a flush, another ingestion). For crash
        drills and tests; a live process should call :meth:`close`.
        """
        self._writers.detach()

    def buckets(self, rows: pa.Table) -> np.ndarray:
        """The bucket (index into ``shard_ids``) of each row, by Lance's hash.

        Key columns must already have the table's types: the hash depends on them.
        """
        return self.handle.router.buckets(rows)

    def flush(self, shard: str | Sequence[str] | None = None) -> list[str]:
        """Flush unflushed WAL data into new generations; return the shards flushed.

        ``shard`` is one shard id, several, or ``None`` for every shard.

        A shard this object writes to has its writer closed (flushing its
        MemTable). Any other shard with WAL entries after its replay position
        (a crashed writer, an idle shard) is claimed with a new writer, which
        replays the WAL, and closed again. Flushing builds no pending run
        (:meth:`build_pending_runs`): that stays off the write path.
        """
        targets = self._shard_list(shard)
        states = {s.shard_id: s for s in self.shards()}
        open_shards = set(self._writers.open_shards)
        to_flush = [s for s in targets if s in open_shards or states[s].unflushed_wal_entries > 0]

        def flush_shard(shard_id: str) -> str:
            self._writers.flush(shard_id)
            return shard_id

        return list(for_each_shard(flush_shard, to_flush))

    def close(self) -> list[str]:
        """Close every open writer, flushing its MemTable to a new generation.

        Writers fenced by another process cannot flush; their acknowledged rows
        are in the WAL, which the new owner replays. Returns those shards.
        """
        return self._writers.close()

    def __enter__(self) -> LsmTable:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------- maintenance

    def compact(
        self,
        shard: str | Sequence[str] | None = None,
        *,
        max_rows_per_pass: int = DEFAULT_MAX_ROWS_PER_PASS,
        maintenance: MaintenancePolicy | None = MaintenancePolicy(),
        runs_only: bool = False,
    ) -> CompactionResult:
        """Merge flushed generations into the base table (one shard, several, or all for ``None``).

        Per shard, the generations the manifest lists above the merged-through
        generation when the call starts are merged in ascending order, newest
        wins: a shard's stored pending run in one pass without joining the
        base, other generations in passes of at most ``max_rows_per_pass``
        rows. Each pass is a data commit that claims its generations, then a
        marker commit. Idempotent and crash-safe: the merged view never
        changes and nothing is applied twice. Afterwards the base's files and indexes are tidied per
        ``maintenance`` (``None``: skip). ``runs_only``: once a run is merged,
        generations without one wait for a later call (beside live writers,
        whose keeper builds their runs). See :mod:`resources.lsm.maintenance.compaction`.
        Then the runs of the shards' generations flushed meanwhile are built;
        until they are stored the call holds a lease on the shards, which
        pending-run keepers pass over (:mod:`~resources.lsm.maintenance.merge_leases`),
        and once it let go, those of generations cut while it held them.
        """
        shard_ids = self._shard_list(shard)
        # Keepers leave these shards' runs to the build that ends the merge.
        with merge_leases(self.handle.storage, shard_ids):
            # A failed pass changed nothing or committed whole; a re-run re-plans from the markers.
            result = self.handle.retrying(
                lambda: compaction.compact(
                    self.handle,
                    shard_ids,
                    max_rows_per_pass=max_rows_per_pass,
                    maintenance=maintenance,
                    runs_only=runs_only,
                ),
                "compact",
            )
            self.build_pending_runs(shard_ids)  # generations flushed meanwhile stay pending, above a new base
        # A writer closing while the lease held left its generation's run to the merge: only checks otherwise.
        self.build_pending_runs(shard_ids)
        return result

    def build_pending_runs(self, shard: str | Sequence[str] | None = None) -> dict[str, int]:
        """Resolve each shard's pending generations into a stored run with its deletion vector.

        A reader then reads one file per shard instead of every pending
        generation, and drops the base rows they supersede by position instead
        of joining keys (:mod:`resources.lsm.read.pending_run`). Runs are only
        a shortcut: without one, reads are as correct and slower. Finding the
        superseded base rows costs a key-index query or a key-column scan of
        the base, so it is maintenance work, not the write path's: ``compact``
        calls this, and so do the Dagster flush and merge runs (the flush
        sensor asks for one when a shard's pending generations have no run).
        Idempotent, and cheap when nothing changed.

        Returns
        -------
        dict
            Changes stored per shard whose run was (re)built: one covering new
            generations, or whose deletion vector a base rewrite made stale.
        """
        return {run.shard_id: run.changes.num_rows for run in build_pending_runs(self.handle, self._shard_list(shard))}

    def gc(
        self,
        *,
        orphan_grace_seconds: float = DEFAULT_GRACE_SECONDS,
        wal_grace_seconds: float = DEFAULT_GRACE_SECONDS,
        retain_versions: int | None = None,
        older_than: timedelta | None = DEFAULT_VERSION_RETENTION,
    ) -> GcResult:
        """Remove what is compacted, consumed or orphaned; return counts and bytes per kind.

        Old base versions go per ``older_than`` / ``retain_versions``
        (Lance's ``cleanup_old_versions``); merged generations once no
        retained base version can list them as pending; WAL entries and
        orphan generation directories once older than their grace periods.
        The merged view never changes. See :mod:`resources.lsm.maintenance.gc`.
        """
        # A run cut short leaves only garbage for the next one: re-running is safe.
        return self.handle.retrying(
            lambda: collect_garbage(
                self.handle,
                orphan_grace_seconds=orphan_grace_seconds,
                wal_grace_seconds=wal_grace_seconds,
                retain_versions=retain_versions,
                older_than=older_than,
            ),
            "gc",
        )

    # ------------------------------------------------------------------- reads

    def version(self) -> TableVersion:
        """The version of the merged view now (see :class:`~resources.lsm.format.version.TableVersion`).

        Pass it as ``as_of`` to read this view again later, or as ``since`` to
        :meth:`changes` to get what changed after it. Costs what pinning a
        read costs (the base version and every shard's state).
        """
        return self.handle.version()

    def read(
        self,
        columns: list[str] | None = None,
        filter: str | None = None,
        fresh: bool = True,
        as_of: TableVersion | str | None = None,
    ) -> pa.Table:
        """The merged view: newest version of every live key, as one table.

        Parameters are those of :meth:`scanner`; use it to stream a view too
        large for memory.
        """
        return self.scanner(columns, filter, fresh, as_of=as_of).read_all()

    def scanner(
        self,
        columns: list[str] | None = None,
        filter: str | None = None,
        fresh: bool = True,
        as_of: TableVersion | str | None = None,
    ) -> pa.RecordBatchReader:
        """The merged view as a stream of record batches, in bounded memory.

        Memory holds the pending changes (one row per key changed since the
        last merge) and a few base batches, whatever the base's size. Any
        Arrow consumer reads the stream directly (``duckdb.from_arrow``,
        ``polars.from_arrow``, ``pyarrow.dataset``); closing it stops the scan.

        Parameters
        ----------
        columns
            Columns to return (default: all).
        filter
            A Lance SQL predicate, e.g. ``"price > 10 AND region = 'eu'"``;
            ``None``, empty or whitespace for none.
        fresh
            Also include rows durable in a WAL but not yet flushed (written
            by any process). ``False`` reads flushed generations and the base only.
        as_of
            A :meth:`version` (or its text): the merged view exactly as it was
            then, whatever was flushed, merged or collected since.

        Raises
        ------
        ValueError
            If ``filter`` holds a ``;`` outside a string literal (Lance would ignore the rest).
        VersionNotRetainedError
            If ``as_of`` is older than garbage collection keeps.
        """
        filter = checked_filter(filter)
        version = None if as_of is None else TableVersion.parse(as_of)
        # The base version is pinned first (see snapshot); its scan starts
        # while the pending levels above it are being pinned.
        dataset = self.handle.dataset_to_read() if version is None else self.handle.dataset_at(version)
        return merged_read.scan(
            dataset,
            self.primary_key,
            lambda: self.handle.snapshot(fresh, dataset=dataset, as_of=version),
            columns or (self.schema.names if version is None else dataset.schema.names),
            filter,
        )

    def search(
        self,
        vector: Sequence[float] | np.ndarray,
        k: int,
        filter: str | None = None,
        columns: list[str] | None = None,
        fresh: bool = True,
    ) -> pa.Table:
        """The ``k`` nearest live rows to ``vector`` across all LSM levels, nearest first.

        Each key appears at most once, with its newest version; ``columns``
        (default: all) plus ``_distance``. ``filter`` is Lance SQL. Needs a
        table created with ``vector_index``; see :func:`resources.lsm.read.vector_search.search`.
        ``filter`` is checked as for :meth:`read`.
        """
        return vector_search.search(self.handle.snapshot(fresh), vector, k, checked_filter(filter), columns)

    def lookup(
        self,
        keys: Keys,
        columns: list[str] | None = None,
        fresh: bool = True,
        as_of: TableVersion | str | None = None,
    ) -> pa.Table:
        """Point lookup by primary key; keys not present are left out.

        ``keys`` is a list of values (single-column key), of tuples or dicts
        (any key), or a table with the key columns. Returns the merged-view
        row of each key found (``fresh`` and ``as_of`` as for :meth:`scanner`).
        A key is read from its own shard only, and of that shard's generations
        only from those whose bloom filter may hold it (see :mod:`resources.lsm.read.pk_bloom`).
        """
        key_table = self._key_table(keys)
        buckets = self.handle.router.buckets(key_table)
        shards = {self.handle.shard_ids[b] for b in np.unique(buckets)}
        version = None if as_of is None else TableVersion.parse(as_of)
        snapshot = self.handle.snapshot(fresh, shards, as_of=version, keys=key_table)
        return merged_read.lookup(
            snapshot, key_table, buckets, columns or snapshot.dataset.schema.names, self.handle.generation_filters
        )

    def changes(self, since: TableVersion | str, until: TableVersion | str | None = None) -> pa.RecordBatchReader:
        """The net change per key from version ``since`` to ``until`` (default: now), streamed.

        Each key written in between appears once, with its state at
        ``until``: ``_op`` ``'upsert'`` with its newest values, or
        ``'delete'`` with its key (other columns null) if it was live at
        ``since``. A key inserted and deleted in between does not appear; a
        key written again with the values it had appears as an upsert. The
        cost follows the change: the WAL entries written between the two
        versions are read, and the deleted keys looked up at ``since``; the
        base is never scanned (see :mod:`resources.lsm.read.change_feed`).

        Raises
        ------
        VersionNotRetainedError
            If either version is older than garbage collection keeps.
        """
        start = TableVersion.parse(since)
        end = self.version() if until is None else TableVersion.parse(until)
        return change_feed.changes(self.handle, start, end)

    def count(self, fresh: bool = True, filter: str | None = None, as_of: TableVersion | str | None = None) -> int:
        """Number of live keys in the merged view matching ``filter`` (``fresh``, ``as_of`` as for :meth:`scanner`).

        Without a filter the count comes from the base's row count and the
        pending changes (:func:`~resources.lsm.read.merged_read.count`): its
        cost follows the change, not the base. With one, the keys of the
        merged view are streamed through the filter, in bounded memory.
        """
        version = None if as_of is None else TableVersion.parse(as_of)
        if checked_filter(filter) is None:
            return merged_read.count(self.handle.snapshot(fresh, as_of=version))
        return sum(batch.num_rows for batch in self.scanner(list(self.primary_key), filter, fresh, as_of=version))

    def shards(self) -> list[ShardState]:
        """State of every shard (manifest, WAL, compacted marker), in bucket order."""
        return self.handle.shard_states()

    def merging_shards(self) -> set[str]:
        """The shards a :meth:`compact` call is merging now: it builds their pending runs as it ends."""
        return leased_shards(self.handle.storage)

    # ----------------------------------------------------------------- helpers

    def _shard_list(self, shard: str | Sequence[str] | None) -> list[str]:
        """``shard`` as a list of shard ids (every shard for ``None``)."""
        if shard is None:
            return list(self.shard_ids)
        return [shard] if isinstance(shard, str) else list(shard)

    def _key_table(self, keys: Keys) -> pa.Table:
        key_schema = pa.schema([self.schema.field(k) for k in self.primary_key])
        if isinstance(keys, (pa.Table, pa.RecordBatch)) or hasattr(keys, "columns"):
            return to_arrow(keys).select(self.primary_key).cast(key_schema)
        keys = list(keys)
        if len(self.primary_key) == 1 and not any(isinstance(k, (dict, tuple, list)) for k in keys):
            return pa.Table.from_arrays([pa.array(keys, key_schema.field(0).type)], schema=key_schema)
        rows = [
            k
            if isinstance(k, dict)
            else dict(zip(self.primary_key, k if isinstance(k, (tuple, list)) else (k,), strict=False))
            for k in keys
        ]
        return pa.Table.from_pylist(rows, schema=key_schema)

    def _check_change_columns(self, changes: pa.Table, method: str, *change_columns: str) -> None:
        """Raise ``ValueError`` unless ``changes`` has the table's columns, then ``change_columns`` (and ``_unset``)."""
        if self.merge_engine == PARTIAL_UPDATE:
            change_columns = (*change_columns, UNSET_COLUMN)
        expected = [*((f.name, f.type) for f in self.schema), *((c, CHANGE_COLUMN_TYPES[c]) for c in change_columns)]
        if [(f.name, f.type) for f in changes.schema] != expected:
            raise ValueError(f"{method} needs columns {expected}, got {changes.schema}")


def _refuse_foreign_folder(uri: str, storage_options: StorageOptions | None) -> None:
    """Raise ``FileExistsError`` if ``uri`` is a non-empty folder without a Lance table."""
    storage = TableStorage(uri, storage_options)
    names = sorted(e.name for e in storage.list_dir(""))
    if names and "_versions" not in names:
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise FileExistsError(
            f"{uri} is a non-empty folder that is not a table ({shown}); refusing to create one there"
        )


def _check_merge_engine(merge_engine: str, schema: pa.Schema, primary_key: list[str], writer: dict[str, Any]) -> None:
    """Raise ``ValueError`` for an unknown merge engine, or a partial-update table that could not keep its promise."""
    if merge_engine not in MERGE_ENGINES:
        raise ValueError(f"merge_engine {merge_engine!r} is not one of {list(MERGE_ENGINES)}")
    if merge_engine != PARTIAL_UPDATE:
        return
    required = [f.name for f in schema if f.name not in primary_key and not f.nullable]
    if required:
        raise ValueError(f"partial-update tables need nullable non-key columns (new keys leave them null): {required}")
    if str(writer.get("durable_write", True)).lower() == "false":
        raise ValueError("a partial-update table needs durable_write: a partial upsert reads the row it updates")


def _check_new_columns(schema: pa.Schema, fields: list[pa.Field]) -> None:
    """Raise ``ValueError`` unless every field can be added to a table of ``schema`` (or is there already)."""
    for f in fields:
        if not f.nullable:
            raise ValueError(f"column {f.name!r} must be nullable: rows written before it was added have no value")
        if f.name in CHANGE_COLUMNS or f.name in INTERNAL_COLUMNS:
            raise ValueError(f"column name {f.name!r} is reserved for change streams")
        if f.name in schema.names and not schema.field(f.name).type.equals(f.type):
            raise ValueError(f"column {f.name!r} exists with type {schema.field(f.name).type}, not {f.type}")


def _as_added(field: pa.Field) -> pa.Field:
    """``field`` marked as added to a live table (writes may leave it out)."""
    return field.with_metadata({**(field.metadata or {}), ADDED_COLUMN_METADATA: b"true"})
