"""Pending runs: a shard's pending generations resolved once and stored, with their deletion vector.

Reading the pending levels means opening every pending generation (a Lance
dataset each), keeping the newest change per key across them, and dropping
the base rows those keys supersede: a key join over the whole base. A
*pending run* pays for that once, in maintenance after a flush or a merge,
and stores the result as one Arrow IPC file per shard::

    _lsm_runs/<shard uuid>/<first gen>-<last gen>-<digest>.arrow

It covers the first ``n`` generations above the shard's compacted marker
(``lsm.generations`` in the schema metadata; the digest names their
directories; a magic and a CRC-32 precede the Arrow data, as IPC files carry
no checksum) and holds the newest change of every key in them (the table's
columns plus ``_tombstone``) and ``_base_rowaddr``: the address of the base
row each key supersedes, ``NOT_IN_BASE`` if the base lacks the key (null in
runs of older versions: not looked up). Those addresses are the run's
deletion vector (:mod:`resources.lsm.read.deletion_vector`). A key's base
row cannot change while its run is in use (only a merge of the shard's
generations, which retires the run, or a rewrite, which the vector check
catches, moves it), so an extended run keeps what the previous one found.

A run is an optional shortcut, never the truth. A reader uses one only if its
generations are exactly a prefix of the shard's pending generations (a merge
moves the marker and retires it), reads any newer generations itself, and
trusts each row of its vector only while the fragment the row is in is still in
the pinned base (``compact_files`` gives the rows of the fragments it rewrites
new addresses); the keys whose row moved are joined as before. A missing or unreadable run is logged and read
around (a warning once the newest generation is older than
``MISSING_RUN_WARNING_SECONDS``: runs are built by maintenance, after the
flush). Runs are written atomically, rebuilt when stale, and deleted by GC
once the marker passes their first generation.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from functools import cached_property

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..format.layout import run_dir
from ..format.schema import ROW_ADDRESS, conform, empty_tail
from ..format.shard_state import ShardState, generation_flush_time_ns
from ..format.storage import TableStorage
from ..lru_cache import LruCache
from .base_key_index import BaseKeyIndex
from .deletion_vector import DeletionVector, addresses_by_key, base_row_addresses, fragment_ids
from .generations import newest_per_key, read_generations
from .key_sets import KeyIndex, rows_of_keys
from .level_readers import build_in_background, level_readers
from .rewrites import follow_moved_rows

log = logging.getLogger(__name__)

MISSING_RUN_WARNING_SECONDS = 300.0
"""A run missing for a generation flushed longer ago than this is logged as a warning (maintenance is late)."""
BASE_ROW_ADDRESS = "_base_rowaddr"
NOT_IN_BASE = np.uint64(2**64 - 1)
"""``_base_rowaddr`` of a key the base lacks (looked up, not found): no row can have this address."""
MISSING_RUN_RECHECK_SECONDS = 1.0
"""How long a run found missing is taken as missing without looking again (reads go around it meanwhile)."""
SCANS_BEFORE_KEY_INDEX = 8
"""Lookups a run answers by scanning its keys before it builds an index of them."""
_GENERATIONS = b"lsm.generations"
_SHARD = "__lsm_shard"
"""While runs are built together: the index of the shard a row belongs to."""
_MAGIC = b"LSMRUN1\n"
"""A run file is this magic, the CRC-32 of the rest (4 bytes, little-endian), then an Arrow IPC file."""
_REPORTED: LruCache[tuple[str, str], bool] = LruCache(max_entries=4096)
"""Runs (table location, run path) this process warned about: every table object opened anew would warn again."""
_ALIGNED = pa.ipc.IpcReadOptions(ensure_alignment=pa.ipc.Alignment.DataTypeSpecific)
"""The body follows a 12-byte header, so its buffers sit 4 bytes off their types' alignment in the bytes read:
they are copied to aligned memory (0.6 ms for 16 MB), or Acero warns on every join and numpy reads them unaligned."""
_ROWS_SCANNED_PER_KEY_LENT = 100
"""Base rows whose keys a scan reads and joins in the time a key is lent its base row by an older run.

