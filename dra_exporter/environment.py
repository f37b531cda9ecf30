"""Where a program's sources read from: the real node or cluster, or a simulated one.

The one place that decides between real and simulated systems, for every program: ``serve`` and
``snapshot`` (``node``), ``doctor`` (``node`` too, on a frozen clock), the cluster mode (``cluster``).
What it decides ends up in a ``SourceContext`` (what the registered sources' factories are given)
and a few facts the runtime needs besides (the simulated node, the exporter's own pod, the clock
the objects are stamped on).

The rules, the same for each program:

* without ``--simulate``: NVML is the ``pynvml`` binding, the kubelet socket the one named or the
  default, the API server in-cluster, ``$KUBECONFIG`` or ``~/.kube/config``;
* with ``--simulate``: everything is simulated, except what an option names explicitly —
  ``--kubeconfig`` replaces the simulated API server, ``--kubelet-socket`` the simulated kubelet
  (NVML always stays simulated);
* a kubeconfig the operator named must work: a broken one is a start-up error (``ConfigError``),
  not a source outage;
* on a simulated node, timestamps, backoffs and rate integrals follow the simulated clock.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .config import DEFAULT_KUBELET_SOCKET, ClusterSettings, ConfigError, Settings
from .sources.cdi import DEFAULT_CDI_ROOT
from .sources.procs import DEFAULT_PROCFS
from .sources.registry import SourceContext

if TYPE_CHECKING:
    from dra_exporter_sim import SimulatedNode

Clock = Callable[[], float]
"""Seconds, on some clock (``time.time``, a simulated clock)."""


@dataclass
class Environment:
    """What a program's sources are built against; ``close`` stops whatever was simulated."""

    context: SourceContext
    sim: SimulatedNode | None = None
    """The simulated node (``serve --simulate``), None elsewhere."""
    simulated_apiserver: bool = False
    """Whether the API server the sources talk to is a simulated one (it allows everything)."""
    self_pod: tuple[str, str] | None = None
    """(namespace, name) of the exporter's own pod: its claims are monitoring claims."""
    object_clock: Clock | None = None
    """The clock the objects' own times (creation, allocation) are on, for ages; None: the wall
    clock. A simulated cluster stamps its objects on the simulator's fixed epoch."""
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for close in reversed(self.closers):
            close()
        self.closers.clear()


def node(settings: Settings, *, sim_time: float | None = None) -> Environment:
    """The node agent's environment. ``sim_time`` freezes the simulated clock there."""
    env = Environment(SourceContext(node_name="", nvml=None, kubelet_socket=""))
    try:
        _node(settings, sim_time, env)
    except BaseException:
        env.close()  # no simulated kubelet socket is left behind
        raise
    return env


def _node(settings: Settings, sim_time: float | None, env: Environment) -> None:
    wall_clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    kubelet_socket = settings.kubelet_socket or DEFAULT_KUBELET_SOCKET
    procfs = settings.procfs or DEFAULT_PROCFS
    cdi_root = settings.cdi_root or DEFAULT_CDI_ROOT
    node_name = settings.node_name or socket.gethostname()
    self_pod = settings.self_pod
    nvml: Any
    sim = None
    if settings.simulate is not None:
        from dra_exporter_sim import ScenarioError, SimClock, SimulatedNode, load_scenario

        # --node-name picks the node of a cluster dump; an ordinary scenario names its own.
        scenario = load_scenario(settings.simulate, settings.node_name or None)
        if settings.node_name and settings.node_name != scenario.node_name:
            # A one-node scenario names its node itself: a --node-name that differs is a typo, not a choice.
            raise ScenarioError(f"--node-name {settings.node_name!r}: scenario {settings.simulate} simulates one "
                                f"node, {scenario.node_name!r}; leave --node-name out or give that name")
        clock = SimClock(sim_time or 0.0, frozen=sim_time is not None)
        sim = SimulatedNode(scenario, clock, kubelet=settings.kubelet_socket is None,
                            apiserver=settings.kubeapi and not settings.kubeconfig).start()
        env.closers.append(sim.close)
        env.sim = sim
        wall_clock, monotonic = sim.wall_clock, clock.now
        nvml = sim.nvml
        if sim.kubelet is not None:
            kubelet_socket = sim.kubelet.socket_path
        if not settings.procfs and sim.procfs is not None:
            procfs = sim.procfs.root
        if not settings.cdi_root and sim.cdi is not None:
            cdi_root = sim.cdi.root
        # The node is what the series describe; the scenario only says where a simulated one came from.
        node_name = str(scenario.node_name)
        if self_pod is None and scenario.exporter_pod is not None:
            self_pod = (scenario.exporter_pod.namespace, scenario.exporter_pod.name)
    else:
        import pynvml

        nvml = pynvml
    access = _kube_access(settings.kubeconfig) if settings.kubeapi else {}
    if settings.kubeapi and not settings.kubeconfig and sim is not None and sim.apiserver is not None:
        access = {"kubeconfig": sim.apiserver.kubeconfig_path}
        env.simulated_apiserver = True
    env.self_pod = self_pod
    env.context = SourceContext(node_name=node_name, nvml=nvml, kubelet_socket=kubelet_socket,
                                claim_refresh=settings.claim_refresh, max_objects=settings.max_objects,
                                procfs=procfs, cdi_root=cdi_root,
                                wall_clock=wall_clock, monotonic=monotonic,
                                simulated_apiserver=env.simulated_apiserver, pod_labels=settings.pod_labels.keys,
                                **access)


def cluster(settings: ClusterSettings) -> Environment:
    """The cluster mode's environment: the real API server, or a simulated one serving a cluster."""
    env = Environment(SourceContext(node_name="", nvml=None, kubelet_socket=""))
    try:
        _cluster(settings, env)
    except BaseException:
        env.close()
        raise
    return env


def _cluster(settings: ClusterSettings, env: Environment) -> None:
    access = _kube_access(settings.kubeconfig, settings.context)
    if settings.simulate is not None and not settings.kubeconfig and not settings.context:
        from dra_exporter_sim import FIXED_EPOCH, SimClock, SimulatedApiServer, load_cluster

        clock = SimClock(0.0)
        apiserver = SimulatedApiServer(load_cluster(settings.simulate), clock, taint_rule_versions=None).start()
        env.closers.append(apiserver.stop)
        access = {"kubeconfig": apiserver.kubeconfig_path}
        env.simulated_apiserver = True

        def simulated_object_time() -> float:  # what the simulated objects are stamped on
            return FIXED_EPOCH + clock.now()

        env.object_clock = simulated_object_time
    env.context = SourceContext(node_name="", nvml=None, kubelet_socket="", max_objects=settings.max_objects, **access)


def _kube_access(kubeconfig: str | None, context: str | None = None) -> dict[str, Any]:
    """``SourceContext`` fields for the API server: a named kubeconfig (or context), loaded and checked now."""
    if not kubeconfig and not context:
        return {}
    from .sources import SourceError
    from .sources.kubeapi import load_client

    try:
        api_client = load_client(kubeconfig, context)
    except SourceError as exc:
        flag = "--kubeconfig" if kubeconfig else "--context"
        raise ConfigError(f"{flag}: {exc}".replace("kubeapi: ", "")) from None

    def given_client() -> Any:
        return api_client

    return {"kubeconfig": kubeconfig, "kube_client": given_client}
