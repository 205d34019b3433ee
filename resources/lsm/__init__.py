"""The LSM engine: plain Python over pylance's MemWAL and pyarrow (no Dagster).

Public contract (see DESIGN.md)::

    from resources.lsm import LsmTable
    t = LsmTable.create(uri, schema, primary_key=["id"], num_shards=4)
    t.write(changes); t.read(); t.lookup(keys); t.count(); t.shards(); t.flush()
    t.compact(); t.gc(); t.search(vector, k)

    from resources.lsm import register_spark_source   # imports PySpark
    register_spark_source(spark); spark.read.format("lance_lsm").load(uri)
"""

from .changes import InvalidChangesError, Rejection
from .compaction import BaseMaintenance, CompactionResult, MaintenancePolicy, ShardCompaction
from .gc import GcResult, Reclaimed
from .shard_state import ShardState
from .table import LsmTable, TableNotFoundError, WriteResult, WriterFencedError
from .vector_search import VectorIndex, train_vector_index

__all__ = [
    "BaseMaintenance",
    "CompactionResult",
    "GcResult",
    "InvalidChangesError",
    "LsmTable",
    "MaintenancePolicy",
    "Rejection",
    "Reclaimed",
    "ShardCompaction",
    "ShardState",
    "TableNotFoundError",
    "VectorIndex",
    "WriteResult",
    "WriterFencedError",
    "train_vector_index",
    "register_spark_source",
]


def __getattr__(name: str):
    # Imported on first use: the Spark source pulls in PySpark, which plain
    # engine users (and Spark executors running ingestion) do not need.
    if name == "register_spark_source":
        from .spark_source import register_spark_source

        return register_spark_source
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