Lending costs about 1.5 µs a key (reading the lender, joining its keys, a take of addresses only); a scan
joins int64 keys at about 16 ns a row, strings at 55. ``benchmarks/runs_after_merge.py``: 200k keys lent on
64Mi rows, 0.45-0.71 s against 0.81-1.64 s looked up; 183k keys on 1Mi rows, 0.48-0.54 s against 0.26-0.34."""
_CACHED_RUNS = 1024
"""Runs the process keeps at most (besides the byte budget): a few per shard are ever in use."""

Generations = tuple[tuple[int, str], ...]
"""``(generation, directory)`` pairs, ascending."""


@dataclass(frozen=True, eq=False)  # identity: comparing tables row by row is never what is meant
class PendingRun:
    """The newest change per key over ``generations`` of one shard, and the base rows they supersede."""

    shard_id: str
    generations: Generations
    changes: pa.Table
    """One row per key: the table's columns and ``_tombstone``."""
    base_rows: pa.Array
    """``uint64`` address of each change's superseded base row, aligned with ``changes``.

    ``NOT_IN_BASE`` for a key the base lacks; null for one not looked up
    (runs of older versions). Ascending in a run built here."""
    _key_index: KeyIndex | None = field(default=None, init=False, repr=False)
    _index_build: Future[None] | None = field(default=None, init=False, repr=False)
    _followed: tuple[frozenset[int], PendingRun] | None = field(default=None, init=False, repr=False)
    """The run as the last base it was followed into (its fragment ids) holds it (:func:`followed`)."""

    @cached_property
    def superseded(self) -> DeletionVector:
        """The base rows the run's keys supersede."""
        addresses = self.base_rows.drop_null().to_numpy()
        return DeletionVector(addresses[addresses != NOT_IN_BASE])

    def held_in(self, fragments: set[int] | frozenset[int]) -> PendingRun:
        """This run as a base holding ``fragments`` (ids) sees it: base rows in any other fragment forgotten.

        A rewrite (``compact_files``) gives the rows of the fragments it
        replaces new addresses, and leaves every other row where it was. So
        only the keys whose row was in a replaced fragment lose it (null: not
        looked up, so joined or looked up again); the rest of the vector
        still holds. ``self`` when every fragment it points into is there.
        """
        if self.superseded.holds_in(fragments):
            return self
        addresses = self.base_rows.fill_null(NOT_IN_BASE).to_numpy()
        in_base = addresses != NOT_IN_BASE
        present = np.fromiter(fragments, dtype=np.uint64, count=len(fragments))
        moved = in_base & ~np.isin(addresses >> np.uint64(32), present)
        return self.with_base_rows(pc.if_else(pa.array(moved), pa.scalar(None, pa.uint64()), self.base_rows))

    def with_base_rows(self, base_rows: pa.Array) -> PendingRun:
        """This run's changes over other base rows (the key index, of the same changes, carried over)."""
        run = PendingRun(self.shard_id, self.generations, self.changes, base_rows)
        object.__setattr__(run, "_key_index", self._key_index)
        return run

    @cached_property
    def _lookups_served(self) -> Iterator[int]:
        return itertools.count()

    def key_index(self, primary_key: list[str]) -> KeyIndex | None:
        """The row of each key, once built: after the run was asked by ``SCANS_BEFORE_KEY_INDEX`` lookups.

        ``None`` until then: a reader doing one lookup scans the run's keys,
        and a reader serving many has the index built once, on the level
        readers' threads (:class:`~resources.lsm.read.key_sets.KeyIndex`;
        500k string keys take about 85 ms, which no lookup waits for), and
        answers each lookup from it once it is there.
        """
        if self._key_index is None and next(self._lookups_served) == SCANS_BEFORE_KEY_INDEX:
            build = build_in_background(
                lambda: object.__setattr__(self, "_key_index", KeyIndex(self.changes, primary_key)),
                f"the key index of pending run {self.generations} of shard {self.shard_id}",
            )
            object.__setattr__(self, "_index_build", build)
        return self._key_index

    def index_built(self, timeout: float | None = 0) -> bool:
        """Whether the key index is built, waiting up to ``timeout`` seconds (``None``: for ever) if its build
        is under way (one that failed was logged: lookups scan the run's keys)."""
        if self._key_index is None and self._index_build is not None:
            wait([self._index_build], timeout)
        return self._key_index is not None

    def extra_generations(self, shard: ShardState) -> Generations:
        """The shard's pending generations newer than the run (``shard``'s pending list must extend the run's)."""
        return shard.pending_generations[len(self.generations) :]


