"""The scrape endpoint: a small threaded HTTP server that serves pre-rendered bytes.

Contract: a request never computes anything. The server asks its ``ExpositionSource`` for
the payload of the negotiated format and writes it; rendering happens elsewhere, once per
collection cycle. Routes:

- ``GET``/``HEAD /metrics``: the latest payload (503 until the first frame exists);
  ``Accept: application/openmetrics-text`` selects OpenMetrics, ``Accept-Encoding: gzip``
  a gzip body. ``Content-Length`` is always sent.
- ``/healthz``: 200 while the process serves requests; ``/readyz``: 503 until the first
  frame, then 200; ``/``: a tiny HTML page; anything else: 404.

Every connection gets a socket timeout so a client that connects and stalls holds one
daemon thread for at most ``request_timeout`` seconds and never blocks other scrapes.
"""

from __future__ import annotations

import gzip
import logging
import socket
import socketserver
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol
from urllib.parse import urlsplit

METRICS_PATH = "/metrics"

_INDEX_HTML = (
    b"<!DOCTYPE html>\n<html><head><title>dra-exporter</title></head>\n"
    b"<body><h1>dra-exporter</h1><p><a href=\"/metrics\">Metrics</a></p></body></html>\n"
)
_NOT_READY = b"no metrics yet: the first collection cycle has not finished\n"
_PLAIN = "text/plain; charset=utf-8"


class ListenAddressError(ValueError):
    """The ``listen`` setting is not ``host:port`` / ``[v6]:port``, or cannot be bound."""


@dataclass(slots=True)
class Payload:
    """One rendered exposition. ``body`` is immutable; the gzip form is computed on the
    first request that asks for it and reused until the next frame replaces the payload."""

    body: bytes
    content_type: str
    _gzipped: bytes | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def gzipped(self) -> bytes:
        if self._gzipped is None:
            # The lock makes "compressed once per frame" hold even when several scrapers
            # arrive together right after a publish.
            with self._lock:
                if self._gzipped is None:
                    # mtime=0 keeps the compressed bytes a pure function of the body.
                    self._gzipped = gzip.compress(self.body, compresslevel=6, mtime=0)
        return self._gzipped


class ExpositionSource(Protocol):
    """What the server reads on each scrape: must be a cheap lookup."""

    def payload(self, openmetrics: bool) -> Payload | None:
        """The current payload in the requested format, or None before the first frame."""
        ...


@dataclass(frozen=True, slots=True)
class ListenAddress:
    host: str
    port: int
    family: socket.AddressFamily


def parse_listen(listen: str) -> ListenAddress:
    """Parse ``host:port``, ``:port`` (all IPv4 addresses) or ``[v6addr]:port``."""
    text = listen.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ListenAddressError(
            f"listen address {listen!r} must look like HOST:PORT, :PORT or [IPV6]:PORT")
    port = int(port_text)
    if port > 65535:
        raise ListenAddressError(f"listen address {listen!r}: port {port} is out of range 0-65535")
    if host.startswith("[") and host.endswith("]"):
        return ListenAddress(host[1:-1], port, socket.AF_INET6)
    if ":" in host:
        # A bare IPv6 address is ambiguous with the port separator; insist on brackets.
        raise ListenAddressError(f"listen address {listen!r}: write IPv6 addresses in brackets, "
                                 f"e.g. [::]:{port}")
    return ListenAddress(host or "0.0.0.0", port, socket.AF_INET)


