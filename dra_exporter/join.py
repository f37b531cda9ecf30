"""The join: latest source snapshots in, one labelled ``Frame`` out.

A pure function (no I/O, no clock, no logging). It owns every attribution rule of
DESIGN §3, so the rules are tested without sockets, threads or GPUs:

1. A device with no allocation still reports, with empty attribution labels.
2. A device held by one pod carries namespace, pod, pod UID, claim and request;
   ``container`` is set when exactly one container of that pod uses the device. A pod holds
   the devices of a claim reserved for it even when no container references the claim
   (a pod-level claim: ``container=""``).
3. A device used by several pods keeps ONE series with ``pod=""``;
   ``dra_claim_consumer_info`` lists every consumer. Values are never copied.
4. Admin-access (monitoring) claims never count as consumers.
5. Pods and claims that are gone leave the next frame (nothing is remembered here).

The kubelet's pod-resources answer says which pod holds which device on this node; the
API server's view (``ClusterSnapshot``, optional) adds what only it knows:

* device → UUID through ResourceSlice attributes, ahead of NVIDIA name parsing;
* the request of each allocated device (``main/sub`` for a prioritized-list subrequest), and
  which request each container uses — the kubelet reports every device of a claim to every
  container that references the claim, the pod spec says which request it really uses;
* pod UIDs; ``adminAccess`` from the allocation results, which is authoritative for rule 4
  (without the API server, the claims of the exporter's own pod are the monitoring ones);
* slice devices, taints and shared counters; claim device conditions; device health;
* attribution when the kubelet cannot give it: pods it does not report DRA claims for
  (kubelets before 1.34 without the ``KubeletPodResourcesDynamicResources`` gate), or all
  running pods while the kubelet has never answered.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from . import catalog as cat
from . import orphans
from .join_domains import domain_families
from .model import (
    CdiSnapshot,
    ClaimDevice,
    ClaimInfo,
    ClaimUse,
    ClusterSnapshot,
    ContainerAllocation,
    DeviceHealth,
    DeviceSample,
    DeviceSnapshot,
    Family,
    Frame,
    GpuDevice,
    Labels,
    PluginDevices,
    PodAllocation,
    PodInfo,
    PodResourcesSnapshot,
    ProcessOwnersSnapshot,
    ProcessSample,
    Sample,
    SourceHealth,
    bare_container_id,
)
from .resolve import ChainResolver, ClaimStatusResolver, NvidiaNameResolver, Resolver, SliceResolver
from .taints import TaintRuleIndex

#: Device-plugin resource names whose ids are NVIDIA GPU or MIG devices.
_PLUGIN_GPU_RESOURCE = "nvidia.com/gpu"
_PLUGIN_MIG_PREFIX = "nvidia.com/mig-"
#: NVIDIA CDI device names embed the claim UID: ``k8s.gpu.nvidia.com/claim=<uid>-<device>``.
_NVIDIA_CDI_PREFIX = "k8s.gpu.nvidia.com/claim="
_RUNNING = "Running"
#: Device attributes behind ``dra_device_info`` labels (NVIDIA's names; the model: ``SliceDevice.model_name``).
_ATTR_TYPE, _ATTR_PROFILE, _ATTR_PARENT = "type", "profile", "parentUUID"


@dataclass(frozen=True, slots=True)
class JoinInput:
    """Everything the join looks at: the latest snapshot of each source and static facts."""

    devices: tuple[DeviceSnapshot, ...] = ()
    """The latest snapshot of each device source (NVML today), each with its vendor."""
    pods: PodResourcesSnapshot | None = None
    health: tuple[SourceHealth, ...] = ()
    self_pod: tuple[str, str] | None = None
    """(namespace, name) of the exporter's own pod: its claims are monitoring claims (rule 4)
    unless the API server says otherwise."""
    version: str = ""
    python_version: str = ""
    timestamp: float = 0.0
    cluster: ClusterSnapshot | None = None
    """The API server's view of this node; None without API access (node-local join only)."""
    owners: ProcessOwnersSnapshot | None = None
    """Which pod and container each GPU process runs in; None when /proc is not read."""
    cdi: CdiSnapshot | None = None
    """The per-claim CDI specs under the CDI root; None when not read (or failing)."""
    orphan_memory: orphans.OrphanMemory | None = None
    """When each orphan was first seen, kept across cycles by the caller; None: no orphan families."""
    pod_labels: cat.PodLabels = cat.PodLabels()
    """The pod labels consumer info carries (``--pod-labels``), from the API server's pods (``""``
    for a pod it does not know or that lacks one); none: the family's declared labels alone."""


