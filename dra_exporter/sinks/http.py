"""The scrape endpoint: a small threaded HTTP(S) server that serves pre-rendered bytes.

Contract: a request never computes anything. The server asks its ``ExpositionSource`` for
the payload of the negotiated format and writes it; rendering happens elsewhere, once per
collection cycle. Routes:

- ``GET``/``HEAD /metrics``: the latest payload (503 until the first frame exists);
  ``Accept`` and ``Accept-Encoding`` are ranked by their q-values (``negotiate_openmetrics``,
  ``negotiate_gzip``) to choose OpenMetrics or text, gzip or not. ``Content-Length`` is
  always sent.
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
- At most ``max_connections`` connections are served at once, and at most
  ``max_connections_per_client`` from one peer address, so one client cannot hold every slot.
  Beyond a cap a connection may still take one of ``PROBE_RESERVE`` reserve slots (at most
  ``PROBE_RESERVE_PER_CLIENT`` per peer, and only for a peer that holds at most
  ``PROBE_RESERVE_MAX_HELD`` ordinary connections) that answer one ``/healthz``, ``/readyz`` or
  ``/metrics`` request and nothing else (503), within ``PROBE_DEADLINE_S``: the kubelet's probes
  and Prometheus's scrapes get through a flood from a few addresses that holds every ordinary slot.
  Beyond that, new connections are closed at once, so a flood costs sockets, not unbounded threads
  and memory.
- A connection whose thread cannot start (a pids limit, an address space full of thread stacks) waits,
  with ``PROBE_DEADLINE_S`` and at most ``SPARE_QUEUE`` of them, for one of ``SPARE_THREADS`` threads
  started with the server; they serve, one request each, whichever waiting connection has sent
  something first (``poll``), so a silent client costs a place in the queue, not the scrapes and
  probes behind it. The failure is logged at most once every ``THREAD_FAILURE_LOG_S``, with a count.
  Spare threads started in advance rather than a smaller stack (``threading.stack_size`` is
  process-wide, so a deep recursion in any later thread would crash the process instead of raising,
  and a pids limit fails whatever the stack) or a pool for every connection (while threads can
  start, a thread per connection keeps a slow client from delaying the others).
- A request's head (request line and headers) is read in small chunks and counted: at most
  ``MAX_HEAD_BYTES`` in total (Go's and so exporter-toolkit's default), the first
  ``HEAD_ALLOWANCE_BYTES`` of it free, the rest borrowed from one server-wide budget of
  ``SHARED_HEAD_BYTES``. A head over its bound, or one that wants more when the budget is
  spent, gets 431 and the connection closes: a header flood costs at most the budget plus
  each connection's allowance, and scrapes (a few hundred bytes of head) never wait on it.
- Requests carrying a body (``Content-Length`` above 0, ``Transfer-Encoding``) or framing it
  ambiguously (conflicting or malformed ``Content-Length``) get 400 and the connection
  closes: no route takes a body, and one that is not read would be parsed as the next
  request. Every error answer closes its connection.
- Accepted sockets have Nagle off (``TCP_NODELAY``): a kept-alive connection's answers go
  out at once instead of waiting ~40 ms for the client's delayed ACK.
- Errors from clients (resets, timeouts, TLS failures, plain HTTP on the TLS port) are
  debug logs, never tracebacks; plain HTTP to the TLS port gets a 400 that says so.
"""

from __future__ import annotations

import gzip
import logging
import re
import select
import socket
import socketserver
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, BinaryIO, Final, Protocol, cast
from urllib.parse import urlsplit

from ..model import LoopHealth
from .basicauth import AuthVerdict, BasicAuth
from .tls import TlsContexts, peer_san_allowed
from .webconfig import WebConfig

METRICS_PATH = "/metrics"
#: Paths served without basic auth (kubelet probes cannot send credentials).
PROBE_PATHS = frozenset({"/healthz", "/readyz"})
#: What a reserve connection (over a cap) answers: the probes, and a scrape, so that a flood from a
#: few addresses stops neither the kubelet nor Prometheus (each holds at most one connection).
RESERVE_PATHS = PROBE_PATHS | {METRICS_PATH}

