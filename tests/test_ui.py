"""End to end through the UI: the webserver and the daemon, a demo_job run over GraphQL, the asset page in Chromium.

Needs Debian's ``chromium`` (``.ci/run`` installs it); skipped with a message where it is missing.
A screenshot of the asset page is kept in ``test-artifacts/ui/``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

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
LAUNCH = """mutation($params: ExecutionParams!) { launchRun(executionParams: $params) { __typename
  ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
  ... on RunConfigValidationInvalid { errors { message } } } }"""
STATUS = "query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"
FAILURES = """query($id: ID!) { runOrError(runId: $id) { ... on Run { eventConnection { events { __typename
  ... on ExecutionStepFailureEvent { stepKey error { message stack } }
  ... on RunFailureEvent { message } } } } } }"""

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _graphql(port: int, query: str, variables: dict) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        json.dumps({"query": query, "variables": variables}).encode(),
        {"Content-Type": "application/json"},
    )
    return json.loads(urllib.request.urlopen(request, timeout=60).read())["data"]


def _failures(port: int, run_id: str) -> str:
    """The run's step and run failure messages, for the assertion message."""
    events = _graphql(port, FAILURES, {"id": run_id})["runOrError"]["eventConnection"]["events"]
    return "\n".join(json.dumps(e) for e in events if e["__typename"] != "Run" and len(e) > 1)


def _wait_until_serving(port: int, server: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.poll() is None, "dagster-webserver exited"
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5)
            return
        except OSError:
            time.sleep(1)
    raise TimeoutError("dagster-webserver did not start serving")


def _chromium(*args: str, profile: Path) -> str:
    result = subprocess.run(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=120
    )
    return result.stdout


@pytest.fixture
def dagster_ui(tmp_path):
    """The webserver and the daemon as separate processes, as ``./dev ui`` starts them."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(ROOT / "deploy" / "dagster.yaml", home / "dagster.yaml")
    port = _free_port()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "LSM_TABLE_URI": str(tmp_path / "table.lance"),
        "LSM_CREATE_TABLE": "true",
        "LSM_LANDING_DIR": str(tmp_path / "landing"),
    }
    bin_dir = Path(sys.executable).parent
    commands = [
        [str(bin_dir / "dagster-daemon"), "run", "-w", "workspace.yaml"],
        [str(bin_dir / "dagster-webserver"), "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
    ]
    daemon, server = (
        subprocess.Popen(
            command, cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for command in commands
    )
    try:
        _wait_until_serving(port, server)
        yield port
    finally:
        for process in (server, daemon):
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


def test_demo_run_shows_its_materialization_and_metadata_in_the_ui(dagster_ui, tmp_path):
    port = dagster_ui
    selector = {"repositoryLocationName": "lance_lsm", "repositoryName": "__repository__", "jobName": "demo_job"}
    launched = _graphql(port, LAUNCH, {"params": {"selector": selector, "runConfigData": DEMO_CONFIG}})["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run_id = launched["run"]["runId"]

    deadline, status = time.monotonic() + 600, None
    while time.monotonic() < deadline and status not in ("SUCCESS", "FAILURE", "CANCELED"):
        time.sleep(2)
        status = _graphql(port, STATUS, {"id": run_id})["runOrError"]["status"]
    assert status == "SUCCESS", _failures(port, run_id)

    page = f"http://127.0.0.1:{port}/assets/ingested_changes"
    dom = _chromium("--dump-dom", page, profile=tmp_path / "chrome")
    for shown in ("ingested_changes", "rows_read", "rows_per_s", "shard_0_rows", "Latest materialization"):
        assert shown in dom, f"{shown!r} is not on the asset page"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    screenshot = ARTIFACTS / "ingested_changes.png"
    _chromium(f"--screenshot={screenshot}", page, profile=tmp_path / "chrome")
    assert screenshot.stat().st_size > 10_000
