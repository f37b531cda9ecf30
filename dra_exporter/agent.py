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
from .model import ClusterSnapshot, Frame, NvmlSnapshot, PodResourcesSnapshot, ProcessOwnersSnapshot, SourceHealth
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
        self.attempted = threading.Event()
        """Set once the first collection has finished, successfully or not."""

    @property
    def name(self) -> str:
        return self.source.name

    def latest(self) -> tuple[Any, SourceHealth]:
        with self._lock:
            return self._snapshot, self._health

    def collect_once(self) -> None:
        try:
            self._collect()
        finally:
            self.attempted.set()

    def _collect(self) -> None:
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
            log.info("source %s recovered", self.name, extra={"source": self.name})
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
                 resolvers: Callable[[], Sequence[Resolver]] = tuple,
                 followers: Sequence[SourceRunner] = ()) -> None:
        self.primary = primary
        self.side = tuple(side)
        self.followers = tuple(followers)
        """Collected right after the primary source in the same cycle, because they read its
        snapshot (the /proc lookup of the PIDs NVML just reported)."""
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
        self._collect_primary()
        return self._publish()

    def _collect_primary(self) -> None:
        self.primary.collect_once()
        for runner in self.followers:
            runner.collect_once()

    def _publish(self) -> Frame:
        frame = join(self._join_input())
        for sink in self.sinks:
            sink.publish(frame)
        self.cycles += 1
        self.ready.set()
        return frame

    def _join_input(self) -> JoinInput:
        snapshots: dict[str, Any] = {}
        health = []
        for runner in (self.primary, *self.followers, *self.side):
            snapshot, h = runner.latest()
            snapshots[runner.name] = snapshot
            health.append(h)
        health.extend(sink.health() for sink in self.sinks if hasattr(sink, "health"))
        nvml = snapshots.get("nvml")
        pods = snapshots.get("podresources")
        cluster = snapshots.get("kubeapi")
        owners = snapshots.get("procs")
        return JoinInput(
            owners=owners if isinstance(owners, ProcessOwnersSnapshot) else None,
            nvml=nvml if isinstance(nvml, NvmlSnapshot) else None,
            pods=pods if isinstance(pods, PodResourcesSnapshot) else None,
            cluster=cluster if isinstance(cluster, ClusterSnapshot) else None,
            health=tuple(sorted(health, key=lambda h: h.source)),
            self_pod=self.self_pod,
            resolvers=tuple(self._resolvers()),
            version=__version__,
            python_version=platform.python_version(),
            timestamp=self._wall_clock(),
        )

    def start(self, *, startup_wait: float = 10.0) -> None:
        """Run side sources on their threads and the cycle on another; returns at once.

        The first NVML collection starts right away (it registers the XID event set), but
        the first frame waits up to ``startup_wait`` seconds for every side source's first
        answer, so it already carries attribution — a slow API client import or a kubelet
        that hangs cannot hold back readiness for longer than that.
        """
        for runner in self.side:
            runner.start(self._stop)
        self._thread = threading.Thread(target=self._loop, args=(startup_wait,), name="agent-cycle",
                                        daemon=True)
        self._thread.start()

    def _wait_for_side_sources(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for runner in self.side:
            runner.attempted.wait(max(0.0, deadline - time.monotonic()))

    def _loop(self, startup_wait: float) -> None:
        self._collect_primary()  # at once: NVML init and XID event registration
        self._wait_for_side_sources(startup_wait)
        deadline = time.monotonic()
        failing = False
        first = True
        while not self._stop.is_set():
            try:
                if first:  # NVML was just collected above; join and publish what we have
                    self._publish()
                    first = False
                else:
                    self.cycle()
                if failing:
                    log.info("cycles work again")
                failing = False
            except Exception:  # noqa: BLE001 - keep serving the last frame rather than die
                if not failing:  # one traceback per failure episode, not one per interval
                    log.exception("cycle failed; serving the last good frame until it works again")
                failing = True
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
        for runner in (self.primary, *self.followers, *self.side):
            try:
                runner.source.close()
            except Exception:  # noqa: BLE001 - shutting down anyway
                log.debug("closing %s failed", runner.name, exc_info=True)
