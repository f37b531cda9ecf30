"""A scenario as Kubernetes objects: ResourceSlices, ResourceClaims and Pods as JSON dicts.

``cluster_objects(scenario, t)`` is what the simulated cluster's API server stores at
simulated time ``t``: the NVIDIA driver's ResourceSlice(s) for the node, the slices of
the scenario's other drivers, the claims that exist at ``t`` and the pods alive at
``t``. Objects are built in the shape of resource.k8s.io **v1** (the storage version);
``dra_exporter.dra_versions.convert`` turns them into any other served version, so the
server can answer v1, v1beta2 and v1beta1 requests from one store. A scenario loaded
from a cluster dump carries its own objects (``Scenario.raw_objects``); they are
returned unchanged. A node of a multi-node scenario (``Scenario.cluster``) gets every
node's objects, plus the ComputeDomains and their cliques.

Shapes follow ``reference/dra-api.md`` §2 and NVIDIA's driver (§4.1): one slice per node,
pool = node name, devices ``gpu-<minor>`` and MIG devices in the 25.12+ name format with
the attributes and capacities the driver publishes. Everything here is pure: no clock,
no I/O; timestamps are ``clock.FIXED_EPOCH + simulated seconds`` (no metric reads them). ``metadata.resourceVersion``
is the server's business and is not set here.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from dra_exporter import model
from dra_exporter.dra_versions import GROUP
from dra_exporter.quantity import quantity
from dra_exporter.resolve import NVIDIA_DRIVER, NvidiaNameResolver, canonical_profile

from .clock import FIXED_EPOCH
from .profile import MigProfile
from .scenario import (
    API_VERSIONS,
    CD_DRIVER,
    CHANNEL_REQUEST,
    DAEMON_REQUEST,
    Claim,
    ClusterScenario,
    Container,
    DriverSlice,
    Gpu,
    MigDevice,
    Pod,
    Scenario,
    SimComputeDomain,
    cdi_devices,
    derived_uuid,
    unit_hash,
)

#: ``/version`` answers of a cluster whose newest resource.k8s.io version is the key (v1: the release the
#: project's test bed runs, so that what the simulator serves is what that server accepts).
KUBERNETES_VERSIONS: Final = {"v1": "v1.36.2", "v1beta2": "v1.33.5", "v1beta1": "v1.32.9"}
#: The release whose API server first serves DeviceTaintRules in each version (behind the DRADeviceTaintRules
#: gate before 1.37): v1alpha3 from 1.33, v1beta2 from 1.36, v1 from 1.37.
TAINT_RULES_SINCE: Final = {"v1": "v1.37.0", "v1beta2": "v1.36.0", "v1alpha3": "v1.33.0"}
#: The namespace label without which the API server refuses admin-access claims (422).
ADMIN_ACCESS_LABEL: Final = "resource.kubernetes.io/admin-access"
#: The label every Namespace gets from the API server (1.21+), whatever its creator wrote.
NAMESPACE_NAME_LABEL: Final = "kubernetes.io/metadata.name"

JSON = dict[str, Any]

_BRAND: Final = "Nvidia"
# MIG capacities per compute-slice count on a Hopper GPU (NVIDIA's MIG user guide, H100/H200
# profiles); the simulator approximates engines by slice count.
_MIG_SMS: Final = {1: 16, 2: 32, 3: 60, 4: 64, 7: 132}
_GPU_SMS: Final = 132
_NODE_FIELD_SELECTOR_KEY: Final = "metadata.name"
_DELETE_PROTECTION: Final = "resource.kubernetes.io/delete-protection"
_POD_CLAIM_NAME: Final = "resource.kubernetes.io/pod-claim-name"
# NVIDIA's ComputeDomain objects (a multi-node scenario's).
CD_GROUP_VERSION: Final = "resource.nvidia.com/v1beta1"
DOMAIN_LABEL: Final = "resource.nvidia.com/computeDomain"
_FINALIZER: Final = "resource.nvidia.com/computeDomain"
# generateName suffixes use this alphabet (no vowels, no look-alikes), as the API server does.
_SUFFIX_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"


@dataclass(frozen=True, slots=True)
class ClusterObjects:
    """The objects of the simulated cluster at one instant, by resource."""

    resourceslices: tuple[JSON, ...] = ()
    resourceclaims: tuple[JSON, ...] = ()
    pods: tuple[JSON, ...] = ()
    devicetaintrules: tuple[JSON, ...] = ()
    nodes: tuple[JSON, ...] = ()
    deviceclasses: tuple[JSON, ...] = ()
    """Only from a scenario's own objects (a dump, a test): scenarios describe neither."""
    computedomains: tuple[JSON, ...] = ()
    """resource.nvidia.com/v1beta1 ComputeDomains (multi-node scenarios, dumps)."""
    computedomaincliques: tuple[JSON, ...] = ()
    namespaces: tuple[JSON, ...] = ()
    """The namespaces of the namespaced objects (``namespace_objects``)."""

    def by_resource(self) -> dict[str, tuple[JSON, ...]]:
        return {
            "resourceslices": self.resourceslices,
            "resourceclaims": self.resourceclaims,
            "pods": self.pods,
            "devicetaintrules": self.devicetaintrules,
            "nodes": self.nodes,
            "deviceclasses": self.deviceclasses,
            "computedomains": self.computedomains,
            "computedomaincliques": self.computedomaincliques,
            "namespaces": self.namespaces,
        }


