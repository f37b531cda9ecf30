"""DeviceClass selectors evaluated in a worker process: the cluster mode's ``CelEngine``.

Why a process: the CEL library (Rust) holds the GIL for a whole evaluation, has no cost counter,
and can crash on input the API server would refuse. In this process, one class with three nested
``.all()`` over 300 elements stopped ``/healthz`` for 12 s; here it costs the worker, which the
parent waits for without the GIL and kills at ``time_limit``. The scheduler enforces a runtime cost
limit (``CELSelectorExpressionMaxCost``: 1,000,000, "roughly 0.1 second" an evaluation); the
library counts no cost, so the limit here is time, with room for a loaded machine. A class whose
evaluation exceeds it, or crashes the library, is refused as a whole with one line, and a fresh
worker takes the next class.

Protocol: the parent writes a request and reads one reply, each a 4-byte big-endian length and a
``marshal``-ed tuple (plain values only: the ``device`` view is dicts, lists, strings, numbers).
``("check", id, expressions)`` → ``""`` or the compile error; ``("eval", id, expressions | None,
view)`` → a ``Verdict``. Expressions travel once per worker; later requests name them by id.
The worker dies with the parent (death signal, and end of input).
"""

from __future__ import annotations

import ctypes
import logging
import marshal
import os
import resource
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import weakref
from typing import IO, Any, Final

from .kubecel import UNSUPPORTED
from .selectors import MAX_PROGRAMS, Interrupted, Verdict, compile_programs, run_programs

#: Wall time one evaluation (or compilation) may take, in seconds.
DEFAULT_TIME_LIMIT: Final = 1.0
#: Wall time the worker may take to start (Python, the library) on a loaded machine.
STARTUP_LIMIT: Final = 60.0
_READY: Final = "ready"
#: Address space of the worker: a compile that would take gigabytes fails there, not here.
WORKER_ADDRESS_SPACE: Final = 2 << 30
_HEADER: Final = struct.Struct(">I")
#: The largest reply or request: a view is a few KiB, ten expressions 100 KiB.
_MAX_MESSAGE: Final = 16 << 20
_PR_SET_PDEATHSIG: Final = 1
#: Classes whose refusal was logged, remembered up to this many (then the log may repeat itself).
_MAX_LOGGED: Final = 10_000

log = logging.getLogger(__name__)


