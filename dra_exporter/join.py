"""The join: latest source snapshots in, one labelled ``Frame`` out.

A pure function (no I/O, no clock, no logging). It owns every attribution rule of
DESIGN §3, so the rules are tested without sockets, threads or GPUs:

1. A device with no allocation still reports, with empty attribution labels.
2. A device held by one pod carries namespace, pod and claim; ``container`` is set
   when exactly one container of that pod references the device.
3. A device used by several pods keeps ONE series with ``pod=""``;
   ``dra_claim_consumer_info`` lists every consumer. Values are never copied.
4. Admin-access (monitoring) claims never count as consumers.
5. Pods and claims that are gone leave the next frame (nothing is remembered here).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from . import catalog as cat
from .model import (
    ClaimDevice,
    DeviceSample,
    Family,
    Frame,
    GpuDevice,
    Labels,
    NvmlSnapshot,
    PodAllocation,
    PodResourcesSnapshot,
    Sample,
    SourceHealth,
)
from .resolve import ChainResolver, NvidiaNameResolver, Resolver

#: Device-plugin resource names whose ids are NVIDIA GPU or MIG devices.
_PLUGIN_GPU_RESOURCE = "nvidia.com/gpu"
_PLUGIN_MIG_PREFIX = "nvidia.com/mig-"
#: NVIDIA CDI device names embed the claim UID: ``k8s.gpu.nvidia.com/claim=<uid>-<device>``.
_NVIDIA_CDI_PREFIX = "k8s.gpu.nvidia.com/claim="


@dataclass(frozen=True, slots=True)
class JoinInput:
    """Everything the join looks at: the latest snapshot of each source and static facts."""

    nvml: NvmlSnapshot | None = None
    pods: PodResourcesSnapshot | None = None
    health: tuple[SourceHealth, ...] = ()
    self_pod: tuple[str, str] | None = None
    """(namespace, name) of the exporter's own pod: its claims are monitoring claims (rule 4)."""
    resolvers: tuple[Resolver, ...] = ()
    """Resolvers asked before NVIDIA name parsing (e.g. ResourceSlice attributes)."""
    version: str = ""
    python_version: str = ""
    timestamp: float = 0.0


@dataclass(frozen=True, slots=True)
class _Consumer:
    namespace: str
    pod: str
    container: str
    claim: str


@dataclass(slots=True)
class _Builder:
    """Collects samples per family, then emits them in catalogue order, sorted."""

    samples: dict[str, list[Sample]] = field(default_factory=lambda: defaultdict(list))

    def add(self, name: str, labels: Labels, value: float) -> None:
        self.samples[name].append(Sample(labels, float(value)))

    def frame(self, timestamp: float) -> Frame:
        families = []
        for spec in cat.CATALOG:
            found = self.samples.get(spec.name)
            if found:
                # One sample per label set: a duplicate would make the exposition invalid.
                unique = {s.labels: s for s in found}
                families.append(Family(spec.name, tuple(sorted(unique.values(), key=lambda s: s.labels))))
        return Frame(tuple(families), timestamp)


def join(inp: JoinInput) -> Frame:
    """Build the frame for one cycle from the latest snapshots."""
    out = _Builder()
    devices = [s.device for s in inp.nvml.devices] if inp.nvml else []
    resolver = ChainResolver((*inp.resolvers, NvidiaNameResolver(devices)))
    pods = inp.pods.pods if inp.pods else ()

    consumers = _device_consumers(pods, devices, resolver, inp.self_pod)
    _claim_families(out, pods, resolver, inp.self_pod)
    if inp.nvml:
        for sample in inp.nvml.devices:
            _device_families(out, sample, _attribution(consumers.get(sample.device.uuid, ())))
    _self_families(out, inp)
    return out.frame(inp.timestamp)


# --- attribution ------------------------------------------------------------------------------


