"""Vector search over the merged view: base table, pending generations and WAL tail.

Indexes are declared when the table is created (:func:`create_search_indexes`):
an IVF-PQ index on the vector column and, optionally, a full-text (inverted)
index on a text column. MemWAL keeps declared indexes up to date in every
flushed generation, and merging into the base runs ``optimize_indices``. An
IVF-PQ index declared on an empty table has nothing to learn its centroids
and codebooks from, so once the base holds data :func:`train_vector_index`
rebuilds it with the declared parameters (and again whenever the data has
drifted).

Full-text search is base-table only: pylance 14.0.2 has MemWAL planners for
point lookups, scans and vector search but none for text, and ``LsmScanner``
filters reject Lance's ``contains_tokens``. ``dataset().to_table(
full_text_query=...)`` ranks merged rows only: it misses rows still in
generations or the WAL, and may return rows a newer level updated or deleted.
A merged (unindexed, unranked) text filter is ``read(filter="col LIKE '%word%'")``.

:func:`search` levels, oldest to newest::

    base table  <  generations above the compacted markers  <  WAL tail

``LsmVectorSearchPlanner`` searches the first two and returns only the newest
version of each key (older versions and tombstoned keys are dropped). The WAL
tail has no index: its live rows are scored brute force (an exact flat search)
and every key it mentions hides the planner's candidate for that key.
Candidates are over-fetched ``refine_factor`` times with exact re-ranking, so
PQ's approximate distances cost little recall.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import lance
import numpy as np
import pyarrow as pa
from lance.mem_wal import LsmVectorSearchPlanner

from ..format.schema import live_rows, without_internal_columns
from .key_sets import key_join
from .merged_read import ReadSnapshot

CONFIG_VECTOR_INDEX = "lsm.vector_index"
CONFIG_FTS_COLUMN = "lsm.fts_column"
DISTANCE = "_distance"
METRICS = ("l2", "cosine", "dot")


@dataclass(frozen=True)
class VectorIndex:
    """An IVF-PQ index on a ``FixedSizeList<float32>`` column.

    ``num_partitions`` IVF cells are trained by k-means and ``num_sub_vectors``
    (a divisor of the dimension) PQ codebooks of 256 codes each: training wants
    a few thousand rows at least (about 40 per cell, 256 per codebook).
    """

    column: str
    num_partitions: int = 16
    num_sub_vectors: int = 8
    metric: str = "l2"

    def validate(self, schema: pa.Schema) -> None:
        """Raise ``ValueError`` unless the column is a float32 vector the parameters fit."""
        if self.column not in schema.names:
            raise ValueError(f"vector column {self.column!r} is not in the schema {schema.names}")
        column_type = schema.field(self.column).type
        if not (pa.types.is_fixed_size_list(column_type) and column_type.value_type == pa.float32()):
            raise ValueError(f"vector column {self.column!r} must be fixed_size_list<float32>, got {column_type}")
        if column_type.list_size % self.num_sub_vectors:
            raise ValueError(
                f"num_sub_vectors {self.num_sub_vectors} must divide the dimension {column_type.list_size}"
            )
        if self.metric not in METRICS or self.num_partitions < 1:
            raise ValueError(f"need metric in {METRICS} and num_partitions >= 1, got {self}")

    def build(self, dataset: lance.LanceDataset, replace: bool = False) -> None:
        dataset.create_index(
            self.column,
            "IVF_PQ",
            metric=self.metric,
            num_partitions=self.num_partitions,
            num_sub_vectors=self.num_sub_vectors,
            replace=replace,
        )


def validate_search_indexes(schema: pa.Schema, vector_index: VectorIndex | None, fts_column: str | None) -> None:
    """Check requested indexes against the schema before anything is created.

    Raises
    ------
    ValueError
        For a vector column that is not ``fixed_size_list<float32>``, parameters
        that do not fit it, or a full-text column that is not a string column.
    """
    if vector_index is not None:
        vector_index.validate(schema)
    if fts_column is not None and (
        fts_column not in schema.names or not pa.types.is_string(schema.field(fts_column).type)
    ):
        raise ValueError(f"full-text column {fts_column!r} must be a string column of the schema")


def create_search_indexes(
    dataset: lance.LanceDataset, vector_index: VectorIndex | None, fts_column: str | None
) -> dict[str, str]:
    """Create validated indexes on a new (empty) base table.

    Call before MemWAL is initialized, which then maintains them in every
    flushed generation. ``fts_column`` gets an ``INVERTED`` index (Lance's
    default tokenizer) named ``<column>_idx``. Returns the table-config
    entries that record them, for :func:`search` and :func:`train_vector_index`.
    """
    config = {}
    if vector_index is not None:
        vector_index.build(dataset)
        config[CONFIG_VECTOR_INDEX] = json.dumps(asdict(vector_index))
    if fts_column is not None:
        dataset.create_scalar_index(fts_column, "INVERTED")
        config[CONFIG_FTS_COLUMN] = fts_column
    return config


def vector_index_of(dataset: lance.LanceDataset) -> VectorIndex:
    """The vector index the table was created with.

    Raises
    ------
    ValueError
        If the table was created without ``vector_index``.
    """
    recorded = dataset.config().get(CONFIG_VECTOR_INDEX)
    if recorded is None:
        raise ValueError(f"{dataset.uri} has no vector index (create the table with vector_index=...)")
    return VectorIndex(**json.loads(recorded))


def train_vector_index(dataset: lance.LanceDataset, min_rows: int = 1_000) -> bool:
    """Rebuild the declared IVF-PQ index from the base table's rows; return whether it did.

    Nothing happens while the base holds fewer than ``min_rows`` rows. Reads
    are unaffected: the rebuild is one commit, and generations keep their own
    index.
    """
    if dataset.count_rows() < min_rows:
        return False
    vector_index_of(dataset).build(dataset, replace=True)
    return True


def search(
    snapshot: ReadSnapshot,
    vector: Sequence[float] | np.ndarray,
    k: int,
    filter: str | None = None,
    columns: list[str] | None = None,
    nprobes: int = 20,
    refine_factor: int = 5,
) -> pa.Table:
    """The ``k`` nearest live rows of the merged view, nearest first.

    Returns ``columns`` (default: all) plus ``_distance``; each key at most
    once, with its newest version. ``filter`` (Lance SQL) selects rows before
    ranking. Distances of indexed levels are exact after re-ranking; recall
    depends on ``nprobes`` and ``refine_factor`` (candidates per level =
    ``k * refine_factor``).

    Raises
    ------
    ValueError
        If ``k < 1``, the table has no vector index, or the vector's length
        differs from the column's dimension.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    index = vector_index_of(snapshot.dataset)
    query = np.asarray(vector, dtype=np.float32).ravel()
    dimension = snapshot.dataset.schema.field(index.column).type.list_size
    if query.size != dimension:
        raise ValueError(f"query has {query.size} values; {index.column!r} has dimension {dimension}")
    key = list(snapshot.primary_key)
    columns = columns or snapshot.dataset.schema.names
    wanted = columns + [c for c in key if c not in columns]
    older = _indexed_levels(snapshot, index, query, k * refine_factor, wanted, filter, nprobes)
    newer = _tail_levels(snapshot.tail, index, query, k, wanted, filter)
    nearest = pa.concat_tables([older, newer.cast(older.schema)]).sort_by(DISTANCE).slice(0, k)
    return nearest.select([*columns, DISTANCE])


