"""``TableHandle``: one opened table's plumbing, built once and shared by the engine's modules.

:class:`~resources.lsm.table.LsmTable` is the user's façade (write, read,
flush, compact, gc); below it, the handle holds what every part of the
engine needs and must not rebuild per call: the URI and storage options, the
table's files (:class:`~resources.lsm.format.storage.TableStorage`: its
filesystem and retry policy), the process's Lance session, the shard router,
the recorded key and writer settings, and the read caches (decoded markers,
pending runs, resolved pending generations, bloom filters). Maintenance,
Spark and quality code take a handle, never ``(uri, storage_options)``.
"""

from __future__ import annotations

import json
import os
import threading
import zlib
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any, TypeVar

import lance
import pyarrow as pa

from .errors import TableNotFoundError, VersionNotRetainedError
from .format.compaction_marker import compacted_generations_in, read_manifest
from .format.layout import generation_dir
from .format.merge_claims import CLAIMS, merged_through, read_claims, unsettled
from .format.retry import RetryPolicy, retrying
from .format.routing import ShardRouter
from .format.schema import ADDED_COLUMN_METADATA, LAST_WRITE_WINS, empty_tail
from .format.shard_manifest import KnownShardFiles, wal_entries_complete
from .format.shard_state import ShardState, load_shard_state
from .format.storage import StorageOptions, TableStorage
from .format.version import ShardPosition, TableVersion
from .read.merged_read import SHARED_PENDING_GENERATIONS, ReadSnapshot
from .read.pending_run import PendingRuns
from .read.pk_bloom import GenerationFilters
from .read.wal_tail import SHARED_RESOLVED_TAILS, SHARED_WAL_ENTRIES, read_wal_tail
from .write.activity import WriteActivity

_T = TypeVar("_T")

CONFIG_PRIMARY_KEY = "lsm.primary_key"
CONFIG_SHARD_IDS = "lsm.shard_ids"
CONFIG_MERGE_ENGINE = "lsm.merge_engine"
CONFIG_TABLE_ID = "lsm.table_id"
"""A random id a table records at creation: a table created again at the same location is another table."""

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
"""The ``ShardWriter`` settings a table records at creation."""

_session: lance.Session | None = None
_session_lock = threading.Lock()


