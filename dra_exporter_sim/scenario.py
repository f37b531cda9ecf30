"""Scenarios: what the simulated node has and does, loaded from validated YAML.

A scenario names the node, its GPUs and MIG layout, the ResourceClaims allocated
on it, the pods that use them (with their processes and workload curves) and the
faults to inject. ``loader.load_scenario`` turns a built-in name, a YAML file or a
cluster dump into a ``Scenario``: frozen records, every identifier (UUIDs, pod and
claim UIDs, container ids, PIDs) filled in deterministically from the seed. Any
problem is a ``ScenarioError`` naming the file and the field (``demo.yaml: pods[2]
.containers[0].claims[0]: claim 'x' not defined in namespace 'ml'``), never a traceback.

This module holds the records, their queries, the seed-derived identifiers and the
format's public constants, and imports nothing else of the simulator but ``profile``:
reading YAML and validating it into records is ``scenario_builder``'s job, reading a
cluster dump ``dump``'s, choosing between them ``loader``'s. Records the exporter has
(device taints and conditions, claim devices) are the exporter's own (``dra_exporter.model``).

The rest of the simulator only reads scenarios: the fake NVML evaluates the
curves and faults at simulated time, the simulated kubelet serves
``Scenario.pod_allocations_at(t)`` and the simulated API server serves the
Kubernetes objects ``k8s_objects`` derives from the scenario (or, for a scenario
loaded from a cluster dump by ``dump``, the dump's own objects, ``raw_objects``).
Validating a MIG layout uses the GPU profile (``profile``: values recorded on a real
H200). The format is documented for users in ``docs/scenarios.md``.
"""

from __future__ import annotations

import hashlib
import math
import uuid as uuidlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from dra_exporter import model
from dra_exporter.dra_versions import SUPPORTED_VERSIONS
from dra_exporter.resolve import NVIDIA_DRIVER, NvidiaNameResolver, nvidia_device_name

from .profile import GpuProfile, load_profile


class ScenarioError(ValueError):
    """A scenario that cannot be loaded; the message names the file and the field."""


# --- scenario records --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Curve:
    """A workload level over simulated time: a constant, a sine wave, plus step noise.

    ``value = base + amplitude * sin(2π (t + phase) / period) + noise * u``, with ``u``
    in [-1, 1) drawn from a hash of (seed, key, floor(t)): the same scenario, seed and
    time always give the same value, and no global random state is touched.
    """

    base: float
    amplitude: float = 0.0
    period: float = 300.0
    phase: float = 0.0
    noise: float = 0.0

    def value(self, t: float, seed: int, key: str) -> float:
        v = self.base
        if self.amplitude:
            v += self.amplitude * math.sin(2 * math.pi * (t + self.phase) / self.period)
        if self.noise:
            v += self.noise * (2 * unit_hash(seed, key, str(math.floor(t))) - 1)
        return v


@dataclass(frozen=True, slots=True)
class MigDevice:
    profile: str
    gi_profile_id: int
    placement_start: int
    placement_size: int
    compute_slices: int
    gi_id: int
    ci_id: int
    uuid: str
    memory_total: int
    memory_reserved: int
    taints: tuple[model.DeviceTaint, ...] = ()
    published: bool = True
    """False: made outside the DRA driver (``nvidia-smi mig -cgi`` by hand): NVML has it, no slice does."""


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    """NVML index; also the minor number (``/dev/nvidia<index>``, DRA ``gpu-<index>``)."""
    uuid: str
    pci_bus_id: str
    mig: tuple[MigDevice, ...] = ()
    taints: tuple[model.DeviceTaint, ...] = ()
    nvlink_tx: Curve | None = None
    """NVLink traffic sent, bytes per second over all active links (``gpus[].nvlink.tx``); None: the
    profile's rate at full load times utilisation."""
    nvlink_rx: Curve | None = None

    @property
    def minor(self) -> int:
        return self.index

    @property
    def mig_enabled(self) -> bool:
        return bool(self.mig)


