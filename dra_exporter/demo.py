"""``dra-exporter demo``: every node of a simulated cluster, each its own exporter process.

One ``dra-exporter serve --simulate <scenario> --node-name <node>`` subprocess per node of the
scenario (``gb200-domain``: 4 nodes), on consecutive ports from ``--base-port``; the Prometheus
scrape configuration for them is printed on stdout, so a local Prometheus can scrape the whole
cluster. Ctrl-C (or SIGTERM) stops them all; one that dies stops the demo; a demo killed outright
(SIGKILL, the OOM killer) takes them with it (``die_with_parent``). Each process has its
own simulated API server that serves the whole cluster, as each node agent of a real cluster
talks to the one API server.

The exporters run in their own session: a terminal's Ctrl-C reaches only the demo, which stops
them with SIGTERM (a child caught by SIGINT while still importing would print a traceback).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, TextIO

import yaml

#: The scrape job the dashboards and alert rules select on (as the chart's relabelings set it).
JOB = "dra-exporter"
DEFAULT_BASE_PORT = 9410
"""Clear of ``serve``'s 9401 and ``cluster``'s 9402, so a demo runs beside a real exporter."""
STOP_DEADLINE_S = 10.0
"""How long the exporters get to stop before they are killed (they take well under a second)."""


def ports_in_use(host: str, ports: Sequence[int]) -> list[int]:
    """The ports of ``ports`` something on ``host`` listens on already (checked before any start)."""
    taken = []
    for port in ports:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
            # As the exporters' servers bind: a port only in TIME_WAIT (a demo just stopped) is free.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError:
                taken.append(port)
    return taken


def scrape_config(targets: Sequence[tuple[str, str]], interval: float) -> str:
    """A Prometheus ``scrape_configs`` entry for (node, host:port) targets; ``instance`` is the node
    name, as the chart's relabelings make it (the dashboards pick nodes by instance)."""
    return yaml.safe_dump({"scrape_configs": [{
        "job_name": JOB,
        "scrape_interval": f"{interval:g}s",
        "static_configs": [{"targets": [address], "labels": {"instance": node}} for node, address in targets],
    }]}, sort_keys=False)


#: ``prctl(PR_SET_PDEATHSIG, ...)``: the signal the kernel sends a process when its parent dies.
_PR_SET_PDEATHSIG: Final = 1


def die_with_parent(parent: int) -> Callable[[], None]:
    """What a child runs before ``exec``: ask the kernel (Linux) for SIGTERM when ``parent`` dies —
    however it dies: a demo killed with SIGKILL runs no ``finally`` — and end at once if it already
    has (the child then has another parent). Elsewhere, nothing: Ctrl-C and SIGTERM still stop them."""
    def arm() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)
    return arm


def run(scenario: str, nodes: Sequence[str], base_port: int, host: str, interval: float,
        out: TextIO = sys.stdout, extra: Sequence[str] = ()) -> int:
    """Start one exporter per node, print the scrape config, wait for Ctrl-C; the exit code."""
    targets = [(node, f"{host}:{base_port + i}") for i, node in enumerate(nodes)]
    procs: list[subprocess.Popen[bytes]] = []

    def stop(*_: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        for node, address in targets:
            procs.append(subprocess.Popen([
                sys.executable, "-m", "dra_exporter.cli", "serve", "--simulate", scenario, "--node-name", node,
                "--listen", address, "--interval", f"{interval:g}", *extra], start_new_session=True,
            preexec_fn=die_with_parent(os.getpid())))
        out.write(f"# {len(procs)} exporters of scenario {scenario}; Ctrl-C stops them. Prometheus:\n")
        out.write(scrape_config(targets, interval))
        out.flush()
        while True:
            for (node, _), proc in zip(targets, procs, strict=True):
                if proc.poll() is not None:
                    sys.stderr.write(f"dra-exporter demo: the exporter of {node} exited with {proc.returncode}; "
                                     "stopping the others\n")
                    return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + STOP_DEADLINE_S
        for (node, _), proc in zip(targets, procs, strict=False):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                sys.stderr.write(f"dra-exporter demo: the exporter of {node} did not stop in "
                                 f"{STOP_DEADLINE_S:g} s; killed\n")
                proc.kill()
                proc.wait()
