"""Read what a peer answers — the API server, an OTLP collector, Prometheus — at bounded cost: the
one mechanism every outbound request of the exporter reads its answer with.

A socket timeout bounds one ``recv``, not an answer: a peer that sends a byte a second never trips
a 10 s timeout, and ``response.read(n)`` waits until ``n`` bytes came, however long that takes. A
byte cap checked after ``read()`` returned bounds nothing either: the memory is spent by then. So
an answer is read here

* with a **deadline for the whole answer** (``monotonic`` time): before each read the socket's
  timeout is lowered to what is left of it, and reads are ``read1`` (what has arrived, at most a
  chunk), so a trickle ends at the deadline, not after the trickle;
* under a **byte cap on what is held**: a declared ``Content-Length`` over the cap is refused
  before a byte is read, and the count of bytes read is checked after every chunk, so at most one
  chunk more than the cap is ever held;
* on the wire bytes (``decode_content=False``): a compressed answer cannot expand past the cap.

The status line and headers come before there is a response to read from: a peer that trickles
those holds ``getresponse`` as long as it likes. So the pools of the three clients get connections
whose ``getresponse`` is cut (the socket shut down, by one timer thread for the whole process) at
the deadline ``answer_within`` set for the thread making the request (``bound_heads``).

Answers are urllib3 responses (``preload_content=False``): the Kubernetes client's, the OTLP HTTP
exporter's ``requests`` (``response.raw``) and ``report``'s own. The caller words the refusal
(``AnswerRefused``'s message says what was exceeded, the caller says whose answer it was) and the
response is closed here when refused, since its connection cannot be reused with the body unread.
"""

from __future__ import annotations

import heapq
import itertools
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

#: Bytes asked of one read: a read returns earlier with what has arrived.
CHUNK: Final = 64 * 1024


class AnswerRefused(Exception):
    """The answer broke a bound; the message says which, in words for a log line."""


class AnswerTooLarge(AnswerRefused):
    def __init__(self, limit: int, declared: int | None = None) -> None:
        said = f" (it announced {declared} bytes)" if declared is not None else ""
        super().__init__(f"the answer is over the {size_words(limit)} limit{said}")
        self.limit = limit


class AnswerTooSlow(AnswerRefused):
    def __init__(self, seconds: float) -> None:
        super().__init__(f"the answer did not arrive within {seconds:.3g} s")
        self.seconds = seconds


def size_words(limit: int) -> str:
    """``4 MiB``, ``64 KiB`` or ``100 bytes``: how the limits are named in messages."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if limit >= 1 << shift and limit % (1 << shift) == 0:
            return f"{limit >> shift} {unit}"
    return f"{limit} bytes"


def declared_length(response: Any) -> int | None:
    """The answer's ``Content-Length`` when it is a plain number, else None (chunked, absent, bogus)."""
    headers = getattr(response, "headers", None)
    value = headers.get("Content-Length") if headers else None
    if isinstance(value, str) and value.strip().isdigit() and len(value.strip()) < 20:
        return int(value.strip())
    return None


def refuse_declared(response: Any, limit: int) -> None:
    """Refuse (and close) an answer whose ``Content-Length`` is over ``limit``, unread."""
    declared = declared_length(response)
    if declared is not None and declared > limit:
        _close(response)
        raise AnswerTooLarge(limit, declared)


