"""Writes acknowledged rows, then adds a column and SIGKILLs itself right after one step of the procedure.

    python -m tests.resources.lsm.evolve_child <table uri> <step> <first key> <count>

Upserts keys ``first .. first + count - 1`` (``name`` = ``"child"``), prints
``ack`` once they are durable, leaves its writers open (the rows are in the
WAL and MemTables only), then runs :meth:`LsmTable.add_columns` and kills
itself with SIGKILL as soon as ``<step>`` is done.
"""

from __future__ import annotations

import os
import signal
import sys

import pyarrow as pa

from resources.lsm import LsmTable

NEW_COLUMN = pa.field("note", pa.string())


def main(uri: str, kill_after: str, first: int, count: int) -> None:
    table = LsmTable.open(uri)
    ids = list(range(first, first + count))
    table.write(pa.table({"id": pa.array(ids, pa.int64()), "name": ["child"] * count, "price": [1.0] * count}))
    print("ack", flush=True)

    def step(name: str) -> None:
        if name == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)

    table.add_columns(NEW_COLUMN, on_step=step)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
