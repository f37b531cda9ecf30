"""The loop of every long-running program: run the sources, hand their latest snapshots to the
program's pure core, publish the frame.

Each cycle collects the primary sources (the node agent: NVML; the cluster mode: the cluster's
objects) and their followers, gives the latest snapshot of every source to the ``core`` (the
node agent: ``join``; the cluster mode: the capacity arithmetic), and publishes the one frame it
returns to every sink. Side sources run on their own threads, so a hanging kubelet never delays
NVML data. A failing source never fails the cycle; its health is published as self-metrics.

A cycle that never returns (a wedged NVML call, a FIFO under ``--procfs``, an API server that
answers one byte a second) cannot report itself, so a watchdog thread watches when the last cycle
finished. Past ``stall_after`` seconds the cycle counts as stalled: ``health()`` says not ready at
once and not alive ``liveness_grace`` seconds later (the probes, so the kubelet restarts the pod),
the watchdog logs one line naming the source the cycle is stuck in, and it publishes frames of its
own in which the primary sources (and that source) are down.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Generic, Protocol, TypeVar

from .config import default_stall_timeout
from .model import Frame, LoopHealth, SourceHealth
from .sources import PartialSnapshot, Snapshots, Source

log = logging.getLogger(__name__)

T = TypeVar("T")


class Sink(Protocol):
    def publish(self, frame: Frame) -> None: ...


class Core(Protocol):
    """A program's pure core: the latest snapshot and health of every source (and of the sinks
    that report one), sorted by source, and the wall-clock time → the frame to publish."""

    def __call__(self, snapshots: Snapshots, health: tuple[SourceHealth, ...], timestamp: float) -> Frame: ...


class SourceRunner(Generic[T]):
    """Collects one source, times it and tracks its health.

    ``keep_last_good``: after a failure keep serving the last good snapshot (kubelet,
    API server: attribution that is a few seconds old beats none) instead of dropping it
    (NVML: stale device values would be misleading).

    ``place`` puts the snapshot into the core's ``Snapshots`` (``sources.registry`` gives
    each source's); without it only the source's health reaches the frame.
    """

    def __init__(self, source: Source[T], *, keep_last_good: bool,
                 place: Callable[[Snapshots, T], Snapshots] | None = None,
                 wall_clock: Callable[[], float] = time.time,
                 interval: float = 1.0, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        self.keep_last_good = keep_last_good
        self.place = place
        self.interval = interval
        self._wall_clock = wall_clock
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._snapshot: T | None = None
        self._health = SourceHealth(source.name, up=False)
        self._collecting_since: float | None = None
        self._thread: threading.Thread | None = None
        self._last_error = ""
        self.attempted = threading.Event()
        """Set once the first collection has finished, successfully or not."""
        self.answered = threading.Event()
        """Set once a collection has succeeded."""

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def last_error(self) -> str:
        """Why the latest collection failed; ``""`` after a success."""
        return self._last_error

    def latest(self) -> tuple[T | None, SourceHealth]:
        with self._lock:
            return self._snapshot, self._health

    def placed(self, snapshots: Snapshots, snapshot: T | None) -> Snapshots:
        """``snapshots`` with ``snapshot`` (this source's) in its place; unchanged for None."""
        return snapshots if snapshot is None or self.place is None else self.place(snapshots, snapshot)

    def collecting_for(self) -> float | None:
        """Seconds the collection in progress has been running (``monotonic``), None when idle."""
        since = self._collecting_since
        return None if since is None else self._monotonic() - since

    def collect_once(self) -> None:
        self._collecting_since = self._monotonic()
        try:
            self._collect()
        finally:
            self._collecting_since = None
            self.attempted.set()

    def _collect(self) -> None:
        started = time.perf_counter()
        try:
            snapshot = self.source.collect()
        except PartialSnapshot as exc:
            with self._lock:
                self._snapshot = exc.snapshot  # type: ignore[assignment]  # the source's own type
            self.answered.set()  # part of the view is there: usable, while the health says what is not
            self._failed(exc, time.perf_counter() - started, keep=True)
            return
        except Exception as exc:  # noqa: BLE001 - one source must never stop the others
            self._failed(exc, time.perf_counter() - started)
            return
        duration = time.perf_counter() - started
        with self._lock:
            self._snapshot = snapshot
            self._health = SourceHealth(self.name, True, duration, self._health.errors_total, self._wall_clock())
        self.answered.set()
        if self._last_error:
            log.info("source %s recovered", self.name, extra={"source": self.name})
            self._last_error = ""

    def _failed(self, exc: Exception, duration: float, keep: bool = False) -> None:
        message = str(exc) or type(exc).__name__
        with self._lock:
            if not (self.keep_last_good or keep):
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
    """Schedules sources, runs the core, publishes. ``cycle()`` is one synchronous round.

    ``stall_after`` (default ``config.default_stall_timeout(interval)``) and
    ``liveness_grace`` (default: as long again) are the watchdog's bounds, measured on
    ``monotonic``; see the module docstring.
    """

    def __init__(self, primaries: Sequence[SourceRunner[Any]], side: Sequence[SourceRunner[Any]],
                 sinks: Sequence[Sink], *, core: Core, interval: float = 1.0,
                 wall_clock: Callable[[], float] = time.time,
                 followers: Sequence[SourceRunner[Any]] = (), stall_after: float | None = None,
                 liveness_grace: float | None = None, monotonic: Callable[[], float] = time.monotonic) -> None:
        if not primaries:
            raise ValueError("a program needs a primary source: the one its cycle collects")
        self.primaries = tuple(primaries)
        self.core = core
        self.side = tuple(side)
        self.followers = tuple(followers)
        """Collected right after the primary sources in the same cycle, because they read its
        snapshot (the /proc lookup of the PIDs NVML just reported)."""
        self.sinks = list(sinks)
        self.interval = interval
        self.ready = threading.Event()
        self.stall_after = default_stall_timeout(interval) if stall_after is None else stall_after
        self.liveness_grace = self.stall_after if liveness_grace is None else liveness_grace
        if not (0 < self.stall_after < math.inf and 0 <= self.liveness_grace < math.inf):
            raise ValueError(f"stall_after must be positive and liveness_grace >= 0, both finite; got "
                             f"{self.stall_after!r} and {self.liveness_grace!r}")
        self._wall_clock = wall_clock
        self._monotonic = monotonic
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watchdog: threading.Thread | None = None
        # Sinks get one frame at a time, from the cycle or from the watchdog, and the core runs
        # for one of them at a time (it may keep memos between frames); the watchdog only tries
        # the locks, so a cycle wedged inside a sink or the core cannot wedge it too.
        self._publish_lock = threading.Lock()
        self._core_lock = threading.Lock()
        # When the last cycle finished (or the loop started): None while no loop runs.
        self._finished_at: float | None = None
        # The first cycle may also wait ``startup_wait`` for the side sources: not a stall.
        self._first_allowance = 0.0
        self._stall_lock = threading.Lock()
        self._stall_logged: str | None = None
        """Where the stall logged in this episode was stuck; None outside a logged stall."""
        self.cycles = 0

    def cycle(self, *, collect_side: bool = False) -> Frame:
        """Collect the primary sources (and, if asked, each side source), run the core, publish."""
        if collect_side:
            for runner in self.side:
                runner.collect_once()
        self._collect_primary()
        return self._publish()

    def _collect_primary(self) -> None:
        for runner in (*self.primaries, *self.followers):
            runner.collect_once()

    def _frame(self, down: Mapping[str, float | None] = MappingProxyType({})) -> Frame:
        snapshots, health = self._latest(down)
        return self.core(snapshots, health, self._wall_clock())

    def _publish(self) -> Frame:
        with self._core_lock:
            frame = self._frame()
        with self._publish_lock:
            for sink in self.sinks:
                sink.publish(frame)
            self.cycles += 1
        self.ready.set()
        return frame

    # --- the watchdog ---------------------------------------------------------------------------

    def never_answered(self) -> SourceRunner[Any] | None:
        """The first primary source that has not once succeeded, or None."""
        return next((p for p in self.primaries if not p.answered.is_set()), None)

    def health(self) -> LoopHealth:
        """What /readyz and /healthz answer: cheap (two clock reads), safe from any thread."""
        ready = self.ready.is_set()
        silent = self.never_answered()
        if ready and silent is not None:
            # Frames are out, but without a primary source in any of them there is nothing to serve.
            error = silent.last_error or "no answer yet"
            return LoopHealth(ready=False, live=True, reason=f"{silent.name} has never answered: {error}")
        bound = self._bound()  # read before _finished_at: both change together, bound last
        finished_at = self._finished_at
        if finished_at is None:
            return LoopHealth(ready=ready, live=True)
        stalled = self._monotonic() - finished_at
        if stalled < bound:
            return LoopHealth(ready=ready, live=True)
        return LoopHealth(ready=False, live=stalled < bound + self.liveness_grace,
                          reason=f"stalled: no collection cycle has finished for {stalled:.0f} s")

    def _bound(self) -> float:
        return self.stall_after + self._first_allowance

    def watch(self) -> None:
        """One look at the cycle; the watchdog thread calls this every tick.

        While the cycle is stalled: log it once per episode, and publish a frame in which the
        primary sources (their values are no longer fresh) and the source the cycle is stuck in
        are down, with the other sources' latest snapshots. A core run here is no scrape-path
        cost: it replaces the one the stuck cycle would have made.
        """
        bound = self._bound()
        finished_at, cycles = self._finished_at, self.cycles
        if finished_at is None:
            return
        stalled = self._monotonic() - finished_at
        if stalled < bound:
            return
        stuck = next(((r, t) for r in (*self.primaries, *self.followers)
                      if (t := r.collecting_for()) is not None), None)
        self._log_stall(finished_at, stalled, stuck)
        if not self._core_lock.acquire(blocking=False):
            return  # the cycle is stuck inside the core: only the probes can say so
        try:
            down: dict[str, float | None] = dict.fromkeys((r.name for r in self.primaries), None)
            if stuck is not None:
                down[stuck[0].name] = stuck[1]
            frame = self._frame(down)
        finally:
            self._core_lock.release()
        if not self._publish_lock.acquire(blocking=False):
            return  # the cycle is stuck inside a sink: only the probes can say so
        try:
            if (self._finished_at, self.cycles) == (finished_at, cycles):  # still the same stall
                for sink in self.sinks:
                    sink.publish(frame)
        finally:
            self._publish_lock.release()

    def _log_stall(self, finished_at: float, stalled: float,
                   stuck: tuple[SourceRunner[Any], float] | None) -> None:
        with self._stall_lock:
            if self._stall_logged is not None or self._finished_at != finished_at:
                return  # logged already, or a cycle has just finished
            self._stall_logged = stuck[0].name if stuck else "the core or a sink"
        where = (f"the {stuck[0].name} source has been collecting for {stuck[1]:.0f} s" if stuck
                 else "it is stuck after collecting (in the core or a sink)")
        log.warning("collection cycle stalled: no cycle has finished for %.0f s; %s. Until one does, %s is "
                    "reported down and /readyz fails; /healthz fails %.0f s after the last finished cycle",
                    stalled, where, " and ".join(r.name for r in self.primaries), self._bound() + self.liveness_grace,
                    extra={"source": stuck[0].name if stuck else ""})

    def _cycle_finished(self) -> None:
        """Called by the loop after every cycle, published or failed: the loop is not stuck."""
        now = self._monotonic()
        with self._stall_lock:
            if self._stall_logged is not None and self._finished_at is not None:
                log.info("collection cycles finish again, after a %.0f s stall in %s", now - self._finished_at,
                         self._stall_logged)
            self._stall_logged = None
            self._finished_at = now
            self._first_allowance = 0.0

    def _watch_loop(self) -> None:
        # Ticks of one interval (a tenth of the bound at most) keep the stall frames as fresh as cycles.
        tick = min(self.interval, self.stall_after / 10)
        while not self._stop.wait(tick):
            try:
                self.watch()
            except Exception:  # noqa: BLE001 - the watchdog must outlive whatever it watches
                log.exception("the cycle watchdog failed; trying again next tick")

    @property
    def runners(self) -> tuple[SourceRunner[Any], ...]:
        """Every source's runner: the primaries, their followers, the side sources."""
        return (*self.primaries, *self.followers, *self.side)

    def _latest(self, down: Mapping[str, float | None]) -> tuple[Snapshots, tuple[SourceHealth, ...]]:
        """The latest snapshot and health of every source; those in ``down`` are reported down
        (with the seconds their collection has been running, if it is stuck), without their
        snapshot unless they keep the last good one. Error counts stay: a hang is no failed
        collection yet, and a counter must not go back down when the cycle comes back."""
        snapshots = Snapshots()
        health = []
        for runner in self.runners:
            snapshot, h = runner.latest()
            if runner.name in down:
                snapshot = snapshot if runner.keep_last_good else None
                running = down[runner.name]
                h = SourceHealth(h.source, False, h.duration_seconds if running is None else running,
                                 h.errors_total, h.last_success_timestamp)
            snapshots = runner.placed(snapshots, snapshot)
            health.append(h)
        health.extend(sink.health() for sink in self.sinks if hasattr(sink, "health"))
        return snapshots, tuple(sorted(health, key=lambda h: h.source))

    def start(self, *, startup_wait: float = 10.0) -> None:
        """Run side sources on their threads and the cycle on another; returns at once.

        The first collection of the primary sources starts right away (NVML registers the XID
        event set), but
        the first frame waits up to ``startup_wait`` seconds for every side source's first
        answer, so it already carries attribution — a slow API client import or a kubelet
        that hangs cannot hold back readiness for longer than that.
        """
        for runner in self.side:
            runner.start(self._stop)
        self._finished_at = self._monotonic()  # a first cycle that never ends is a stall too
        self._first_allowance = startup_wait if self.side else 0.0  # it waits for side sources only
        self._thread = threading.Thread(target=self._loop, args=(startup_wait,), name="agent-cycle",
                                        daemon=True)
        self._thread.start()
        self._watchdog = threading.Thread(target=self._watch_loop, name="agent-watchdog", daemon=True)
        self._watchdog.start()

    def _wait_for_side_sources(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for runner in self.side:
            runner.attempted.wait(max(0.0, deadline - time.monotonic()))

    def _loop(self, startup_wait: float) -> None:
        self._collect_primary()  # at once: NVML init and XID event registration, the cluster's lists
        self._wait_for_side_sources(startup_wait)
        deadline = time.monotonic()
        failing = False
        first = True
        while not self._stop.is_set():
            try:
                if first:  # the primaries were just collected above; publish what we have
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
            self._cycle_finished()
            deadline += self.interval
            now = time.monotonic()
            if deadline < now:  # fell behind: skip missed ticks instead of bursting
                deadline = now
            self._stop.wait(deadline - now)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout)
        if self._watchdog:
            self._watchdog.join(timeout)
        for runner in self.side:
            runner.join(timeout)
        for runner in self.runners:
            try:
                runner.source.close()
            except Exception:  # noqa: BLE001 - shutting down anyway
                log.debug("closing %s failed", runner.name, exc_info=True)


def latest_snapshots(runners: Iterable[SourceRunner[Any]]) -> Snapshots:
    """The latest snapshot of each of ``runners``, each in its place."""
    snapshots = Snapshots()
    for runner in runners:
        snapshots = runner.placed(snapshots, runner.latest()[0])
    return snapshots