def chunks(response: Any, deadline: float, seconds: float) -> Iterator[bytes]:
    """The answer's body as it arrives, until it ends; ``AnswerTooSlow`` (and the response closed)
    once ``deadline`` (``time.monotonic``) passes. ``seconds`` names the deadline in the message.
    Transport errors other than a timeout propagate as the client raised them."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            _close(response)
            raise AnswerTooSlow(seconds)
        _lower_timeout(response, left)
        try:
            data = response.read1(CHUNK, decode_content=False)
        except (urllib3.exceptions.ReadTimeoutError, TimeoutError):
            if time.monotonic() < deadline:
                raise  # the client's own per-read timeout, before ours: a silent peer
            _close(response)
            raise AnswerTooSlow(seconds) from None
        if not data:
            return
        yield data


def read_body(response: Any, limit: int, seconds: float, deadline: float | None = None) -> bytearray:
    """The whole body, at most ``limit`` bytes, within ``seconds`` (or by ``deadline``, when the
    request's own deadline started earlier). Raises ``AnswerTooLarge`` / ``AnswerTooSlow``."""
    body = bytearray()
    for data in bounded_chunks(response, limit, seconds, deadline):
        body += data
    return body


def bounded_chunks(response: Any, limit: int, seconds: float, deadline: float | None = None) -> Iterator[bytes]:
    """The body as it arrives (``chunks``), for a reader that parses it on the way instead of holding
    it: ``AnswerTooLarge`` once more than ``limit`` bytes came (or were announced)."""
    refuse_declared(response, limit)
    size = 0
    for data in chunks(response, time.monotonic() + seconds if deadline is None else deadline, seconds):
        size += len(data)
        if size > limit:
            _close(response)
            raise AnswerTooLarge(limit)
        yield data


def _lower_timeout(response: Any, left: float) -> None:
    """Make the next ``recv`` wait at most ``left`` seconds (never longer than the client's own
    timeout). The pool sets the timeout again for the connection's next request."""
    connection = getattr(response, "connection", None)
    sock = getattr(connection, "sock", None)
    if sock is None:
        return
    try:
        current = sock.gettimeout()
        sock.settimeout(left if current is None else min(current, left))
    except OSError:
        pass  # a socket closed meanwhile: the read says so


# --- the status line and headers ----------------------------------------------------------------------

_local = threading.local()


@contextmanager
def answer_within(seconds: float) -> Iterator[None]:
    """Requests this thread makes in the block get their status line and headers within
    ``seconds`` (on connections of a pool ``bound_heads`` set up), else ``AnswerTooSlow``."""
    previous = getattr(_local, "bound", None)
    _local.bound = (time.monotonic() + seconds, seconds)
    try:
        yield
    finally:
        _local.bound = previous


class _Cutter:
    """One thread for the process: shuts a socket down when its deadline passes, unless disarmed."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, list[Any]]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def arm(self, deadline: float, sock: socket.socket) -> list[Any]:
        entry: list[Any] = [sock, False]  # [the socket (None: disarmed), whether it was cut]
        with self._wake:
            heapq.heappush(self._heap, (deadline, next(self._order), entry))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="outbound-deadlines", daemon=True)
                self._thread.start()
            self._wake.notify()
        return entry

    @staticmethod
    def disarm(entry: list[Any]) -> None:
        entry[0] = None

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._wake.wait(self._heap[0][0] - time.monotonic() if self._heap else None)
                _, _, entry = heapq.heappop(self._heap)
            sock = entry[0]
            if sock is not None:
                entry[1] = True
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # the blocked read returns at once
                except OSError:
                    pass  # closed meanwhile


_cutter = _Cutter()


class _HeadsWithinDeadline:
    """``getresponse`` (status line and headers) cut at the thread's ``answer_within`` deadline."""

    sock: Any

    def getresponse(self) -> Any:
        bound = getattr(_local, "bound", None)
        if bound is None or self.sock is None:
            return super().getresponse()  # type: ignore[misc]
        deadline, seconds = bound
        if deadline <= time.monotonic():
            raise AnswerTooSlow(seconds)
        entry = _cutter.arm(deadline, self.sock)
        try:
            response = super().getresponse()  # type: ignore[misc]
        except Exception:
            if entry[1]:
                raise AnswerTooSlow(seconds) from None
            raise
        finally:
            _cutter.disarm(entry)
        if entry[1]:  # cut in the headers: http.client takes the end of input for their end
            response.close()
            raise AnswerTooSlow(seconds)
        return response


class _HTTPConnection(_HeadsWithinDeadline, HTTPConnection):
    pass


class _HTTPSConnection(_HeadsWithinDeadline, HTTPSConnection):
    pass


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


_BOUND_POOLS: Final = {"http": _HTTPPool, "https": _HTTPSPool}


def bound_heads(pool_manager: Any) -> None:
    """Make ``pool_manager``'s pools cut a trickled head (``answer_within``); pools it made before
    are closed, so every later request gets one. Calling it again changes nothing."""
    if pool_manager.pool_classes_by_scheme is not _BOUND_POOLS:
        pool_manager.pool_classes_by_scheme = _BOUND_POOLS
        pool_manager.clear()


def _close(response: Any) -> None:
    try:
        response.close()
    except Exception:  # noqa: BLE001 - refusing anyway; a failed close only frees the socket later
        pass
