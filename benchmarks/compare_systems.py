"""The systems of benchmarks/compare.py; each run is one process of its own.

    python benchmarks/compare_systems.py SYSTEM CONFIG.json

``compare.py`` starts one process per system (so each has its own peak RSS,
and Paimon can run from its own venv) and hands it a JSON config: the base
table (Parquet), the stream's landing files, the batches to probe for
visibility and where to put the results. The process:

1. warms up on a scratch table (a slice of the base plus the first landing
   file), untimed, so one-off start-up costs (Spark's Python workers, lazy
   imports) do not land in the first batch;
2. loads the base table (timed, reported, not part of any rate);
3. applies the stream one landing file per call (the platform's backlog mode:
   all files in one call); each call's seconds are its batch latency, from
   reading the landing file to the system's acknowledgement;
4. after the calls listed for probing, polls a separate reader for the
   newest version of one key the call upserted: visibility = first matching
   read minus the acknowledgement;
5. runs the system's own maintenance, timed per phase (MemWAL flush, merge
   into the base, garbage collection; old-version cleanup for Lance and delta;
   nothing is available for Paimon from Python);
6. writes the table's content as a reader sees it right after the stream and
   after maintenance to Parquet, and a result JSON (latencies, lags, phases,
   bytes on disk after the stream and after maintenance).

Only the standard library, numpy and pyarrow are imported at module level:
the Paimon venv has no pylance, Spark or deltalake.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
KEY, OP, SEQ, DELETE = "id", "_op", "_seq", "delete"
VALUE_COLUMNS = ["id", "customer", "amount", "status"]
WARM_UP_BASE_ROWS = 1_000
VISIBILITY_TIMEOUT_SECONDS = 120.0


# ------------------------------------------------------------------ helpers


def newest_per_key(batch: pa.Table) -> pa.Table:
    """One change per key, the highest ``_seq`` winning (as ``replay`` does); sorted by key."""
    ids, seqs = batch[KEY].to_numpy(), batch[SEQ].to_numpy()
    order = np.lexsort((seqs, ids))
    last = np.ones(len(order), dtype=bool)
    last[:-1] = ids[order][1:] != ids[order][:-1]
    return batch.take(pa.array(order[last]))


def read_resolved(path: str) -> pa.Table:
    """A landing file, newest change per key: the source every per-batch merge gets."""
    return newest_per_key(pq.read_table(path))


def probe_row(path: str) -> dict:
    """A key the file upserts, with the values it leaves (no later change in the file)."""
    upserts = read_resolved(path).filter(pc.not_equal(pc.field(OP), DELETE))
    return upserts.select(VALUE_COLUMNS).slice(upserts.num_rows - 1).to_pylist()[0]


def bytes_on_disk(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def timed(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def values_only(table: pa.Table) -> pa.Table:
    return table.select(VALUE_COLUMNS)


# ------------------------------------------------------------------ systems
#
# A system: ``load_base(base)``, ``apply(files)`` (returns once acknowledged),
# ``lookup(key)`` (a separate reader's view of one key, or None),
# ``maintain() -> {phase: seconds}``, ``content()`` (every live row).


class LanceMergeInsert:
    """A plain Lance table (BTREE on ``id``, like the LSM base); per batch ONE
    ``merge_insert``: update/insert the upserts, and ``when_not_matched_by_source_delete``
    restricted to the deleted keys (a deleted key is not in the source)."""

    def __init__(self, root: Path, config: dict) -> None:
        self.uri = str(root)

    def load_base(self, base: pa.Table) -> None:
        import lance

        lance.write_dataset(base, self.uri).create_scalar_index(KEY, "BTREE")

    def apply(self, files: list[str]) -> None:
        import lance

        dataset = lance.dataset(self.uri)
        for path in files:
            changes = read_resolved(path)
            is_delete = pc.equal(changes[OP], DELETE)
            upserts = values_only(changes.filter(pc.invert(is_delete))).cast(dataset.schema)
            deleted = changes.filter(is_delete)[KEY].to_pylist()
            merge = dataset.merge_insert(KEY).when_matched_update_all().when_not_matched_insert_all()
            if deleted:
                merge = merge.when_not_matched_by_source_delete(f"{KEY} IN ({', '.join(map(str, deleted))})")
            merge.execute(upserts)
            dataset = lance.dataset(self.uri)

    def lookup(self, key: int) -> dict | None:
        import lance

        rows = lance.dataset(self.uri).to_table(columns=VALUE_COLUMNS, filter=f"{KEY} = {key}").to_pylist()
        return rows[0] if rows else None

    def maintain(self) -> dict[str, float]:
        import lance

        return {
            "cleanup_old_versions": timed(
                lambda: lance.dataset(self.uri).cleanup_old_versions(older_than=timedelta(0), retain_versions=1)
            )
        }

    def content(self) -> pa.Table:
        import lance

        return lance.dataset(self.uri).to_table(columns=VALUE_COLUMNS)


class DeltaMerge:
    """A Delta table (delta-rs defaults); per batch one ``merge``: matched and
    delete -> delete, matched -> update, not matched and not delete -> insert."""

    def __init__(self, root: Path, config: dict) -> None:
        self.uri = str(root)
        self.table = None

    def load_base(self, base: pa.Table) -> None:
        from deltalake import DeltaTable, write_deltalake

        write_deltalake(self.uri, base)
        self.table = DeltaTable(self.uri)

    def apply(self, files: list[str]) -> None:
        for path in files:
            source = read_resolved(path).drop_columns([SEQ])
            (
                self.table.merge(source, predicate="t.id = s.id", source_alias="s", target_alias="t")
                .when_matched_delete(predicate=f"s.{OP} = '{DELETE}'")
                .when_matched_update_all(except_cols=[OP])
                .when_not_matched_insert_all(predicate=f"s.{OP} != '{DELETE}'", except_cols=[OP])
                .execute()
            )

    def lookup(self, key: int) -> dict | None:
        from deltalake import DeltaTable

        dataset = DeltaTable(self.uri).to_pyarrow_dataset()
        rows = dataset.to_table(columns=VALUE_COLUMNS, filter=pc.field(KEY) == key).to_pylist()
        return rows[0] if rows else None

    def maintain(self) -> dict[str, float]:
        return {
            "vacuum": timed(
                lambda: self.table.vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False)
            )
        }

    def content(self) -> pa.Table:
        from deltalake import DeltaTable

        return DeltaTable(self.uri).to_pyarrow_table(columns=VALUE_COLUMNS)


class PaimonPrimaryKey:
    """An Apache Paimon primary-key table (pypaimon, filesystem catalog, fixed
    buckets = shards, deduplicate merge engine); per batch one write + commit
    with ``rowkind.field``: '+I' for upserts, '-D' for deletes. pypaimon writes
    level-0 files and has no compaction or snapshot expiry: readers merge."""

    ROWKIND = "_rowkind"

    def __init__(self, root: Path, config: dict) -> None:
        from pypaimon import CatalogFactory

        self.catalog = CatalogFactory.create({"warehouse": root.as_uri()})
        self.buckets = config["shards"]
        self.name = "bench.events"

    def load_base(self, base: pa.Table) -> None:
        from pypaimon import Schema

        schema = pa.schema(
            [pa.field(KEY, pa.int64(), nullable=False), *base.schema.remove(0), (self.ROWKIND, pa.string())]
        )
        self.catalog.create_database("bench", True)
        self.catalog.create_table(
            self.name,
            Schema.from_pyarrow_schema(
                schema, primary_keys=[KEY], options={"bucket": str(self.buckets), "rowkind.field": self.ROWKIND}
            ),
            False,
        )
        self._commit(base.append_column(self.ROWKIND, pa.array(["+I"] * base.num_rows)))

    def apply(self, files: list[str]) -> None:
        for path in files:
            changes = read_resolved(path)
            kinds = pc.if_else(pc.equal(changes[OP], DELETE), "-D", "+I")
            self._commit(values_only(changes).append_column(self.ROWKIND, kinds))

    def _commit(self, rows: pa.Table) -> None:
        table = self.catalog.get_table(self.name)
        rows = rows.cast(pa.schema([pa.field(KEY, pa.int64(), nullable=False), *rows.schema.remove(0)]))
        builder = table.new_batch_write_builder()
        write, commit = builder.new_write(), builder.new_commit()
        write.write_arrow(rows)
        commit.commit(write.prepare_commit())
        write.close()
        commit.close()

    def _read(self, key: int | None = None) -> pa.Table:
        builder = self.catalog.get_table(self.name).new_read_builder()
        if key is not None:
            builder = builder.with_filter(builder.new_predicate_builder().equal(KEY, key))
        return values_only(builder.new_read().to_arrow(builder.new_scan().plan().splits()))

    def lookup(self, key: int) -> dict | None:
        rows = self._read(key).to_pylist()
        return rows[0] if rows else None

    def maintain(self) -> dict[str, float]:
        return {}

    def content(self) -> pa.Table:
        return self._read()


class _LsmSystem:
    """Shared by the platform and the ShardWriter ceiling: an ``LsmTable`` whose
    base holds the base rows (BTREE on ``id`` optimized), a reader of its own
    (fresh merged view: base + generations + WAL tail), and maintenance =
    flush MemTables, merge into the base, GC with no grace periods."""

    def __init__(self, root: Path, config: dict) -> None:
        self.uri = str(root)
        self.shards = config["shards"]
        self.reader = None

    def load_base(self, base: pa.Table) -> None:
        import lance

        from resources.lsm import LsmTable

        table = LsmTable.create(self.uri, base.schema, [KEY], num_shards=self.shards)
        lance.write_dataset(base.cast(table.schema), self.uri, mode="append")
        table.dataset().optimize.optimize_indices()
        self.reader = LsmTable.open(self.uri)

    def lookup(self, key: int) -> dict | None:
        rows = self.reader.lookup([key], columns=VALUE_COLUMNS).to_pylist()
        return rows[0] if rows else None

    def close_writers(self) -> None:
        raise NotImplementedError

    def maintain(self) -> dict[str, float]:
        from resources.lsm import LsmTable

        table = LsmTable.open(self.uri)
        return {
            "flush (close writers)": timed(self.close_writers),
            "flush (other shards)": timed(table.flush),
            "merge into base": timed(table.compact),
            "gc": timed(
                lambda: table.gc(
                    orphan_grace_seconds=0, wal_grace_seconds=0, retain_versions=1, older_than=timedelta(0)
                )
            ),
        }

    def content(self) -> pa.Table:
        from resources.lsm import LsmTable

        return LsmTable.open(self.uri).read(columns=VALUE_COLUMNS)


def spark_session():
    """The platform's session settings on ``local[2]`` (as benchmarks/ingest.py), one per process."""
    from resources.spark import spark_session as platform_session

    session = platform_session("local[2]")
    session.sparkContext.setLogLevel("ERROR")
    return session


