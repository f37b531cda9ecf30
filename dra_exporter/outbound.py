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

Answers are urllib3 responses (``preload_content=False``): the Kubernetes client's, the OTLP HTTP
exporter's ``requests`` (``response.raw``) and ``report``'s own. The caller words the refusal
(``AnswerRefused``'s message says what was exceeded, the caller says whose answer it was) and the
response is closed here when refused, since its connection cannot be reused with the body unread.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Final

import urllib3

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
    refuse_declared(response, limit)
    body = bytearray()
    for data in chunks(response, time.monotonic() + seconds if deadline is None else deadline, seconds):
        body += data
        if len(body) > limit:
            _close(response)
            raise AnswerTooLarge(limit)
    return body


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


def _close(response: Any) -> None:
    try:
        response.close()
    except Exception:  # noqa: BLE001 - refusing anyway; a failed close only frees the socket later
        pass
