"""A fault-injecting HTTP proxy on 127.0.0.1 in front of the tests' ``moto_server``.

Every request is forwarded to the real S3 API server unless the proxy draws
a fault for it. Faults are drawn from a seeded generator (a probability per
request), or taken from a fixed schedule, so a failing run can be replayed.
The kinds, as object storage fails in practice:

- ``error_500`` / ``error_503``: an S3 ``InternalError`` / ``SlowDown`` answer;
  the request never reaches the server.
- ``reset_before``: the connection is reset before the request is forwarded.
- ``reset_after``: the request is applied on the server, then the connection
  is reset instead of answering (a PUT that succeeded while the client saw an
  error, so its retry finds the object already there).
- ``delay``: the request is applied, and the answer is held for
  ``delay_seconds`` (set it past the client's timeout).
- ``truncate``: the request is applied, and the answer's body is cut in half
  (the full ``Content-Length`` is announced; an answer without a body loses
  half its headers), then the connection is reset.

:meth:`FaultyS3.outage` answers every request with 503 while it lasts. Counts
per kind and of all requests are kept in :attr:`FaultyS3.counts`.
"""

from __future__ import annotations

import http.client
import random
import socket
import socketserver
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from tests.s3_server import S3Server

KINDS = ("error_500", "error_503", "reset_before", "reset_after", "delay", "truncate")
_ERRORS = {"error_500": (500, "InternalError"), "error_503": (503, "SlowDown"), "outage": (503, "ServiceUnavailable")}
# Hop-by-hop headers: the proxy re-frames bodies itself.
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection"}


@dataclass
class FaultPlan:
    """Which requests fail: each with ``probability``, kinds drawn from ``kinds`` with a seeded generator.

    ``schedule`` (kind or ``None`` per request, in arrival order) overrides the
    draw for the first ``len(schedule)`` requests.
    """

    probability: float = 0.0
    kinds: Sequence[str] = KINDS
    seed: int = 0
    delay_seconds: float = 3.0
    schedule: Sequence[str | None] = ()


@dataclass
class _Request:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes


@dataclass
class _Response:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes
    head: bool = False

    def header_bytes(self) -> bytes:
        lines = [f"HTTP/1.1 {self.status} {self.reason}"]
        lines += [
            f"{k}: {v}" for k, v in self.headers if k.lower() not in _HOP_BY_HOP and k.lower() != "content-length"
        ]
        if not self.head or not any(k.lower() == "content-length" for k, _ in self.headers):
            lines.append(f"Content-Length: {len(self.body)}")
        else:  # a HEAD answer announces the object's length, with no body
            lines += [f"{k}: {v}" for k, v in self.headers if k.lower() == "content-length"]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


@dataclass
class FaultyS3:
    """The running proxy: its endpoint, the plan in force, and what it counted."""

    upstream: S3Server
    endpoint: str = ""
    plan: FaultPlan = field(default_factory=FaultPlan)
    counts: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _random: random.Random = field(default_factory=random.Random)
    _outage: bool = False
    _schedule_start: int = 0

    @property
    def server(self) -> S3Server:
        """The proxy as an :class:`S3Server` (its ``env()`` and ``storage_options()`` point clients here)."""
        return S3Server(self.endpoint, self.upstream.bucket)

    def set_plan(self, plan: FaultPlan) -> None:
        """Inject per ``plan`` from now on (the seed restarts the draw)."""
        with self._lock:
            self.plan, self._random = plan, random.Random(plan.seed)
            self._schedule_start = self.counts["requests"]

    @contextmanager
    def outage(self) -> Iterator[None]:
        """Answer every request with 503 (counted as ``outage``) while the block runs."""
        self._outage = True
        try:
            yield
        finally:
            self._outage = False

    def faults(self) -> dict[str, int]:
        """Injected faults by kind (only kinds that occurred)."""
        return {kind: n for kind, n in self.counts.items() if kind in (*KINDS, "outage")}

    def draw(self) -> str | None:
        """The fault for the next request (``None``: forward it untouched); counts the request."""
        with self._lock:
            index = self.counts["requests"] - self._schedule_start
            self.counts["requests"] += 1
            if self._outage:
                kind: str | None = "outage"
            elif index < len(self.plan.schedule):
                kind = self.plan.schedule[index]
            elif self._random.random() < self.plan.probability:
                kind = self._random.choice(list(self.plan.kinds))
            else:
                kind = None
            if kind is not None:
                self.counts[kind] += 1
            return kind


