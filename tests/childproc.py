"""Servers the tests start die with the test run.

A test run killed from outside (a CI timeout, Ctrl-C twice, ``kill -9``) runs no fixture teardown,
and the servers it started — etcd, kube-apiserver, the scheduler, Prometheus — used to live on,
holding ports and both cores of the machine for the next run. ``die_with_parent`` is a
``preexec_fn`` that asks Linux to send the child SIGTERM when the process that started it exits
(``prctl(PR_SET_PDEATHSIG)``); elsewhere it does nothing and teardown is all there is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In the child, between fork and exec: SIGTERM when the parent exits (Linux only)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
