"""Route change rows to shards with Lance's own bucket hash.

Lance's bucket sharding computes a bucket number per row
(``evaluate_sharding_spec``) but leaves the bucket → shard-UUID association
to the caller: a ``ShardWriter`` accepts any UUID and no manifest records the
bucket. We derive the UUIDs with LanceDB's scheme (uuid5 of ``bucket-<b>`` in
its "LSMWRITE_SHARD01" namespace), so shards line up with LanceDB's, and record
the list in the table's config at creation, so every process discovers the
mapping from the table itself.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from lance import mem_wal

if TYPE_CHECKING:
    from lance.schema import LanceSchema

# ASCII "LSMWRITE_SHARD01", the namespace LanceDB uses for bucket shards.
_SHARD_NAMESPACE = uuid.UUID("4c534d57-5249-5445-5f53-484152443031")


def shard_ids_for(num_shards: int) -> list[str]:
    """The shard UUID of every bucket, indexed by bucket number."""
    return [str(uuid.uuid5(_SHARD_NAMESPACE, f"bucket-{b}")) for b in range(num_shards)]


@dataclass(frozen=True)
class ShardRouter:
    """Maps rows to buckets (Lance's hash) and buckets to shard UUIDs."""

    sharding_spec: dict[str, Any]
    lance_schema: LanceSchema
    shard_ids: tuple[str, ...]

    def buckets(self, table: pa.Table) -> np.ndarray:
        """The bucket of every row of ``table`` (int32), in row order.

        ``table`` must contain the bucket column; other columns are ignored.
        """
        parts = [
            mem_wal.evaluate_sharding_spec(batch, self.sharding_spec, self.lance_schema).column(0)
            for batch in table.combine_chunks().to_batches()
        ]
        if not parts:
            return np.empty(0, dtype=np.int32)
        return np.concatenate([p.to_numpy(zero_copy_only=False) for p in parts]).astype(np.int32)

    def split(self, table: pa.Table) -> dict[str, pa.Table]:
        """Partition ``table`` by shard UUID; shards with no rows are omitted."""
        if table.num_rows == 0:
            return {}
        buckets = self.buckets(table)
        return {self.shard_ids[int(b)]: table.filter(pa.array(buckets == b)) for b in np.unique(buckets)}
