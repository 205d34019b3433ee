"""Scans of a base whose fragments carry deletion files: the merged scan against plain Lance on the same base.

    .venv/bin/python benchmarks/deleted_rows.py --kinds string              # 64Mi rows; 0, 1, 10, 30% deleted
    .venv/bin/python benchmarks/deleted_rows.py --rows 1048576 --kinds int64 --repeat 1   # smoke run

Every merge deletes the base rows its updates and deletes supersede (a
deletion file per fragment), and a tidy-up rewrites them only past 10% of
the base. Per key kind, on a base of ``--rows`` rows (``benchmarks/scale.py``'s
tables, cloned by hard links) with ``--deleted`` fractions of every
fragment's rows deleted at random (one Lance delete commit, nothing pending),
in alternating pairs (``--repeat``): the merged scan (``LsmTable.scanner()``
drained: it reads the deleted rows and drops them by position) against
Lance's ``to_batches()`` (which applies the deletion files), wall and CPU
seconds.

Results: ``benchmarks/results/deleted_rows.{json,md}`` (``--out``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lance
import numpy as np
from lance import LanceOperation

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.scale import (
    add_base_arguments,
    alternating_wall_and_cpu,
    clone,
    drain,
    on_each_base,
    save_results,
    template,
)
from resources.lsm import LsmTable


def delete_at_random(uri: str, fraction: float, rng: np.random.Generator) -> None:
    """Delete ``fraction`` of every fragment's rows, in one commit (as merges leave them, without the merges)."""
    dataset = lance.dataset(uri)
    updated = [
        fragment.delete_rows(
            np.sort(rng.choice(fragment.physical_rows, int(fragment.physical_rows * fraction), replace=False)).tolist()
        )
        for fragment in dataset.get_fragments()
    ]
    lance.LanceDataset.commit(uri, LanceOperation.Delete(updated, [], "random rows"), read_version=dataset.version)


def scans(uri: str, repeat: int) -> dict[str, float]:
    """Medians of the merged scan and Lance's scan, in alternating pairs (each side first in turn)."""
    table, base = LsmTable.open(uri), lance.dataset(uri)
    sides: dict[str, Callable[[], object]] = {
        "merged": lambda: drain(table.scanner()),
        "lance": lambda: drain(base.to_batches()),
    }
    return {"rows": base.count_rows(), **alternating_wall_and_cpu(sides, repeat)}


def measure(kind: str, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    states = {}
    for fraction in args.deleted:
        uri = str(clone(template(args.data, kind, args.rows), scratch / f"{kind}-{fraction}.lance"))
        if fraction:
            delete_at_random(uri, fraction, np.random.default_rng(3))
        states[str(fraction)] = scans(uri, args.repeat)
        print(kind, fraction, states[str(fraction)], flush=True)
        shutil.rmtree(uri, ignore_errors=True)
    return states


def render(results: dict[str, Any]) -> str:
    lines = [
        "# Scans of a base with deleted rows",
        "",
        f"`benchmarks/deleted_rows.py`, bases of {results['rows']:,} rows, a fraction of every fragment's rows "
        "deleted at random, nothing pending. Merged scan (reads the deleted rows, drops them by position) "
        "against Lance's `to_batches()` (applies the deletion files), medians of alternating pairs.",
        "",
        "| key | deleted | merged scan wall / CPU | Lance scan wall / CPU | merged / Lance (wall, CPU) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for kind, states in results["kinds"].items():
        for fraction, r in states.items():
            lines.append(
                f"| {kind} | {float(fraction):.0%} | {r['merged_s']:.2f} / {r['merged_cpu_s']:.2f} s "
                f"| {r['lance_s']:.2f} / {r['lance_cpu_s']:.2f} s "
                f"| {r['merged_s'] / r['lance_s']:.2f}x, {r['merged_cpu_s'] / r['lance_cpu_s']:.2f}x |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_base_arguments(parser, "deleted_rows")
    parser.add_argument("--deleted", type=float, nargs="+", default=[0.0, 0.01, 0.1, 0.3], help="fractions deleted")
    parser.add_argument("--repeat", type=int, default=3, help="alternating pairs")
    args = parser.parse_args()
    results: dict[str, Any] = {
        "rows": args.rows,
        "kinds": on_each_base(args, lambda uri, kind, scratch: measure(kind, args, scratch)),
    }
    save_results(results, render(results), args.out)


if __name__ == "__main__":
    main()
