"""Frozen records shared by every layer.

Sources produce snapshots made of these records, ``join`` turns snapshots into
a ``Frame``, sinks publish frames. Nothing here does I/O or knows Prometheus or
OpenTelemetry; metric names are catalogue keys (see ``catalog``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Label pairs in output order. Tuples keep records hashable and frames byte-stable.
Labels = tuple[tuple[str, str], ...]


# --- NVML -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """Identity of one NVML device: a whole GPU or a MIG device."""

    uuid: str
    index: int
    """NVML index of the physical GPU (the parent's index for a MIG device)."""
    minor: int
    """Minor number of the physical GPU (``/dev/nvidia<minor>``, NVIDIA DRA ``gpu-<minor>``)."""
    model: str
    pci_bus_id: str
    """The physical GPU's bus id in NVML's ``00000000:BB:DD.F`` form."""
    driver_version: str = ""
    mig_mode: str = "disabled"
    """``enabled``/``disabled`` for a whole GPU; ``""`` for a MIG device."""
    parent_uuid: str = ""
    profile: str = ""
    """MIG profile such as ``1g.18gb``; ``""`` for a whole GPU."""
    gi_id: int | None = None
    ci_id: int | None = None
    gi_profile_id: int | None = None
    placement_start: int | None = None
    placement_size: int | None = None

    @property
    def is_mig(self) -> bool:
        return bool(self.parent_uuid)


@dataclass(frozen=True, slots=True)
class Reading:
    """One value of one metric family for one device; ``labels`` are the family's own
    extra labels (``clock="sm"``, ``xid="79"``), never identity or attribution."""

    metric: str
    value: float
    labels: Labels = ()


@dataclass(frozen=True, slots=True)
class DeviceSample:
    """What one collection cycle read from one device."""

    device: GpuDevice
    up: bool
    readings: tuple[Reading, ...] = ()
    error: str = ""


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One process running on one device (whole GPU or MIG device)."""

    uuid: str
    pid: int
    used_memory_bytes: float | None = None
    sm_utilization_ratio: float | None = None


@dataclass(frozen=True, slots=True)
class NvmlSnapshot:
    devices: tuple[DeviceSample, ...] = ()
    processes: tuple[ProcessSample, ...] = ()
    driver_version: str = ""
    nvml_version: str = ""


# --- kubelet pod-resources ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """One device of a claim as the kubelet reports it: the (driver, pool, device) triplet."""

    driver: str
    pool: str
    device: str
    cdi_devices: tuple[str, ...] = ()
    share_id: str = ""


@dataclass(frozen=True, slots=True)
class ClaimUse:
    """A ResourceClaim referenced by a container, with the devices allocated to it."""

    namespace: str
    name: str
    devices: tuple[ClaimDevice, ...] = ()


@dataclass(frozen=True, slots=True)
class PluginDevices:
    """Devices handed out by a device plugin (``nvidia.com/gpu``, ``nvidia.com/mig-*``)."""

    resource_name: str
    device_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    name: str
    claims: tuple[ClaimUse, ...] = ()
    plugin_devices: tuple[PluginDevices, ...] = ()


@dataclass(frozen=True, slots=True)
class PodAllocation:
    namespace: str
    name: str
    containers: tuple[ContainerAllocation, ...] = ()


@dataclass(frozen=True, slots=True)
class PodResourcesSnapshot:
    pods: tuple[PodAllocation, ...] = ()


# --- API server: the cluster view ---------------------------------------------------------
#
# What only the API server knows, normalised from resource.k8s.io v1, v1beta2 and v1beta1
# (``sources/kubeapi_normalize.py``) into one shape. Names follow the API; values are plain
# strings and floats (quantities in base units), so the join never sees a version difference.


@dataclass(frozen=True, slots=True)
class DeviceTaint:
    """A taint a driver put on one ResourceSlice device (KEP-5055)."""

    key: str
    value: str = ""
    effect: str = ""
    """``NoSchedule``, ``NoExecute`` or ``None``."""


@dataclass(frozen=True, slots=True)
class CounterSet:
    """Shared counters of a partitionable device (``spec.sharedCounters[]``): what all its
    partitions together may consume, e.g. ``memory`` in bytes, ``multiprocessors``."""

    name: str
    counters: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class CounterConsumption:
    """What one device takes from a counter set when allocated (``devices[].consumesCounters[]``)."""

    counter_set: str
    counters: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class SliceDevice:
    """One device of a ResourceSlice."""

    name: str
    attributes: tuple[tuple[str, str], ...] = ()
    """Attribute values as strings (ints in decimal, bools ``true``/``false``, versions as
    written, lists comma-joined), sorted by key. Keys in the driver's own domain lose the
    domain (``gpu.nvidia.com/uuid`` → ``uuid``); other qualified keys keep theirs."""
    capacity: tuple[tuple[str, float], ...] = ()
    """Capacity values in base units (``80Gi`` → 85899345920.0), sorted by key."""
    consumes_counters: tuple[CounterConsumption, ...] = ()
    taints: tuple[DeviceTaint, ...] = ()
    node_name: str = ""
    """Per-device node (``perDeviceNodeSelection``); ``""`` when the slice names the node."""

    def attribute(self, key: str) -> str:
        for k, v in self.attributes:
            if k == key:
                return v
        return ""


@dataclass(frozen=True, slots=True)
class ResourceSliceInfo:
    """A ResourceSlice: part of one driver's pool of devices."""

    name: str
    driver: str
    pool: str
    generation: int = 0
    resource_slice_count: int = 1
    node_name: str = ""
    devices: tuple[SliceDevice, ...] = ()
    shared_counters: tuple[CounterSet, ...] = ()


@dataclass(frozen=True, slots=True)
class AllocationResult:
    """One ``status.allocation.devices.results[]`` entry of a ResourceClaim."""

    request: str
    """The request name; ``main/sub`` when a prioritized-list subrequest was chosen."""
    driver: str
    pool: str
    device: str
    admin_access: bool = False
    share_id: str = ""

    def serves(self, request: str) -> bool:
        """Whether this result belongs to ``request`` as a container names it (``main`` covers
        ``main/sub``; ``""`` means every request of the claim)."""
        return not request or self.request == request or self.request.startswith(request + "/")


@dataclass(frozen=True, slots=True)
class DeviceCondition:
    type: str
    status: str
    """``True``, ``False`` or ``Unknown``."""
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ClaimDeviceStatus:
    """One ``status.devices[]`` entry: what the driver reports about an allocated device."""

    driver: str
    pool: str
    device: str
    share_id: str = ""
    conditions: tuple[DeviceCondition, ...] = ()


@dataclass(frozen=True, slots=True)
class ConsumerRef:
    """One ``status.reservedFor[]`` entry."""

    resource: str
    name: str
    uid: str
    api_group: str = ""


@dataclass(frozen=True, slots=True)
class ClaimInfo:
    """A ResourceClaim as the join needs it."""

    namespace: str
    name: str
    uid: str
    results: tuple[AllocationResult, ...] = ()
    """Empty while the claim is not allocated."""
    reserved_for: tuple[ConsumerRef, ...] = ()
    devices: tuple[ClaimDeviceStatus, ...] = ()

    def results_for(self, driver: str, pool: str, device: str) -> tuple[AllocationResult, ...]:
        return tuple(r for r in self.results if (r.driver, r.pool, r.device) == (driver, pool, device))


@dataclass(frozen=True, slots=True)
class ContainerClaim:
    """A container's ``resources.claims[]`` entry, with the claim object it names."""

    ref: str
    """The pod-level claim reference name (``pod.spec.resourceClaims[].name``)."""
    claim: str
    """The ResourceClaim object's name; ``""`` while unknown (template not yet instantiated)."""
    request: str = ""
    """The request the container uses; ``""``: all requests of the claim."""


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    """One ``allocatedResourcesStatus`` entry for a DRA device (KEP-4680)."""

    claim: str
    """The ResourceClaim object's name (resolved from the status entry's reference name)."""
    request: str
    driver: str
    pool: str
    device: str
    health: str
    """``Healthy``, ``Unhealthy`` or ``Unknown``."""


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    name: str
    container_id: str = ""
    """``containerd://<id>`` as in ``status.containerStatuses[].containerID``; ``""`` before it starts."""
    claims: tuple[ContainerClaim, ...] = ()
    health: tuple[DeviceHealth, ...] = ()


@dataclass(frozen=True, slots=True)
class PodInfo:
    """A pod on this node as the API server has it."""

    namespace: str
    name: str
    uid: str
    phase: str = ""
    claims: tuple[str, ...] = ()
    """Names of every ResourceClaim object the pod references, sorted."""
    containers: tuple[ContainerInfo, ...] = ()
    """Regular and init containers (sidecars hold claims too), by name."""

    @property
    def terminal(self) -> bool:
        """Succeeded or failed: the pod holds no device any more."""
        return self.phase in ("Succeeded", "Failed")

    def container(self, name: str) -> ContainerInfo | None:
        for c in self.containers:
            if c.name == name:
                return c
        return None


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """The API server's view of this node: slices (highest pool generation only), the claims
    local pods use, and the node's pods. Everything sorted, so equal views compare equal."""

    node: str
    api_version: str = ""
    """The resource.k8s.io version read (``v1``, ``v1beta2`` or ``v1beta1``)."""
    slices: tuple[ResourceSliceInfo, ...] = ()
    claims: tuple[ClaimInfo, ...] = ()
    pods: tuple[PodInfo, ...] = ()

    def claim(self, namespace: str, name: str) -> ClaimInfo | None:
        for c in self.claims:
            if (c.namespace, c.name) == (namespace, name):
                return c
        return None

    def pod(self, namespace: str, name: str) -> PodInfo | None:
        for p in self.pods:
            if (p.namespace, p.name) == (namespace, name):
                return p
        return None


# --- /proc -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProcessOwner:
    """The pod and container a GPU process runs in, from its cgroup."""

    pid: int
    pod_uid: str
    container_id: str
    """The bare runtime ID, without ``containerd://``."""


@dataclass(frozen=True, slots=True)
class ProcessOwnersSnapshot:
    owners: tuple[ProcessOwner, ...] = ()
    unresolved: tuple[int, ...] = ()
    """GPU PIDs whose pod could not be found (no host PID namespace, or not a container)."""


# --- self health ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SourceHealth:
    """How one source fared, as the agent saw it."""

    source: str
    up: bool
    duration_seconds: float = 0.0
    errors_total: int = 0
    last_success_timestamp: float = 0.0


@dataclass(frozen=True, slots=True)
class LoopHealth:
    """Whether the collection loop makes progress, as the agent's watchdog sees it: what
    ``/readyz`` (``ready``) and ``/healthz`` (``live``) answer; ``reason`` says why not."""

    ready: bool
    live: bool
    reason: str = ""


# --- output -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sample:
    labels: Labels
    value: float


@dataclass(frozen=True, slots=True)
class Family:
    """All samples of one catalogue metric; ``name`` is the native family name."""

    name: str
    samples: tuple[Sample, ...]


@dataclass(frozen=True, slots=True)
class Frame:
    """Everything one cycle publishes, sorted by family and labels."""

    families: tuple[Family, ...] = ()
    timestamp: float = 0.0

    def family(self, name: str) -> Family | None:
        for fam in self.families:
            if fam.name == name:
                return fam
        return None
