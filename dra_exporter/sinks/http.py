"""The scrape endpoint: a small threaded HTTP(S) server that serves pre-rendered bytes.

Contract: a request never computes anything. The server asks its ``ExpositionSource`` for
the payload of the negotiated format and writes it; rendering happens elsewhere, once per
collection cycle. Routes:

- ``GET``/``HEAD /metrics``: the latest payload (503 until the first frame exists);
  ``Accept: application/openmetrics-text`` selects OpenMetrics, ``Accept-Encoding: gzip``
  a gzip body. ``Content-Length`` is always sent.
- ``/healthz``: 200 while the process serves requests and the collection loop is not
  stalled for long; ``/readyz``: 503 until the first frame and while the loop is stalled,
  else 200 (both ask the ``health`` callback, the agent's watchdog, when there is one);
  ``/``: a tiny HTML page; anything else: 404.

With a ``WebConfig`` (``sinks.webconfig``) the server speaks TLS, may require client
certificates, and asks for basic auth on every path except the two probes: ``/healthz``
and ``/readyz`` say only "ok" or "not ready", and the kubelet's HTTP probes cannot send
credentials. The probes still need TLS when TLS is on (kubelet HTTPS probes do not verify
the certificate, so that works unless client certificates are required).

Staying up under hostile or broken clients:

- Accepting and serving are separate: the accept loop only accepts; each connection gets a
  thread, and the TLS handshake happens there, so a slow TLS client never blocks others.
- Every connection has a deadline, enforced by one watchdog thread that hangs up on
  overdue sockets: ``request_timeout`` from accept for the handshake and first request
  (line, headers, response), ``idle_timeout`` to start the next request on a kept-alive
  connection, then ``request_timeout`` again. Per-``recv`` socket timeouts alone would let
  a client that trickles one byte every few seconds (slowloris) hold a thread forever.
- At most ``max_connections`` connections are served at once; beyond that new ones are
  closed at once, so a flood costs sockets, not unbounded threads and memory.
- Errors from clients (resets, timeouts, TLS failures, plain HTTP on the TLS port) are
  debug logs, never tracebacks; plain HTTP to the TLS port gets a 400 that says so.
"""

from __future__ import annotations

import gzip
import logging
import socket
import socketserver
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, Protocol
from urllib.parse import urlsplit

from ..model import LoopHealth
from .basicauth import AuthVerdict, BasicAuth
from .tls import TlsContexts, peer_san_allowed
from .webconfig import WebConfig

METRICS_PATH = "/metrics"
#: Paths served without basic auth (kubelet probes cannot send credentials).
PROBE_PATHS = frozenset({"/healthz", "/readyz"})

_INDEX_HTML = (
    b"<!DOCTYPE html>\n<html><head><title>dra-exporter</title></head>\n"
    b"<body><h1>dra-exporter</h1><p><a href=\"/metrics\">Metrics</a></p></body></html>\n"
)
_NOT_READY = b"no metrics yet: the first collection cycle has not finished\n"
_UNAUTHORIZED = b"unauthorized\n"
#: The probes' answer without a health callback: alive, ready once there is a frame.
_NO_WATCHDOG = LoopHealth(ready=True, live=True)
_THROTTLED = b"too many failed logins from this address, or too many at once; retry later\n"
_PLAIN = "text/plain; charset=utf-8"
#: What a plain-HTTP client gets from the TLS port (the same words Go's servers use).
_HTTP_ON_TLS_PORT = (b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
                     b"Connection: close\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")
_TLS_HANDSHAKE_RECORD = 0x16


class ListenAddressError(ValueError):
    """The ``listen`` setting is not ``host:port`` / ``[v6]:port``, or cannot be bound."""


@dataclass(slots=True)
class Payload:
    """One rendered exposition. ``body`` is immutable; the gzip form is computed once, by the
    source ahead of time or else by the first request that asks for it, and reused until the
    next frame replaces the payload."""

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

    def payload(self, openmetrics: bool, gzip: bool = False) -> Payload | None:
        """The current payload in the requested format, or None before the first frame.
        ``gzip`` says whether this scrape will send the gzip form (a hint: the source may
        compress later frames ahead of the next such scrape)."""
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
    if "[" in host or "]" in host:
        raise ListenAddressError(f"listen address {listen!r}: unbalanced brackets; write IPv6 addresses "
                                 f"as [ADDRESS]:PORT, e.g. [::]:{port}")
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


