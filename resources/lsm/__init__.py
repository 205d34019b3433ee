"""The LSM engine: plain Python over pylance's MemWAL and pyarrow (no Dagster).

Public contract::

    from resources.lsm import LsmTable
    t = LsmTable.create(uri, schema, primary_key=["id"], num_shards=4)
    t.write(changes); t.read(); t.lookup(keys); t.count(); t.shards(); t.flush()
    t.compact(); t.gc(); t.search(vector, k)
    v = t.version(); t.read(as_of=v); t.lookup(keys, as_of=v); t.changes(since=v)

    from resources.lsm import register_spark_source   # imports PySpark
    register_spark_source(spark); spark.read.format("lance_lsm").load(uri)
    df.write.format("lance_lsm").mode("append").save(uri)   # and df.writeStream: spark/writer.py

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
    "StorageUnavailableError": ".errors",
    "TableNotFoundError": ".errors",
    "VersionNotRetainedError": ".errors",
    "WriterFencedError": ".errors",
    "LsmTable": ".table",
    "WriteResult": ".table",
    "ShardState": ".format.shard_state",
    "TableVersion": ".format.version",
    "VectorIndex": ".read.vector_search",
    "train_vector_index": ".read.vector_search",
    "register_spark_source": ".spark.source",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # `X as X`: explicit re-exports for type checkers (`__all__` is computed)
    from .errors import (
        InvalidChangesError as InvalidChangesError,
        Rejection as Rejection,
        StorageUnavailableError as StorageUnavailableError,
        TableNotFoundError as TableNotFoundError,
        VersionNotRetainedError as VersionNotRetainedError,
        WriterFencedError as WriterFencedError,
    )
    from .format.shard_state import ShardState as ShardState
    from .format.version import TableVersion as TableVersion
    from .maintenance.compaction import (
        BaseMaintenance as BaseMaintenance,
        CompactionResult as CompactionResult,
        MaintenancePolicy as MaintenancePolicy,
        ShardCompaction as ShardCompaction,
    )
    from .maintenance.gc import GcResult as GcResult, Reclaimed as Reclaimed
    from .read.vector_search import VectorIndex as VectorIndex, train_vector_index as train_vector_index
    from .spark.source import register_spark_source as register_spark_source
    from .table import LsmTable as LsmTable, WriteResult as WriteResult


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value
