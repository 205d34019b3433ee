"""Row-count reconciliation: the merged view changes by exactly what was applied.

Around each step of the write path the number of rows in the merged view
must change by ``inserted - deleted``: keys a change batch upserts that were
not live before, minus keys it deletes that were live. A flush and a merge
apply nothing new, so the view must not change at all. A difference means a
lost write, a resurrected delete or a duplicated key.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..table import LsmTable
from ..write.changes import resolve_changes, validate_changes
from .scratch import key_pool, live_keys, synthetic_changes


@dataclass(frozen=True)
class StepReconciliation:
    """Rows of the merged view before and after one step, against the expected change."""

    step: str
    rows_before: int
    rows_after: int
    inserted: int
    deleted: int

    @property
    def expected_change(self) -> int:
        return self.inserted - self.deleted

    @property
    def actual_change(self) -> int:
        return self.rows_after - self.rows_before

    @property
    def passed(self) -> bool:
        return self.actual_change == self.expected_change


def expected_change(table: LsmTable, live: pa.Table, changes: pa.Table) -> tuple[int, int]:
    """``(inserted, deleted)``: keys ``changes`` would add to and remove from the ``live`` keys.

    Changes are resolved as :meth:`LsmTable.write` resolves them (newest per
    key); deleting a key that is not live removes nothing.
    """
    key = list(table.primary_key)
    resolved = resolve_changes(validate_changes(changes, table.schema, key).valid, table.schema, key)
    upserted = resolved.upserts.select(key)
    if live.num_rows == 0:
        return upserted.num_rows, 0
    inserted = upserted.join(live, keys=key, join_type="left anti").num_rows
    deleted = resolved.deletes.join(live, keys=key, join_type="left semi").num_rows
    return inserted, deleted


def reconcile_write_flush_merge(table: LsmTable, changes: pa.Table) -> list[StepReconciliation]:
    """Write ``changes``, flush, merge; reconcile the merged view around each step.

    Mutates ``table``: run it on a scratch copy.
    """
    before = live_keys(table)
    inserted, deleted = expected_change(table, before, changes)
    table.write(changes)
    after_write = table.count()
    steps = [StepReconciliation("ingest", before.num_rows, after_write, inserted, deleted)]
    table.flush()
    after_flush = table.count()
    steps.append(StepReconciliation("flush", after_write, after_flush, 0, 0))
    table.compact()
    steps.append(StepReconciliation("merge", after_flush, table.count(), 0, 0))
    return steps


def probe_reconciliation(
    table: LsmTable, rows: int = 500, delete_ratio: float = 0.3, seed: int = 0
) -> list[StepReconciliation]:
    """Reconcile a generated batch of ``rows`` changes (half on existing keys) on ``table``.

    Mutates ``table``: run it on a scratch copy.
    """
    rng = np.random.default_rng(seed)
    keys = key_pool(table, live_keys(table), rows - rows // 2, rng, max_existing=rows // 2)
    return reconcile_write_flush_merge(table, synthetic_changes(table, keys, delete_ratio, rng, "probe"))