@dataclass(frozen=True, slots=True)
class _Consumer:
    namespace: str
    pod: str
    pod_uid: str
    container: str
    claim: str
    request: str


#: Native families by name: a reading names its family by name (``Reading.metric``).
_FAMILIES: dict[str, cat.MetricSpec] = {spec.name: spec for spec in cat.CATALOG}


@dataclass(slots=True)
class _Builder:
    """Collects samples per family, then emits them in catalogue order, sorted.

    Every label set is made by the family's spec (``series``, ``device_series``, ``check``), so a
    label the family does not declare, or one it declares and the join forgot, is a
    ``catalog.LabelError`` here rather than a series that differs from the catalogue."""

    samples: dict[str, list[Sample]] = field(default_factory=lambda: defaultdict(list))

    def add(self, spec: cat.MetricSpec, value: float, /, **labels: str) -> None:
        self.samples[spec.name].append(Sample(spec.series(**labels), float(value)))

    def add_labels(self, spec: cat.MetricSpec, labels: Labels, value: float) -> None:
        """A sample whose label set was built beforehand (checked against ``spec`` here)."""
        self.samples[spec.name].append(Sample(spec.check(labels), float(value)))

    def add_with_pod_labels(self, spec: cat.MetricSpec, value: float, pod_labels: Labels, /, **labels: str) -> None:
        """``add``, with the allowlisted pod labels after the family's own (``with_pod_labels``)."""
        self.samples[spec.name].append(Sample(spec.with_pod_labels(spec.series(**labels), pod_labels), float(value)))

    def add_device(self, spec: cat.MetricSpec, device: Labels, extra: Labels, value: float) -> None:
        self.samples[spec.name].append(Sample(spec.device_series(device, extra), float(value)))

    def frame(self, timestamp: float, device_vendors: tuple[tuple[str, str], ...],
              pod_labels: cat.PodLabels) -> Frame:
        families = []
        for spec in cat.CATALOG:
            found = self.samples.get(spec.name)
            if found:
                # One sample per label set: a duplicate would make the exposition invalid.
                unique = {s.labels: s for s in found}
                families.append(Family(spec.name, tuple(sorted(unique.values(), key=lambda s: s.labels))))
        return Frame(tuple(families), timestamp, device_vendors, pod_labels.attributes())


class _View:
    """The cluster snapshot indexed for the join; empty (every lookup None) without one."""

    def __init__(self, cluster: ClusterSnapshot | None, self_pod: tuple[str, str] | None) -> None:
        self.cluster = cluster
        self.self_pod = self_pod
        self.claims = {(c.namespace, c.name): c for c in cluster.claims} if cluster else {}
        self.pods = {(p.namespace, p.name): p for p in cluster.pods} if cluster else {}
        self.pods_by_uid = {p.uid: p for p in cluster.pods} if cluster else {}

    def claim(self, namespace: str, name: str) -> ClaimInfo | None:
        claim = self.claims.get((namespace, name))
        return claim if claim is not None and claim.results else None

    def pod_uid(self, namespace: str, pod: str, claim: ClaimInfo | None) -> str:
        if info := self.pods.get((namespace, pod)):
            return info.uid
        # A pod the watch has not delivered yet may already be in the claim's reservedFor.
        for ref in claim.reserved_for if claim else ():
            if ref.resource == "pods" and ref.name == pod:
                return ref.uid
        return ""

    def monitoring_claim(self, pod: PodAllocation, claim: ClaimUse) -> bool:
        """Rule 4 for a whole claim: every result has admin access (the API server's word);
        without it, the claim belongs to the exporter's own pod."""
        if info := self.claim(claim.namespace, claim.name):
            return all(r.admin_access for r in info.results)
        return (pod.namespace, pod.name) == self.self_pod

    def device_use(self, pod: PodAllocation, container: str, claim: ClaimUse,
                   dev: ClaimDevice) -> tuple[bool, str] | None:
        """(monitoring, request) for one device the kubelet lists for a container; None when the
        container does not use it (the pod spec names another request of the claim)."""
        info = self.claim(claim.namespace, claim.name)
        results = info.results_for(dev.driver, dev.pool, dev.device) if info else ()
        if not results:
            return self.monitoring_claim(pod, claim), ""
        wanted = self._requests(pod, container, claim.name)
        if wanted is not None:
            results = tuple(r for r in results if any(r.serves(w) for w in wanted))
            if not results:
                return None
        return all(r.admin_access for r in results), _only({r.request for r in results})

    def _requests(self, pod: PodAllocation, container: str, claim: str) -> set[str] | None:
        """The requests of ``claim`` the container names; None: all of them (or unknown)."""
        info = self.pods.get((pod.namespace, pod.name))
        ctr = info.container(container) if info else None
        refs = {c.request for c in ctr.claims if c.claim == claim} if ctr else set()
        return None if not refs or "" in refs else refs