_INDEX_HTML = (
    b"<!DOCTYPE html>\n<html><head><title>dra-exporter</title></head>\n"
    b"<body><h1>dra-exporter</h1><p><a href=\"/metrics\">Metrics</a></p></body></html>\n"
)
_NOT_READY = b"no metrics yet: the first collection cycle has not finished\n"
_UNAUTHORIZED = b"unauthorized\n"
#: The probes' answer without a health callback: alive, ready once there is a frame.
_NO_WATCHDOG = LoopHealth(ready=True, live=True)
_THROTTLED = b"too many failed logins from this address, or too many at once; retry later\n"
_OVER_CAP = b"too many connections: only /healthz and /readyz are answered on this one\n"
_PLAIN = "text/plain; charset=utf-8"
#: What a plain-HTTP client gets from the TLS port (the same words Go's servers use).
_HTTP_ON_TLS_PORT = (b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
                     b"Connection: close\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")
_TLS_HANDSHAKE_RECORD = 0x16

#: The most bytes one request's head (request line and headers together) may have: Go's
#: ``http.DefaultMaxHeaderBytes``, which exporter-toolkit's servers keep. The stdlib's own
#: limits (64 KiB a line, 100 headers) stay on top; alone they let one head hold 6.4 MB.
MAX_HEAD_BYTES: Final = 1 << 20
#: What any connection may hold of its current head without drawing on the shared budget:
#: a Prometheus scrape's head is ~300 bytes, one with basic auth and a proxy's headers a few KiB.
HEAD_ALLOWANCE_BYTES: Final = 8 << 10
#: Head bytes beyond their allowances that all connections together may hold. With the
#: allowances (``max_connections`` x 8 KiB) it bounds what a header flood can make the
#: server keep, whatever the number of connections.
SHARED_HEAD_BYTES: Final = 8 << 20
#: Heads are read at most this much at a time, so what a connection holds uncounted is small.
_HEAD_CHUNK = 4096
#: Extra connections, beyond the caps, that answer one probe request and nothing else.
PROBE_RESERVE: Final = 8
#: Of those, how many one peer address may hold (a liveness and a readiness probe at once).
PROBE_RESERVE_PER_CLIENT: Final = 2
#: Only a peer that holds at most this many ordinary connections may take a reserve slot: the
#: kubelet opens a connection per probe and holds none between them, while a flood from a few
#: addresses holds many per address (a flood from 8 addresses used to take the whole reserve).
PROBE_RESERVE_MAX_HELD: Final = 1
#: The deadline of a reserve connection (a kubelet probe times out after 1 s by default).
PROBE_DEADLINE_S: Final = 2.0
#: Threads started with the server that serve, one request at a time, the connections whose own
#: thread cannot start: two, so that a scrape and a probe are answered together.
SPARE_THREADS: Final = 2
#: Connections waiting for a spare thread; beyond that a connection is closed at once. Each waits at
#: most ``PROBE_DEADLINE_S`` (the watchdog hangs up on it) and costs a socket while it waits.
SPARE_QUEUE: Final = 64
#: How often a spare thread looks again at the waiting connections (new ones join between looks).
_SPARE_POLL_MS: Final = 50
#: Seconds between two log lines about threads that cannot start (each says how many since the last).
THREAD_FAILURE_LOG_S: Final = 60.0
#: After an error answer to a client that may still be sending (431, 400 with a body), its
#: input is read and dropped for at most this long (and ``_LINGER_BYTES``) before the socket is
#: closed: closing with unread input sends a RST, which can destroy the answer before the
#: client reads it (Go's server waits 500 ms for the same reason).
_LINGER_S = 0.5
_LINGER_BYTES = 256 << 10
_ASCII_DIGITS = re.compile(r"[0-9]+", re.ASCII)


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
    # ASCII only: str.isdigit() is also true for '²' (which int() refuses) and for '٣' (which
    # int() reads as 3).
    if not sep or not _ASCII_DIGITS.fullmatch(port_text):
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


# --- content negotiation -------------------------------------------------------------------------

