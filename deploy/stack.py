"""The local production-like stack: a Spark standalone cluster, PostgreSQL, Dagster's webserver and daemon.

One place for starting and stopping each service, used by ``./dev stack``
(``python -m deploy.stack``) and by the tests that run against the real
services. Every service runs in its own process group on 127.0.0.1 with free
ports, so stopping it stops everything it started (Spark executors, Python
workers, Postgres backends, Dagster run workers).
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, closing, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
LOCALHOST = "127.0.0.1"


# --- processes --------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port nobody listens on right now (on 127.0.0.1)."""
    with socket.socket() as s:
        s.bind((LOCALHOST, 0))
        port: int = s.getsockname()[1]
        return port


def spawn(command: Sequence[str], log: Path, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.Popen:
    """Start ``command`` in a new process group, stdout and stderr appended to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(
            list(command), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def stop(process: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
    """Signal ``process``'s whole group, then kill the group if it has not exited within ``timeout``."""
    for signal_to_send, wait in ((sig, timeout), (signal.SIGKILL, 10)):
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal_to_send)
        try:
            process.wait(timeout=wait)
            _kill_stragglers(process.pid)
            return
        except subprocess.TimeoutExpired:
            continue


def _kill_stragglers(pgid: int) -> None:
    """Kill what is left of a process group whose leader has exited (e.g. Postgres backends)."""
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


@contextmanager
def running(process: subprocess.Popen, sig: int = signal.SIGTERM) -> Iterator[subprocess.Popen]:
    """Yield ``process``; stop its process group on the way out."""
    try:
        yield process
    finally:
        stop(process, sig)


def wait_for(check: Callable[[], Any], what: str, processes: Sequence[subprocess.Popen], timeout: float = 180) -> Any:
    """Poll ``check()`` until it returns something truthy; fail early if one of ``processes`` exits.

    A check that cannot connect yet (``OSError``) or reads an answer it cannot
    decode (``ValueError``: a Spark master starting up served its HTML page at
    ``/json/``) counts as not ready.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for process in processes:
            if process.poll() is not None:
                raise RuntimeError(f"{what}: {process.args[0]} exited with {process.returncode}")
        try:
            result = check()
        except (OSError, ValueError):
            result = None
        if result:
            return result
        time.sleep(0.5)
    raise TimeoutError(f"{what}: not ready after {timeout:.0f}s")


def http_json(url: str, body: dict[str, Any] | None = None, timeout: float = 60) -> Any:
    """GET ``url`` (or POST ``body`` as JSON) and decode the JSON answer."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


# --- Spark standalone -------------------------------------------------------------------------


@dataclass(frozen=True)
class SparkCluster:
    """A standalone master and its workers; ``master_url`` is what ``SPARK_MASTER`` takes."""

    master_url: str
    ui_url: str

    def alive_workers(self) -> int:
        """Workers registered with the master and alive."""
        return int(http_json(f"{self.ui_url}/json/")["aliveworkers"])


def spark_home() -> Path:
    """The Spark distribution pyspark ships (``bin/spark-class``, ``jars/``)."""
    import pyspark

    return Path(pyspark.__file__).parent


MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def _spark_class(main_class: str, args: list[str], log: Path, workdir: Path) -> subprocess.Popen:
    """Run one of Spark's daemons (master or worker) with pyspark's launcher, on 127.0.0.1."""
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": LOCALHOST,
        "SPARK_LOCAL_DIRS": str(workdir / "local"),
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
    }
    return spawn([str(spark_home() / "bin" / "spark-class"), main_class, *args], log, env)