def join(inp: JoinInput) -> Frame:
    """Build the frame for one cycle from the latest snapshots."""
    out = _Builder()
    samples = [sample for snapshot in inp.devices for sample in snapshot.devices]
    processes = [proc for snapshot in inp.devices for proc in snapshot.processes]
    devices = [sample.device for sample in samples]
    cluster = inp.cluster
    slice_resolvers = (SliceResolver(cluster.slices), ClaimStatusResolver(cluster.claims)) if cluster else ()
    resolver = ChainResolver((*slice_resolvers, NvidiaNameResolver(devices)))
    view = _View(cluster, inp.self_pod)
    pods = _with_cluster_pods(inp.pods, view)

    consumers = _device_consumers(pods, devices, resolver, view)
    _add_claim_holders(consumers, {(p.namespace, p.name) for p in pods}, resolver, view)
    _claim_families(out, pods, resolver, view, inp.pod_labels)
    _unprepared_families(out, inp.pods, view)
    if cluster:
        _cluster_families(out, cluster, resolver)
        _health_families(out, cluster, pods, view)
        for spec, labels, value in domain_families(cluster, _gpu_holders(devices, consumers)):
            out.add_labels(spec, labels, value)
    per_device = Counter(proc.uuid for proc in processes)
    for sample in samples:
        uuid = sample.device.uuid
        _device_families(out, sample, _attribution(consumers.get(uuid, ())), per_device[uuid])
    if inp.devices and inp.owners is not None:
        _container_families(out, processes, inp.owners, view, consumers)
    if inp.orphan_memory is not None:
        _orphan_families(out, inp, pods, devices, processes, resolver)
    _self_families(out, inp)
    vendors = tuple((s.device.uuid, snapshot.vendor) for snapshot in inp.devices if snapshot.vendor
                    for s in snapshot.devices)
    return out.frame(inp.timestamp, vendors, inp.pod_labels)


# --- the cluster fallback for attribution ---------------------------------------------------------


def _with_cluster_pods(snapshot: PodResourcesSnapshot | None, view: _View) -> tuple[PodAllocation, ...]:
    """The kubelet's pods, plus claims the API server knows and the kubelet does not report.

    The kubelet stays authoritative about which pods run here: while it answers, only pods it
    lists (without any DRA claim) get their claims from the API server. Until it has ever
    answered, every running pod on the node does.
    """
    pods = list(snapshot.pods) if snapshot else []
    if view.cluster is None:
        return tuple(pods)
    index = {(p.namespace, p.name): i for i, p in enumerate(pods)}
    for info in view.cluster.pods:
        if info.phase != _RUNNING:
            continue
        at = index.get((info.namespace, info.name))
        if snapshot is not None and (at is None or any(c.claims for c in pods[at].containers)):
            continue
        derived = _containers_from_cluster(info, view)
        if at is None:
            pods.append(PodAllocation(info.namespace, info.name, derived))
        else:
            pods[at] = _merge_claims(pods[at], derived)
    return tuple(pods)


def _containers_from_cluster(pod: PodInfo, view: _View) -> tuple[ContainerAllocation, ...]:
    containers = []
    for ctr in pod.containers:
        uses = []
        for name in sorted({c.claim for c in ctr.claims if c.claim}):
            claim = view.claim(pod.namespace, name)
            if claim is None:
                continue
            wanted = {c.request for c in ctr.claims if c.claim == name}
            devices = {ClaimDevice(r.driver, r.pool, r.device, share_id=r.share_id) for r in claim.results
                       if "" in wanted or any(r.serves(w) for w in wanted)}
            uses.append(ClaimUse(pod.namespace, name, tuple(sorted(devices, key=_device_key))))
        if uses:
            containers.append(ContainerAllocation(ctr.name, tuple(uses)))
    return tuple(containers)


def _merge_claims(pod: PodAllocation, derived: Sequence[ContainerAllocation]) -> PodAllocation:
    claims = {c.name: c.claims for c in derived}
    merged = [ContainerAllocation(c.name, c.claims + claims.pop(c.name, ()), c.plugin_devices)
              for c in pod.containers]
    merged += [c for c in derived if c.name in claims]
    return PodAllocation(pod.namespace, pod.name, tuple(merged))


def _device_key(dev: ClaimDevice) -> tuple[str, str, str, str]:
    return dev.driver, dev.pool, dev.device, dev.share_id