@dataclass(frozen=True, slots=True)
class SubRequest:
    """One alternative of a prioritized-list request (``firstAvailable``, KEP-4816)."""

    name: str
    device_class: str
    count: int = 1


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """A named request of a claim and the devices allocated for it."""

    name: str
    devices: tuple[str, ...]
    device_class: str = ""
    """DeviceClass of an ``exactly`` request; ``""`` for a prioritized list."""
    all_devices: bool = False
    """``allocationMode: All`` (every matching device) instead of ``ExactCount``."""
    first_available: tuple[SubRequest, ...] = ()
    allocated: str = ""
    """The subrequest the scheduler chose, for a prioritized list."""

    @property
    def result_name(self) -> str:
        """``request`` of the allocation results: ``<request>/<subrequest>`` for a prioritized list."""
        return f"{self.name}/{self.allocated}" if self.allocated else self.name


@dataclass(frozen=True, slots=True)
class TimedCondition:
    """A condition the simulated driver writes into a claim's ``status.devices[]`` from simulated
    time ``at``, with its ``message`` (free text the exporter does not read)."""

    condition: model.DeviceCondition
    message: str = ""
    at: float = 0.0


@dataclass(frozen=True, slots=True)
class DeviceStatus:
    device: str
    conditions: tuple[TimedCondition, ...]


@dataclass(frozen=True, slots=True)
class Claim:
    namespace: str
    name: str
    uid: str
    request: str
    """Name of the first request (the only one for claims written with ``devices``)."""
    admin_access: bool
    driver: str
    pool: str
    devices: tuple[str, ...]
    """Every allocated device, over all requests."""
    requests: tuple[ClaimRequest, ...] = ()
    template: str = ""
    """The ResourceClaimTemplate it was generated from: then it exists only while its pod does."""
    device_status: tuple[DeviceStatus, ...] = ()

    @property
    def pod_claim_name(self) -> str:
        """The name pods use for it in ``spec.resourceClaims[]`` and container ``resources.claims[]``."""
        return self.template or self.name

    def all_requests(self) -> tuple[ClaimRequest, ...]:
        return self.requests or (ClaimRequest(self.request, self.devices),)


@dataclass(frozen=True, slots=True)
class SliceDevice:
    """A device of another driver's ResourceSlice; NVML knows nothing of it."""

    name: str
    attributes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, hash=False)
    """Attribute name → typed value as in the API (``{"string": "x"}``, ``{"int": 3}``…)."""
    capacity: Mapping[str, str] = field(default_factory=dict, hash=False)
    """Capacity name → quantity string."""
    taints: tuple[model.DeviceTaint, ...] = ()


@dataclass(frozen=True, slots=True)
class DriverSlice:
    """The ResourceSlice of a driver other than NVIDIA's on this node."""

    driver: str
    pool: str
    devices: tuple[SliceDevice, ...]


@dataclass(frozen=True, slots=True)
class PluginDevice:
    resource: str
    ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Process:
    device: str
    """The device as the scenario wrote it (DRA name or GPU index)."""
    uuid: str
    """NVML UUID of that device (``GPU-…`` or ``MIG-…``)."""
    pid: int
    memory_bytes: int
    sm: Curve
    key: str
    """Stable identity used to seed this process's curve noise."""


@dataclass(frozen=True, slots=True)
class Container:
    name: str
    container_id: str
    claims: tuple[str, ...] = ()
    plugin_devices: tuple[PluginDevice, ...] = ()
    processes: tuple[Process, ...] = ()
    claim_requests: tuple[tuple[str, str], ...] = ()
    """(claim, request) for each claim the container uses one request of (``resources.claims[].request``)."""
    device_health: tuple[tuple[str, str], ...] = ()
    """(device, health) the kubelet reports in ``allocatedResourcesStatus``; empty: not reported."""

    def request_for(self, claim: str) -> str:
        """The one request of ``claim`` this container uses; ``""`` for all of them."""
        return next((r for c, r in self.claim_requests if c == claim), "")


@dataclass(frozen=True, slots=True)
class Pod:
    namespace: str
    name: str
    uid: str
    start: float
    end: float | None
    containers: tuple[Container, ...]
    labels: tuple[tuple[str, str], ...] = ()
    """The pod's metadata labels (key, value), by key."""

    def alive_at(self, t: float) -> bool:
        return self.start <= t and (self.end is None or t < self.end)


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Fault:
    """An injected fault, active on ``[at, until)`` (``until=None``: to the end).

    ``params`` holds the kind's own parameters (``family``, ``xid``, ``mig_device``,
    ``delay``, ``error``); an ``xid`` fault is a single event at ``at``; ``gpu`` narrows
    ``gpu_lost``, ``family_unsupported``, ``xid`` and ``nvml_hang`` to one GPU.
    """

    kind: str
    at: float
    until: float | None = None
    gpu: int | None = None
    params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), hash=False)

    def active_at(self, t: float) -> bool:
        return self.at <= t and (self.until is None or t < self.until)


