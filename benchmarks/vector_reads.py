"""Merged scans of a table with a vector column while generations wait without runs.

    .venv/bin/python benchmarks/vector_reads.py                       # 16Mi rows, 32-d vectors
    .venv/bin/python benchmarks/vector_reads.py --rows 1048576 --repeat 1   # smoke run
    .venv/bin/python benchmarks/revisions.py --before <rev> vector_reads -- --rows 4194304

A base of ``--rows`` rows (string keys, a float and a ``--dims``-d
float32 vector), 4 shards, then 1, 4 and 16 generations of
``--generation-rows`` random upserts with their pending runs deleted: every
pending key must be dropped from the base by key. A vector column cannot go
through Arrow's hash join, so these scans are the ones that find the keys'
rows ahead of the scan, through the base fragments' stored key hashes
(``stored_hash_rows.StoredHashRows``; the base is given them as a merge
gives them). Measured side by
side with plain Lance on the same base (medians of ``--repeat`` alternating
pairs): the merged scan (``LsmTable.scanner()`` drained, warm table object)
against the base's ``to_batches()``, wall and CPU seconds.

Results: ``benchmarks/results/vector_reads.{json,md}`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.scale import drain, paired, save_results, wall_and_cpu
from resources.lsm import LsmTable
from resources.lsm.format.layout import RUNS_DIR

RESULTS = Path(__file__).resolve().parent / "results"
PENDING = (1, 4, 16)
SHARDS = 4
CHUNK = 1 << 20


def schema(dims: int) -> pa.Schema:
    return pa.schema(
        [pa.field("sid", pa.string(), nullable=False), ("score", pa.float32()), ("vec", pa.list_(pa.float32(), dims))]
    )


def rows_for(ids: np.ndarray, dims: int, rng: np.random.Generator) -> pa.Table:
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(len(ids) * dims, dtype=np.float32)), dims)
    columns = [pa.array(np.char.add("k", ids.astype(str))), pa.array(rng.random(len(ids), dtype=np.float32)), vectors]
    return pa.Table.from_arrays(columns, schema=schema(dims))


def build_base(uri: str, rows: int, dims: int) -> LsmTable:
    """An LSM table whose base holds ``rows`` rows and nothing is pending."""
    table = LsmTable.create(uri, schema(dims), ["sid"], num_shards=SHARDS)
    rng = np.random.default_rng(rows)

    def batches() -> Iterator[pa.RecordBatch]:
        for start in range(0, rows, CHUNK):
            yield from rows_for(np.arange(start, min(start + CHUNK, rows)), dims, rng).to_batches()

    lance.write_dataset(pa.RecordBatchReader.from_batches(table.schema, batches()), uri, mode="append")
    table = LsmTable.open(uri)
    table.build_pending_runs()  # stores the fragments' key hashes, as the merges that wrote a base do
    return table


def scans(uri: str, repeat: int) -> dict[str, float]:
    table, base = LsmTable.open(uri), lance.dataset(uri)
    merged, plain = paired(lambda: drain(table.scanner()), lambda: drain(base.to_batches()), repeat)
    merged_cpu = min(wall_and_cpu(lambda: drain(table.scanner()))[1] for _ in range(repeat))
    plain_cpu = min(wall_and_cpu(lambda: drain(base.to_batches()))[1] for _ in range(repeat))
    return {
        "merged_scan_s": merged,
        "base_scan_s": plain,
        "scan_ratio": merged / plain,
        "merged_scan_cpu_s": merged_cpu,
        "base_scan_cpu_s": plain_cpu,
    }


def render(results: dict) -> str:
    lines = [
        "# Merged scans of a table with a vector column, pending generations without runs",
        "",
        f"`benchmarks/vector_reads.py`: base of {results['rows']:,} rows (string key, a float, a "
        f"{results['dims']}-d float32 vector), {SHARDS} shards, generations of {results['generation_rows']:,} "
        "random upserts, runs deleted; medians of alternating pairs against plain Lance on the same base "
        "(CPU: the best of the repeats).",
        "",
        "| pending gens/shard | merged scan | base scan | ratio | merged CPU | base CPU |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for pending, r in results["pending"].items():
        lines.append(
            f"| {pending} | {r['merged_scan_s']:.2f} s | {r['base_scan_s']:.2f} s | {r['scan_ratio']:.2f}x "
            f"| {r['merged_scan_cpu_s']:.2f} s | {r['base_scan_cpu_s']:.2f} s |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=16 << 20, help="base rows (default 16Mi)")
    parser.add_argument("--dims", type=int, default=32, help="vector dimensions")
    parser.add_argument("--generation-rows", type=int, default=50_000, help="upserts per generation write")
    parser.add_argument("--repeat", type=int, default=3, help="alternating pairs per measurement")
    parser.add_argument("--out", type=Path, default=RESULTS / "vector_reads", help="results path without suffix")
    args = parser.parse_args()
    results: dict = {"rows": args.rows, "dims": args.dims, "generation_rows": args.generation_rows, "pending": {}}
    scratch = Path(tempfile.mkdtemp(prefix="vector-reads-"))
    try:
        uri = str(scratch / "t.lance")
        table, rng, cut = build_base(uri, args.rows, args.dims), np.random.default_rng(7), 0
        for pending in PENDING:
            for _ in range(pending - cut):
                table.write(rows_for(rng.integers(0, args.rows, args.generation_rows), args.dims, rng))
                table.close()
            cut = pending
            table.handle.storage.delete_dir(RUNS_DIR)
            results["pending"][str(pending)] = scans(uri, args.repeat)
            print(pending, json.dumps(results["pending"][str(pending)], default=lambda v: round(v, 3)), flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    save_results(results, render(results), args.out)


if __name__ == "__main__":
    main()