class PlatformContinuous(_LsmSystem):
    """This platform: ``ingest_landing_files`` with the shard writers held open
    (continuous mode, as ``continuous_ingest_job``), one landing file per call:
    Spark reads, validates and routes the file, the rows are written durably
    through the open writers, the file is recorded in the ledger."""

    def __init__(self, root: Path, config: dict) -> None:
        super().__init__(root, config)
        self.landing, self.quarantine = config["landing"], str(root.parent / f"{root.name}-quarantine")
        self.spark = spark_session()
        self.writers = None

    def load_base(self, base: pa.Table) -> None:
        from resources.lsm import LsmTable

        super().load_base(base)
        self.writers = LsmTable.open(self.uri)
        self.writers.claim()

    def apply(self, files: list[str]) -> None:
        from resources.lsm.spark.ingest import ingest_landing_files

        report = ingest_landing_files(
            self.spark, self.uri, self.landing, self.quarantine, writers=self.writers, max_files=len(files)
        )
        assert list(report.files) == [Path(f).name for f in files], (report.files, files)

    def close_writers(self) -> None:
        self.writers.close()


class PlatformBacklog(PlatformContinuous):
    """This platform catching up a backlog: ``ingest_landing_files`` in batch
    mode (``ingest_job``) over every pending file in ONE call: Spark tasks
    write each shard and close its writer (which flushes it)."""

    def load_base(self, base: pa.Table) -> None:
        _LsmSystem.load_base(self, base)

    def apply(self, files: list[str]) -> None:
        from resources.lsm.spark.ingest import ingest_landing_files

        report = ingest_landing_files(self.spark, self.uri, self.landing, self.quarantine, max_files=len(files))
        assert list(report.files) == [Path(f).name for f in files], (report.files, files)

    def close_writers(self) -> None:
        pass  # the write tasks closed them