def shared_session() -> lance.Session:
    """The process's Lance session, shared by every table opened in it.

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


def absolute_uri(uri: str) -> str:
    """Local paths become absolute: Spark executors and other processes resolve
    them from another working directory."""
    return uri if "://" in uri else os.path.abspath(uri)


class TableHandle:
    """An opened LSM table's fixed parts: location, settings, router and read caches.

    Built by :meth:`open` (or by ``LsmTable.open``/``create``). Everything it
    holds is fixed for the table's life (key, shards, writer settings) or is a
    cache of immutable things; what changes (the base version, shard states)
    is read anew by each call. Safe to share between threads.
    """

    def __init__(self, uri: str, dataset: lance.LanceDataset, storage_options: StorageOptions | None = None) -> None:
        config = dataset.config()
        details = dataset.mem_wal_index_details()
        if details is None or CONFIG_SHARD_IDS not in config:
            raise ValueError(f"{uri} is not an LSM table (create it with LsmTable.create)")
        self.uri = uri
        self.storage_options = storage_options
        self.storage = TableStorage(uri, storage_options)
        """The table's files: filesystem, root and retry policy, built once."""
        self.cache_scope = f"{self.storage.location}#{config.get(CONFIG_TABLE_ID, '')}"
        """What the process's caches of this table's files are keyed by: its location, and its id (a file of a
        table created again at the same location may have the name, size and, on object stores, the
        second-resolution modification time of one read before)."""
        self.session = shared_session()
        self.primary_key: tuple[str, ...] = tuple(json.loads(config[CONFIG_PRIMARY_KEY]))
        self.shard_ids: tuple[str, ...] = tuple(json.loads(config[CONFIG_SHARD_IDS]))
        self.writer_config: dict[str, str] = dict(details.get("writer_config_defaults") or {})
        """The writer settings recorded at creation, as Lance stores them (strings)."""
        self.merge_engine: str = config.get(CONFIG_MERGE_ENGINE, LAST_WRITE_WINS)
        """``last-write-wins`` or ``partial-update`` (tables created before the setting: the former)."""
        self.router = ShardRouter(details["sharding_specs"][0], dataset.lance_schema, self.shard_ids)
        self.runs = PendingRuns(self.storage, self.cache_scope)
        self.write_activity = WriteActivity()
        """What this process's writers of the table are doing, for work that keeps off their cores."""
        self.pending_cache = SHARED_PENDING_GENERATIONS
        self.wal_entries = SHARED_WAL_ENTRIES
        self.wal_tails = SHARED_RESOLVED_TAILS
        self.known_files = KnownShardFiles()
        self.generation_filters = GenerationFilters(self.storage, [dataset.schema.field(k) for k in self.primary_key])
        # A version's manifest and transactions never change: decode its markers and claims once per version.
        self._version_facts = lru_cache(maxsize=16)(self._read_version_facts)
        self._history = dataset.checkout_version(dataset.version)
        """Reads transactions by number: its own object, one call at a time (pylance borrows it mutably)."""
        self._history_lock = threading.Lock()
        self.schema: pa.Schema = dataset.schema
        """The base's columns when the handle was opened (:meth:`dataset` has the latest)."""
        self._read_base: lance.LanceDataset | None = dataset  # reused for reads while no commit comes

    @classmethod
    def open(cls, uri: str, storage_options: StorageOptions | None = None) -> TableHandle:
        """Open the LSM table at ``uri``; raises as :meth:`LsmTable.open <resources.lsm.table.LsmTable.open>`."""
        uri = absolute_uri(uri)
        policy = RetryPolicy.from_options(storage_options)
        try:
            dataset = retrying(
                lambda: lance.dataset(uri, storage_options=storage_options, session=shared_session()),
                "open",
                uri,
                policy,
            )
        except ValueError as exc:
            if "was not found" in str(exc):
                raise TableNotFoundError(f"no table at {uri}") from exc
            raise
        return cls(uri, dataset, storage_options)

    @property
    def is_local(self) -> bool:
        return self.storage.is_local

    def retrying(self, call: Callable[[], _T], operation: str, before_retry: Callable[[], object] | None = None) -> _T:
        """``call()`` with the table's retries (it must be safe to repeat); see :meth:`TableStorage.retrying`."""
        return self.storage.retrying(call, operation, before_retry)

    def dataset(self) -> lance.LanceDataset:
        """The base table at its latest version (as committed by any process when called).

        Every call opens the latest version anew; opens share the process's
        Lance session (:func:`shared_session`), so indexes and file metadata
        already read are not read again, by this handle or another one.
        """
        return self.retrying(
            lambda: lance.dataset(self.uri, storage_options=self.storage_options, session=self.session), "open"
        )

    def dataset_to_read(self) -> lance.LanceDataset:
        """The latest base version, for reads only: the object opened last while no commit came since.

        Checking for a newer version costs a third of opening one, and the
        reused object keeps Lance's per-dataset state warm. Never handed to a
        commit (``merge_insert`` moves its dataset object to the new version).
        """
        cached = self._read_base
        if cached is not None and self.retrying(lambda: cached.latest_version, "open") == cached.version:
            return cached
        self._read_base = self.dataset()
        return self._read_base

    def writer_settings(self) -> dict[str, Any]:
        """The recorded writer settings as typed keyword arguments (Lance records every value as a string)."""
        return {
            key: value == "true" if key == "durable_write" else int(value)
            for key, value in self.writer_config.items()
            if key in WRITER_CONFIG_KEYS
        }

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
        compacted = self.compacted_generations(dataset.version)
        wanted = None if shard_ids is None else set(shard_ids)
        return [
            load_shard_state(
                self.storage, shard_id, bucket, compacted.get(shard_id, 0), for_read=for_read, known=self.known_files
            )
            for bucket, shard_id in enumerate(self.shard_ids)
            if wanted is None or shard_id in wanted
        ]

    def version(self) -> TableVersion:
        """The merged view's version now: the base version, then each shard's manifest version and WAL position.

        Pinned in the order a read pins (base first), so reading it later
        (``as_of``) gives what a read started now would have given.
        """
        dataset = self.dataset_to_read()
        states = self.shard_states(dataset, for_read=True)
        return TableVersion(dataset.version, tuple(ShardPosition(s.manifest_version, s.wal_position) for s in states))

    def dataset_at(self, version: TableVersion) -> lance.LanceDataset:
        """The base table as ``version`` pinned it.

        Raises
        ------
        VersionNotRetainedError
            If garbage collection removed that base version.
        """
        if len(version.shards) != len(self.shard_ids):
            raise ValueError(f"version {version} has {len(version.shards)} shards, the table {len(self.shard_ids)}")
        try:
            return self.retrying(
                lambda: lance.dataset(
                    self.uri, version=version.base, storage_options=self.storage_options, session=self.session
                ),
                "open",
            )
        except (ValueError, OSError) as error:
            if "not found" not in str(error).lower():
                raise
            raise VersionNotRetainedError(version, f"base version {version.base} was removed") from error

    def shard_states_at(
        self, version: TableVersion, dataset: lance.LanceDataset, shard_ids: Iterable[str] | None = None
    ) -> list[ShardState]:
        """The shards' states as ``version`` pinned them, above its base (``dataset``, from :meth:`dataset_at`).

        Raises
        ------
        VersionNotRetainedError
            If a generation or WAL entry the version lists was removed.
        """
        compacted = self.compacted_generations(dataset.version)
        wanted = None if shard_ids is None else set(shard_ids)
        states = []
        for bucket, (shard_id, position) in enumerate(zip(self.shard_ids, version.shards, strict=True)):
            if wanted is not None and shard_id not in wanted:
                continue
            state = load_shard_state(
                self.storage,
                shard_id,
                bucket,
                compacted.get(shard_id, 0),
                for_read=True,
                at=position,
                known=self.known_files,
            )
            self._check_retained(version, state)
            states.append(state)
        return states

    def _check_retained(self, version: TableVersion, state: ShardState) -> None:
        """Raise :class:`VersionNotRetainedError` if a file ``state`` (read at ``version``) lists is gone."""
        if not wal_entries_complete(state.wal_entries, state.replay_after_wal_position, state.wal_position):
            raise VersionNotRetainedError(version, f"WAL entries of shard {state.bucket} were removed")
        for generation, directory in state.pending_generations:
            if not self.storage.exists(generation_dir(state.shard_id, directory)):
                raise VersionNotRetainedError(version, f"generation {generation} of shard {state.bucket} was removed")

    def compacted_generations(self, version: int) -> dict[str, int]:
        """Each shard's merged-through generation at base ``version``: the newer of its compacted marker
        and the claim of a data commit the marker has not caught up with yet
        (:mod:`~resources.lsm.format.merge_claims`). Decoded once per version."""
        return merged_through(*self._version_facts(version))

    def unsettled_claims(self, version: int) -> dict[str, int]:
        """The generations a data commit at or below ``version`` merged beyond the marker (usually none)."""
        return unsettled(*self._version_facts(version))

    def _read_version_facts(self, version: int) -> tuple[dict[str, int], dict[str, int]]:
        """The compacted markers and the outstanding claims at base ``version``."""
        manifest = read_manifest(self.storage, version)
        return compacted_generations_in(manifest), CLAIMS.get(
            (self.uri, version, zlib.crc32(manifest)), lambda: self._read_claims(version)
        )

    def _read_claims(self, version: int) -> dict[str, int]:
        with self._history_lock:
            return read_claims(self._history, version)

    def snapshot(
        self,
        fresh: bool,
        shard_ids: set[str] | None = None,
        *,
        dataset: lance.LanceDataset | None = None,
        as_of: TableVersion | None = None,
        keys: pa.Table | None = None,
    ) -> ReadSnapshot:
        """What a read of ``shard_ids`` (default: all shards) sees, pinned now (above ``dataset``, if given),
        or as ``as_of`` pinned it (``dataset``, if given, is its base: :meth:`dataset_at`).

        The base version, the pending generations above its markers and (with
        ``fresh``) each shard's WAL tail: the input of the read path
        (:mod:`resources.lsm.read.merged_read`). With ``keys`` (the key
        columns of a point lookup) the tail holds only those keys' changes.
        """
        if as_of is None:
            dataset = self.dataset_to_read() if dataset is None else dataset
            states = self.shard_states(dataset, shard_ids, for_read=True)
        else:
            dataset = self.dataset_at(as_of) if dataset is None else dataset
            states = self.shard_states_at(as_of, dataset, shard_ids)
        schema = dataset.schema  # each call converts Lance's schema again (3 us)
        tails = [
            read_wal_tail(
                self.storage,
                s.shard_id,
                s.wal_entries,
                schema,
                list(self.primary_key),
                keys=keys,
                cache=self.wal_entries,
                resolved=self.wal_tails,
                scope=self.cache_scope,
            )
            for s in states
            if fresh and s.unflushed_wal_entries
        ]
        # The pinned base's schema: it may have columns added after the handle was opened.
        tail = pa.concat_tables(tails) if tails else empty_tail(schema)
        return ReadSnapshot(
            dataset,
            tuple(states),
            tail,
            self.primary_key,
            self.storage,
            self.session,
            self.pending_cache,
            self.runs,
        )


def added_columns(schema: pa.Schema) -> frozenset[str]:
    """Columns of ``schema`` added to the live table after creation: an upsert may leave them out (null)."""
    return frozenset(f.name for f in schema if (f.metadata or {}).get(ADDED_COLUMN_METADATA) == b"true")