def run_path(shard_id: str, generations: Generations) -> str:
    """Where the run covering ``generations`` of ``shard_id`` lives, relative to the table root."""
    digest = hashlib.sha1("\n".join(d for _, d in generations).encode()).hexdigest()[:16]
    return f"{run_dir(shard_id)}/{generations[0][0]:08d}-{generations[-1][0]:08d}-{digest}.arrow"


def covered_generations(name: str) -> tuple[int, int] | None:
    """The first and last generation a run file covers, by its name; ``None`` for any other file."""
    parts = name.removesuffix(".arrow").split("-")
    if not name.endswith(".arrow") or len(parts) != 3 or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    return int(parts[0]), int(parts[1])


def build_runs(
    storage: TableStorage,
    dataset: lance.LanceDataset,
    shards: Sequence[ShardState],
    primary_key: list[str],
    previous: Mapping[str, PendingRun | None],
    *,
    lenders: Mapping[str, PendingRun] | None = None,
    fragments: set[int] | None = None,
    session: lance.Session | None = None,
    map: Callable[..., Iterable[pa.Table]] = map,
) -> list[PendingRun]:
    """Resolve each shard's pending generations (above its marker in ``dataset``, the base at ``storage``) into a run.

    ``shards`` must be pinned above ``dataset`` (``LsmTable.shard_states``);
    ``fragments`` are ``dataset``'s fragment ids, if the caller has them.
    ``previous[shard_id]``, a run over a prefix of that shard's pending
    generations, is extended rather than rebuilt, at a cost that follows the
    newer generations: only they are read (through ``map``: pass a thread
    pool's) and resolved to one change per key; the earlier run's rows they
    supersede are dropped, and only keys it did not hold are looked up in the
    base. ``lenders[shard_id]``, a run a merge has since taken part of
    (its first generations are merged), lends the base rows it found to the
    keys it holds, for a shard without a ``previous`` run: a row never
    changes, and a merge that changed its key deleted it, so each lent row
    that is still live is the key's (:func:`_lent_base_rows`). A key lives
    in one shard, so all shards go through each step together, with one
    probe of the base (a search of its key index, a BTREE ``IN`` query or a
    scan of the key columns, whichever costs less for their number:
    :func:`~resources.lsm.read.deletion_vector.base_row_addresses`).
    """
    if not shards:
        return []
    present = fragment_ids(dataset) if fragments is None else fragments
    columns = empty_tail(dataset.schema).schema
    earlier = [previous.get(shard.shard_id) for shard in shards]
    todo = [
        (index, (shard.shard_id, directory))
        for index, (shard, run) in enumerate(zip(shards, earlier, strict=True))
        for _, directory in (run.extra_generations(shard) if run else shard.pending_generations)
    ]
    read = read_generations(storage, [g for _, g in todo], columns, session=session, map=map)
    tagged = [_tagged(rows, index) for (index, _), rows in zip(todo, read, strict=True)]
    newer = newest_per_key(tagged, columns.append(pa.field(_SHARD, pa.int32())), primary_key)
    older = _earlier_rows(earlier, storage, dataset, present, columns)
    # A re-written key keeps the base row its earlier run found; only the others are looked up.
    earlier_row = rows_of_keys(newer, older, primary_key)
    carried = older.column(BASE_ROW_ADDRESS).take(earlier_row).combine_chunks()
    rewritten = np.zeros(older.num_rows, dtype=bool)
    rewritten[earlier_row.drop_null().to_numpy()] = True
    older = older.filter(pa.array(~rewritten))
    known = pa.concat_arrays([older.column(BASE_ROW_ADDRESS).combine_chunks(), carried])
    resolved = pa.concat_tables([older.drop_columns([BASE_ROW_ADDRESS]), newer]).combine_chunks()
    holding = [followed(run, storage, dataset, present) for run in (lenders or {}).values()]
    known = _lent_base_rows(dataset, resolved.select(primary_key), known, holding, primary_key)
    base_rows = _fill_base_rows(storage, dataset, resolved.select(primary_key), known, primary_key)
    runs = []
    shard_of_row = resolved.column(_SHARD).to_numpy()
    for index, shard in enumerate(shards):
        mine = np.flatnonzero(shard_of_row == index)
        # The vector ascending: readers need not sort.
        order = mine[pc.array_sort_indices(base_rows.take(mine)).to_numpy()]
        changes = resolved.drop_columns([_SHARD]).take(order)
        runs.append(PendingRun(shard.shard_id, shard.pending_generations, changes, base_rows.take(order)))
    return runs


