"""Hostile HTTP clients, second pass (issue 13): header floods, per-client connection caps,
probes under a connection flood, Nagle on kept-alive connections, bodies on GET, Accept ranking.

Attackers connect from other loopback addresses (127.0.0.2, ...: Linux routes all of
127.0.0.0/8 to ``lo``), so that a per-client cap applies to them and not to the test's own
scrapes from 127.0.0.1. No assertion is about speed.
"""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import pytest
from simnode import eventually

from dra_exporter import catalog, model
from dra_exporter.sinks import http as http_server
from dra_exporter.sinks.http import ListenAddressError, negotiate_gzip, negotiate_openmetrics, parse_listen
from dra_exporter.sinks.prometheus import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, PrometheusSink

#: A header line just under the stdlib's 64 KiB line limit, so only a bound on the whole head stops it.
BIG_LINE = b"X-Flood: " + b"a" * 65_000 + b"\r\n"


def small_frame() -> model.Frame:
    spec = catalog.GPU_MEMORY_USED
    return model.Frame((model.Family(spec.name, (model.Sample(tuple((lbl, "v") for lbl in spec.labels), 1.0),)),))


@contextmanager
def sink_serving(**kwargs: float) -> Iterator[PrometheusSink]:
    sink = PrometheusSink("127.0.0.1:0", **kwargs)  # type: ignore[arg-type]
    sink.start()
    sink.publish(small_frame())
    try:
        yield sink
    finally:
        sink.stop()


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))


def get(port: int, path: str = "/metrics", source: str = "127.0.0.1",
        headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def read_until_closed(sock: socket.socket) -> bytes:
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except (ConnectionResetError, TimeoutError):
        pass
    return b"".join(chunks)


def hang_up(socks: list[socket.socket], threads: list[threading.Thread]) -> None:
    """Close the client sockets. Shut down first: on Linux, close() alone neither wakes a thread
    blocked in recv() on the socket nor sends FIN while that recv() holds it."""
    for sock in socks:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    for thread in threads:
        thread.join(60)
    for sock in socks:
        sock.close()


def flood(sock: socket.socket, lines: int) -> None:
    """Send a request line and ``lines`` big header lines, never the blank line that ends the head."""
    try:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        for _ in range(lines):
            sock.sendall(BIG_LINE)
    except OSError:
        pass  # the server hung up: what it answered is in the receive buffer


def answer_to_flood(sock: socket.socket, lines: int) -> bytes:
    """What the server answers a client that keeps sending header lines (sent from a thread,
    so a server that stops reading cannot deadlock the test)."""
    sender = threading.Thread(target=flood, args=(sock, lines), daemon=True)
    sender.start()
    answer = read_until_closed(sock)
    sender.join(60)
    return answer


# --- item 1: the bytes of a request head, and of all heads together ------------------------------


def test_a_head_over_the_total_bound_gets_431_and_is_closed_though_each_line_is_legal() -> None:
    lines = http_server.MAX_HEAD_BYTES // len(BIG_LINE) + 2  # well under the stdlib's 100 headers
    assert lines < 100
    with sink_serving() as sink:
        with connect(sink.port) as sock:
            answer = answer_to_flood(sock, lines)
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
        assert b"Connection: close" in answer
        # A head under the bound, made of the same lines, is served.
        with connect(sink.port) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + BIG_LINE * 3 + b"\r\n")
            assert read_until_closed(sock).startswith(b"HTTP/1.1 200 ")
        assert sink._server.head_budget.held == 0