#: RFC 9110's qvalue: 0 to 1 with at most three decimals, ASCII digits only.
_QVALUE = re.compile(r"0(\.[0-9]{0,3})?|1(\.0{0,3})?", re.ASCII)
#: Versions of each format that we can answer with (as client_golang's expfmt.Negotiate).
_OPENMETRICS_VERSIONS = frozenset({"", "0.0.1", "1.0.0"})
_TEXT_VERSIONS = frozenset({"", "0.0.4"})


@dataclass(frozen=True, slots=True)
class _Choice:
    """One element of an Accept or Accept-Encoding list."""

    token: str
    """The media range or content coding, lower-cased."""
    q: float
    params: dict[str, str]


def _choices(header: str | None) -> list[_Choice]:
    """The elements of an Accept-style header, in the client's order. A q that is not an RFC
    9110 qvalue counts as 0 (as Go's ``strconv.ParseFloat`` error does in goautoneg)."""
    choices = []
    for item in (header or "").split(","):
        token, *params = (part.strip() for part in item.split(";"))
        if not token:
            continue
        q, named = 1.0, {}
        for param in params:
            key, _, value = (x.strip() for x in param.partition("="))
            if key.lower() == "q":
                q = float(value) if _QVALUE.fullmatch(value) else 0.0
            else:
                named[key.lower()] = value.strip('"')
        choices.append(_Choice(token.lower(), q, named))
    return choices


def negotiate_openmetrics(accept: str | None) -> bool:
    """Whether to answer OpenMetrics rather than the text format, from an ``Accept`` header.

    As client_golang's ``expfmt.NegotiateIncludingOpenMetrics``: the media ranges are ranked
    by q (a stable sort: equal q keeps the client's order) and the first one we can serve
    decides (``application/openmetrics-text`` in version 0.0.1 or 1.0.0, ``text/plain`` in
    0.0.4, or either without a version); wildcards and other types decide nothing, and
    without a match the answer is text. Unlike goautoneg, q=0 means "not acceptable" (RFC 9110
    section 12.4.2), so such a range is never chosen."""
    for choice in sorted(_choices(accept), key=lambda c: -c.q):
        if choice.q <= 0:
            break
        version = choice.params.get("version", "")
        if choice.token == "application/openmetrics-text" and version in _OPENMETRICS_VERSIONS:
            return True
        if choice.token == "text/plain" and version in _TEXT_VERSIONS:
            return False
    return False


def negotiate_gzip(accept_encoding: str | None) -> bool:
    """Whether to send the gzip form, from an ``Accept-Encoding`` header.

    As client_golang's ``httputil.NegotiateContentEncoding`` with the offers gzip, then
    identity: gzip unless identity has a strictly higher q; ``*`` stands for a coding the
    header does not name. Where Go lets ``*`` override an explicit ``gzip;q=0``, the explicit
    entry wins here (RFC 9110 section 12.5.3), and q=0 always means "not acceptable"."""
    named: dict[str, float] = {}
    for choice in _choices(accept_encoding):
        named.setdefault(choice.token, choice.q)
    wildcard = named.get("*", 0.0)
    gzip_q = named.get("gzip", wildcard)
    identity_q = named.get("identity", wildcard)
    return gzip_q > 0 and gzip_q >= identity_q


# --- request heads and what they may hold --------------------------------------------------------


class HeadTooLarge(Exception):
    """A request head over ``MAX_HEAD_BYTES``, or wanting more when the shared budget is spent."""