def _tagged(rows: pa.Table, shard_index: int) -> pa.Table:
    return rows.append_column(_SHARD, pa.array(np.full(rows.num_rows, shard_index, dtype=np.int32)))


def _earlier_rows(
    earlier: list[PendingRun | None],
    storage: TableStorage,
    dataset: lance.LanceDataset,
    fragments: set[int],
    columns: pa.Schema,
) -> pa.Table:
    """The earlier runs' changes, tagged with their shard, with the base rows they found, as ``dataset`` holds them.

    A row a rewrite of the base moved is followed to its new address
    (:func:`~resources.lsm.read.rewrites.follow_moved_rows`); null base rows
    where it cannot be (looked up again) or where a row was never looked up.
    """
    parts = [columns.append(pa.field(_SHARD, pa.int32())).append(pa.field(BASE_ROW_ADDRESS, pa.uint64())).empty_table()]
    for index, run in enumerate(earlier):
        if run is None:
            continue
        base_rows = followed(run, storage, dataset, fragments).base_rows
        parts.append(_tagged(conform(run.changes, columns), index).append_column(BASE_ROW_ADDRESS, base_rows))
    return pa.concat_tables(parts)


def followed(run: PendingRun, storage: TableStorage, dataset: lance.LanceDataset, fragments: set[int]) -> PendingRun:
    """``run`` as ``dataset`` (``fragments``: its ids) holds it: the rows a rewrite moved at their new address.

    ``run`` itself when no row moved; null where a row cannot be followed
    (:func:`~resources.lsm.read.rewrites.follow_moved_rows`): its key is then
    looked up again. Kept with ``run`` for the last base asked (every read
    of that base asks again, until a build stores the run it follows into).
    """
    if run._followed is not None and run._followed[0] == fragments:
        return run._followed[1]
    held = run.held_in(fragments)
    if held is run:
        return run
    moved = np.flatnonzero(
        held.base_rows.is_null().to_numpy(zero_copy_only=False)
        & run.base_rows.is_valid().to_numpy(zero_copy_only=False)
    )
    moved_to = follow_moved_rows(storage, dataset, fragments, run.base_rows.take(moved).to_numpy())
    found = moved_to.is_valid().to_numpy(zero_copy_only=False)
    addresses = moved_to.fill_null(NOT_IN_BASE).to_numpy()[found]
    result = run.with_base_rows(_placed(held.base_rows, moved[found], addresses))
    object.__setattr__(run, "_followed", (frozenset(fragments), result))
    return result


def _lent_base_rows(
    dataset: lance.LanceDataset, keys: pa.Table, known: pa.Array, lenders: list[PendingRun], primary_key: list[str]
) -> pa.Array:
    """``known``, with the keys it lacks given the base row a ``lenders`` run found for them, if still live.

    A run found each key's row in an older base version. The row's content
    is what it was then; a merge since then that changed the key deleted
    it. So a row still live holds the key, and no other row does: checking
    that it is live (a take of addresses only, no column decoded: about
    0.5 µs a row against 5-12 µs for a take of the key to compare) is
    enough. A key a lender found absent from the base may have been merged
    in since: it is looked up again. Keys many enough for the base to be
    scanned for them are all looked up (:data:`_ROWS_SCANNED_PER_KEY_LENT`).
    """
    if not lenders or dataset.has_stable_row_ids:  # a take then reads ids, not addresses
        return known
    missing = np.flatnonzero(known.is_null().to_numpy(zero_copy_only=False))
    if not len(missing) or len(missing) * _ROWS_SCANNED_PER_KEY_LENT > dataset.count_rows():
        return known  # a scan of the base's keys costs less
    lent = pa.concat_tables(
        [run.changes.select(primary_key).append_column(BASE_ROW_ADDRESS, run.base_rows) for run in lenders]
    )
    offered = (
        addresses_by_key(keys.take(missing), lent, primary_key, BASE_ROW_ADDRESS).fill_null(NOT_IN_BASE).to_numpy()
    )
    candidates = np.unique(offered[offered != NOT_IN_BASE])
    if not len(candidates):
        return known
    live = dataset._take_rows(pa.array(candidates), columns=[ROW_ADDRESS]).column(ROW_ADDRESS).to_numpy()
    usable = (offered != NOT_IN_BASE) & np.isin(offered, live)
    return _placed(known, missing[usable], offered[usable])


