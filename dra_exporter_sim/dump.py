"""Cluster dumps as scenarios: one node of a real cluster, replayed by the simulator.

``kubectl get resourceslices,resourceclaims,pods -A -o yaml`` (a ``kind: List``), or a
multi-document YAML of such objects, in resource.k8s.io v1, v1beta2 or v1beta1, becomes
the ``Scenario`` of one node:

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
null fields) load; an unusable one is a ``ScenarioError`` naming the object as
``kind/namespace/name`` and the field.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from dra_exporter.resolve import NVIDIA_DRIVER, NvidiaDeviceName, canonical_profile, parse_nvidia_device_name

from .profile import MigProfile, identified, known_mig_profiles, load_profile, mig_profile_from_slice
from .scenario import API_VERSIONS, DEVICE_HEALTH, MAX_GPUS, Hardware, Scenario, ScenarioError
from .scenario_builder import Cursor, _quantity, parse_scenario, read_documents

KINDS: Final = ("ResourceSlice", "ResourceClaim", "Pod")
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
_GROUP: Final = "resource.k8s.io"
_FINISHED: Final = ("Succeeded", "Failed")
#: Container name given to pods known only from a claim's ``reservedFor``.
UNKNOWN_CONTAINER: Final = "unknown"


def is_dump(docs: list[Any]) -> bool:
    """Whether parsed YAML documents are Kubernetes objects rather than a scenario."""
    return any(isinstance(d, Mapping) and "kind" in d and "apiVersion" in d and "gpus" not in d for d in docs)


def load_dump(path: str | os.PathLike[str], node_name: str | None = None) -> Scenario:
    """The scenario of ``node_name`` (or of the dump's only GPU node) in a dump file."""
    label, docs = read_documents(path)
    if not is_dump(docs):
        raise ScenarioError(
            f"{label}: not a cluster dump (expected a kind: List or Kubernetes objects, "
            "as `kubectl get resourceslices,resourceclaims,pods -A -o yaml` prints)"
        )
    return parse_dump(docs, label, node_name)


def parse_dump(docs: list[Any], label: str, node_name: str | None = None) -> Scenario:
    """Parsed dump documents → ``Scenario``; see the module docstring."""
    objects = list(_objects(docs, label))
    node = _choose_node(objects, label, node_name)
    builder = _DumpBuilder(label, node, objects)
    data = builder.scenario_document()
    try:
        scenario = parse_scenario(data, label, builder.hardware)
    except ScenarioError as e:
        # Only reachable for dumps the checks here let through; say that it is about the dump.
        raise ScenarioError(f"{label}: node {node!r} of the dump is not a consistent node: {e}") from None
    return dataclasses.replace(scenario, raw_objects=tuple(o.raw for o in objects))


# --- objects --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Obj:
    """One object of the dump with its place for error messages."""

    raw: dict[str, Any]
    label: str

    @property
    def kind(self) -> str:
        return str(self.raw.get("kind"))

    @property
    def namespace(self) -> str:
        return str(_get(self.raw, "metadata", "namespace") or "")

    @property
    def name(self) -> str:
        return str(_get(self.raw, "metadata", "name") or "")

    @property
    def version(self) -> str:
        """resource.k8s.io version (``v1beta1``…), ``v1`` for core objects."""
        return str(self.raw.get("apiVersion", "")).rpartition("/")[2]

    def where(self) -> str:
        return "/".join(p for p in (self.kind, self.namespace, self.name) if p)

    def error(self, field: str, message: str) -> ScenarioError:
        return ScenarioError(f"{self.label}: {self.where()}: {field}: {message}")


def _get(value: Any, *path: str | int) -> Any:
    """``value[path[0]][path[1]]…``, None where anything on the way is missing or null."""
    for key in path:
        if isinstance(key, int):
            value = value[key] if isinstance(value, list) and -len(value) <= key < len(value) else None
        else:
            value = value.get(key) if isinstance(value, Mapping) else None
    return value


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _plain(value: Any) -> Any:
    """YAML values as JSON would have them: unquoted timestamps back to RFC 3339 strings."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dt.datetime):
        value = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


def _objects(docs: list[Any], label: str) -> Iterator[_Obj]:
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
            if not isinstance(item, Mapping) or not item.get("kind") or not item.get("apiVersion"):
                raise ScenarioError(
                    f"{where}: items[{i}]: expected a Kubernetes object with kind and apiVersion"
                )
            obj = _Obj(_plain(item), label)
            if obj.kind not in KINDS:
                continue  # DeviceClasses, templates, nodes…: nothing the simulated node needs
            if not obj.name:
                raise obj.error("metadata.name", "required")
            group, _, version = str(item["apiVersion"]).rpartition("/")
            expected = _GROUP if obj.kind != "Pod" else ""
            if (
                group != expected
                or (expected and version not in API_VERSIONS)
                or (not expected and version != "v1")
            ):
                served = ", ".join(f"{_GROUP}/{v}" for v in API_VERSIONS) if expected else "v1"
                raise obj.error(
                    "apiVersion", f"{item['apiVersion']!r} is not supported (supported: {served})"
                )
            if obj.kind == "ResourceClaim" and not obj.namespace:
                raise obj.error("metadata.namespace", "required for a ResourceClaim")
            if obj.kind == "Pod" and not obj.namespace:
                raise obj.error("metadata.namespace", "required for a Pod")
            yield obj


def _slices(objects: list[_Obj]) -> list[_Obj]:
    return [o for o in objects if o.kind == "ResourceSlice"]


def _choose_node(objects: list[_Obj], label: str, node_name: str | None) -> str:
    # Any driver's node-local slice makes a node: one with only a NIC, or only the
    # dra-example-driver's GPUs, replays too (NVML then reports no driver).
    nodes = sorted(
        {
            node
            for o in _slices(objects)
            if isinstance(node := _get(o.raw, "spec", "nodeName"), str) and node
        }
    )
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
    """``spec.devices[<i>]``, for messages."""
    prefix: str
    """Where its attributes and capacity are: ``path``, or ``path.basic`` in v1beta1."""
    name: str
    kind: str
    """``gpu`` or ``mig``."""
    parsed: NvidiaDeviceName
    attributes: Mapping[str, Any]
    capacity: Mapping[str, Any]


@dataclass(slots=True)
class _Gpu:
    minor: int
    uuid: str
    source: str
    """Where the GPU was found, for conflict messages."""
    mig: dict[tuple[int, int], dict[str, Any]] = dataclasses.field(default_factory=dict)
    """(giProfileId, placementStart) → scenario MIG entry."""


class _DumpBuilder:
    """Builds a scenario document for ``node`` from the dump's objects, checking what can go wrong."""

    def __init__(self, label: str, node: str, objects: list[_Obj]) -> None:
        self.label = label
        self.node = node
        self.objects = objects
        self.slices = self._newest_slices()
        self.published = self._published_nvidia_devices()
        self.hardware = self._hardware()
        """What the slices say of the GPUs; None for a node without NVIDIA GPUs."""
        self.profile = self.hardware.profile if self.hardware else load_profile(RECORDED_MODEL)
        self.pools = {
            (str(_get(s.raw, "spec", "driver")), str(_get(s.raw, "spec", "pool", "name")))
            for s in self.slices
        }
        self.pools.add((NVIDIA_DRIVER, node))
        self.gpus: dict[int, _Gpu] = {}
        self.abstract_mig: dict[str, tuple[int, str, int, int, _Obj, str]] = {}
        """Name → (minor, profile, giProfileId, start, slice, field) of MIG devices without a UUID."""
        self.nvidia_devices: set[str] = set()

    def scenario_document(self) -> dict[str, Any]:
        self._gpus_from_slices()
        claims = self._claims()
        pods = self._pods(claims)
        self._fill_gpu_gaps()
        versions = {o.version for o in self.objects if o.kind != "Pod"}
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

    def _newest_slices(self) -> list[_Obj]:
        # Only the highest generation of a pool counts; older slices are being replaced.
        mine = [s for s in _slices(self.objects) if _get(s.raw, "spec", "nodeName") == self.node]
        newest: dict[tuple[str, str], int] = {}
        for s in mine:
            key = (str(_get(s.raw, "spec", "driver")), str(_get(s.raw, "spec", "pool", "name")))
            generation = _get(s.raw, "spec", "pool", "generation")
            newest[key] = max(newest.get(key, 0), generation if isinstance(generation, int) else 0)
        return [
            s
            for s in mine
            if (_get(s.raw, "spec", "pool", "generation") or 0)
            == newest[(str(_get(s.raw, "spec", "driver")), str(_get(s.raw, "spec", "pool", "name")))]
        ]

    def _published_nvidia_devices(self) -> list[_NvidiaDevice]:
        out = []
        for s in self.slices:
            if _get(s.raw, "spec", "driver") != NVIDIA_DRIVER:
                continue
            for i, device in enumerate(_list(_get(s.raw, "spec", "devices"))):
                found = self._published(s, f"spec.devices[{i}]", device)
                if found is not None:
                    out.append(found)
        return out

    def _published(self, s: _Obj, path: str, device: Any) -> _NvidiaDevice | None:
        if not isinstance(device, Mapping) or not isinstance(device.get("name"), str):
            raise s.error(f"{path}.name", "a device needs a name")
        name = device["name"]
        body = device.get("basic") if s.version == "v1beta1" else device
        prefix = f"{path}.basic" if s.version == "v1beta1" else path
        attrs = _get(body, "attributes") or {}
        if not isinstance(attrs, Mapping):
            raise s.error(f"{prefix}.attributes", "expected a mapping")
        capacity = _get(body, "capacity") or {}
        if not isinstance(capacity, Mapping):
            raise s.error(f"{prefix}.capacity", "expected a mapping")
        parsed = parse_nvidia_device_name(name)
        kind = _attr(attrs, "type") or ("mig" if parsed and parsed.is_mig else "gpu" if parsed else "")
        if kind not in ("gpu", "mig"):
            return None  # VFIO passthrough and whatever comes next: not an NVML device of this node
        if parsed is None or parsed.is_mig != (kind == "mig"):
            raise s.error(
                f"{path}.name",
                f"{name!r} is not an NVIDIA {kind} device name "
                f"({'gpu-<minor>-mig-…' if kind == 'mig' else 'gpu-<minor>'})",
            )
        return _NvidiaDevice(s, path, prefix, name, kind, parsed, attrs, capacity)

    # -- what the GPUs are ------------------------------------------------------------------------

    def _hardware(self) -> Hardware | None:
        """The model, memory, driver, architecture and PCI bus ids the NVIDIA slices publish."""
        devices = sorted(self.published, key=lambda d: (d.parsed.minor, d.kind != "gpu", d.name))
        if not devices:
            return None
        base = load_profile(RECORDED_MODEL)
        model = self._one_value(devices, "productName", _attr)
        architecture = self._one_value(devices, "architecture", _attr)
        driver = self._one_value(devices, "driverVersion", _version)
        cuda = self._one_value(devices, "cudaDriverVersion", _version)
        memory = self._gpu_memory(devices)
        mig = known_mig_profiles(base, architecture, memory) if memory else None
        if mig is None:
            mig = self._mig_profiles_seen(devices, memory)
        profile = identified(
            base, model=model, architecture=architecture, memory_total=memory,
            driver_version=_nvml_driver_version(driver), cuda_major=_major(cuda), mig_profiles=mig,
        )
        bus_ids: dict[int, str] = {}
        for d in devices:
            field = f"{d.prefix}.attributes.{_PCI_BUS_ID}"
            value = _attr(d.attributes, _PCI_BUS_ID) or _attr(d.attributes, _PCI_BUS_ID_BEFORE_25_12)
            if value:
                bus_ids.setdefault(d.parsed.minor, _nvml_bus_id(d.slice, field, value))
        return Hardware(profile, bus_ids)

    def _one_value(
        self, devices: list[_NvidiaDevice], name: str, read: Callable[[Mapping[str, Any], str], str]
    ) -> str:
        # The simulator runs one GPU model per node, as NVIDIA's nodes are built.
        first: tuple[str, _NvidiaDevice] | None = None
        for d in devices:
            value = read(d.attributes, name)
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
            memory = self._capacity_bytes(d, "memory")
            if memory and d.kind == "gpu":
                return memory
        for d in devices:
            memory, slices = self._capacity_bytes(d, "memory"), _memory_slices(d.capacity)
            if memory and slices:
                return memory * RECORDED_MEMORY_SLICES // len(slices)
        return 0

    def _capacity_bytes(self, d: _NvidiaDevice, name: str) -> int:
        value = d.capacity.get(name)
        # v1alpha3 wrote bare quantities; v1beta1 and later {value: <quantity>}.
        quantity = _get(value, "value") if isinstance(value, Mapping) else value
        if quantity is None:
            return 0
        where = f"{d.slice.label}: {d.slice.where()}"
        return _quantity(Cursor(where, f"{d.prefix}.capacity.{name}.value", quantity))

    def _mig_profiles_seen(self, devices: list[_NvidiaDevice], gpu_memory: int) -> tuple[MigProfile, ...]:
        """A model without a known MIG table: its profiles as far as the slice's MIG devices show them."""
        seen: dict[str, tuple[int, int, set[int]]] = {}
        for d in (d for d in devices if d.kind == "mig"):
            profile = _attr(d.attributes, "profile")
            if not profile or d.parsed.placement_start is None or d.parsed.gi_profile_id is None:
                continue  # the checks of the device itself say what is wrong
            slices = len(_memory_slices(d.capacity))
            memory = self._capacity_bytes(d, "memory")
            if not slices and memory and gpu_memory:
                slices = max(1, round(memory * RECORDED_MEMORY_SLICES / gpu_memory))
            seen.setdefault(profile, (d.parsed.gi_profile_id, slices or 1, set()))[2].add(d.parsed.placement_start)
        return tuple(mig_profile_from_slice(name, gi, size, starts) for name, (gi, size, starts) in seen.items())

    # -- slices and GPUs --------------------------------------------------------------------------

    def _gpus_from_slices(self) -> None:
        for device in self.published:
            self._nvidia_device(device)

    def _nvidia_device(self, d: _NvidiaDevice) -> None:
        s, path, prefix, name, kind, parsed, attrs = (
            d.slice, d.path, d.prefix, d.name, d.kind, d.parsed, d.attributes
        )
        self.nvidia_devices.add(name)
        if parsed.minor >= MAX_GPUS:
            raise s.error(
                f"{path}.name", f"GPU minor {parsed.minor}: the simulator has at most {MAX_GPUS} GPUs"
            )
        if kind == "gpu":
            uuid = _attr(attrs, "uuid")
            if not uuid:
                raise s.error(f"{prefix}.attributes.uuid", f"required for the gpu device {name!r}")
            self._gpu(parsed.minor, uuid, f"{s.where()} {path}", s, f"{prefix}.attributes.uuid")
            return
        parent = _attr(attrs, "parentUUID")
        profile = _attr(attrs, "profile")
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
        uuid = _attr(attrs, "uuid")
        if not uuid:
            self.abstract_mig[name] = (
                parsed.minor,
                profile,
                mp.gi_profile_id,
                parsed.placement_start,
                s,
                path,
            )
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

    def _claims(self) -> dict[tuple[str, str], tuple[dict[str, Any], _Obj]]:
        out: dict[tuple[str, str], tuple[dict[str, Any], _Obj]] = {}
        owners: dict[tuple[str, str], tuple[str, str]] = {}
        for obj in (o for o in self.objects if o.kind == "ResourceClaim"):
            claim = self._claim(obj, owners)
            if claim is not None:
                out[(obj.namespace, obj.name)] = (claim, obj)
        for claim, obj in out.values():
            # With DynamicMIG a GPU is either allocated whole or partitioned, never both.
            for device in (d for r in claim["requests"] for d in r["devices"]):
                parsed = parse_nvidia_device_name(device) if claim["driver"] == NVIDIA_DRIVER else None
                if parsed is not None and not parsed.is_mig and self.gpus[parsed.minor].mig:
                    raise obj.error(
                        "status.allocation.devices.results",
                        f"{device!r} is allocated whole while MIG devices of it exist or are allocated",
                    )
        return out

    def _claim(self, obj: _Obj, owners: dict[tuple[str, str], tuple[str, str]]) -> dict[str, Any] | None:
        results = _get(obj.raw, "status", "allocation", "devices", "results")
        if results is not None and not isinstance(results, list):
            raise obj.error("status.allocation.devices.results", "expected a list")
        local: list[tuple[int, Mapping[str, Any]]] = []
        for i, r in enumerate(results or ()):
            field = f"status.allocation.devices.results[{i}]"
            if not isinstance(r, Mapping):
                raise obj.error(field, "expected a mapping")
            for key in ("request", "driver", "pool", "device"):
                if not isinstance(r.get(key), str) or not r[key]:
                    raise obj.error(f"{field}.{key}", "required")
            if (r["driver"], r["pool"]) in self.pools:
                local.append((i, r))
        if not local:
            return None  # allocated elsewhere, or not allocated: not this node's business
        # The scenario has one driver per claim; NVIDIA's devices are the ones with metrics.
        drivers = [r["driver"] for _, r in local]
        driver = NVIDIA_DRIVER if NVIDIA_DRIVER in drivers else drivers[0]
        local = [(i, r) for i, r in local if r["driver"] == driver]
        admin = any(r.get("adminAccess") is True for _, r in local)
        requests: dict[str, dict[str, Any]] = {}
        for i, r in local:
            field = f"status.allocation.devices.results[{i}]"
            device = r["device"]
            if driver == NVIDIA_DRIVER:
                self._check_nvidia_result(obj, f"{field}.device", device)
            if not admin and not r.get("shareID"):
                other = owners.setdefault((driver, device), (obj.namespace, obj.name))
                if other != (obj.namespace, obj.name):
                    raise obj.error(
                        f"{field}.device", f"{device!r} is also allocated to claim {'/'.join(other)}"
                    )
            main, _, sub = r["request"].partition("/")
            request = requests.setdefault(main, self._request(obj, main, sub))
            if device not in request["devices"]:
                request["devices"].append(device)
        claim: dict[str, Any] = {
            "namespace": obj.namespace,
            "name": obj.name,
            "driver": driver,
            "pool": local[0][1]["pool"],
            "admin_access": admin,
            "requests": list(requests.values()),
        }
        uid = _get(obj.raw, "metadata", "uid")
        if isinstance(uid, str) and uid:
            claim["uid"] = uid
        status = self._device_status(obj, driver, {d for r in requests.values() for d in r["devices"]})
        if status:
            claim["device_status"] = status
        return claim

    def _check_nvidia_result(self, obj: _Obj, field: str, device: str) -> None:
        if device in self.abstract_mig:
            minor, profile, _, start, _, _ = self.abstract_mig[device]
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

    def _request(self, obj: _Obj, main: str, sub: str) -> dict[str, Any]:
        spec = next(
            (
                r
                for r in _list(_get(obj.raw, "spec", "devices", "requests"))
                if isinstance(r, Mapping) and r.get("name") == main
            ),
            None,
        )
        request: dict[str, Any] = {"name": main, "devices": []}
        if sub:
            subs = [
                s for s in _list(_get(spec, "firstAvailable")) if isinstance(s, Mapping) and s.get("name")
            ]
            if not any(s["name"] == sub for s in subs):
                subs.append({"name": sub})
            request["first_available"] = [
                {
                    "name": s["name"],
                    **(
                        {"device_class": s["deviceClassName"]}
                        if isinstance(s.get("deviceClassName"), str) and s["deviceClassName"]
                        else {}
                    ),
                }
                for s in subs[:8]
            ]
            request["allocated"] = sub
            return request
        exact = _get(spec, "exactly") if obj.version != "v1beta1" else spec
        device_class = _get(exact, "deviceClassName")
        if isinstance(device_class, str) and device_class:
            request["device_class"] = device_class
        if _get(exact, "allocationMode") == "All":
            request["all"] = True
        return request

    def _device_status(self, obj: _Obj, driver: str, devices: set[str]) -> list[dict[str, Any]]:
        out = []
        for i, entry in enumerate(_list(_get(obj.raw, "status", "devices"))):
            if not isinstance(entry, Mapping):
                continue
            field = f"status.devices[{i}]"
            if (
                _text(obj, entry.get("driver"), f"{field}.driver") != driver
                or _text(obj, entry.get("device"), f"{field}.device") not in devices
            ):
                continue
            conditions = []
            for j, c in enumerate(_list(entry.get("conditions"))):
                field = f"status.devices[{i}].conditions[{j}]"
                if not isinstance(c, Mapping) or not isinstance(c.get("type"), str):
                    raise obj.error(f"{field}.type", "required")
                if c.get("status") not in ("True", "False", "Unknown"):
                    raise obj.error(f"{field}.status", f"{c.get('status')!r} is not True, False or Unknown")
                condition = {"type": c["type"], "status": c["status"]}
                if isinstance(c.get("reason"), str) and c["reason"]:
                    condition["reason"] = c["reason"]
                if isinstance(c.get("message"), str) and c["message"]:
                    condition["message"] = c["message"]
                conditions.append(condition)
            if conditions:
                out.append({"device": entry["device"], "conditions": conditions[:8]})
        return out

    # -- pods ---------------------------------------------------------------------------------------

    def _pods(self, claims: Mapping[tuple[str, str], tuple[dict[str, Any], _Obj]]) -> list[dict[str, Any]]:
        pods: list[dict[str, Any]] = []
        present: set[tuple[str, str]] = set()
        for obj in (o for o in self.objects if o.kind == "Pod"):
            present.add((obj.namespace, obj.name))
            if (
                _get(obj.raw, "spec", "nodeName") != self.node
                or _get(obj.raw, "status", "phase") in _FINISHED
            ):
                continue
            pods.append(self._pod(obj, claims))
        pods.extend(self._reserved_only_pods(claims, present))
        return pods

    def _pod(
        self, obj: _Obj, claims: Mapping[tuple[str, str], tuple[dict[str, Any], _Obj]]
    ) -> dict[str, Any]:
        by_pod_name = self._pod_claim_names(obj)
        statuses = {
            _text(obj, s.get("name"), f"status.containerStatuses[{i}].name"): s
            for i, s in enumerate(_list(_get(obj.raw, "status", "containerStatuses")))
            if isinstance(s, Mapping)
        }
        containers = []
        containers_raw = _list(_get(obj.raw, "spec", "containers"))
        if not containers_raw:
            raise obj.error("spec.containers", "a pod needs at least one container")
        for i, c in enumerate(containers_raw):
            if not isinstance(c, Mapping) or not isinstance(c.get("name"), str):
                raise obj.error(f"spec.containers[{i}].name", "required")
            container: dict[str, Any] = {"name": c["name"]}
            status = statuses.get(c["name"]) or {}
            status_field = f"status.containerStatuses[name={c['name']}]"
            if isinstance(status.get("containerID"), str) and status["containerID"]:
                container["container_id"] = status["containerID"]
            refs = self._container_claims(obj, c, by_pod_name, claims)
            if refs:
                container["claims"] = refs
                health = self._health(obj, status_field, status, refs, claims)
                if health:
                    container["device_health"] = health
            containers.append(container)
        pod: dict[str, Any] = {"namespace": obj.namespace, "name": obj.name, "containers": containers}
        uid = _get(obj.raw, "metadata", "uid")
        if isinstance(uid, str) and uid:
            pod["uid"] = uid
        return pod

    def _pod_claim_names(self, obj: _Obj) -> dict[str, str]:
        """Pod-level claim name → ResourceClaim name (``""``: no claim is needed or known yet)."""
        generated = {
            _text(obj, s.get("name"), f"status.resourceClaimStatuses[{i}].name"): _text(
                obj, s.get("resourceClaimName"), f"status.resourceClaimStatuses[{i}].resourceClaimName"
            )
            for i, s in enumerate(_list(_get(obj.raw, "status", "resourceClaimStatuses")))
            if isinstance(s, Mapping)
        }
        out = {}
        for i, ref in enumerate(_list(_get(obj.raw, "spec", "resourceClaims"))):
            if not isinstance(ref, Mapping) or not isinstance(ref.get("name"), str):
                raise obj.error(f"spec.resourceClaims[{i}].name", "required")
            direct = ref.get("resourceClaimName")
            out[ref["name"]] = (
                direct if isinstance(direct, str) and direct else generated.get(ref["name"], "")
            )
        return out

    def _container_claims(
        self,
        obj: _Obj,
        c: Mapping[str, Any],
        by_pod_name: Mapping[str, str],
        claims: Mapping[tuple[str, str], tuple[dict[str, Any], _Obj]],
    ) -> list[Any]:
        refs: list[Any] = []
        seen: set[str] = set()
        for ref in _list(_get(c, "resources", "claims")):
            if not isinstance(ref, Mapping):
                continue
            name = by_pod_name.get(str(ref.get("name")), "")
            found = claims.get((obj.namespace, name))
            if found is None or name in seen:
                continue  # not allocated on this node (or not at all), or named twice
            seen.add(name)
            request = ref.get("request")
            if isinstance(request, str) and any(r["name"] == request for r in found[0]["requests"]):
                refs.append({"claim": name, "request": request})
            else:
                refs.append(name)
        return refs

    def _health(
        self,
        obj: _Obj,
        field: str,
        status: Mapping[str, Any],
        refs: list[Any],
        claims: Mapping[tuple[str, str], Any],
    ) -> dict[str, str]:
        mine = set()
        for ref in refs:
            claim = claims[(obj.namespace, ref if isinstance(ref, str) else ref["claim"])][0]
            request = "" if isinstance(ref, str) else ref["request"]
            mine |= {
                f"{claim['driver']}/{claim['pool']}/{d}"
                for r in claim["requests"]
                if not request or r["name"] == request
                for d in r["devices"]
            }
        out = {}
        for i, entry in enumerate(_list(status.get("allocatedResourcesStatus"))):
            for j, res in enumerate(_list(_get(entry, "resources"))):
                where = f"{field}.allocatedResourcesStatus[{i}].resources[{j}]"
                rid = _text(obj, _get(res, "resourceID"), f"{where}.resourceID")
                health = _text(obj, _get(res, "health"), f"{where}.health")
                if rid in mine and health in DEVICE_HEALTH:
                    out[rid.rsplit("/", 1)[1]] = health
        return out

    def _reserved_only_pods(
        self, claims: Mapping[tuple[str, str], tuple[dict[str, Any], _Obj]], present: set[tuple[str, str]]
    ) -> list[dict[str, Any]]:
        # Pods missing from the dump: the claim's reservedFor still names them (and their UIDs).
        missing: dict[tuple[str, str], dict[str, Any]] = {}
        for (ns, name), (_, obj) in claims.items():
            for i, ref in enumerate(_list(_get(obj.raw, "status", "reservedFor"))):
                if not isinstance(ref, Mapping) or ref.get("resource") != "pods" or ref.get("apiGroup"):
                    continue
                pod_name = ref.get("name")
                if not isinstance(pod_name, str) or not pod_name:
                    raise obj.error(f"status.reservedFor[{i}].name", "required")
                if (ns, pod_name) in present:
                    continue
                pod = missing.setdefault(
                    (ns, pod_name),
                    {
                        "namespace": ns,
                        "name": pod_name,
                        "containers": [{"name": UNKNOWN_CONTAINER, "claims": []}],
                    },
                )
                if isinstance(ref.get("uid"), str) and ref["uid"]:
                    pod.setdefault("uid", ref["uid"])
                pod["containers"][0]["claims"].append(name)
        return list(missing.values())


def _text(obj: _Obj, value: Any, field: str) -> str:
    """A string field of ``obj``; ``""`` where it is missing or null, an error naming it for any other type.

    Values used as keys or looked up in sets must be checked first: a mapping or a list
    there would be a ``TypeError``, not a message.
    """
    if value is None or isinstance(value, str):
        return value or ""
    raise obj.error(field, f"expected a string, got {_type_name(value)}")


def _type_name(value: Any) -> str:
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {value!r}"[:60]


def _attr(attrs: Mapping[str, Any], name: str, kind: str = "string") -> str:
    """A string attribute's value; NVIDIA's own attributes may also be written with its domain."""
    value = attrs.get(name) or attrs.get(f"{NVIDIA_DRIVER}/{name}")
    text = _get(value, kind)
    return text if isinstance(text, str) else ""


def _version(attrs: Mapping[str, Any], name: str) -> str:
    return _attr(attrs, name, "version")


def _memory_slices(capacity: Mapping[str, Any]) -> list[str]:
    """The ``memorySlice<i>`` capacities of a static MIG device: one per memory slice it occupies."""
    return [k for k in capacity if isinstance(k, str) and _MEMORY_SLICE.fullmatch(k)]


def _nvml_driver_version(semver: str) -> str:
    """NVIDIA's driver publishes ``580.159.04`` as the semver ``580.159.4``; NVML writes the patch with
    two digits (every release since 3xx does), so that is how it is written back."""
    parts = semver.split(".")
    if len(parts) == 3 and all(p.isdigit() for p in parts):
        return f"{int(parts[0])}.{int(parts[1])}.{int(parts[2]):02d}"
    return semver


def _major(version: str) -> int | None:
    head = version.partition(".")[0]
    return int(head) if head.isdigit() else None


def _nvml_bus_id(s: _Obj, field: str, value: str) -> str:
    """The attribute's ``0000:18:00.0`` as NVML writes it: ``00000000:18:00.0``."""
    m = _PCI_ADDRESS.fullmatch(value)
    if m is None:
        raise s.error(field, f"{value!r} is not a PCI address (domain:bus:device.function)")
    return f"{int(m['domain'], 16):08X}:{m['bus'].upper()}:{m['device'].upper()}.{m['function']}"
