"""Benchmark CDC decoding: a Debezium JSON Lines landing file against the same changes as plain JSON Lines.

    .venv/bin/python benchmarks/cdc.py            # 100k changes, 5 rounds
    .venv/bin/python benchmarks/cdc.py --quick    # 20k changes, 3 rounds

One change stream (``testing/changegen``) is written twice: as a plain JSON
Lines landing file (the table's columns, ``_op``, ``_seq``) and as Debezium
envelopes with the ``schema``/``payload`` wrapper (``_seq`` as
``source.lsn``). Each round reads and validates both, side by side
(``read_landing_file`` + ``validate_changes``, what a Spark stage task does
per file); the medians and their ratio are printed. Both must yield the same
validated changes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from resources.lsm.format.schema import DELETE, OP_COLUMN, SEQ_COLUMN
from resources.lsm.ingest.cdc import CdcFormat
from resources.lsm.ingest.landing import read_landing_file
from resources.lsm.testing.changegen import EVENTS_SCHEMA, ChangeStreamSpec, generate_changes
from resources.lsm.write.changes import validate_changes


def write_files(changes: pa.Table, directory: Path) -> tuple[Path, Path]:
    """The changes as a plain JSON Lines file and as a Debezium one."""
    plain, debezium = directory / "plain.jsonl", directory / "debezium.jsonl"
    rows = changes.to_pylist()
    plain.write_text("".join(json.dumps(r) + "\n" for r in rows))
    debezium.write_text("".join(json.dumps(_envelope(r)) + "\n" for r in rows))
    return plain, debezium


def _envelope(row: dict[str, object]) -> dict[str, object]:
    values = {k: v for k, v in row.items() if k not in (OP_COLUMN, SEQ_COLUMN)}
    before, after = (values, None) if row[OP_COLUMN] == DELETE else (None, values)
    payload = {"op": "d" if row[OP_COLUMN] == DELETE else "u", "before": before, "after": after}
    return {"schema": {"type": "struct"}, "payload": {**payload, "source": {"lsn": row[SEQ_COLUMN]}, "ts_ms": 0}}


def timed_read(path: Path, cdc: CdcFormat | None) -> tuple[float, pa.Table]:
    started = time.perf_counter()
    read = read_landing_file(str(path), cdc=cdc)
    valid = validate_changes(read.table, EVENTS_SCHEMA, ["id"]).valid
    return time.perf_counter() - started, valid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rows, rounds = (20_000, 3) if args.quick else (100_000, 5)
    spec = ChangeStreamSpec(num_keys=rows // 2, num_batches=1, batch_size=rows, seed=3)
    changes = next(iter(generate_changes(spec)))
    with tempfile.TemporaryDirectory() as directory:
        plain, debezium = write_files(changes, Path(directory))
        times: dict[str, list[float]] = {"plain": [], "debezium": []}
        for _ in range(rounds):
            seconds, plain_valid = timed_read(plain, None)
            times["plain"].append(seconds)
            seconds, dbz_valid = timed_read(debezium, CdcFormat("debezium"))
            times["debezium"].append(seconds)
        # Same changes, same order of application (_seq ranks preserve the LSN order).
        key = ["id", SEQ_COLUMN]
        assert (
            plain_valid.sort_by([(k, "ascending") for k in key])
            .select(["id", OP_COLUMN])
            .equals(dbz_valid.sort_by([(k, "ascending") for k in key]).select(["id", OP_COLUMN]))
        )
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, seconds in medians.items():
        print(f"{name:9s} {rows:,} changes: {seconds:.3f} s median of {rounds} ({rows / seconds:,.0f} rows/s)")
    print(f"debezium / plain: {medians['debezium'] / medians['plain']:.2f}x the time")


if __name__ == "__main__":
    main()
