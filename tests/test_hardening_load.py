"""Load and hostile clients: many scrapers, slowloris, stalled readers, connection floods.

The long test runs ``dra-exporter serve --simulate`` as a subprocess (its own interpreter,
as in production) for ``DRA_EXPORTER_LOAD_SECONDS`` (default 40, the CI setting: four of the
10 s request deadlines) under 50 concurrent scrapers and a slowloris crowd. The short ones use
the sink in-process with small timeouts. No assertion is about speed: throughput is printed, never asserted.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text
from promharness import free_port
from simnode import eventually, scrape, simulated

from dra_exporter import catalog, model
from dra_exporter.sinks.prometheus import PrometheusSink

LOAD_SECONDS = float(os.environ.get("DRA_EXPORTER_LOAD_SECONDS", "40"))
SCRAPERS = 50
SLOWLORIS = 40
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def frame_of(size: int) -> model.Frame:
    """A frame whose text exposition is roughly ``size`` bytes."""
    spec = catalog.GPU_MEMORY_USED
    samples = tuple(model.Sample(tuple((lbl, f"{lbl}-{i:06d}-" + "x" * 40) for lbl in spec.labels), float(i))
                    for i in range(max(1, size // (60 * len(spec.labels)))))
    return model.Frame((model.Family(spec.name, samples),))


@contextmanager
def sink_serving(frame: model.Frame, **kwargs: float) -> Iterator[PrometheusSink]:
    sink = PrometheusSink("127.0.0.1:0", **kwargs)  # type: ignore[arg-type]
    sink.start()
    sink.publish(frame)
    try:
        yield sink
    finally:
        sink.stop()


def scrape_ok(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        body = response.read()
        return response.status == 200 and int(response.getheader("Content-Length", "-1")) == len(body)
    finally:
        conn.close()


def closed_by_server(sock: socket.socket, guard: float = 60.0) -> bool:
    """Wait (at most ``guard`` s, a safety net) until the peer closes; True if it did."""
    sock.settimeout(guard)
    try:
        while sock.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


# --- in-process: deadlines and limits ----------------------------------------------------------


def test_a_trickling_client_is_cut_at_the_request_deadline_while_others_are_served() -> None:
    """Per-recv timeouts alone never fire for a client that sends a byte every 0.2 s."""
    with sink_serving(frame_of(10_000), request_timeout=1.0) as sink:
        trickler = socket.create_connection(("127.0.0.1", sink.port))
        trickler.sendall(b"GET /metrics HTTP/1.1\r\n")
        cut = threading.Event()

        def trickle() -> None:
            try:
                for _ in range(300):  # 60 s at most, far beyond the 1 s deadline
                    trickler.sendall(b"X")
                    time.sleep(0.2)
            except OSError:
                cut.set()

        thread = threading.Thread(target=trickle, daemon=True)
        thread.start()
        assert all(scrape_ok(sink.port) for _ in range(5))
        thread.join(90)
        trickler.close()
        assert cut.is_set(), "the trickling client was never disconnected"
        assert sink._server.connections.expired >= 1


def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() -> None:
    with sink_serving(frame_of(1000), request_timeout=5.0, idle_timeout=0.5) as sink:
        conn = socket.create_connection(("127.0.0.1", sink.port))
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert conn.recv(1024).startswith(b"HTTP/1.1 200")
        assert closed_by_server(conn), "idle connection kept open forever"
        conn.close()


def test_a_client_that_never_reads_its_response_is_cut() -> None:
    """A stalled reader blocks the server's write; the deadline covers writes too."""
    with sink_serving(frame_of(4_000_000), request_timeout=1.0) as sink:
        reader = socket.socket()
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.connect(("127.0.0.1", sink.port))
        reader.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        eventually(lambda: sink._server.connections.expired >= 1, timeout=60)
        assert scrape_ok(sink.port)
        reader.close()


def test_connections_beyond_the_limit_are_refused_at_once_and_service_resumes(
        caplog: pytest.LogCaptureFixture) -> None:
    with sink_serving(frame_of(1000), request_timeout=60.0, max_connections=3, max_connections_per_client=3) as sink:
        stalled = [socket.create_connection(("127.0.0.1", sink.port)) for _ in range(3)]
        eventually(lambda: sink._server.connections.count == 3)
        with caplog.at_level(logging.WARNING):
            extra = [socket.create_connection(("127.0.0.1", sink.port)) for _ in range(5)]
            for sock in extra:
                assert closed_by_server(sock, guard=30), "a connection over the limit was kept"
                sock.close()
        assert sink._server.connections.refused == 5
        assert caplog.text.count("refusing new ones") == 1, "one warning per episode, not one per connection"
        for sock in stalled:
            sock.close()
        eventually(lambda: sink._server.connections.count == 0)
        assert scrape_ok(sink.port)


def test_garbage_requests_get_errors_not_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with sink_serving(frame_of(1000)) as sink:
        for junk in (b"\x00\xff" * 100 + b"\r\n\r\n", b"GET " + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",
                     b"GET /metrics HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n", b"POST /metrics HTTP/1.1\r\n\r\n",
                     b"GET /metrics HTTP/9.9\r\n\r\n"):
            with socket.create_connection(("127.0.0.1", sink.port), timeout=10) as sock:
                sock.sendall(junk)
                answer = sock.recv(100)
                assert answer.startswith(b"HTTP/1.") and b" 200 " not in answer[:15], answer
        assert scrape_ok(sink.port)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


