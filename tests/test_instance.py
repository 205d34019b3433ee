"""The shipped deploy/dagster.yaml loads and sets the concurrency limits the platform relies on."""

from __future__ import annotations

import shutil
from pathlib import Path

from dagster import DagsterInstance
from dagster._core.run_coordinator import QueuedRunCoordinator

ROOT = Path(__file__).resolve().parents[1]


def test_dagster_yaml_limits_writers_and_maintenance_runs(tmp_path):
    shutil.copy(ROOT / "deploy" / "dagster.yaml", tmp_path / "dagster.yaml")
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        assert isinstance(instance.run_coordinator, QueuedRunCoordinator)
        # What the run-queue daemon enforces.
        queue = instance.get_concurrency_config().run_queue_config
        limits = {limit["key"]: limit for limit in queue.tag_concurrency_limits}
        assert limits["lsm/writer"]["limit"] == 1
        assert limits["lsm/maintenance"]["limit"] == 1
        assert limits["lsm/maintenance"]["value"] == {"applyLimitPerUniqueValue": True}
        assert instance.run_retries_enabled and instance.run_retries_max_retries == 2
