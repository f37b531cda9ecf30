"""Cluster dumps as scenarios: one node of a real cluster, replayed by the simulator.

``kubectl get resourceslices,resourceclaims,pods -A -o yaml`` (a ``kind: List``), or a
multi-document YAML of such objects, in resource.k8s.io v1, v1beta2 or v1beta1, becomes
the ``Scenario`` of one node. The objects are read by the exporter's own reader
(``dra_exporter.sources.kubeapi_normalize``) into the exporter's records (``dra_exporter.model``),
exactly as the exporter reads them from an API server, so the dump is replayed as the exporter
would see that cluster; this module only checks the envelope (kind, apiVersion, names) and
turns the records into a scenario:

* **GPUs** from the node's ``gpu.nvidia.com`` slices (``spec.nodeName``, newest pool
  generation): ``type: gpu`` devices give a GPU with their ``uuid``, the index from the name
  ``gpu-<minor>``; ``type: mig`` devices give MIG devices (``parentUUID``, ``profile``,
  placement from the name, in either NVIDIA format). A MIG device without a ``uuid``
  (DynamicMIG) exists only when a claim on the node has it allocated. Unpublished minors
  in between become plain GPUs, since NVML numbers GPUs without gaps.
* **What the GPUs are** (``Hardware``): model, memory, driver version, architecture (GPM or
  not), MIG profiles and PCI bus ids from the same slices (``profile.identified``). A node
  with only other drivers' slices has no GPU: NVML fails to initialise there, as without
  NVIDIA's driver.
* **The kubelet's view**: claims with allocation results in the node's pools (any driver),
  consumed by the node's running pods through ``spec.resourceClaims`` (+
  ``status.resourceClaimStatuses`` for generated claims), or, for pods missing from the
  dump, by the pods in the claim's ``status.reservedFor`` (one container named ``unknown``).
* **The API server's view**: the dump's objects, kept as they are (``Scenario.raw_objects``).

No GPU processes are invented: the GPUs are idle. Partial dumps (no pods, other drivers,
null fields) load, and a field of the wrong type reads as empty, as it does for the exporter;
a dump that cannot make a node is a ``ScenarioError`` naming the object as
``kind/namespace/name`` and the field.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from dra_exporter import model
from dra_exporter.dra_versions import GROUP, device_fields_path
from dra_exporter.resolve import NVIDIA_DRIVER, NvidiaDeviceName, canonical_profile, parse_nvidia_device_name
from dra_exporter.sources.kubeapi_normalize import (
    claim_from_dict,
    current_slices,
    noting_wrong_types,
    pod_from_dict,
    slice_from_dict,
)

from . import admission
from .duplicates import refuse_duplicates
from .profile import MigProfile, identified, known_mig_profiles, load_profile, mig_profile_from_slice
from .scenario import API_VERSIONS, DEVICE_HEALTH, MAX_GPUS, Hardware, Scenario, ScenarioError
from .scenario_builder import not_an_object, parse_scenario

KINDS: Final = ("ResourceSlice", "ResourceClaim", "Pod")
#: Core kinds the dump may hold that are served as they are: their labels say what the server admits
#: (a Namespace's admin-access label) and what owns the slices (a Node).
SERVED_AS_THEY_ARE: Final = ("Namespace", "Node")
#: NVIDIA's ComputeDomain objects: not part of the node's hardware or kubelet view, only served as they are.
CD_KINDS: Final = ("ComputeDomain", "ComputeDomainClique")
_CD_API_VERSION: Final = "resource.nvidia.com/v1beta1"
#: The recording whose answers (power, clocks, fields) every replayed GPU gives; see ``profile.identified``.
RECORDED_MODEL: Final = "h200"
#: Memory slices of the GPUs the MIG table knows (A100, H100, H200): eight.
RECORDED_MEMORY_SLICES: Final = 8
_PCI_BUS_ID: Final = "resource.kubernetes.io/pciBusID"
#: The attribute's name in NVIDIA's driver up to 25.8.
_PCI_BUS_ID_BEFORE_25_12: Final = "pcieBusID"
_PCI_ADDRESS: Final = re.compile(
    r"(?:(?P<domain>[0-9a-fA-F]{4,8}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<device>[0-9a-fA-F]{2})\.(?P<function>[0-7])"
)
_MEMORY_SLICE: Final = re.compile(r"memorySlice[0-9]+")
#: Container name given to pods known only from a claim's ``reservedFor``.
UNKNOWN_CONTAINER: Final = "unknown"


def is_dump(docs: list[Any]) -> bool:
    """Whether parsed YAML documents are Kubernetes objects rather than a scenario."""
    return any(isinstance(d, Mapping) and "kind" in d and "apiVersion" in d and "gpus" not in d for d in docs)


def parse_dump(docs: list[Any], label: str, node_name: str | None = None) -> Scenario:
    """Parsed dump documents → ``Scenario``; see the module docstring."""
    objects = _Objects.read(docs, label)
    admission.check((item for item, _ in kubernetes_objects(docs, label)), label)
    node = _choose_node(objects, label, node_name)
    builder = _DumpBuilder(label, node, objects)
    data = builder.scenario_document()
    try:
        scenario = parse_scenario(data, label, builder.hardware)
    except ScenarioError as e:
        # Only reachable for dumps the checks here let through; say that it is about the dump.
        raise ScenarioError(f"{label}: node {node!r} of the dump is not a consistent node: {e}") from None
    return dataclasses.replace(scenario, raw_objects=objects.raw)


# --- objects --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Obj:
    """Where one object of the dump is, for error messages."""

    label: str
    kind: str
    namespace: str
    name: str
    version: str
    """resource.k8s.io version (``v1beta1``…), ``v1`` for core objects."""

    def where(self) -> str:
        return "/".join(p for p in (self.kind, self.namespace, self.name) if p)

    def error(self, field: str, message: str) -> ScenarioError:
        return ScenarioError(f"{self.label}: {self.where()}: {field}: {message}")


@dataclass(frozen=True, slots=True)
class _Slice:
    obj: _Obj
    info: model.ResourceSliceInfo


@dataclass(frozen=True, slots=True)
class _Claim:
    obj: _Obj
    info: model.ClaimInfo
    requests: tuple[model.DeviceRequestInfo, ...]


@dataclass(frozen=True, slots=True)
class _Pod:
    obj: _Obj
    info: model.PodInfo
    node_name: str
    """``spec.nodeName``: the exporter never reads it from a pod (it lists its node's pods by it)."""


@dataclass(frozen=True, slots=True)
class _Objects:
    """The dump's objects the simulated node needs, as the exporter reads them, in dump order."""

    slices: tuple[_Slice, ...]
    claims: tuple[_Claim, ...]
    pods: tuple[_Pod, ...]
    raw: tuple[dict[str, Any], ...]
    """The same objects as written (timestamps as strings), served by the simulated API server."""

    @classmethod
    def read(cls, docs: list[Any], label: str) -> _Objects:
        slices: list[_Slice] = []
        claims: list[_Claim] = []
        pods: list[_Pod] = []
        raw: list[dict[str, Any]] = []
        for item, _where in kubernetes_objects(docs, label):
            kind, api_version = str(item["kind"]), str(item["apiVersion"])
            if kind in CD_KINDS:
                raw.append(_compute_domain_object(as_json(item), label))
                continue
            if kind in SERVED_AS_THEY_ARE and api_version == "v1":
                raw.append(as_json(item))
                continue
            if kind not in KINDS:
                continue  # DeviceClasses, templates, nodes…: nothing the simulated node needs
            obj = as_json(item)
            group, _, version = api_version.rpartition("/")
            # The exporter's own reader, told to note fields of the wrong type: it reads them as absent
            # (as it must for an API server's answer), a dump with one is refused, naming the field.
            with noting_wrong_types() as wrong:
                if kind == "ResourceSlice":
                    info = slice_from_dict(obj, version)
                    place = _Obj(label, kind, "", info.name, version)
                elif kind == "ResourceClaim":
                    claim = claim_from_dict(obj, version)
                    place = _Obj(label, kind, claim.namespace, claim.name, version)
                else:
                    pod = pod_from_dict(obj)
                    place = _Obj(label, kind, pod.namespace, pod.name, version)
            if wrong:
                field, _, what = wrong[0].partition(": ")
                raise place.error(field, f"{what} (a value of the wrong type)")
            if not place.name:
                raise place.error("metadata.name", "required")
            expected = GROUP if kind != "Pod" else ""
            if group != expected or version not in (API_VERSIONS if expected else ("v1",)):
                served = ", ".join(f"{GROUP}/{v}" for v in API_VERSIONS) if expected else "v1"
                raise place.error("apiVersion", f"{api_version!r} is not supported (supported: {served})")
            if kind == "ResourceSlice":
                slices.append(_Slice(place, info))
            elif not place.namespace:
                raise place.error("metadata.namespace", f"required for a {kind}")
            elif kind == "ResourceClaim":
                claims.append(_Claim(place, claim, claim.requests))
            else:
                node = _map(obj.get("spec")).get("nodeName")
                pods.append(_Pod(place, pod, node if isinstance(node, str) else ""))
            raw.append(admission.defaulted(obj))
        refuse_duplicates(raw, label)
        return cls(tuple(slices), tuple(claims), tuple(pods), tuple(raw))


def _compute_domain_object(obj: dict[str, Any], label: str) -> dict[str, Any]:
    """A ComputeDomain or ComputeDomainClique of the dump, checked: served as it is."""
    meta = _map(obj.get("metadata"))
    name, namespace = meta.get("name"), meta.get("namespace")
    place = _Obj(label, str(obj["kind"]), namespace if isinstance(namespace, str) else "",
                 name if isinstance(name, str) else "", "")
    if not place.name or not place.namespace:
        raise place.error("metadata", "name and namespace are required")
    if obj["apiVersion"] != _CD_API_VERSION:
        raise place.error("apiVersion", f"{obj['apiVersion']!r} is not supported (supported: {_CD_API_VERSION})")
    return obj


def kubernetes_objects(docs: list[Any], label: str) -> Iterator[tuple[Mapping[str, Any], str]]:
    """Every object of the documents (a ``kind: List``'s items or the document itself), each with
    where it is for messages (``<label>: document 2: items[3]``); the envelope is checked here, for
    a node's dump and for the cluster mode's (``cluster.load_cluster_dump``)."""
    for d, doc in enumerate(docs):
        if doc is None:
            continue
        where = f"{label}: document {d + 1}" if len(docs) > 1 else label
        if not isinstance(doc, Mapping):
            raise ScenarioError(
                f"{where}: expected a Kubernetes object or a kind: List, got {type(doc).__name__}"
            )
        items = doc.get("items") if str(doc.get("kind", "")).endswith("List") else [doc]
        if not isinstance(items, list):
            raise ScenarioError(f"{where}: items: expected a list of objects")
        for i, item in enumerate(items):
            problem = not_an_object(item)
            if problem is not None:
                raise ScenarioError(f"{where}: items[{i}]: {problem}")
            yield item, f"{where}: items[{i}]"


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def as_json(value: Any) -> Any:
    """YAML values as JSON would have them: unquoted timestamps back to RFC 3339 strings."""
    if isinstance(value, Mapping):
        return {str(k): as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_json(v) for v in value]
    if isinstance(value, dt.datetime):
        value = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


def _choose_node(objects: _Objects, label: str, node_name: str | None) -> str:
    # Any driver's node-local slice makes a node: one with only a NIC, or only the
    # dra-example-driver's GPUs, replays too (NVML then reports no driver).
    nodes = sorted({s.info.node_name for s in objects.slices if s.info.node_name})
    if node_name:
        if node_name not in nodes:
            have = f"nodes with one: {', '.join(nodes)}" if nodes else "the dump has none"
            raise ScenarioError(f"{label}: no ResourceSlice with spec.nodeName {node_name!r} ({have})")
        return node_name
    if len(nodes) == 1:
        return nodes[0]
    if not nodes:
        raise ScenarioError(
            f"{label}: the dump has no ResourceSlice with a spec.nodeName, so there is no node to simulate"
        )
    raise ScenarioError(
        f"{label}: the dump has devices on several nodes ({', '.join(nodes)}); name one (--node-name)"
    )


# --- the builder ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _NvidiaDevice:
    """A device of the node's NVIDIA slices that NVML knows (a GPU or a MIG device), as published."""

    slice: _Obj
    path: str
    """``spec.devices[name=<name>]``, for messages."""
    prefix: str
    """Where its attributes and capacity are: ``path``, or ``path.basic`` in v1beta1."""
    kind: str
    """``gpu`` or ``mig``."""
    parsed: NvidiaDeviceName
    device: model.SliceDevice

    @property
    def name(self) -> str:
        return self.device.name

    def attribute(self, name: str) -> str:
        return self.device.attribute(name)

    def capacity(self, name: str) -> int:
        return next((int(v) for k, v in self.device.capacity if k == name), 0)

    def memory_slices(self) -> int:
        """The ``memorySlice<i>`` capacities of a static MIG device: one per memory slice it occupies."""
        return sum(1 for k, _ in self.device.capacity if _MEMORY_SLICE.fullmatch(k))


@dataclass(slots=True)
class _Gpu:
    minor: int
    uuid: str
    source: str
    """Where the GPU was found, for conflict messages."""
    mig: dict[tuple[int, int], dict[str, Any]] = dataclasses.field(default_factory=dict)
    """(giProfileId, placementStart) → scenario MIG entry."""


_Found = dict[tuple[str, str], tuple[dict[str, Any], _Claim]]
"""(namespace, name) → (the scenario's claim entry, the claim) of the claims allocated on the node."""


class _DumpBuilder:
    """Builds a scenario document for ``node`` from the dump's records, checking what can go wrong."""

    def __init__(self, label: str, node: str, objects: _Objects) -> None:
        self.label = label
        self.node = node
        self.objects = objects
        mine = [s for s in objects.slices if s.info.node_name == node]
        # Only the highest generation of a pool counts; older slices are being replaced.
        current = {id(s) for s in current_slices(s.info for s in mine)}
        self.slices = [s for s in mine if id(s.info) in current]
        self.published = self._published_nvidia_devices()
        self.hardware = self._hardware()
        """What the slices say of the GPUs; None for a node without NVIDIA GPUs."""
        self.profile = self.hardware.profile if self.hardware else load_profile(RECORDED_MODEL)
        self.pools = {(s.info.driver, s.info.pool) for s in self.slices}
        self.pools.add((NVIDIA_DRIVER, node))
        self.gpus: dict[int, _Gpu] = {}
        self.abstract_mig: dict[str, tuple[int, str, int, int]] = {}
        """Name → (minor, profile, giProfileId, start) of MIG devices without a UUID."""
        self.nvidia_devices: set[str] = set()

    def scenario_document(self) -> dict[str, Any]:
        self._gpus_from_slices()
        claims = self._claims()
        pods = self._pods(claims)
        self._fill_gpu_gaps()
        versions = {c.obj.version for c in self.objects.claims} | {s.obj.version for s in self.objects.slices}
        api_version = next((v for v in API_VERSIONS if v in versions), "v1")
        document = {
            "node": self.node,
            "description": f"node {self.node} of the cluster dump {os.path.basename(self.label)}",
            "api_version": api_version,
            "gpus": [self._gpu_entry(g) for g in sorted(self.gpus.values(), key=lambda g: g.minor)],
            "claims": [c for c, _ in claims.values()],
            "pods": pods,
        }
        if not self.gpus:
            # No NVIDIA GPU here: NVML answers as on a node without NVIDIA's driver, for the whole run.
            document["faults"] = [{"kind": "init_failure", "at": 0, "error": "driver_not_loaded"}]
        return document

    # -- slices and GPUs --------------------------------------------------------------------------

    def _published_nvidia_devices(self) -> list[_NvidiaDevice]:
        out = []
        for s in self.slices:
            if s.info.driver != NVIDIA_DRIVER:
                continue
            for device in s.info.devices:
                found = self._published(s.obj, device)
                if found is not None:
                    out.append(found)
        return out

    def _published(self, s: _Obj, device: model.SliceDevice) -> _NvidiaDevice | None:
        path = f"spec.devices[name={device.name}]"
        prefix = f"{path}.{device_fields_path(s.version)}".rstrip(".")
        parsed = parse_nvidia_device_name(device.name)
        kind = device.attribute("type") or ("mig" if parsed and parsed.is_mig else "gpu" if parsed else "")
        if kind not in ("gpu", "mig"):
            return None  # VFIO passthrough and whatever comes next: not an NVML device of this node
        if parsed is None or parsed.is_mig != (kind == "mig"):
            raise s.error(
                f"{path}.name",
                f"{device.name!r} is not an NVIDIA {kind} device name "
                f"({'gpu-<minor>-mig-…' if kind == 'mig' else 'gpu-<minor>'})",
            )
        return _NvidiaDevice(s, path, prefix, kind, parsed, device)

    # -- what the GPUs are ------------------------------------------------------------------------

    def _hardware(self) -> Hardware | None:
        """The model, memory, driver, architecture and PCI bus ids the NVIDIA slices publish."""
        devices = sorted(self.published, key=lambda d: (d.parsed.minor, d.kind != "gpu", d.name))
        if not devices:
            return None
        base = load_profile(RECORDED_MODEL)
        model_name = self._one_value(devices, "productName")
        architecture = self._one_value(devices, "architecture")
        driver = self._one_value(devices, "driverVersion")
        cuda = self._one_value(devices, "cudaDriverVersion")
        compute_capability = self._one_value(devices, "cudaComputeCapability")
        memory = self._gpu_memory(devices)
        mig = known_mig_profiles(base, architecture, memory) if memory else None
        if mig is None:
            mig = self._mig_profiles_seen(devices, memory)
        profile = identified(
            base, model=model_name, architecture=architecture, memory_total=memory,
            driver_version=_nvml_driver_version(driver), cuda_driver_version=_major_minor(cuda),
            cuda_compute_capability=_major_minor(compute_capability), mig_profiles=mig,
        )
        bus_ids: dict[int, str] = {}
        for d in devices:
            field = f"{d.prefix}.attributes.{_PCI_BUS_ID}"
            value = d.attribute(_PCI_BUS_ID) or d.attribute(_PCI_BUS_ID_BEFORE_25_12)
            if value:
                bus_ids.setdefault(d.parsed.minor, _nvml_bus_id(d.slice, field, value))
        return Hardware(profile, bus_ids)

    def _one_value(self, devices: list[_NvidiaDevice], name: str) -> str:
        # The simulator runs one GPU model per node, as NVIDIA's nodes are built.
        first: tuple[str, _NvidiaDevice] | None = None
        for d in devices:
            value = d.attribute(name)
            if not value:
                continue
            if first is None:
                first = (value, d)
            elif value != first[0]:
                raise d.slice.error(
                    f"{d.prefix}.attributes.{name}",
                    f"{value!r} on {d.name}, {first[0]!r} on {first[1].name}: "
                    "the simulator runs one GPU model per node",
                )
        return first[0] if first else ""

    def _gpu_memory(self, devices: list[_NvidiaDevice]) -> int:
        """A whole GPU's memory capacity; else, for MIG-only nodes, a MIG device's scaled by its memory slices."""
        for d in devices:
            memory = d.capacity("memory")
            if memory and d.kind == "gpu":
                return memory
        for d in devices:
            memory, slices = d.capacity("memory"), d.memory_slices()
            if memory and slices:
                return memory * RECORDED_MEMORY_SLICES // slices
        return 0

    def _mig_profiles_seen(self, devices: list[_NvidiaDevice], gpu_memory: int) -> tuple[MigProfile, ...]:
        """A model without a known MIG table: its profiles as far as the slice's MIG devices show them."""
        seen: dict[str, tuple[int, int, set[int]]] = {}
        for d in (d for d in devices if d.kind == "mig"):
            profile = d.attribute("profile")
            if not profile or d.parsed.placement_start is None or d.parsed.gi_profile_id is None:
                continue  # the checks of the device itself say what is wrong
            slices = d.memory_slices()
            memory = d.capacity("memory")
            if not slices and memory and gpu_memory:
                slices = max(1, round(memory * RECORDED_MEMORY_SLICES / gpu_memory))
            seen.setdefault(profile, (d.parsed.gi_profile_id, slices or 1, set()))[2].add(d.parsed.placement_start)
        return tuple(mig_profile_from_slice(name, gi, size, starts) for name, (gi, size, starts) in seen.items())

    # -- slices and GPUs --------------------------------------------------------------------------

    def _gpus_from_slices(self) -> None:
        for device in self.published:
            self._nvidia_device(device)

    def _nvidia_device(self, d: _NvidiaDevice) -> None:
        s, path, prefix, name, parsed = d.slice, d.path, d.prefix, d.name, d.parsed
        self.nvidia_devices.add(name)
        if parsed.minor >= MAX_GPUS:
            raise s.error(
                f"{path}.name", f"GPU minor {parsed.minor}: the simulator has at most {MAX_GPUS} GPUs"
            )
        if d.kind == "gpu":
            uuid = d.attribute("uuid")
            if not uuid:
                raise s.error(f"{prefix}.attributes.uuid", f"required for the gpu device {name!r}")
            self._gpu(parsed.minor, uuid, f"{s.where()} {path}", s, f"{prefix}.attributes.uuid")
            return
        parent = d.attribute("parentUUID")
        profile = d.attribute("profile")
        if not parent:
            raise s.error(f"{prefix}.attributes.parentUUID", f"required for the MIG device {name!r}")
        if not profile:
            raise s.error(f"{prefix}.attributes.profile", f"required for the MIG device {name!r}")
        mp = self.profile.mig_profile(profile)
        if mp is None:
            raise s.error(
                f"{prefix}.attributes.profile",
                f"{profile!r} is not a MIG profile of the {self.profile.model} "
                f"({', '.join(p.name for p in self.profile.mig_profiles)})",
            )
        if parsed.profile and parsed.profile != canonical_profile(profile):
            raise s.error(f"{path}.name", f"{name!r} does not name profile {profile!r}")
        if parsed.gi_profile_id != mp.gi_profile_id:
            raise s.error(
                f"{path}.name",
                f"{name!r}: GPU-instance profile {parsed.gi_profile_id} is not "
                f"{profile}'s ({mp.gi_profile_id})",
            )
        assert parsed.placement_start is not None
        if parsed.placement_start not in mp.starts:
            raise s.error(f"{path}.name", f"{profile} cannot start at memory slice {parsed.placement_start}")
        gpu = self._gpu(parsed.minor, parent, f"{s.where()} {path}", s, f"{prefix}.attributes.parentUUID")
        uuid = d.attribute("uuid")
        if not uuid:
            self.abstract_mig[name] = (parsed.minor, profile, mp.gi_profile_id, parsed.placement_start)
            return
        entry = {"profile": profile, "placement_start": parsed.placement_start, "uuid": uuid}
        gpu.mig[(mp.gi_profile_id, parsed.placement_start)] = entry

    def _gpu(self, minor: int, uuid: str, source: str, s: _Obj, field: str) -> _Gpu:
        gpu = self.gpus.get(minor)
        if gpu is None:
            gpu = self.gpus[minor] = _Gpu(minor, uuid, source)
        elif gpu.uuid != uuid:
            raise s.error(field, f"GPU minor {minor} is {gpu.uuid} in {gpu.source}, not {uuid}")
        return gpu

    def _fill_gpu_gaps(self) -> None:
        for minor in range(max(self.gpus, default=-1)):
            # A GPU the driver does not publish is still on the node (NVML counts it).
            self.gpus.setdefault(minor, _Gpu(minor, "", "not published"))

    def _gpu_entry(self, gpu: _Gpu) -> dict[str, Any]:
        entry: dict[str, Any] = {"index": gpu.minor}
        if gpu.uuid:
            entry["uuid"] = gpu.uuid
        if gpu.mig:
            entry["mig"] = sorted(gpu.mig.values(), key=lambda m: m["placement_start"])
        return entry

    # -- claims -------------------------------------------------------------------------------------

    def _claims(self) -> _Found:
        out: _Found = {}
        owners: dict[tuple[str, str], tuple[str, str]] = {}
        for c in self.objects.claims:
            claim = self._claim(c, owners)
            if claim is not None:
                out[(c.obj.namespace, c.obj.name)] = (claim, c)
        for claim, c in out.values():
            # With DynamicMIG a GPU is either allocated whole or partitioned, never both.
            for device in (d for r in claim["requests"] for d in r["devices"]):
                parsed = parse_nvidia_device_name(device) if claim["driver"] == NVIDIA_DRIVER else None
                if parsed is not None and not parsed.is_mig and self.gpus[parsed.minor].mig:
                    raise c.obj.error(
                        "status.allocation.devices.results",
                        f"{device!r} is allocated whole while MIG devices of it exist or are allocated",
                    )
        return out

    def _claim(self, c: _Claim, owners: dict[tuple[str, str], tuple[str, str]]) -> dict[str, Any] | None:
        obj = c.obj
        local: list[model.AllocationResult] = []
        for r in c.info.results:
            field = f"status.allocation.devices.results[device={r.device}]"
            for key, value in (("request", r.request), ("driver", r.driver), ("pool", r.pool)):
                if not value:
                    raise obj.error(f"{field}.{key}", "required")
            if (r.driver, r.pool) in self.pools:
                local.append(r)
        if not local:
            return None  # allocated elsewhere, or not allocated: not this node's business
        # The scenario has one driver per claim; NVIDIA's devices are the ones with metrics.
        drivers = [r.driver for r in local]
        driver = NVIDIA_DRIVER if NVIDIA_DRIVER in drivers else drivers[0]
        local = [r for r in local if r.driver == driver]
        admin = any(r.admin_access for r in local)
        requests: dict[str, dict[str, Any]] = {}
        for r in local:
            field = f"status.allocation.devices.results[device={r.device}].device"
            if driver == NVIDIA_DRIVER:
                self._check_nvidia_result(obj, field, r.device)
            if not admin and not r.share_id:
                other = owners.setdefault((driver, r.device), (obj.namespace, obj.name))
                if other != (obj.namespace, obj.name):
                    raise obj.error(field, f"{r.device!r} is also allocated to claim {'/'.join(other)}")
            main, _, sub = r.request.partition("/")
            request = requests.setdefault(main, self._request(c, main, sub))
            if r.device not in request["devices"]:
                request["devices"].append(r.device)
        claim: dict[str, Any] = {
            "namespace": obj.namespace,
            "name": obj.name,
            "driver": driver,
            "pool": local[0].pool,
            "admin_access": admin,
            "requests": list(requests.values()),
        }
        if c.info.uid:
            claim["uid"] = c.info.uid
        status = self._device_status(c, driver, {d for r in requests.values() for d in r["devices"]})
        if status:
            claim["device_status"] = status
        return claim

    def _check_nvidia_result(self, obj: _Obj, field: str, device: str) -> None:
        if device in self.abstract_mig:
            minor, profile, _, start = self.abstract_mig[device]
            gpu = self.gpus[minor]
            mp = self.profile.mig_profile(profile)
            assert mp is not None
            # A DynamicMIG device allocated to a claim has been created: it is an NVML device now.
            gpu.mig.setdefault((mp.gi_profile_id, start), {"profile": profile, "placement_start": start})
            return
        if device not in self.nvidia_devices:
            raise obj.error(
                field, f"{device!r} is not a device of the {NVIDIA_DRIVER} slices of node {self.node}"
            )

    def _request(self, c: _Claim, main: str, sub: str) -> dict[str, Any]:
        # The reader names a prioritized list's alternatives ``main/sub``, as allocation results do.
        spec = next((r for r in c.requests if r.name == main), model.DeviceRequestInfo(main, ""))
        request: dict[str, Any] = {"name": main, "devices": []}
        if sub:
            subs = [(r.name.partition("/")[2], r.device_class) for r in c.requests if r.name.startswith(main + "/")]
            if not any(name == sub for name, _ in subs):
                subs.append((sub, ""))
            request["first_available"] = [
                {"name": name, **({"device_class": device_class} if device_class else {})}
                for name, device_class in subs[:8]
            ]
            request["allocated"] = sub
            return request
        if spec.device_class:
            request["device_class"] = spec.device_class
        if spec.all_devices:
            request["all"] = True
        return request

    def _device_status(self, c: _Claim, driver: str, devices: set[str]) -> list[dict[str, Any]]:
        out = []
        for entry in c.info.devices:
            if entry.driver != driver or entry.device not in devices:
                continue
            conditions = [
                {"type": x.type, "status": x.status, **({"reason": x.reason} if x.reason else {})}
                for x in entry.conditions
            ]
            if conditions:
                out.append({"device": entry.device, "conditions": conditions[:8]})
        return out

    # -- pods ---------------------------------------------------------------------------------------

    def _pods(self, claims: _Found) -> list[dict[str, Any]]:
        pods: list[dict[str, Any]] = []
        present = {(p.obj.namespace, p.obj.name) for p in self.objects.pods}
        for p in self.objects.pods:
            if p.node_name == self.node and not p.info.terminal:
                pods.append(self._pod(p, claims))
        pods.extend(self._reserved_only_pods(claims, present))
        return pods

    def _pod(self, p: _Pod, claims: _Found) -> dict[str, Any]:
        containers = []
        for c in p.info.containers:
            container: dict[str, Any] = {"name": c.name}
            if c.container_id:
                container["container_id"] = c.container_id
            refs = self._container_claims(p, c, claims)
            if refs:
                container["claims"] = refs
                health = self._health(p, c, refs, claims)
                if health:
                    container["device_health"] = health
            containers.append(container)
        pod: dict[str, Any] = {"namespace": p.obj.namespace, "name": p.obj.name, "containers": containers}
        if p.info.uid:
            pod["uid"] = p.info.uid
        return pod

    def _container_claims(self, p: _Pod, c: model.ContainerInfo, claims: _Found) -> list[Any]:
        refs: list[Any] = []
        seen: set[str] = set()
        for use in c.claims:
            found = claims.get((p.obj.namespace, use.claim))
            if not use.claim or found is None or use.claim in seen:
                continue  # not allocated on this node (or not at all), or named twice
            seen.add(use.claim)
            if use.request and any(r["name"] == use.request for r in found[0]["requests"]):
                refs.append({"claim": use.claim, "request": use.request})
            else:
                refs.append(use.claim)
        return refs

    def _health(self, p: _Pod, c: model.ContainerInfo, refs: list[Any], claims: _Found) -> dict[str, str]:
        mine = set()
        for ref in refs:
            claim = claims[(p.obj.namespace, ref if isinstance(ref, str) else ref["claim"])][0]
            request = "" if isinstance(ref, str) else ref["request"]
            mine |= {
                (claim["driver"], claim["pool"], d)
                for r in claim["requests"]
                if not request or r["name"] == request
                for d in r["devices"]
            }
        # Devices the kubelet named by their triplet; a CDI-named one (``cdi_id``) is not resolved here.
        return {h.device: h.health for h in c.health
                if not h.cdi_id and (h.driver, h.pool, h.device) in mine and h.health in DEVICE_HEALTH}

    def _reserved_only_pods(self, claims: _Found, present: set[tuple[str, str]]) -> list[dict[str, Any]]:
        # Pods missing from the dump: the claim's reservedFor still names them (and their UIDs).
        missing: dict[tuple[str, str], dict[str, Any]] = {}
        for (ns, name), (_, c) in claims.items():
            for ref in c.info.reserved_for:
                if ref.resource != "pods" or ref.api_group or not ref.name or (ns, ref.name) in present:
                    continue
                pod = missing.setdefault(
                    (ns, ref.name),
                    {"namespace": ns, "name": ref.name, "containers": [{"name": UNKNOWN_CONTAINER, "claims": []}]},
                )
                if ref.uid:
                    pod.setdefault("uid", ref.uid)
                pod["containers"][0]["claims"].append(name)
        return list(missing.values())


def _nvml_driver_version(semver: str) -> str:
    """NVIDIA's driver publishes ``580.159.04`` as the semver ``580.159.4``; NVML writes the patch with
    two digits (every release since 3xx does), so that is how it is written back."""
    parts = semver.split(".")
    if len(parts) == 3 and all(p.isdigit() for p in parts):
        return f"{int(parts[0])}.{int(parts[1])}.{int(parts[2]):02d}"
    return semver


def _major_minor(semver: str) -> str:
    """The driver's semver ``12.4.0`` as NVML's ``<major>.<minor>`` (``12.4``); "" when it is not one."""
    parts = semver.split(".")
    return f"{int(parts[0])}.{int(parts[1])}" if len(parts) >= 2 and all(p.isdigit() for p in parts[:2]) else ""


def _nvml_bus_id(s: _Obj, field: str, value: str) -> str:
    """The attribute's ``0000:18:00.0`` as NVML writes it: ``00000000:18:00.0``."""
    m = _PCI_ADDRESS.fullmatch(value)
    if m is None:
        raise s.error(field, f"{value!r} is not a PCI address (domain:bus:device.function)")
    return f"{int(m['domain'], 16):08X}:{m['bus'].upper()}:{m['device'].upper()}.{m['function']}"
