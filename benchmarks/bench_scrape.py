"""Scrape latency: dra-exporter's cached bytes against the per-scrape baseline, same node, same run.

Both servers run as child processes on the simulated node (``servers.py``); the scrapers are
other processes, so no one shares a GIL with a server. Each scraper opens a new connection
per scrape (as curl does; the baseline's server closes connections anyway), sends the
headers of the mode, reads the whole response and times it with ``perf_counter``:

- ``prometheus``: what Prometheus sends (OpenMetrics preferred, gzip accepted);
- ``text``: no Accept header, no compression (curl, or a scraper that wants text).

dra-exporter keeps collecting every second while it is scraped, as in production; the
baseline does all its work inside the scrape.

Hammering a server back to back mostly measures cache hits: one frame a second serves
hundreds of scrapes. Prometheus does the opposite: it scrapes every 15-60 s, so each of its
scrapes is the first to see a new frame. The *paced* rows reproduce that: each scraper sends
Prometheus's headers about once a second (0.9-1.3 s apart, at random), against dra-exporter
and against the same exporter started with ``--gzip-on-scrape`` (the first gzip request of
each frame compresses it, as before the sink compressed ahead in ``publish``). A third server, dra-exporter serving one
frame with its collection loop stopped (``idle_*`` columns), shows what the HTTP server
costs alone, so the difference is what a cycle running in the same interpreter adds. p50/p99
are nearest-rank percentiles over all scrapers' scrapes together.

The *keep-alive* rows reuse one connection per scraper, as Prometheus does (gzip with
Prometheus's headers, and plain text), against dra-exporter and against the same exporter
started with ``--nagle`` (accepted sockets without ``TCP_NODELAY``, as before issue 13): there
each answer after the first on a connection waited for the client's delayed ACK (~40 ms),
which the new-connection rows never show.
"""

from __future__ import annotations

import multiprocessing
import random
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .common import (
    PROMETHEUS_HEADERS,
    REPO,
    Check,
    Config,
    Result,
    child_env,
    free_port,
    ms,
    percentile,
    python_command,
    ratio,
    stop_process,
    wait_http_ok,
)

MODES = {"prometheus": PROMETHEUS_HEADERS, "text": {}}
KEEP_ALIVE_MODES = {"keepalive-prometheus": PROMETHEUS_HEADERS, "keepalive-text": {}}
PACED = "prometheus-paced"
_WARMUP_SCRAPES = 3
P99_TARGET_MS = 5.0
SPEEDUP_TARGET = 10.0
#: Seconds between paced scrapes (uniform): around the exporter's 1 s interval, so that almost
#: every scrape finds a new frame, as each of Prometheus's scrapes does.
PACE_S = (0.9, 1.3)


