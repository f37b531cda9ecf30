"""The cluster mode's shell: from ``ClusterSettings`` to the cluster-wide source, the capacity core and
the node agent's sinks (Prometheus and/or OTLP), with a loop that publishes a frame every interval."""

from __future__ import annotations

import dataclasses
import logging
import platform
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..agent import SourceRunner
from ..config import ConfigError
from ..model import ClusterState, Frame
from .capacity import Capacity

if TYPE_CHECKING:
    from ..sinks.otlp_settings import OtlpSettings

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
    prometheus: bool = True
    """Serve /metrics (and the probes) on ``listen``."""
    otlp: OtlpSettings | None = None
    """Push every frame over OTLP too; None: no push."""


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
        sink_health = tuple(sink.health() for sink in self.sinks if hasattr(sink, "health"))
        frame = self.capacity.frame(state if isinstance(state, ClusterState) else ClusterState(), now,
                                    (health, *sink_health), (("version", __version__),
                                                             ("python_version", platform.python_version())))
        if self.object_clock is not None:  # ages on the objects' clock; the frame's time is the host's
            frame = dataclasses.replace(frame, timestamp=self.wall_clock())
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
    if publish and settings.otlp is not None:
        from ..sinks.otlp import OtlpSink

        # No k8s.node.name: the series are the cluster's, not those of the node this replica runs on
        # (the series that have a node carry it as an attribute). OTEL_RESOURCE_ATTRIBUTES may add
        # k8s.cluster.name.
        otlp = OtlpSink(settings.otlp, node_name="", host_name=socket.gethostname(), version=__version__)
        closers.append(otlp.shutdown)
        runtime.sinks.append(otlp)
    if publish and settings.prometheus:
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
    if runtime.prometheus is not None:
        log.info("cluster mode: serving /metrics on %s (port %d), a frame every %ss", settings.listen,
                 runtime.prometheus.port, settings.interval)
    if settings.otlp is not None:
        log.info("cluster mode: pushing OTLP (%s) to %s every %ss, a frame every %ss", settings.otlp.protocol,
                 settings.otlp.endpoint or "the OTEL_EXPORTER_OTLP_* endpoint", settings.otlp.interval,
                 settings.interval)
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
