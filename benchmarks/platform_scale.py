"""Benchmark the code location at platform scale: many declared tables.

    .venv/bin/python benchmarks/platform_scale.py --tables 50 [--s3] [--json out.json]

Declares ``--tables`` tables (int64, string and composite keys in turn, 4
shards each) in a temporary tables folder, creates each with two pending
generations per shard (so the sensors read real shard state), then measures:

* ``import definitions`` in a fresh interpreter (bytecode cached: the best
  of ``--repeat`` runs after a warm-up), against ``import dagster`` alone;
* the webserver loading the code location: from starting
  ``dagster-webserver`` to its GraphQL API reporting the location loaded,
  and a reload of the location (the UI's "Reload definitions": a new code
  server imports the definitions, the webserver takes their snapshot);
* one tick of the flush sensor and of the merge sensor over every table
  (in process, on a fresh instance), the median of ``--repeat`` ticks.

With ``--s3`` the tables live on a ``moto_server`` started on 127.0.0.1.
Targets (issue 26): import <= 2 s, webserver load <= 5 s, one tick of each
sensor <= 5 s on local disk. Run it with ``--tables 1`` too: the difference
is what the tables cost, the rest is Dagster's own start-up.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KEYS = {
    "int64": ("    - {name: id, type: int64}\n", "[id]"),
    "string": ("    - {name: code, type: string}\n", "[code]"),
    "composite": ("    - {name: region, type: string}\n    - {name: seq, type: int32}\n", "[region, seq]"),
}
DECLARATION = """type: declarations.LsmTableComponent
attributes:
  name: {name}
  uri: "{uri}"
  columns:
{key_columns}    - {{name: value, type: double}}
    - {{name: label, type: string}}
  primary_key: {key}
  shards: 4
"""


def declare_tables(count: int, folder: Path, warehouse: str) -> list[tuple[str, str]]:
    """Write ``count`` declarations under ``folder``; return (name, key kind) for each."""
    tables = []
    for number in range(count):
        kind = list(KEYS)[number % len(KEYS)]
        name = f"t{number:03d}_{kind}"
        columns, key = KEYS[kind]
        (folder / name).mkdir(parents=True)
        text = DECLARATION.format(name=name, uri=f"{warehouse}/{name}.lance", key_columns=columns, key=key)
        (folder / name / "defs.yaml").write_text(text)
        tables.append((name, kind))
    return tables


def create_tables(rows_per_generation: int) -> None:
    """Create every declared table through its resource, with two generations per shard."""
    from declarations import load_tables, tables_dir
    from lsm_assets.table_context import DEFAULT_TABLE
    from resources.lsm.testing.changegen import ChangeStreamSpec, generate_table_changes
    from resources.table_resource import LsmTableResource

    for table in load_tables(tables_dir(), [DEFAULT_TABLE]).tables:
        lsm = LsmTableResource.for_table(table).open()
        spec = ChangeStreamSpec(num_keys=rows_per_generation * 4, num_batches=2, batch_size=rows_per_generation * 4)
        for batch in generate_table_changes(lsm.schema, lsm.primary_key, spec):
            lsm.write(batch)
            lsm.close()  # each batch becomes a generation in every shard


def import_seconds(env: dict[str, str], module: str, repeat: int) -> float:
    """Best wall time of ``import module`` in a fresh interpreter (after one warm-up that writes bytecode)."""
    times = []
    for _ in range(repeat + 1):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT, env=env, check=True)
        times.append(time.perf_counter() - start)
    return min(times[1:])


def webserver_load_seconds(env: dict[str, str], timeout: float = 120) -> tuple[float, float]:
    """Seconds from starting dagster-webserver until the code location reports LOADED, and of a reload.

    The reload (the UI's "Reload definitions") is what loading the code location
    costs by itself: a new code server imports the definitions and the webserver
    takes their snapshot.
    """
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    webserver = Path(sys.executable).with_name("dagster-webserver")
    query = json.dumps(
        {"query": "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus "
         "locationOrLoadError { __typename } } } } }"}
    ).encode()  # fmt: skip

    def post(body: bytes) -> dict:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", body, {"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(request, timeout=60).read())

    def wait_loaded(since: float) -> float:
        while time.perf_counter() - since < timeout:
            try:
                entries = post(query)["data"]["workspaceOrError"]["locationEntries"]
                if entries and all(e["loadStatus"] == "LOADED" for e in entries):
                    assert entries[0]["locationOrLoadError"]["__typename"] == "RepositoryLocation", entries
                    return time.perf_counter() - since
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError("the webserver did not load the code location")

    start = time.perf_counter()
    process = subprocess.Popen(
        [str(webserver), "-m", "definitions", "-h", "127.0.0.1", "-p", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        first = wait_loaded(start)
        reload_start = time.perf_counter()
        post(json.dumps({"query": RELOAD, "variables": {"name": "definitions"}}).encode())
        return first, wait_loaded(reload_start)
    finally:
        process.terminate()
        process.wait(timeout=30)


RELOAD = "mutation($name: String!) { reloadRepositoryLocation(repositoryLocationName: $name) { __typename } }"


def tick_seconds(definitions_module, sensor_name: str, repeat: int) -> tuple[float, int]:
    """Median seconds of one tick of ``sensor_name``, and the run requests of the last tick."""
    from dagster import build_sensor_context, instance_for_test

    sensor = definitions_module.defs.get_sensor_def(sensor_name)
    times, requests = [], 0
    with instance_for_test() as instance:
        for _ in range(repeat):
            defs = definitions_module.defs
            start = time.perf_counter()
            # Only the sensor's own resources, as the daemon gives it (others claim shard writers).
            resources = {key: defs.resources[key] for key in sensor.required_resource_keys}
            with build_sensor_context(instance=instance, definitions=defs, resources=resources) as context:
                result = sensor.evaluate_tick(context)
            times.append(time.perf_counter() - start)
            requests = len(result.run_requests or [])
    return statistics.median(times), requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=50)
    parser.add_argument("--rows-per-generation", type=int, default=200, help="rows per shard per generation")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--s3", action="store_true", help="put the tables on a moto_server on 127.0.0.1")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()

    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lsm-platform-")))
        env = {**os.environ, "DAGSTER_HOME": str(tmp / "home"), "LSM_TABLES_DIR": str(tmp / "tables")}
        # Measured as deployed: the warm-up writes bytecode the measured imports load.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        (tmp / "home").mkdir()
        warehouse = str(tmp / "warehouse")
        if args.s3:
            from tests.s3_server import moto_server

            server = stack.enter_context(moto_server())
            env.update(server.env())
            warehouse = f"s3://{server.bucket}/platform"
        tables = declare_tables(args.tables, tmp / "tables", warehouse)
        os.environ.update(env)
        create_tables(args.rows_per_generation)
        import definitions

        results = {
            "tables": len(tables),
            "storage": "s3 (moto)" if args.s3 else "local disk",
            "import_dagster_s": round(import_seconds(env, "dagster", args.repeat), 2),
            "import_definitions_s": round(import_seconds(env, "definitions", args.repeat), 2),
        }
        results["webserver_start_s"], results["code_location_reload_s"] = (
            round(seconds, 2) for seconds in webserver_load_seconds(env)
        )
        for name in ("flush_sensor", "merge_sensor"):
            seconds, requests = tick_seconds(definitions, name, args.repeat)
            results[f"{name}_tick_s"], results[f"{name}_run_requests"] = round(seconds, 2), requests
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
