"""End to end through the UI: the webserver and the daemon, a demo_job run over GraphQL, the asset page in Chromium.

Needs Debian's ``chromium`` (``.ci/run`` installs it); skipped with a message where it is missing.
A screenshot of the asset page is kept in ``test-artifacts/ui/``. The services come from ``deploy/stack.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.stack import DagsterServices, dagster_home, dagster_services

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts" / "ui"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1500,1100",
    "--virtual-time-budget=20000",
]
DEMO_CONFIG = {"ops": {"landing_changes": {"config": {"num_keys": 2000, "num_batches": 2, "batch_size": 1000}}}}

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")


def _chromium(*args: str, profile: Path) -> str:
    result = subprocess.run(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=120
    )
    return result.stdout


@pytest.fixture(scope="module")
def dagster_ui(tmp_path_factory) -> Iterator[DagsterServices]:
    """The webserver and the daemon as separate processes, as ``./dev ui`` starts them (shared by this module)."""
    tmp_path = tmp_path_factory.mktemp("ui")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(dagster_home(tmp_path / "dagster_home")),
        "LSM_TABLE_URI": str(tmp_path / "table.lance"),
        "LSM_CREATE_TABLE": "true",
        "LSM_LANDING_DIR": str(tmp_path / "landing"),
    }
    with dagster_services(env, tmp_path / "logs") as services:
        yield services


def test_demo_run_shows_its_materialization_and_metadata_in_the_ui(dagster_ui, tmp_path):
    run_id = dagster_ui.launch("demo_job", DEMO_CONFIG)
    status = dagster_ui.wait(run_id, timeout=600)
    assert status == "SUCCESS", dagster_ui.failures(run_id)

    page = f"{dagster_ui.url}/assets/ingested_changes"
    dom = _chromium("--dump-dom", page, profile=tmp_path / "chrome")
    for shown in ("ingested_changes", "rows_read", "rows_per_s", "shard_0_rows", "Latest materialization"):
        assert shown in dom, f"{shown!r} is not on the asset page"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    screenshot = ARTIFACTS / "ingested_changes.png"
    _chromium(f"--screenshot={screenshot}", page, profile=tmp_path / "chrome")
    assert screenshot.stat().st_size > 10_000


def test_each_declared_table_shows_as_its_own_group_in_the_ui(dagster_ui, tmp_path):
    """The tables shipped in tables/ load with the default one, each its own group of prefixed assets."""
    for table in ("customers", "order_lines", "sensor_readings"):
        page = f"{dagster_ui.url}/locations/{dagster_ui.location}/asset-groups/{table}"
        dom = _chromium("--dump-dom", page, profile=tmp_path / "chrome")
        for shown in (table, "ingested_changes", "merged_base", "garbage_collected"):
            assert shown in dom, f"{shown!r} is not on the page of group {table}"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    screenshot = ARTIFACTS / f"{table}_group.png"
    _chromium(f"--screenshot={screenshot}", page, profile=tmp_path / "chrome")
    assert screenshot.stat().st_size > 10_000