def _fill_base_rows(
    storage: TableStorage, dataset: lance.LanceDataset, keys: pa.Table, known: pa.Array, primary_key: list[str]
) -> pa.Array:
    """``known``, with the base rows of the keys it lacks looked up in the base (``NOT_IN_BASE``: absent)."""
    missing = np.flatnonzero(known.is_null().to_numpy(zero_copy_only=False))
    if not len(missing):
        return known
    index = BaseKeyIndex.of(storage, dataset, partial=True)  # only when a key is looked up: opening lists and maps
    found = base_row_addresses(dataset, keys.take(missing), primary_key, index)
    return _placed(known, missing, found.fill_null(NOT_IN_BASE).to_numpy())


def _placed(known: pa.Array, at: np.ndarray, addresses: np.ndarray) -> pa.Array:
    """``known`` (``uint64`` base rows) with ``addresses`` at positions ``at``; its other nulls stay null."""
    values = known.fill_null(NOT_IN_BASE).to_numpy().copy()
    values[at] = addresses
    still_missing = known.is_null().to_numpy(zero_copy_only=False)
    still_missing[at] = False
    return pa.array(values, pa.uint64(), mask=still_missing)


def store_run(storage: TableStorage, run: PendingRun) -> str:
    """Write ``run`` atomically (readers see all of it or none); returns its path."""
    table = run.changes.append_column(BASE_ROW_ADDRESS, run.base_rows)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), _GENERATIONS: json.dumps(run.generations)})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    body = sink.getvalue().to_pybytes()
    path = run_path(run.shard_id, run.generations)
    storage.write_bytes_atomic(path, _MAGIC + zlib.crc32(body).to_bytes(4, "little") + body)
    return path


def read_run(storage: TableStorage, path: str, shard_id: str) -> PendingRun:
    """The run stored at ``path``; ``OSError`` / ``ValueError`` / ``pa.ArrowInvalid`` if unreadable or damaged."""
    data = storage.read_bytes(path)
    body = memoryview(data)[len(_MAGIC) + 4 :]  # not a copy (runs of a busy shard are tens of MB): see _ALIGNED
    if not data.startswith(_MAGIC) or zlib.crc32(body) != int.from_bytes(data[len(_MAGIC) : len(_MAGIC) + 4], "little"):
        raise ValueError(f"{path} is damaged (checksum mismatch)")
    table = pa.ipc.open_file(pa.BufferReader(pa.py_buffer(body)), options=_ALIGNED).read_all()
    generations = tuple((int(g), str(d)) for g, d in json.loads((table.schema.metadata or {})[_GENERATIONS]))
    if not generations or run_path(shard_id, generations) != path:
        raise ValueError(f"{path} does not hold the run its name promises")
    base_rows = table.column(BASE_ROW_ADDRESS).combine_chunks()
    return PendingRun(shard_id, generations, table.drop_columns([BASE_ROW_ADDRESS]), base_rows)


RunCache = LruCache[tuple[str, str], PendingRun]
"""Runs read or built, by table (:attr:`~resources.lsm.handle.TableHandle.cache_scope`) and path."""


def run_cache(max_bytes: int = 1 << 30) -> RunCache:
    """An empty :data:`RunCache` keeping at most ``max_bytes`` of runs, least recently used dropped first."""
    return LruCache(_CACHED_RUNS, max_bytes=max_bytes, size_of=lambda run: run.changes.nbytes)


SHARED_RUNS = run_cache()
"""The runs this process read or built, shared by every table object opened in it. Beside a busy writer each
generation cut brings a new run per shard (tens of MB at 64M rows): a reader opened anew (every Dagster step,
every ``LsmTable.open``) then starts with the runs, and their key indexes, an earlier one read and built."""


