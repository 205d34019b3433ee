"""Model-based test: random change sequences against a plain-Python oracle.

Each step writes upserts / deletes (with out-of-order ``_seq``), closes,
reopens or crashes the table (writers dropped unflushed), flushes, builds
pending runs, merges (or stops a merge between its data and marker commits),
rewrites the base's files (stale deletion vectors) or collects garbage; after
every step the merged view, the count and point lookups must equal the oracle,
and every stored pending run must agree with a key join against the base.
Single and composite keys.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from datetime import timedelta
from typing import ClassVar
from unittest.mock import patch

import pyarrow as pa
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from resources.lsm import LsmTable
from resources.lsm.maintenance import compaction
from resources.lsm.maintenance.compaction import MaintenancePolicy, maintain_base
from resources.lsm.read.deletion_vector import fragment_ids
from resources.lsm.read.pending_run import NOT_IN_BASE
from tests.helpers import rows_by_key, stored_run

STEPS = settings(max_examples=12, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SINGLE_KEY_SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("qty", pa.int32())])
COMPOSITE_KEY_SCHEMA = pa.schema([("region", pa.string()), ("id", pa.int32()), ("name", pa.string())])


class _Killed(Exception):
    """Stands for a SIGKILL at one step of a merge (the crash matrix kills real processes)."""


class LsmTableMachine(RuleBasedStateMachine):
    """Drives one LsmTable and a dict oracle {key tuple: row} side by side."""

    schema: pa.Schema
    primary_key: ClassVar[list[str]]
    keys: st.SearchStrategy

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="lsm-model-")
        self.oracle: dict[tuple, dict] = {}
        self.deleted: set[tuple] = set()
        self.version = 0

    @initialize()
    def create(self) -> None:
        self.table = LsmTable.create(f"{self.tmp}/t.lance", self.schema, self.primary_key, num_shards=3)

    def teardown(self) -> None:
        self.table.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def row(self, key: tuple) -> dict:
        raise NotImplementedError

    def _changes(self, ops: list[tuple[tuple, str]]) -> pa.Table:
        """Rows for ``ops`` with shuffled-but-meaningful _seq; returns the winners too."""
        rows = []
        for seq, (key, op) in enumerate(ops):
            self.version += 1
            row = self.row(key) if op == "upsert" else dict(zip(self.primary_key, key, strict=True))
            rows.append({**row, "_op": op, "_seq": seq})
        # Present rows in reverse order: the highest _seq (last op) must still win.
        rows.reverse()
        columns = [*self.schema.names, "_op", "_seq"]
        return pa.Table.from_pylist(
            [{c: r.get(c) for c in columns} for r in rows],
            schema=self.schema.append(pa.field("_op", pa.string())).append(pa.field("_seq", pa.int64())),
        )

    def _apply(self, ops: list[tuple[tuple, str]]) -> None:
        batch = self._changes(ops)
        self.table.write(batch)
        for row in sorted(batch.to_pylist(), key=lambda r: r["_seq"]):
            key = tuple(row[k] for k in self.primary_key)
            if row["_op"] == "delete":
                self.oracle.pop(key, None)
                self.deleted.add(key)
            else:
                self.oracle[key] = {c: row[c] for c in self.schema.names}
                self.deleted.discard(key)

    @rule(data=st.data())
    def upsert_and_delete(self, data) -> None:
        ops = data.draw(
            st.lists(st.tuples(self.keys, st.sampled_from(["upsert", "upsert", "delete"])), min_size=1, max_size=12)
        )
        self._apply(ops)

    @precondition(lambda self: self.deleted)
    @rule(data=st.data())
    def reinsert_deleted(self, data) -> None:
        key = data.draw(st.sampled_from(sorted(self.deleted)))
        self._apply([(key, "upsert")])

    @rule()
    def close_writers(self) -> None:
        self.table.close()

    @rule()
    def reopen(self) -> None:
        self.table.close()
        self.table = LsmTable.open(self.table.uri)

    @rule()
    def flush(self) -> None:
        self.table.flush()
        assert all(s.unflushed_wal_entries == 0 for s in self.table.shards())

    @rule()
    def build_pending_runs(self) -> None:
        self.table.build_pending_runs()

    @rule()
    def crash(self) -> None:
        """Writers vanish unflushed, as in a SIGKILL: their rows live on in the WAL only."""
        self.table.detach_writers()
        self.table = LsmTable.open(self.table.uri)

    @rule(max_rows_per_pass=st.sampled_from([3, 1000]))
    def merge(self, max_rows_per_pass: int) -> None:
        self.table.compact(max_rows_per_pass=max_rows_per_pass)

    @rule()
    def merge_killed_between_its_commits(self) -> None:
        """A merge dies after a data commit, before the marker catches up with its claim."""
        with patch.object(compaction, "commit_marker", side_effect=_Killed), contextlib.suppress(_Killed):
            self.table.compact()
        self.table = LsmTable.open(self.table.uri)

    @rule()
    def rewrite_base_files(self) -> None:
        """``compact_files`` gives base rows new addresses: stored deletion vectors go stale."""
        maintain_base(
            self.table.handle.storage,
            self.table.dataset(),
            MaintenancePolicy(max_small_fragments=0, small_fragment_rows=1 << 30),
        )

    @rule()
    def collect_garbage(self) -> None:
        self.table.gc(orphan_grace_seconds=0, wal_grace_seconds=0, older_than=timedelta(0))

    @invariant()
    def merged_view_matches_oracle(self) -> None:
        if not hasattr(self, "table"):
            return
        assert rows_by_key(self.table.read(), self.primary_key) == self.oracle
        assert self.table.count() == len(self.oracle)

    @invariant()
    def stored_runs_agree_with_a_key_join(self) -> None:
        if not hasattr(self, "table"):
            return
        dataset = self.table.dataset()
        base = dataset.to_table(columns=self.primary_key, with_row_address=True).to_pylist()
        address = {tuple(r[k] for k in self.primary_key): r["_rowaddr"] for r in base}
        fragments = fragment_ids(dataset)
        for shard in self.table.handle.shard_states(dataset):
            run = stored_run(self.table, shard)
            if run is None or not run.superseded.holds_in(fragments):
                continue  # none stored, or stale: readers join keys
            keys = [tuple(r[k] for k in self.primary_key) for r in run.changes.to_pylist()]
            assert run.base_rows.to_pylist() == [address.get(k, NOT_IN_BASE) for k in keys]

    @invariant()
    def lookups_match_oracle(self) -> None:
        if not hasattr(self, "table"):
            return
        probe = sorted(self.oracle)[:3] + sorted(self.deleted)[:3]
        if probe:
            found = rows_by_key(self.table.lookup(probe), self.primary_key)
            assert found == {k: self.oracle[k] for k in probe if k in self.oracle}


class SingleKeyMachine(LsmTableMachine):
    schema = SINGLE_KEY_SCHEMA
    primary_key: ClassVar[list[str]] = ["id"]
    keys = st.integers(min_value=0, max_value=40).map(lambda i: (i,))

    def row(self, key: tuple) -> dict:
        return {"id": key[0], "name": f"n{key[0]}-v{self.version}", "qty": self.version % 1000}


class CompositeKeyMachine(LsmTableMachine):
    schema = COMPOSITE_KEY_SCHEMA
    primary_key: ClassVar[list[str]] = ["region", "id"]
    keys = st.tuples(st.sampled_from(["eu", "us", "apac"]), st.integers(min_value=0, max_value=12))

    def row(self, key: tuple) -> dict:
        return {"region": key[0], "id": key[1], "name": f"{key}-v{self.version}"}


TestSingleKeyModel = SingleKeyMachine.TestCase
TestSingleKeyModel.settings = STEPS
TestCompositeKeyModel = CompositeKeyMachine.TestCase
TestCompositeKeyModel.settings = STEPS
