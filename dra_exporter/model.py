"""Frozen records shared by every layer.

Sources produce snapshots made of these records, ``join`` turns snapshots into
a ``Frame``, sinks publish frames. Nothing here does I/O or knows Prometheus or
OpenTelemetry; metric names are catalogue keys (see ``catalog``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Final

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
class DeviceSnapshot:
    """What one device source (a role: ``sources.registry.device_source``; NVML is the one today)
    read in one cycle: its devices, the processes on them, and who makes them."""

    devices: tuple[DeviceSample, ...] = ()
    processes: tuple[ProcessSample, ...] = ()
    driver_version: str = ""
    library_version: str = ""
    """The version of the library the source reads the devices through (NVML's)."""
    vendor: str = ""
    """The maker of these devices, as OpenTelemetry's ``hw.vendor`` names it (``NVIDIA``)."""


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
    """A taint on a device (KEP-5055): put there by its driver in the ResourceSlice, or by an
    admin's DeviceTaintRule. A core/v1 Node's taints (``ClusterNode.taints``) have the same three
    fields and meaning, and are this type too."""

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
class NodeSelectorRequirement:
    """One ``matchExpressions``/``matchFields`` entry of a core/v1 NodeSelectorTerm."""

    key: str
    operator: str
    """``In``, ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt`` or ``Lt``."""
    values: tuple[str, ...] = ()

    def matches(self, value: str | None) -> bool:
        """Whether a node whose ``key`` is ``value`` (None: absent) meets this requirement; an
        unknown operator or a ``Gt``/``Lt`` that is not a number never matches (as the scheduler)."""
        if self.operator == "In":
            return value is not None and value in self.values
        if self.operator == "NotIn":
            return value is None or value not in self.values
        if self.operator == "Exists":
            return value is not None
        if self.operator == "DoesNotExist":
            return value is None
        if self.operator in ("Gt", "Lt") and value is not None and len(self.values) == 1:
            try:
                have, want = int(value), int(self.values[0])
            except ValueError:
                return False
            return have > want if self.operator == "Gt" else have < want
        return False


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    match_expressions: tuple[NodeSelectorRequirement, ...] = ()
    """Node labels."""
    match_fields: tuple[NodeSelectorRequirement, ...] = ()
    """Node fields; only ``metadata.name`` is defined."""


@dataclass(frozen=True, slots=True)
class NodeSelector:
    """A core/v1 NodeSelector (``nodeSelectorTerms``, ORed; each term's requirements ANDed)."""

    terms: tuple[NodeSelectorTerm, ...] = ()

    @property
    def needs_labels(self) -> bool:
        return any(t.match_expressions for t in self.terms)

    def matches(self, node: str, labels: dict[str, str] | None) -> bool:
        """Whether node ``node`` with ``labels`` is selected; without its labels (None), a term
        that asks about labels is taken as not matching: a device is only claimed for this node
        when that is known."""
        for term in self.terms:
            if not (term.match_expressions or term.match_fields):
                continue  # an empty term selects nothing (core/v1 NodeSelectorTerm)
            if term.match_expressions and labels is None:
                continue
            fields = {"metadata.name": node}
            if all(r.matches(fields.get(r.key)) for r in term.match_fields) and all(
                    r.matches((labels or {}).get(r.key)) for r in term.match_expressions):
                return True
        return False


@dataclass(frozen=True, slots=True)
class NodePlacement:
    """Where a slice, or one device of a ``perDeviceNodeSelection`` slice, is available:
    exactly one of the three is set."""

    node_name: str = ""
    all_nodes: bool = False
    node_selector: NodeSelector | None = None

    def covers(self, node: str, labels: dict[str, str] | None) -> bool:
        if self.node_name:
            return self.node_name == node
        if self.all_nodes:
            return True
        return self.node_selector is not None and self.node_selector.matches(node, labels)


#: The device attributes that name a slice device's model, first found wins (``SliceDevice.model_name``).
MODEL_ATTRIBUTES: Final = ("productName", "model")


@dataclass(frozen=True, slots=True)
class CapacityRequestPolicy:
    """``capacity[].requestPolicy`` of a device that allows multiple allocations (KEP-5075): what a
    request that names no amount takes (``default``), and the amounts a request may take
    (``valid_values``, or ``min``..``max`` in steps of ``step`` from ``min``). Base units."""

    default: float | None = None
    valid_values: tuple[float, ...] = ()
    min: float | None = None
    max: float | None = None
    step: float | None = None


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
    attribute_kinds: tuple[tuple[str, str], ...] = ()
    """The union member of each attribute that is not a ``string`` (``int``, ``bool``, ``version``,
    ``ints`` …), sorted by key: CEL selectors compare typed values (the cluster mode)."""
    consumes_counters: tuple[CounterConsumption, ...] = ()
    taints: tuple[DeviceTaint, ...] = ()
    node_name: str = ""
    """Per-device node (``perDeviceNodeSelection``); ``""`` when the slice names the node."""
    placement: NodePlacement | None = None
    """Per-device placement (``perDeviceNodeSelection`` slices: ``nodeName``, ``allNodes`` or
    ``nodeSelector`` on the device); None when the slice places all its devices."""
    allow_multiple_allocations: bool = False
    """``allowMultipleAllocations``: claims share the device, each taking part of its capacity."""
    request_policies: tuple[tuple[str, CapacityRequestPolicy], ...] = ()
    """``capacity[].requestPolicy`` by capacity name (as ``capacity`` spells it), sorted."""
    binding_conditions: tuple[str, ...] = ()
    """``bindingConditions``: conditions the claim's device status must reach before the pod binds
    (the scheduler tries pools with such devices after all others)."""
    binds_to_node: bool = False
    """``bindsToNode``: an allocation of the device is limited to the node the pod is placed on."""

    def attribute(self, key: str) -> str:
        for k, v in self.attributes:
            if k == key:
                return v
        return ""

    @property
    def model_name(self) -> str:
        """The model its driver publishes: NVIDIA's ``productName``, else the example driver's ``model``."""
        return next((m for key in MODEL_ATTRIBUTES if (m := self.attribute(key))), "")


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
    placement: NodePlacement = NodePlacement()
    """The slice's ``nodeName``, ``allNodes`` or ``nodeSelector``; empty for
    ``perDeviceNodeSelection`` (each device says) and counters-only slices."""
    per_device_node_selection: bool = False

    def for_node(self, node: str, labels: dict[str, str] | None) -> ResourceSliceInfo | None:
        """This slice as far as it covers ``node``: itself, only the devices a
        ``perDeviceNodeSelection`` slice places there, or None when it covers none of it."""
        if self.per_device_node_selection:
            devices = tuple(d for d in self.devices if d.placement is not None and d.placement.covers(node, labels))
            return replace(self, devices=devices) if devices else None
        return self if self.placement.covers(node, labels) else None


@dataclass(frozen=True, slots=True)
class DeviceToleration:
    """A toleration of device taints (core/v1 Toleration semantics); a pod's tolerations of node
    taints (``PodNodeFilters.tolerations``) are this type too."""

    key: str = ""
    """``""`` with ``Exists``: every key."""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    """``""``: every effect."""

    def tolerates(self, taint: DeviceTaint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.operator in ("Equal", "") and self.value == taint.value


@dataclass(frozen=True, slots=True)
class DeviceTaintRule:
    """A DeviceTaintRule (cluster-scoped): ``taint`` on every device its selector names."""

    name: str
    taint: DeviceTaint
    driver: str = ""
    pool: str = ""
    device: str = ""
    """The selector's fields; ``""``: any."""
    unsupported_selector: bool = False
    """The 1.33-1.34 v1alpha3 selector also had ``deviceClassName`` and CEL ``selectors``; a rule
    that uses them is not applied (the exporter cannot evaluate them)."""

    def selects(self, driver: str, pool: str, device: str) -> bool:
        return not self.unsupported_selector and all(
            not want or want == have for want, have in ((self.driver, driver), (self.pool, pool),
                                                         (self.device, device)))


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
    """The allocation's share of a device that allows several (consumable capacity, KEP-5075)."""
    tolerations: tuple[DeviceToleration, ...] = ()
    """Device taints the allocation tolerates (``results[].tolerations``)."""
    consumed_capacity: tuple[tuple[str, float], ...] = ()
    """What this allocation takes of the device's capacity, in base units, sorted by key."""

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
class NetworkDeviceData:
    """``status.devices[].networkData``: how a network device appears in the pod."""

    interface_name: str = ""
    hardware_address: str = ""
    ips: tuple[str, ...] = ()
    """CIDRs, sorted (at most 16, by the API)."""


@dataclass(frozen=True, slots=True)
class ClaimDeviceStatus:
    """One ``status.devices[]`` entry: what the driver reports about an allocated device."""

    driver: str
    pool: str
    device: str
    share_id: str = ""
    conditions: tuple[DeviceCondition, ...] = ()
    uuid: str = ""
    """A device identity the driver published in ``data`` (``uuid``): NVIDIA proposes the
    concrete UUID of a dynamically created MIG device there (dra-driver-nvidia-gpu#1456)."""
    network: NetworkDeviceData | None = None


@dataclass(frozen=True, slots=True)
class ConsumerRef:
    """One ``status.reservedFor[]`` entry."""

    resource: str
    name: str
    uid: str
    api_group: str = ""


@dataclass(frozen=True, slots=True)
class DeviceRequestInfo:
    """One request of a claim's spec, or one subrequest of a prioritized list (``main/sub``)."""

    name: str
    device_class: str
    count: int = 1
    all_devices: bool = False
    """``allocationMode: All``."""
    selectors: tuple[str, ...] = ()
    """The request's own CEL selectors (``selectors[].cel.expression``), ANDed with its class's."""
    admin_access: bool = False
    tolerations: tuple[DeviceToleration, ...] = ()
    capacity: tuple[tuple[str, float], ...] = ()
    """``capacity.requests``: what the request takes of a shared device's capacity, base units."""

    @property
    def parent(self) -> str:
        """The request a prioritized-list subrequest belongs to (``main`` of ``main/sub``); its
        own name for a plain request."""
        return self.name.partition("/")[0]


@dataclass(frozen=True, slots=True)
class DeviceConstraint:
    """One ``spec.devices.constraints[]`` entry: the devices of ``requests`` (all the claim's
    when empty) share the value of ``match_attribute``, or all differ in ``distinct_attribute``
    (fully qualified names)."""

    requests: tuple[str, ...] = ()
    match_attribute: str = ""
    distinct_attribute: str = ""


@dataclass(frozen=True, slots=True)
class OpaqueConfig:
    """One ``status.allocation.devices.config[]`` entry with ``opaque`` parameters: driver-defined
    JSON, of which only the top-level scalar fields are kept (``kind``, ``domainID``, …)."""

    driver: str
    requests: tuple[str, ...] = ()
    """The requests it applies to; empty: every request of the claim."""
    source: str = ""
    """``FromClaim`` or ``FromClass``."""
    parameters: tuple[tuple[str, str], ...] = ()
    """Top-level string, number and bool fields of ``parameters`` as text, sorted by key."""

    def parameter(self, key: str) -> str:
        return next((v for k, v in self.parameters if k == key), "")


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
    requests: tuple[DeviceRequestInfo, ...] = ()
    """What the claim asks for (``spec.devices.requests``), one entry per request or subrequest."""
    created: float = 0.0
    """``metadata.creationTimestamp`` as Unix time; 0 when unknown."""
    configs: tuple[OpaqueConfig, ...] = ()
    """The allocation's opaque device configuration (NVIDIA's ``ComputeDomainChannelConfig``)."""
    constraints: tuple[DeviceConstraint, ...] = ()

    @property
    def allocated(self) -> bool:
        return bool(self.results)

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
    """One ``allocatedResourcesStatus`` entry for a DRA device (KEP-4680).

    The kubelet names the device by its first CDI device ID when the driver returned one
    (NVIDIA always does), else by ``driver/pool/device``: the triplet is set in the second
    case, ``cdi_id`` in the first (the join resolves it to the device)."""

    claim: str
    """The ResourceClaim object's name (resolved from the status entry's reference name)."""
    request: str
    driver: str
    pool: str
    device: str
    health: str
    """``Healthy``, ``Unhealthy`` or ``Unknown``."""
    cdi_id: str = ""
    """The fully qualified CDI device name (``k8s.gpu.nvidia.com/claim=<uid>-gpu-0``); ``""``
    when the kubelet named the device by its triplet."""
    message: str = ""
    """Why (1.36+ ``message``), one line, at most ``kubeapi_normalize.HEALTH_MESSAGE_CHARS``;
    logged by the source, never a label (free text: one series per wording)."""


#: A Kubernetes label key: an optional DNS-subdomain prefix and ``/``, then a name of at most 63
#: characters, alphanumeric at both ends, ``-``, ``_`` and ``.`` inside (the API server's rule);
#: a value is such a name or empty.
_LABEL_KEY: Final = re.compile(r"(?:(?=[a-z0-9.-]{1,253}/)[a-z0-9](?:[a-z0-9-]*[a-z0-9])?"
                               r"(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*/)?"
                               r"(?=.{1,63}$)[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?")
_LABEL_VALUE: Final = re.compile(r"(?:(?=.{1,63}$)[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def is_label_key(text: str) -> bool:
    """Whether the API server accepts ``text`` as a label key (``team``, ``app.kubernetes.io/name``)."""
    return bool(_LABEL_KEY.fullmatch(text))


def is_label_value(text: str) -> bool:
    """Whether the API server accepts ``text`` as a label value."""
    return bool(_LABEL_VALUE.fullmatch(text))


def bare_container_id(status_id: str) -> str:
    """A pod status's container id without its runtime's scheme (``containerd://abc…`` → ``abc…``):
    how a process's cgroup names its container (``ProcessOwner.container_id``)."""
    return status_id.rpartition("://")[2]


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    name: str
    container_id: str = ""
    """``containerd://<id>`` as in ``status.containerStatuses[].containerID``; ``""`` before it starts."""
    claims: tuple[ContainerClaim, ...] = ()
    health: tuple[DeviceHealth, ...] = ()


#: Pod phases after which the pod holds, and waits for, no device.
TERMINAL_PHASES: Final = ("Succeeded", "Failed")


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
    labels: tuple[tuple[str, str], ...] = ()
    """(key, value) of the pod's labels that ``--pod-labels`` allowlists, by key; no others are kept."""

    @property
    def terminal(self) -> bool:
        """Succeeded or failed: the pod holds no device any more."""
        return self.phase in TERMINAL_PHASES

    def container(self, name: str) -> ContainerInfo | None:
        for c in self.containers:
            if c.name == name:
                return c
        return None


@dataclass(frozen=True, slots=True)
class ComputeDomainNode:
    """One member node of a ComputeDomain: a ``status.nodes[]`` entry, or a ComputeDomainClique's
    ``daemons[]`` entry (the same fields)."""

    name: str
    clique: str = ""
    """``<clusterUUID>.<cliqueId>``; ``""`` for a node without fabric."""
    index: int | None = None
    """The IMEX daemon's DNS index (-1 without fabric); None where the driver writes none (v25.3)."""
    status: str = ""
    """``Ready`` or ``NotReady``; ``""`` where the driver writes none (v25.3: a listed node has joined)."""


@dataclass(frozen=True, slots=True)
class ComputeDomain:
    """A ``resource.nvidia.com`` ComputeDomain (NVIDIA's multi-node NVLink / IMEX domain)."""

    namespace: str
    name: str
    uid: str
    num_nodes: int = 0
    allocation_mode: str = ""
    """``Single`` or ``All`` (v25.8+); ``""`` where the driver has no such field (v25.3)."""
    status: str = ""
    """``status.status``: ``Ready``/``NotReady``; ``""`` when the controller wrote none yet."""
    nodes: tuple[ComputeDomainNode, ...] = ()
    """``status.nodes[]``, by name."""


@dataclass(frozen=True, slots=True)
class ComputeDomainClique:
    """A ComputeDomainClique (driver namespace, feature gate ``ComputeDomainCliques``): the IMEX
    daemons of one domain in one NVLink clique."""

    namespace: str
    name: str
    domain_uid: str
    """Its ``resource.nvidia.com/computeDomain`` label: the domain's UID."""
    clique: str = ""
    daemons: tuple[ComputeDomainNode, ...] = ()


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """The API server's view of this node: slices (highest pool generation only, only what
    covers this node), the claims local pods use, the node's pods and the cluster's
    DeviceTaintRules. Everything sorted, so equal views compare equal."""

    node: str
    api_version: str = ""
    """The resource.k8s.io version read (``v1``, ``v1beta2`` or ``v1beta1``)."""
    slices: tuple[ResourceSliceInfo, ...] = ()
    claims: tuple[ClaimInfo, ...] = ()
    pods: tuple[PodInfo, ...] = ()
    taint_rules: tuple[DeviceTaintRule, ...] = ()
    """DeviceTaintRules of the cluster (all of them: they are few); the join applies them to this
    node's devices."""
    compute_domains: tuple[ComputeDomain, ...] = ()
    """The ComputeDomains this node's claims hold a channel of (``resource.nvidia.com``; empty where
    the CRD is not served)."""
    compute_domain_cliques: tuple[ComputeDomainClique, ...] = ()
    """The cliques of those domains."""
    claim_census: ClaimCensus | None = None
    """Whether the API server has the claims a driver prepared on this node that no local pod's
    claim explains (``cdi``'s claim UIDs); None: not asked (nothing to ask, or not yet)."""

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


@dataclass(frozen=True, slots=True)
class DeviceClassInfo:
    """A DeviceClass: the CEL selectors every device of the class must meet."""

    name: str
    selectors: tuple[str, ...] = ()
    """``spec.selectors[].cel.expression``, in order (ANDed)."""
    extended_resource_name: str = ""


@dataclass(frozen=True, slots=True)
class ClusterNode:
    """A core/v1 Node as the cluster mode keeps it: what the scheduler's node filters read (labels
    for slices' and pods' node selectors, taints, ``spec.unschedulable``), nothing else."""

    name: str
    labels: tuple[tuple[str, str], ...] = ()
    taints: tuple[DeviceTaint, ...] = ()
    """``spec.taints``: key, value, effect (``NoSchedule``, ``PreferNoSchedule`` or ``NoExecute``)."""
    unschedulable: bool = False
    """``spec.unschedulable`` (cordoned)."""


@dataclass(frozen=True, slots=True)
class PodNodeFilters:
    """What a pod says about the nodes it may go to: ``spec.nodeSelector``, the required part of
    its node affinity and its tolerations. Pods from one template share one such object."""

    node_selector: tuple[tuple[str, str], ...] = ()
    """``spec.nodeSelector``: labels a node must carry with these values."""
    affinity: NodeSelector | None = None
    """``spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution``; None: none."""
    tolerations: tuple[DeviceToleration, ...] = ()


NO_NODE_FILTERS: Final = PodNodeFilters()


@dataclass(frozen=True, slots=True)
class ClusterPod:
    """A pod as the cluster mode needs it: the claims it references and whether it can still wait
    for them (a claim is pending only while some pod waits for it)."""

    namespace: str
    name: str
    created: float = 0.0
    """``metadata.creationTimestamp`` as Unix time; 0 when unknown."""
    claims: tuple[str, ...] = ()
    """Names of the ResourceClaim objects it references (by name, or generated from a template)."""
    ended: bool = False
    """Succeeded, Failed or being deleted: the scheduler never places it again."""
    node_filters: PodNodeFilters = NO_NODE_FILTERS
    """Its node selector, required node affinity and tolerations (the scheduler's NodeAffinity,
    TaintToleration and NodeUnschedulable filters read them)."""


@dataclass(frozen=True, slots=True)
class ClusterState:
    """The API server's DRA objects of the whole cluster (the cluster mode): every slice (all
    generations: completeness is judged on them), claim, DeviceClass and DeviceTaintRule, and the
    pods that reference claims."""

    api_version: str = ""
    slices: tuple[ResourceSliceInfo, ...] = ()
    claims: tuple[ClaimInfo, ...] = ()
    classes: tuple[DeviceClassInfo, ...] = ()
    taint_rules: tuple[DeviceTaintRule, ...] = ()
    pods: tuple[ClusterPod, ...] = ()
    unread: tuple[tuple[str, str], ...] = ()
    """(kind, why) of each kind the source could not read (list forbidden, say): what it would
    tell is unknown, not empty. ``pods`` unread: whether a pod waits for a claim is unknown."""

    def read(self, kind: str) -> bool:
        """Whether ``kind`` (``pods``, ``resourceclaims`` …) was read."""
        return all(k != kind for k, _ in self.unread)
    nodes: tuple[ClusterNode, ...] | None = None
    """Every Node; None when they were not read (no access): node filters are then unknown, and
    a slice's node selector is taken as met, never as failed."""
    server_version: str = ""
    """The API server's ``/version`` ``gitVersion`` (``v1.36.2``); ``""`` when not known. The scheduler
    is taken to run this version (``cluster.scheduler_versions``)."""


@dataclass(frozen=True, slots=True)
class ClaimCensus:
    """One good list of the cluster's ResourceClaims, kept only for the claim UIDs it was asked about.

    ``asked`` holds every UID looked for; ``found`` the claims among them that exist (a UID never
    comes back once deleted, so an asked UID not found is known absent). A UID not asked is unknown:
    never an orphan."""

    asked: frozenset[str] = frozenset()
    found: tuple[ClaimInfo, ...] = ()
    listed_at: float = 0.0
    """Wall-clock time of the list."""


# --- CDI specs ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device a DRA driver prepared for a claim, as its CDI spec under the CDI root names it:
    ``<vendor>/<class>=<claimUID>-<device>`` (NVIDIA: ``k8s.gpu.nvidia.com/claim=<uid>-gpu-3``)."""

    claim_uid: str
    device: str
    """The driver's device name (``gpu-3``): the ResourceSlice's, for drivers that follow the convention."""
    driver: str
    """The driver, from the CDI vendor (``k8s.gpu.nvidia.com`` → ``gpu.nvidia.com``)."""
    spec_file: str
    """The spec's file name under the CDI root."""


@dataclass(frozen=True, slots=True)
class CdiSnapshot:
    """The per-claim devices of every CDI spec under the CDI root, sorted."""

    devices: tuple[PreparedDevice, ...] = ()
    skipped: int = 0
    """Spec files that could not be read (each logged once)."""


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
    device_vendors: tuple[tuple[str, str], ...] = ()
    """(uuid, vendor) of each device the device sources read (their snapshots' ``vendor``): OTLP's
    ``hw.vendor``. Not a series: the Prometheus exposition does not show it."""
    pod_label_attributes: tuple[tuple[str, str], ...] = ()
    """(Prometheus label, OTel attribute) of the allowlisted pod labels the frame's pod-label
    families carry (``catalog.PodLabels.attributes``): the key a sanitized ``label_*`` came from."""

    def family(self, name: str) -> Family | None:
        for fam in self.families:
            if fam.name == name:
                return fam
        return None
