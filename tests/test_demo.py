"""``dra-exporter demo``: its ports are checked before anything starts, and Ctrl-C stops every
exporter cleanly (no traceback, none left for the kill deadline)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest
from promharness import free_port

from dra_exporter import demo

NODES = 4  # gb200-domain


def free_ports(count: int) -> int:
    """A base port with ``count`` free ports from it."""
    for _ in range(50):
        base = free_port()
        if base + count <= 65535 and not demo.ports_in_use("127.0.0.1", range(base, base + count)):
            return base
    pytest.fail("no run of free ports")


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def foreground_job(command: list[str]) -> subprocess.Popen[str]:
    """``command`` as a shell starts a foreground job: a session of its own (Ctrl-C is SIGINT to the
    whole group) and SIGINT at its default, even where the test run itself inherited it ignored (a CI
    runner that starts ``.ci/run`` as a background job: the shell ignores SIGINT there, and a Python
    started with SIGINT ignored never raises KeyboardInterrupt)."""
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_sigint_default)


def start(*args: str) -> subprocess.Popen[str]:
    return foreground_job([sys.executable, "-m", "dra_exporter.cli", "demo", *args])


def test_the_demo_gets_sigint_at_its_default_when_the_test_run_ignores_it() -> None:
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as under `.ci/run &`
    try:
        proc = foreground_job([sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT))"])
    finally:
        signal.signal(signal.SIGINT, before)
    out, err = proc.communicate(timeout=60)
    assert "default_int_handler" in out, (out, err)  # Ctrl-C raises KeyboardInterrupt in it


@pytest.fixture
def stopped() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_port_in_use_is_found_before_anything_starts_and_exits_2() -> None:
    base = free_ports(NODES)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", base + 2))
        busy.listen()
        result = subprocess.run([sys.executable, "-m", "dra_exporter.cli", "demo", "--base-port", str(base)],
                                capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2, result.stderr
    assert result.stdout == "", "no scrape config for exporters that never started"
    assert result.stderr.count("\n") == 1 and f"port {base + 2} on 127.0.0.1 in use" in result.stderr


def test_the_default_ports_are_clear_of_serve_and_cluster() -> None:
    ports = range(demo.DEFAULT_BASE_PORT, demo.DEFAULT_BASE_PORT + NODES)
    assert 9401 not in ports and 9402 not in ports


def _serving(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
            return True
    except OSError:
        return False


@pytest.mark.slow  # four exporter processes start
def test_ctrl_c_stops_every_exporter_without_a_traceback_or_the_kill(
        stopped: list[subprocess.Popen[str]]) -> None:
    base = free_ports(NODES)
    proc = start("--base-port", str(base), "--interval", "1")
    stopped.append(proc)
    deadline = time.monotonic() + 120
    while not all(_serving(base + i) for i in range(NODES)):
        if proc.poll() is not None:
            pytest.fail(f"the demo exited with {proc.returncode}: {proc.communicate()[1]}")
        assert time.monotonic() < deadline, "the exporters never came up"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    # They stop on their own, long before the kill deadline (issue 24: a child's main thread sat
    # in stop.wait() until it).
    out, err = proc.communicate(timeout=demo.STOP_DEADLINE_S)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "killed" not in err, err
    assert "scrape_configs" in out
    assert not any(_serving(base + i) for i in range(NODES)), "every exporter is gone"


@pytest.mark.slow  # four exporter processes start
def test_ctrl_c_while_the_exporters_start_prints_no_traceback(stopped: list[subprocess.Popen[str]]) -> None:
    base = free_ports(NODES)
    proc = start("--base-port", str(base), "--interval", "1")
    stopped.append(proc)
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("# 4 exporters"), "the scrape config is printed as they start"
    os.killpg(proc.pid, signal.SIGINT)  # they are still importing
    _, err = proc.communicate(timeout=demo.STOP_DEADLINE_S)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
