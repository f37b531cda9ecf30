"""The registry of sources: each source once, with its name, role, default and factory.

Modelled on node_exporter's collector registry: a source is registered once, with its name,
whether it is on by default and a factory, and the command line derives its switch from the
registry (``--source-<name>/--no-source-<name>``, plus the older spellings in ``aliases``,
such as ``--no-kubeapi``). ``runtime`` builds what is enabled, in registry order, and the agent
puts each snapshot where ``place`` says in the typed ``Snapshots`` the join reads. A new source
is one ``register`` call here and its module; nothing else picks sources by name.

Roles: a ``PRIMARY`` source is collected by the cycle itself and is always on: the device
sources (``device_source``: NVML today, any other the same way), each of whose snapshots the
join reads with its vendor; a ``FOLLOWER`` is collected right after them in the same cycle,
because it reads their snapshots (/proc, for the PIDs the device sources just reported); a
``SIDE`` source runs on its own thread and cadence, so a hanging kubelet or API server never
delays device data.

Factories import their source module when called: the API server client alone costs ~29 MB
of RSS, which ``--no-kubeapi`` must not pay.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from ..model import (
    CdiSnapshot,
    ClusterSnapshot,
    ClusterState,
    DeviceSnapshot,
    PodResourcesSnapshot,
    ProcessOwnersSnapshot,
)
from . import Snapshots, Source

T = TypeVar("T")


class Role(enum.Enum):
    PRIMARY = "primary"
    FOLLOWER = "follower"
    SIDE = "side"


@dataclass(frozen=True, slots=True)
class SourceContext:
    """What the factories need, resolved by ``runtime`` from the settings (and a simulated node)."""

    node_name: str
    nvml: Any
    """The NVML binding: the ``pynvml`` module, or the simulated node's stand-in."""
    kubelet_socket: str
    kubeconfig: str | None = None
    """Kubeconfig of the API server; None: in-cluster, else $KUBECONFIG or ~/.kube/config."""
    kube_client: Callable[[], Any] | None = None
    """Makes the API client (a kubeconfig checked at start-up); None: the source loads its own."""
    claim_refresh: float = 300.0
    max_objects: int | None = None
    """Objects of one kind held from the API server; None: the source's default."""
    simulated_apiserver: bool = False
    """The API server is ``--simulate``'s: what it lacks is what the scenario has, not a problem."""
    procfs: str = "/proc"
    cdi_root: str = "/var/run/cdi"
    """Where DRA drivers write their per-claim CDI specs (``--cdi-root``)."""
    pod_labels: tuple[str, ...] = ()
    """The pod label keys the API server source keeps on each pod (``--pod-labels``)."""
    wall_clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    latest: Callable[[], Snapshots] = Snapshots
    """The latest snapshots of the sources built before this one (the kubelet's claims for the
    API server, NVML's PIDs for /proc)."""


@dataclass(frozen=True, slots=True)
class SourceSpec(Generic[T]):
    """One registered source. ``place`` puts its snapshot into ``Snapshots`` (typed: a source of
    ``T`` goes into the field of ``T``)."""

    name: str
    role: Role
    factory: Callable[[SourceContext], Source[T]]
    place: Callable[[Snapshots, T], Snapshots]
    keep_last_good: bool
    """After a failure keep serving the last good snapshot (the kubelet, the API server:
    attribution a few seconds old beats none) instead of dropping it (NVML: stale device
    values would mislead)."""
    help: str = ""
    enabled_by_default: bool = True
    aliases: tuple[str, ...] = ()
    """Older switch names: ``kubeapi`` keeps ``--kubeapi/--no-kubeapi`` and ``DRA_EXPORTER_KUBEAPI``."""

    @property
    def switchable(self) -> bool:
        """Whether a flag can turn it off: every source but the primary (the point of the exporter)."""
        return self.role is not Role.PRIMARY


class Registry:
    """The sources of one program, in registration order (the order they are built in)."""

    def __init__(self, program: str) -> None:
        self.program = program
        self._specs: dict[str, SourceSpec[Any]] = {}

    def register(self, spec: SourceSpec[T]) -> SourceSpec[T]:
        """Add a source; each name once."""
        if spec.name in self._specs:
            raise ValueError(f"source {spec.name!r} is registered twice")
        self._specs[spec.name] = spec
        return spec

    def sources(self) -> tuple[SourceSpec[Any], ...]:
        return tuple(self._specs.values())

    def default_enabled(self) -> frozenset[str]:
        return frozenset(s.name for s in self._specs.values() if s.enabled_by_default or not s.switchable)

    def enabled(self, switches: Mapping[str, bool]) -> frozenset[str]:
        """The sources to build: the registry's defaults, with the switches given applied."""
        unknown = set(switches) - set(self._specs)
        if unknown:
            raise ValueError(f"unknown sources: {', '.join(sorted(unknown))}; known: {', '.join(self._specs)}")
        fixed = [n for n, on in switches.items() if not on and not self._specs[n].switchable]
        if fixed:
            raise ValueError(f"the {fixed[0]} source cannot be turned off")
        return frozenset(n for n, s in self._specs.items()
                         if switches.get(n, s.enabled_by_default) or not s.switchable)

    def without(self, *names: str) -> frozenset[str]:
        """The default sources less ``names`` (e.g. ``without("kubeapi")``: ``--no-kubeapi``)."""
        return self.enabled(dict.fromkeys(names, False))

    def spec(self, name: str) -> SourceSpec[Any]:
        return self._specs[name]


NODE: Final = Registry("serve")
"""The node agent's sources (``serve``, ``snapshot``, ``doctor``)."""
CLUSTER: Final = Registry("cluster")
"""The cluster mode's sources."""

