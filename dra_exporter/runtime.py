"""The imperative shell: from ``Settings`` to running sources, agent and sinks."""

from __future__ import annotations

import dataclasses
import gc
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import __version__
from .agent import Agent, Sink, SourceRunner, latest_snapshots
from .config import DEFAULT_KUBELET_SOCKET, Settings
from .model import Frame
from .sources import registry
from .sources.procs import DEFAULT_PROCFS
from .sources.registry import Role, SourceContext

if TYPE_CHECKING:
    from dra_exporter_sim import SimulatedNode

    from .sinks.prometheus import PrometheusSink

log = logging.getLogger(__name__)

#: Simulated seconds at which `snapshot --simulate` looks at the scenario: late enough
#: that the demo's pods run and its XID has fired, fixed so the output is reproducible.
SNAPSHOT_SIM_TIME = 60.0


@dataclass
class Runtime:
    agent: Agent
    sim: SimulatedNode | None = None
    prometheus: PrometheusSink | None = None
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        self.agent.stop()
        for close in reversed(self.closers):
            close()


def build(settings: Settings, *, sim_time: float | None = None, publish: bool = False) -> Runtime:
    """Wire sources, agent and (with ``publish``) the sinks. ``sim_time`` freezes the simulated clock there.

    If anything fails half-way, what was already started is closed again before the error
    propagates (no simulated kubelet socket is left behind).
    """
    closers: list[Callable[[], None]] = []
    try:
        return _build(settings, sim_time, publish, closers)
    except BaseException:
        for close in reversed(closers):
            close()
        raise


def _build(settings: Settings, sim_time: float | None, publish: bool,
           closers: list[Callable[[], None]]) -> Runtime:
    sim: SimulatedNode | None = None
    wall_clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    if settings.simulate is not None:
        from dra_exporter_sim import SimClock, SimulatedNode, load_scenario

        # --node-name picks the node of a cluster dump; an ordinary scenario names its own.
        scenario = load_scenario(settings.simulate, settings.node_name or None)
        clock = SimClock(sim_time or 0.0, frozen=sim_time is not None)
        # An explicit --kubelet-socket replaces the simulated kubelet, an explicit --kubeconfig the
        # simulated API server (NVML stays simulated).
        sim = SimulatedNode(scenario, clock, kubelet=settings.kubelet_socket is None,
                            apiserver=settings.kubeapi and not settings.kubeconfig).start()
        closers.append(sim.close)
        # On a simulated node, timestamps, backoffs and rate integrals follow simulated time.
        wall_clock, monotonic = sim.wall_clock, clock.now
        nvml: Any = sim.nvml
        kubelet_socket = sim.kubelet.socket_path if sim.kubelet else (settings.kubelet_socket or
                                                                      DEFAULT_KUBELET_SOCKET)
    else:
        import pynvml

        nvml = pynvml
        kubelet_socket = settings.kubelet_socket or DEFAULT_KUBELET_SOCKET

    runners = _source_runners(settings, sim, SourceContext(
        node_name=node_name(settings, sim), nvml=nvml, kubelet_socket=kubelet_socket,
        kubeconfig=settings.kubeconfig, claim_refresh=settings.claim_refresh,
        procfs=settings.procfs or (sim.procfs.root if sim is not None and sim.procfs else DEFAULT_PROCFS),
        wall_clock=wall_clock, monotonic=monotonic))
    sinks: list[Sink] = []
    prometheus = None
    if publish and settings.otlp is not None:
        from .sinks.otlp import OtlpSink

        otlp = OtlpSink(settings.otlp, node_name=node_name(settings, sim), host_name=socket.gethostname(),
                        version=__version__)
        closers.append(otlp.shutdown)
        sinks.append(otlp)
    if publish and settings.prometheus:
        from .sinks.prometheus import PrometheusSink

        prometheus = PrometheusSink(settings.listen, web_config=settings.web_config)
        prometheus.start()
        closers.append(prometheus.stop)
        # Only the scrape endpoint is renamed: OTLP keeps the semantic names.
        sinks.append(prometheus if settings.naming == "native"
                     else RenamingSink(prometheus, settings.naming, node_name(settings, sim)))
    (primary,) = runners[Role.PRIMARY]
    agent = Agent(primary, runners[Role.SIDE], sinks, interval=settings.interval,
                  self_pod=_self_pod(settings, sim), wall_clock=wall_clock, followers=runners[Role.FOLLOWER],
                  stall_after=settings.stall_timeout)
    if prometheus is not None:
        prometheus.answer_probes_from(agent.health)
    return Runtime(agent, sim, prometheus, closers)


class RenamingSink:
    """Publishes each frame to ``inner`` under a ``--naming`` other than native (``dra_exporter.naming``)."""

    def __init__(self, inner: Sink, naming: str, hostname: str) -> None:
        from .naming import XidMemory

        self.inner, self.naming, self.hostname = inner, naming, hostname
        self._xid = XidMemory()  # which XID code is the latest, across frames

    def publish(self, frame: Frame) -> None:
        from .naming import apply

        self.inner.publish(apply(frame, self.naming, hostname=self.hostname, xid=self._xid))


def node_name(settings: Settings, sim: SimulatedNode | None) -> str:
    """The simulated scenario's node (which --node-name chose for a dump), else --node-name
    (or $NODE_NAME), else the hostname."""
    if sim is not None:
        return str(sim.scenario.node_name)
    return settings.node_name or socket.gethostname()


