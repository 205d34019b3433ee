"""The LSM engine: plain Python over pylance's MemWAL and pyarrow (no Dagster).

Public contract::

    from resources.lsm import LsmTable
    t = LsmTable.create(uri, schema, primary_key=["id"], num_shards=4)
    t.write(changes); t.read(); t.lookup(keys); t.count(); t.shards(); t.flush()
    t.compact(); t.gc(); t.search(vector, k)

    from resources.lsm import register_spark_source   # imports PySpark
    register_spark_source(spark); spark.read.format("lance_lsm").load(uri)

Subpackages, bottom up (see docs/architecture.md): ``format`` (on-disk
layout: storage, manifests, markers, WAL entries, routing), ``read`` (the
merged view), ``write`` (change validation and resolution), ``maintenance``
(compaction, GC, backpressure), ``ingest`` (landing files and the ledger),
``spark`` (Spark ingestion and the ``lance_lsm`` source), ``quality``
(recovery checks and drills), ``testing`` (the change-stream generator);
``table.py`` is the façade over them.

Names are imported on first use, so ``import resources.lsm`` stays cheap
(Dagster's definitions import it without loading Lance, Arrow or Spark).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "BaseMaintenance": ".maintenance.compaction",
    "CompactionResult": ".maintenance.compaction",
    "MaintenancePolicy": ".maintenance.compaction",
    "ShardCompaction": ".maintenance.compaction",
    "GcResult": ".maintenance.gc",
    "Reclaimed": ".maintenance.gc",
    "InvalidChangesError": ".errors",
    "Rejection": ".errors",
    "TableNotFoundError": ".errors",
    "WriterFencedError": ".errors",
    "LsmTable": ".table",
    "WriteResult": ".table",
    "ShardState": ".format.shard_state",
    "VectorIndex": ".read.vector_search",
    "train_vector_index": ".read.vector_search",
    "register_spark_source": ".spark.source",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from .errors import InvalidChangesError, Rejection, TableNotFoundError, WriterFencedError
    from .format.shard_state import ShardState
    from .maintenance.compaction import BaseMaintenance, CompactionResult, MaintenancePolicy, ShardCompaction
    from .maintenance.gc import GcResult, Reclaimed
    from .read.vector_search import VectorIndex, train_vector_index
    from .spark.source import register_spark_source
    from .table import LsmTable, WriteResult


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value