def request_bytes(headers: dict[str, str], keep_alive: bool = False) -> bytes:
    """A GET /metrics that asks the server to close the connection after answering, or
    (``keep_alive``) to keep it open, as HTTP/1.1 does by default."""
    lines = ["GET /metrics HTTP/1.1", "Host: 127.0.0.1", *([] if keep_alive else ["Connection: close"]),
             *(f"{name}: {value}" for name, value in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def scrape(port: int, request: bytes) -> bytes:
    """One scrape over a new connection; the whole response, read until the server closes."""
    # A raw socket rather than http.client: the client's own CPU (4 scrapers share 2 cores
    # with the server here) should add as little as possible to what is measured.
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(1 << 20):
            chunks.append(chunk)
    response = b"".join(chunks)
    head, _, body = response.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0]
    if b" 200 " not in status + b" " or not body:
        raise RuntimeError(f"scrape of port {port} answered {status!r} with {len(body)} bytes of body")
    return response


def kept_alive_scrape(sock: socket.socket, request: bytes) -> None:
    """One scrape on an open connection: the head, then exactly ``Content-Length`` bytes of body."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(1 << 16)
        if not chunk:
            raise RuntimeError("the server closed a kept-alive connection")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200 "):
        status = head.split(b"\r\n", 1)[0]
        raise RuntimeError(f"kept-alive scrape answered {status!r}")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = sock.recv(max(1 << 16, length - len(body)))
        if not chunk:
            raise RuntimeError("the server closed a kept-alive connection mid-body")
        body += chunk


def keep_alive_scrape_times(port: int, count: int, headers: dict[str, str]) -> list[float]:
    """``count`` timed scrapes on one connection, after a few untimed ones on it."""
    request = request_bytes(headers, keep_alive=True)
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        for _ in range(_WARMUP_SCRAPES):
            kept_alive_scrape(sock, request)
        times = []
        for _ in range(count):
            started = time.perf_counter()
            kept_alive_scrape(sock, request)
            times.append(time.perf_counter() - started)
    return times


def scrape_times(port: int, count: int, headers: dict[str, str], paced: bool = False,
                 keep_alive: bool = False) -> list[float]:
    """``count`` timed scrapes of ``/metrics`` (seconds each), after a few untimed ones; ``paced``:
    each after a pause of ``PACE_S``, so that nearly each sees a frame nobody scraped yet;
    ``keep_alive``: all on one connection."""
    if keep_alive:
        return keep_alive_scrape_times(port, count, headers)
    request = request_bytes(headers)
    for _ in range(_WARMUP_SCRAPES):
        scrape(port, request)
    times = []
    for _ in range(count):
        if paced:
            time.sleep(random.uniform(*PACE_S))
        started = time.perf_counter()
        scrape(port, request)
        times.append(time.perf_counter() - started)
    return times


def _scrape_job(job: tuple[int, int, dict[str, str], bool, bool]) -> list[float]:
    return scrape_times(*job)


def concurrent_scrape_times(port: int, scrapers: int, count: int, headers: dict[str, str],
                            paced: bool = False, keep_alive: bool = False) -> list[float]:
    """Latencies of ``scrapers`` processes scraping ``count`` times each, all at once."""
    # spawn, not fork: the parent may hold gRPC or server threads that must not be forked.
    with multiprocessing.get_context("spawn").Pool(scrapers) as pool:
        results = pool.map(_scrape_job, [(port, count, headers, paced, keep_alive)] * scrapers)
    return [t for times in results for t in times]


@contextmanager
def server(kind: str, scenario: str) -> Iterator[int]:
    """A server of ``kind`` (``dra-exporter``, ``gzip-on-scrape``, ``nagle``, ``frozen``, ``per-scrape``)
    on a free port, ready to scrape."""
    port = free_port()
    listen = f"127.0.0.1:{port}"
    if kind in ("dra-exporter", "gzip-on-scrape", "nagle"):
        flags = {"dra-exporter": [], "gzip-on-scrape": ["--gzip-on-scrape"], "nagle": ["--nagle"]}[kind]
        args = ["-m", "benchmarks.servers", "exporter", *flags, "--", "serve", "--simulate", scenario,
                "--listen", listen, "--log-level", "warning"]
    else:
        args = ["-m", "benchmarks.servers", kind, "--simulate", scenario, "--listen", listen]
    proc = subprocess.Popen(python_command(*args), cwd=REPO, env=child_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_http_ok(f"http://{listen}/metrics", alive=lambda: proc.poll() is None)
        yield port
    except RuntimeError as err:
        raise RuntimeError(f"{err}: {_stderr_tail(proc)}") from None
    finally:
        stop_process(proc)


def _stderr_tail(proc: subprocess.Popen[bytes]) -> str:
    if proc.poll() is None:
        proc.terminate()
    _, err = proc.communicate(timeout=10)
    return err.decode(errors="replace")[-2000:]


def run(config: Config) -> Result:
    result = Result(
        description="Latency of GET /metrics, p50/p99 over all scrapes, new connection per scrape.",
        baseline="prometheus_client custom collector that reads the fake NVML, joins and builds the families "
                 "on every scrape, served by prometheus_client's HTTP server (benchmarks/servers.py)")
    for scenario in config.scenarios:
        latencies: dict[tuple[str, int, str], list[float]] = {}
        for kind, count in (("dra-exporter", config.scrapes), ("frozen", config.scrapes),
                            ("per-scrape", config.baseline_scrapes)):
            with server(kind, scenario) as port:
                for scrapers in config.concurrency:
                    for mode, headers in MODES.items():
                        times = concurrent_scrape_times(port, scrapers, count, headers)
                        latencies[(kind, scrapers, mode)] = times
                    if kind == "dra-exporter":
                        latencies[(kind, scrapers, PACED)] = concurrent_scrape_times(
                            port, scrapers, config.paced_scrapes, PROMETHEUS_HEADERS, paced=True)
                        for mode, headers in KEEP_ALIVE_MODES.items():
                            latencies[(kind, scrapers, mode)] = concurrent_scrape_times(
                                port, scrapers, count, headers, keep_alive=True)
        with server("gzip-on-scrape", scenario) as port:
            for scrapers in config.concurrency:
                latencies[("gzip-on-scrape", scrapers, PACED)] = concurrent_scrape_times(
                    port, scrapers, config.paced_scrapes, PROMETHEUS_HEADERS, paced=True)
        # ~40 ms a scrape with Nagle on: the baseline's number of scrapes keeps this short.
        with server("nagle", scenario) as port:
            for scrapers in config.concurrency:
                for mode, headers in KEEP_ALIVE_MODES.items():
                    latencies[("nagle", scrapers, mode)] = concurrent_scrape_times(
                        port, scrapers, config.baseline_scrapes, headers, keep_alive=True)
        for scrapers in config.concurrency:
            for mode in MODES:
                ours = latencies[("dra-exporter", scrapers, mode)]
                idle = latencies[("frozen", scrapers, mode)]
                base = latencies[("per-scrape", scrapers, mode)]
                p50, p99 = ms(percentile(ours, 50)), ms(percentile(ours, 99))
                base_p50, base_p99 = ms(percentile(base, 50)), ms(percentile(base, 99))
                row: dict[str, Any] = {"scenario": scenario, "scrapers": scrapers, "mode": mode,
                                       "p50_ms": p50, "p99_ms": p99,
                                       "idle_p50_ms": ms(percentile(idle, 50)),
                                       "idle_p99_ms": ms(percentile(idle, 99)),
                                       "baseline_p50_ms": base_p50, "baseline_p99_ms": base_p99,
                                       "scrapes": len(ours), "baseline_scrapes": len(base),
                                       "p50_ratio": ratio(base_p50, p50), "p99_ratio": ratio(base_p99, p99)}
                result.rows.append(row)
                if scenario == "scale":
                    where = f"scale, {scrapers} scraper(s), {mode}"
                    result.checks.append(Check(f"scrape p99 ({where})", p99, P99_TARGET_MS, "ms"))
                    result.checks.append(Check(f"p99 speed-up over the per-scrape baseline ({where})",
                                               row["p99_ratio"], SPEEDUP_TARGET, "x", higher_is_better=True))
            ours = latencies[("dra-exporter", scrapers, PACED)]
            lazy = latencies[("gzip-on-scrape", scrapers, PACED)]
            p50, p99 = ms(percentile(ours, 50)), ms(percentile(ours, 99))
            lazy_p50, lazy_p99 = ms(percentile(lazy, 50)), ms(percentile(lazy, 99))
            result.rows.append({"scenario": scenario, "scrapers": scrapers, "mode": PACED, "p50_ms": p50,
                                "p99_ms": p99, "gzip_on_scrape_p50_ms": lazy_p50, "gzip_on_scrape_p99_ms": lazy_p99,
                                "scrapes": len(ours), "p50_ratio": ratio(lazy_p50, p50),
                                "p99_ratio": ratio(lazy_p99, p99)})
            if scenario == "scale":
                result.checks.append(Check(f"scrape p99 (scale, {scrapers} scraper(s), {PACED})", p99,
                                           P99_TARGET_MS, "ms"))
            for mode in KEEP_ALIVE_MODES:
                ours, nagle = latencies[("dra-exporter", scrapers, mode)], latencies[("nagle", scrapers, mode)]
                p50, p99 = ms(percentile(ours, 50)), ms(percentile(ours, 99))
                nagle_p50, nagle_p99 = ms(percentile(nagle, 50)), ms(percentile(nagle, 99))
                result.rows.append({"scenario": scenario, "scrapers": scrapers, "mode": mode, "p50_ms": p50,
                                    "p99_ms": p99, "nagle_p50_ms": nagle_p50, "nagle_p99_ms": nagle_p99,
                                    "scrapes": len(ours), "nagle_scrapes": len(nagle),
                                    "p50_ratio": ratio(nagle_p50, p50), "p99_ratio": ratio(nagle_p99, p99)})
                if scenario == "scale":
                    result.checks.append(Check(f"scrape p99 (scale, {scrapers} scraper(s), {mode})", p99,
                                               P99_TARGET_MS, "ms"))
    result.notes.append(f"{PACED} rows: the ratios compare with the same exporter compressing on the scrape "
                        "(--gzip-on-scrape), not with the per-scrape baseline")
    result.notes.append("keepalive-* rows: one connection per scraper; the ratios compare with the same exporter "
                        "with Nagle's algorithm on (--nagle), not with the per-scrape baseline")
    return result