class ShardWriterCeiling(_LsmSystem):
    """The in-process ceiling: each file's rows validated, resolved and routed
    to shards BEFORE the clock (``prepare``); timed are only the durable
    ``ShardWriter.put``/``delete`` calls, one thread per shard, through writers
    held open with the table's settings (5 ms WAL flush)."""

    def __init__(self, root: Path, config: dict) -> None:
        super().__init__(root, config)
        self.writers: dict[str, Any] = {}
        self.work: dict[str, dict[str, Any]] = {}
        self.pool = ThreadPoolExecutor(max_workers=self.shards, thread_name_prefix="shard")

    def prepare(self, files: list[str]) -> None:
        from resources.lsm import LsmTable
        from resources.lsm.table import DEFAULT_WRITER_CONFIG
        from resources.lsm.write.changes import resolve_changes, validate_changes

        table = LsmTable.open(self.uri)
        for path in files:
            valid = validate_changes(pq.read_table(path), table.schema, table.primary_key).valid
            buckets = table.buckets(valid.select(table.primary_key))
            self.work[path] = {
                table.shard_ids[b]: resolve_changes(
                    valid.filter(pa.array(buckets == b)), table.schema, table.primary_key
                )
                for b in np.unique(buckets)
            }
        self.writers = {s: table.dataset().mem_wal_writer(s, **DEFAULT_WRITER_CONFIG) for s in table.shard_ids}

    def apply(self, files: list[str]) -> None:
        for path in files:
            list(self.pool.map(lambda item: self._write(*item), self.work[path].items()))

    def _write(self, shard_id: str, resolved) -> None:
        writer = self.writers[shard_id]
        if resolved.upserts.num_rows:
            writer.put(resolved.upserts)
        if resolved.deletes.num_rows:
            writer.delete(resolved.deletes)

    def close_writers(self) -> None:
        for writer in self.writers.values():
            writer.close()
        self.pool.shutdown()


