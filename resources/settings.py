"""Locations from environment variables, with embedded defaults (see README)."""

from __future__ import annotations

import os

DEFAULT_TABLE_URI = "data/table.lance"
DEFAULT_LANDING_DIR = "data/landing"
DEFAULT_SPARK_MASTER = "local[*]"


def table_uri() -> str:
    """``LSM_TABLE_URI``: the LSM table (local path or object-store URI)."""
    return os.environ.get("LSM_TABLE_URI", DEFAULT_TABLE_URI)


def landing_dir() -> str:
    """``LSM_LANDING_DIR``: where change files land."""
    return os.environ.get("LSM_LANDING_DIR", DEFAULT_LANDING_DIR)


def spark_master() -> str:
    """``SPARK_MASTER``: the Spark master URL."""
    return os.environ.get("SPARK_MASTER", DEFAULT_SPARK_MASTER)


def quarantine_dir() -> str:
    """``LSM_QUARANTINE_DIR``: where rejected rows go (default ``<landing dir>/_quarantine``)."""
    return os.environ.get("LSM_QUARANTINE_DIR", os.path.join(landing_dir(), "_quarantine"))


def run_keeper_seconds() -> float:
    """``LSM_RUN_KEEPER_SECONDS``: how often a run holding shard writers builds the runs of the generations they cut."""
    from .lsm.maintenance.pending_runs import DEFAULT_KEEPER_INTERVAL_SECONDS

    return float(os.environ.get("LSM_RUN_KEEPER_SECONDS") or DEFAULT_KEEPER_INTERVAL_SECONDS)


def run_keeper_patience_seconds() -> float:
    """``LSM_RUN_KEEPER_PATIENCE_SECONDS``: how long that keeper waits for the writers to pause, at most, before
    building runs beside them."""
    from .lsm.maintenance.pending_runs import DEFAULT_KEEPER_PATIENCE_SECONDS

    return float(os.environ.get("LSM_RUN_KEEPER_PATIENCE_SECONDS") or DEFAULT_KEEPER_PATIENCE_SECONDS)


def num_shards() -> int:
    """``LSM_NUM_SHARDS``: shards of a new table, and the shard partitions of maintenance assets."""
    return int(os.environ.get("LSM_NUM_SHARDS", "4"))


def create_table_if_missing(uri: str) -> bool:
    """``LSM_CREATE_TABLE`` (``true``/``false``): create a missing table on first use.

    Unset: only for the embedded default ``data/table.lance`` (the demo's), so
    a mistyped ``LSM_TABLE_URI`` fails instead of creating a new table.
    """
    setting = os.environ.get("LSM_CREATE_TABLE", "").strip().lower()
    if setting:
        return setting in ("1", "true", "yes")
    return os.path.abspath(uri) == os.path.abspath(DEFAULT_TABLE_URI)