def test_heads_that_stall_under_the_bound_share_one_budget_and_a_scrape_still_answers() -> None:
    """Each stalled head borrows from the server-wide budget; once it is spent, heads that want
    more get 431 while small scrapes (within every connection's own allowance) go on."""
    budget_lines = (http_server.MAX_HEAD_BYTES - 4096) // len(BIG_LINE)  # a head just under the bound
    per_head = budget_lines * len(BIG_LINE)
    fit = http_server.SHARED_HEAD_BYTES // (per_head - http_server.HEAD_ALLOWANCE_BYTES)
    stallers = fit + 4
    with sink_serving(request_timeout=120.0) as sink:
        budget = sink._server.head_budget
        socks = [connect(sink.port, source=f"127.0.0.{2 + i % 4}") for i in range(stallers)]
        answers: list[bytes] = [b""] * stallers
        threads: list[threading.Thread] = []
        try:
            def stall(i: int) -> None:
                flood(socks[i], budget_lines)
                socks[i].settimeout(120)
                answers[i] = read_until_closed(socks[i])

            threads += [threading.Thread(target=stall, args=(i,), daemon=True) for i in range(stallers)]
            for thread in threads:
                thread.start()
            eventually(lambda: sum(a.startswith(b"HTTP/1.1 431 ") for a in answers) >= stallers - fit, timeout=60)
            assert budget.peak <= budget.limit == http_server.SHARED_HEAD_BYTES
            assert budget.held > 0, "the heads that fit are still held"
            for _ in range(5):
                assert get(sink.port)[0] == 200
        finally:
            hang_up(socks, threads)
        eventually(lambda: budget.held == 0, timeout=30)


def test_many_connections_flooding_headers_are_refused_and_a_scrape_answers_meanwhile() -> None:
    attackers = 48
    with sink_serving() as sink:
        budget = sink._server.head_budget
        socks = [connect(sink.port, source=f"127.0.0.{2 + i % 8}") for i in range(attackers)]
        answers: list[bytes] = [b""] * attackers

        def attack(i: int) -> None:
            answers[i] = answer_to_flood(socks[i], 99)

        threads = [threading.Thread(target=attack, args=(i,), daemon=True) for i in range(attackers)]
        for thread in threads:
            thread.start()
        scrapes = [get(sink.port)[0] for _ in range(5)]
        # Each attacker ends when the server has answered and closed; hang up only then (cutting
        # them earlier would leave answers unread when the scrapes are quicker than the flood).
        for thread in threads:
            thread.join(60)
        hang_up(socks, threads)
        assert scrapes == [200] * 5
        assert all(a.startswith(b"HTTP/1.1 431 ") for a in answers), {a[:40] for a in answers}
        assert budget.peak <= budget.limit
        eventually(lambda: budget.held == 0 and sink._server.connections.count == 0, timeout=30)
        assert get(sink.port)[0] == 200


# --- item 3: a per-client connection cap, and probes when the caps are reached -------------------


def test_one_client_cannot_hold_more_than_its_cap_and_others_are_served() -> None:
    with sink_serving(request_timeout=60.0, max_connections=8, max_connections_per_client=3) as sink:
        conns = sink._server.connections
        idle = [connect(sink.port, source="127.0.0.2") for _ in range(3)]
        eventually(lambda: conns.count == 3)
        # Over its cap the client gets nothing: it holds several connections, so it is no kubelet
        # probe (those hold none between probes) and the probe reserve is not for it either.
        refused = conns.refused
        with connect(sink.port, source="127.0.0.2") as over:
            assert read_until_closed(over) == b""
        assert conns.refused == refused + 1
        # Another client is served: the global cap (8) is not reached.
        assert get(sink.port)[0] == 200
        assert get(sink.port, "/healthz")[0] == 200
        for sock in idle:
            sock.close()
        eventually(lambda: conns.count == 0)
        assert get(sink.port, source="127.0.0.2")[0] == 200


@contextmanager
def connection_flood(port: int, sources: Iterable[str]) -> Iterator[None]:
    """Idle connections from each of ``sources``, each reopened as soon as the server closes it
    (those it admits are kept open), until the block ends; then every one is closed."""
    stop = threading.Event()
    held: list[socket.socket] = []

    def flood_connections(source: str) -> None:
        while not stop.is_set():
            try:
                sock = connect(port, source=source)
            except OSError:
                continue
            held.append(sock)
            sock.settimeout(0.05)
            try:
                if sock.recv(1) == b"":  # refused at once: reopen
                    sock.close()
            except (TimeoutError, OSError):
                pass  # admitted: keep it open
    flooders = [threading.Thread(target=flood_connections, args=(source,), daemon=True) for source in sources]
    for thread in flooders:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in flooders:
            thread.join(30)
        for sock in held:
            sock.close()