# --- attribution ------------------------------------------------------------------------------


def _device_consumers(pods: Iterable[PodAllocation], devices: Sequence[GpuDevice], resolver: Resolver,
                      view: _View) -> dict[str, set[_Consumer]]:
    """NVML UUID → every (pod, container, claim, request) that holds it, monitoring claims excluded."""
    by_uuid: dict[str, set[_Consumer]] = defaultdict(set)
    gpu_by_index = {str(d.index): d.uuid for d in devices if not d.is_mig}
    for pod in pods:
        for container in pod.containers:
            for claim in container.claims:
                for uuid, consumer in _claim_consumers(pod, container.name, claim, resolver, view):
                    by_uuid[uuid].add(consumer)
            for plugin in container.plugin_devices:
                pod_uid = view.pod_uid(pod.namespace, pod.name, None)
                for uuid in _plugin_uuids(plugin, gpu_by_index):
                    by_uuid[uuid].add(_Consumer(pod.namespace, pod.name, pod_uid, container.name, "", ""))
    return by_uuid


def _plugin_uuids(plugin: PluginDevices, gpu_by_index: dict[str, str]) -> Iterator[str]:
    """The NVML UUIDs of an NVIDIA device plugin's allocation (GPUs by index or UUID, MIG devices)."""
    if plugin.resource_name != _PLUGIN_GPU_RESOURCE and not plugin.resource_name.startswith(_PLUGIN_MIG_PREFIX):
        return
    for device_id in plugin.device_ids:
        # Time-slicing replicas are announced as "<uuid>::<n>".
        device_id = device_id.split("::", 1)[0]
        yield gpu_by_index.get(device_id, device_id)


def _add_claim_holders(by_uuid: dict[str, set[_Consumer]], running: set[tuple[str, str]], resolver: Resolver,
                       view: _View) -> None:
    """Pods that hold a claim's device and that no container use accounts for: a pod-level claim no
    container references is prepared and reserved for its pod, yet the kubelet lists it under no
    container (seen on a real kubelet 1.36). Its devices still name the claim, the request of its
    allocation result and the pod (``container=""``). Only pods in the claim's ``reservedFor`` that
    run here (``running``: the kubelet's word while it answers), so an ended pod leaves at once."""
    for claim in view.claims.values():
        holders = [pod for ref in claim.reserved_for if ref.resource == "pods"
                   and (pod := view.pods_by_uid.get(ref.uid)) is not None and not pod.terminal
                   and (pod.namespace, pod.name) in running]
        for r in claim.results if holders else ():
            if r.admin_access or not (uuid := resolver.resolve(r.driver, r.pool, r.device)):
                continue
            known = by_uuid.get(uuid, set())
            for pod in holders:
                if not any((c.namespace, c.pod, c.claim) == (claim.namespace, pod.name, claim.name) for c in known):
                    by_uuid[uuid].add(_Consumer(claim.namespace, pod.name, pod.uid, "", claim.name, r.request))


def _claim_consumers(pod: PodAllocation, container: str, claim: ClaimUse, resolver: Resolver,
                     view: _View) -> Iterator[tuple[str, _Consumer]]:
    info = view.claim(claim.namespace, claim.name)
    pod_uid = view.pod_uid(pod.namespace, pod.name, info)
    for dev in claim.devices:
        use = view.device_use(pod, container, claim, dev)
        if use is None or use[0]:
            continue  # another request's device, or a monitoring (admin-access) one
        if uuid := resolver.resolve(dev.driver, dev.pool, dev.device):
            yield uuid, _Consumer(pod.namespace, pod.name, pod_uid, container, claim.name, use[1])


def _attribution(consumers: Iterable[_Consumer]) -> dict[str, str]:
    """Attribution labels for one device: a value only where every consumer agrees (rules 1-3)."""
    consumers = tuple(consumers)
    pods = {(c.namespace, c.pod) for c in consumers}
    claims = {c.claim for c in consumers}
    one = len(pods) == 1
    claim = _only(claims)
    return {
        "namespace": _only({c.namespace for c in consumers}),
        "pod": _only({p for _, p in pods}) if one else "",
        "pod_uid": _only({c.pod_uid for c in consumers}) if one else "",
        "container": _only({c.container for c in consumers}) if one else "",
        "claim": claim,
        # A request name means something only together with its claim.
        "request": _only({c.request for c in consumers}) if claim else "",
    }


def _only(values: set[str]) -> str:
    return next(iter(values)) if len(values) == 1 else ""


