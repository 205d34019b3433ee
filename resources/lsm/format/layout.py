"""Where everything lives under a table's root, and under a landing directory.

Every path the engine reads or writes is spelled here once; all are relative
to the table root (or, for the archive, to the landing directory)::

    _versions/<n>.manifest                               Lance's base manifests
    data/<file>.lance                                    Lance's base data files
    _mem_wal/<shard>/manifest/version_hint.json          shard manifest hint (Lance MemWAL)
    _mem_wal/<shard>/manifest/<bits>.binpb               shard manifests, one per version
    _mem_wal/<shard>/wal/<bits>.arrow                    WAL entries
    _mem_wal/<shard>/<prefix>_gen_<N>/                   flushed generations
    _lsm_runs/<shard>/<first>-<last>-<digest>.arrow      pending runs (read/pending_run.py)
    _lsm_merging/<shard>@<until, unix ms>                a merge's lease on a shard (maintenance/merge_leases.py)
    _lsm_key_hashes/v1/<fragment id>-<data file>.u64     key hashes of a base fragment (read/key_hash_files.py)
    _lsm_key_hashes/sorted-v1/<fragment id>-<data file>.idx  its key index (read/base_key_index.py)
    _lsm_ingest/files/<landing file>.json                the landing ledger (ingest/landing.py)
    _lsm_ingest/staging/<run or write>/                  Spark's staged rows, deleted after a run
    _lsm_ingest/writes/<write id>/<shard>.json           the DataFrame writer's ledger (spark/writer.py)
    _lsm_ingest/quarantine/                              the DataFrame writer's default quarantine
    <landing directory>/_archive/                        landing files kept after ingestion

docs/architecture.md §2 describes what each holds and who deletes it.
"""

from __future__ import annotations

VERSIONS_DIR = "_versions"
DATA_DIR = "data"
MEM_WAL_DIR = "_mem_wal"
RUNS_DIR = "_lsm_runs"
MERGE_LEASES_DIR = "_lsm_merging"
REWRITES_DIR = "_lsm_rewrites"
"""Where each tidy-up's rewrite of the base put the rows it moved (``read/rewrites.py``)."""
KEY_HASHES_DIR = "_lsm_key_hashes/v1"
KEY_INDEX_DIR = "_lsm_key_hashes/sorted-v1"
INGEST_DIR = "_lsm_ingest"
LEDGER_DIR = f"{INGEST_DIR}/files"
STAGING_DIR = f"{INGEST_DIR}/staging"
WRITES_DIR = f"{INGEST_DIR}/writes"
QUARANTINE_DIR = f"{INGEST_DIR}/quarantine"
ARCHIVE_DIR = "_archive"
"""Below a landing directory, not the table."""


def shard_dir(shard_id: str) -> str:
    """A shard's MemWAL directory: its manifests, WAL and generations."""
    return f"{MEM_WAL_DIR}/{shard_id}"


def manifest_dir(shard_id: str) -> str:
    return f"{shard_dir(shard_id)}/manifest"


def wal_dir(shard_id: str) -> str:
    return f"{shard_dir(shard_id)}/wal"


def wal_entry_path(shard_id: str, name: str) -> str:
    """A WAL entry file named ``name`` (``<bits>.arrow``)."""
    return f"{wal_dir(shard_id)}/{name}"


def generation_dir(shard_id: str, directory: str) -> str:
    """A flushed generation's dataset directory (``directory`` as the shard manifest names it)."""
    return f"{shard_dir(shard_id)}/{directory}"


def run_dir(shard_id: str) -> str:
    """A shard's pending-run files."""
    return f"{RUNS_DIR}/{shard_id}"
