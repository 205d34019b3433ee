"""Merge cost against base size: join-free merge vs the merge_insert fallback vs plain Lance.

    .venv/bin/python benchmarks/merge_cost.py                      # int64 key, 2Mi and 64Mi rows
    .venv/bin/python benchmarks/merge_cost.py --kinds int64,string,composite --sizes 67108864

For each key kind and base size (templates shared with ``benchmarks/scale.py``
under ``--data``, cloned by hard links per attempt) the same change volume is
merged: 4 flushed generations of 50k random-key upserts per generation write
(200k changes, 4 shards). Measured on fresh clones, side by side in one run:

* ``join_free_s``: ``LsmTable.compact(maintenance=None)`` with the pending runs
  built (as the flush job leaves them): the data commit (deletion files + new
  fragments + claim) and the marker commit; each also timed on its own;
* ``fallback_s``: the same merge with no runs stored: ``merge_insert`` computes
  the data commit with its hash join against the base;
* ``lance_merge_insert_s``: one plain ``merge_insert`` of the same resolved rows
  into the same base (Lance's defaults);
* ``index_upkeep_s``: the base upkeep after the join-free merge (the key
  BTREE indexes the new rows as a delta segment), then a check that the key
  index finds 1,000 of the merged rows with their new values;
* ``build_runs_s``: building the pending runs (off the write path, before the merge).

Results: ``benchmarks/results/merge_cost.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.scale import GENERATION_ROWS, GENERATIONS, KEYS, clone, plain_merge, rows_for, template
from resources.lsm import LsmTable
from resources.lsm.maintenance import compaction
from resources.lsm.maintenance.compaction import MaintenancePolicy, maintain_base
from resources.lsm.read.dedup import keep_last_per_key

RESULTS = Path(__file__).resolve().parent / "results"


class CommitTimer:
    """Adds up the time of the compaction's data and marker commits (patched in for the benchmark only)."""

    def __init__(self) -> None:
        self.seconds = {"data_commit_s": 0.0, "marker_commit_s": 0.0}
        self._originals = (compaction.data_from_runs, compaction.commit_data, compaction.commit_marker)

    def __enter__(self) -> CommitTimer:
        data_from_runs, commit_data, commit_marker = self._originals
        compaction.data_from_runs = self._timed(data_from_runs, "data_commit_s")
        compaction.commit_data = self._timed(commit_data, "data_commit_s")
        compaction.commit_marker = self._timed(commit_marker, "marker_commit_s")
        return self

    def __exit__(self, *exc: object) -> None:
        compaction.data_from_runs, compaction.commit_data, compaction.commit_marker = self._originals

    def _timed(self, call: Callable[..., Any], name: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - started

        return timed


def write_changes(table: LsmTable, kind: str, rows: int, seed: int) -> pa.Table:
    """Flush ``GENERATIONS`` generations of random-key upserts; the resolved rows they hold."""
    rng = np.random.default_rng(seed)
    batches = [rows_for(kind, rng.integers(0, rows, GENERATION_ROWS), rng) for _ in range(GENERATIONS)]
    for batch in batches:
        table.write(batch)
        table.close()
    return keep_last_per_key(pa.concat_tables(batches), KEYS[kind])


def index_finds_merged_rows(table: LsmTable, kind: str, upserts: pa.Table) -> bool:
    """The base's key index answers an ``IN`` query for 1,000 merged keys with their merged values."""
    key = KEYS[kind]
    sample = upserts.slice(0, 1000)
    base = table.dataset()
    if len(key) == 1:
        literals = ", ".join(repr(v) if isinstance(v, str) else str(v) for v in sample.column(key[0]).to_pylist())
        found = base.to_table(filter=f"{key[0]} IN ({literals})")
    else:
        found = table.lookup(sample.select(key))
    expected = {tuple(r[k] for k in key): r for r in sample.to_pylist()}
    got = {tuple(r[k] for k in key): r for r in found.select(sample.column_names).to_pylist()}
    return got == expected


def attempt(data: Path, kind: str, rows: int, seed: int) -> dict[str, float]:
    source = template(data, kind, rows)
    sample: dict[str, float] = {}
    table = LsmTable.open(str(clone(source, data / "run-merge.lance")))
    upserts = write_changes(table, kind, rows, seed)
    started = time.perf_counter()
    table.build_pending_runs()
    sample["build_runs_s"] = time.perf_counter() - started
    with CommitTimer() as timer:
        result = table.compact(maintenance=None)
    assert all(s.join_free_passes == s.passes == 1 for s in result.shards), result
    sample |= {"join_free_s": result.elapsed_seconds} | timer.seconds
    started = time.perf_counter()
    maintain_base(table.handle.storage, table.dataset(), MaintenancePolicy())
    sample["index_upkeep_s"] = time.perf_counter() - started
    assert index_finds_merged_rows(table, kind, upserts), "the key index lost merged rows"

    fallback = LsmTable.open(str(clone(source, data / "run-merge.lance")))
    write_changes(fallback, kind, rows, seed)  # no runs built: the merge must join
    result = fallback.compact(maintenance=None)
    assert not any(s.join_free_passes for s in result.shards)
    sample["fallback_s"] = result.elapsed_seconds
    sample["lance_merge_insert_s"] = plain_merge_keyed(clone(source, data / "run-plain.lance"), upserts, KEYS[kind])
    return sample


def plain_merge_keyed(uri: Path, upserts: pa.Table, key: list[str]) -> float:
    if key == ["id"]:
        return plain_merge(uri, upserts, True)
    dataset = lance.dataset(str(uri))
    builder = dataset.merge_insert(key).when_matched_update_all().when_not_matched_insert_all()
    rows = upserts.cast(dataset.schema)
    started = time.perf_counter()
    builder.execute(rows)
    return time.perf_counter() - started


def measure(data: Path, kind: str, rows: int, repeat: int) -> dict[str, Any]:
    samples = [attempt(data, kind, rows, seed=rows + 7 * n) for n in range(repeat)]
    result: dict[str, Any] = {"kind": kind, "rows": rows, "changes": GENERATIONS * GENERATION_ROWS}
    result |= {name: statistics.median(s[name] for s in samples) for name in samples[0]}
    fragments = len(lance.dataset(str(template(data, kind, rows))).get_fragments())
    result["base_fragments"] = fragments
    print(json.dumps(result), flush=True)
    return result


def render(results: list[dict[str, Any]]) -> str:
    lines = [
        "| key | base rows | fragments | join-free merge | data commit | marker commit | fallback (hash join) "
        "| plain merge_insert | index upkeep | build runs |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r['kind']} | {r['rows'] / 2**20:.0f}Mi | {r['base_fragments']} | {r['join_free_s']:.3f} s "
        f"| {r['data_commit_s']:.3f} s | {r['marker_commit_s']:.3f} s | {r['fallback_s']:.3f} s "
        f"| {r['lance_merge_insert_s']:.3f} s | {r['index_upkeep_s']:.3f} s | {r['build_runs_s']:.3f} s |"
        for r in results
    ]
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        by_kind.setdefault(r["kind"], []).append(r)
    for kind, sized in by_kind.items():
        if len(sized) > 1:
            small, large = min(sized, key=lambda r: r["rows"]), max(sized, key=lambda r: r["rows"])
            lines.append(
                f"\n{kind}: join-free merge at {large['rows'] / 2**20:.0f}Mi rows = "
                f"{large['join_free_s'] / small['join_free_s']:.2f}x the merge at {small['rows'] / 2**20:.0f}Mi "
                f"(fallback: {large['fallback_s'] / small['fallback_s']:.2f}x)."
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=Path("/work/bench-data"), help="where templates live")
    parser.add_argument("--kinds", default="int64", help="comma-separated: int64,string,composite")
    parser.add_argument("--sizes", default=f"{2 << 20},{64 << 20}", help="comma-separated base sizes (rows)")
    parser.add_argument("--repeat", type=int, default=3, help="attempts per size (medians reported)")
    parser.add_argument("--name", default="merge_cost", help="results file name under benchmarks/results/")
    args = parser.parse_args()
    args.data.mkdir(parents=True, exist_ok=True)
    results = [
        measure(args.data, kind, int(rows), args.repeat)
        for kind in args.kinds.split(",")
        for rows in args.sizes.split(",")
    ]
    (RESULTS / f"{args.name}.json").write_text(json.dumps(results, indent=2) + "\n")
    (RESULTS / f"{args.name}.md").write_text(render(results))
    print(render(results))


if __name__ == "__main__":
    main()
