"""The one runtime every long-running program is an instance of: registered sources → the
program's pure core → sinks, with the agent's loop, watchdog and probes.

A ``Program`` says what differs: its source registry, its environment (``environment``: real or
simulated), its core, how it names itself. Everything else is here, once, for every program:
building the sources, the sinks (Prometheus with the probes answered from the loop's health, and
OTLP), the loop with its watchdog, signal handling and shutdown, ``snapshot`` (a one-shot run of
the same pipeline). The node agent (``NODE``: NVML, the kubelet, the API server and /proc joined
by ``join``) is defined here; the cluster mode's program is ``cluster.runtime.CLUSTER``.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import platform
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from . import __version__, environment
from . import catalog as cat
from .agent import Agent, Core, Sink, SourceRunner, latest_snapshots
from .config import Settings, ShellSettings
from .environment import Environment
from .join import JoinInput, join
from .model import Frame, SourceHealth
from .orphans import OrphanMemory
from .sources import Snapshots
from .sources.registry import NODE as NODE_SOURCES
from .sources.registry import Registry, Role

if TYPE_CHECKING:
    from dra_exporter_sim import SimulatedNode

    from .sinks.prometheus import PrometheusSink

log = logging.getLogger(__name__)

S = TypeVar("S", bound=ShellSettings)

#: Simulated seconds at which `snapshot --simulate` looks at the scenario: late enough
#: that the demo's pods run and its XID has fired, fixed so the output is reproducible.
SNAPSHOT_SIM_TIME = 60.0
#: The build labels of ``dra_exporter_build_info``.
BUILD_LABELS = (("version", __version__), ("python_version", platform.python_version()))


class Program(Generic[S]):
    """What makes a program of the runtime. Subclasses say how they differ from the defaults."""

    name = ""
    """How the log lines name the program."""
    registry: Registry
    snapshot_cycles = 1
    """Cycles ``snapshot`` runs (the node agent: two, so that rates have two samples)."""

    def environment(self, settings: S, sim_time: float | None) -> Environment:
        raise NotImplementedError

    def core(self, settings: S, env: Environment) -> Core:
        raise NotImplementedError

    def enabled(self, settings: S) -> frozenset[str]:
        """The names of the sources to build."""
        return self.registry.default_enabled()

    def otlp_node_name(self, env: Environment) -> str:
        """``k8s.node.name`` of the OTLP resource ("" for none)."""
        return env.context.node_name

    def scrape_sink(self, settings: S, env: Environment, sink: Sink) -> Sink:
        """What the Prometheus endpoint is published through (the node agent: its ``--naming``)."""
        return sink

    def renamed(self, settings: S, env: Environment, frame: Frame) -> Frame:
        """``frame`` as the Prometheus endpoint shows it."""
        return frame

    def describe(self, settings: S, env: Environment) -> str:
        """The start-up line saying what the program collects."""
        return f"{self.name}: a frame every {settings.interval:g}s"


class NodeProgram(Program[Settings]):
    """The node agent (``serve``, ``snapshot``): NVML, the kubelet, the API server and /proc, joined."""

    name = "serve"
    registry = NODE_SOURCES
    snapshot_cycles = 2

    def environment(self, settings: Settings, sim_time: float | None) -> Environment:
        return environment.node(settings, sim_time=sim_time)

    def core(self, settings: Settings, env: Environment) -> Core:
        return JoinCore(env.self_pod, settings.pod_labels)

    def enabled(self, settings: Settings) -> frozenset[str]:
        return settings.sources

    def scrape_sink(self, settings: Settings, env: Environment, sink: Sink) -> Sink:
        # Only the scrape endpoint is renamed: OTLP keeps the semantic names.
        return sink if settings.naming == "native" else RenamingSink(sink, settings.naming, env.context.node_name)

    def renamed(self, settings: Settings, env: Environment, frame: Frame) -> Frame:
        if settings.naming == "native":
            return frame
        from .naming import apply

        return apply(frame, settings.naming, hostname=env.context.node_name)

    def describe(self, settings: Settings, env: Environment) -> str:
        # The node is what the series describe; the scenario only says where a simulated one came from.
        simulated = f" (simulated from scenario {settings.simulate})" if settings.simulate is not None else ""
        return f"collecting every {settings.interval:g}s on node '{env.context.node_name}'{simulated}"


@dataclass(frozen=True, slots=True)
class JoinCore:
    """The node agent's core: ``join`` of the latest snapshots. It keeps, across frames, when each
    orphan was first seen (the agent runs the core for one frame at a time)."""

    self_pod: tuple[str, str] | None = None
    pod_labels: cat.PodLabels = cat.PodLabels()
    orphan_memory: OrphanMemory = field(default_factory=OrphanMemory)

    def __call__(self, snapshots: Snapshots, health: tuple[SourceHealth, ...], timestamp: float) -> Frame:
        return join(JoinInput(devices=snapshots.devices, pods=snapshots.pods, cluster=snapshots.cluster,
                              owners=snapshots.owners, cdi=snapshots.cdi, orphan_memory=self.orphan_memory,
                              health=health, self_pod=self.self_pod,
                              pod_labels=self.pod_labels,
                              version=__version__, python_version=platform.python_version(), timestamp=timestamp))


NODE: NodeProgram = NodeProgram()


@dataclass
class Runtime:
    """A built program: its environment, its loop (``agent``) and, when publishing, its sinks."""

    agent: Agent
    env: Environment
    prometheus: PrometheusSink | None = None
    closers: list[Callable[[], None]] = field(default_factory=list)

    @property
    def sim(self) -> SimulatedNode | None:
        return self.env.sim

    def close(self) -> None:
        self.agent.stop()
        for close in reversed(self.closers):
            close()
        self.env.close()


def build(settings: S, program: Program[S] | None = None, *, sim_time: float | None = None,
          publish: bool = False) -> Runtime:
    """Wire the environment, the sources, the loop and (with ``publish``) the sinks of ``program``
    (the node agent by default). ``sim_time`` freezes a simulated node's clock there.

    If anything fails half-way, what was already started is closed again before the error
    propagates (no simulated kubelet socket is left behind).
    """
    prog: Program[Any] = NODE if program is None else program
    env = prog.environment(settings, sim_time)
    closers: list[Callable[[], None]] = []
    try:
        return _build(settings, prog, env, publish, closers)
    except BaseException:
        for close in reversed(closers):
            close()
        env.close()
        raise


def _build(settings: S, program: Program[S], env: Environment, publish: bool,
           closers: list[Callable[[], None]]) -> Runtime:
    runners = _source_runners(settings, program, env)
    sinks: list[Sink] = []
    prometheus = None
    if publish and settings.otlp is not None:
        from .sinks.otlp import OtlpSink

        otlp = OtlpSink(settings.otlp, node_name=program.otlp_node_name(env), host_name=socket.gethostname(),
                        version=__version__)
        closers.append(otlp.shutdown)
        sinks.append(otlp)
    if publish and settings.prometheus:
        from .sinks.prometheus import PrometheusSink

        prometheus = PrometheusSink(settings.listen, web_config=settings.web_config)
        prometheus.start()
        closers.append(prometheus.stop)
        sinks.append(program.scrape_sink(settings, env, prometheus))
    agent = Agent(runners[Role.PRIMARY], runners[Role.SIDE], sinks, core=program.core(settings, env),
                  interval=settings.interval, wall_clock=env.context.wall_clock, followers=runners[Role.FOLLOWER],
                  stall_after=settings.stall_timeout)
    if prometheus is not None:
        prometheus.answer_probes_from(agent.health)
    return Runtime(agent, env, prometheus, closers)


class RenamingSink:
    """Publishes each frame to ``inner`` under a ``--naming`` other than native (``dra_exporter.naming``)."""

    def __init__(self, inner: Sink, naming: str, hostname: str) -> None:
        from .naming import RateMemory, XidMemory

        self.inner, self.naming, self.hostname = inner, naming, hostname
        self._xid = XidMemory()  # which XID code is the latest, across frames
        self._rates = RateMemory()  # the rate fields' previous totals (NVLink throughput)

    def publish(self, frame: Frame) -> None:
        from .naming import apply

        self.inner.publish(apply(frame, self.naming, hostname=self.hostname, xid=self._xid,
                                      rates=self._rates))


def _source_runners(settings: S, program: Program[S], env: Environment) -> dict[Role, list[SourceRunner[Any]]]:
    """A runner for every enabled source of ``program`` (its primaries always), in registry order,
    by role. The agent closes them when it stops."""
    built: list[SourceRunner[Any]] = []
    ctx = replace(env.context, latest=lambda: latest_snapshots(built))
    enabled = program.enabled(settings)
    by_role: dict[Role, list[SourceRunner[Any]]] = {role: [] for role in Role}
    for spec in program.registry.sources():
        if spec.switchable and spec.name not in enabled:
            continue
        runner = SourceRunner(spec.factory(ctx), keep_last_good=spec.keep_last_good, place=spec.place,
                              wall_clock=ctx.wall_clock, interval=settings.interval)
        built.append(runner)
        by_role[spec.role].append(runner)
    return by_role


class NothingUsable(RuntimeError):
    """The run finished, but the primary source never answered and no device is known: nothing to show."""


def _names_a_device(frame: Frame) -> bool:
    return any((family := frame.family(spec.name)) is not None and bool(family.samples)
               for spec in (cat.GPU_INFO, cat.DEVICE_INFO))


def snapshot(settings: S, program: Program[S] | None = None, *, renamed: bool = False) -> Frame:
    """A one-shot run of the program's pipeline: its cycles (the node agent: two, so that rates —
    GPM, process utilisation — have two samples), the last frame returned.

    ``renamed``: as the Prometheus endpoint shows it (the node agent's ``--naming``)."""
    prog: Program[Any] = NODE if program is None else program
    with _one_shot(settings, prog) as (runtime, frame):
        return prog.renamed(settings, runtime.env, frame) if renamed else frame


def snapshot_and_sources(settings: S, program: Program[S]) -> tuple[Frame, Snapshots]:
    """``snapshot``'s frame and the sources' snapshots it was made of (what they could not read)."""
    with _one_shot(settings, program) as (runtime, frame):
        return frame, latest_snapshots(runtime.agent.runners)


def snapshots(settings: S, program: Program[S]) -> Snapshots:
    """A one-shot run of the program's sources, as ``snapshot`` runs them: their latest snapshots
    (``explain`` asks its own questions of the cluster's objects)."""
    with _one_shot(settings, program) as (runtime, _):
        return latest_snapshots(runtime.agent.runners)


@contextlib.contextmanager
def _one_shot(settings: S, prog: Program[S]) -> Iterator[tuple[Runtime, Frame]]:
    runtime = build(settings, prog, sim_time=SNAPSHOT_SIM_TIME if settings.simulate is not None else None)
    try:
        frame = runtime.agent.cycle(collect_side=True)
        for _ in range(prog.snapshot_cycles - 1):
            if runtime.sim is not None:
                runtime.sim.clock.advance(settings.interval)
            else:
                time.sleep(settings.interval)
            frame = runtime.agent.cycle(collect_side=True)
        # Nothing usable: a primary source never answered and the frame names no device at all. A node
        # without NVIDIA's driver whose API server answered (another driver's devices) is worth printing.
        silent = runtime.agent.never_answered()
        if silent is not None and not _names_a_device(frame):
            raise NothingUsable(silent.last_error or f"{silent.name} did not answer")
        yield runtime, frame
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


def serve(settings: S, program: Program[S] | None = None, *, stop: threading.Event | None = None) -> None:
    """Serve ``program`` (the node agent by default) until SIGTERM/SIGINT (or ``stop`` is set)."""
    prog: Program[Any] = NODE if program is None else program
    stop = stop or threading.Event()
    runtime = build(settings, prog, publish=True)
    if threading.current_thread() is threading.main_thread():
        def stop_from_another_thread(*_: Any) -> None:
            # The handler runs on the main thread, which may be inside stop.wait() holding the
            # Event's lock: setting it here would deadlock until the demo's kill deadline.
            threading.Thread(target=stop.set, name="stop-signal", daemon=True).start()

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, stop_from_another_thread)
    if runtime.prometheus is not None:
        log.info("%s: serving /metrics on %s (port %d)", prog.name, settings.listen, runtime.prometheus.port)
    if settings.otlp is not None:
        log.info("%s: pushing OTLP (%s) to %s every %ss", prog.name, settings.otlp.protocol,
                 settings.otlp.endpoint or "the OTEL_EXPORTER_OTLP_* endpoint", settings.otlp.interval)
    log.info("%s", prog.describe(settings, runtime.env))
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
