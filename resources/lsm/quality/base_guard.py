"""Merge guard on the base table's keys, scoped to what changed since the last merge.

A merge keeps the base's keys unique by construction: ``merge_insert`` on the
key with a source that holds each key once. The base can gain a duplicate or
a null key only from a commit that is not a merge, such as a plain Lance
append. :func:`verify_appended_keys` therefore reads the base's transactions
back from the latest version to the last merge (or the table's creation),
and checks only the rows those commits appended:

* every key column of the base is declared non-nullable (Lance then refuses
  null keys in every commit), and the appended rows hold no null key;
* no appended key occurs twice in the base: the appended keys are probed
  through the key index (an ``IN`` predicate), so the cost follows the
  appended rows, not the base.

Appends larger than ``max_rows`` are not probed here (that would cost a scan
of the base); they are reported as unchecked and left to the full
``base_primary_key_unique`` check of ``quality_job`` (streamed, or Spark).
Earlier appends were checked by the guard of the merge that followed them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import lance
import pyarrow as pa

from ..maintenance.compaction import key_in_predicate
from ..read.deletion_vector import fragment_ids

if TYPE_CHECKING:
    from ..handle import TableHandle

DEFAULT_MAX_APPENDED_ROWS = 1_000_000
"""Appended rows the guard probes at most (beyond: reported as unchecked)."""

_SAMPLE = 20


@dataclass(frozen=True)
class AppendedKeys:
    """What :func:`verify_appended_keys` found.

    Attributes
    ----------
    versions
        Base versions read back (the latest first), down to the last merge.
    rows_checked
        Appended rows whose keys were probed.
    rows_unchecked
        Appended rows beyond ``max_rows``, left to ``quality_job``.
    nullable_key_columns, null_keys
        Key columns the base declares nullable; appended rows with a null key.
    duplicate_keys
        How many appended keys occur more than once in the base, and a sample of them.
    """

    versions: int
    rows_checked: int
    rows_unchecked: int
    nullable_key_columns: tuple[str, ...]
    null_keys: int
    duplicate_keys: int
    duplicate_sample: tuple[tuple[object, ...], ...]

    @property
    def keys_unique(self) -> bool:
        return self.duplicate_keys == 0

    @property
    def keys_not_null(self) -> bool:
        return not self.nullable_key_columns and self.null_keys == 0


def verify_appended_keys(table: TableHandle, max_rows: int = DEFAULT_MAX_APPENDED_ROWS) -> AppendedKeys:
    """Check the keys of the rows appended to the base since the last merge.

    Reads the transactions and the appended rows' key columns only; the base
    is probed through its key index for those keys.
    """
    base = table.dataset()
    key = list(table.primary_key)
    versions, fragments = _appended_fragments(base)
    appended = sum(f.count_rows() for f in fragments)
    nullable = tuple(k for k in key if base.schema.field(k).nullable)
    if not fragments or appended > max_rows:
        return AppendedKeys(versions, 0, appended, nullable, 0, 0, ())
    keys = pa.concat_tables([f.to_table(columns=key) for f in fragments])
    null_keys = keys.num_rows - keys.drop_null().num_rows
    found = base.to_table(
        columns=key, filter=key_in_predicate(keys.drop_null().group_by(key).aggregate([]), base.schema)
    )
    counts = found.group_by(key).aggregate([([], "count_all")])
    duplicates = counts.filter(pa.compute.greater(counts["count_all"], 1)).select(key)
    sample = tuple(tuple(row.values()) for row in duplicates.slice(0, _SAMPLE).to_pylist())
    return AppendedKeys(versions, keys.num_rows, 0, nullable, null_keys, duplicates.num_rows, sample)


def _appended_fragments(base: lance.LanceDataset) -> tuple[int, list[lance.LanceFragment]]:
    """Versions read back to the last merge, and the fragments holding rows appended since it.

    Walks forward from the last merge over each version's fragment ids: an
    append's new fragments are tracked, and so are the fragments that replace
    a tracked one (``compact_files`` rewriting appended rows), whatever the
    commit's kind. pylance 14.0.2 cannot decode some transactions (a rewrite
    that remaps indexes raises ``TypeError``); such a commit appends nothing,
    so it is read as "not an append", and the fragment ids still follow it.
    """
    since_merge = _operations_since_merge(base)
    merge = base.version - len(since_merge)
    tracked: set[int] = set()
    before = fragment_ids(base.checkout_version(merge))
    for version, operation in enumerate(since_merge, start=merge + 1):
        after = fragment_ids(base.checkout_version(version))
        added = after - before
        if isinstance(operation, lance.LanceOperation.Append) or (before - after) & tracked:
            tracked |= added
        tracked &= after
        before = after
    return len(since_merge) + 1, [f for f in base.get_fragments() if f.fragment_id in tracked]


def _operations_since_merge(base: lance.LanceDataset) -> list[object | None]:
    """The operations of the versions after the newest merge (or the table's creation), oldest first.

    What came before that merge was guarded by it. ``None`` stands for a
    version without a transaction, or one pylance 14.0.2 cannot decode (a
    rewrite that remaps indexes raises ``TypeError``). The walk also stops
    after the oldest version garbage collection kept: older ones can no
    longer be read, so rows appended before it are out of reach.
    """
    retained = {v["version"] for v in base.versions()}
    operations: list[object | None] = []
    for version in range(base.version, 1, -1):
        if version - 1 not in retained:
            break
        try:
            transaction = base.read_transaction(version)
        except TypeError:
            transaction = None
        operation = transaction.operation if transaction else None
        if isinstance(operation, (lance.LanceOperation.Update, lance.LanceOperation.Overwrite)):
            break
        operations.append(operation)
    return operations[::-1]
