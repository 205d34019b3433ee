"""The change feed and time travel at scale, side by side with the full reads they replace.

    .venv/bin/python benchmarks/change_feed.py                 # 64Mi rows (builds the base once, ~10 min)
    .venv/bin/python benchmarks/change_feed.py --rows 4194304  # a quick look

On ``benchmarks/scale.py``'s int64 base of ``--rows`` rows (4 shards, built
once under ``--data`` and cloned by hard links), a version ``v`` is taken,
then 4 generations of 50k random-key upserts (200k changes) are written,
flushed and merged into the base. Measured in alternating pairs, on the same
table in the same run:

* ``changes(since=v)`` drained, against a full merged scan (``scanner()``):
  what a downstream asset reads incrementally, against recomputing from the
  whole view;
* ``scanner(as_of=v)`` (the view before the merge) drained, against
  ``scanner()`` (now): time travel against a read of the latest view.

Results: ``benchmarks/results/change_feed.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.scale import (
    GENERATION_ROWS,
    GENERATIONS,
    RESULTS,
    clone,
    drain,
    machine,
    paired,
    template,
    write_generations,
)
from resources.lsm import LsmTable


def measure(data: Path, rows: int, repeat: int) -> dict[str, object]:
    table = LsmTable.open(str(clone(template(data, "int64", rows), data / "run-change-feed.lance")))
    since = table.version()
    write_generations(table, "int64", rows, GENERATIONS, np.random.default_rng(rows + 5))
    started = time.perf_counter()
    table.compact()
    merge_s = time.perf_counter() - started
    changed = drain(table.changes(since=since))
    feed_s, scan_s = paired(lambda: drain(table.changes(since=since)), lambda: drain(table.scanner()), repeat)
    as_of_s, now_s = paired(lambda: drain(table.scanner(as_of=since)), lambda: drain(table.scanner()), repeat)
    return {
        "rows": rows,
        "changes_written": GENERATIONS * GENERATION_ROWS,
        "keys_changed": changed,
        "merge_s": round(merge_s, 3),
        "changes_s": round(feed_s, 3),
        "merged_scan_s": round(scan_s, 3),
        "changes_vs_scan": round(feed_s / scan_s, 4),
        "scan_as_of_s": round(as_of_s, 3),
        "scan_now_s": round(now_s, 3),
        "as_of_vs_now": round(as_of_s / now_s, 3),
    }


def render(result: dict[str, object]) -> str:
    return "\n".join(
        [
            f"# Change feed and time travel ({result['rows']:,} base rows)",
            "",
            f"Machine: {result['machine']}. {result['changes_written']:,} upserts of random keys "
            f"({result['keys_changed']:,} distinct keys) written after version `v`, flushed and merged "
            f"({result['merge_s']} s). Alternating pairs, medians.",
            "",
            "| read | seconds | against | seconds | ratio |",
            "| --- | ---: | --- | ---: | ---: |",
            f"| `changes(since=v)` | {result['changes_s']} | full merged scan | {result['merged_scan_s']} "
            f"| {result['changes_vs_scan']} |",
            f"| `scanner(as_of=v)` (before the merge) | {result['scan_as_of_s']} | `scanner()` (now) "
            f"| {result['scan_now_s']} | {result['as_of_vs_now']} |",
            "",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=64 << 20, help="base rows (default 64Mi)")
    parser.add_argument("--repeat", type=int, default=3, help="alternating pairs per comparison")
    parser.add_argument("--data", type=Path, default=Path("/work/bench-data"), help="where base tables are kept")
    parser.add_argument("--out", type=Path, default=RESULTS / "change_feed", help="results path without suffix")
    args = parser.parse_args()
    args.data.mkdir(parents=True, exist_ok=True)
    result = {**measure(args.data, args.rows, args.repeat), "machine": machine()}
    print(json.dumps(result, indent=2))
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
