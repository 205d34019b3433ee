"""Merge claims: the generations a base data commit merged, until the marker catches up.

pylance 14.0.2 moves the MemWAL compacted marker only in a ``merge_insert``
commit, so a merge that commits its data any other way (deletion files and
new fragments in one ``Update``, see :mod:`resources.lsm.maintenance.compaction`)
records the generations it covers in that commit's transaction properties,
``{CLAIM_PROPERTY: '{"<shard uuid>": <generation>, ...}'}``, and moves the
marker in a second, data-free commit.

Between the two commits the base holds the generations' rows while the
marker still lists them as pending. Every reader therefore takes a shard's
*merged-through* generation as the newer of the marker and the claim of the
newest data commit at or below its pinned version (:func:`merged_through`).

Finding that claim reads transactions back from the pinned version and
stops at the first one that is a data commit (its claim) or any other
``Update`` (a ``merge_insert``, which moves the marker; a merge moves it for
an earlier claim before it commits anything else, so nothing older is
outstanding). Maintenance commits in between (index and file upkeep) are
passed over.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import lance

from ..lru_cache import LruCache

CLAIM_PROPERTY = "lsm.merged_through"


def claim_properties(generations: Mapping[str, int]) -> dict[str, str]:
    """The transaction properties of a data commit that merges each shard through ``generations[shard]``."""
    return {CLAIM_PROPERTY: json.dumps(dict(generations), sort_keys=True)}


def read_claims(dataset: lance.LanceDataset, version: int) -> dict[str, int]:
    """The generations a data commit at or below ``version`` claims and no marker commit has settled yet.

    ``dataset`` is any version of the table (transactions are read by
    number). Empty when the walk meets a marker move, a version without a
    transaction record, or one that was cleaned up (garbage collection
    settles claims before it removes versions).
    """
    for number in range(version, 0, -1):
        try:
            transaction = dataset.read_transaction(number)
        except (OSError, ValueError):
            return {}
        except TypeError:
            continue  # pylance 14.0.2 cannot decode a file compaction that rewrote indexes: upkeep, not a merge
        if transaction is None:
            return {}
        claim = (transaction.transaction_properties or {}).get(CLAIM_PROPERTY)
        if claim is not None:
            return {shard: int(generation) for shard, generation in json.loads(claim).items()}
        if isinstance(transaction.operation, lance.LanceOperation.Update):
            return {}
    return {}


CLAIMS: LruCache[tuple[str, int, int], dict[str, int]] = LruCache(max_entries=1024)
"""The claims of base versions this process has read, shared by every handle (they never change).

Keyed by table location, version and a checksum of that version's manifest,
so a table deleted and created again at the same location never meets its
predecessor's claims. Spares each newly opened table the transaction walk (a
few ms: one read per version walked)."""


def merged_through(markers: Mapping[str, int], claims: Mapping[str, int]) -> dict[str, int]:
    """Per shard, the newer of its compacted marker and its claim (shards with neither are absent)."""
    merged = dict(markers)
    for shard, generation in claims.items():
        merged[shard] = max(merged.get(shard, 0), generation)
    return merged


def unsettled(markers: Mapping[str, int], claims: Mapping[str, int]) -> dict[str, int]:
    """The claims the marker has not caught up with yet."""
    return {shard: generation for shard, generation in claims.items() if generation > markers.get(shard, 0)}
