"""Spark 4 Python data source ``lance_lsm``: the merged view of an LSM table.

::

    register_spark_source(spark)
    df = spark.read.format("lance_lsm").load(uri)                  # == LsmTable(uri).read()
    df = spark.read.format("lance_lsm").option("fresh", "false").load(uri)
    df = spark.read.format("lance_lsm").option("columns", "id,price").load(uri)
    df = spark.read.format("lance_lsm").option("storage.aws_endpoint", "http://...").load("s3://bucket/t.lance")
    df = spark.read.format("lance_lsm").option("as_of", str(version)).load(uri)          # == read(as_of=version)
    df = spark.read.format("lance_lsm").option("changes_since", str(version)).load(uri)  # == changes(since=version)

``as_of`` reads the merged view as a :class:`~resources.lsm.format.version.TableVersion`
pinned it; ``changes_since`` (and optionally ``changes_until``) reads the
change feed (:meth:`LsmTable.changes`: the table's columns plus ``_op``), in
one partition: its size follows the change.

Options named ``storage.<key>`` are the table's Lance storage options
(:meth:`LsmTable.open`), used on the driver and in every task; without them
the environment (``AWS_*``) configures an object store. Every file is read
through Lance and ``pyarrow.fs``, never through Spark's own file readers.

Partitioning: one input partition per shard range
--------------------------------------------------

Newest-wins is decided per key and every key lives in exactly one shard, but
the base table is not laid out by shard: any base fragment holds keys of every
shard. Filtering the whole base by key hash in every partition would read the
base once per shard. Instead, on the driver, :meth:`LsmReader.partitions` pins
one snapshot (base version, each shard's pending generations, each shard's
WAL entries up to the newest position seen) and gives partition ``i``:

* its **shard range** ``i``: the newest change per key among shard ``i``'s
  pending generations (ascending) and its WAL tail (newest) — upserts are
  returned, tombstones only hide;
* a **slice of the base fragments** (balanced by row count): each base row is
  read by exactly one partition and returned unless its key has a newer
  change in *any* shard's pending levels.

So partition ``i`` also resolves every shard's pending levels, as
:func:`~resources.lsm.read.merged_read.resolve_levels` does for a local read:
one stored pending run per shard (plus any generation newer than it, and the
WAL tail), whose deletion vector drops the superseded base rows by position;
compaction keeps these levels small. The base, the bulk of the data, is read
once. The union of the partitions is the
merged view: a key with a pending change appears only from its shard's
partition, with its newest value; any other key comes from the one base
fragment that holds its live row. Every file a partition reads is immutable,
so all partitions see the same snapshot even while writers, flushes and merges
continue (garbage collection keeps what a pinned base version lists for its
grace period).

Filter pushdown: comparisons, ``IN``, null checks, ``NOT`` and string
prefix/suffix/contains on top-level columns become one pyarrow expression,
applied by Lance to the base scan and to the resolved pending rows — never
before resolution, which would let an older version of a filtered-out key
resurface. Spark re-checks nothing it pushed.

Column pruning: Spark 4.3's Python data-source API passes the reader the
declared schema and does not push projections. The source reads exactly the
columns of that schema: the ``columns`` option or a user-given schema
(``spark.read.format("lance_lsm").schema("id long, price double")``) narrows it.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any, TypeAlias, cast

import lance
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringContains,
    StringEndsWith,
    StringStartsWith,
)
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from ..format.schema import empty_tail, live_rows
from ..format.shard_state import ShardState
from ..format.storage import StorageOptions, TableStorage
from ..format.version import TableVersion
from ..handle import TableHandle, absolute_uri
from ..read.change_feed import change_schema
from ..read.merged_read import BaseRowFilter, ReadSnapshot, base_batches, resolve_levels
from ..read.pending_run import PendingRuns
from ..read.wal_tail import read_wal_tail
from .options import storage_options_of
from .writer import LsmBatchWriter, LsmStreamWriter, write_options

SOURCE_NAME = "lance_lsm"
FILTER_PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register_spark_source(spark: SparkSession) -> None:
    """Register ``lance_lsm`` on ``spark`` (idempotent) and enable Python filter pushdown.

    Spark refuses a Python source that implements ``pushFilters`` unless
    ``spark.sql.python.filterPushdown.enabled`` is on, so this turns it on.
    """
    spark.conf.set(FILTER_PUSHDOWN_CONF, "true")
    spark.dataSource.register(LsmDataSource)


@dataclass(frozen=True)
class ShardPin:
    """One shard's pending levels as of the pinned snapshot."""

    state: ShardState
    """The shard's state above the pinned base version (its pending generations)."""
    reads_tail: bool
    """Whether the state's WAL entries (:attr:`ShardState.wal_entries`) are read as the shard's tail."""


