"""A real S3-compatible server for the object-storage tests: ``moto_server`` as a child process on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

BUCKET = "lsm-tests"
REGION = "us-east-1"


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    bucket: str = BUCKET

    def env(self) -> dict[str, str]:
        """The standard ``AWS_*`` variables that point pyarrow and Lance at this server (plain HTTP)."""
        return {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": REGION,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def storage_options(self) -> dict[str, str]:
        """The same settings as Lance storage options (what a process without the variables needs)."""
        return {
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
            "aws_region": REGION,
            "aws_endpoint": self.endpoint,
            "allow_http": "true",
        }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_until_up(endpoint: str, child: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError(f"moto_server exited with {child.returncode}")
        try:
            with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"moto_server did not answer on {endpoint} within {timeout} s")


def _create_bucket(server: S3Server) -> None:
    import pyarrow.fs as pafs

    options = server.storage_options()
    fs = pafs.S3FileSystem(
        access_key=options["aws_access_key_id"],
        secret_key=options["aws_secret_access_key"],
        region=REGION,
        endpoint_override=server.endpoint,
        allow_bucket_creation=True,
    )
    fs.create_dir(server.bucket)


@contextmanager
def moto_server() -> Iterator[S3Server]:
    """Start ``moto_server`` on a free loopback port, create the test bucket; stop the server on exit."""
    executable = shutil.which("moto_server", path=os.path.dirname(sys.executable)) or "moto_server"
    port = _free_port()
    child = subprocess.Popen(
        [executable, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        server = S3Server(f"http://127.0.0.1:{port}")
        _wait_until_up(server.endpoint, child)
        _create_bucket(server)
        yield server
    finally:
        child.terminate()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