#: NVIDIA's ComputeDomain kinds (resource.nvidia.com/v1beta1), served only where a scenario has them.
COMPUTE_DOMAIN_KINDS: Final = ("ComputeDomain", "ComputeDomainClique")


def serves_compute_domains(scenario: Scenario) -> bool:
    """Whether the simulated cluster has NVIDIA's ComputeDomain CRDs: a multi-node scenario with
    ComputeDomains, or a dump that holds such objects."""
    if scenario.cluster is not None:
        return bool(scenario.cluster.compute_domains)
    return any(o.get("kind") in COMPUTE_DOMAIN_KINDS for o in scenario.raw_objects)


def served_versions(preferred: str) -> tuple[str, ...]:
    """resource.k8s.io versions a cluster preferring ``preferred`` serves, newest first.

    A 1.34+ cluster serves v1 and still v1beta2/v1beta1; a 1.33 cluster v1beta2 and
    v1beta1; a 1.32 cluster only v1beta1.
    """
    if preferred not in API_VERSIONS:
        raise ValueError(f"unknown resource.k8s.io version {preferred!r} (known: {', '.join(API_VERSIONS)})")
    return API_VERSIONS[API_VERSIONS.index(preferred) :]


def _release(version: str) -> tuple[int, int]:
    major, minor = version.lstrip("v").split(".")[:2]
    return int(major), int(minor)


def taint_rule_versions(kubernetes_version: str) -> tuple[str, ...]:
    """The versions a cluster of ``kubernetes_version`` serves DeviceTaintRules in (its gate on), newest first."""
    release = _release(kubernetes_version)
    return tuple(v for v, since in TAINT_RULES_SINCE.items() if release >= _release(since))


def kubernetes_version(scenario: Scenario) -> str:
    """The release the simulated cluster is: the one of its newest resource.k8s.io version, or, when its
    objects hold DeviceTaintRules of a newer version (a 1.37 cluster's dump), the first that serves those."""
    rules = (str(o.get("apiVersion", "")).rpartition("/")[2] for o in scenario.raw_objects
             if o.get("kind") == "DeviceTaintRule")
    return release_serving(KUBERNETES_VERSIONS[scenario.api_version], rules)


def release_serving(release: str, rule_versions: Iterable[str]) -> str:
    """``release``, or the first release that serves DeviceTaintRules in all of ``rule_versions``."""
    for rule in rule_versions:
        if rule in TAINT_RULES_SINCE and _release(TAINT_RULES_SINCE[rule]) > _release(release):
            release = TAINT_RULES_SINCE[rule]
    return release


def timestamp(t: float) -> str:
    """RFC 3339 time of simulated second ``t`` on the simulated node's wall clock."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(FIXED_EPOCH + t))


def cluster_objects(scenario: Scenario, t: float) -> ClusterObjects:
    """Every object of the simulated cluster at simulated time ``t`` (see the module docstring)."""
    if scenario.raw_objects:
        return _raw_objects(scenario.raw_objects)
    if scenario.cluster is not None:
        return _cluster_objects(scenario.cluster, t)
    slices = (*nvidia_slices(scenario), *(driver_slice(scenario, s) for s in scenario.slices))
    claims = tuple(resource_claim(scenario, c, t) for c in scenario.claims_at(t))
    pods = tuple(pod(scenario, p) for p in scenario.pods_at(t))
    return ClusterObjects(
        resourceslices=tuple(r for s in slices for r in _rolled_out(scenario, s, t)),
        resourceclaims=claims,
        pods=pods,
        # The Node its slices name as their owner: an owner that does not exist gets them garbage-collected.
        nodes=(node_object(scenario.seed, scenario.node_name),),
        namespaces=namespace_objects(scenario.seed, (*claims, *pods)),
    )


def node_object(seed: int, name: str) -> JSON:
    """The Node ``name``, with the UID the node's slices name in their owner reference."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": derived_uuid(seed, "node", name), "creationTimestamp": timestamp(-86400),
                         "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
            "spec": {}}


def admin_access_requests(claim: Mapping[str, Any]) -> list[int]:
    """The indexes of a ResourceClaim's requests (any served version) that ask for admin access."""
    spec = claim.get("spec")
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    out = []
    for i, request in enumerate(requests if isinstance(requests, list) else ()):
        if not isinstance(request, Mapping):
            continue
        # v1/v1beta2 under ``exactly`` (``firstAvailable`` has no adminAccess); v1beta1 next to the name.
        exactly = request.get("exactly") if "exactly" in request else request
        if isinstance(exactly, Mapping) and exactly.get("adminAccess") is True:
            out.append(i)
    return out