@dataclass(frozen=True)
class ShardRangePartition(InputPartition):
    """Partition ``index``: shard range ``index`` plus a slice of the base fragments."""

    index: int
    base_version: int
    fragment_ids: tuple[int, ...]
    shards: tuple[ShardPin, ...]


@dataclass(frozen=True)
class ChangesPartition(InputPartition):
    """The change feed between two versions (their text)."""

    since: str
    until: str


class LsmDataSource(DataSource):
    """``spark.read.format("lance_lsm").load(uri)``; options ``fresh``, ``columns``, ``as_of``,
    ``changes_since`` / ``changes_until`` and ``storage.<key>``.

    Also the sink of ``df.write`` and ``df.writeStream`` (:mod:`resources.lsm.spark.writer`).
    """

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        table = TableHandle.open(self._uri, storage_options_of(self.options))
        as_of = _version_option(self.options, "as_of")
        table_schema = table.dataset_at(as_of).schema if as_of else table.schema
        if _version_option(self.options, "changes_since"):
            table_schema = change_schema(table_schema, list(table.primary_key))
        columns = _columns_option(self.options) or table_schema.names
        return from_arrow_schema(pa.schema([_plain(table_schema.field(c)) for c in columns]))

    def writer(self, schema: StructType, overwrite: bool) -> LsmBatchWriter:
        """``df.write.format("lance_lsm").mode("append").save(uri)`` (see :mod:`resources.lsm.spark.writer`)."""
        return LsmBatchWriter(write_options(self.options, schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> LsmStreamWriter:
        """``df.writeStream.format("lance_lsm")...start(uri)`` (see :mod:`resources.lsm.spark.writer`)."""
        return LsmStreamWriter(write_options(self.options, schema, overwrite))

    def reader(self, schema: StructType) -> DataSourceReader:
        storage_options = storage_options_of(self.options)
        since, until = _version_option(self.options, "changes_since"), _version_option(self.options, "changes_until")
        if since is not None:
            return ChangesReader(self._uri, schema, since, until, storage_options)
        fresh = str(self.options.get("fresh", "true")).lower() != "false"
        return LsmReader(self._uri, schema, fresh, storage_options, _version_option(self.options, "as_of"))

    @property
    def _uri(self) -> str:
        uri = self.options.get("path")
        if not uri:
            raise ValueError('lance_lsm needs a table URI: spark.read.format("lance_lsm").load(uri)')
        return uri


class LsmReader(DataSourceReader):
    """Reads the merged view; see the module docstring for partitioning and pushdown."""

    def __init__(
        self,
        uri: str,
        schema: StructType,
        fresh: bool,
        storage_options: StorageOptions | None = None,
        as_of: TableVersion | None = None,
    ) -> None:
        table = TableHandle.open(uri, storage_options)
        self.uri = table.uri
        self.storage_options = table.storage_options
        self.cache_scope = table.cache_scope
        self.primary_key = list(table.primary_key)
        self.as_of = as_of
        self.table_schema = table.dataset_at(as_of).schema if as_of else table.schema
        self.columns = schema.fieldNames()
        self.output_schema = to_arrow_schema(schema, timezone="UTC")
        self.fresh = fresh
        self.filters: list[Filter] = []

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        """Keep the filters :func:`filter_expression` can express; return the others to Spark."""
        for f in filters:
            if _expression(f, self.table_schema) is None:
                yield f
            else:
                self.filters.append(f)

    def partitions(self) -> Sequence[ShardRangePartition]:
        """Pin the snapshot and split it into one partition per shard range."""
        table = TableHandle.open(self.uri, self.storage_options)
        if self.as_of is None:
            dataset = table.dataset_to_read()  # the version just opened, unless a commit came since
            states = table.shard_states(dataset, for_read=True)
        else:
            dataset = table.dataset_at(self.as_of)
            states = table.shard_states_at(self.as_of, dataset)
        pins = tuple(self._pin(state) for state in states)
        slices = _balanced_slices(dataset, len(pins))
        return [ShardRangePartition(i, dataset.version, slices[i], pins) for i in range(len(pins))]

    def _pin(self, state: ShardState) -> ShardPin:
        return ShardPin(state, self.fresh and state.unflushed_wal_entries > 0)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The partition's rows of the merged view, as batches of the declared schema."""
        partition = cast(ShardRangePartition, partition)  # one of :meth:`partitions`
        storage = TableStorage(self.uri, self.storage_options)
        dataset = lance.dataset(self.uri, version=partition.base_version, storage_options=self.storage_options)
        runs = PendingRuns(storage, self.cache_scope)
        levels = [
            resolve_levels(self._snapshot(dataset, storage, runs, pin), self.table_schema.names)
            for pin in partition.shards
        ]
        where = filter_expression(self.filters, self.table_schema)
        wanted = self.columns + [k for k in self.primary_key if k not in self.columns]
        if partition.fragment_ids:
            # Ids of the pinned version's own fragments: none is missing.
            fragments = cast("list[lance.LanceFragment]", [dataset.get_fragment(f) for f in partition.fragment_ids])
            batches = base_batches(dataset, wanted, where, fragments)
            superseded = BaseRowFilter(storage, dataset, levels, self.primary_key, batches.schema, fragments)
            for base in superseded.stream(batches):
                if base.num_rows:
                    yield from self._output(pa.Table.from_batches([base]))
        live = live_rows(levels[partition.index].changes)
        yield from self._output(live.filter(where) if where is not None else live)

    def _snapshot(
        self, dataset: lance.LanceDataset, storage: TableStorage, runs: PendingRuns, pin: ShardPin
    ) -> ReadSnapshot:
        """What this partition reads of one shard: its pending generations (through its stored run) and tail."""
        state = pin.state
        tail = (
            read_wal_tail(
                storage,
                state.shard_id,
                state.wal_entries,
                self.table_schema,
                self.primary_key,
            )
            if pin.reads_tail
            else empty_tail(self.table_schema)
        )
        return ReadSnapshot(dataset, (state,), tail, tuple(self.primary_key), storage, runs=runs)

    def _output(self, rows: pa.Table) -> Iterator[pa.RecordBatch]:
        yield from rows.select(self.columns).cast(self.output_schema).to_batches()


class ChangesReader(DataSourceReader):
    """Reads the change feed from ``since`` to ``until`` (default: the version when the read is planned)."""

    def __init__(
        self,
        uri: str,
        schema: StructType,
        since: TableVersion,
        until: TableVersion | None,
        storage_options: StorageOptions | None = None,
    ) -> None:
        self.uri, self.storage_options = absolute_uri(uri), storage_options  # tasks may run in another directory
        self.since, self.until = since, until
        self.columns = schema.fieldNames()
        self.output_schema = to_arrow_schema(schema, timezone="UTC")

    def partitions(self) -> Sequence[ChangesPartition]:
        until = self.until or TableHandle.open(self.uri, self.storage_options).version()
        return [ChangesPartition(str(self.since), str(until))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from ..read.change_feed import changes

        partition = cast(ChangesPartition, partition)
        table = TableHandle.open(self.uri, self.storage_options)
        feed = changes(table, TableVersion.parse(partition.since), TableVersion.parse(partition.until))
        for batch in feed:
            yield pa.RecordBatch.from_arrays(batch.select(self.columns).columns, schema=self.output_schema)


def filter_expression(filters: Sequence[Filter], schema: pa.Schema) -> pc.Expression | None:
    """The AND of ``filters`` as a pyarrow expression (``None`` for no filters).

    Raises
    ------
    ValueError
        If a filter is not expressible (:meth:`LsmReader.pushFilters` never keeps one).
    """
    expressions = [_expression(f, schema) for f in filters]
    if any(e is None for e in expressions):
        raise ValueError(f"unsupported filter among {filters}")
    return reduce(operator.and_, expressions) if expressions else None


_COMPARISONS = {
    EqualTo: operator.eq,
    EqualNullSafe: operator.eq,
    GreaterThan: operator.gt,
    GreaterThanOrEqual: operator.ge,
    LessThan: operator.lt,
    LessThanOrEqual: operator.le,
}
_Comparison: TypeAlias = EqualTo | EqualNullSafe | GreaterThan | GreaterThanOrEqual | LessThan | LessThanOrEqual
_StringMatch: TypeAlias = StringStartsWith | StringEndsWith | StringContains
_STRING_MATCHES = {StringStartsWith: pc.starts_with, StringEndsWith: pc.ends_with, StringContains: pc.match_substring}


def _expression(f: Filter, schema: pa.Schema) -> pc.Expression | None:
    """``f`` as a pyarrow expression, or ``None`` when it is not pushed."""
    if isinstance(f, Not):
        child = _expression(f.child, schema)
        return None if child is None else ~child
    column = _top_level_column(f, schema)
    if column is None:
        return None
    field = pc.field(column)
    if isinstance(f, EqualNullSafe) and f.value is None:
        return field.is_null()
    if type(f) in _COMPARISONS and (value := cast(_Comparison, f).value) is not None:
        return _COMPARISONS[type(f)](field, pc.scalar(value))
    if isinstance(f, In):
        return field.isin([v for v in f.value if v is not None])
    if isinstance(f, IsNull):
        return field.is_null()
    if isinstance(f, IsNotNull):
        return field.is_valid()
    if type(f) in _STRING_MATCHES:
        return _STRING_MATCHES[type(f)](field, cast(_StringMatch, f).value)
    return None


def _top_level_column(f: Filter, schema: pa.Schema) -> str | None:
    """The filtered column when it is a top-level scalar column of ``schema``."""
    path: Any = getattr(f, "attribute", None)
    if not path or len(path) != 1 or path[0] not in schema.names:
        return None
    column_type = schema.field(path[0]).type
    return None if pa.types.is_nested(column_type) else path[0]


def _balanced_slices(dataset: lance.LanceDataset, parts: int) -> list[tuple[int, ...]]:
    """Fragment ids split into ``parts`` slices of similar row counts (largest first, greedy)."""
    fragments = sorted(dataset.get_fragments(), key=lambda f: f.count_rows(), reverse=True)
    slices: list[list[int]] = [[] for _ in range(parts)]
    rows = [0] * parts
    for fragment in fragments:
        lightest = rows.index(min(rows))
        slices[lightest].append(fragment.fragment_id)
        rows[lightest] += fragment.count_rows()
    return [tuple(sorted(s)) for s in slices]


def _version_option(options: Mapping[str, str], name: str) -> TableVersion | None:
    """Option ``name`` as a table version (``None`` when not given)."""
    text = str(options.get(name) or "").strip()
    return TableVersion.parse(text) if text else None


def _columns_option(options: Mapping[str, str]) -> list[str]:
    return [c.strip() for c in str(options.get("columns", "")).split(",") if c.strip()]


def _plain(field: pa.Field) -> pa.Field:
    """A field as Spark declares it: nullable, no Lance metadata, vectors as plain lists."""
    field_type = field.type
    if pa.types.is_fixed_size_list(field_type):
        field_type = pa.list_(field_type.value_type)
    return pa.field(field.name, field_type, nullable=field.nullable)
