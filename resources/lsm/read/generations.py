"""Flushed generations (SSTables): where they live and how their rows are read.

A generation is a Lance dataset in its shard's directory (:func:`~resources.lsm.format.layout.generation_dir`), written
by one MemTable flush. Callers pass only directories that the shard manifest
lists (see :mod:`resources.lsm.format.shard_state`): a directory listing would also
find orphans of failed or fenced flushes, which must never be read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import lance
import pyarrow as pa
import pyarrow.compute as pc

from ..format.layout import generation_dir
from ..format.schema import conform
from ..format.storage import TableStorage
from .dedup import keep_last_per_key


def open_generation(
    storage: TableStorage, shard_id: str, directory: str, session: lance.Session | None = None
) -> lance.LanceDataset:
    """One generation of the table at ``storage`` as a Lance dataset (immutable once the manifest lists it).

    A shared ``session`` caches its metadata across opens.
    """
    return lance.dataset(
        storage.uri(generation_dir(shard_id, directory)), storage_options=storage.storage_options, session=session
    )


def generation_rows(
    generation: lance.LanceDataset, columns: pa.Schema, filter: str | pc.Expression | None = None
) -> pa.Table:
    """Every live row of ``generation`` in write order, cast to ``columns``.

    Later rows are newer: the order of a generation's physical rows is the
    order its changes were written (a flush hides a key's older versions
    behind a deletion vector, which the scan honours). ``columns`` usually
    includes ``_tombstone`` (``True`` marks a delete). Columns added to the
    table after the generation was flushed are null (see :func:`conform`);
    ``filter`` (Lance SQL or an Arrow expression) may name only the generation's own columns.
    """
    present = [name for name in columns.names if name in generation.schema.names]
    return conform(generation.to_table(columns=present, filter=filter, scan_in_order=True), columns)


def read_generations(
    storage: TableStorage,
    generations: Sequence[tuple[str, str]],
    columns: pa.Schema,
    *,
    session: lance.Session | None = None,
    map: Callable[[Callable[[tuple[str, str]], pa.Table], Sequence[tuple[str, str]]], Iterable[pa.Table]] = map,
) -> list[pa.Table]:
    """The rows of each ``(shard_id, directory)`` generation (:func:`generation_rows`), in order.

    ``map`` may be a thread pool's, to read several generations at once.
    """

    def read(generation: tuple[str, str]) -> pa.Table:
        shard_id, directory = generation
        return generation_rows(open_generation(storage, shard_id, directory, session), columns)

    return list(map(read, generations))


def newest_per_key(levels: Iterable[pa.Table], columns: pa.Schema, primary_key: Sequence[str]) -> pa.Table:
    """The newest change of every key over ``levels`` (oldest first, each shaped ``columns``)."""
    return keep_last_per_key(pa.concat_tables([columns.empty_table(), *levels]), list(primary_key))