def _accepts(header: str | None, wanted: str) -> bool:
    """Whether an Accept/Accept-Encoding header lists ``wanted`` with a non-zero q."""
    if not header:
        return False
    for item in header.split(","):
        token, *params = (part.strip() for part in item.split(";"))
        if token.lower() != wanted:
            continue
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    return float(value) > 0
                except ValueError:
                    return False
        return True
    return False


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 lets Prometheus keep its connection open between scrapes; every answer
    # carries Content-Length so keep-alive framing is always correct.
    protocol_version = "HTTP/1.1"
    server_version = "dra-exporter"
    sys_version = ""
    server: _Server

    def do_GET(self) -> None:
        self._respond(send_body=True)

    def do_HEAD(self) -> None:
        self._respond(send_body=False)

    def _respond(self, *, send_body: bool) -> None:
        path = urlsplit(self.path).path
        if path == METRICS_PATH:
            self._metrics(send_body)
        elif path == "/healthz":
            self._send(200, _PLAIN, b"ok\n", send_body)
        elif path == "/readyz":
            ready = self.server.source.payload(False) is not None
            self._send(200 if ready else 503, _PLAIN, b"ok\n" if ready else _NOT_READY, send_body)
        elif path == "/":
            self._send(200, "text/html; charset=utf-8", _INDEX_HTML, send_body)
        else:
            self._send(404, _PLAIN, b"not found; metrics are at /metrics\n", send_body)

    def _metrics(self, send_body: bool) -> None:
        openmetrics = _accepts(self.headers.get("Accept"), "application/openmetrics-text")
        payload = self.server.source.payload(openmetrics)
        if payload is None:
            self._send(503, _PLAIN, _NOT_READY, send_body)
            return
        if _accepts(self.headers.get("Accept-Encoding"), "gzip"):
            self._send(200, payload.content_type, payload.gzipped(), send_body, encoding="gzip")
        else:
            self._send(200, payload.content_type, payload.body, send_body)

    def _send(self, status: int, content_type: str, body: bytes, send_body: bool,
              encoding: str = "") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if encoding:
            self.send_header("Content-Encoding", encoding)
        # Caches in between must key on the negotiated format and encoding.
        self.send_header("Vary", "Accept, Accept-Encoding")
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        # A scrape every second per Prometheus would flood stderr; access logs are off.
        pass

    def log_error(self, format: str, *args: object) -> None:
        # Malformed requests and timeouts are the client's problem: debug, not error.
        self.server.logger.debug("http %s: " + format, self.client_address[0], *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # stop() must not wait for a stalled client's thread; its socket timeout ends it.
    block_on_close = False

    def __init__(self, address: ListenAddress, source: ExpositionSource,
                 logger: logging.Logger, request_timeout: float) -> None:
        self.address_family = address.family
        self.source = source
        self.logger = logger
        self.request_timeout = request_timeout
        super().__init__((address.host, address.port), _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN, a DNS round trip that can hang
        # start-up on an isolated node; the name is only used in CGI variables.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def finish_request(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        # Set before the handler reads anything: the timeout covers the request line,
        # headers and the write of the body.
        request.settimeout(self.request_timeout)
        super().finish_request(request, client_address)

    def handle_error(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        # Clients that hang up mid-response are routine; anything else is a bug worth a
        # log line, but never a traceback on stderr that kills nothing.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            self.logger.debug("http %s: connection dropped: %s", client_address[0], exc)
        else:
            self.logger.error("http %s: request failed", client_address[0], exc_info=exc)


class MetricsServer:
    """Owns the listening socket and the serving thread."""

    def __init__(self, listen: str, source: ExpositionSource, *, logger: logging.Logger,
                 request_timeout: float = 10.0) -> None:
        if request_timeout <= 0:
            raise ValueError(f"request timeout must be positive, got {request_timeout}")
        self._address = parse_listen(listen)
        self._listen = listen
        self._source = source
        self._logger = logger
        self._timeout = request_timeout
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("metrics server already started")
        try:
            server = _Server(self._address, self._source, self._logger, self._timeout)
        except OSError as exc:
            raise ListenAddressError(f"cannot listen on {self._listen}: {exc.strerror or exc}") from exc
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="metrics-http", daemon=True)
        self._thread.start()
        self._logger.info("serving metrics on %s (port %d)", self._listen, self.port)

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("metrics server is not started")
        return int(self._server.server_address[1])

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