class _HeadBudget:
    """The server-wide budget of head bytes held beyond the connections' own allowances."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self.held = 0
        #: The most ever held at once (tests check it against ``limit``).
        self.peak = 0

    def take(self, size: int) -> bool:
        with self._lock:
            if self.held + size > self.limit:
                return False
            self.held += size
            self.peak = max(self.peak, self.held)
            return True

    def give_back(self, size: int) -> None:
        with self._lock:
            self.held -= size


class _HeadReader:
    """A connection's buffered input that counts the bytes of the request head being read.

    The stdlib reads the request line and each header line whole (64 KiB each, 100 headers)
    and keeps them all until the blank line; this reader hands it each line in chunks of
    ``_HEAD_CHUNK``, charging them to the head as they arrive: free up to the allowance, then
    from the shared budget, never beyond ``MAX_HEAD_BYTES``. Past a bound it raises
    ``HeadTooLarge`` (the handler answers 431). ``end_of_request`` gives back what the
    request borrowed."""

    def __init__(self, raw: BinaryIO, budget: _HeadBudget) -> None:
        self._raw = raw
        self._budget = budget
        self._held = 0
        self._borrowed = 0

    def readline(self, limit: int = -1) -> bytes:
        pieces = []
        wanted = limit if limit >= 0 else MAX_HEAD_BYTES + 1
        while wanted > 0:
            piece = self._raw.readline(min(_HEAD_CHUNK, wanted))
            if not piece:
                break
            self._charge(len(piece))
            pieces.append(piece)
            wanted -= len(piece)
            if piece.endswith(b"\n"):
                break
        return b"".join(pieces)

    def _charge(self, size: int) -> None:
        self._held += size
        if self._held > MAX_HEAD_BYTES:
            raise HeadTooLarge(f"the request head is over {MAX_HEAD_BYTES} bytes")
        beyond = max(0, self._held - HEAD_ALLOWANCE_BYTES) - self._borrowed
        if beyond > 0:
            if not self._budget.take(beyond):
                raise HeadTooLarge("large request heads are using the server's whole header budget; "
                                   f"heads up to {HEAD_ALLOWANCE_BYTES} bytes are still served")
            self._borrowed += beyond

    def end_of_request(self) -> None:
        self._budget.give_back(self._borrowed)
        self._held = self._borrowed = 0

    def read(self, size: int = -1) -> bytes:
        return self._raw.read(size)  # never called: no route reads a body

    def close(self) -> None:
        self._raw.close()


# --- connections and their deadlines ---------------------------------------------------------


@dataclass(eq=False, slots=True)
class _Connection:
    sock: socket.socket
    """The socket that owns the file descriptor: the TCP socket, then its TLS wrapper."""
    peer: str
    deadline: float
    served: int = 0
    probe_only: bool = False
    """A reserve connection, over a cap: one probe or scrape request (``RESERVE_PATHS``), nothing else."""
    answered_probe: bool = False
    counted_refused: bool = False
    one_request: bool = False
    """Served by a spare thread (its own could not start): one request, then closed."""


def _hang_up(sock: socket.socket) -> None:
    # The plain socket method, also on an SSLSocket: it acts on the descriptor and leaves
    # the TLS object alone (another thread may be inside it), so the blocked read returns.
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # already closed or never connected


class _Connections:
    """Open connections, their caps and deadlines, and the watchdog that enforces the deadlines."""

    def __init__(self, limit: int, per_client: int, tick: float, logger: logging.Logger,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._limit = limit
        self._per_client = per_client
        self._tick = tick
        self._log = logger
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._open: set[_Connection] = set()
        #: Ordinary and reserve connections open now, by peer address (no entry at zero).
        self._by_peer: dict[str, int] = {}
        self._reserve_by_peer: dict[str, int] = {}
        self._reserved = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Whether the global cap turned the last connection away, and the peers at their own
        #: cap (at most max_connections / per_client of them): what "refusing" is logged from.
        self._full = False
        self._capped_peers: set[str] = set()
        #: Connections refused at a cap (closed at once, or a reserve connection that served no
        #: probe), and connections cut at their deadline.
        self.refused = 0
        self.expired = 0

    @property
    def count(self) -> int:
        """Connections open now, reserve connections included."""
        with self._lock:
            return len(self._open)

    @property
    def reserved(self) -> int:
        """Reserve connections open now (over a cap, for probes only)."""
        with self._lock:
            return self._reserved

    def open(self, sock: socket.socket, peer: str, seconds: float) -> _Connection | None:
        """Register a new connection: an ordinary one while under both caps, else a reserve one
        (``probe_only``, ``PROBE_DEADLINE_S``) while the reserve has room, else None."""
        conn = None
        with self._lock:
            was_refusing = self._refusing
            self._full = len(self._open) - self._reserved >= self._limit
            if self._by_peer.get(peer, 0) >= self._per_client:
                self._capped_peers.add(peer)
            if not self._full and peer not in self._capped_peers:
                conn = _Connection(sock, peer, self._monotonic() + seconds)
                self._by_peer[peer] = self._by_peer.get(peer, 0) + 1
            elif (self._reserved < PROBE_RESERVE and self._reserve_by_peer.get(peer, 0) < PROBE_RESERVE_PER_CLIENT
                  and self._by_peer.get(peer, 0) <= PROBE_RESERVE_MAX_HELD):
                conn = _Connection(sock, peer, self._monotonic() + min(seconds, PROBE_DEADLINE_S),
                                   probe_only=True)
                self._reserve_by_peer[peer] = self._reserve_by_peer.get(peer, 0) + 1
                self._reserved += 1
            else:
                self.refused += 1
            if conn is not None:
                self._open.add(conn)
            refusing = self._refusing
        # Log changes of state only: a flood must not turn into a flood of log lines.
        if refusing and not was_refusing:
            self._log.warning("http: a connection cap is reached (%d in all, %d per client address); refusing "
                              "new ones until some close, except for a few that may ask for /healthz or /readyz",
                              self._limit, self._per_client)
        elif was_refusing and not refusing:
            self._log.info("http: below the connection caps again; serving new connections")
        return conn

    @property
    def _refusing(self) -> bool:
        """Whether some cap turns connections away now; the caller holds the lock."""
        return self._full or bool(self._capped_peers)

    def _forget(self, conn: _Connection) -> None:
        """Drop ``conn`` from the counts; the caller holds the lock."""
        if conn not in self._open:
            return
        self._open.discard(conn)
        counts = self._reserve_by_peer if conn.probe_only else self._by_peer
        counts[conn.peer] -= 1
        if not counts[conn.peer]:
            del counts[conn.peer]
        if not conn.probe_only:
            self._capped_peers.discard(conn.peer)  # it is below its cap again
        if conn.probe_only:
            self._reserved -= 1
            self._count_refused(conn)

    def _count_refused(self, conn: _Connection) -> None:
        """A reserve connection that served no probe counts as refused, once; the caller holds the lock."""
        if conn.probe_only and not conn.answered_probe and not conn.counted_refused:
            conn.counted_refused = True
            self.refused += 1

    def arm(self, conn: _Connection, seconds: float) -> None:
        conn.deadline = self._monotonic() + seconds

    def rebind(self, conn: _Connection, sock: socket.socket) -> None:
        with self._lock:
            conn.sock = sock

    def close(self, conn: _Connection) -> None:
        with self._lock:
            # Once removed, the watchdog cannot touch the socket, so closing it is safe.
            self._forget(conn)
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
                    self._count_refused(conn)  # before the client can see the hang-up
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

    rfile: _HeadReader  # type: ignore[assignment]

    def __init__(self, request: Any, client_address: Any, server: _Server, conn: _Connection) -> None:
        self._conn = conn
        #: Whether the client may still be sending when the connection closes (see _LINGER_S).
        self.linger = False
        super().__init__(request, client_address, server)

    def setup(self) -> None:
        super().setup()
        # The stdlib's setup has just made rfile the socket's buffered reader; the class declares
        # it as the _HeadReader that wraps that reader from here on.
        self.rfile = _HeadReader(cast(BinaryIO, self.rfile), self.server.head_budget)

    def handle_one_request(self) -> None:
        # What send_error needs if the head is refused before its request line is parsed.
        self.command, self.request_version, self.requestline = "", self.default_request_version, ""
        try:
            super().handle_one_request()
        except HeadTooLarge as exc:
            self.linger = True
            self.send_error(431, "Request Header Fields Too Large", str(exc))
        finally:
            self.rfile.end_of_request()
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
        framing_error = _body_framing_error(self.headers)
        if self._conn.probe_only:
            self._conn.answered_probe = not framing_error and path in RESERVE_PATHS
        if framing_error:
            self.linger = True
            self.send_error(400, "Bad Request", framing_error)
            return
        if self._conn.probe_only and path not in RESERVE_PATHS:
            # A reserve connection (over a cap) answers a probe or a scrape, and nothing else.
            self._send(503, _PLAIN, _OVER_CAP, send_body)
            return
        # Checked only once the request is known to be served: a check may cost a bcrypt run.
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
        openmetrics = negotiate_openmetrics(self.headers.get("Accept"))
        gzipped = negotiate_gzip(self.headers.get("Accept-Encoding"))
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
        if self._conn.probe_only or self._conn.one_request:
            self.send_header("Connection", "close")  # one request per reserve or spare-thread connection
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


def _body_framing_error(headers: Any) -> str:
    """Why a request's body framing is refused (no route takes a body), or "" when it has none.

    Go's server would read and drop such a body; the issue asks for what proxy-safe servers
    do: refuse it, so that a body nobody reads can never be taken for the next request."""
    if headers.get("Transfer-Encoding") is not None:
        return "a request with Transfer-Encoding: no route here takes a body"
    lengths = {value.strip() for value in headers.get_all("Content-Length") or ()}
    if len(lengths) > 1:
        return "conflicting Content-Length headers"
    for length in lengths:
        if not _ASCII_DIGITS.fullmatch(length):
            return "a malformed Content-Length"
        if int(length) > 0:
            return "a request with a body: no route here takes one"
    return ""


def _linger(sock: socket.socket) -> None:
    """Send FIN, then read and drop what the client still sends, for a bounded time and size."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_WR)
        sock.settimeout(_LINGER_S)
        until, dropped, scratch = time.monotonic() + _LINGER_S, 0, bytearray(16384)
        # Raw reads, below TLS: these bytes are only being dropped.
        while dropped < _LINGER_BYTES and time.monotonic() < until:
            got = socket.socket.recv_into(sock, scratch)
            if not got:
                break
            dropped += got
    except OSError:
        pass  # reset, timed out or already shut down: closing is all that is left