@dataclass(frozen=True, slots=True)
class LeftoverCdiSpec:
    """A per-claim CDI spec a driver left under the CDI root (``leftover_cdi_specs``): its claim is gone."""

    claim_uid: str
    devices: tuple[str, ...]
    driver: str


@dataclass(frozen=True, slots=True)
class Hardware:
    """The node's GPUs as a cluster dump's ResourceSlices describe them (``dump``), not as the format writes
    them: the model's profile (``profile.identified``) and each GPU's PCI bus id (NVML's form)."""

    profile: GpuProfile
    pci_bus_ids: Mapping[int, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    """Where it came from (``demo.yaml`` or the path given); used in messages."""
    node_name: str
    seed: int
    gpu_model: str
    gpus: tuple[Gpu, ...]
    claims: tuple[Claim, ...] = ()
    pods: tuple[Pod, ...] = ()
    faults: tuple[Fault, ...] = ()
    exporter_pod: PodRef | None = None
    description: str = ""
    api_version: str = "v1"
    """resource.k8s.io version the simulated cluster prefers; it serves that one and the older ones."""
    slices: tuple[DriverSlice, ...] = ()
    dynamic_mig: bool = False
    """NVIDIA's DynamicMIG: partitionable devices with shared counters in the slices."""
    raw_objects: tuple[Mapping[str, Any], ...] = field(default=(), hash=False, compare=False)
    """A cluster dump's own objects (ResourceSlices, ResourceClaims, Pods), served as they are."""
    gpu_profile: GpuProfile | None = None
    """The GPUs' profile where a cluster dump's slices name the model (``Hardware``); else ``gpu_model``'s."""
    leftover_cdi_specs: tuple[LeftoverCdiSpec, ...] = ()
    """CDI specs left behind for claims the cluster does not have (the simulated CDI root has them)."""
    cluster: ClusterScenario | None = field(default=None, hash=False, compare=False)
    """The whole simulated cluster, for a node of a multi-node scenario (``multinode``); None: one node."""

    @property
    def profile(self) -> GpuProfile:
        return self.gpu_profile or load_profile(self.gpu_model)

    def pods_at(self, t: float) -> tuple[Pod, ...]:
        return tuple(p for p in self.pods if p.alive_at(t))

    def claim(self, namespace: str, name: str) -> Claim | None:
        return next((c for c in self.claims if (c.namespace, c.name) == (namespace, name)), None)

    def consumers_at(self, claim: Claim, t: float) -> tuple[Pod, ...]:
        """Pods alive at ``t`` with a container that references ``claim`` (its ``reservedFor``)."""
        return tuple(p for p in self.pods_at(t) if p.namespace == claim.namespace
                     and any(claim.name in c.claims for c in p.containers))

    def active_faults(self, t: float, kind: str | None = None) -> tuple[Fault, ...]:
        return tuple(f for f in self.faults if f.active_at(t) and (kind is None or f.kind == kind))

    def pod_allocations_at(self, t: float) -> model.PodResourcesSnapshot:
        """What the kubelet's pod-resources ``List`` returns at simulated time ``t``."""
        claims = {(c.namespace, c.name): c for c in self.claims}
        # While a driver rolls out, the kubelet's answer briefly lacks that driver's devices.
        rolling = {f.params["driver"] for f in self.active_faults(t, "driver_rollout")}
        # NodePrepareResources failing for a pod: the real kubelet lists its claims with no devices.
        unprepared = {f.params["pod"] for f in self.active_faults(t, "prepare_failed")}
        return model.PodResourcesSnapshot(pods=tuple(
            model.PodAllocation(pod.namespace, pod.name, tuple(
                model.ContainerAllocation(
                    name=c.name,
                    # Like the real kubelet: every device of each referenced claim, whatever
                    # request the container names (only the API server's pod spec says which).
                    claims=tuple(model.ClaimUse(pod.namespace, name)
                                 if f"{pod.namespace}/{pod.name}" in unprepared
                                 else claim_use(claims[(pod.namespace, name)]) for name in c.claims
                                 if claims[(pod.namespace, name)].driver not in rolling),
                    plugin_devices=tuple(model.PluginDevices(d.resource, d.ids) for d in c.plugin_devices))
                for c in pod.containers))
            for pod in self.pods_at(t)))

    def claims_at(self, t: float) -> tuple[Claim, ...]:
        """Claims that exist at ``t``: standalone ones always, generated ones while their pod lives."""
        return tuple(c for c in self.claims if not c.template or self.consumers_at(c, t))

    def gpu_devices(self) -> tuple[model.GpuDevice, ...]:
        """NVML identities of every GPU and MIG device, in NVML enumeration order."""
        out: list[model.GpuDevice] = []
        for gpu in self.gpus:
            common = dict(index=gpu.index, minor=gpu.minor, model=self.profile.model,
                          pci_bus_id=gpu.pci_bus_id, driver_version=self.profile.driver_version)
            out.append(model.GpuDevice(uuid=gpu.uuid, mig_mode="enabled" if gpu.mig_enabled else "disabled",
                                       **common))  # type: ignore[arg-type]
            out.extend(model.GpuDevice(
                uuid=m.uuid, mig_mode="", parent_uuid=gpu.uuid, profile=m.profile,
                gi_id=m.gi_id, ci_id=m.ci_id,
                gi_profile_id=m.gi_profile_id, placement_start=m.placement_start,
                placement_size=m.placement_size, **common) for m in gpu.mig)  # type: ignore[arg-type]
        return tuple(out)

    def device_name(self, uuid: str) -> str | None:
        """The NVIDIA DRA device name (canonical format) of an NVML device."""
        dev = next((d for d in self.gpu_devices() if d.uuid == uuid), None)
        return nvidia_device_name(dev) if dev else None

    def nvml_uuid(self, device: str) -> str | None:
        """The NVML UUID that an NVIDIA DRA device name on this node stands for."""
        return NvidiaNameResolver(self.gpu_devices()).resolve(NVIDIA_DRIVER, self.node_name, device)

    def find_mig(self, uuid: str) -> tuple[Gpu, MigDevice] | None:
        for gpu in self.gpus:
            for mig in gpu.mig:
                if mig.uuid == uuid:
                    return gpu, mig
        return None


# --- multi-node scenarios (parsed by ``multinode``, their objects built by ``k8s_objects``) -----

CD_DRIVER: Final = "compute-domain.nvidia.com"
CHANNEL_REQUEST: Final = "channel"
DAEMON_REQUEST: Final = "daemon"
#: The driver's default namespace up to v25.12 (v0.4+ uses dra-driver-nvidia-gpu).
DEFAULT_DRIVER_NAMESPACE: Final = "nvidia-dra-driver-gpu"


@dataclass(frozen=True, slots=True)
class SimComputeDomain:
    namespace: str
    name: str
    uid: str
    nodes: tuple[str, ...]
    """Member nodes, in index order."""
    clique: str
    """``<clusterUUID>.<cliqueId>`` of every member (one NVLink clique)."""
    num_nodes: int = 0
    allocation_mode: str = "Single"
    status_form: str = "v25.8"
    cliques: bool = True
    channel_template: str = ""


@dataclass(frozen=True, slots=True)
class ClusterScenario:
    """The whole simulated cluster; ``Scenario.cluster`` of the node a process plays."""

    name: str
    nodes: tuple[Scenario, ...]
    compute_domains: tuple[SimComputeDomain, ...] = ()
    faults: tuple[Fault, ...] = ()
    """Cluster faults; ``params["node"]`` names the node."""
    driver_namespace: str = DEFAULT_DRIVER_NAMESPACE
    channel_claims: Mapping[tuple[str, str], str] = field(default_factory=dict, hash=False)
    """(namespace, claim) → the domain name whose IMEX channel the claim holds."""

    def node(self, name: str) -> Scenario | None:
        return next((n for n in self.nodes if n.node_name == name), None)

    def domain(self, namespace: str, name: str) -> SimComputeDomain | None:
        return next((d for d in self.compute_domains if (d.namespace, d.name) == (namespace, name)), None)

    def imex_not_ready(self, node: str, t: float) -> bool:
        return any(f.kind == "imex_not_ready" and f.params["node"] == node and f.active_at(t) for f in self.faults)


def claim_use(claim: Claim, request: str = "") -> model.ClaimUse:
    """The claim's devices as the kubelet reports them (only those of ``request`` when one is given).

    Like a real kubelet 1.36 (the node test bed): it keeps one list of CDI ids per driver while it
    walks a claim's devices, so device k carries the CDI ids of the claim's devices 1..k."""
    wanted = set(claim.devices)
    if request:
        wanted = {d for r in claim.all_requests() if r.name == request for d in r.devices}
    listed: list[model.ClaimDevice] = []
    cdi: tuple[str, ...] = ()
    for device in claim.devices:
        cdi += cdi_devices(claim, device)
        if device in wanted:
            listed.append(model.ClaimDevice(claim.driver, claim.pool, device, cdi))
    return model.ClaimUse(claim.namespace, claim.name, tuple(listed))


def cdi_devices(claim: Claim, device: str) -> tuple[str, ...]:
    """The CDI device names the claim's driver returned for ``device``."""
    # NVIDIA's driver names one CDI device per claim device, embedding the claim UID;
    # other drivers' CDI names are their own business, so none are invented here.
    if claim.driver != NVIDIA_DRIVER:
        return ()
    return (f"k8s.gpu.nvidia.com/claim={claim.uid}-{device}",)


# --- deterministic identifiers ----------------------------------------------------------------


def digest(seed: int, *parts: str, size: int = 16) -> bytes:
    text = "\x1f".join((str(seed), *parts))
    return hashlib.blake2b(text.encode(), digest_size=size).digest()


def unit_hash(seed: int, *parts: str) -> float:
    """A number in [0, 1) that depends only on its arguments."""
    return int.from_bytes(digest(seed, *parts, size=8), "big") / 2**64


def derived_uuid(seed: int, *parts: str) -> str:
    return str(uuidlib.UUID(bytes=digest(seed, *parts), version=4))


# PCI bus numbers of an 8-GPU HGX board, then a second set for 16-GPU nodes.
BUS_NUMBERS: Final = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB,
                       0x19, 0x2B, 0x3B, 0x5E, 0x9B, 0xAC, 0xBB, 0xDC)