def namespace_objects(seed: int, objects: Iterable[Mapping[str, Any]]) -> tuple[JSON, ...]:
    """The Namespaces of ``objects``, labelled as the API server requires: ``resource.kubernetes.io/
    admin-access: "true"`` where an admin-access claim lives (the server refuses the claim elsewhere)."""
    admin: dict[str, bool] = {}
    for obj in objects:
        ns = (obj.get("metadata") or {}).get("namespace")
        if ns:
            claim = obj.get("kind") == "ResourceClaim"
            admin[ns] = admin.get(ns, False) or (claim and bool(admin_access_requests(obj)))
    out = []
    for ns in sorted(admin):
        labels = {NAMESPACE_NAME_LABEL: ns, **({ADMIN_ACCESS_LABEL: "true"} if admin[ns] else {})}
        out.append({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": ns, "uid": derived_uuid(seed, "namespace", ns),
                                 "creationTimestamp": timestamp(-86400), "labels": labels},
                    "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}})
    return tuple(out)


def changes_key(scenario: Scenario, t: float) -> object:
    """Equal for two instants exactly when ``cluster_objects`` gives the same objects for both.

    Objects change only when a pod starts or ends or a device condition appears, so the
    API server can skip rebuilding them on most clock ticks.
    """
    if scenario.raw_objects:
        return ()
    if scenario.cluster is not None:
        return _cluster_changes(scenario.cluster, t)
    return (
        tuple(p.uid for p in scenario.pods_at(t)),
        tuple(c.at <= t for claim in scenario.claims for s in claim.device_status for c in s.conditions),
        tuple((f.at <= t, f.active_at(t)) for f in scenario.faults if f.kind == "driver_rollout"),
    )


def _rolled_out(scenario: Scenario, slice_: JSON, t: float) -> list[JSON]:
    """A slice as its driver's rolling updates (``driver_rollout`` faults) leave it at ``t``.

    Each rollout starts a second kubelet-plugin instance, which publishes the pool again under
    new slice names with the pool generation bumped; when the rollout ends (``until``) the old
    instance's slices, one generation lower, are deleted. In between both generations exist, as
    in a 1.33+ seamless upgrade; consumers use only the highest.
    """
    driver = slice_["spec"]["driver"]
    started = [f for f in scenario.faults
               if f.kind == "driver_rollout" and f.params["driver"] == driver and f.at <= t]
    if not started:
        return [slice_]
    generation = 1 + len(started)
    out = [_generation(scenario, slice_, generation)]
    if started[-1].active_at(t):
        out.append(_generation(scenario, slice_, generation - 1))
    return out


def _generation(scenario: Scenario, slice_: JSON, generation: int) -> JSON:
    if generation == 1:
        return slice_
    out = copy.deepcopy(slice_)
    meta = out["metadata"]
    meta["name"] = meta["generateName"] + _suffix(scenario.seed, meta["name"], str(generation))
    meta["uid"] = derived_uuid(scenario.seed, "k8s", "ResourceSlice", "", meta["name"])
    out["spec"]["pool"]["generation"] = generation
    return out


def _raw_objects(objects: Iterable[Mapping[str, Any]]) -> ClusterObjects:
    kinds = ("ResourceSlice", "ResourceClaim", "Pod", "DeviceTaintRule", "Node", "DeviceClass", *COMPUTE_DOMAIN_KINDS,
             "Namespace")
    by_kind: dict[str, list[JSON]] = {k: [] for k in kinds}
    for obj in objects:
        if obj.get("kind") in by_kind:
            by_kind[obj["kind"]].append(copy.deepcopy(dict(obj)))
    return ClusterObjects(*(tuple(by_kind[k]) for k in kinds))


# --- names and metadata ------------------------------------------------------------------------


def _suffix(seed: int, *parts: str) -> str:
    n = int(unit_hash(seed, "suffix", *parts) * len(_SUFFIX_ALPHABET) ** 5)
    out = ""
    for _ in range(5):
        n, i = divmod(n, len(_SUFFIX_ALPHABET))
        out += _SUFFIX_ALPHABET[i]
    return out


def object_metadata(
    seed: int, kind: str, name: str, namespace: str = "", uid: str = "", t: float = 0.0, **extra: Any
) -> JSON:
    meta: JSON = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    meta["uid"] = uid or derived_uuid(seed, "k8s", kind, namespace, name)
    meta["creationTimestamp"] = timestamp(t)
    meta.update({k: v for k, v in extra.items() if v})
    return meta


def _owner(kind: str, api_version: str, name: str, uid: str) -> JSON:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


# --- ResourceSlices ----------------------------------------------------------------------------


def binary_quantity(n: int) -> str:
    """``n`` as Kubernetes writes a BinarySI quantity: the largest exact binary suffix (``141Gi``)."""
    for suffix, size in (
        ("Ei", 1 << 60),
        ("Pi", 1 << 50),
        ("Ti", 1 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ):
        if n and n % size == 0:
            return f"{n // size}{suffix}"
    return str(n)


def _semver(version: str) -> str:
    """NVIDIA publishes versions as semver: ``580.159.04`` → ``580.159.4``."""
    parts = [str(int(p)) for p in version.split(".")[:3] if p.isdigit()]
    return ".".join(parts + ["0"] * (3 - len(parts)))


def _pci_bus_id(nvml_bus_id: str) -> str:
    """NVML's ``00000000:18:00.0`` → the attribute's ``0000:18:00.0``."""
    return nvml_bus_id[-12:].lower()


def _s(value: str) -> JSON:
    return {"string": value}


def _v(value: str) -> JSON:
    return {"version": value}


def _q(value: int | str) -> JSON:
    return {"value": str(value)}


def _taints(taints: Iterable[model.DeviceTaint]) -> list[JSON]:
    out = []
    for t in taints:
        taint: JSON = {"key": t.key, "effect": t.effect, "timeAdded": timestamp(0)}
        if t.value:
            taint["value"] = t.value
        out.append(taint)
    return out


def _common_attributes(scenario: Scenario, gpu: Gpu) -> JSON:
    profile = scenario.profile
    attrs: JSON = {"productName": _s(profile.model), "brand": _s(_BRAND)}
    # A replayed dump's profile knows only what its slices said: what they did not, is not published.
    if profile.architecture:
        attrs["architecture"] = _s(profile.architecture)
    if profile.cuda_compute_capability:
        attrs["cudaComputeCapability"] = _v(_semver(profile.cuda_compute_capability))
    if profile.cuda_driver_version:
        attrs["cudaDriverVersion"] = _v(_semver(profile.cuda_driver_version))
    attrs["driverVersion"] = _v(_semver(profile.driver_version))
    attrs["resource.kubernetes.io/pciBusID"] = _s(_pci_bus_id(gpu.pci_bus_id))
    attrs["addressingMode"] = _s("None")
    return attrs


def gpu_device(scenario: Scenario, gpu: Gpu) -> JSON:
    """The slice device NVIDIA's driver publishes for a whole GPU (v1 shape)."""
    device: JSON = {
        "name": f"gpu-{gpu.minor}",
        "attributes": {"type": _s("gpu"), "uuid": _s(gpu.uuid), **_common_attributes(scenario, gpu)},
        "capacity": {"memory": _q(binary_quantity(scenario.profile.memory_total))},
    }
    if gpu.taints:
        device["taints"] = _taints(gpu.taints)
    return device


def _mig_capacity(profile: MigProfile, memory: int, start: int) -> JSON:
    slices = profile.compute_slices
    media = profile.name.endswith("+me") or slices == 7
    capacity: JSON = {
        "multiprocessors": _q(_MIG_SMS.get(slices, 16 * slices)),
        "copyEngines": _q(slices + 1 if slices == 7 else slices),
        "decoders": _q(slices),
        "encoders": _q(0),
        "jpegEngines": _q(slices),
        "ofaEngines": _q(1 if media else 0),
        "memory": _q(binary_quantity(memory >> 20 << 20)),
    }
    capacity.update({f"memorySlice{i}": _q(1) for i in range(start, start + profile.memory_slices)})
    return capacity


def mig_device(
    scenario: Scenario,
    gpu: Gpu,
    profile: MigProfile,
    start: int,
    *,
    uuid: str = "",
    taints: Iterable[model.DeviceTaint] = (),
    name: str = "",
) -> JSON:
    """A MIG device as NVIDIA's driver publishes it; no ``uuid`` for a DynamicMIG placement.

    ``name`` defaults to the 25.12+ format (``gpu-0-mig-1g18gb-19-0``).
    """
    memory = int(scenario.profile.memory_total * profile.memory_slices / scenario.profile.mig_memory_slices)
    attrs: JSON = {"type": _s("mig")}
    if uuid:
        attrs["uuid"] = _s(uuid)
    attrs.update(parentUUID=_s(gpu.uuid), profile=_s(profile.name), **_common_attributes(scenario, gpu))
    device: JSON = {
        "name": name
        or f"gpu-{gpu.minor}-mig-{canonical_profile(profile.name)}-{profile.gi_profile_id}-{start}",
        "attributes": attrs,
        "capacity": _mig_capacity(profile, memory, start),
    }
    if published := _taints(taints):
        device["taints"] = published
    return device


def _slice(scenario: Scenario, driver: str, pool: str, count: int, index: int, spec_extra: JSON) -> JSON:
    name = f"{scenario.node_name}-{driver}-{_suffix(scenario.seed, driver, pool, str(index))}"
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "ResourceSlice",
        "metadata": object_metadata(
            scenario.seed,
            "ResourceSlice",
            name,
            generation=1,
            generateName=f"{scenario.node_name}-{driver}-",
            ownerReferences=[
                _owner(
                    "Node", "v1", scenario.node_name, derived_uuid(scenario.seed, "node", scenario.node_name)
                )
            ],
        ),
        "spec": {
            "driver": driver,
            "nodeName": scenario.node_name,
            "pool": {"name": pool, "generation": 1, "resourceSliceCount": count},
            **spec_extra,
        },
    }


def nvidia_slices(scenario: Scenario) -> tuple[JSON, ...]:
    """The ``gpu.nvidia.com`` slice(s) of the node: one slice, or partitionable ones (DynamicMIG)."""
    if scenario.dynamic_mig:
        return _partitionable_slices(scenario)
    names = _claimed_names(scenario)
    devices: list[JSON] = []
    for gpu in scenario.gpus:
        if not gpu.mig:
            devices.append(gpu_device(scenario, gpu))
            continue
        # A MIG-enabled GPU is published as its MIG devices only; the GPU itself cannot be allocated.
        # A MIG device made outside the driver (``published: false``) is in NVML only.
        for m in (m for m in gpu.mig if m.published):
            profile = scenario.profile.mig_profile(m.profile)
            assert profile is not None  # validated when the scenario was loaded
            devices.append(
                mig_device(
                    scenario,
                    gpu,
                    profile,
                    m.placement_start,
                    uuid=m.uuid,
                    taints=m.taints,
                    name=names.get(m.uuid, ""),
                )
            )
    return (_slice(scenario, NVIDIA_DRIVER, scenario.node_name, 1, 0, {"devices": devices}),)


def _claimed_names(scenario: Scenario) -> dict[str, str]:
    """NVML UUID → the device name the scenario's claims use for it.

    Claims name a device as the driver published it, so a scenario that allocates a MIG
    device by its older name (driver 25.3-25.8) gets a slice that publishes that name.
    """
    resolver = NvidiaNameResolver(scenario.gpu_devices())
    out: dict[str, str] = {}
    for claim in scenario.claims:
        if claim.driver == NVIDIA_DRIVER:
            for device in claim.devices:
                if (uuid := resolver.resolve(NVIDIA_DRIVER, scenario.node_name, device)) is not None:
                    out.setdefault(uuid, device)
    return out


def _counter_set_name(gpu: Gpu) -> str:
    return f"gpu-{gpu.minor}-counter-set"


def _counter_name(capacity: str) -> str:
    """NVIDIA's counter for a capacity: its name in DNS form (``copyEngines`` → ``copy-engines``)."""
    return "".join(f"-{c.lower()}" if c.isupper() else c for c in capacity)


def _engine_counters(capacity: JSON) -> JSON:
    """A MIG placement's capacities as the counters it consumes (memory slices are counters of their own)."""
    return {_counter_name(k): v for k, v in capacity.items() if not k.startswith("memorySlice")}


def _gpu_counters(scenario: Scenario) -> JSON:
    """A GPU's counter set as NVIDIA's driver publishes it: per capacity of its MIG placements the
    largest any placement has (multiprocessors, memory, copy/decoder/encoder/JPEG/OFA engines: one
    OFA engine, so one ``+me`` or 7g placement at a time), and one counter per memory slice."""
    largest: dict[str, tuple[float, JSON]] = {}
    for profile in scenario.profile.mig_profiles:
        memory = int(scenario.profile.memory_total * profile.memory_slices / scenario.profile.mig_memory_slices)
        for name, value in _engine_counters(_mig_capacity(profile, memory, 0)).items():
            number = quantity(value["value"]) or 0.0
            if name not in largest or number > largest[name][0]:
                largest[name] = (number, value)
    counters: JSON = {name: value for name, (_, value) in sorted(largest.items())}
    counters.update({f"memory-slice-{i}": _q(1) for i in range(scenario.profile.mig_memory_slices)})
    return counters


def _consumes(gpu: Gpu, counters: JSON) -> list[JSON]:
    return [{"counterSet": _counter_set_name(gpu), "counters": counters}]


def _partitionable_devices(scenario: Scenario, gpu: Gpu) -> list[JSON]:
    """The whole GPU and every MIG placement, each consuming the GPU's shared counters: the GPU all
    of them, a placement its capacities (engines included) and its memory slices."""
    whole = gpu_device(scenario, gpu)
    whole["consumesCounters"] = _consumes(gpu, _gpu_counters(scenario))
    devices = [whole]
    existing: dict[tuple[str, int], MigDevice] = {(m.profile, m.placement_start): m for m in gpu.mig}
    for profile in scenario.profile.mig_profiles:
        for start in profile.starts:
            mig = existing.get((profile.name, start))
            # Dynamic MIG devices have no UUID in the slice: they only exist once prepared.
            device = mig_device(scenario, gpu, profile, start, taints=mig.taints if mig else ())
            counters = _engine_counters(device["capacity"])
            counters.update({f"memory-slice-{i}": _q(1) for i in range(start, start + profile.memory_slices)})
            device["consumesCounters"] = _consumes(gpu, counters)
            devices.append(device)
    return devices


def _partitionable_slices(scenario: Scenario) -> tuple[JSON, ...]:
    counter_sets = [
        {"name": _counter_set_name(g), "counters": _gpu_counters(scenario)} for g in scenario.gpus
    ]
    node = scenario.node_name
    n = len(scenario.gpus)
    if scenario.api_version == "v1":
        # Kubernetes 1.35+: a slice holds either devices or shared counters, so the pool is one
        # counters-only slice plus one device slice per GPU.
        out = [_slice(scenario, NVIDIA_DRIVER, node, n + 1, 0, {"sharedCounters": counter_sets})]
        out += [
            _slice(
                scenario,
                NVIDIA_DRIVER,
                node,
                n + 1,
                g.index + 1,
                {"devices": _partitionable_devices(scenario, g)},
            )
            for g in scenario.gpus
        ]
        return tuple(out)
    # 1.33-1.34: counters live in the slice of the devices that consume them.
    return tuple(
        _slice(
            scenario,
            NVIDIA_DRIVER,
            node,
            n,
            g.index,
            {"sharedCounters": [counter_sets[g.index]], "devices": _partitionable_devices(scenario, g)},
        )
        for g in scenario.gpus
    )


def driver_slice(scenario: Scenario, driver_slice: DriverSlice) -> JSON:
    """Another driver's slice, as the scenario describes it (v1 shape)."""
    devices = []
    for d in driver_slice.devices:
        device: JSON = {"name": d.name}
        if d.attributes:
            device["attributes"] = {k: dict(v) for k, v in d.attributes.items()}
        if d.capacity:
            device["capacity"] = {k: _q(v) for k, v in d.capacity.items()}
        if d.taints:
            device["taints"] = _taints(d.taints)
        devices.append(device)
    return _slice(scenario, driver_slice.driver, driver_slice.pool, 1, 0, {"devices": devices})


# --- ResourceClaims ----------------------------------------------------------------------------


def _requests(claim: Claim) -> list[JSON]:
    out: list[JSON] = []
    for r in claim.all_requests():
        if r.first_available:
            out.append(
                {
                    "name": r.name,
                    "firstAvailable": [
                        {
                            "name": s.name,
                            "deviceClassName": s.device_class,
                            "allocationMode": "ExactCount",
                            "count": s.count,
                        }
                        for s in r.first_available
                    ],
                }
            )
            continue
        exactly: JSON = {"deviceClassName": r.device_class or _default_class(claim)}
        if r.all_devices:
            exactly["allocationMode"] = "All"
        else:
            exactly.update(allocationMode="ExactCount", count=len(r.devices))
        if claim.admin_access:
            exactly["adminAccess"] = True
        out.append({"name": r.name, "exactly": exactly})
    return out


def _default_class(claim: Claim) -> str:
    return "gpu.nvidia.com" if claim.driver == NVIDIA_DRIVER else claim.driver


def _results(claim: Claim) -> list[JSON]:
    out = []
    for r in claim.all_requests():
        for device in r.devices:
            result: JSON = {
                "request": r.result_name,
                "driver": claim.driver,
                "pool": claim.pool,
                "device": device,
            }
            if claim.admin_access:
                result["adminAccess"] = True
            out.append(result)
    return out


def _device_statuses(claim: Claim, t: float) -> list[JSON]:
    out = []
    for status in claim.device_status:
        conditions = [
            {
                "type": c.condition.type,
                "status": c.condition.status,
                "reason": c.condition.reason,
                "message": c.message,
                "lastTransitionTime": timestamp(c.at),
            }
            for c in status.conditions
            if c.at <= t
        ]
        if conditions:
            out.append(
                {
                    "driver": claim.driver,
                    "pool": claim.pool,
                    "device": status.device,
                    "conditions": conditions,
                }
            )
    return out


def resource_claim(scenario: Scenario, claim: Claim, t: float) -> JSON:
    """A claim allocated on the node, reserved for the pods alive at ``t`` that use it (v1 shape)."""
    consumers = scenario.consumers_at(claim, t)
    created = min((p.start for p in consumers), default=0.0) if claim.template else 0.0
    extra: JSON = {"generation": 1, "finalizers": [_DELETE_PROTECTION]}
    if claim.template and consumers:
        owner = consumers[0]
        extra.update(
            generateName=f"{owner.name}-{claim.pod_claim_name}-",
            annotations={_POD_CLAIM_NAME: claim.pod_claim_name},
            ownerReferences=[_owner("Pod", "v1", owner.name, owner.uid)],
        )
    allocation: JSON = {
        "devices": {"results": _results(claim)},
        "nodeSelector": {
            "nodeSelectorTerms": [
                {
                    "matchFields": [
                        {"key": _NODE_FIELD_SELECTOR_KEY, "operator": "In", "values": [scenario.node_name]}
                    ]
                }
            ]
        },
    }
    if scenario.api_version == "v1":
        allocation["allocationTimestamp"] = timestamp(created)  # a 1.34+ field
    status: JSON = {"allocation": allocation}
    if consumers:
        status["reservedFor"] = [{"resource": "pods", "name": p.name, "uid": p.uid} for p in consumers]
    if devices := _device_statuses(claim, t):
        status["devices"] = devices
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "ResourceClaim",
        "metadata": object_metadata(
            scenario.seed, "ResourceClaim", claim.name, claim.namespace, claim.uid, created, **extra
        ),
        "spec": {"devices": {"requests": _requests(claim)}},
        "status": status,
    }


