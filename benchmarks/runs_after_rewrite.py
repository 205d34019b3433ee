"""Pending runs after a rewrite of base fragments: moved rows' keys joined, then followed by the next build.

    .venv/bin/python benchmarks/runs_after_rewrite.py --kinds string        # 64Mi rows, 2 fragments rewritten
    .venv/bin/python benchmarks/runs_after_rewrite.py --rows 4194304 --kinds int64 --repeat 1   # smoke run

A file compaction (``compact_files``: small fragments, or fragments with many
rows deleted) gives the rows of the fragments it rewrites new addresses and
leaves every other row where it was. Per key kind, on a base of ``--rows`` rows
(``benchmarks/scale.py``'s tables, cloned by hard links), 4 shards:
``--generations`` writes of ``--generation-rows`` random upserts (one
generation per shard each) with their runs built, then ``--rewritten``
fragments of the base rewritten into one. From that state, in alternating
pairs (``--repeat``), side by side:

- the merged scan (``LsmTable.scanner()`` drained: wall and CPU seconds) as
  the runs are read now (a row of a run is trusted while its fragment is in
  the base: only the keys whose row moved are joined) and under the rule
  before it (a run pointing into any rewritten fragment was not trusted at
  all: every key of it joined), and the base scan;
- the next build of the runs: now (the rows that moved followed to their new
  addresses through the tidy-up's record of its rewrite, no key looked up),
  with the keys whose row moved looked up again instead (the rule before
  following), and under the whole-run rule (every key looked up again).

``--rewritten N`` rewrites with Lance's own compaction, which leaves no
record: its moved rows are looked up either way. ``--rewritten 0`` rewrites
the whole base instead, as the tidy-ups that random upserts bring on do,
through a merge's tidy-up (``maintain_base``: neighbouring fragments merged
in pairs), which records where it put the rows.

Results: ``benchmarks/results/runs_after_rewrite.{json,md}`` (``--out``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.runs_after_merge import write
from benchmarks.scale import add_base_arguments, alternating_wall_and_cpu, drain, on_each_base, save_results
from resources.lsm import LsmTable, MaintenancePolicy
from resources.lsm.format.layout import RUNS_DIR
from resources.lsm.maintenance.compaction import maintain_base
from resources.lsm.read import pending_run
from resources.lsm.read.key_hash_files import key_files, write_missing_key_hashes
from resources.lsm.read.merged_read import resolve_levels
from resources.lsm.read.pending_run import PendingRun


@contextmanager
def whole_run_rule() -> Iterator[None]:
    """Runs read as before per-row trust: a run pointing into any fragment the base lacks loses every base row."""
    held_in = PendingRun.held_in

    def whole(run: PendingRun, fragments: set[int] | frozenset[int]) -> PendingRun:
        if run.superseded.holds_in(fragments):
            return run
        return PendingRun(run.shard_id, run.generations, run.changes, pa.nulls(len(run.base_rows), pa.uint64()))

    PendingRun.held_in = whole  # type: ignore[method-assign]
    try:
        yield
    finally:
        PendingRun.held_in = held_in  # type: ignore[method-assign]


@contextmanager
def moved_rows_looked_up() -> Iterator[None]:
    """Builds as before they followed moved rows through the rewrite: every row that moved is looked up again."""
    follow = pending_run.follow_moved_rows
    pending_run.follow_moved_rows = lambda storage, dataset, fragments, addresses: pa.nulls(len(addresses), pa.uint64())  # type: ignore[assignment]
    try:
        yield
    finally:
        pending_run.follow_moved_rows = follow  # type: ignore[assignment]


RULES: dict[str, Callable[[], AbstractContextManager[None]]] = {
    "now": nullcontext,
    "looked_up": moved_rows_looked_up,
    "whole_run": whole_run_rule,
}
"""How a build treats the rows of runs a rewrite moved: followed, looked up again, or every key looked up."""


def rewrite_whole_base(uri: str) -> list[int]:
    """Rewrite every base fragment through a tidy-up, neighbours merged in pairs; the ids of those rewritten."""
    table = LsmTable.open(uri)
    dataset = table.dataset()
    fragments = dataset.get_fragments()
    pairs = 2 * max(f.metadata.physical_rows for f in fragments)
    policy = MaintenancePolicy(max_small_fragments=0, small_fragment_rows=pairs, target_fragment_rows=pairs)
    maintain_base(table.handle.storage, dataset, policy)
    _store_key_indexes(table)
    return [f.fragment_id for f in fragments]


def rewrite_first(uri: str, count: int) -> list[int]:
    """Rewrite the base's first ``count`` fragments into one (as ``compact_files`` does small ones); their ids.

    Then stores the new fragment's key files.
    """
    table = LsmTable.open(uri)
    dataset = table.dataset()
    fragments = dataset.get_fragments()
    if len(fragments) <= count:
        raise SystemExit(f"a base of {len(fragments)} fragments: more than --rewritten {count} are needed")
    rewritten = [f.fragment_id for f in fragments[:count]]
    dataset.optimize.compact_files(
        target_rows_per_fragment=sum(f.physical_rows for f in fragments[:count]) + 1,
        materialize_deletions=False,
        excluded_fragment_ids=[f.fragment_id for f in fragments[count:]],
    )
    assert not set(rewritten) & {f.fragment_id for f in table.dataset().get_fragments()}
    _store_key_indexes(table)
    return rewritten


def _store_key_indexes(table: LsmTable) -> None:
    """The rewritten fragments' key files, stored as a merge's tidy-up stores them."""
    after = table.dataset()
    write_missing_key_hashes(
        table.handle.storage, after, list(table.primary_key), key_files(table.handle.storage, after)
    )


def scans(uri: str, repeat: int) -> dict[str, float]:
    """Merged scans now and under the whole-run rule, and base scans, in alternating order: medians."""
    sides: dict[str, Callable[[], object]] = {
        "now_scan": lambda: drain(LsmTable.open(uri).scanner()),
        "whole_run_scan": lambda: _under_whole_run_rule(lambda: drain(LsmTable.open(uri).scanner())),
        "base_scan": lambda: drain(lance.dataset(uri).to_batches()),
    }
    sides["now_scan"]()  # warm: the rewritten fragment's key index mapped, the base's pages read
    return alternating_wall_and_cpu(sides, repeat)


def _under_whole_run_rule(work: Callable[[], object]) -> object:
    with whole_run_rule():
        return work()


def joined_keys(uri: str, whole_run: bool) -> int:
    """Keys a scan of the table drops by key (no vector holds their row)."""
    table = LsmTable.open(uri)
    with whole_run_rule() if whole_run else nullcontext():
        return resolve_levels(table.handle.snapshot(fresh=True), list(table.primary_key)).joined_keys.num_rows


def rebuild_seconds(uri: str, runs: Path, rule: str) -> float:
    """Restore the runs stored before the rewrite, then build them again under ``rule`` (:data:`RULES`)."""
    live = Path(uri, RUNS_DIR)
    shutil.rmtree(live, ignore_errors=True)
    shutil.copytree(runs, live)
    table = LsmTable.open(uri)
    with RULES[rule]():
        started = time.perf_counter()
        table.build_pending_runs()
        return time.perf_counter() - started


def measure(uri: str, kind: str, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    write(LsmTable.open(uri), kind, args.rows, args.generations, args.generation_rows, np.random.default_rng(17))
    runs = scratch / f"{kind}-runs"
    shutil.copytree(Path(uri, RUNS_DIR), runs)
    started = time.perf_counter()
    rewritten = rewrite_first(uri, args.rewritten) if args.rewritten else rewrite_whole_base(uri)
    result: dict[str, Any] = {
        "fragments_rewritten": len(rewritten),
        "rewrite_s": time.perf_counter() - started,
        "joined_keys_now": joined_keys(uri, whole_run=False),
        "joined_keys_whole_run": joined_keys(uri, whole_run=True),
        **scans(uri, args.repeat),
    }
    rebuild_seconds(uri, runs, "now")  # warm: the first build writes the new fragment's key files
    builds: dict[str, list[float]] = {rule: [] for rule in RULES}
    for round_ in range(args.repeat):
        for rule in list(RULES)[round_ % len(RULES) :] + list(RULES)[: round_ % len(RULES)]:
            builds[rule].append(rebuild_seconds(uri, runs, rule))
    result |= {f"rebuild_{rule}_s": statistics.median(seconds) for rule, seconds in builds.items()}
    print(kind, result, flush=True)
    return result


def render(results: dict[str, Any]) -> str:
    lines = [
        "# Pending runs after a rewrite of base fragments",
        "",
        f"`benchmarks/runs_after_rewrite.py`, base of {results['rows']:,} rows, 4 shards, runs over "
        f"{results['generations']} writes of {results['generation_rows']:,} random upserts, then "
        f"{results['rewritten'] or 'all'} base fragments rewritten (all: by a tidy-up, in pairs; else into one). "
        "Now: a run's row is trusted while its fragment is in the base, and the next build follows the rows a "
        "recorded rewrite moved; before: a run pointing into a rewritten fragment was not trusted at all. "
        "Medians of alternating runs from the same state (scans: wall / CPU seconds).",
        "",
        "| key | keys joined now / before | merged scan now | merged scan before | base scan "
        "| now / base (wall, CPU) | next build: moved rows followed / looked up / every key looked up |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for kind, r in results["kinds"].items():
        lines.append(
            f"| {kind} | {r['joined_keys_now']:,} / {r['joined_keys_whole_run']:,} "
            f"| {r['now_scan_s']:.2f} / {r['now_scan_cpu_s']:.2f} s "
            f"| {r['whole_run_scan_s']:.2f} / {r['whole_run_scan_cpu_s']:.2f} s "
            f"| {r['base_scan_s']:.2f} / {r['base_scan_cpu_s']:.2f} s "
            f"| {r['now_scan_s'] / r['base_scan_s']:.2f}x, {r['now_scan_cpu_s'] / r['base_scan_cpu_s']:.2f}x "
            f"| {r['rebuild_now_s']:.2f} / {r.get('rebuild_looked_up_s', float('nan')):.2f} "
            f"/ {r['rebuild_whole_run_s']:.2f} s |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_base_arguments(parser, "runs_after_rewrite")
    parser.add_argument("--generations", type=int, default=16, help="writes with runs before the rewrite")
    parser.add_argument("--generation-rows", type=int, default=50_000, help="upserts per write")
    parser.add_argument(
        "--rewritten", type=int, default=2, help="base fragments rewritten into one (0: the whole base, a tidy-up)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="alternating rounds")
    args = parser.parse_args()
    results: dict[str, Any] = {
        "rows": args.rows,
        "generations": args.generations,
        "generation_rows": args.generation_rows,
        "rewritten": args.rewritten,
        "kinds": on_each_base(args, lambda uri, kind, scratch: measure(uri, kind, args, scratch)),
    }
    save_results(results, render(results), args.out)


if __name__ == "__main__":
    main()