@contextmanager
def spark_cluster(workdir: Path, workers: int = 2, cores: int = 1, memory: str = "1g") -> Iterator[SparkCluster]:
    """A Spark standalone master and ``workers`` workers (``cores`` and ``memory`` each) on 127.0.0.1."""
    workdir.mkdir(parents=True, exist_ok=True)
    port, ui_port = free_port(), free_port()
    cluster = SparkCluster(f"spark://{LOCALHOST}:{port}", f"http://{LOCALHOST}:{ui_port}")
    master_args = ["--host", LOCALHOST, "--port", str(port), "--webui-port", str(ui_port)]
    with ExitStack() as stack:
        master = _spark_class(MASTER_CLASS, master_args, workdir / "master.log", workdir)
        started = [stack.enter_context(running(master))]
        wait_for(lambda: http_json(f"{cluster.ui_url}/json/"), "Spark master", started)
        for n in range(workers):
            worker_args = ["--host", LOCALHOST, "--webui-port", str(free_port()), "--cores", str(cores)]
            worker_args += ["--memory", memory, "--work-dir", str(workdir / f"worker-{n}"), cluster.master_url]
            worker = _spark_class(WORKER_CLASS, worker_args, workdir / f"worker-{n}.log", workdir)
            started.append(stack.enter_context(running(worker)))
        wait_for(lambda: cluster.alive_workers() == workers, f"{workers} Spark workers", started)
        yield cluster


# --- PostgreSQL -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Postgres:
    """A PostgreSQL server on 127.0.0.1 (trust authentication, no password)."""

    port: int
    user: str = "postgres"
    db_name: str = "dagster"
    host: str = LOCALHOST

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{self.db_name}"

    def connect(self, db_name: str | None = None) -> Any:
        """A psycopg2 connection (autocommit) to ``db_name`` (default: the server's database)."""
        import psycopg2

        connection = psycopg2.connect(
            host=self.host, port=self.port, user=self.user, dbname=db_name or self.db_name, connect_timeout=5
        )
        connection.autocommit = True
        return connection

    def accepting(self) -> bool:
        """Whether the server accepts connections (not starting up)."""
        import psycopg2

        try:
            self.connect("postgres").close()
        except psycopg2.OperationalError:
            return False
        return True