def test_a_failing_cycle_keeps_the_last_frame_on_metrics_and_the_loop_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from dra_exporter import runtime as runtime_module  # the node agent's core (JoinCore) calls its join

    with simulated("demo", http=True, interval=0.05) as rt:
        rt.agent.start()
        eventually(lambda: rt.agent.cycles >= 2)
        failures: list[int] = []

        def broken_join(inp: object) -> model.Frame:
            failures.append(1)
            raise RuntimeError("a bug in the join")

        monkeypatch.setattr(runtime_module, "join", broken_join)
        eventually(lambda: len(failures) >= 3)
        last = scrape(rt.prometheus.port)
        assert scrape(rt.prometheus.port) == last, "no new frame while the join fails"
        assert catalog.GPU_UP.name in {f.name for f in parse_text(last.decode())}
        monkeypatch.undo()
        cycles = rt.agent.cycles
        eventually(lambda: rt.agent.cycles > cycles + 2)


# --- the long run: 50 scrapers and a slowloris crowd against `serve --simulate` ---------------


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    scrapes: int = 0
    errors: list[str] = field(default_factory=list)
    bodies: dict[bytes, tuple[bool, bytes]] = field(default_factory=dict)  # sha → (openmetrics, body)
    cuts: int = 0

    def error(self, message: str) -> None:
        with self.lock:
            if len(self.errors) < 50:
                self.errors.append(message)


@contextmanager
def exporter_process() -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    for _ in range(3):  # the free port may be taken between the check and the bind
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "dra_exporter.cli", "serve", "--simulate",
                                 "--listen", f"127.0.0.1:{port}", "--log-level", "info"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if _started(proc, port):
            break
    else:
        raise AssertionError("the exporter did not start")
    try:
        yield port, proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _started(proc: subprocess.Popen[bytes], port: int) -> bool:
    """Whether the exporter became ready (False: it exited, e.g. the port was taken)."""
    try:
        eventually(lambda: proc.poll() is not None or _ready(port), timeout=60, step=0.2)
    except AssertionError:
        proc.kill()
        raise
    return proc.poll() is None


def _ready(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/readyz")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


def scraper(port: int, index: int, until: float, tally: Tally) -> None:
    openmetrics, use_gzip, keep_alive = index % 2 == 1, index % 3 == 0, index % 4 < 2
    headers = {"Accept": OPENMETRICS} if openmetrics else {}
    if use_gzip:
        headers["Accept-Encoding"] = "gzip"
    conn: http.client.HTTPConnection | None = None
    while time.monotonic() < until:
        try:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("GET", "/metrics", headers=headers)
            response = conn.getresponse()
            body = response.read()
            length = int(response.getheader("Content-Length", "-1"))
            if response.status != 200 or length != len(body):
                tally.error(f"scraper {index}: status {response.status}, {len(body)} of {length} bytes")
            if response.getheader("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            digest = hashlib.sha256(body).digest()
            with tally.lock:
                tally.scrapes += 1
                tally.bodies.setdefault(digest, (openmetrics, body))
        except (OSError, http.client.HTTPException, EOFError) as exc:
            tally.error(f"scraper {index}: {type(exc).__name__}: {exc}")
            conn = None
            continue
        if not keep_alive:
            conn.close()
            conn = None
    if conn is not None:
        conn.close()


def slowloris(port: int, until: float, tally: Tally) -> None:
    """Keeps SLOWLORIS connections trickling one header byte every 2 s; counts server cuts."""
    socks: list[socket.socket | None] = [None] * SLOWLORIS
    while time.monotonic() < until:
        for i, sock in enumerate(socks):
            try:
                if sock is None:
                    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
                    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                    socks[i] = sock
                else:
                    sock.sendall(b"a")
            except OSError:
                with tally.lock:
                    tally.cuts += 1
                if sock is not None:
                    sock.close()
                socks[i] = None
        time.sleep(2.0)
    for sock in socks:
        if sock is not None:
            sock.close()


@pytest.mark.slow
def test_50_concurrent_scrapers_get_complete_valid_responses_despite_slowloris(capsys) -> None:  # type: ignore[no-untyped-def]
    tally = Tally()
    with exporter_process() as (port, proc):
        rss_before = _rss_kib(proc.pid)
        until = time.monotonic() + LOAD_SECONDS
        threads = [threading.Thread(target=scraper, args=(port, i, until, tally), daemon=True)
                   for i in range(SCRAPERS)]
        threads.append(threading.Thread(target=slowloris, args=(port, until, tally), daemon=True))
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(LOAD_SECONDS + 120)
        elapsed = time.monotonic() - started
        rss_after = _rss_kib(proc.pid)
        assert proc.poll() is None, "the exporter died under load"
    stderr = proc.stderr.read().decode() if proc.stderr else ""

    assert not tally.errors, tally.errors[:10]
    assert tally.scrapes >= SCRAPERS, "every scraper got at least one answer"
    # Every distinct body (one per frame and format) parses completely.
    for openmetrics, body in tally.bodies.values():
        text = body.decode("utf-8")
        families = {f.name for f in (parse_openmetrics if openmetrics else parse_text)(text)}
        assert catalog.GPU_UP.name in families and catalog.CLAIM_CONSUMER_INFO.name in families
        assert text.endswith("# EOF\n") if openmetrics else text.endswith("\n")
    if LOAD_SECONDS >= 30:
        # The 10 s request deadline cut the trickling connections (they reconnect each time).
        assert tally.cuts >= SLOWLORIS, f"slowloris connections cut {tally.cuts} times"
    assert "Traceback" not in stderr and " ERROR " not in stderr, stderr[-2000:]
    with capsys.disabled():
        print(f"\nload: {tally.scrapes} scrapes by {SCRAPERS} scrapers in {elapsed:.0f}s "
              f"({tally.scrapes / elapsed:.0f}/s), {len(tally.bodies)} distinct bodies, "
              f"{tally.cuts} slowloris cuts, exporter RSS {rss_before} -> {rss_after} KiB")


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1
