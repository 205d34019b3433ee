"""``LsmTable``: a Lance table with a primary key and an LSM write path.

Writes go through pylance's MemWAL (one ``ShardWriter`` per shard: WAL +
MemTable, flushed into generations); reads merge the base table, pending
generations and the WAL tail. See docs/architecture.md for the whole design.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar

import lance
import numpy as np
import pyarrow as pa
from lance.mem_wal import ShardWriter

from .errors import InvalidChangesError, StorageUnavailableError, TableNotFoundError, WriterFencedError
from .format.compaction_marker import read_compacted_generations
from .format.retry import RetryPolicy, bounded, is_transient, retrying
from .format.routing import ShardRouter, shard_ids_for
from .format.schema import (
    ADDED_COLUMN_METADATA,
    CHANGE_COLUMNS,
    INTERNAL_COLUMNS,
    OP_COLUMN,
    SEQ_COLUMN,
    conform,
    empty_tail,
    with_primary_key,
)
from .format.shard_state import ShardState, load_shard_state
from .format.storage import StorageOptions, TableStorage
from .maintenance import compaction
from .maintenance.compaction import CompactionResult, MaintenancePolicy
from .maintenance.gc import GcResult, collect_garbage
from .maintenance.policy import DEFAULT_GRACE_SECONDS, DEFAULT_MAX_ROWS_PER_PASS, DEFAULT_VERSION_RETENTION
from .read import merged_read, vector_search
from .read.deletion_vector import fragment_ids
from .read.filter_text import checked_filter
from .read.level_readers import level_readers
from .read.pending_run import PendingRun, PendingRuns, build_runs, run_path, store_run
from .read.pk_bloom import GenerationFilters
from .read.wal_tail import read_wal_tail
from .write.changes import ChangeData, resolve_changes, resolve_ordered_changes, to_arrow, validate_changes

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_S = TypeVar("_S")

Keys: TypeAlias = "pa.Table | pa.RecordBatch | pd.DataFrame | Iterable[object]"
"""What :meth:`LsmTable.lookup` accepts: a table of key columns, or key values, tuples or dicts."""

_CONFIG_PRIMARY_KEY = "lsm.primary_key"
_CONFIG_SHARD_IDS = "lsm.shard_ids"

WRITER_CONFIG_KEYS = frozenset(
    {
        "durable_write",
        "max_wal_buffer_size",
        "max_wal_flush_interval_ms",
        "max_memtable_size",
        "max_memtable_rows",
        "max_memtable_batches",
        "max_unflushed_memtable_bytes",
        "manifest_scan_batch_size",
        "backpressure_log_interval_ms",
        "stats_log_interval_ms",
    }
)

LANCE_MAX_MEMTABLE_ROWS = 100_000  # Lance's default for ``max_memtable_rows``
_REPLAY_OVERFLOW = "past what the memtable replaying it can hold"
_ROOMY_MEMTABLE_ROWS = 1 << 30
_ROOMY_MEMTABLE_BATCHES = 1 << 20

DEFAULT_WRITER_CONFIG: dict[str, Any] = {
    "durable_write": True,
    # A durable put waits for the WAL flush timer. Measured with
    # benchmarks/ingest.py (1M changes, 4 shards, one writer thread each):
    # 2.5k-row puts 585k rows/s at 5 ms vs 535k at 10 ms and 83k at Lance's
    # 100 ms; 100k-row puts 2.1M vs 1.3M at 10 ms; 2 ms was within noise. Each
    # put is one WAL file whatever the timer, so shorter costs no extra files.
    "max_wal_flush_interval_ms": 5,
}


@dataclass(frozen=True)
class ShardWriteCount:
    shard_id: str
    upserts: int
    deletes: int


class ShardCounts(Protocol):
    """Per-shard upsert/delete counts (:class:`ShardWriteCount` and the like)."""

    @property
    def upserts(self) -> int: ...

    @property
    def deletes(self) -> int: ...


class ShardTotals:
    """Totals over a ``shards`` tuple of per-shard upsert/delete counts."""

    shards: tuple[ShardCounts, ...]

    @property
    def upserts(self) -> int:
        return sum(s.upserts for s in self.shards)

    @property
    def deletes(self) -> int:
        return sum(s.deletes for s in self.shards)


@dataclass(frozen=True)
class WriteResult(ShardTotals):
    """What one ``write`` made durable, per shard, after newest-wins resolution."""

    shards: tuple[ShardWriteCount, ...]

    @property
    def rows(self) -> int:
        return self.upserts + self.deletes


_session: lance.Session | None = None
_session_lock = threading.Lock()


def shared_session() -> lance.Session:
    """The process's Lance session, shared by every table object opened in it.

    Its caches hold immutable things (file metadata, index pages, keyed by
    file, index UUID and version), so tables opened anew, as every Dagster
    step does, start warm: a base lookup through a warm index cache takes
    half the time of one through a cold one. A forked child starts a new one.
    """
    global _session
    with _session_lock:
        if _session is None:
            _session = lance.Session()
        return _session


def _forget_session() -> None:
    global _session, _session_lock
    _session, _session_lock = None, threading.Lock()  # the parent's lock may have been held at the fork


os.register_at_fork(after_in_child=_forget_session)


class LsmTable:
    """A primary-keyed Lance table written through MemWAL shard writers.

    Obtain one with :meth:`create` or :meth:`open`. A table object lazily
    claims the shards it writes to and keeps their writers open until
    :meth:`close` (or the end of a ``with`` block), which flushes every
    MemTable into a new generation.
    """

    def __init__(self, uri: str, dataset: lance.LanceDataset, *, storage_options: dict[str, str] | None = None) -> None:
        config = dataset.config()
        details = dataset.mem_wal_index_details()
        if details is None or _CONFIG_SHARD_IDS not in config:
            raise ValueError(f"{uri} is not an LSM table (create it with LsmTable.create)")
        self.uri = uri
        self.storage_options = storage_options
        self.primary_key: list[str] = json.loads(config[_CONFIG_PRIMARY_KEY])
        self.shard_ids: list[str] = json.loads(config[_CONFIG_SHARD_IDS])
        self.schema: pa.Schema = dataset.schema
        """The columns this object writes and reads by default (as opened; :meth:`add_columns` updates it)."""
        self.writer_config: dict[str, Any] = dict(details.get("writer_config_defaults") or {})
        self.storage = TableStorage(uri, storage_options)
        self._session = shared_session()
        self._pending_cache = merged_read.PendingGenerations()
        self._runs = PendingRuns(self.storage)
        self._read_base: lance.LanceDataset | None = None
        # A version's manifest never changes: decode its markers once per version, not once per read.
        self._compacted_generations = lru_cache(maxsize=16)(partial(read_compacted_generations, self.storage))
        self._router = ShardRouter(details["sharding_specs"][0], dataset.lance_schema, tuple(self.shard_ids))
        self._writers: dict[str, ShardWriter] = {}
        # The base schema each writer was opened on: Lance binds a writer to it.
        self._writer_schemas: dict[str, pa.Schema] = {}
        self._generation_filters = GenerationFilters(
            uri, self.storage, [self.schema.field(k) for k in self.primary_key], storage_options
        )

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

        Raises
        ------
        ValueError
            For an invalid key, shard count, bucket column, writer setting or index.
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

        uri = _absolute(uri)
        _refuse_foreign_folder(uri, storage_options)
        dataset = lance.write_dataset(keyed.empty_table(), uri, storage_options=storage_options)
        compaction.index_key_columns(dataset)
        search_config = vector_search.create_search_indexes(dataset, vector_index, fts_column)
        dataset.initialize_mem_wal(
            bucket_column=bucket_column, num_buckets=num_shards, **{**DEFAULT_WRITER_CONFIG, **writer_config}
        )
        dataset.update_config(
            {
                _CONFIG_PRIMARY_KEY: json.dumps(primary_key),
                _CONFIG_SHARD_IDS: json.dumps(shard_ids_for(num_shards)),
                **search_config,
            }
        )
        return cls.open(uri, storage_options=storage_options)

    @classmethod
    def open(cls, uri: str, *, storage_options: dict[str, str] | None = None) -> LsmTable:
        """Open an existing LSM table with the settings it was created with.

        Raises
        ------
        TableNotFoundError
            If no Lance dataset exists at ``uri``.
        ValueError
            If the dataset exists but was not created as an LSM table.
        """
        uri = _absolute(uri)
        policy = RetryPolicy.from_options(storage_options)
        try:
            dataset = retrying(lambda: lance.dataset(uri, storage_options=storage_options), "open", uri, policy)
        except ValueError as exc:
            if "was not found" in str(exc):
                raise TableNotFoundError(f"no table at {uri}") from exc
            raise
        return cls(uri, dataset, storage_options=storage_options)

    @property
    def num_shards(self) -> int:
        return len(self.shard_ids)

    def dataset(self) -> lance.LanceDataset:
        """The base table at its latest version (as committed by any process when called).

        Every call opens the latest version anew; opens share the process's
        Lance session (:func:`shared_session`), so indexes and file metadata
        already read (immutable: keyed by index UUID and version) are not read
        again, by this object or by another one opened later.
        """
        return self.storage.retrying(
            lambda: lance.dataset(self.uri, storage_options=self.storage_options, session=self._session), "open"
        )

    def _dataset_to_read(self) -> lance.LanceDataset:
        """The latest base version, for reads only: the object opened last while no commit came since.

        Checking for a newer version costs a third of opening one, and the
        reused object keeps Lance's per-dataset state warm. Never handed to a
        commit (``merge_insert`` moves its dataset object to the new version).
        """
        cached = self._read_base
        if cached is not None and self.storage.retrying(lambda: cached.latest_version, "open") == cached.version:
            return cached
        self._read_base = self.dataset()
        return self._read_base

    # ------------------------------------------------------------------ writes

    def write(self, data: ChangeData) -> WriteResult:
        """Apply a batch of changes; return once every row is durable in a WAL.

        ``data`` (pyarrow or pandas) has the table's columns plus optional
        ``_op`` ('upsert' | 'delete', default upsert) and ``_seq`` (int64).
        Per key, the row with the highest ``_seq`` wins (the later row on
        ties). A delete needs only the key columns; deleting a missing key is
        a no-op. Shards are written in parallel.

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
        validated = validate_changes(data, self.schema, self.primary_key, optional_columns=self.added_columns)
        if validated.rejections:
            raise InvalidChangesError(validated.rejections, validated.valid.num_rows + len(validated.rejections))
        return self.write_validated(validated.valid)

    def write_validated(self, changes: pa.Table) -> WriteResult:
        """:meth:`write` for rows that already passed ``validate_changes`` for this table.

        Skips the second validation pass (a cast and null check per column).
        ``changes`` must be ``ValidatedChanges.valid``-shaped: the table's
        columns with its types, then ``_op`` (string) and ``_seq`` (int64).
        Nothing else is checked, so a row that was never validated (a null
        key, an unknown ``_op``) is written as it is.

        Raises
        ------
        ValueError
            If ``changes`` does not have exactly that schema.
        WriterFencedError
            As for :meth:`write`.
        """
        self._check_change_columns(changes, "write_validated", (OP_COLUMN, pa.string()), (SEQ_COLUMN, pa.int64()))
        resolved = resolve_changes(changes, self.schema, self.primary_key)
        upserts = self._router.split(resolved.upserts)
        deletes = self._router.split(resolved.deletes)
        shard_ids = sorted(set(upserts) | set(deletes))
        return WriteResult(
            tuple(
                for_each_shard(
                    lambda shard_id: self._put_resolved(shard_id, upserts.get(shard_id), deletes.get(shard_id)),
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
        with its types, then ``_op`` (string); values are not re-validated.
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
        self._check_change_columns(changes, "write_shard_ordered", (OP_COLUMN, pa.string()))
        if np.any(self._router.buckets(changes.select(self.primary_key)) != self.shard_ids.index(shard_id)):
            raise ValueError(f"write_shard_ordered({shard_id!r}) got rows of other shards")
        resolved = resolve_ordered_changes(changes, self.schema, self.primary_key)
        return self._put_resolved(shard_id, resolved.upserts, resolved.deletes)

    @property
    def max_rows_per_put(self) -> int:
        """Most rows one ``put`` or ``delete`` may carry: a MemTable's row cap.

        Lance refuses (never splits) a larger write, so :meth:`write` slices
        each shard's rows to this size; callers that batch for throughput
        should batch up to it.
        """
        return int(self.writer_config.get("max_memtable_rows", LANCE_MAX_MEMTABLE_ROWS))

    def claim(self, shard_ids: Iterable[str] | None = None) -> None:
        """Open writers now (claim epoch, replay the WAL tail) instead of on first write.

        Claiming fences any other writer of those shards.
        """
        for_each_shard(self._writer, shard_ids if shard_ids is not None else self.shard_ids)

    @property
    def added_columns(self) -> frozenset[str]:
        """Columns added to the live table by :meth:`add_columns`: an upsert may leave them out (null)."""
        return frozenset(f.name for f in self.schema if (f.metadata or {}).get(ADDED_COLUMN_METADATA) == b"true")

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
        return {shard_id: writer.stats() for shard_id, writer in self._writers.items()}

    def buckets(self, rows: pa.Table) -> np.ndarray:
        """The bucket (index into ``shard_ids``) of each row, by Lance's hash.

        Key columns must already have the table's types: the hash depends on them.
        """
        return self._router.buckets(rows)

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
        to_flush = [s for s in targets if s in self._writers or states[s].unflushed_wal_entries > 0]

        def flush_shard(shard_id: str) -> str:
            self._close_writer(shard_id, self._writers.pop(shard_id, None))
            return shard_id

        return list(for_each_shard(flush_shard, to_flush))

    def close(self) -> list[str]:
        """Close every open writer, flushing its MemTable to a new generation.

        Writers fenced by another process cannot flush; their acknowledged rows
        are in the WAL, which the new owner replays. Returns those shards.
        """
        writers, self._writers = self._writers, {}

        def close(shard_id: str) -> bool:
            try:
                self._close_writer(shard_id, writers[shard_id])
                return False
            except WriterFencedError:
                return True

        # In parallel: a close is mostly waiting on storage.
        return [shard_id for shard_id, fenced in zip(writers, for_each_shard(close, writers), strict=True) if fenced]

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
    ) -> CompactionResult:
        """Merge flushed generations into the base table (one shard, several, or all for ``None``).

        Per shard, the generations the manifest lists above the compacted
        marker when the call starts are merged in ascending order, newest
        wins, in passes of at most ``max_rows_per_pass`` rows; each pass is
        one commit carrying its data and the new marker. Idempotent and
        crash-safe: the merged view never changes and nothing is applied
        twice. Afterwards the base's files and indexes are tidied per
        ``maintenance`` (``None``: skip). See :mod:`resources.lsm.maintenance.compaction`.
        """
        shard_ids = self._shard_list(shard)
        # A failed pass changed nothing or committed whole; a re-run re-plans from the markers.
        result = self.storage.retrying(
            lambda: compaction.compact(self, shard_ids, max_rows_per_pass=max_rows_per_pass, maintenance=maintenance),
            "compact",
        )
        self.build_pending_runs(shard_ids)  # generations flushed meanwhile stay pending, above a new base
        return result

    def has_pending_run(self, state: ShardState) -> bool:
        """Whether a run over all of ``state``'s pending generations is stored (``True`` if none is pending)."""
        pending = state.pending_generations
        return not pending or self.storage.exists(run_path(state.shard_id, pending))

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
        shard_ids = self._shard_list(shard)
        if not shard_ids:
            return {}
        dataset = self.dataset()
        present = fragment_ids(dataset)
        states = [s for s in self.shard_states(dataset, shard_ids, for_read=True) if s.pending_generations]

        def stored_run(state: ShardState) -> tuple[PendingRun | None, bool]:
            """The shard's stored run over a prefix of its pending generations, and whether it is current."""
            run = self._runs.find(state, quiet=True)
            if run is None or run.generations != state.pending_generations:
                return run, False
            if self.storage.exists(run_path(state.shard_id, run.generations)) and run.superseded.holds_in(present):
                return run, True
            self._runs.forget(run)
            return run, False

        # Run files and generations are read and written on the level readers' threads (none waits on them).
        pool = level_readers()
        found = list(pool.map(stored_run, states))
        previous = {state.shard_id: run for state, (run, _) in zip(states, found, strict=True)}
        stale = [state for state, (_, current) in zip(states, found, strict=True) if not current]
        runs = self.storage.retrying(
            lambda: build_runs(
                dataset,
                stale,
                self.primary_key,
                previous,
                fragments=present,
                storage_options=self.storage_options,
                session=self._session,
                map=pool.map,
            ),
            "build the pending runs",
        )

        def store(run: PendingRun) -> None:
            self.storage.retrying(
                lambda: store_run(self.storage, run), f"store the pending run of shard {run.shard_id}"
            )
            self._runs.remember(run)

        list(pool.map(store, runs))
        return {run.shard_id: run.changes.num_rows for run in runs}

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
        return self.storage.retrying(
            lambda: collect_garbage(
                self,
                orphan_grace_seconds=orphan_grace_seconds,
                wal_grace_seconds=wal_grace_seconds,
                retain_versions=retain_versions,
                older_than=older_than,
            ),
            "gc",
        )

    # ------------------------------------------------------------------- reads

    def read(self, columns: list[str] | None = None, filter: str | None = None, fresh: bool = True) -> pa.Table:
        """The merged view: newest version of every live key, as one table.

        Parameters are those of :meth:`scanner`; use it to stream a view too
        large for memory.
        """
        return self.scanner(columns, filter, fresh).read_all()

    def scanner(
        self, columns: list[str] | None = None, filter: str | None = None, fresh: bool = True
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

        Raises
        ------
        ValueError
            If ``filter`` holds a ``;`` outside a string literal (Lance would ignore the rest).
        """
        filter = checked_filter(filter)
        # The base version is pinned first (see snapshot); its scan starts
        # while the pending levels above it are being pinned.
        dataset = self._dataset_to_read()
        return merged_read.scan(
            dataset,
            self.primary_key,
            lambda: self.snapshot(fresh, dataset=dataset),
            columns or self.schema.names,
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
        return vector_search.search(self.snapshot(fresh), vector, k, checked_filter(filter), columns)

    def lookup(self, keys: Keys, columns: list[str] | None = None, fresh: bool = True) -> pa.Table:
        """Point lookup by primary key; keys not present are left out.

        ``keys`` is a list of values (single-column key), of tuples or dicts
        (any key), or a table with the key columns. Returns the merged-view
        row of each key found (``fresh`` as for :meth:`read`). A key is read
        from its own shard only, and of that shard's generations only from
        those whose bloom filter may hold it (see :mod:`resources.lsm.read.pk_bloom`).
        """
        key_table = self._key_table(keys)
        buckets = self._router.buckets(key_table)
        snapshot = self.snapshot(fresh, {self.shard_ids[b] for b in np.unique(buckets)})
        return merged_read.lookup(snapshot, key_table, buckets, columns or self.schema.names, self._generation_filters)

    def count(self, fresh: bool = True, filter: str | None = None) -> int:
        """Number of live keys in the merged view matching ``filter`` (streamed, in bounded memory)."""
        return sum(batch.num_rows for batch in self.scanner(list(self.primary_key), filter, fresh))

    def shards(self) -> list[ShardState]:
        """State of every shard (manifest, WAL, compacted marker), in bucket order."""
        return self.shard_states()

    def shard_states(
        self,
        dataset: lance.LanceDataset | None = None,
        shard_ids: Iterable[str] | None = None,
        *,
        for_read: bool = False,
    ) -> list[ShardState]:
        """The state of ``shard_ids`` (default: all) above a pinned base version, in bucket order.

        ``dataset`` is the base version whose compacted markers apply (default:
        the latest, pinned now). Pin the base before the shards: generations
        merged after that version are still listed by the shard manifests read
        next, so a reader of the base plus these states misses nothing. The
        markers are decoded once for all shards. ``for_read`` leaves out what
        only maintenance needs (see :func:`~resources.lsm.format.shard_state.load_shard_state`).
        """
        dataset = self.dataset() if dataset is None else dataset
        compacted = self._compacted_generations(dataset.version)
        wanted = None if shard_ids is None else set(shard_ids)
        return [
            load_shard_state(self.storage, shard_id, bucket, compacted.get(shard_id, 0), for_read=for_read)
            for bucket, shard_id in enumerate(self.shard_ids)
            if wanted is None or shard_id in wanted
        ]

    def detach_writers(self) -> None:
        """Forget this object's writers without closing them, as a crashed process would.

        Their MemTables are not flushed: the rows stay in the WAL, replayed by
        the next writer of each shard (a flush, another ingestion). For crash
        drills and tests; a live process should call :meth:`close`.
        """
        self._writers.clear()

    # ----------------------------------------------------------------- helpers

    def snapshot(
        self, fresh: bool, shard_ids: set[str] | None = None, *, dataset: lance.LanceDataset | None = None
    ) -> merged_read.ReadSnapshot:
        """What a read of ``shard_ids`` (default: all shards) sees, pinned now (above ``dataset``, if given).

        The base version, the pending generations above its markers and (with
        ``fresh``) each shard's WAL tail: the input of the read path
        (:mod:`resources.lsm.read.merged_read`).
        """
        dataset = self._dataset_to_read() if dataset is None else dataset
        states = self.shard_states(dataset, shard_ids, for_read=True)
        tails = [
            read_wal_tail(self.storage, s.shard_id, s.replay_after_wal_position, dataset.schema, self.primary_key)
            for s in states
            if fresh and s.unflushed_wal_entries
        ]
        # The pinned base's schema: it may have columns added after this object was opened.
        tail = pa.concat_tables(tails) if tails else empty_tail(dataset.schema)
        return merged_read.ReadSnapshot(
            dataset,
            tuple(states),
            tail,
            tuple(self.primary_key),
            self.storage_options,
            self._session,
            self._pending_cache,
            self._runs,
        )

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

    def _check_change_columns(self, changes: pa.Table, method: str, *change_columns: tuple[str, pa.DataType]) -> None:
        expected = [*((f.name, f.type) for f in self.schema), *change_columns]
        if [(f.name, f.type) for f in changes.schema] != expected:
            raise ValueError(f"{method} needs columns {expected}, got {changes.schema}")

    def _put_resolved(self, shard_id: str, upserts: pa.Table | None, deletes: pa.Table | None) -> ShardWriteCount:
        """Put upserts, then delete keys (at most one change per key), in slices a MemTable accepts.

        After a transient store error the writer is dropped, whatever the
        failed attempt may have logged is flushed (a new writer replays the
        WAL, then closes), and everything is put again through a fresh writer:
        re-putting one change per key is idempotent, and nothing is
        acknowledged before every put returned.
        """

        def put(abandoned: threading.Event) -> None:
            writer = self._writers.get(shard_id) or self._open_writer(shard_id)
            if abandoned.is_set():
                return  # given up on while opening: never registered, so it cannot fence a later attempt's
            self._writers[shard_id] = writer
            rows = upserts
            if rows is not None and rows.schema.names != self._writer_schemas[shard_id].names:
                # Columns were added since these rows were validated: the writer wants them (null).
                rows = conform(rows, self._writer_schemas[shard_id])
            with self._fencing_as_error(shard_id):
                for chunk in _slices(rows, self.max_rows_per_put):
                    writer.put(chunk)
                for chunk in _slices(deletes, self.max_rows_per_put):
                    writer.delete(chunk)

        def start_afresh() -> None:
            # The failed attempt may have logged part of the change. Flushing it (a new writer replays
            # the WAL, then closes) lets the retry's writer start a new generation: replayed and re-put
            # rows together in one generation could outgrow what a later replay accepts.
            self._writers.pop(shard_id, None)
            self._close_writer(shard_id, None)

        operation = f"write shard {shard_id}"
        try:
            self.storage.retrying(lambda: self._bounded(put, operation), operation, before_retry=start_afresh)
        except StorageUnavailableError:
            self._writers.pop(shard_id, None)  # possibly stuck in the outage: the next write claims anew
            raise
        return ShardWriteCount(
            shard_id, upserts.num_rows if upserts is not None else 0, deletes.num_rows if deletes is not None else 0
        )

    def _writer(self, shard_id: str) -> ShardWriter:
        if shard_id not in self._writers:
            self._writers[shard_id] = self._open_writer(shard_id)
        return self._writers[shard_id]

    def _open_writer(self, shard_id: str) -> ShardWriter:
        """Claim the shard (epoch + 1, fencing any other writer) and replay its WAL.

        The writer gets the settings recorded at creation: Lance stores them
        but its writers fall back to built-in defaults unless passed in.

        Raises
        ------
        WriterFencedError
            If another writer claimed the shard while this one was opening.
        """
        dataset = self.dataset()
        settings = self.recorded_writer_settings()
        with self._fencing_as_error(shard_id):
            try:
                writer = dataset.mem_wal_writer(shard_id, **settings)
            except OSError as exc:
                if _REPLAY_OVERFLOW not in str(exc):
                    raise
                self._flush_oversized_generation(dataset, shard_id, settings, exc)
                writer = dataset.mem_wal_writer(shard_id, **settings)
        self._writer_schemas[shard_id] = dataset.schema
        return writer

    def _flush_oversized_generation(
        self, dataset: lance.LanceDataset, shard_id: str, settings: dict[str, Any], exc: OSError
    ) -> None:
        """Flush a WAL generation larger than the recorded MemTable limits, through a writer with room for it.

        pylance 14.0.2 can leave more rows logged for one generation than a
        replaying writer of the same settings accepts (seen in the storage-fault
        soak, where writers are replaced after failed puts and flushes); every
        later writer then refuses to open the shard. The generation's rows are
        all in the WAL: a writer with larger limits replays and flushes them.
        """
        log.warning("shard %s: %s; flushing it with larger MemTable limits", shard_id, exc)
        roomy = {**settings, "max_memtable_rows": _ROOMY_MEMTABLE_ROWS, "max_memtable_batches": _ROOMY_MEMTABLE_BATCHES}
        dataset.mem_wal_writer(shard_id, **roomy).close()

    def _close_writer(self, shard_id: str, writer: ShardWriter | None) -> None:
        """Close ``writer`` (``None``: claim the shard with a new one), flushing its MemTable.

        A close that fails on a transient store error is retried with a new
        writer: the MemTable's rows are in the WAL, which that writer replays.

        Raises
        ------
        WriterFencedError
            If another writer claimed the shard.
        """
        writers = iter([writer] if writer is not None else [])

        def close(_: threading.Event) -> None:
            current = next(writers, None) or self._open_writer(shard_id)
            with self._fencing_as_error(shard_id):
                current.close()

        operation = f"flush shard {shard_id}"
        self.storage.retrying(lambda: self._bounded(close, operation), operation)

    def _bounded(self, call: Callable[[threading.Event], _T], operation: str) -> _T:
        """``call`` waited for at most ``client_retry_timeout`` on an object store (:func:`bounded`).

        On a local path it runs on the caller's thread: there is no store
        outage to wait out, and a thread per put costs about 0.5 ms.
        """
        if "://" not in self.uri:
            return call(threading.Event())
        return bounded(call, operation, self.uri, self.storage.retry_policy.timeout)

    def recorded_writer_settings(self) -> dict[str, Any]:
        """``writer_config`` as typed keyword arguments (Lance records every value as a string)."""
        return {
            key: value == "true" if key == "durable_write" else int(value)
            for key, value in self.writer_config.items()
            if key in WRITER_CONFIG_KEYS
        }

    @contextmanager
    def _fencing_as_error(self, shard_id: str) -> Iterator[None]:
        """Turn Lance's fencing ``OSError`` into :class:`WriterFencedError`.

        Lance says "Writer fenced" when a live writer's call is fenced, and
        "another writer claimed epoch" or "fenced during open" when the claim
        or WAL replay of a writer being opened loses to another writer. A
        fenced writer is dead: it is forgotten so the next write claims anew.
        A "fence" after this writer's own PUT failed ("persistence failure":
        the WAL position may hold its own entry) is a transient store error,
        left as it is for the caller's retry.
        """
        try:
            yield
        except OSError as exc:
            message = str(exc).lower()
            fenced = "fenced" in message or "another writer claimed" in message
            if not fenced or is_transient(exc):
                raise
            self._writers.pop(shard_id, None)
            raise WriterFencedError(
                f"shard {shard_id} was claimed by another writer; this call was not acknowledged "
                f"(rows acknowledged earlier are safe in the WAL): {exc}"
            ) from exc


def for_each_shard(work: Callable[[_S], _T], shards: Iterable[_S]) -> list[_T]:
    """``work`` on each shard (id, state or batch of work) in parallel threads, results in order.

    Shard work mostly waits on storage, and shards never share a key, so each
    gets a thread of its own; a single shard runs on the calling thread.
    """
    shards = list(shards)
    if len(shards) <= 1:
        return [work(s) for s in shards]
    with ThreadPoolExecutor(max_workers=len(shards), thread_name_prefix="lsm-shard") as pool:
        return list(pool.map(work, shards))


def _absolute(uri: str) -> str:
    """Local paths become absolute: Spark executors and other processes resolve
    them from another working directory."""
    return uri if "://" in uri else os.path.abspath(uri)


def _refuse_foreign_folder(uri: str, storage_options: StorageOptions | None) -> None:
    """Raise ``FileExistsError`` if ``uri`` is a non-empty folder without a Lance table."""
    storage = TableStorage(uri, storage_options)
    names = sorted(e.name for e in storage.list_dir(""))
    if names and "_versions" not in names:
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise FileExistsError(
            f"{uri} is a non-empty folder that is not a table ({shown}); refusing to create one there"
        )


def _slices(rows: pa.Table | None, size: int) -> Iterator[pa.Table]:
    """``rows`` in consecutive slices of at most ``size`` rows (nothing for ``None``)."""
    if rows is None:
        return
    for offset in range(0, rows.num_rows, size):
        yield rows.slice(offset, size)


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