# --- Pods --------------------------------------------------------------------------------------


def _container(container: Container, claims: Mapping[str, Claim]) -> JSON:
    out: JSON = {"name": container.name, "image": f"sim.local/{container.name}:latest"}
    resources: JSON = {}
    refs = []
    for name in container.claims:
        ref: JSON = {"name": claims[name].pod_claim_name}
        if request := container.request_for(name):
            ref["request"] = request
        refs.append(ref)
    if refs:
        resources["claims"] = refs
    if container.plugin_devices:
        resources["limits"] = {d.resource: str(len(d.ids)) for d in container.plugin_devices}
    if resources:
        out["resources"] = resources
    return out


def _allocated_resources_status(container: Container, claims: Mapping[str, Claim]) -> list[JSON]:
    # Reported only where the scenario gives health: a driver without health checks reports none.
    if not container.device_health:
        return []
    health = dict(container.device_health)
    out = []
    for name in container.claims:
        claim = claims[name]
        request = container.request_for(name)
        devices = [d for r in claim.all_requests() if not request or r.name == request for d in r.devices]
        out.append(
            {
                "name": f"claim:{claim.pod_claim_name}" + (f"/{request}" if request else ""),
                "resources": [
                    {"resourceID": _health_resource_id(claim, d), "health": health.get(d, "Healthy")}
                    for d in devices
                ],
            }
        )
    return out