def _indexed_levels(
    snapshot: ReadSnapshot,
    index: VectorIndex,
    query: np.ndarray,
    fetch: int,
    wanted: list[str],
    filter: str | None,
    nprobes: int,
) -> pa.Table:
    """Planner candidates from base and generations, without keys the WAL tail overrides.

    If hiding tail keys leaves fewer than ``fetch`` candidates while the planner
    had more, plan once more with room for every tail key: hiding can then
    remove at most that many, so the top ``fetch`` survivors are complete.
    """
    key = list(snapshot.primary_key)
    planner = LsmVectorSearchPlanner(
        snapshot.dataset, snapshot.shard_snapshots(), index.column, key, distance_type=index.metric, filter=filter
    )

    def candidates(n: int) -> tuple[int, pa.Table]:
        found = planner.plan_search(
            pa.array(query),
            k=n,
            nprobes=nprobes,
            columns=[*wanted, DISTANCE],
            refine_base_table=True,
            overfetch_factor=2.0,
        ).to_table()
        found = without_internal_columns(found).select([*wanted, DISTANCE])
        return found.num_rows, key_join(found, snapshot.tail, key, "left anti")

    returned, visible = candidates(fetch)
    if visible.num_rows < returned == fetch:
        returned, visible = candidates(fetch + snapshot.tail.num_rows)
    return visible


def _tail_levels(
    tail: pa.Table, index: VectorIndex, query: np.ndarray, k: int, wanted: list[str], filter: str | None
) -> pa.Table:
    """The ``k`` nearest live WAL-tail rows matching ``filter``, by exact flat search.

    Lance itself scores and filters them, so the SQL dialect and the distance
    definition are the same as the indexed levels'.
    """
    live = live_rows(tail)
    if live.num_rows == 0:
        return live.select(wanted).append_column(DISTANCE, pa.array([], pa.float32()))
    with tempfile.TemporaryDirectory(prefix="lsm-tail-") as tmp:
        nearest = {"column": index.column, "q": query, "k": k, "metric": index.metric}
        return (
            lance.write_dataset(live, tmp)
            .to_table(columns=[*wanted, DISTANCE], nearest=nearest, filter=filter, prefilter=True)
            .select([*wanted, DISTANCE])
        )