def _source_runners(settings: Settings, sim: SimulatedNode | None,
                    ctx: SourceContext) -> dict[Role, list[SourceRunner[Any]]]:
    """A runner for every enabled source (``settings.sources``; the primary always), in registry
    order, by role. The agent closes them when it stops."""
    built: list[SourceRunner[Any]] = []
    ctx = dataclasses.replace(ctx, latest=lambda: latest_snapshots(built))
    if settings.kubeapi:
        ctx = dataclasses.replace(ctx, **_kube_access(settings, sim))
    by_role: dict[Role, list[SourceRunner[Any]]] = {role: [] for role in Role}
    for spec in registry.sources():
        if spec.switchable and spec.name not in settings.sources:
            continue
        runner = SourceRunner(spec.factory(ctx), keep_last_good=spec.keep_last_good, place=spec.place,
                              wall_clock=ctx.wall_clock, interval=settings.interval)
        built.append(runner)
        by_role[spec.role].append(runner)
    return by_role


def _kube_access(settings: Settings, sim: SimulatedNode | None) -> dict[str, Any]:
    """How the API server source reaches the API server: ``SourceContext`` fields.

    A kubeconfig the operator named must work: a broken one is a start-up error, not a source
    outage. Without it: the simulated API server under --simulate, else in-cluster or $KUBECONFIG."""
    from .config import ConfigError
    from .sources import SourceError
    from .sources.kubeapi import load_client

    if settings.kubeconfig:
        try:
            api_client = load_client(settings.kubeconfig)
        except SourceError as exc:
            raise ConfigError(f"--kubeconfig: {exc}".replace("kubeapi: ", "")) from None
        return {"kubeconfig": settings.kubeconfig, "kube_client": lambda: api_client}
    if sim is not None and sim.apiserver is not None:
        return {"kubeconfig": sim.apiserver.kubeconfig_path}
    return {}


def _self_pod(settings: Settings, sim: SimulatedNode | None) -> tuple[str, str] | None:
    if settings.self_pod:
        return settings.self_pod
    if sim is not None and sim.scenario.exporter_pod:
        pod = sim.scenario.exporter_pod
        return (pod.namespace, pod.name)
    return None


class NothingUsable(RuntimeError):
    """The run finished, but the primary source never answered: there is nothing to show."""


def snapshot(settings: Settings, *, renamed: bool = False) -> Frame:
    """One collection cycle, taken twice so that rates (GPM, process utilisation) have two samples.

    ``renamed``: under ``settings.naming`` (as /metrics shows it) instead of the native names."""
    runtime = build(settings, sim_time=SNAPSHOT_SIM_TIME if settings.simulate is not None else None)
    try:
        runtime.agent.cycle(collect_side=True)
        if runtime.sim is not None:
            runtime.sim.clock.advance(settings.interval)
        else:
            time.sleep(settings.interval)
        frame = runtime.agent.cycle(collect_side=True)
        primary = runtime.agent.primary
        if not primary.answered.is_set():
            raise NothingUsable(primary.last_error or f"{primary.name} did not answer")
        if renamed and settings.naming != "native":
            from .naming import apply

            frame = apply(frame, settings.naming, hostname=node_name(settings, runtime.sim))
        return frame
    finally:
        runtime.close()


#: How long ``serve`` waits for the first frame before ``settle_gc`` (the agent waits up to 10 s
#: for its side sources before the first frame).
STARTUP_SETTLE_S = 15.0
#: Allocations (net, of container objects) between young collections: CPython's default is 700,
#: which a cycle at ``scale`` crosses ~9 times.
GC_YOUNG_THRESHOLD = 5_000


def settle_gc() -> None:
    """Hide what start-up built from the cyclic garbage collector, and collect the young
    generation less often.

    After start-up ~80,000 objects are tracked at ``scale`` (modules, the API and gRPC clients,
    under ``--simulate`` the simulated node), and every full collection walked them all while
    holding the GIL: pauses of up to 70 ms every ~12 cycles, which every scrape arriving
    meanwhile waited out. ``gc.freeze`` moves them to a generation no collection visits (they
    live as long as the process anyway): no full collection in 300 cycles, the longest (young)
    pause 4-11 ms, GC time per cycle ~30x lower (``python3 -m benchmarks.run --only gc``).
    Objects made afterwards are collected as usual.
    """
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


def serve(settings: Settings, *, stop: threading.Event | None = None) -> None:
    """Serve until SIGTERM/SIGINT (or ``stop`` is set)."""
    stop = stop or threading.Event()
    runtime = build(settings, publish=True)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    if runtime.prometheus is not None:
        log.info("serving /metrics on %s (port %d)", settings.listen, runtime.prometheus.port)
    if settings.otlp is not None:
        log.info("pushing OTLP (%s) to %s every %ss", settings.otlp.protocol,
                 settings.otlp.endpoint or "the OTEL_EXPORTER_OTLP_* endpoint", settings.otlp.interval)
    # The node is what the series describe; the scenario only says where a simulated one came from.
    log.info("collecting every %ss on node '%s'%s", settings.interval, node_name(settings, runtime.sim),
             f" (simulated from scenario {settings.simulate})" if settings.simulate is not None else "")
    try:
        runtime.agent.start()
        # Settle once start-up is over (the first frame is out, clients exist); if the first
        # frame takes longer than this, settle anyway: what is tracked by then is start-up's.
        runtime.agent.ready.wait(timeout=STARTUP_SETTLE_S)
        settle_gc()
        stop.wait()
    finally:
        log.info("shutting down")
        runtime.close()
