"""One engine benchmark at two git revisions, alternating, side by side: did a change make anything slower?

    .venv/bin/python benchmarks/revisions.py --before 0cc27d7 read_keys
    .venv/bin/python benchmarks/revisions.py --before 0cc27d7 --after HEAD --rounds 3 ingest -- --rows 300000

Both revisions are checked out with ``git worktree add`` under a scratch
directory and run with this venv's interpreter (``PYTHONPATH`` points at the
tree, so the script, its imports and Spark's Python workers all use that
tree's code; the pinned packages are this venv's). Rounds alternate which
revision goes first, because the machine is shared. After each run the
script's own results (``benchmarks/results/<script>.json`` in that tree) are
collected; every numeric leaf is reported as the median over rounds for
both revisions, with after/before. Timings (leaves ending in ``_s`` or
``seconds``) above 1.10x are flagged: lower is better for
them. Results: ``benchmarks/results/revisions-<script>.md`` / ``.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SLOWER = 1.10


def checkout(revision: str, where: Path) -> Path:
    """A detached worktree of ``revision`` at ``where``."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(where), revision], check=True)
    return where


def run_once(tree: Path, script: str, args: list[str]) -> dict[str, object]:
    """Run ``benchmarks/<script>.py`` in ``tree``; return the JSON results it wrote."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, str(tree / "benchmarks" / f"{script}.py"), *args], cwd=tree, env=env, check=True)
    results: dict[str, object] = json.loads((tree / "benchmarks" / "results" / f"{script}.json").read_text())
    return results


def leaves(value: object, path: str = "") -> Iterator[tuple[str, float]]:
    """Every numeric leaf of a JSON value, as ``(dotted path, value)``."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield from leaves(child, f"{path}.{key}" if path else str(key))
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield path, float(value)


def is_timing(path: str) -> bool:
    last = path.rsplit(".", 1)[-1]
    return last.endswith(("_s", "seconds"))


def compare(before: list[dict[str, object]], after: list[dict[str, object]]) -> list[dict[str, object]]:
    """Per leaf present in every run: the medians of both revisions and their ratio."""
    runs = [dict(leaves(r)) for r in before + after]
    common = [p for p in runs[0] if all(p in r for r in runs) and not p.startswith("config.")]
    rows = []
    for path in common:
        b = statistics.median(dict(leaves(r))[path] for r in before)
        a = statistics.median(dict(leaves(r))[path] for r in after)
        ratio = a / b if b else None
        slower = is_timing(path) and ratio is not None and ratio > SLOWER
        rows.append({"metric": path, "before": b, "after": a, "ratio": ratio, "slower": slower})
    return rows


def markdown(
    script: str, revisions: tuple[str, str], rounds: int, args: list[str], rows: list[dict[str, object]]
) -> str:
    lines = [
        f"# `benchmarks/{script}.py` before/after",
        "",
        f"Before = `{revisions[0]}`, after = `{revisions[1]}`; median of {rounds} alternating rounds "
        f"(`benchmarks/revisions.py`), script arguments: `{' '.join(args) or '(defaults)'}`. "
        f"Timings more than {SLOWER:.2f}x the before are marked **slower**.",
        "",
        "| metric | before | after | after/before |",
        "| --- | ---: | ---: | ---: |",
    ]
    for row in rows:
        ratio = "" if row["ratio"] is None else f"{row['ratio']:.2f}x" + (" **slower**" if row["slower"] else "")
        lines.append(f"| {row['metric']} | {row['before']:.4g} | {row['after']:.4g} | {ratio} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", required=True, help="git revision to compare with")
    parser.add_argument("--after", default="HEAD", help="git revision measured as after (default HEAD)")
    parser.add_argument("--rounds", type=int, default=2, help="runs per revision, alternating (default 2)")
    parser.add_argument("script", help="benchmark under benchmarks/ that writes results/<script>.json")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script, after --")
    options = parser.parse_args()
    args = [a for a in options.args if a != "--"]
    scratch = Path(tempfile.mkdtemp(prefix="lsm-revisions-"))
    trees = (checkout(options.before, scratch / "before"), checkout(options.after, scratch / "after"))
    results: tuple[list[dict[str, object]], list[dict[str, object]]] = ([], [])
    try:
        for round_ in range(options.rounds):
            order = (0, 1) if round_ % 2 == 0 else (1, 0)
            for side in order:
                print(f"[revisions] round {round_ + 1}: {('before', 'after')[side]}", flush=True)
                results[side].append(run_once(trees[side], options.script, args))
    finally:
        for tree in trees:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
        shutil.rmtree(scratch, ignore_errors=True)
    rows = compare(*results)
    revisions = (options.before, options.after)
    name = f"revisions-{options.script}"
    (RESULTS / f"{name}.json").write_text(
        json.dumps({"revisions": revisions, "rounds": options.rounds, "args": args, "metrics": rows}, indent=1)
    )
    (RESULTS / f"{name}.md").write_text(markdown(options.script, revisions, options.rounds, args, rows))
    slower = [row["metric"] for row in rows if row["slower"]]
    print(f"[revisions] {len(rows)} metrics; slower: {slower or 'none'}; see {RESULTS / name}.md")


if __name__ == "__main__":
    main()