class CelWorker:
    """The parent's side: a ``CelEngine`` whose evaluations run in a worker process."""

    def __init__(self, time_limit: float = DEFAULT_TIME_LIMIT) -> None:
        self.time_limit = time_limit
        self._lock = threading.Lock()
        self._slot = _Slot()
        weakref.finalize(self, self._slot.stop)  # a dropped engine takes its worker with it
        self._ids: dict[tuple[str, ...], int] = {}
        self._sent: set[int] = set()  # ids the current worker has the expressions of
        self.restarts = 0
        self._logged: set[tuple[str, tuple[str, ...]]] = set()

    # --- CelEngine -----------------------------------------------------------------------------

    def check(self, name: str, expressions: tuple[str, ...]) -> str:
        reply = self._ask("check", expressions, None)
        why = reply if isinstance(reply, str) else ""
        self._refused(name, expressions, why)
        return why

    def evaluate(self, name: str, expressions: tuple[str, ...], view: dict[str, Any]) -> Verdict:
        verdict = self._ask("eval", expressions, view)
        if isinstance(verdict, str):
            self._refused(name, expressions, verdict)
        return verdict

    def _refused(self, name: str, expressions: tuple[str, ...], why: str) -> None:
        """One line per class and version of its selectors: the class is not counted until it changes."""
        if not why or isinstance(why, Interrupted) or (name, expressions) in self._logged:
            # An interrupted run is tried again (cel_budget), which logs it if it never succeeds.
            return
        if len(self._logged) >= _MAX_LOGGED:
            self._logged.clear()
        self._logged.add((name, expressions))
        log.warning("DeviceClass %s: selectors not evaluated, its capacity is not reported: %s",
                    ascii(name)[1:-1], why)

    def close(self) -> None:
        with self._lock:
            self._stop()

    # --- the conversation -----------------------------------------------------------------------

    def _ask(self, op: str, expressions: tuple[str, ...], view: dict[str, Any] | None) -> Verdict:
        with self._lock:
            if expressions not in self._ids and len(self._ids) >= MAX_PROGRAMS:
                self._ids.clear()  # and a fresh worker, so that neither side keeps them all
                self._stop()
            ident = self._ids.setdefault(expressions, len(self._ids))
            process = self._slot.process
            try:
                if process is None or process.poll() is not None:
                    process = self._start()
            except (OSError, EOFError, ValueError, TimeoutError) as exc:
                self._stop()
                return Interrupted(f"the CEL worker could not start: {exc or type(exc).__name__}")
            carried = None if ident in self._sent else expressions
            try:
                payload = marshal.dumps((op, ident, carried, view))
            except ValueError:
                return None  # a value marshal cannot carry: the API would not have served it
            try:
                _write(process.stdin, payload)
                self._sent.add(ident)
                reply = _read(process.stdout, time.monotonic() + self.time_limit)
            except TimeoutError:
                self._stop()
                return Interrupted(f"evaluation took longer than {self.time_limit:g} s (the scheduler's cost limit)")
            except (OSError, EOFError, ValueError):
                code = self._stop()
                how = f"signal {-code}" if code is not None and code < 0 else f"exit {code}"
                # The library's own crash, or the worker killed from outside (OOM, an operator):
                # which one cannot be told here, so it is tried again (cel_budget.MAX_TRIES),
                # then taken as a class this exporter cannot run.
                return Interrupted(f"{UNSUPPORTED}the CEL library crashed evaluating it ({how})")
            return reply if isinstance(reply, (bool, str)) else None

    def _start(self) -> subprocess.Popen[bytes]:
        self._stop()
        process = self._slot.process = subprocess.Popen(
            [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, close_fds=True)
        self._sent = set()
        self.restarts += 1
        # Starting Python and the library is not an evaluation: it has its own, generous bound.
        if _read(process.stdout, time.monotonic() + STARTUP_LIMIT) != _READY:
            raise EOFError("the CEL worker did not start")
        return process

    def _stop(self) -> int | None:
        return self._slot.stop()

    @property
    def pid(self) -> int | None:
        """The current worker's process id (None before the first evaluation or after a stop)."""
        process = self._slot.process
        return process.pid if process is not None else None


class _Slot:
    """The worker process, held apart from ``CelWorker`` so a finalizer can stop it."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None

    def stop(self) -> int | None:
        """Kills the worker if it runs; its exit status (negative: the signal), None when none ran."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            process.kill()
        code = process.wait()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()
        return code


def _write(stream: IO[bytes] | None, payload: bytes) -> None:
    if stream is None:
        raise EOFError
    stream.write(_HEADER.pack(len(payload)) + payload)
    stream.flush()


def _read(stream: IO[bytes] | None, deadline: float) -> Any:
    """One message, by ``deadline`` (monotonic) for the whole of it."""
    if stream is None:
        raise EOFError
    fd = stream.fileno()
    header = _read_exactly(fd, _HEADER.size, deadline)
    (size,) = _HEADER.unpack(header)
    if size > _MAX_MESSAGE:
        raise ValueError(f"a reply of {size} bytes")
    return marshal.loads(_read_exactly(fd, size, deadline))


def _read_exactly(fd: int, size: int, deadline: float) -> bytes:
    chunks, left = [], size
    while left:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            raise TimeoutError
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# --- the worker ----------------------------------------------------------------------------------


def _serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    programs: dict[int, list[Any] | str] = {}
    _write(replies, marshal.dumps(_READY))
    while True:
        header = requests.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return  # the parent closed the pipe, or died
        (size,) = _HEADER.unpack(header)
        op, ident, expressions, view = marshal.loads(requests.read(size))
        if expressions is not None:
            programs[ident] = compile_programs(expressions)
        compiled = programs.get(ident, "expressions not sent")
        if op == "check" or isinstance(compiled, str):
            reply: Verdict = compiled if isinstance(compiled, str) else ""
        else:
            reply = run_programs(compiled, view)
        _write(replies, marshal.dumps(reply))


def main() -> None:
    try:  # die with the parent, even when it is killed (Linux)
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    resource.setrlimit(resource.RLIMIT_AS, (WORKER_ADDRESS_SPACE, WORKER_ADDRESS_SPACE))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it; Ctrl-C reaches the group
    _serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    main()