class _Handler(socketserver.StreamRequestHandler):
    server: _ProxyServer

    def handle(self) -> None:
        upstream = urlsplit(self.server.proxy.upstream.endpoint)
        connection = http.client.HTTPConnection(upstream.hostname or "127.0.0.1", upstream.port, timeout=60)
        try:
            while (request := self._read_request()) is not None:
                if not self._serve(request, connection):
                    return
        except OSError:
            return  # the client went away (or gave up on a delayed answer)
        finally:
            connection.close()

    def _serve(self, request: _Request, connection: http.client.HTTPConnection) -> bool:
        """Answer one request, with its fault; ``False`` once the connection is gone."""
        kind = self.server.proxy.draw()
        if kind in _ERRORS:
            status, code = _ERRORS[kind]
            self._send(_error_response(status, code, request))
            return True
        if kind == "reset_before":
            self._reset()
            return False
        response = _forward(connection, request)
        if kind == "reset_after":
            self._reset()
            return False
        if kind == "delay":
            time.sleep(self.server.proxy.plan.delay_seconds)
        if kind == "truncate":
            self.wfile.write(_truncated(response))
            self.wfile.flush()
            self._reset()
            return False
        self._send(response)
        return True

    def _read_request(self) -> _Request | None:
        line = self.rfile.readline(65537).decode("latin-1").strip()
        if not line:
            return None
        method, target, _ = line.split(" ", 2)
        headers: list[tuple[str, str]] = []
        while (header := self.rfile.readline(65537).decode("latin-1").rstrip("\r\n")) != "":
            name, _, value = header.partition(":")
            headers.append((name.strip(), value.strip()))
        names = {k.lower(): v for k, v in headers}
        if names.get("transfer-encoding", "").lower() == "chunked":
            body = self._read_chunked()
        else:
            body = self.rfile.read(int(names.get("content-length", "0")))
        if names.get("expect", "").lower() == "100-continue":
            headers = [(k, v) for k, v in headers if k.lower() != "expect"]
        return _Request(method, target, headers, body)

    def _read_chunked(self) -> bytes:
        parts = []
        while (size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)) > 0:
            parts.append(self.rfile.read(size))
            self.rfile.readline()
        while self.rfile.readline().strip():  # trailers
            pass
        return b"".join(parts)

    def _send(self, response: _Response) -> None:
        self.wfile.write(response.header_bytes() + (b"" if response.head else response.body))
        self.wfile.flush()

    def _reset(self) -> None:
        """Close with a TCP RST (SO_LINGER 0), not an orderly FIN."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()


def _forward(connection: http.client.HTTPConnection, request: _Request) -> _Response:
    """Send ``request`` to the server as it came (body re-framed with a length); its whole answer."""
    connection.putrequest(request.method, request.target, skip_host=True, skip_accept_encoding=True)
    for name, value in request.headers:
        if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
            connection.putheader(name, value)
    connection.putheader("Content-Length", str(len(request.body)))
    connection.endheaders(request.body)
    answer = connection.getresponse()
    body = answer.read()
    return _Response(answer.status, answer.reason, answer.getheaders(), body, head=request.method == "HEAD")


def _truncated(response: _Response) -> bytes:
    """The answer cut short: half its body, or half its headers when it has no body (a HEAD, a PUT's)."""
    head = response.header_bytes()
    if response.head or len(response.body) < 2:
        return head[: len(head) // 2]
    return head + response.body[: len(response.body) // 2]


def _error_response(status: int, code: str, request: _Request) -> _Response:
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
        f"<Message>injected by the faulty proxy</Message><Resource>{request.target}</Resource></Error>"
    ).encode()
    headers = [("Content-Type", "application/xml")]
    reason = http.client.responses.get(status, "Error")
    return _Response(status, reason, headers, body if request.method != "HEAD" else b"", head=False)


class _ProxyServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, proxy: FaultyS3) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.proxy = proxy


@contextmanager
def faulty_s3(upstream: S3Server, plan: FaultPlan | None = None) -> Iterator[FaultyS3]:
    """Run a proxy in front of ``upstream`` on a free loopback port; stop it on exit."""
    proxy = FaultyS3(upstream)
    proxy.set_plan(plan or FaultPlan())
    server = _ProxyServer(proxy)
    proxy.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="faulty-s3", daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