SYSTEMS: dict[str, type] = {
    "platform": PlatformContinuous,
    "platform-backlog": PlatformBacklog,
    "lance-merge-insert": LanceMergeInsert,
    "delta-merge": DeltaMerge,
    "paimon": PaimonPrimaryKey,
    "shardwriter-ceiling": ShardWriterCeiling,
}
ONE_CALL_FOR_ALL_FILES = {"platform-backlog"}


# ------------------------------------------------------------------ the run

# Driver-side steps of ``ingest_landing_files``, timed for the platform's profile.
INGEST_PHASES = {
    "_write_here": "Spark stage job: read + validate + route + stage files, then the driver "
    "writes the staged files through the open writers",
    "_write_in_tasks": "Spark write job: read + validate + route + stage files, route staged files "
    "by shard, write tasks (put + close)",
}


def profile_ingestion() -> dict[str, float]:
    """Wrap the steps of ``INGEST_PHASES`` with timers; return the dict they add seconds to."""
    from resources.lsm.spark import ingest as spark_ingest

    phases: dict[str, float] = {}
    for name, label in INGEST_PHASES.items():

        def timed_step(*args, _step=getattr(spark_ingest, name), _label=label, **kwargs):  # noqa: B008 (binds this step)
            started = time.perf_counter()
            try:
                return _step(*args, **kwargs)
            finally:
                phases[_label] = phases.get(_label, 0.0) + time.perf_counter() - started

        setattr(spark_ingest, name, timed_step)
    return phases


def groups_of(system: str, files: list[str]) -> list[list[str]]:
    """The files of each apply call: one per call, or all in one for the backlog mode."""
    return [files] if system in ONE_CALL_FOR_ALL_FILES else [[f] for f in files]