def _health_resource_id(claim: Claim, device: str) -> str:
    """The kubelet names a device in ``allocatedResourcesStatus`` by its first CDI device ID when
    the driver returned one (NVIDIA always does), else ``driver/pool/device`` (kubernetes
    ``pkg/kubelet/cm/dra/manager.go``)."""
    cdi = cdi_devices(claim, device)
    return cdi[0] if cdi else f"{claim.driver}/{claim.pool}/{device}"


def _container_status(container: Container, claims: Mapping[str, Claim], started: str) -> JSON:
    status: JSON = {
        "name": container.name,
        "containerID": container.container_id,
        "image": f"sim.local/{container.name}:latest",
        "imageID": "",
        "ready": True,
        "restartCount": 0,
        "started": True,
        "state": {"running": {"startedAt": started}},
    }
    if health := _allocated_resources_status(container, claims):
        status["allocatedResourcesStatus"] = health
    return status


def pod(scenario: Scenario, p: Pod) -> JSON:
    """A running pod on the node, with its claim references and container statuses."""
    claims = {c.name: c for c in scenario.claims if c.namespace == p.namespace}
    used = list(dict.fromkeys(n for c in p.containers for n in c.claims))
    started = timestamp(p.start)
    spec: JSON = {
        "nodeName": scenario.node_name,
        "restartPolicy": "Always",
        "schedulerName": "default-scheduler",
        "containers": [_container(c, claims) for c in p.containers],
    }
    if used:
        spec["resourceClaims"] = [
            {
                "name": claims[n].pod_claim_name,
                **(
                    {"resourceClaimTemplateName": claims[n].template}
                    if claims[n].template
                    else {"resourceClaimName": n}
                ),
            }
            for n in used
        ]
    status: JSON = {
        "phase": "Running",
        "startTime": started,
        "conditions": [
            {"type": t, "status": "True", "lastTransitionTime": started}
            for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ],
        "containerStatuses": [_container_status(c, claims, started) for c in p.containers],
        "qosClass": "BestEffort",
    }
    # The resourceclaim controller records which claim it generated for each template reference.
    generated = [
        {"name": claims[n].pod_claim_name, "resourceClaimName": n} for n in used if claims[n].template
    ]
    if generated:
        status["resourceClaimStatuses"] = generated
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": object_metadata(scenario.seed, "Pod", p.name, p.namespace, p.uid, p.start,
                                    labels=dict(p.labels)),
        "spec": spec,
        "status": status,
    }