def postgres_bin() -> Path | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` holding ``initdb``, if Postgres is installed."""
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    return candidates[-1].parent if candidates else None


def _as_server_user(command: list[str]) -> list[str]:
    """Postgres refuses to run as root: as root, run ``command`` as the ``postgres`` system user."""
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", "postgres", "--", *command]


def _server_dir() -> Path:
    """A data directory the server user can reach (temp dirs of root are not traversable by others)."""
    path = Path(tempfile.mkdtemp(prefix="lsm-postgres-"))
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(path, user.pw_uid, user.pw_gid)
    return path


@contextmanager
def postgres_server(log: Path, db_name: str = "dagster") -> Iterator[Postgres]:
    """``initdb`` a throw-away cluster in a temp dir, run ``postgres`` on a free port, create ``db_name``."""
    bin_dir = postgres_bin()
    if bin_dir is None:
        raise FileNotFoundError("PostgreSQL is not installed (./dev setup-postgres, or apt-get install postgresql)")
    base = _server_dir()
    data = base / "data"
    try:
        initdb = [str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"]
        subprocess.run(_as_server_user(initdb), check=True, capture_output=True, timeout=120)
        server = Postgres(free_port(), db_name=db_name)
        options = ["-p", str(server.port), "-h", LOCALHOST, "-k", str(base), "-c", "fsync=off"]
        command = _as_server_user([str(bin_dir / "postgres"), "-D", str(data), *options])
        # SIGINT: Postgres's "fast" shutdown (roll back sessions, checkpoint, exit).
        with running(spawn(command, log), signal.SIGINT) as process:
            wait_for(server.accepting, "PostgreSQL", [process], timeout=60)
            with closing(server.connect("postgres")) as admin, admin.cursor() as cursor:
                cursor.execute(f'CREATE DATABASE "{db_name}"')
            yield server
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --- Dagster ----------------------------------------------------------------------------------


def postgres_storage_yaml(server: Postgres) -> str:
    """The ``storage:`` block of a dagster.yaml that keeps runs, events and schedules in ``server``.

    ``scheme: postgresql+psycopg2``: SQLAlchemy 2.1 maps plain ``postgresql://``
    to psycopg 3, which dagster-postgres does not install (it brings psycopg2).
    """
    return (
        "\nstorage:\n  postgres:\n    postgres_db:\n"
        f"      hostname: {server.host}\n      port: {server.port}\n"
        f"      username: {server.user}\n      password: ''\n      db_name: {server.db_name}\n"
        "      scheme: postgresql+psycopg2\n"
    )


def dagster_home(home: Path, server: Postgres | None = None) -> Path:
    """A DAGSTER_HOME with ``deploy/dagster.yaml``'s settings (run queue, retries), on Postgres if given."""
    home.mkdir(parents=True, exist_ok=True)
    settings = (ROOT / "deploy" / "dagster.yaml").read_text()
    (home / "dagster.yaml").write_text(settings + (postgres_storage_yaml(server) if server else ""))
    return home


LAUNCH_RUN = """mutation($params: ExecutionParams!) { launchRun(executionParams: $params) { __typename
  ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
  ... on RunConfigValidationInvalid { errors { message } } } }"""
RUN_STATUS = "query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"
TERMINATE_RUN = """mutation($id: String!) { terminateRun(runId: $id) { __typename
  ... on TerminateRunFailure { message } ... on PythonError { message } } }"""
RUN_EVENTS = """query($id: ID!) { runOrError(runId: $id) { ... on Run { eventConnection(limit: 5000) { events {
  __typename ... on MessageEvent { level message }
  ... on ExecutionStepFailureEvent { stepKey error { message stack errorChain { error { message stack } } } }
} } } } }"""
FINISHED = ("SUCCESS", "FAILURE", "CANCELED")
LOCATIONS = """{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { __typename ... on PythonError { message } } } } } }"""


@dataclass(frozen=True)
class DagsterServices:
    """``dagster-webserver`` (GraphQL at ``url``) and ``dagster-daemon`` on one instance."""

    url: str
    location: str = "lance_lsm"

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> Any:
        """Run a GraphQL query against the webserver; return its ``data`` (errors raise)."""
        answer = http_json(f"{self.url}/graphql", {"query": query, "variables": variables or {}})
        if answer.get("errors"):
            raise RuntimeError(f"GraphQL errors: {answer['errors']}")
        return answer["data"]

    def location_loaded(self) -> bool:
        """Whether the webserver has loaded the code location (raises if loading it failed)."""
        entries = self.graphql(LOCATIONS)["workspaceOrError"]["locationEntries"]
        for entry in entries:
            if entry["name"] == self.location and entry["locationOrLoadError"]["__typename"] == "PythonError":
                raise RuntimeError(f"code location {self.location}: {entry['locationOrLoadError']['message']}")
        return any(e["name"] == self.location and e["loadStatus"] == "LOADED" for e in entries)

    def launch(self, job: str, run_config: dict[str, Any] | None = None) -> str:
        """Submit a run of ``job`` to the run queue (as the UI's Launch button does); return its id."""
        selector = {"repositoryLocationName": self.location, "repositoryName": "__repository__", "jobName": job}
        params = {"selector": selector, "runConfigData": run_config or {}}
        launched = self.graphql(LAUNCH_RUN, {"params": params})["launchRun"]
        if launched["__typename"] != "LaunchRunSuccess":
            raise RuntimeError(f"launchRun {job}: {launched}")
        run_id: str = launched["run"]["runId"]
        return run_id

    def status(self, run_id: str) -> str:
        """The run's status (QUEUED, STARTED, SUCCESS, FAILURE, CANCELING, CANCELED, ...)."""
        status: str = self.graphql(RUN_STATUS, {"id": run_id})["runOrError"]["status"]
        return status

    def wait(self, run_id: str, timeout: float = 600) -> str:
        """Wait until the run has finished; return its final status."""
        deadline = time.monotonic() + timeout
        while (status := self.status(run_id)) not in FINISHED:
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} still {status} after {timeout:.0f}s")
            time.sleep(1)
        return status

    def terminate(self, run_id: str) -> None:
        """Terminate the run (the UI's Terminate button)."""
        answer = self.graphql(TERMINATE_RUN, {"id": run_id})["terminateRun"]
        if answer["__typename"] != "TerminateRunSuccess":
            raise RuntimeError(f"terminateRun {run_id}: {answer}")

    def events(self, run_id: str) -> list[dict[str, Any]]:
        """The run's event log (type, level, message; step failures with their error)."""
        events: list[dict[str, Any]] = self.graphql(RUN_EVENTS, {"id": run_id})["runOrError"]["eventConnection"][
            "events"
        ]
        return events

    def failures(self, run_id: str) -> str:
        """The run's ERROR-level events and step failures, one JSON line each (for assertion messages)."""
        bad = [e for e in self.events(run_id) if e.get("level") == "ERROR" or "error" in e]
        return "\n".join(json.dumps(e) for e in bad)


@contextmanager
def dagster_services(env: dict[str, str], logs: Path, port: int | None = None) -> Iterator[DagsterServices]:
    """The daemon (sensors, schedules, run queue) and the webserver as separate processes, as in production."""
    port = port or free_port()
    webserver = [str(BIN / "dagster-webserver"), "-w", "workspace.yaml", "-h", LOCALHOST, "-p", str(port)]
    # Create the instance's storage first: two processes creating a new SQLite storage at
    # once can both stamp its schema version ("more than one head"), and neither loads.
    migrate = spawn([str(BIN / "dagster"), "instance", "migrate"], logs / "instance.log", env)
    if migrate.wait(timeout=120):
        raise RuntimeError(f"dagster instance migrate failed: see {logs / 'instance.log'}")
    with ExitStack() as stack:
        daemon = stack.enter_context(
            running(spawn([str(BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"], logs / "daemon.log", env))
        )
        server = stack.enter_context(running(spawn(webserver, logs / "webserver.log", env)))
        services = DagsterServices(f"http://{LOCALHOST}:{port}")
        wait_for(services.location_loaded, "dagster-webserver and the code location", [daemon, server])
        yield services


# --- the whole stack --------------------------------------------------------------------------


@dataclass
class Stack:
    """What ``local_stack`` started, and the environment a client of it needs."""

    env: dict[str, str] = field(default_factory=dict)
    urls: dict[str, str] = field(default_factory=dict)


@contextmanager
def local_stack(workdir: Path, spark_workers: int = 1, s3: bool = True) -> Iterator[Stack]:
    """Spark (master + workers), Postgres, Dagster on Postgres (webserver + daemon) and, if installed, moto_server."""
    logs = workdir / "logs"
    stack = Stack()
    with ExitStack() as services:
        cluster = services.enter_context(spark_cluster(workdir / "spark", workers=spark_workers))
        server = services.enter_context(postgres_server(logs / "postgres.log"))
        stack.env = {
            "DAGSTER_HOME": str(dagster_home(workdir / "dagster_home", server)),
            "SPARK_MASTER": cluster.master_url,
            "LSM_TABLE_URI": os.environ.get("LSM_TABLE_URI", str(workdir / "table.lance")),
            "LSM_LANDING_DIR": os.environ.get("LSM_LANDING_DIR", str(workdir / "landing")),
        }
        stack.urls = {"spark master UI": cluster.ui_url, "postgres": server.url}
        moto = shutil.which("moto_server") or (str(BIN / "moto_server") if (BIN / "moto_server").exists() else None)
        if s3 and moto:
            s3_port = free_port()
            services.enter_context(running(spawn([moto, "-H", LOCALHOST, "-p", str(s3_port)], logs / "moto.log")))
            stack.urls["S3 (moto_server)"] = f"http://{LOCALHOST}:{s3_port}"
        dagster = services.enter_context(dagster_services({**os.environ, **stack.env}, logs))
        stack.urls["dagster UI"] = dagster.url
        yield stack


def _serve(workdir: Path, spark_workers: int) -> None:
    """Run the stack until Ctrl-C (or SIGTERM), printing where everything is."""
    stop_requested = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop_requested.set())
    with local_stack(workdir, spark_workers) as stack:
        print("[stack] up; logs in", workdir / "logs")
        for name, url in stack.urls.items():
            print(f"[stack] {name}: {url}")
        print("[stack] environment for jobs and clients:")
        for name, value in stack.env.items():
            print(f"export {name}={value}")
        print("[stack] Ctrl-C stops everything", flush=True)
        stop_requested.wait()
        print("[stack] stopping", flush=True)
    print("[stack] stopped")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dir", type=Path, default=ROOT / ".stack", help="state and logs (default .stack/)")
    parser.add_argument("--spark-workers", type=int, default=1)
    args = parser.parse_args(argv)
    _serve(args.dir.resolve(), args.spark_workers)


if __name__ == "__main__":
    main()