def _gpu_holders(devices: Sequence[GpuDevice], consumers: dict[str, set[_Consumer]]
                 ) -> Iterator[tuple[str, str, str, str]]:
    """(uuid, gpu, namespace, pod) for each physical GPU and each pod holding it or one of its MIG
    devices: NVLink links belong to the physical GPU."""
    for dev in devices:
        for c in consumers.get(dev.uuid, ()):
            yield dev.parent_uuid or dev.uuid, str(dev.index), c.namespace, c.pod


# --- families -----------------------------------------------------------------------------------


def _device_families(out: _Builder, sample: DeviceSample, attribution: dict[str, str], processes: int) -> None:
    dev = sample.device
    out.add(cat.GPU_INFO, 1, uuid=dev.uuid, gpu=str(dev.index), model=dev.model, pci_bus_id=dev.pci_bus_id,
            driver_version=dev.driver_version, profile=dev.profile, parent_uuid=dev.parent_uuid,
            mig_mode=dev.mig_mode, gpu_instance_id=_opt(dev.gi_id), compute_instance_id=_opt(dev.ci_id),
            # /dev/nvidia<minor> and NVIDIA's DRA name gpu-<minor>: not always the NVML index.
            minor=str(dev.minor))
    # Identity and attribution once per device; each family adds only its own labels to them.
    base = cat.device_labels(uuid=dev.uuid, gpu=str(dev.index), profile=dev.profile,
                             parent_uuid=dev.parent_uuid, **attribution)
    out.add_device(cat.GPU_UP, base, (), 1 if sample.up else 0)
    if sample.up:
        out.add_device(cat.GPU_PROCESSES, base, (), processes)
    samples = out.samples
    # The hot loop: ~30 readings per device, every cycle. Link and fabric identity (a
    # ``gpu_identity`` family) keeps only the GPU's identity of ``base``: who holds it does not change it.
    for reading in sample.readings:
        labels = _FAMILIES[reading.metric].device_series(base, reading.labels)
        samples[reading.metric].append(Sample(labels, reading.value))


def _claim_families(out: _Builder, pods: Iterable[PodAllocation], resolver: Resolver, view: _View,
                    allowed: cat.PodLabels) -> None:
    """Allocation and consumer info. Claims the API server knows come from their allocation
    results (real request names, admin access, UID); the others from the kubelet's view. Consumer
    info carries the pod's allowlisted labels."""
    for known in view.claims.values():
        for r in known.results:
            out.add(cat.CLAIM_ALLOCATION_INFO, 1, namespace=known.namespace, claim=known.name, claim_uid=known.uid,
                    request=r.request, driver=r.driver, pool=r.pool, device=r.device,
                    uuid=resolver.resolve(r.driver, r.pool, r.device) or "",
                    admin_access="true" if r.admin_access else "false")
    for pod in pods:
        seen = view.pods.get((pod.namespace, pod.name))
        pod_labels = allowed.pairs(dict(seen.labels) if seen else {}) if allowed else ()
        for container in pod.containers:
            for claim in container.claims:
                info = view.claim(claim.namespace, claim.name)
                monitoring = view.monitoring_claim(pod, claim)
                if info is None:
                    for dev in claim.devices:
                        out.add(cat.CLAIM_ALLOCATION_INFO, 1, namespace=claim.namespace, claim=claim.name,
                                claim_uid=_claim_uid_from_cdi(dev), request="", driver=dev.driver, pool=dev.pool,
                                device=dev.device, uuid=resolver.resolve(dev.driver, dev.pool, dev.device) or "",
                                admin_access="true" if monitoring else "false")
                if not monitoring:
                    out.add_with_pod_labels(cat.CLAIM_CONSUMER_INFO, 1, pod_labels, namespace=claim.namespace,
                                            claim=claim.name, pod=pod.name,
                                            pod_uid=view.pod_uid(pod.namespace, pod.name, info),
                                            container=container.name)


def _unprepared_families(out: _Builder, snapshot: PodResourcesSnapshot | None, view: _View) -> None:
    """Claims the kubelet lists for a pod with no devices: it lists a pod's claims before preparing
    them and keeps them so while NodePrepareResources fails (a real kubelet 1.36). The kubelet's own
    answer only: a claim the API server alone gives a pod is never "listed". Monitoring claims too
    (the exporter's own pod cannot start without it)."""
    for pod in snapshot.pods if snapshot else ():
        for container in pod.containers:
            for claim in container.claims:
                if not claim.devices:
                    out.add(cat.CLAIM_NOT_PREPARED, 1, namespace=claim.namespace, claim=claim.name, pod=pod.name,
                            pod_uid=view.pod_uid(pod.namespace, pod.name, view.claims.get((claim.namespace,
                                                                                          claim.name))))