# --- a multi-node scenario's objects -----------------------------------------------------------------


def _cluster_objects(cluster: ClusterScenario, t: float) -> ClusterObjects:
    """Every object of the simulated cluster at ``t``: each node's, plus ComputeDomains and cliques."""
    parts = [cluster_objects(n, t) for n in cluster.nodes]
    claims = tuple(_with_config(cluster, c) for p in parts for c in p.resourceclaims)
    domains = tuple(compute_domain(cluster, d, t) for d in cluster.compute_domains)
    cliques = tuple(c for d in cluster.compute_domains if d.cliques for c in cliques_of(cluster, d, t))
    pods = tuple(o for p in parts for o in p.pods)
    return ClusterObjects(
        resourceslices=tuple(s for p in parts for s in p.resourceslices),
        resourceclaims=claims,
        pods=pods,
        nodes=tuple(n for p in parts for n in p.nodes),
        computedomains=domains,
        computedomaincliques=cliques,
        namespaces=namespace_objects(cluster.nodes[0].seed if cluster.nodes else 0,
                                     (*claims, *pods, *domains, *cliques)),
    )


def _cluster_changes(cluster: ClusterScenario, t: float) -> object:
    """Equal for two instants exactly when ``_cluster_objects`` gives the same objects (see ``changes_key``)."""
    return (tuple(changes_key(n, t) for n in cluster.nodes), tuple(f.active_at(t) for f in cluster.faults))


