"""What a point lookup pays to ask the pending generations' bloom filters which of them may hold its keys.

    .venv/bin/python benchmarks/bloom_filters.py

A one-shard table with 16 flushed generations of ``--generation-rows``
random int64 keys; ``GenerationFilters.candidate_keys`` over the newest 1, 4
and 16 generations for 1, 10 and 1,000 keys at a time (filters cached, as
in a warm reader), the best of ``--repeat`` rounds of ``--calls`` calls.

Results: ``benchmarks/results/bloom_filters.{json,md}`` (``--out``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.scale import save_results
from resources.lsm import LsmTable

RESULTS = Path(__file__).resolve().parent / "results"
GENERATIONS = (1, 4, 16)
KEYS = (1, 10, 1000)


def table_with_generations(uri: str, rows: int) -> LsmTable:
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.float64())])
    table = LsmTable.create(uri, schema, ["id"], num_shards=1)
    rng = np.random.default_rng(1)
    for _ in range(GENERATIONS[-1]):
        ids = rng.integers(0, 1 << 40, rows)
        table.write(pa.table({"id": ids, "v": rng.random(rows)}))
        table.close()
    return LsmTable.open(uri)


def microseconds_per_call(table: LsmTable, generations: int, keys: int, calls: int, repeat: int) -> float:
    shard = table.handle.shard_states()[0]
    pending = shard.pending_generations[-generations:]
    filters = table.handle.generation_filters
    batches = [[(int(k),) for k in np.arange(i * keys, (i + 1) * keys)] for i in range(calls)]
    filters.candidate_keys(shard.shard_id, pending, batches[0])  # filters loaded and checked once
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for batch in batches:
            filters.candidate_keys(shard.shard_id, pending, batch)
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def render(results: dict) -> str:
    lines = [
        "# Bloom-filter checks of a point lookup",
        "",
        f"`benchmarks/bloom_filters.py`: one shard, generations of {results['generation_rows']:,} random int64 "
        "keys, filters cached; microseconds per `candidate_keys` call (best of the rounds).",
        "",
        "| generations \\ keys per call | " + " | ".join(f"{k:,}" for k in KEYS) + " |",
        "| ---: | " + " | ".join("---:" for _ in KEYS) + " |",
    ]
    for generations in GENERATIONS:
        cells = (f"{results['us_per_call'][f'{generations}_gens_{k}_keys']:.0f} us" for k in KEYS)
        lines.append(f"| {generations} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--generation-rows", type=int, default=20_000, help="keys per generation")
    parser.add_argument("--calls", type=int, default=1000, help="calls per round")
    parser.add_argument("--repeat", type=int, default=5, help="rounds (the best is kept)")
    parser.add_argument("--out", type=Path, default=RESULTS / "bloom_filters", help="results path without suffix")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bloom-filters-") as scratch:
        table = table_with_generations(f"{scratch}/t.lance", args.generation_rows)
        timings = {
            f"{generations}_gens_{keys}_keys": microseconds_per_call(
                table, generations, keys, max(args.calls // keys, 10), args.repeat
            )
            for generations in GENERATIONS
            for keys in KEYS
        }
    results = {"generation_rows": args.generation_rows, "us_per_call": timings}
    save_results(results, render(results), args.out)


if __name__ == "__main__":
    main()