# --- connections and their deadlines ---------------------------------------------------------


@dataclass(eq=False, slots=True)
class _Connection:
    sock: socket.socket
    """The socket that owns the file descriptor: the TCP socket, then its TLS wrapper."""
    peer: str
    deadline: float
    served: int = 0


def _hang_up(sock: socket.socket) -> None:
    # The plain socket method, also on an SSLSocket: it acts on the descriptor and leaves
    # the TLS object alone (another thread may be inside it), so the blocked read returns.
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # already closed or never connected


class _Connections:
    """Open connections, their deadlines, and the watchdog that enforces them."""

    def __init__(self, limit: int, tick: float, logger: logging.Logger,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._limit = limit
        self._tick = tick
        self._log = logger
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._open: set[_Connection] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._refusing = False
        #: Connections refused at the limit, and connections cut at their deadline.
        self.refused = 0
        self.expired = 0

    @property
    def count(self) -> int:
        """Connections open now."""
        with self._lock:
            return len(self._open)

    def open(self, sock: socket.socket, peer: str, seconds: float) -> _Connection | None:
        """Register a new connection, or None when ``limit`` connections are already open."""
        conn = None
        with self._lock:
            was_refusing = self._refusing
            if len(self._open) >= self._limit:
                self.refused += 1
                self._refusing = True
            else:
                conn = _Connection(sock, peer, self._monotonic() + seconds)
                self._open.add(conn)
                self._refusing = False
        # Log changes of state only: a flood must not turn into a flood of log lines.
        if conn is None and not was_refusing:
            self._log.warning("http: %d connections open, the limit; refusing new ones until some close",
                              self._limit)
        elif conn is not None and was_refusing:
            self._log.info("http: below the connection limit again; accepting connections")
        return conn

    def arm(self, conn: _Connection, seconds: float) -> None:
        conn.deadline = self._monotonic() + seconds

    def rebind(self, conn: _Connection, sock: socket.socket) -> None:
        with self._lock:
            conn.sock = sock

    def close(self, conn: _Connection) -> None:
        with self._lock:
            # Once removed, the watchdog cannot touch the socket, so closing it is safe.
            self._open.discard(conn)
        try:
            conn.sock.shutdown(socket.SHUT_WR)  # flush the response and send FIN
        except (OSError, ValueError):
            pass
        conn.sock.close()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="metrics-http-deadlines", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the watchdog and hang up on every open connection (their threads then end)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            for conn in self._open:
                _hang_up(conn.sock)

    def _watch(self) -> None:
        while not self._stop.wait(self._tick):
            self.expire(self._monotonic())

    def expire(self, now: float) -> None:
        """Hang up on every connection past its deadline (called by the watchdog)."""
        with self._lock:
            for conn in self._open:
                if conn.deadline <= now:
                    if conn.deadline != float("-inf"):
                        self.expired += 1
                        self._log.debug("http %s: connection past its deadline; hanging up", conn.peer)
                    # Marked so it is counted once; shut down on every tick until its
                    # thread closes it (the shutdown may race with the TLS wrap).
                    conn.deadline = float("-inf")
                    _hang_up(conn.sock)


# --- requests -------------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 lets Prometheus keep its connection open between scrapes; every answer
    # carries Content-Length so keep-alive framing is always correct.
    protocol_version = "HTTP/1.1"
    server_version = "dra-exporter"
    sys_version = ""
    # Nobody speaks HTTP/0.9 to an exporter: a garbled request line still gets a status line.
    default_request_version = "HTTP/1.0"
    # Short plain-text errors instead of the stdlib's HTML page.
    error_message_format = "%(code)d %(message)s\n"
    error_content_type = _PLAIN
    server: _Server

    def __init__(self, request: Any, client_address: Any, server: _Server, conn: _Connection) -> None:
        self._conn = conn
        super().__init__(request, client_address, server)

    def handle_one_request(self) -> None:
        super().handle_one_request()
        if not self.close_connection:
            self._conn.served += 1
            self.server.connections.arm(self._conn, self.server.idle_timeout)

    def parse_request(self) -> bool:
        if self._conn.served:
            # The request line of a later request on a kept-alive connection has arrived:
            # from here the request gets the request timeout, like the first one.
            self.server.connections.arm(self._conn, self.server.request_timeout)
        return super().parse_request()

    def end_headers(self) -> None:
        # Every response, errors included, carries the configured extra headers.
        for name, value in self.server.extra_headers:
            self.send_header(name, value)
        super().end_headers()

    def do_GET(self) -> None:
        self._respond(send_body=True)

    def do_HEAD(self) -> None:
        self._respond(send_body=False)

    def _respond(self, *, send_body: bool) -> None:
        path = urlsplit(self.path).path
        auth = self.server.auth
        verdict = AuthVerdict.OK if auth is None or path in PROBE_PATHS else \
            auth.verdict(self.headers.get("Authorization"), self.client_address[0])
        if verdict is AuthVerdict.DENIED:
            # Never log what was sent: it may be a password typed into the wrong field.
            self.server.logger.debug("http %s: basic auth failed", self.client_address[0])
            self._send(401, _PLAIN, _UNAUTHORIZED, send_body,
                       extra=(("WWW-Authenticate", 'Basic realm="dra-exporter", charset="UTF-8"'),))
        elif verdict is AuthVerdict.THROTTLED and auth is not None:
            self.server.logger.debug("http %s: basic auth not checked (failed-login budget spent, or busy)",
                                     self.client_address[0])
            self._send(429, _PLAIN, _THROTTLED, send_body, extra=(("Retry-After", str(auth.retry_after)),))
        elif path == METRICS_PATH:
            self._metrics(send_body)
        elif path in PROBE_PATHS:
            self._probe(path, send_body)
        elif path == "/":
            self._send(200, "text/html; charset=utf-8", _INDEX_HTML, send_body)
        else:
            self._send(404, _PLAIN, b"not found; metrics are at /metrics\n", send_body)

    def _probe(self, path: str, send_body: bool) -> None:
        health = self.server.health() if self.server.health is not None else _NO_WATCHDOG
        if path == "/healthz":
            ok = health.live
        else:
            ok = health.ready and self.server.source.payload(False) is not None
        why = health.reason.encode() + b"\n" if health.reason else _NOT_READY
        self._send(200 if ok else 503, _PLAIN, b"ok\n" if ok else why, send_body)

    def _metrics(self, send_body: bool) -> None:
        openmetrics = _accepts(self.headers.get("Accept"), "application/openmetrics-text")
        gzipped = _accepts(self.headers.get("Accept-Encoding"), "gzip")
        payload = self.server.source.payload(openmetrics, gzipped)
        if payload is None:
            self._send(503, _PLAIN, _NOT_READY, send_body)
            return
        if gzipped:
            self._send(200, payload.content_type, payload.gzipped(), send_body, encoding="gzip")
        else:
            self._send(200, payload.content_type, payload.body, send_body)

    def _send(self, status: int, content_type: str, body: bytes, send_body: bool, encoding: str = "",
              extra: tuple[tuple[str, str], ...] = ()) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if encoding:
            self.send_header("Content-Encoding", encoding)
        for name, value in extra:
            self.send_header(name, value)
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


@dataclass(frozen=True, slots=True)
class _Limits:
    request_timeout: float
    idle_timeout: float
    max_connections: int


class _Server(HTTPServer):
    # The listen backlog: socketserver's default of 5 drops SYNs when a few dozen scrapers
    # (or HA Prometheus pairs behind a NAT) connect at the same moment.
    request_queue_size = 128

    def __init__(self, address: ListenAddress, source: ExpositionSource, logger: logging.Logger,
                 limits: _Limits, web: WebConfig | None, health: Callable[[], LoopHealth] | None) -> None:
        self.address_family = address.family
        self.source = source
        self.health = health
        self.logger = logger
        self.request_timeout = limits.request_timeout
        self.idle_timeout = limits.idle_timeout
        # A backstop for one blocking call; the watchdog enforces the real deadlines.
        self.io_timeout = max(limits.request_timeout, limits.idle_timeout)
        tick = min(0.5, limits.request_timeout / 4, limits.idle_timeout / 4)
        self.connections = _Connections(limits.max_connections, tick, logger)
        self.tls = TlsContexts(web.tls, logger=logger) if web is not None and web.tls is not None else None
        self.auth = BasicAuth(web.users) if web is not None and web.users else None
        self.extra_headers = web.headers if web is not None else ()
        super().__init__((address.host, address.port), _Handler)  # type: ignore[arg-type]

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN, a DNS round trip that can hang
        # start-up on an isolated node; the name is only used in CGI variables.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Runs in the accept loop: register the connection and hand it to its own thread."""
        conn = self.connections.open(request, client_address[0], self.request_timeout)
        if conn is None:
            self.shutdown_request(request)
            return
        try:
            threading.Thread(target=self._serve, args=(conn, client_address), name="metrics-http-conn",
                             daemon=True).start()
        except RuntimeError:  # no thread could be started: shed this connection, keep accepting
            self.logger.warning("http %s: cannot start a thread for the connection", client_address[0])
            self.connections.close(conn)

    def _serve(self, conn: _Connection, client_address: Any) -> None:
        """Runs in the connection's thread: TLS handshake (if any), then HTTP requests."""
        try:
            conn.sock.settimeout(self.io_timeout)
            sock = self._secure(conn) if self.tls is not None else conn.sock
            if sock is not None:
                _Handler(sock, client_address, self, conn)
        except Exception:  # noqa: BLE001 - one connection must never take the server down
            self.handle_error(conn.sock, client_address)
        finally:
            self.connections.close(conn)

    def _secure(self, conn: _Connection) -> ssl.SSLSocket | None:
        """The TLS socket after a completed handshake, or None when the client is turned away."""
        assert self.tls is not None
        raw = conn.sock
        try:
            first = raw.recv(1, socket.MSG_PEEK)
        except OSError:
            return None
        if not first:
            return None
        if first[0] != _TLS_HANDSHAKE_RECORD:
            self.logger.debug("http %s: plain HTTP (or junk) on the TLS port", conn.peer)
            if first.isalpha():  # an HTTP method: tell the client what went wrong
                try:
                    raw.sendall(_HTTP_ON_TLS_PORT)
                except OSError:
                    pass
            return None
        sock = self.tls.context().wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
        # Rebind before the handshake, so the watchdog can cut a handshake that trickles.
        self.connections.rebind(conn, sock)
        try:
            sock.do_handshake()
        except (ssl.SSLError, OSError) as exc:
            self.logger.debug("http %s: TLS handshake failed: %s", conn.peer, exc)
            return None
        allowed = self.tls.settings.client_allowed_sans
        if allowed and not peer_san_allowed(sock.getpeercert(), allowed):
            self.logger.debug("http %s: client certificate has none of the allowed SANs", conn.peer)
            return None
        return sock

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that hang up, time out or fail TLS are routine; anything else is a bug
        # worth a log line, but never a traceback on stderr that kills nothing.
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            self.logger.debug("http %s: connection dropped: %s", client_address[0], exc)
        else:
            self.logger.error("http %s: request failed", client_address[0], exc_info=exc)


class MetricsServer:
    """Owns the listening socket, the accept thread and the deadline watchdog."""

    def __init__(self, listen: str, source: ExpositionSource, *, logger: logging.Logger,
                 request_timeout: float = 10.0, idle_timeout: float = 60.0, max_connections: int = 256,
                 web_config: WebConfig | None = None, health: Callable[[], LoopHealth] | None = None) -> None:
        """``health``: what the probes answer (cheap, called per probe); None: always alive, and
        ready once ``source`` has a payload."""
        if request_timeout <= 0 or idle_timeout <= 0:
            raise ValueError(f"timeouts must be positive, got request {request_timeout}, idle {idle_timeout}")
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections}")
        self._address = parse_listen(listen)
        self._listen = listen
        self._source = source
        self._logger = logger
        self._limits = _Limits(request_timeout, idle_timeout, max_connections)
        self._web = web_config
        self._health = health
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("metrics server already started")
        try:
            server = _Server(self._address, self._source, self._logger, self._limits, self._web, self._health)
        except OSError as exc:
            raise ListenAddressError(f"cannot listen on {self._listen}: {exc.strerror or exc}") from exc
        self._server = server
        server.connections.start()
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="metrics-http", daemon=True)
        self._thread.start()
        security = self._web.describe() if self._web is not None else "plain HTTP"
        self._logger.info("serving metrics on %s (port %d, %s)", self._listen, self.port, security)

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("metrics server is not started")
        return int(self._server.server_address[1])

    @property
    def connections(self) -> _Connections:
        """Open connections and their counters (for tests and self-diagnosis)."""
        if self._server is None:
            raise RuntimeError("metrics server is not started")
        return self._server.connections

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        server.connections.stop()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
