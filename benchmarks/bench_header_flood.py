"""RSS of ``serve --simulate demo`` under a header flood, and whether scrapes still answer.

``python3 -m benchmarks.bench_header_flood [--connections 256] [--seconds 15] [--unbounded]``

The attack of issue 13, item 1: each hostile connection sends a request line and 99 header
lines of 65 KB (each under the stdlib's 64 KiB line limit) and never the blank line that ends
the head; when the server hangs up (431), it reconnects and starts again, until the window
ends. The connections come from 127.0.0.2 and up, 32 per address, so the per-client cap does
not turn them away and every one of them reaches the head bound. Meanwhile a legitimate
scraper on 127.0.0.1 asks for ``/metrics`` four times a second.

The server's RSS is read from ``/proc`` every 0.1 s: before the attack (after a 3 s warm-up),
its highest value during the attack, and 2 s after. ``--unbounded`` is the baseline: the same
server with the head bounds lifted to what the stdlib alone allows (100 lines of 64 KiB), as
before the bounds existed; it can take more than a GB with 256 connections, so try it with
``--connections 80`` (the issue's repro) first.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import threading
import time

from .common import MB, rss_bytes, simulated_exporter

LINE = b"X-Flood: " + b"a" * 65_000 + b"\r\n"
LINES = 99
PER_ADDRESS = 32


def attacker(port: int, source: str, until: float, tally: dict[str, int], lock: threading.Lock) -> None:
    while time.monotonic() < until:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
        except OSError:
            time.sleep(0.05)
            continue
        answer = b""
        try:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            for _ in range(LINES):
                if time.monotonic() >= until:
                    break
                sock.sendall(LINE)
            # All sent, the head never ended: hold the connection until the server answers or
            # hangs up (its 10 s request deadline), or the window ends.
            sock.settimeout(max(0.1, until - time.monotonic()))
            answer = sock.recv(64)
        except OSError:
            try:
                answer = sock.recv(64)
            except OSError:
                pass
        finally:
            sock.close()
        with lock:
            tally["rounds"] += 1
            tally["431"] += answer.startswith(b"HTTP/1.1 431")


def scraper(port: int, until: float, tally: dict[str, int], lock: threading.Lock) -> None:
    while time.monotonic() < until:
        ok = False
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/metrics")
            response = conn.getresponse()
            ok = response.status == 200 and len(response.read()) > 0
            conn.close()
        except (OSError, http.client.HTTPException):
            pass
        with lock:
            tally["scrapes"] += 1
            tally["scrapes_ok"] += ok
        time.sleep(0.25)


def run(connections: int, seconds: float, unbounded: bool) -> dict[str, object]:
    with simulated_exporter(*(["--unbounded-heads"] if unbounded else [])) as (proc, port):
        time.sleep(3.0)
        before = rss_bytes(proc.pid)
        tally = {"rounds": 0, "431": 0, "scrapes": 0, "scrapes_ok": 0}
        lock = threading.Lock()
        until = time.monotonic() + seconds
        threads = [threading.Thread(target=attacker, args=(port, f"127.0.0.{2 + i // PER_ADDRESS}", until, tally, lock),
                                    daemon=True) for i in range(connections)]
        threads.append(threading.Thread(target=scraper, args=(port, until, tally, lock), daemon=True))
        for thread in threads:
            thread.start()
        peak = before
        while time.monotonic() < until:
            peak = max(peak, rss_bytes(proc.pid))
            time.sleep(0.1)
        for thread in threads:
            thread.join(30)
        peak = max(peak, rss_bytes(proc.pid))
        time.sleep(2.0)
        after = rss_bytes(proc.pid)
        peak = max(peak, after)
        alive = proc.poll() is None
    return {"connections": connections, "seconds": seconds, "unbounded": unbounded, "server_alive": alive,
            "rss_before_mb": round(before / MB, 1), "rss_peak_mb": round(peak / MB, 1),
            "rss_after_mb": round(after / MB, 1), **tally}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.bench_header_flood",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--unbounded", action="store_true", help="the baseline: no bound on a head's total size")
    ns = parser.parse_args()
    print(json.dumps(run(ns.connections, ns.seconds, ns.unbounded)))


if __name__ == "__main__":
    main()
