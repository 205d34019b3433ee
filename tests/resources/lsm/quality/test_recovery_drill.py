"""The recovery drill and row-count reconciliation on real tables and real SIGKILLs."""

from __future__ import annotations

import pyarrow as pa

from resources.lsm.quality.reconciliation import expected_change, probe_reconciliation
from resources.lsm.quality.recovery_drill import DrillConfig, run_drill
from resources.lsm.quality.scratch import live_keys, scratch_sample
from resources.lsm.testing.changegen import EVENTS_SCHEMA, ChangeStreamSpec, generate_changes
from tests.helpers import rows_by_key


def events_table(make_table):
    table = make_table(EVENTS_SCHEMA)
    for batch in generate_changes(ChangeStreamSpec(num_keys=400, num_batches=2, batch_size=300, seed=3)):
        table.write(batch)
        table.close()
    return table


def test_the_drill_kills_a_writer_and_recovers_every_acknowledged_change(make_table, tmp_path):
    table = events_table(make_table)
    view = table.read()
    report = run_drill(table, str(tmp_path / "drill"), DrillConfig(seed=5))
    assert report.passed, report.violations
    assert report.killed and report.batches_acknowledged >= 2 * DrillConfig.batches_per_generation
    assert report.generations_merged >= 3 and report.deleted_keys_verified > 0
    assert report.rows_replayed >= report.batches_only_in_wal * DrillConfig.batch_size
    assert report.findings_before_recovery == ()
    assert rows_by_key(table.read()) == rows_by_key(view)  # the drill wrote to a copy


def test_expected_change_counts_new_keys_and_live_deletes(make_table):
    table = make_table()
    table.write(pa.table({"id": [1, 2], "name": ["a", "b"], "price": [1.0, 2.0]}))
    changes = pa.table(
        {
            "id": [2, 3, 4, 1, 9],
            "name": ["x"] * 5,
            "price": [0.0] * 5,
            "_op": ["upsert", "upsert", "delete", "delete", "delete"],
        }
    )
    assert expected_change(table, live_keys(table), changes) == (1, 1)  # 3 inserted; 1 deleted (4, 9 absent)


def test_row_counts_reconcile_through_ingest_flush_and_merge(make_table, tmp_path):
    table = events_table(make_table)
    steps = probe_reconciliation(scratch_sample(table, str(tmp_path / "copy.lance")), rows=300, seed=2)
    assert [s.step for s in steps] == ["ingest", "flush", "merge"]
    assert all(s.passed for s in steps), steps
    assert steps[0].inserted > 0 and steps[0].deleted > 0


def test_a_scratch_sample_holds_the_first_rows_of_the_view_and_is_its_own_table(make_table, tmp_path):
    table = events_table(make_table)
    view = rows_by_key(table.read())
    sample = scratch_sample(table, str(tmp_path / "sample.lance"), rows=150)
    sampled = rows_by_key(sample.read())
    assert len(sampled) == 150 and all(view[k] == row for k, row in sampled.items())
    assert sample.num_shards == table.num_shards and sample.primary_key == table.primary_key
    assert sample.dataset().count_rows() == 150  # merged into the base, nothing pending
    assert all(
        not s.pending_generations and s.compacted_generation > 0 for s in sample.shards() if s.flushed_generations
    )
    assert sample.handle.writer_settings() == table.handle.writer_settings()
    sample.write(pa.table({"id": [10**9], "customer": ["x"], "amount": [1.0], "status": ["new"]}))
    assert rows_by_key(table.read()) == view  # the source is untouched


def test_the_drill_costs_follow_its_sample_not_the_table(make_table, tmp_path):
    table = events_table(make_table)
    report = run_drill(table, str(tmp_path / "drill"), DrillConfig(seed=3, sample_rows=50))
    assert report.passed, report.violations
    assert report.rows_before == 50 and report.keys_verified < 50 + DrillConfig.batches * DrillConfig.batch_size