# The node agent's registry is the one the command line derives its switches from.
register, sources, default_enabled, enabled, without, spec = (
    NODE.register, NODE.sources, NODE.default_enabled, NODE.enabled, NODE.without, NODE.spec)


# --- the sources --------------------------------------------------------------------------------


def device_source(name: str, factory: Callable[[SourceContext], Source[DeviceSnapshot]], *,
                  help: str) -> SourceSpec[DeviceSnapshot]:
    """A device source's spec, for one ``register`` call: primary (collected by the cycle, always
    on), its snapshot added to ``Snapshots.devices`` beside the other device sources', and dropped
    after a failure (stale device values would mislead)."""
    return SourceSpec(name, Role.PRIMARY, factory, _add_devices, keep_last_good=False, help=help)


def _add_devices(snapshots: Snapshots, snapshot: DeviceSnapshot) -> Snapshots:
    return dataclasses.replace(snapshots, devices=(*snapshots.devices, snapshot))


def _nvml(ctx: SourceContext) -> Source[DeviceSnapshot]:
    from .nvml import NvmlSource

    return NvmlSource(ctx.nvml, wall_clock=ctx.wall_clock, monotonic=ctx.monotonic)


def _podresources(ctx: SourceContext) -> Source[PodResourcesSnapshot]:
    from .podresources import PodResourcesSource

    return PodResourcesSource(ctx.kubelet_socket)


def _kubeapi(ctx: SourceContext) -> Source[ClusterSnapshot]:
    """Without any API access it is still built: it then reports itself down once
    (``dra_exporter_source_up{source="kubeapi"} 0``) and the join stays node-local."""
    from .kubeapi import KubeApiSource

    def claim_hints() -> list[tuple[str, str]]:
        # Claims the kubelet reports are fetched even before the pod watch has their pod.
        pods = ctx.latest().pods
        if pods is None:
            return []
        return [(c.namespace, c.name) for p in pods.pods for ctr in p.containers for c in ctr.claims]

    def prepared_claims() -> list[str]:
        # Claims drivers prepared here: the census asks the API server about those no local pod explains.
        cdi = ctx.latest().cdi
        return [d.claim_uid for d in cdi.devices] if cdi is not None else []

    return KubeApiSource(ctx.node_name, kubeconfig=ctx.kubeconfig, client_factory=ctx.kube_client,
                         claim_hints=claim_hints, prepared_claims=prepared_claims, wall_clock=ctx.wall_clock,
                         claim_refresh=ctx.claim_refresh, max_objects=ctx.max_objects,
                         simulated=ctx.simulated_apiserver, pod_labels=ctx.pod_labels)


def _procs(ctx: SourceContext) -> Source[ProcessOwnersSnapshot]:
    """GPU PIDs of the device sources' latest snapshots → pods and containers, through the host's /proc."""
    from .procs import ProcsSource

    def gpu_pids() -> list[int]:
        return [p.pid for snapshot in ctx.latest().devices for p in snapshot.processes]

    return ProcsSource(gpu_pids, ctx.procfs)


def _cdi(ctx: SourceContext) -> Source[CdiSnapshot]:
    from .cdi import CdiSource

    return CdiSource(ctx.cdi_root)


NVML: SourceSpec[DeviceSnapshot] = register(device_source(
    "nvml", _nvml, help="The GPUs and MIG devices, through NVML; always on."))
# Before kubeapi: its factory reads the CDI specs' claim UIDs through ``latest``.
CDI: SourceSpec[CdiSnapshot] = register(SourceSpec(
    "cdi", Role.SIDE, _cdi, lambda s, v: dataclasses.replace(s, cdi=v), keep_last_good=False,
    help="Read the per-claim CDI specs DRA drivers write under --cdi-root, to find devices prepared for "
         "claims the API server no longer has (dra_orphan_prepared_device_since_timestamp_seconds)."))
PODRESOURCES: SourceSpec[PodResourcesSnapshot] = register(SourceSpec(
    "podresources", Role.SIDE, _podresources, lambda s, v: dataclasses.replace(s, pods=v), keep_last_good=True,
    help="Ask the kubelet's pod-resources API which pod and container hold which device."))
KUBEAPI: SourceSpec[ClusterSnapshot] = register(SourceSpec(
    "kubeapi", Role.SIDE, _kubeapi, lambda s, v: dataclasses.replace(s, cluster=v), keep_last_good=True,
    aliases=("kubeapi",),
    help="Read ResourceSlices, ResourceClaims and Pods from the API server (request names, pod UIDs, "
         "admin access, slice devices, taints, health). Off: node-local attribution only."))
PROCS: SourceSpec[ProcessOwnersSnapshot] = register(SourceSpec(
    "procs", Role.FOLLOWER, _procs, lambda s, v: dataclasses.replace(s, owners=v), keep_last_good=False,
    help="Find the pod and container of each GPU process in the host's /proc (needs hostPID: true). "
         "Off: GPU processes are not matched to containers."))


# --- the cluster mode's source ----------------------------------------------------------------------


def _cluster_state(ctx: SourceContext) -> Source[ClusterState]:
    from .kubeapi_cluster import ClusterSource

    return ClusterSource(kubeconfig=ctx.kubeconfig, client_factory=ctx.kube_client, max_objects=ctx.max_objects)


CLUSTER_STATE: SourceSpec[ClusterState] = CLUSTER.register(SourceSpec(
    "kubeapi", Role.PRIMARY, _cluster_state, lambda s, v: dataclasses.replace(s, state=v), keep_last_good=True,
    help="Every ResourceSlice, ResourceClaim, DeviceClass and DeviceTaintRule of the cluster, listed once and "
         "then watched."))
