"""Base rows of keys, looked up ahead of a scan fragment group by fragment group."""

from __future__ import annotations

import lance
import numpy as np
import pyarrow as pa
import pytest

from resources.lsm import LsmTable
from resources.lsm.format.schema import ROW_ADDRESS
from resources.lsm.read import deletion_vector
from resources.lsm.read.deletion_vector import DeletionVector, SupersededRows
from tests.helpers import drop_pending_runs, rows_kept

ROWS = 16_000


@pytest.fixture
def base(tmp_path) -> lance.LanceDataset:
    """A base of 16 fragments of 1,000 string keys each, ``k0`` to ``k15999``."""
    keys = [f"k{i}" for i in range(ROWS)]
    return lance.write_dataset(pa.table({"id": keys, "v": range(ROWS)}), str(tmp_path / "base"), max_rows_per_file=1000)


@pytest.mark.parametrize(
    "addresses",
    [
        np.arange(100, 164),  # one run of rows
        np.arange(100, 228, 2),  # gaps (rows deleted in the base): a bitmap over the range
        np.array([100, 103, 102, 101]),  # the span of a run, not in order
        np.array([5, 7, 1 << 32, (1 << 32) + 9]),  # two fragments: scattered
        np.arange(10_000, 10_064),  # beyond every address of the vector
    ],
    ids=["run", "gaps", "unordered", "two fragments", "beyond"],
)
def test_a_deletion_vector_keeps_exactly_the_rows_it_does_not_hold(addresses):
    held = np.array([1, 5, 101, 102, 130, 163, 1 << 32, (1 << 32) + 9], dtype=np.uint64)
    addresses = addresses.astype(np.uint64)
    assert DeletionVector(held).keep_mask(addresses).tolist() == (~np.isin(addresses, held)).tolist()


@pytest.mark.parametrize("count", [1, 400], ids=["few keys: one indexed query", "many keys: groups scanned"])
def test_every_row_of_the_keys_is_found_whatever_fragment_group_it_lies_in(base, count):
    wanted = [f"k{i}" for i in np.random.default_rng(count).choice(ROWS, count, replace=False)]
    wanted.append("not-in-the-base")
    rows = SupersededRows(base, pa.table({"id": wanted}), ["id"])

    assert rows_kept(rows, base) == [f"k{i}" for i in range(ROWS) if f"k{i}" not in set(wanted)]


def test_many_keys_are_looked_up_in_groups_of_consecutive_fragments(base):
    groups = deletion_vector._fragment_groups(base.get_fragments(), keys=400)

    assert [len(group) for group in groups] == [4, 4, 4, 4]
    assert [f.fragment_id for group in groups for f in group] == [f.fragment_id for f in base.get_fragments()]
    assert [len(group) for group in deletion_vector._fragment_groups(base.get_fragments(), keys=2)] == [16]


def test_a_failed_lookup_fails_the_scan_when_it_reaches_that_group(base, monkeypatch):
    looked_up = deletion_vector._base_rows_of

    def failing_in_the_third_group(dataset, keys, primary_key, fragments):
        if fragments[0].fragment_id == 8:
            raise OSError("storage went away")
        return looked_up(dataset, keys, primary_key, fragments)

    monkeypatch.setattr(deletion_vector, "_base_rows_of", failing_in_the_third_group)
    rows = SupersededRows(base, pa.table({"id": [f"k{i}" for i in range(0, ROWS, 40)]}), ["id"])
    first = base.get_fragment(0).scanner(columns=["id"], with_row_address=True).to_table()

    assert rows.keep_mask(first.column(ROW_ADDRESS).to_numpy(), first, None).sum() == 975  # the groups before it answer
    with pytest.raises(OSError, match="storage went away"):
        rows_kept(rows, base)


def test_a_table_with_a_vector_column_and_nothing_merged_yet_reads_its_pending_rows(tmp_path):
    schema = pa.schema([pa.field("id", pa.string(), nullable=False), ("vec", pa.list_(pa.float32(), 2))])
    table = LsmTable.create(str(tmp_path / "t.lance"), schema, ["id"], num_shards=2)
    table.write(pa.table({"id": ["a", "b"], "vec": [[1.0, 0.0], [0.0, 1.0]]}, schema=schema))
    table.close()
    drop_pending_runs(table)

    assert sorted(table.read()["id"].to_pylist()) == ["a", "b"]