def test_a_flood_from_more_addresses_than_the_reserve_holds_leaves_the_probes_their_slots() -> None:
    """Eight flooding addresses, each holding its share of the slots, used to take every reserve
    slot too (2 each): only a peer holding at most one ordinary connection may take one."""
    with sink_serving(request_timeout=60.0, max_connections=16, max_connections_per_client=2) as sink:
        conns = sink._server.connections
        with connection_flood(sink.port, (f"127.0.0.{n}" for n in range(2, 10))):
            eventually(lambda: conns.count >= 16 and conns.refused > 50, timeout=30)
            probes = [get(sink.port, path)[0] for path in ("/healthz", "/readyz") * 10]
        assert probes == [200] * 20
        eventually(lambda: conns.count == 0)


def test_probes_and_scrapes_answer_while_a_connection_flood_holds_every_slot() -> None:
    """The issue's repro, scaled down: idle sockets from several addresses, reopened as fast as
    they close, hold every slot; /healthz, /readyz and /metrics (from an address that holds no
    connection, as Prometheus) answer every time; anything else gets 503."""
    with sink_serving(request_timeout=60.0, max_connections=4, max_connections_per_client=2) as sink:
        conns = sink._server.connections
        with connection_flood(sink.port, ("127.0.0.2", "127.0.0.3", "127.0.0.4")):
            eventually(lambda: conns.count >= 4 and conns.refused > 10, timeout=30)
            probes = [get(sink.port, path)[0] for path in ("/healthz", "/readyz", "/metrics") * 10]
            status, headers, _ = get(sink.port, "/")
        assert probes == [200] * 30
        assert status == 503 and headers["connection"] == "close"
        eventually(lambda: conns.count == 0)
        assert get(sink.port)[0] == 200


def test_the_per_client_cap_must_be_below_or_at_the_global_one() -> None:
    with pytest.raises(ValueError, match="max_connections_per_client"):
        PrometheusSink("127.0.0.1:0", max_connections=4, max_connections_per_client=5)


# --- item 4: Nagle ---------------------------------------------------------------------------------


def test_accepted_sockets_have_nagle_off() -> None:
    """With Nagle on, the second small answer on a kept-alive connection waits ~40 ms for the
    client's delayed ACK; TCP_NODELAY sends it at once."""
    with sink_serving() as sink:
        conn = http.client.HTTPConnection("127.0.0.1", sink.port, timeout=30)
        try:
            for _ in range(2):
                conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
                assert conn.getresponse().read()
            open_now = list(sink._server.connections._open)
            assert open_now
            assert all(c.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for c in open_now)
        finally:
            conn.close()


# --- item 7: the listen address is ASCII -----------------------------------------------------------


@pytest.mark.parametrize("listen", ["127.0.0.1:²", "127.0.0.1:٣", "127.0.0.1:９４０１", "127.0.0.1:1_0"])
def test_a_port_with_non_ascii_digits_is_refused(listen: str) -> None:
    with pytest.raises(ListenAddressError, match="HOST:PORT"):
        parse_listen(listen)


def test_a_port_with_non_ascii_digits_is_a_one_line_error_exit_2() -> None:
    result = subprocess.run([sys.executable, "-m", "dra_exporter.cli", "serve", "--listen", "127.0.0.1:²"],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith(("Error:", "dra-exporter: error:"))]
    assert len(errors) == 1 and "HOST:PORT" in errors[0], result.stderr


# --- item 10: a request that carries a body, or frames it ambiguously ------------------------------


SMUGGLED = b"GET /secret HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.parametrize("method, framing", [
    ("GET", f"Content-Length: {len(SMUGGLED)}\r\n"),
    ("HEAD", f"Content-Length: {len(SMUGGLED)}\r\n"),
    ("GET", "Transfer-Encoding: chunked\r\n"),
    ("GET", "Content-Length: 0\r\nContent-Length: 34\r\n"),
    ("GET", "Content-Length: 0, 0\r\n"),
    ("GET", "Content-Length: -1\r\n"),
    ("GET", "Content-Length: ٣\r\n"),
    ("POST", f"Content-Length: {len(SMUGGLED)}\r\n"),
], ids=["get-body", "head-body", "chunked", "conflicting-lengths", "length-list", "negative", "non-ascii",
        "post-body"])