def _device_consumers(pods: Iterable[PodAllocation], devices: Sequence[GpuDevice], resolver: Resolver,
                      self_pod: tuple[str, str] | None) -> dict[str, set[_Consumer]]:
    """NVML UUID → every (pod, container, claim) that holds it, monitoring claims excluded."""
    by_uuid: dict[str, set[_Consumer]] = defaultdict(set)
    gpu_by_index = {str(d.index): d.uuid for d in devices if not d.is_mig}
    for pod in pods:
        if (pod.namespace, pod.name) == self_pod:
            continue
        for container in pod.containers:
            for claim in container.claims:
                for dev in claim.devices:
                    if uuid := resolver.resolve(dev.driver, dev.pool, dev.device):
                        by_uuid[uuid].add(_Consumer(pod.namespace, pod.name, container.name, claim.name))
            for plugin in container.plugin_devices:
                if plugin.resource_name != _PLUGIN_GPU_RESOURCE and not plugin.resource_name.startswith(
                        _PLUGIN_MIG_PREFIX):
                    continue
                for device_id in plugin.device_ids:
                    # Time-slicing replicas are announced as "<uuid>::<n>".
                    device_id = device_id.split("::", 1)[0]
                    uuid = gpu_by_index.get(device_id, device_id)
                    by_uuid[uuid].add(_Consumer(pod.namespace, pod.name, container.name, ""))
    return by_uuid


def _attribution(consumers: Iterable[_Consumer]) -> Labels:
    """Attribution labels for one device: a value only where every consumer agrees (rules 1-3)."""
    consumers = tuple(consumers)
    pods = {(c.namespace, c.pod) for c in consumers}
    namespaces = {c.namespace for c in consumers}
    claims = {c.claim for c in consumers}
    containers = {c.container for c in consumers}
    one = len(pods) == 1
    return (
        ("namespace", _only(namespaces)),
        ("pod", _only({p for _, p in pods}) if one else ""),
        ("container", _only(containers) if one else ""),
        ("claim", _only(claims)),
    )


def _only(values: set[str]) -> str:
    return next(iter(values)) if len(values) == 1 else ""


# --- families -----------------------------------------------------------------------------------


def _device_families(out: _Builder, sample: DeviceSample, attribution: Labels) -> None:
    dev = sample.device
    out.add(cat.GPU_INFO, (
        ("uuid", dev.uuid), ("gpu", str(dev.index)), ("model", dev.model), ("pci_bus_id", dev.pci_bus_id),
        ("driver_version", dev.driver_version), ("profile", dev.profile), ("parent_uuid", dev.parent_uuid),
        ("mig_mode", dev.mig_mode), ("gpu_instance_id", _opt(dev.gi_id)),
        ("compute_instance_id", _opt(dev.ci_id)),
    ), 1)
    base = (("uuid", dev.uuid), ("gpu", str(dev.index)), ("profile", dev.profile),
            ("parent_uuid", dev.parent_uuid), *attribution)
    out.add(cat.GPU_UP, base, 1 if sample.up else 0)
    for reading in sample.readings:
        out.add(reading.metric, base + reading.labels, reading.value)


def _claim_families(out: _Builder, pods: Iterable[PodAllocation], resolver: Resolver,
                    self_pod: tuple[str, str] | None) -> None:
    for pod in pods:
        monitoring = (pod.namespace, pod.name) == self_pod
        for container in pod.containers:
            for claim in container.claims:
                for dev in claim.devices:
                    out.add(cat.CLAIM_ALLOCATION_INFO, (
                        ("namespace", claim.namespace), ("claim", claim.name),
                        ("claim_uid", _claim_uid_from_cdi(dev)), ("request", ""),
                        ("driver", dev.driver), ("pool", dev.pool), ("device", dev.device),
                        ("uuid", resolver.resolve(dev.driver, dev.pool, dev.device) or ""),
                        ("admin_access", "true" if monitoring else "false"),
                    ), 1)
                if not monitoring:
                    out.add(cat.CLAIM_CONSUMER_INFO, (
                        ("namespace", claim.namespace), ("claim", claim.name), ("pod", pod.name),
                        ("pod_uid", ""), ("container", container.name),
                    ), 1)


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


def _self_families(out: _Builder, inp: JoinInput) -> None:
    for h in inp.health:
        src = (("source", h.source),)
        out.add(cat.SOURCE_UP, src, 1 if h.up else 0)
        out.add(cat.COLLECT_DURATION, src, h.duration_seconds)
        out.add(cat.COLLECT_ERRORS, src, h.errors_total)
        out.add(cat.LAST_SUCCESS, src, h.last_success_timestamp)
    out.add(cat.BUILD_INFO, (("version", inp.version), ("python_version", inp.python_version)), 1)


def _opt(value: int | None) -> str:
    return "" if value is None else str(value)