def _with_config(cluster: ClusterScenario, claim: JSON) -> JSON:
    """A compute-domain claim with the opaque config its template gives it (``status.allocation
    .devices.config``: the driver reads it at prepare time; the exporter reads the domain's UID there)."""
    meta = claim["metadata"]
    results = claim["status"]["allocation"]["devices"]["results"]
    if not any(r["driver"] == CD_DRIVER for r in results):
        return claim
    domain_name = cluster.channel_claims.get((meta["namespace"], meta["name"]))
    if domain_name is not None:
        domain = cluster.domain(meta["namespace"], domain_name)
        assert domain is not None
        request, params = CHANNEL_REQUEST, {"kind": "ComputeDomainChannelConfig", "domainID": domain.uid}
        if domain.status_form != "v25.3":
            params["allocationMode"] = domain.allocation_mode
    else:  # a daemon's claim: its template names the domain by UID
        uid = str(meta.get("annotations", {}).get("resource.kubernetes.io/pod-claim-name", ""))
        uid = uid.removeprefix("computedomain-daemon-")
        request, params = DAEMON_REQUEST, {"kind": "ComputeDomainDaemonConfig", "domainID": uid}
    out = copy.deepcopy(claim)
    config = {"source": "FromClaim", "requests": [request],
              "opaque": {"driver": CD_DRIVER, "parameters": {"apiVersion": CD_GROUP_VERSION, **params}}}
    out["status"]["allocation"]["devices"]["config"] = [config]
    out["spec"]["devices"]["config"] = [{k: v for k, v in config.items() if k != "source"}]
    return out


