"""Which Dagster runs may hold a table's shard writers right now.

Jobs that open writers carry the ``lsm/writer`` tag with the table's name as
its value; maintenance that would claim a shard (a flush) skips while such a
run of the same table is in progress, so it never fences a live ingestion
writer. The instance's ``lsm/writer`` limit applies per value: one writer run
per table, while other tables' runs go on (``deploy/dagster.yaml``).
"""

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from resources.declared_table import DEFAULT_TABLE_NAME

WRITER_TAG = "lsm/writer"

_ACTIVE = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]


def writer_tags(table_name: str) -> dict[str, str]:
    """The run tags of a job that holds ``table_name``'s shard writers."""
    return {WRITER_TAG: table_name}


WRITER_TAGS = writer_tags(DEFAULT_TABLE_NAME)
"""The default table's writer tags."""


def live_writer_runs(instance: DagsterInstance, table_name: str, exclude_run_id: str | None = None) -> list[str]:
    """IDs of in-progress runs holding ``table_name``'s writers (other than ``exclude_run_id``)."""
    records = instance.get_run_records(RunsFilter(statuses=_ACTIVE, tags=writer_tags(table_name)), limit=50)
    return [r.dagster_run.run_id for r in records if r.dagster_run.run_id != exclude_run_id]
