"""Assertion and set-up helpers shared by the tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import lance
import pyarrow as pa
import pyarrow.ipc as ipc

from resources.lsm import LsmTable
from resources.lsm.format.layout import RUNS_DIR, wal_entry_path
from resources.lsm.format.schema import ROW_ADDRESS
from resources.lsm.format.shard_manifest import list_wal_entries, position_name
from resources.lsm.format.shard_state import ShardState
from resources.lsm.format.wal import read_wal_entry
from resources.lsm.read.deletion_vector import RowsFoundAhead
from resources.lsm.read.pending_run import SHARED_RUNS, PendingRun, PendingRuns, run_cache


def rows_by_key(table: pa.Table, key=("id",)) -> dict:
    """A pyarrow table as {key tuple: row dict}, asserting keys are unique."""
    result = {}
    for row in table.to_pylist():
        k = tuple(row[c] for c in key)
        assert k not in result, f"duplicate key {k} in merged view"
        result[k] = row
    return result


def rows_kept(found: RowsFoundAhead, dataset: lance.LanceDataset) -> list[str]:
    """The ``id`` of every row of a scan of ``dataset`` that ``found`` keeps, batch by batch, in scan order."""
    survivors = []
    for batch in dataset.scanner(columns=["id"], with_row_address=True, batch_size=300).to_batches():
        keep = found.keep_mask(batch.column(ROW_ADDRESS).to_numpy(), batch, None)
        survivors += [k for k, stays in zip(batch.column("id").to_pylist(), keep, strict=True) if stays]
    return survivors


def keys_in_bucket(table: LsmTable, bucket: int, count: int, start: int = 0) -> list[int]:
    """``count`` int64 keys (from ``start`` up) that Lance routes to ``bucket``."""
    candidates = pa.table({"id": pa.array(range(start, start + 64 * count), pa.int64())})
    hits = candidates.filter(pa.array(table.buckets(candidates) == bucket))["id"].to_pylist()
    assert len(hits) >= count
    return hits[:count]


def write_generation(table: LsmTable, keys: list[int], label: str) -> None:
    """Upsert ``keys`` (events schema) and close the writers: one new generation per touched shard."""
    table.write(
        pa.table(
            {
                "id": pa.array(keys, pa.int64()),
                "customer": [label] * len(keys),
                "amount": [float(k) for k in keys],
                "status": ["new"] * len(keys),
            }
        )
    )
    table.close()


def drop_pending_runs(table: LsmTable) -> None:
    """Delete the table's stored pending runs, and the process's copies: reads then take the path without them."""
    table.handle.storage.delete_dir(RUNS_DIR)
    SHARED_RUNS.clear()


def stored_run(table: LsmTable, shard: ShardState) -> PendingRun | None:
    """The run stored over the longest prefix of ``shard``'s pending generations, read from its file (the
    process's cache may hold the builder's copy)."""
    return PendingRuns(table.handle.storage, table.handle.cache_scope, run_cache()).find(shard, maintenance=True)


def in_another_process(table: LsmTable) -> LsmTable:
    """``table``, given a cache of runs of its own: runs it builds or reads stay out of the process's cache, as
    if it were opened in another process."""
    table.handle.runs = PendingRuns(table.handle.storage, table.handle.cache_scope, run_cache())
    return table


def forge_wal_entry(table: LsmTable, columns: dict[str, pa.Array], bucket: int = 0) -> None:
    """Append a WAL entry holding ``columns`` (``_tombstone`` is added) to a shard, as only a forged
    write could; the shard's writer is left crashed so the entry is unflushed. The entry carries
    the writer metadata of a real one (epoch, generation)."""
    key = keys_in_bucket(table, bucket, 1)[0]
    table.write(pa.Table.from_pylist([{"id": key}], schema=table.schema))  # every column, nulls but the key
    table.detach_writers()
    shard = table.shards()[bucket]
    entry = list_wal_entries(table.handle.storage, shard.shard_id)[-1]
    _, rows = read_wal_entry(table.handle.storage, shard.shard_id, entry)
    forged = pa.table({**columns, "_tombstone": pa.array([False] * len(next(iter(columns.values()))))})
    forged = forged.replace_schema_metadata(rows.schema.metadata)
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, forged.schema) as writer:
        writer.write_table(forged)
    path = f"{table.uri}/{wal_entry_path(shard.shard_id, position_name(entry.position + 1))}.arrow"
    with open(path, "wb") as out:
        out.write(sink.getvalue().to_pybytes())


def forge_null_key_wal_entry(table: LsmTable, bucket: int = 0) -> None:
    """A forged WAL entry with a null key (Lance refuses null keys everywhere else); items schema."""
    forge_wal_entry(table, {"id": pa.array([None], pa.int64()), "name": ["null"], "price": [0.0]}, bucket)


def resolved_job(job, resources: dict):
    """``job`` of the code location, resolved with ``resources`` in place of the location's own."""
    from dagster import Definitions

    from definitions import defs

    return Definitions(
        assets=list(defs.assets or ()),
        asset_checks=list(defs.asset_checks or ()),
        jobs=[job],
        resources={**(defs.resources or {}), **resources},
    ).resolve_job_def(job.name)


REPO_ROOT = Path(__file__).resolve().parents[1]


def run_cli_job(job: str, env: dict[str, str], config: Path | None = None, timeout: float = 600) -> str:
    """Run ``dagster job execute -m definitions -j job`` as a user would; assert it succeeded; return its output.

    ``env`` is added to this process's environment (``DAGSTER_HOME``, ``LSM_*``).
    """
    dagster = Path(sys.executable).with_name("dagster")
    command = [str(dagster), "job", "execute", "-m", "definitions", "-j", job]
    if config is not None:
        command += ["-c", str(config)]
    result = subprocess.run(
        command, cwd=REPO_ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert "RUN_SUCCESS" in output, output[-5000:]
    return output


def reads_of(table: LsmTable, part: str) -> list[str]:
    """The files with ``part`` in their path that ``table`` reads from now on, appended as they are read."""
    storage = table.handle.storage
    paths: list[str] = []
    read_bytes = storage.read_bytes

    def recording_read_bytes(path: str) -> bytes:
        if part in path:
            paths.append(path)
        return read_bytes(path)

    storage.read_bytes = recording_read_bytes  # type: ignore[method-assign]
    return paths
