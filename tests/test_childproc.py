"""The servers a test run starts do not outlive it when it is killed (tests/childproc.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0) until its new parent (init) reaps it.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("preexec", [True, False])
def test_a_child_started_with_die_with_parent_goes_when_its_parent_is_killed(preexec: bool) -> None:
    script = (
        "import subprocess, sys, time\n"
        f"sys.path.insert(0, {str(TESTS)!r})\n"
        "from childproc import die_with_parent\n"
        "child = subprocess.Popen(['sleep', '60'], start_new_session=True"
        f"{', preexec_fn=die_with_parent' if preexec else ''})\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        parent.send_signal(signal.SIGKILL)  # no teardown runs, as when CI kills a test run
        parent.wait(timeout=10)
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        # Without die_with_parent the child outlives its parent: the orphan this module prevents.
        assert _alive(child) is not preexec
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