def _cluster_families(out: _Builder, cluster: ClusterSnapshot, resolver: Resolver) -> None:
    """What the API server alone knows: slice devices, their taints (the slice's and the
    DeviceTaintRules' that select them), counters; claims' tolerations, consumed capacity,
    device conditions and network data."""
    # Counter consumption only for allocated devices: a partitionable GPU lists every possible
    # placement (~25 per H200), and only what is allocated takes anything from the counters.
    # Admin access does not allocate capacity.
    allocated = {(r.driver, r.pool, r.device) for c in cluster.claims for r in c.results if not r.admin_access}
    taint_rules = TaintRuleIndex(cluster.taint_rules)
    for sl in cluster.slices:
        for cs in sl.shared_counters:
            for counter, value in cs.counters:
                out.add(cat.DEVICE_SHARED_CAPACITY, value, driver=sl.driver, pool=sl.pool, counter_set=cs.name,
                        counter=counter)
        for dev in sl.devices:
            ident = {"driver": sl.driver, "pool": sl.pool, "device": dev.name}
            out.add(cat.DEVICE_INFO, 1, node=dev.node_name or sl.node_name or cluster.node, **ident,
                    uuid=resolver.resolve(sl.driver, sl.pool, dev.name) or "", type=dev.attribute(_ATTR_TYPE),
                    profile=dev.attribute(_ATTR_PROFILE), parent_uuid=dev.attribute(_ATTR_PARENT),
                    model=dev.model_name)
            rules = ((rule.taint, rule.name) for rule in taint_rules.matching(sl.driver, sl.pool, dev.name))
            for taint, rule in (*((t, "") for t in dev.taints), *rules):
                out.add(cat.DEVICE_TAINT, 1, **ident, key=taint.key, value=taint.value, effect=taint.effect,
                        rule=rule)
            for use in dev.consumes_counters if (sl.driver, sl.pool, dev.name) in allocated else ():
                for counter, value in use.counters:
                    out.add(cat.DEVICE_SHARED_CONSUMPTION, value, **ident, counter_set=use.counter_set,
                            counter=counter)
    for claim in cluster.claims:
        who = {"namespace": claim.namespace, "claim": claim.name}
        for r in claim.results:
            result = {**who, "request": r.request, "driver": r.driver, "pool": r.pool, "device": r.device}
            for tol in r.tolerations:
                out.add(cat.CLAIM_DEVICE_TOLERATION, 1, **result, key=tol.key, operator=tol.operator,
                        value=tol.value, effect=tol.effect)
            for capacity, value in r.consumed_capacity:
                out.add(cat.CLAIM_CONSUMED_CAPACITY, value, **result, share_id=r.share_id, capacity=capacity)
        for status in claim.devices:
            device = {**who, "driver": status.driver, "pool": status.pool, "device": status.device}
            for cond in status.conditions:
                out.add(cat.CLAIM_DEVICE_CONDITION, 1, **device, type=cond.type, status=cond.status)
            if (net := status.network) is not None:
                out.add(cat.CLAIM_DEVICE_NETWORK, 1, **device, interface=net.interface_name,
                        hardware_address=net.hardware_address, ips=",".join(net.ips))


def _health_families(out: _Builder, cluster: ClusterSnapshot, pods: Iterable[PodAllocation], view: _View) -> None:
    """``dra_device_health`` from the pods' ``allocatedResourcesStatus``, each device named by its
    triplet: a CDI-named entry is resolved first through the claim's UID and allocation results,
    then through the CDI names the kubelet lists. One nobody can name keeps its claim, pod and
    health with an empty triplet: an Unhealthy device must not vanish because of its name."""
    cdi_devices = _cdi_owners(pods)
    for pod in cluster.pods:
        if pod.terminal:
            continue
        for ctr in pod.containers:
            reported = set()
            for h in ctr.health:
                driver, pool, device = _health_device(pod.namespace, h, view, cdi_devices)
                reported.add((h.claim, driver, pool, device))
                out.add(cat.DEVICE_HEALTH, 1, namespace=pod.namespace, pod=pod.name, container=ctr.name,
                        claim=h.claim, request=_health_request(view.claim(pod.namespace, h.claim), h, driver, pool,
                                                               device),
                        driver=driver, pool=pool, device=device, health=h.health)
            # An extended resource backed by DRA (``nvidia.com/gpu: 1`` served by a DeviceClass, the
            # claim the scheduler made, ``ref=""``): the kubelet never reports its health (1.36), so
            # its devices would have no row at all. They are there, their health unknown.
            for use in ctr.claims:
                claim = view.claim(pod.namespace, use.claim) if not use.ref and use.claim else None
                for r in claim.results if claim else ():
                    if r.serves(use.request) and not r.admin_access and (
                            use.claim, r.driver, r.pool, r.device) not in reported:
                        out.add(cat.DEVICE_HEALTH, 1, namespace=pod.namespace, pod=pod.name, container=ctr.name,
                                claim=use.claim, request=r.request, driver=r.driver, pool=r.pool, device=r.device,
                                health="Unknown")