def warm_up(system: str, config: dict, base: pa.Table) -> float:
    """Run the first landing file through a scratch instance; return its seconds."""
    scratch = Path(config["workdir"]) / f"{system}-warm-up"
    started = time.perf_counter()
    instance = SYSTEMS[system](scratch, {**config, "landing": _first_file_landing(config, scratch)})
    instance.load_base(base.slice(0, WARM_UP_BASE_ROWS))
    first = [config["files"][0]]
    getattr(instance, "prepare", lambda files: None)(first)
    instance.apply(first)
    instance.lookup(probe_row(first[0])[KEY])
    getattr(instance, "close_writers", lambda: None)()
    seconds = time.perf_counter() - started
    shutil.rmtree(scratch, ignore_errors=True)
    return seconds


def _first_file_landing(config: dict, scratch: Path) -> str:
    """A landing directory holding only the stream's first file (for the scratch table)."""
    landing = scratch.parent / f"{scratch.name}-landing"
    landing.mkdir(parents=True, exist_ok=True)
    first = Path(config["files"][0])
    shutil.copy(first, landing / first.name)
    return str(landing)


def visibility_lag(instance, probe: dict, acknowledged: float) -> float:
    """Seconds from ``acknowledged`` until the reader returns ``probe`` for its key."""
    while instance.lookup(probe[KEY]) != probe:
        if time.perf_counter() - acknowledged > VISIBILITY_TIMEOUT_SECONDS:
            raise TimeoutError(f"key {probe[KEY]} not visible after {VISIBILITY_TIMEOUT_SECONDS}s")
    return time.perf_counter() - acknowledged


def stream(instance, groups: list[list[str]], probed: set[int]) -> tuple[list[float], list[float]]:
    """Apply every group; return each call's seconds and the probed calls' visibility lags."""
    probes = {i: probe_row(groups[i][-1]) for i in probed}
    latencies, lags = [], []
    for i, group in enumerate(groups):
        started = time.perf_counter()
        instance.apply(group)
        acknowledged = time.perf_counter()
        latencies.append(acknowledged - started)
        if i in probes:
            lags.append(visibility_lag(instance, probes[i], acknowledged))
    return latencies, lags


def save_content(instance, path: Path) -> float:
    """Write the system's live rows to ``path``, sorted by key; return the read's seconds."""
    started = time.perf_counter()
    content = instance.content()
    seconds = time.perf_counter() - started
    pq.write_table(content.sort_by(KEY), path)
    return seconds


def run(system: str, config: dict) -> dict:
    base = pq.read_table(config["base"])
    out, root = Path(config["out"]), Path(config["workdir"]) / system
    shutil.rmtree(root, ignore_errors=True)  # a previous round's table
    warm_up_seconds = warm_up(system, config, base)
    ingest_phases = profile_ingestion() if system.startswith("platform") else {}
    instance = SYSTEMS[system](root, config)
    load_seconds = timed(lambda: instance.load_base(base))
    groups = groups_of(system, config["files"])
    getattr(instance, "prepare", lambda files: None)(config["files"])
    probed = {min(i, len(groups) - 1) for i in config["probe_batches"]}
    latencies, lags = stream(instance, groups, probed)
    bytes_after_stream = bytes_on_disk(root)
    read_after_stream = save_content(instance, out / f"{system}-after-stream.parquet")
    maintenance = instance.maintain()
    return {
        "system": system,
        "warm_up_seconds": warm_up_seconds,
        "load_base_seconds": load_seconds,
        "batch_seconds": latencies,
        "visibility_seconds": lags,
        "maintenance_seconds": maintenance,
        "ingest_phases_seconds": {
            **ingest_phases,
            "driver: list files, ledger, the rest": sum(latencies) - sum(ingest_phases.values()),
        }
        if ingest_phases
        else {},
        "bytes_after_stream": bytes_after_stream,
        "bytes_after_maintenance": bytes_on_disk(root),
        "read_after_stream_seconds": read_after_stream,
        "read_after_maintenance_seconds": save_content(instance, out / f"{system}-after-maintenance.parquet"),
        "versions": library_versions(),
    }


def library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("pylance", "pyarrow", "pyspark", "deltalake", "pypaimon"):
        with contextlib.suppress(PackageNotFoundError):
            found[name] = version(name)
    return found


def main(argv: list[str]) -> int:
    system, config_path = argv
    config = json.loads(Path(config_path).read_text())
    sys.path.insert(0, str(REPO))
    os.chdir(config["workdir"])
    result = run(system, config)
    (Path(config["out"]) / f"{system}.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
