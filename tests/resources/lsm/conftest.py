"""Fixtures of the engine's tests: a writer in a process of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def writer_process():
    """Start ``writer_child`` on a table; SIGKILL it at the end if still alive."""
    started: list[subprocess.Popen] = []

    def start(uri: str) -> subprocess.Popen:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.resources.lsm.read.writer_child", uri],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()
