"""The LSM engine: plain Python over pylance's MemWAL and pyarrow (no Dagster).

Public contract (see DESIGN.md)::

    from resources.lsm import LsmTable
    t = LsmTable.create(uri, schema, primary_key=["id"], num_shards=4)
    t.write(changes); t.read(); t.lookup(keys); t.count(); t.shards(); t.flush()
    t.compact(); t.gc()
"""

from .changes import InvalidChangesError, Rejection
from .compaction import BaseMaintenance, CompactionResult, MaintenancePolicy, ShardCompaction
from .gc import GcResult, Reclaimed
from .shard_state import ShardState
from .table import LsmTable, TableNotFoundError, WriteResult, WriterFencedError

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
    "WriteResult",
    "WriterFencedError",
]
