"""A writer in its own process: acknowledges batches on stdin's command and stays alive.

    python -m tests.resources.lsm.read.writer_child <table uri>

(started by the ``writer_process`` fixture; :func:`acknowledge` sends a line and waits for its ack.)

For every line ``<op> <first key> <count>`` read from stdin it upserts
(``name`` = ``"child"``) or deletes those keys and prints ``ack <first key>``
once the write is durable. It never closes its writers, so nothing is flushed: acknowledged rows
live only in the WAL until another process replays it.
"""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa

from resources.lsm import LsmTable


def main(uri: str) -> None:
    table = LsmTable.open(uri)
    for line in sys.stdin:
        op, first, count = line.split()
        ids = list(range(int(first), int(first) + int(count)))
        table.write(
            pa.table(
                {
                    "id": pa.array(ids, pa.int64()),
                    "name": ["child"] * len(ids),
                    "price": [float(i) for i in ids],
                    "_op": [op] * len(ids),
                }
            )
        )
        print(f"ack {first}", flush=True)


def acknowledge(process: subprocess.Popen, op: str, first: int, count: int) -> None:
    process.stdin.write(f"{op} {first} {count}\n")
    process.stdin.flush()
    assert process.stdout.readline().strip() == f"ack {first}"


if __name__ == "__main__":
    main(sys.argv[1])