def _disable_nagle(sock: socket.socket) -> None:
    """TCP_NODELAY: an answer's last segment goes out at once instead of waiting for the ACK of
    the one before, which a client delays by up to 40 ms on a kept-alive connection."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass  # not TCP (never here) or already reset by the client


@dataclass(frozen=True, slots=True)
class _Limits:
    request_timeout: float
    idle_timeout: float
    max_connections: int
    max_connections_per_client: int


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
        self.connections = _Connections(limits.max_connections, limits.max_connections_per_client, tick, logger)
        self.head_budget = _HeadBudget(SHARED_HEAD_BYTES)
        self.tls = TlsContexts(web.tls, logger=logger) if web is not None and web.tls is not None else None
        self.auth = BasicAuth(web.users) if web is not None and web.users else None
        self.extra_headers = web.headers if web is not None else ()
        self._waiting: list[tuple[_Connection, Any]] = []
        self._spare_turn = threading.Condition()
        self._spares_stop = False
        self._spares: list[threading.Thread] = []
        self._thread_failures = 0
        self._thread_failure_logged = float("-inf")
        #: Connections whose thread could not start: served by a spare thread, or closed (queue full).
        self.spare_served = 0
        self.spare_shed = 0
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
        except RuntimeError:  # no thread could be started: a spare thread serves it, or it is shed
            self._to_spare(conn, client_address)

    def start_spares(self) -> None:
        """Start the ``SPARE_THREADS`` (with the server: a thread that cannot start later is the case
        they are for)."""
        for i in range(SPARE_THREADS):
            thread = threading.Thread(target=self._spare, name=f"metrics-http-spare-{i}", daemon=True)
            thread.start()
            self._spares.append(thread)

    def stop_spares(self) -> None:
        with self._spare_turn:
            self._spares_stop = True
            self._spare_turn.notify_all()
        for thread in self._spares:
            thread.join()
        self._spares.clear()
        for conn, _ in self._waiting:
            self.connections.close(conn)
        self._waiting.clear()

    def _spare(self) -> None:
        """A spare thread: serve whichever waiting connection has sent something (a request, a TLS
        hello, or the EOF of the watchdog's hang-up), one at a time."""
        while True:
            with self._spare_turn:
                while not self._waiting and not self._spares_stop:
                    self._spare_turn.wait()
                if self._spares_stop:
                    return
                waiting = list(self._waiting)
            poller = select.poll()  # no descriptor of its own, and no FD_SETSIZE limit
            by_fd = {}
            for item in waiting:
                try:
                    fd = item[0].sock.fileno()
                except (OSError, ValueError):
                    fd = -1
                if fd >= 0:
                    by_fd[fd] = item
                    poller.register(fd, select.POLLIN | select.POLLPRI)
            ready = {fd for fd, _ in poller.poll(_SPARE_POLL_MS)} if by_fd else set()
            with self._spare_turn:  # another spare thread may have taken it meanwhile
                taken = next((item for item in waiting
                              if item in self._waiting and (item not in by_fd.values() or
                                                            any(by_fd[fd] is item for fd in ready))), None)
                if taken is not None:
                    self._waiting.remove(taken)
            if taken is not None:
                self._serve(*taken)

    def _to_spare(self, conn: _Connection, client_address: Any) -> None:
        """Runs in the accept loop when ``conn``'s thread could not start: it waits for a spare thread
        with a probe's deadline and one request, or is closed when ``SPARE_QUEUE`` wait already; said
        in the log at most once every ``THREAD_FAILURE_LOG_S``."""
        conn.one_request = True
        self.connections.arm(conn, min(self.request_timeout, PROBE_DEADLINE_S))
        with self._spare_turn:
            queued = len(self._waiting) < SPARE_QUEUE and not self._spares_stop
            if queued:
                self._waiting.append((conn, client_address))
                self._spare_turn.notify()
        if queued:
            self.spare_served += 1
        else:
            self.spare_shed += 1
            self.connections.close(conn)
        self._thread_failures += 1
        now = time.monotonic()
        if now - self._thread_failure_logged >= THREAD_FAILURE_LOG_S:
            self.logger.warning("http: cannot start a thread for a connection (%d time%s since the last such line; "
                                "a pids or memory limit?): %d spare threads serve them one request at a time, "
                                "%d closed with every spare busy so far", self._thread_failures,
                                "s" if self._thread_failures != 1 else "", SPARE_THREADS, self.spare_shed)
            self._thread_failures = 0
            self._thread_failure_logged = now

    def _serve(self, conn: _Connection, client_address: Any) -> None:
        """Runs in the connection's thread: TLS handshake (if any), then HTTP requests."""
        try:
            conn.sock.settimeout(self.io_timeout)
            _disable_nagle(conn.sock)
            sock = self._secure(conn) if self.tls is not None else conn.sock
            if sock is not None and _Handler(sock, client_address, self, conn).linger:
                _linger(sock)
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
                 max_connections_per_client: int | None = None, web_config: WebConfig | None = None,
                 health: Callable[[], LoopHealth] | None = None) -> None:
        """``max_connections_per_client`` defaults to half of ``max_connections`` (128): one
        address cannot hold the server alone, and 50 scrapers plus 40 slowloris connections from
        one address (the load test) stay under it; Prometheus itself keeps one or two.
        ``health``: what the probes answer (cheap, called per probe); None: always alive, and
        ready once ``source`` has a payload."""
        if request_timeout <= 0 or idle_timeout <= 0:
            raise ValueError(f"timeouts must be positive, got request {request_timeout}, idle {idle_timeout}")
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections}")
        per_client = max(1, max_connections // 2) if max_connections_per_client is None else max_connections_per_client
        if not 1 <= per_client <= max_connections:
            raise ValueError(f"max_connections_per_client must be between 1 and max_connections ({max_connections}), "
                             f"got {per_client}")
        self._address = parse_listen(listen)
        self._listen = listen
        self._source = source
        self._logger = logger
        self._limits = _Limits(request_timeout, idle_timeout, max_connections, per_client)
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
        server.start_spares()
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

    @property
    def head_budget(self) -> _HeadBudget:
        """The shared budget of request-head bytes (for tests and self-diagnosis)."""
        if self._server is None:
            raise RuntimeError("metrics server is not started")
        return self._server.head_budget

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        server.connections.stop()
        server.stop_spares()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
