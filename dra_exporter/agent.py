"""The loop: run the sources, join their latest snapshots, publish the frame.

NVML is the primary source: each cycle collects it, joins it with the latest
snapshot of every side source (kubelet, API server, /proc), and publishes one
frame to every sink. Side sources run on their own threads, so a hanging kubelet
never delays NVML data. A failing source never fails the cycle; its health is
published as self-metrics.
"""

from __future__ import annotations

import logging
import platform
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from . import __version__
from .join import JoinInput, join
from .model import Frame, NvmlSnapshot, PodResourcesSnapshot, SourceHealth
from .resolve import Resolver

log = logging.getLogger(__name__)


class Source(Protocol):
    name: str

    def collect(self) -> Any: ...

    def close(self) -> None: ...


class Sink(Protocol):
    def publish(self, frame: Frame) -> None: ...


class ReportingSink(Sink, Protocol):
    """A sink whose own health is worth a self-metric (a push that can fail)."""

    def health(self) -> SourceHealth: ...


class SourceRunner:
    """Collects one source, times it and tracks its health.

    ``keep_last_good``: after a failure keep serving the last good snapshot (kubelet,
    API server: attribution that is a few seconds old beats none) instead of dropping it
    (NVML: stale device values would be misleading).
    """

    def __init__(self, source: Source, *, keep_last_good: bool, wall_clock: Callable[[], float] = time.time,
                 interval: float = 1.0) -> None:
        self.source = source
        self.keep_last_good = keep_last_good
        self.interval = interval
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._snapshot: Any = None
        self._health = SourceHealth(source.name, up=False)
        self._thread: threading.Thread | None = None
        self._last_error = ""

    @property
    def name(self) -> str:
        return self.source.name

    def latest(self) -> tuple[Any, SourceHealth]:
        with self._lock:
            return self._snapshot, self._health

    def collect_once(self) -> None:
        started = time.perf_counter()
        try:
            snapshot = self.source.collect()
        except Exception as exc:  # noqa: BLE001 - one source must never stop the others
            self._failed(exc, time.perf_counter() - started)
            return
        duration = time.perf_counter() - started
        with self._lock:
            self._snapshot = snapshot
            self._health = SourceHealth(self.name, True, duration, self._health.errors_total, self._wall_clock())
        if self._last_error:
            log.info("source recovered", extra={"source": self.name})
            self._last_error = ""

    def _failed(self, exc: Exception, duration: float) -> None:
        message = str(exc) or type(exc).__name__
        with self._lock:
            if not self.keep_last_good:
                self._snapshot = None
            h = self._health
            self._health = SourceHealth(self.name, False, duration, h.errors_total + 1, h.last_success_timestamp)
        if message != self._last_error:
            # Log state changes only: a source down for an hour must not flood the log.
            log.warning("source %s failed: %s", self.name, message, extra={"source": self.name})
            self._last_error = message

    def start(self, stop: threading.Event) -> None:
        def loop() -> None:
            while not stop.is_set():
                started = time.monotonic()
                self.collect_once()
                stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

        self._thread = threading.Thread(target=loop, name=f"source-{self.name}", daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> None:
        if self._thread:
            self._thread.join(timeout)


class Agent:
    """Schedules sources, joins, publishes. ``cycle()`` is one synchronous round."""

    def __init__(self, primary: SourceRunner, side: Sequence[SourceRunner], sinks: Sequence[Sink], *,
                 interval: float = 1.0, self_pod: tuple[str, str] | None = None,
                 wall_clock: Callable[[], float] = time.time,
                 resolvers: Callable[[], Sequence[Resolver]] = tuple) -> None:
        self.primary = primary
        self.side = tuple(side)
        self.sinks = list(sinks)
        self.interval = interval
        self.self_pod = self_pod
        self.ready = threading.Event()
        self._wall_clock = wall_clock
        self._resolvers = resolvers
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.cycles = 0

    def cycle(self, *, collect_side: bool = False) -> Frame:
        """Collect the primary source (and, if asked, each side source), join, publish."""
        if collect_side:
            for runner in self.side:
                runner.collect_once()
        self.primary.collect_once()
        frame = join(self._join_input())
        for sink in self.sinks:
            sink.publish(frame)
        self.cycles += 1
        self.ready.set()
        return frame

    def _join_input(self) -> JoinInput:
        snapshots: dict[str, Any] = {}
        health = []
        for runner in (self.primary, *self.side):
            snapshot, h = runner.latest()
            snapshots[runner.name] = snapshot
            health.append(h)
        health.extend(sink.health() for sink in self.sinks if hasattr(sink, "health"))
        nvml = snapshots.get("nvml")
        pods = snapshots.get("podresources")
        return JoinInput(
            nvml=nvml if isinstance(nvml, NvmlSnapshot) else None,
            pods=pods if isinstance(pods, PodResourcesSnapshot) else None,
            health=tuple(sorted(health, key=lambda h: h.source)),
            self_pod=self.self_pod,
            resolvers=tuple(self._resolvers()),
            version=__version__,
            python_version=platform.python_version(),
            timestamp=self._wall_clock(),
        )

    def start(self) -> None:
        """Run side sources on their threads and the cycle on another; returns at once."""
        for runner in self.side:
            runner.collect_once()  # so the first frame already carries attribution
            runner.start(self._stop)
        self._thread = threading.Thread(target=self._loop, name="agent-cycle", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        deadline = time.monotonic()
        while not self._stop.is_set():
            try:
                self.cycle()
            except Exception:  # noqa: BLE001 - keep serving the last frame rather than die
                log.exception("cycle failed")
            deadline += self.interval
            now = time.monotonic()
            if deadline < now:  # fell behind: skip missed ticks instead of bursting
                deadline = now
            self._stop.wait(deadline - now)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout)
        for runner in self.side:
            runner.join(timeout)
        for runner in (self.primary, *self.side):
            try:
                runner.source.close()
            except Exception:  # noqa: BLE001 - shutting down anyway
                log.debug("closing %s failed", runner.name, exc_info=True)
