"""Shared fixtures: real Lance tables on local disk, a Spark session, and a real S3-compatible server (moto_server)."""

from __future__ import annotations

import os
import re

import pyarrow as pa
import pytest

from resources.lsm import LsmTable

ITEMS_SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("price", pa.float64())])


@pytest.fixture
def make_table(tmp_path):
    """Create LSM tables under the test's temporary directory; closes them afterwards."""
    created: list[LsmTable] = []

    def make(
        schema: pa.Schema = ITEMS_SCHEMA, primary_key=("id",), num_shards: int = 4, name: str = "table", **writer_config
    ) -> LsmTable:
        table = LsmTable.create(
            str(tmp_path / f"{name}.lance"), schema, list(primary_key), num_shards=num_shards, **writer_config
        )
        created.append(table)
        return table

    yield make
    for table in created:
        table.close()


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for the whole test session (the platform's SparkResource reuses it)."""
    from resources.spark import spark_session

    session = spark_session("local[2]")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def s3_server():
    """A ``moto_server`` process on 127.0.0.1 (a free port) with the bucket ``lsm-tests``, for the whole session."""
    from tests.s3_server import moto_server

    with moto_server() as server:
        yield server


@pytest.fixture
def s3_root(s3_server, monkeypatch, request):
    """An empty ``s3://`` prefix for this test, with the ``AWS_*`` environment pointing at the server."""
    import uuid

    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name)[:40]
    return f"s3://{s3_server.bucket}/{name}-{uuid.uuid4().hex[:8]}"


# Short client timeouts, so that the proxy's delayed answers (3 s) time out; a 30 s retry deadline.
FAULT_TEST_STORAGE_OPTIONS = {"timeout": "2s", "connect_timeout": "1s", "client_retry_timeout": "30"}


@pytest.fixture
def faulty_s3(s3_server, s3_root):
    """A fault-injecting proxy (tests/faulty_s3.py) in front of the session's server, injecting nothing yet.

    Yields ``(proxy, root, storage_options)``: ``root`` is this test's empty ``s3://``
    prefix, and the options point Lance and pyarrow at the proxy with short client
    timeouts (so a delayed answer times out) and a 30 s retry deadline.
    """
    from tests.faulty_s3 import faulty_s3 as proxy_in_front_of

    with proxy_in_front_of(s3_server) as proxy:
        options = {**proxy.server.storage_options(), **FAULT_TEST_STORAGE_OPTIONS}
        yield proxy, s3_root, options