def _health_request(claim: ClaimInfo | None, health: DeviceHealth, driver: str, pool: str, device: str) -> str:
    """The request as every other family names it: the allocation result's (``acc/h100`` for a
    prioritized list's subrequest). The kubelet names its status entries ``claim:<name>`` for a
    container that references the whole claim and ``claim:<name>/<request>`` for one request, never
    the subrequest; without the claim's results its name is all there is."""
    results = claim.results_for(driver, pool, device) if claim else ()
    return _only({r.request for r in results if r.serves(health.request)}) or health.request


def _cdi_owners(pods: Iterable[PodAllocation]) -> dict[tuple[str, str, str], ClaimDevice]:
    """(namespace, claim, CDI name) → the device the kubelet lists it for. A device's list may
    also carry the CDI names of the driver's earlier devices of the claim (a kubelet quirk), so
    a name belongs to the first device that lists it."""
    owners: dict[tuple[str, str, str], ClaimDevice] = {}
    for pod in pods:
        for container in pod.containers:
            for claim in container.claims:
                for dev in claim.devices:
                    for name in dev.cdi_devices:
                        owners.setdefault((claim.namespace, claim.name, name), dev)
    return owners


def _health_device(namespace: str, health: DeviceHealth, view: _View,
                   cdi_devices: dict[tuple[str, str, str], ClaimDevice]) -> tuple[str, str, str]:
    if not health.cdi_id:
        return health.driver, health.pool, health.device
    claim = view.claim(namespace, health.claim)
    # NVIDIA (and the example driver) name a claim's device ``<vendor>/<class>=<claimUID>-<device>``.
    cdi_name = health.cdi_id.partition("=")[2]
    if claim is not None and claim.uid:
        for r in claim.results:
            if cdi_name == f"{claim.uid}-{r.device}":
                return r.driver, r.pool, r.device
    if dev := cdi_devices.get((namespace, health.claim, health.cdi_id)):
        return dev.driver, dev.pool, dev.device
    return "", "", ""


def _container_families(out: _Builder, processes: Iterable[ProcessSample], owners: ProcessOwnersSnapshot,
                        view: _View, consumers: dict[str, set[_Consumer]]) -> None:
    """Per-container shares of each device: the container's processes summed (rule 3's true shares).

    Processes whose pod is unknown count in ``dra_exporter_unattributed_gpu_processes``; they
    stay in the device totals but get no container series.
    """
    by_pid = {o.pid: o for o in owners.owners}
    memory: dict[Labels, float] = defaultdict(float)
    sm: dict[Labels, float] = defaultdict(float)
    unattributed = set(owners.unresolved)
    for proc in processes:
        owner = by_pid.get(proc.pid)
        if owner is None:
            unattributed.add(proc.pid)
            continue
        labels = _container_labels(proc.uuid, owner.pod_uid, owner.container_id, view,
                                   consumers.get(proc.uuid, ()))
        if proc.used_memory_bytes is not None:
            memory[labels] += proc.used_memory_bytes
        if proc.sm_utilization_ratio is not None:
            sm[labels] += proc.sm_utilization_ratio
    for labels, value in memory.items():
        out.add_labels(cat.CONTAINER_GPU_MEMORY_USED, labels, value)
    for labels, value in sm.items():
        out.add_labels(cat.CONTAINER_GPU_SM_UTILIZATION, labels, min(value, 1.0))
    out.add(cat.UNATTRIBUTED_PROCESSES, len(unattributed))


def _container_labels(uuid: str, pod_uid: str, container_id: str, view: _View,
                      consumers: Iterable[_Consumer]) -> Labels:
    """Names for a (pod UID, container ID) from the API server's pods; the claim when the
    device reached that container through exactly one claim."""
    pod = view.pods_by_uid.get(pod_uid)
    namespace = pod.namespace if pod else ""
    name = pod.name if pod else ""
    container = ""
    for ctr in pod.containers if pod else ():
        if ctr.container_id and bare_container_id(ctr.container_id) == container_id:
            container = ctr.name
    claims = {c.claim for c in consumers if (c.namespace, c.pod) == (namespace, name) and c.claim
              and (not container or c.container == container)} if pod else set()
    # Both container families have these labels; built once, they key the sums of both.
    return cat.CONTAINER_GPU_MEMORY_USED.series(uuid=uuid, namespace=namespace, pod=name, pod_uid=pod_uid,
                                                container=container, claim=_only(claims))