def test_a_body_or_ambiguous_framing_gets_400_and_close_and_is_never_read_as_a_request(
        method: str, framing: str) -> None:
    with sink_serving() as sink:
        with connect(sink.port) as sock:
            sock.sendall(f"{method} /metrics HTTP/1.1\r\nHost: x\r\n{framing}\r\n".encode() + SMUGGLED)
            answer = read_until_closed(sock)
        assert answer.count(b"HTTP/1.1 ") == 1, answer  # one answer: the body was not served as a request
        expected = b"HTTP/1.1 501 " if method == "POST" else b"HTTP/1.1 400 "
        assert answer.startswith(expected) and b"Connection: close" in answer, answer[:300]


def test_an_empty_body_and_identical_lengths_are_fine_and_keep_the_connection() -> None:
    with sink_serving() as sink:
        conn = http.client.HTTPConnection("127.0.0.1", sink.port, timeout=30)
        try:
            for headers in ({"Content-Length": "0"}, {}):
                conn.request("GET", "/metrics", headers=headers)
                response = conn.getresponse()
                assert response.status == 200 and response.read()
                assert not response.will_close
        finally:
            conn.close()
        with connect(sink.port) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 0\r\n"
                         b"Connection: close\r\n\r\n")
            assert read_until_closed(sock).startswith(b"HTTP/1.1 200 ")


# --- item 13: Accept and Accept-Encoding are ranked by q ---------------------------------------------


PROMETHEUS_2 = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
PROMETHEUS_3 = ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;"
                "version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,"
                "text/plain;version=0.0.4;q=0.3,*/*;q=0.2")


@pytest.mark.parametrize("accept, openmetrics", [
    (None, False),
    ("", False),
    (PROMETHEUS_2, True),
    (PROMETHEUS_3, True),
    ("application/openmetrics-text;q=0.8, text/plain;q=0.9", False),
    ("text/plain;q=0.5, application/openmetrics-text;q=0.6", True),
    ("text/plain, application/openmetrics-text", False),  # equal q: the client's order (goautoneg)
    ("application/openmetrics-text, text/plain", True),
    ("application/openmetrics-text;q=0", False),  # q=0: not acceptable (RFC 9110)
    ("application/openmetrics-text;q=0.000, text/plain;q=0.001", False),
    ("application/openmetrics-text;q=0.001", True),
    ("APPLICATION/OpenMetrics-Text", True),
    ("application/openmetrics-text;version=2.0.0", False),  # a version we do not write
    ("application/openmetrics-text;q=abc", False),  # a malformed q counts as 0, as in Go
    ("application/openmetrics-text;q=１", False),  # not an ASCII qvalue
    ("application/openmetrics-text;q=nan", False),
    ("application/openmetrics-text;q=1.5", False),
    ("*/*", False),
])
def test_accept_is_ranked_by_q(accept: str | None, openmetrics: bool) -> None:
    assert negotiate_openmetrics(accept) is openmetrics


@pytest.mark.parametrize("accept_encoding, gzipped", [
    (None, False),
    ("gzip", True),
    ("gzip, deflate", True),
    ("gzip;q=0", False),
    ("gzip;q=0.5, identity", False),  # identity ranked higher
    ("identity;q=0.5, gzip;q=0.5", True),  # a tie: the server's preference, gzip (promhttp's offers)
    ("*", True),
    ("gzip;q=0, *", False),  # an explicit gzip;q=0 overrides * (RFC 9110)
    ("deflate", False),
    ("GZIP;Q=1.0", True),
])
def test_accept_encoding_is_ranked_by_q(accept_encoding: str | None, gzipped: bool) -> None:
    assert negotiate_gzip(accept_encoding) is gzipped


def test_the_server_serves_what_the_ranking_chooses() -> None:
    with sink_serving() as sink:
        _, headers, _ = get(sink.port, headers={"Accept": "application/openmetrics-text;q=0.8, text/plain;q=0.9"})
        assert headers["content-type"] == TEXT_CONTENT_TYPE
        _, headers, _ = get(sink.port, headers={"Accept": "text/plain;q=0.5, application/openmetrics-text;q=0.6",
                                                "Accept-Encoding": "gzip;q=0.5, identity"})
        assert headers["content-type"] == OPENMETRICS_CONTENT_TYPE and "content-encoding" not in headers
