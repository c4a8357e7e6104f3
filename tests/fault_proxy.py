"""A fault-injecting HTTP proxy on 127.0.0.1, in front of the S3 test server (moto), for the object-store
fault tests.

Each request is forwarded to the server unless the proxy fails it: every request that matches a rule
(:meth:`FaultProxy.always`), and a seeded share of the others (:meth:`FaultProxy.flaky`). The faults are
what object stores do at scale:

- ``"500"``: ``500 InternalError``, the request not forwarded;
- ``"503"``: ``503 SlowDown`` (throttling), the request not forwarded;
- ``"drop"``: the connection closed before an answer, the request not forwarded;
- ``"lost"``: the request forwarded and done, then the connection closed: its answer lost;
- ``"slow"``: the request forwarded and done, its answer held :attr:`FaultProxy.delay` seconds (longer
  than the client's read timeout: the client gives up and tries again).

Every response closes its connection, so no handler thread outlives its request. :attr:`FaultProxy.log`
records ``(method, path, fault)`` for each request (``fault`` is ``None`` when forwarded), so a test can
show that its faults landed.
"""

from __future__ import annotations

import http.client
import random
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

FAULTS = ("500", "503", "drop", "lost", "slow")

_ERRORS = {
    "500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "503": (503, "SlowDown", "Please reduce your request rate."),
}
#: Headers that belong to one connection, not to the request (RFC 9110, 7.6.1), and Expect, which the
#: proxy answered itself.
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade", "expect"}


class FaultProxy:
    """The proxy: start it with ``with FaultProxy(target) as proxy:``; :attr:`url` is its endpoint."""

    def __init__(self, target: str, *, delay: float = 3.0):
        parts = urlsplit(target)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.delay = delay
        self.log: list[tuple[str, str, str | None]] = []
        self._lock = threading.Lock()
        self._rules: list[tuple[str | None, re.Pattern[str], str]] = []
        self._share, self._faults, self._random = 0.0, FAULTS, random.Random(0)
        self._stop = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        # a client that gave up on a slow answer is no error of the proxy's: no traceback on stderr
        self._server.handle_error = lambda request, address: None  # type: ignore[method-assign]
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()  # a held answer goes at once
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def clear(self) -> None:
        """Forward everything from now on; forget the log."""
        with self._lock:
            self._rules, self._share, self.log = [], 0.0, []

    def flaky(self, share: float, *, seed: int, faults: tuple[str, ...] = FAULTS) -> None:
        """Fail a share of the requests (drawn with ``seed``), each with one of ``faults``."""
        with self._lock:
            self._share, self._faults, self._random = share, faults, random.Random(seed)

    def always(self, fault: str, *, method: str | None = None, path: str = "") -> None:
        """Fail every request whose method is ``method`` (any, by default) and whose path matches ``path``."""
        with self._lock:
            self._rules.append((method, re.compile(path), fault))

    @contextmanager
    def only(self, fault: str, *, method: str | None = None, path: str = "") -> Iterator[None]:
        """:meth:`always`, for the block."""
        self.always(fault, method=method, path=path)
        try:
            yield
        finally:
            self.clear()

    def faulted(self) -> list[tuple[str, str, str | None]]:
        """The requests failed so far."""
        with self._lock:
            return [entry for entry in self.log if entry[2] is not None]

    def _decide(self, method: str, path: str) -> str | None:
        with self._lock:
            fault = next((f for m, p, f in self._rules if m in (None, method) and p.search(path)), None)
            if fault is None and self._share and self._random.random() < self._share:
                fault = self._random.choice(self._faults)
            self.log.append((method, path, fault))
            return fault


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # answers Expect: 100-continue, as S3 does

        def log_message(self, *args: Any) -> None:
            pass

        def _body(self) -> bytes:
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                body = b""
                while size := int(self.rfile.readline().split(b";")[0], 16):
                    body += self.rfile.read(size)
                    self.rfile.readline()
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return body
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
            connection = http.client.HTTPConnection(*proxy.target, timeout=60)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                headers["Content-Length"] = str(len(body))
                connection.request(self.command, self.path, body=body, headers=headers)
                response = connection.getresponse()
                data = response.read()
                kept = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP | {"content-length"}]
                return response.status, response.reason, kept, data
            finally:
                connection.close()

        def _answer(self, status: int, reason: str, headers: list[tuple[str, str]], data: bytes) -> None:
            self.send_response(status, reason)
            for key, value in headers:
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            self.close_connection = True

        def _handle(self) -> None:
            body = self._body()
            fault = proxy._decide(self.command, self.path)
            self.close_connection = True
            if fault == "drop":
                return
            if fault in _ERRORS:
                status, code, message = _ERRORS[fault]
                xml = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}'
                       f"</Message><RequestId>fault-proxy</RequestId></Error>").encode()
                self._answer(status, code, [("Content-Type", "application/xml")], xml)
                return
            answer = self._forward(body)
            if fault == "lost":
                return
            if fault == "slow" and proxy._stop.wait(proxy.delay):
                return
            self._answer(*answer)

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle

    return Handler

