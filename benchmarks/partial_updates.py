"""Partial updates at scale: what setting one column costs against writing whole rows, and against plain Lance.

    .venv/bin/python benchmarks/partial_updates.py                     # 1Mi and 64Mi rows
    .venv/bin/python benchmarks/partial_updates.py --sizes 1048576     # a quick look

On ``benchmarks/scale.py``'s int64 base (4 shards, cloned by hard links and
switched to ``merge_engine: partial-update``), with 4 generations of 50k
random upserts pending, each measured write is one call of ``--batch``
random existing keys, in alternating pairs:

* whole rows (every column given: written as they are, no read);
* one column (``status``) given: the writer reads the other columns of those
  keys from the merged view (base, generations, WAL tail) before its put;
* plain Lance, the same one-column change: ``merge_insert("id")`` with
  ``when_matched_update_all`` on a clone of the base, a source of ``id`` and
  ``status`` only (a commit per call, against the base alone).

Results: ``benchmarks/results/partial_updates.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.scale import (
    GENERATIONS,
    RESULTS,
    STATUSES,
    clone,
    machine,
    paired,
    rows_for,
    template,
    write_generations,
)
from resources.lsm import LsmTable
from resources.lsm.handle import CONFIG_MERGE_ENGINE


def measure(data: Path, rows: int, batch: int, repeat: int) -> dict[str, object]:
    base = template(data, "int64", rows)
    path = clone(base, data / "run-partial.lance")
    lance.dataset(str(path)).update_config({CONFIG_MERGE_ENGINE: "partial-update"})
    plain = lance.dataset(str(clone(base, data / "run-partial-plain.lance")))
    table = LsmTable.open(str(path))
    rng = np.random.default_rng(rows + 11)
    write_generations(table, "int64", rows, GENERATIONS, rng)

    def keys() -> np.ndarray:
        return rng.choice(rows, batch, replace=False)

    def one_column(ids: np.ndarray) -> pa.Table:
        return pa.table({"id": pa.array(ids, pa.int64()), "status": STATUSES[rng.integers(0, 4, len(ids))]})

    whole_s, partial_s = paired(
        lambda: table.write(rows_for("int64", keys(), rng)), lambda: table.write(one_column(keys())), repeat
    )
    merge = lambda: plain.merge_insert("id").when_matched_update_all().execute(one_column(keys()))  # noqa: E731
    ours_s, lance_s = paired(lambda: table.write(one_column(keys())), merge, repeat)
    table.close()
    return {
        "rows": rows,
        "batch": batch,
        "whole_rows_s": round(whole_s, 3),
        "one_column_s": round(partial_s, 3),
        "one_column_vs_whole": round(partial_s / whole_s, 2),
        "one_column_again_s": round(ours_s, 3),
        "lance_merge_insert_s": round(lance_s, 3),
        "one_column_vs_lance": round(ours_s / lance_s, 2),
    }


def render(results: list[dict[str, object]], host: str) -> str:
    lines = [
        "# Partial updates",
        "",
        f"Machine: {host}. int64 base, 4 shards, {GENERATIONS} generations of 50k upserts pending; "
        "each call writes `batch` random existing keys. Alternating pairs, medians (s).",
        "",
        "| base rows | batch | whole rows | one column | ratio | one column (again) | Lance `merge_insert` "
        "(one column) | ratio |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r['rows']:,} | {r['batch']:,} | {r['whole_rows_s']} | {r['one_column_s']} | "
        f"{r['one_column_vs_whole']} | {r['one_column_again_s']} | {r['lance_merge_insert_s']} | "
        f"{r['one_column_vs_lance']} |"
        for r in results
    ]
    return "\n".join([*lines, ""])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1 << 20, 64 << 20], help="base rows")
    parser.add_argument("--batch", type=int, default=10_000, help="keys per write call")
    parser.add_argument("--repeat", type=int, default=3, help="alternating pairs per comparison")
    parser.add_argument("--data", type=Path, default=Path("/work/bench-data"), help="where base tables are kept")
    parser.add_argument("--out", type=Path, default=RESULTS / "partial_updates", help="results path without suffix")
    args = parser.parse_args()
    args.data.mkdir(parents=True, exist_ok=True)
    results = [measure(args.data, rows, args.batch, args.repeat) for rows in args.sizes]
    host = machine()
    print(json.dumps(results, indent=2))
    args.out.with_suffix(".json").write_text(json.dumps({"machine": host, "results": results}, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(render(results, host))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