def _claim_uid_from_cdi(dev: ClaimDevice) -> str:
    """The claim UID NVIDIA embeds in CDI names; ``""`` for other drivers.

    The kubelet may list CDI names of earlier devices of the same claim on a later
    device (a known quirk), so only the name ending in this device's name counts.
    """
    suffix = "-" + dev.device
    for name in dev.cdi_devices:
        if name.startswith(_NVIDIA_CDI_PREFIX) and name.endswith(suffix):
            return name[len(_NVIDIA_CDI_PREFIX):-len(suffix)]
    return ""


def _orphan_families(out: _Builder, inp: JoinInput, pods: Sequence[PodAllocation], devices: Sequence[GpuDevice],
                     processes: Sequence[ProcessSample], resolver: Resolver) -> None:
    """What the node holds that no claim accounts for (``orphans``), each valued since when it is seen.

    Decided only from sources that are up now: a kubelet or API server that is down, or has not
    answered, leaves the question open (what was found stays found, nothing new is). What each
    kind needs is built only when there is something of that kind to judge (a spec, a MIG device,
    a process): most nodes have none of the first two, and the join runs every cycle."""
    memory = inp.orphan_memory
    assert memory is not None
    up = {h.source for h in inp.health if h.up}
    cluster = inp.cluster
    kube_up = cluster is not None and "kubeapi" in up
    pods_up = inp.pods is not None and "podresources" in up
    slices = cluster.slices if cluster else ()
    cdi = inp.cdi
    in_use_cdi: frozenset[str] = frozenset()
    uuid_of: dict[tuple[str, str], str] = {}
    if cdi is not None and cdi.devices:
        in_use_cdi = frozenset(name.partition("=")[2] for pod in pods for ctr in pod.containers
                               for claim in ctr.claims for dev in claim.devices for name in dev.cdi_devices)
        wanted = {(d.driver, d.device) for d in cdi.devices}
        uuid_of = {(sl.driver, dev.name): uuid for sl in slices for dev in sl.devices
                   if (sl.driver, dev.name) in wanted and (uuid := resolver.resolve(sl.driver, sl.pool, dev.name))}
    migs = any(d.is_mig for d in devices)
    held = _held_uuids(pods, devices, resolver, cluster) if migs or processes else frozenset()
    published = SliceResolver(slices).uuids() if migs else frozenset()
    for found in (
        orphans.prepared(cdi, cluster.claims if cluster else (), cluster.claim_census if cluster else None,
                         in_use_cdi, uuid_of, kube_up),
        orphans.mig_devices(devices, held, published, kube_up and pods_up),
        orphans.processes(processes, devices, held, pods_up),
    ):
        since = memory.since(found, inp.timestamp)
        for key, labels in found.orphans.items():
            out.add_labels(found.spec, labels, since[key])


def _held_uuids(pods: Iterable[PodAllocation], devices: Sequence[GpuDevice], resolver: Resolver,
                cluster: ClusterSnapshot | None) -> frozenset[str]:
    """Every device UUID a claim (allocated, or listed by the kubelet; monitoring ones too) or a
    device-plugin allocation names."""
    gpu_by_index = {str(d.index): d.uuid for d in devices if not d.is_mig}
    held: set[str | None] = set()
    for pod in pods:
        for container in pod.containers:
            held.update(resolver.resolve(d.driver, d.pool, d.device) for c in container.claims for d in c.devices)
            for plugin in container.plugin_devices:
                held.update(_plugin_uuids(plugin, gpu_by_index))
    for claim in cluster.claims if cluster else ():
        held.update(resolver.resolve(r.driver, r.pool, r.device) for r in claim.results)
    return frozenset(uuid for uuid in held if uuid)


def _self_families(out: _Builder, inp: JoinInput) -> None:
    for h in inp.health:
        out.add(cat.SOURCE_UP, 1 if h.up else 0, source=h.source)
        out.add(cat.COLLECT_DURATION, h.duration_seconds, source=h.source)
        out.add(cat.COLLECT_ERRORS, h.errors_total, source=h.source)
        out.add(cat.LAST_SUCCESS, h.last_success_timestamp, source=h.source)
    out.add(cat.BUILD_INFO, 1, version=inp.version, python_version=inp.python_version)


def _opt(value: int | None) -> str:
    return "" if value is None else str(value)
