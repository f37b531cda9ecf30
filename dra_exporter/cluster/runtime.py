"""The cluster mode's shell: from ``ClusterSettings`` to the cluster-wide source, the capacity core and
the Prometheus sink (the node agent's), with a loop that publishes a frame every interval."""

from __future__ import annotations

import logging
import platform
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import __version__
from ..agent import SourceRunner
from ..config import ConfigError
from ..model import ClusterState, Frame
from .capacity import Capacity

log = logging.getLogger(__name__)

DEFAULT_CLUSTER_LISTEN = "0.0.0.0:9402"  # beside the node agent's 9401
DEFAULT_CLUSTER_INTERVAL = 15.0


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    listen: str = DEFAULT_CLUSTER_LISTEN
    interval: float = DEFAULT_CLUSTER_INTERVAL
    """Seconds between frames; the objects themselves arrive by watch, whenever they change."""
    kubeconfig: str | None = None
    simulate: str | None = None
    """``cluster`` (the built-in cluster) or a cluster dump file; None: the real API server."""
    web_config: Any = None


@dataclass
class ClusterRuntime:
    runner: SourceRunner
    capacity: Capacity
    wall_clock: Callable[[], float]
    sinks: list[Any] = field(default_factory=list)
    closers: list[Callable[[], None]] = field(default_factory=list)
    apiserver: Any = None
    prometheus: Any = None
    ready: threading.Event = field(default_factory=threading.Event)
    object_clock: Callable[[], float] | None = None
    """The clock the objects' own times (creation, allocation) are on, for ages; None: ``wall_clock``.
    A simulated cluster stamps its objects on the simulator's fixed epoch, while the exported
    timestamps follow the host's clock."""

    def cycle(self) -> Frame:
        """Collect (cheap: the watches keep the state), build the frame, publish it."""
        self.runner.collect_once()
        state, health = self.runner.latest()
        now = (self.object_clock or self.wall_clock)()
        frame = self.capacity.frame(state if isinstance(state, ClusterState) else ClusterState(), now,
                                    (health,), (("version", __version__),
                                                ("python_version", platform.python_version())))
        for sink in self.sinks:
            sink.publish(frame)
        self.ready.set()
        return frame

    def close(self) -> None:
        for close in reversed(self.closers):
            close()


def build(settings: ClusterSettings, *, publish: bool = False) -> ClusterRuntime:
    closers: list[Callable[[], None]] = []
    try:
        return _build(settings, publish, closers)
    except BaseException:
        for close in reversed(closers):
            close()
        raise


def _build(settings: ClusterSettings, publish: bool, closers: list[Callable[[], None]]) -> ClusterRuntime:
    from ..sources import SourceError
    from ..sources.kubeapi import load_client
    from ..sources.kubeapi_cluster import ClusterSource

    wall_clock: Callable[[], float] = time.time
    object_clock: Callable[[], float] | None = None
    apiserver = None
    client_factory = None
    kubeconfig = settings.kubeconfig
    if settings.simulate is not None and not kubeconfig:
        from dra_exporter_sim import FIXED_EPOCH, SimClock, SimulatedApiServer, load_cluster

        clock = SimClock(0.0)
        apiserver = SimulatedApiServer(load_cluster(settings.simulate), clock, taint_rule_versions=("v1",)).start()
        closers.append(apiserver.stop)
        kubeconfig = apiserver.kubeconfig_path

        def simulated_object_time() -> float:  # what the simulated objects are stamped on
            return FIXED_EPOCH + clock.now()

        object_clock = simulated_object_time
    elif kubeconfig:
        try:
            api_client = load_client(kubeconfig)
        except SourceError as exc:
            raise ConfigError(f"--kubeconfig: {exc}".replace("kubeapi: ", "")) from None

        def given_client() -> Any:
            return api_client

        client_factory = given_client
    source = ClusterSource(kubeconfig=kubeconfig, client_factory=client_factory)
    closers.append(source.close)
    runner = SourceRunner(source, keep_last_good=True, wall_clock=wall_clock, interval=settings.interval)
    runtime = ClusterRuntime(runner, Capacity(), wall_clock, closers=closers, apiserver=apiserver,
                             object_clock=object_clock)
    if publish:
        from ..sinks.prometheus import PrometheusSink

        prometheus = PrometheusSink(settings.listen, web_config=settings.web_config)
        prometheus.start()
        closers.append(prometheus.stop)
        runtime.sinks.append(prometheus)
        runtime.prometheus = prometheus
    return runtime


def snapshot(settings: ClusterSettings) -> Frame:
    runtime = build(settings)
    try:
        return runtime.cycle()
    finally:
        runtime.close()


def serve(settings: ClusterSettings, *, stop: threading.Event | None = None) -> None:
    """Serve until SIGTERM/SIGINT (or ``stop``)."""
    from ..runtime import settle_gc

    stop = stop or threading.Event()
    runtime = build(settings, publish=True)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    log.info("cluster mode: serving /metrics on %s (port %d), a frame every %ss", settings.listen,
             runtime.prometheus.port, settings.interval)
    try:
        first = True
        while not stop.is_set():
            started = time.monotonic()
            try:
                runtime.cycle()
            except Exception:  # keep serving the last frame
                log.exception("cluster cycle failed; serving the last good frame")
            if first:
                settle_gc()  # what the first lists built lives as long as the process
                first = False
            stop.wait(max(0.0, settings.interval - (time.monotonic() - started)))
    finally:
        log.info("shutting down")
        runtime.close()