MAX_GPUS: Final = len(BUS_NUMBERS)
#: The most devices a real API server lets one claim's allocation hold (resource.k8s.io
#: ``AllocationResultsMaxSize``; a status update with more is refused, 422).
MAX_CLAIM_DEVICES: Final = 32


# --- the format's constants ---------------------------------------------------------------------

#: NVML call families a ``family_unsupported`` fault can switch off.
NVML_FAMILIES: Final = ("utilization", "memory", "power", "temperature", "clocks", "clock_events",
                        "fields", "processes", "gpm", "events", "nvlink", "fabric")
#: NVLink error counters each generation's NVML has (``nvlink_errors`` fault ``type``), the first
#: being the default: CRC/replay/recovery up to Hopper, the ``COUNT_*`` fields on Blackwell.
NVLINK_ERROR_TYPES: Final = {
    "nvlink4": ("crc_flit", "crc_data", "replay", "recovery", "ecc_data"),
    "nvlink5": ("symbol", "effective", "malformed_packet", "buffer_overrun", "rcv", "rcv_remote",
                "rcv_general", "local_link_integrity", "xmit_discards"),
}
NVLINK_FAULTS: Final = ("nvlink_link_down", "nvlink_errors", "fabric_unhealthy", "fabric_in_progress")
INIT_ERRORS: Final = ("driver_not_loaded", "library_not_found")
KUBELET_FAULTS: Final = ("kubelet_socket_gone", "kubelet_resource_exhausted", "kubelet_slow",
                         "kubelet_malformed")
APISERVER_FAULTS: Final = ("apiserver_gone", "apiserver_error", "apiserver_slow", "apiserver_watch_drop",
                           "apiserver_gone_410")
FAULT_KINDS: Final = (("gpu_lost", "family_unsupported", "init_failure", "xid", "nvml_hang", "driver_rollout",
                       "prepare_failed")
                      + NVLINK_FAULTS + KUBELET_FAULTS + APISERVER_FAULTS)

#: resource.k8s.io versions a simulated cluster can serve, newest first.
API_VERSIONS: Final = SUPPORTED_VERSIONS
TAINT_EFFECTS: Final = ("NoSchedule", "NoExecute", "None")
DEVICE_HEALTH: Final = ("Healthy", "Unhealthy", "Unknown")
CONDITION_STATUS: Final = ("True", "False", "Unknown")
#: NVIDIA's DeviceClasses for whole GPUs and MIG devices.
NVIDIA_GPU_CLASS: Final = "gpu.nvidia.com"
NVIDIA_MIG_CLASS: Final = "mig.nvidia.com"
