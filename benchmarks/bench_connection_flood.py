"""Probes and scrapes of ``serve --simulate demo`` under a connection flood.

``python3 -m benchmarks.bench_connection_flood [--sockets 300] [--sources 1] [--seconds 10]``

The attack of issue 13, item 3: ``--sockets`` idle connections (they send nothing), each reopened
as soon as the server closes it, from ``--sources`` loopback addresses (127.0.0.2 and up). Meanwhile
a kubelet-like prober on 127.0.0.1 asks ``/healthz`` and ``/readyz`` and a scraper ``/metrics``,
each on a new connection every 0.25 s, and the answers (HTTP 200) are counted. Each case runs twice
in the same run: against the server as it is, and against the baseline ``--global-cap-only`` (the
global cap of 256 connections alone, no per-client cap, no probe reserve: the server before the fix).

- One source address: the per-client cap (128) holds the flood, so probes and scrapes from other
  addresses keep every slot they need.
- Many addresses (``--sources 8``): the flood can fill the global cap; then the probe reserve still
  answers the probes, while scrapes wait for slots (that part is not promised).
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import threading
import time

from .common import simulated_exporter


def flooder(port: int, source: str, until: float, opened: list[int], lock: threading.Lock) -> None:
    """One idle connection, opened again whenever the server closes it, until ``until``."""
    while time.monotonic() < until:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=2, source_address=(source, 0))
        except OSError:
            time.sleep(0.01)
            continue
        with lock:
            opened[0] += 1
        try:
            sock.settimeout(max(0.05, until - time.monotonic()))
            sock.recv(1)  # returns (b"" or an error) when the server hangs up
        except OSError:
            pass
        finally:
            sock.close()


def asker(port: int, paths: tuple[str, ...], until: float, tally: dict[str, list[int]], lock: threading.Lock) -> None:
    """Each of ``paths`` every 0.25 s on a new connection; per path: [asked, answered 200]."""
    while time.monotonic() < until:
        for path in paths:
            ok = False
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3)
                conn.request("GET", path)
                response = conn.getresponse()
                response.read()
                ok = response.status == 200
                conn.close()
            except (OSError, http.client.HTTPException):
                pass
            with lock:
                tally[path][0] += 1
                tally[path][1] += ok
        time.sleep(0.25)


def run(sockets: int, sources: int, seconds: float, baseline: bool) -> dict[str, object]:
    with simulated_exporter(*(["--global-cap-only"] if baseline else [])) as (proc, port):
        lock = threading.Lock()
        opened = [0]
        tally = {path: [0, 0] for path in ("/healthz", "/readyz", "/metrics")}
        until = time.monotonic() + seconds
        threads = [threading.Thread(target=flooder, args=(port, f"127.0.0.{2 + i % sources}", until, opened, lock),
                                    daemon=True) for i in range(sockets)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)  # let the flood take the slots first
        askers = [threading.Thread(target=asker, args=(port, ("/healthz", "/readyz"), until, tally, lock), daemon=True),
                  threading.Thread(target=asker, args=(port, ("/metrics",), until, tally, lock), daemon=True)]
        for thread in askers:
            thread.start()
        for thread in threads + askers:
            thread.join(seconds + 10)
        alive = proc.poll() is None
    answered = {path.strip("/"): f"{ok} of {asked}" for path, (asked, ok) in tally.items()}
    return {"server": "global cap only (before)" if baseline else "per-client cap + probe reserve (now)",
            "sockets": sockets, "sources": sources, "seconds": seconds, "flood_connections_opened": opened[0],
            "server_alive": alive, **answered}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.bench_connection_flood",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--sockets", type=int, default=300)
    parser.add_argument("--sources", type=int, default=1, help="loopback addresses the flood comes from")
    parser.add_argument("--seconds", type=float, default=10.0)
    ns = parser.parse_args()
    for baseline in (False, True):
        print(json.dumps(run(ns.sockets, ns.sources, ns.seconds, baseline)), flush=True)


if __name__ == "__main__":
    main()