def _daemon(cluster: ClusterScenario, d: SimComputeDomain, index: int, node: str, t: float) -> JSON:
    entry: JSON = {"name": node, "ipAddress": f"10.244.{cluster.nodes.index(cluster.node(node)) + 1}.{10 + index}",
                   "cliqueID": d.clique}
    if d.status_form != "v25.3":
        entry["index"] = index
        entry["status"] = "NotReady" if cluster.imex_not_ready(node, t) else "Ready"
    return entry


def compute_domain(cluster: ClusterScenario, d: SimComputeDomain, t: float) -> JSON:
    """The ComputeDomain as the driver's controller writes it at ``t``."""
    nodes = [_daemon(cluster, d, i, n, t) for i, n in enumerate(d.nodes)]
    if d.status_form == "v25.3":
        # v25.3 lists a node once its daemon is up, and has no per-node status.
        nodes = [n for n in nodes if not cluster.imex_not_ready(n["name"], t)]
        ready = len(nodes) == len(d.nodes) and len(nodes) >= d.num_nodes
    else:
        ready = all(n["status"] == "Ready" for n in nodes) and len(nodes) >= d.num_nodes
    channel: JSON = {"resourceClaimTemplate": {"name": d.channel_template}}
    if d.status_form != "v25.3":
        channel["allocationMode"] = d.allocation_mode
    return {
        "apiVersion": CD_GROUP_VERSION,
        "kind": "ComputeDomain",
        "metadata": object_metadata(0, "ComputeDomain", d.name, d.namespace, d.uid, generation=1,
                              finalizers=[_FINALIZER]),
        "spec": {"numNodes": d.num_nodes, "channel": channel},
        "status": {"status": "Ready" if ready else "NotReady", "nodes": nodes},
    }


def cliques_of(cluster: ClusterScenario, d: SimComputeDomain, t: float) -> list[JSON]:
    """The domain's ComputeDomainCliques (one: every member is in the cluster's one clique)."""
    name = f"{d.uid}.{d.clique}"
    return [{
        "apiVersion": CD_GROUP_VERSION,
        "kind": "ComputeDomainClique",
        "metadata": object_metadata(0, "ComputeDomainClique", name, cluster.driver_namespace,
                              derived_uuid(0, "clique", name),
                              labels={DOMAIN_LABEL: d.uid, f"{DOMAIN_LABEL}.cliqueID": d.clique}),
        "daemons": [{("nodeName" if k == "name" else k): v for k, v in _daemon(cluster, d, i, n, t).items()}
                    for i, n in enumerate(d.nodes)],
    }]