class PendingRuns:
    """Finds and caches the stored runs of one table's shards. Safe to share between threads.

    A run's content is fixed by its generations, so cached runs are reused
    until the shard's pending generations no longer extend them; ``cache``
    (:data:`SHARED_RUNS` unless given) holds them under ``scope``, the
    table's :attr:`~resources.lsm.handle.TableHandle.cache_scope`. A run
    found missing is not looked for again for ``MISSING_RUN_RECHECK_SECONDS``
    (each look is a read and a listing, most of a point lookup's own cost when
    generations wait for their run): reads use the run over a shorter prefix
    found instead, if any; one built in this process meanwhile is found at
    once (:meth:`remember`).
    """

    def __init__(self, storage: TableStorage, scope: str, cache: RunCache = SHARED_RUNS) -> None:
        self._storage, self._scope, self._cache = storage, scope, cache
        self._missing: dict[str, tuple[float, str | None]] = {}
        """Each missing run's path: when it was found missing (``time.monotonic()``), and the run over a
        shorter prefix of its generations found instead (its path), if any."""
        self._finding: set[str] = set()
        """Runs (paths) being looked for off the lookup path (:meth:`for_lookups`)."""
        self._lock = threading.Lock()
        """Guards ``_missing`` and ``_finding``."""
        self._indexed: dict[str, PendingRun | None] = {}
        """Each shard's newest run whose key index lookups used (:meth:`for_lookups`): one run a shard, kept
        besides the cache's budget until a newer one's index is built."""

    def find(self, shard: ShardState, *, maintenance: bool = False) -> PendingRun | None:
        """The stored run over the longest prefix of ``shard``'s pending generations, if any.

        For a read, a missing or unreadable run is logged (once per process,
        shard and pending set), and a run found missing less than
        ``MISSING_RUN_RECHECK_SECONDS`` ago is not looked for again (the run
        over a shorter prefix found then, if any, is the answer). For
        ``maintenance`` (which builds and merges runs) neither: it always looks.
        """
        pending = shard.pending_generations
        if not pending:
            return None
        full = run_path(shard.shard_id, pending)
        if (cached := self._cached(full)) is not None:
            return cached
        with self._lock:
            seen, prefix = self._missing.get(full, (-math.inf, None))
        if not maintenance and time.monotonic() - seen < MISSING_RUN_RECHECK_SECONDS:
            if prefix is None:
                return None
            if (cached := self._cached(prefix)) is not None:
                return cached
        found: PendingRun | None = None
        for path in self._stored(shard.shard_id, pending):
            if (found := self._cached(path)) is not None:
                break
            try:
                found = read_run(self._storage, path, shard.shard_id)
            except FileNotFoundError:
                continue  # not built (or retired meanwhile)
            except (OSError, ValueError, KeyError, pa.ArrowInvalid) as exc:
                if not maintenance:
                    self._report(shard, path, f"is unreadable ({exc}); reading its generations instead")
                return None
            self.remember(found)
            break
        if found is not None and found.generations == pending:
            return found
        with self._lock:
            now = time.monotonic()
            self._missing = {p: m for p, m in self._missing.items() if now - m[0] < MISSING_RUN_RECHECK_SECONDS}
            self._missing[full] = (now, None if found is None else run_path(shard.shard_id, found.generations))
        if found is None and not maintenance:
            self._report_missing(shard, full)
        return found

    def for_lookups(self, shard: ShardState, primary_key: list[str]) -> PendingRun | None:
        """The run point lookups of ``shard`` read: :meth:`find`'s, or while it is not read or its key index
        not built yet, the indexed run it extends (if the lookups had one), with the generations between
        read directly.

        Beside a busy writer the keeper replaces a shard's run with each
        generation cut, and every reader reads and indexes each new run
        again; a lookup meanwhile would wait for the read (tens of MB) or
        scan the new run's keys (about 1.6 ms a lookup for 500k string keys,
        where its index answers in microseconds). Both are done off the
        lookup path.
        """
        pending = shard.pending_generations
        older = self._indexed.get(shard.shard_id)
        extends = older is not None and older.generations == pending[: len(older.generations)]
        if extends and older is not None and older.generations != pending:
            run = self._cached(run_path(shard.shard_id, pending))
            if run is None:
                self._find_in_background(shard)
                return older
        else:
            run = self.find(shard)
        if run is None or run.index_built():
            self._indexed[shard.shard_id] = run
            return run
        if not extends:
            return run  # scanned, and counted towards its index
        run.key_index(primary_key)  # counted towards its index
        return older

    def _find_in_background(self, shard: ShardState) -> None:
        """:meth:`find` on the level readers, unless under way or found missing less than a recheck ago."""
        path = run_path(shard.shard_id, shard.pending_generations)
        with self._lock:
            seen, _ = self._missing.get(path, (-math.inf, None))
            if path in self._finding or time.monotonic() - seen < MISSING_RUN_RECHECK_SECONDS:
                return
            self._finding.add(path)

        def find() -> None:
            try:
                self.find(shard)
            finally:
                with self._lock:
                    self._finding.discard(path)

        build_in_background(find, f"the run {path}")

    def partly_merged(self, shard: ShardState) -> PendingRun | None:
        """The stored run of ``shard`` that reaches furthest into its pending generations from below its marker.

        A merge takes the first generations of a run built meanwhile (up to
        the run it planned with), and a run must start at the marker: the
        run over the rest is built again, from this one's base rows
        (:func:`build_runs`' ``lenders``). ``None`` if there is none, or
        it is unreadable (GC deletes such runs: the rebuild then looks every key up).
        """
        pending, marker = shard.pending_generations, shard.compacted_generation
        if not pending:
            return None
        directory = run_dir(shard.shard_id)
        reaching = []
        for name in (f.name for f in self._storage.list_files(directory)):
            span = covered_generations(name)
            if span is not None and span[0] <= marker < span[1]:
                reaching.append((span[1], f"{directory}/{name}"))
        for _, path in sorted(reaching, reverse=True):
            try:
                run = self._cached(path) or read_run(self._storage, path, shard.shard_id)
            except (OSError, ValueError, KeyError, pa.ArrowInvalid):
                continue  # retired by GC meanwhile, or damaged: a shorter one may do
            rest = tuple(g for g in run.generations if g[0] > marker)
            if rest == pending[: len(rest)]:
                return run
        return None

    def find_each(self, shards: Sequence[ShardState]) -> list[PendingRun | None]:
        """:meth:`find` for each shard, in order.

        From object storage the runs are read in parallel; from a local disk
        one after another: each read takes a fraction of a millisecond, less
        than handing it to another thread costs.
        """
        if self._storage.is_local or len(shards) < 2:
            return [self.find(shard) for shard in shards]
        return list(level_readers().map(self.find, shards))

    def forget(self, run: PendingRun) -> None:
        """Drop ``run`` from the cache (its vector went stale: a rebuilt one may be stored)."""
        self._cache.discard((self._scope, run_path(run.shard_id, run.generations)))

    def _stored(self, shard_id: str, pending: Generations) -> Iterator[str]:
        """Paths of runs over prefixes of ``pending``, longest first.

        The full set's path comes first, unlisted (the usual case, one read);
        the shorter prefixes only if a listing shows them.
        """
        yield run_path(shard_id, pending)
        present = {f.name for f in self._storage.list_files(run_dir(shard_id))}
        prefixes = (run_path(shard_id, pending[:n]) for n in range(len(pending) - 1, 0, -1))
        yield from (path for path in prefixes if path.rsplit("/", 1)[1] in present)

    def _cached(self, path: str) -> PendingRun | None:
        return self._cache.find((self._scope, path))

    def remember(self, run: PendingRun) -> None:
        """Cache ``run`` (just built or read)."""
        self._cache.put((self._scope, run_path(run.shard_id, run.generations)), run)
        with self._lock:
            self._missing.clear()

    def _report_missing(self, shard: ShardState, path: str) -> None:
        """Warn if a run should exist by now: maintenance builds one soon after each flush."""
        if (self._storage.location, path) in _REPORTED:
            return  # said already: no need to list the generation for its age
        flushed_ns = generation_flush_time_ns(self._storage, shard.shard_id, shard.pending_generations[-1][1])
        age = None if flushed_ns is None else time.time() - flushed_ns / 1e9
        if age is not None and age < MISSING_RUN_WARNING_SECONDS:
            log.debug(
                "pending run %s of shard %s not built yet (newest generation %.0fs old)", path, shard.shard_id, age
            )
            return
        self._report(
            shard, path, f"is missing (newest generation flushed {age or 0:.0f}s ago); reading the generations"
        )

    def _report(self, shard: ShardState, path: str, problem: str) -> None:
        """Warn once per process, shard and pending set: every read, of any table object, would say the same."""
        said = (self._storage.location, path)
        if said not in _REPORTED:
            _REPORTED.put(said, True)
            log.warning("pending run %s of shard %s %s", path, shard.shard_id, problem)
