"""Which Dagster runs may hold shard writers right now.

Jobs that open writers carry the ``lsm/writer`` tag; maintenance that would
claim a shard (a flush) skips while such a run is in progress, so it never
fences a live ingestion writer.
"""

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

WRITER_TAG = "lsm/writer"
WRITER_TAGS = {WRITER_TAG: "true"}

_ACTIVE = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]


def live_writer_runs(instance: DagsterInstance, exclude_run_id: str | None = None) -> list[str]:
    """IDs of in-progress runs tagged as writers (other than ``exclude_run_id``)."""
    records = instance.get_run_records(RunsFilter(statuses=_ACTIVE, tags=WRITER_TAGS), limit=50)
    return [r.dagster_run.run_id for r in records if r.dagster_run.run_id != exclude_run_id]
