"""Scenario YAML to a validated ``Scenario``: reading and checking the scenario format.

``read_documents`` reads a built-in scenario or a file (size-capped, UTF-8 only) and parses
it with a YAML loader that refuses duplicate keys; ``parse_scenario`` walks the document
with a ``Cursor`` that
tracks the field path, so every problem is a ``ScenarioError`` naming the file and the
field (``demo.yaml: gpus[1].mig[0].placement_start: ...``), never a traceback. The
``_Builder`` checks the document against the GPU profile and itself (MIG layouts,
device names, claim exclusivity, memory, fault parameters) and fills in the identifiers
the file leaves out, deterministically from the seed.

It is separate from ``scenario`` so that the records and their queries, which the whole
simulator reads, stay short and free of the format's validation rules, which only loading
needs. It imports the records from ``scenario``, never the other way round; ``dump`` builds
on it, ``loader`` chooses between the two.
"""

from __future__ import annotations

import builtins
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from dra_exporter import model, strict_yaml
from dra_exporter.boundedio import FileTooLargeError, read_text
from dra_exporter.resolve import (
    NVIDIA_DRIVER,
    NvidiaNameResolver,
    nvidia_device_name,
    parse_nvidia_device_name,
)

from .profile import GPU_MODELS, GpuProfile, NvLinkSpec, load_profile
from .scenario import (
    API_VERSIONS,
    BUS_NUMBERS,
    CONDITION_STATUS,
    DEVICE_HEALTH,
    FAULT_KINDS,
    INIT_ERRORS,
    MAX_CLAIM_DEVICES,
    MAX_GPUS,
    NVIDIA_GPU_CLASS,
    NVIDIA_MIG_CLASS,
    NVLINK_ERROR_TYPES,
    NVML_FAMILIES,
    TAINT_EFFECTS,
    Claim,
    ClaimRequest,
    Container,
    Curve,
    DeviceStatus,
    DriverSlice,
    Fault,
    Gpu,
    Hardware,
    LeftoverCdiSpec,
    MigDevice,
    PluginDevice,
    Pod,
    PodRef,
    Process,
    Scenario,
    ScenarioError,
    SliceDevice,
    SubRequest,
    TimedCondition,
    claim_use,
    derived_uuid,
    digest,
)

# Limits and patterns only reading and validation use.
_PID_MIN, _PID_SPAN = 1000, 4_000_000
_MAX_FILE_BYTES: Final = 4 << 20
_K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_QUANTITY = re.compile(r"(\d+(?:\.\d+)?)\s*(Ki|Mi|Gi|Ti|Pi|k|K|M|G|T|P)?")
_UNITS: Final = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50,
                 "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
_MIG_RESOURCE = re.compile(r"nvidia\.com/mig-(?P<profile>.+)")
_GPU_RESOURCE: Final = "nvidia.com/gpu"
_QUALIFIED_NAME = re.compile(r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z_][A-Za-z0-9_]{0,31}")
_CONDITION_TYPE = re.compile(
    r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_REASON = re.compile(r"[A-Za-z]([A-Za-z0-9_,:]{0,1022}[A-Za-z0-9_])?")
_SCENARIO_DIR: Final = "scenarios"


def not_an_object(item: Any) -> str | None:
    """Why a list item is not a Kubernetes object (what is missing, not a blanket "needs kind and
    apiVersion": a truncated file's last item often has one of them); None when it is one."""
    if not isinstance(item, Mapping):
        return f"expected a Kubernetes object, got {'nothing' if item is None else type(item).__name__}"
    kind, version = item.get("kind"), item.get("apiVersion")
    has_kind, has_version = isinstance(kind, str) and bool(kind), isinstance(version, str) and bool(version)
    if has_kind and has_version:
        return None
    if not has_kind and not has_version:
        return "expected a Kubernetes object: it has neither kind nor apiVersion"
    present = f"apiVersion {version!r}" if has_version else f"kind {kind!r}"
    missing = "kind" if has_version else "apiVersion"
    return f"{present} but no {missing} (a truncated file?)"


def builtin_scenarios() -> list[str]:
    """Names accepted by ``loader.load_scenario`` besides file paths."""
    folder = resources.files(__package__).joinpath(_SCENARIO_DIR)
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def read_documents(source: str | os.PathLike[str]) -> tuple[str, list[Any]]:
    """The label (for messages) and every YAML document of a built-in scenario or a file."""
    label, text = _read_source(source)
    return label, _parse_yaml_documents(label, text)


def parse_scenario(data: Any, label: str = "<scenario>", hardware: Hardware | None = None,
                   path: str = "") -> Scenario:
    """Validate already-parsed YAML (a mapping) into a ``Scenario``; ``hardware`` replaces the GPUs' identity;
    ``path`` is where the mapping is in its file (``nodes[2]`` of a multi-node scenario), for messages."""
    return _Builder(label, hardware).build(Cursor(label, path, data))


def _read_source(source: str | os.PathLike[str]) -> tuple[str, str]:
    if isinstance(source, str) and source in builtin_scenarios() and not os.path.exists(source):
        name = f"{source}.yaml"
        return name, resources.files(__package__).joinpath(_SCENARIO_DIR, name).read_text()
    path = Path(source)
    label = os.fspath(source)
    try:
        return label, read_text(path, _MAX_FILE_BYTES)
    except FileTooLargeError:
        raise ScenarioError(f"{label}: file is larger than {_MAX_FILE_BYTES >> 20} MiB; not a scenario") from None
    except FileNotFoundError:
        raise ScenarioError(f"scenario {label!r}: no such file, and not a built-in scenario "
                            f"(built-ins: {', '.join(builtin_scenarios())})") from None
    except IsADirectoryError:
        raise ScenarioError(f"scenario {label!r} is a directory, not a YAML file") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"{label}: not a UTF-8 text file") from None
    except OSError as e:
        raise ScenarioError(f"scenario {label!r}: cannot read it: {e.strerror}") from None


def _parse_yaml_documents(label: str, text: str) -> list[Any]:
    """Every document of a (possibly multi-document) YAML text; ``[None]`` for an empty one."""
    try:
        docs = strict_yaml.load_all(text)
    except strict_yaml.YamlFileError as e:
        raise ScenarioError(f"{label}: {e}") from None
    return docs or [None]


#: A Kubernetes object UID as the API server writes it.
_CLAIM_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class Cursor:
    """A value inside the YAML document, with its field path for error messages."""

    __slots__ = ("label", "path", "value")

    def __init__(self, label: str, path: str, value: Any) -> None:
        self.label, self.path, self.value = label, path, value

    def error(self, message: str) -> ScenarioError:
        where = f"{self.label}: {self.path}" if self.path else self.label
        return ScenarioError(f"{where}: {message}")

    def key(self, name: str) -> Cursor:
        value = self.value.get(name) if isinstance(self.value, dict) else None
        return Cursor(self.label, f"{self.path}.{name}" if self.path else name, value)

    def items(self) -> Iterator[tuple[int, Cursor]]:
        for i, value in enumerate(self.list()):
            yield i, Cursor(self.label, f"{self.path}[{i}]", value)

    @property
    def present(self) -> bool:
        return self.value is not None

    def mapping(self, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> Cursor:
        if not isinstance(self.value, dict):
            raise self.error(f"expected a mapping with keys {', '.join(required + optional)}, "
                             f"got {_kind(self.value)}")
        for key in self.value:
            if key not in required and key not in optional:
                raise self.key(str(key)).error(
                    f"unknown key (allowed here: {', '.join(required + optional)})")
        for key in required:
            if self.value.get(key) is None:
                raise self.key(key).error("required")
        return self

    def list(self) -> list[Any]:
        if self.value is None:
            return []
        if not isinstance(self.value, list):
            raise self.error(f"expected a list, got {_kind(self.value)}")
        return self.value

    def str(self, default: str | None = None, pattern: re.Pattern[str] | None = None, what: str = "") -> str:
        if self.value is None and default is not None:
            return default
        if not isinstance(self.value, str) or not self.value:
            raise self.error(f"expected a non-empty string, got {_kind(self.value)}")
        if pattern is not None and not pattern.fullmatch(self.value):
            raise self.error(f"{self.value!r} is not a valid {what}")
        return self.value

    def name(self, what: builtins.str, pattern: re.Pattern[builtins.str] | None = None) -> builtins.str:
        """A Kubernetes object name."""
        return self.str(pattern=pattern or _K8S_NAME, what=f"{what} (lowercase letters, digits, '-' and '.')")

    def int(self, default: int | None = None, minimum: int | None = None) -> int:
        if self.value is None and default is not None:
            return default
        if isinstance(self.value, bool) or not isinstance(self.value, int):
            raise self.error(f"expected an integer, got {_kind(self.value)}")
        if minimum is not None and self.value < minimum:
            raise self.error(f"must be >= {minimum}, got {self.value}")
        return self.value

    def number(self, default: float | None = None, minimum: float | None = None) -> float:
        if self.value is None and default is not None:
            return default
        value = self.value
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise self.error(f"expected a number, got {_kind(value)}")
        if minimum is not None and value < minimum:
            raise self.error(f"must be >= {minimum:g}, got {value:g}")
        return float(value)

    def bool(self, default: bool) -> bool:
        if self.value is None:
            return default
        if not isinstance(self.value, bool):
            raise self.error(f"expected true or false, got {_kind(self.value)}")
        return self.value


def _gi_id(size: int, start: int) -> int:
    """GPU-instance id for a placement; distinct for any non-overlapping layout."""
    return {8: 0, 4: 1 + start // 4, 2: 3 + start // 2}.get(size, 7 + start)


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"boolean {value}"
    if isinstance(value, int | float):
        return f"number {value}"
    if isinstance(value, str):
        return f"string {value!r}" if len(value) < 60 else "a long string"
    names: dict[type, str] = {dict: "a mapping", list: "a list"}
    return names.get(type(value), type(value).__name__)


class _Builder:
    """Turns the validated document into records, in dependency order."""

    def __init__(self, label: str, hardware: Hardware | None = None) -> None:
        self.label = label
        self.hardware = hardware
        self.seed = 0
        self.node = ""
        self.profile: GpuProfile
        self.gpus: dict[int, Gpu] = {}
        self.devices: tuple[model.GpuDevice, ...] = ()
        self.resolver: NvidiaNameResolver
        self.claims: dict[tuple[str, str], Claim] = {}
        self.slices: dict[tuple[str, str], DriverSlice] = {}
        self.uuids: dict[str, str] = {}
        self.pids: dict[int, str] = {}
        self.process_paths: dict[str, str] = {}

    def build(self, doc: Cursor) -> Scenario:
        if doc.value is None:
            raise doc.error("the file is empty")
        doc.mapping(("node", "gpus"), ("seed", "gpu_model", "exporter_pod", "claims", "pods", "faults",
                                       "description", "api_version", "slices", "dynamic_mig",
                                       "leftover_cdi_specs"))
        self.node = doc.key("node").name("node name")
        self.seed = doc.key("seed").int(default=0)
        gpu_model = doc.key("gpu_model").str(default="h200")
        if gpu_model not in GPU_MODELS:
            raise doc.key("gpu_model").error(
                f"unknown GPU model {gpu_model!r} (known: {', '.join(GPU_MODELS)})")
        self.profile = self.hardware.profile if self.hardware else load_profile(gpu_model)
        api_version = doc.key("api_version").str(default="v1")
        if api_version not in API_VERSIONS:
            raise doc.key("api_version").error(
                f"{api_version!r} is not a resource.k8s.io version the simulator serves "
                f"({', '.join(API_VERSIONS)})")
        dynamic_mig = doc.key("dynamic_mig").bool(False)
        if dynamic_mig and api_version == "v1beta1":
            raise doc.key("dynamic_mig").error("partitionable devices need resource.k8s.io v1beta2 or v1 "
                                               "(Kubernetes 1.33+); api_version is v1beta1")
        self._gpus(doc.key("gpus"), _without_nvidia_driver(doc.key("faults")))
        gpu_profile = self.hardware.profile if self.hardware else None
        scenario = Scenario(self.label, self.node, self.seed, gpu_model, tuple(self.gpus.values()),
                            gpu_profile=gpu_profile)
        self.devices = scenario.gpu_devices()
        self.resolver = NvidiaNameResolver(self.devices)
        slices = self._slices(doc.key("slices"))
        claims = tuple(self._claim(c) for _, c in doc.key("claims").items())
        self._check_exclusive(doc.key("claims"), claims)
        pods = self._pods(doc.key("pods"))
        self._check_templates(doc.key("claims"), claims, pods)
        faults = tuple(self._fault(f) for _, f in doc.key("faults").items())
        exporter = doc.key("exporter_pod")
        pod_ref = None
        if exporter.present:
            exporter.mapping(("namespace", "name"))
            pod_ref = PodRef(exporter.key("namespace").name("namespace"),
                             exporter.key("name").name("pod name"))
        description = doc.key("description").str(default="")
        leftovers = tuple(self._leftover_cdi(c) for _, c in doc.key("leftover_cdi_specs").items())
        return Scenario(self.label, self.node, self.seed, gpu_model, scenario.gpus, claims, pods, faults,
                        pod_ref, description, api_version, slices, dynamic_mig, gpu_profile=gpu_profile,
                        leftover_cdi_specs=leftovers)

    def _leftover_cdi(self, c: Cursor) -> LeftoverCdiSpec:
        """A CDI spec a driver left behind for a claim the cluster does not have (``claim_uid``), for
        devices of this node."""
        c.mapping(("claim_uid", "devices"), ("driver",))
        uid = c.key("claim_uid").str()
        if not _CLAIM_UID.fullmatch(uid):
            raise c.key("claim_uid").error(f"{uid!r} is not a claim UID (8-4-4-4-12 lower-case hex)")
        devices = tuple(d.str() for _, d in c.key("devices").items())
        if not devices:
            raise c.key("devices").error("a spec names at least one device")
        return LeftoverCdiSpec(uid, devices, c.key("driver").str(default=NVIDIA_DRIVER))

    # -- GPUs and MIG ------------------------------------------------------------------------

    def _gpus(self, cur: Cursor, may_be_empty: bool) -> None:
        if not cur.list() and not may_be_empty:
            raise cur.error("a node needs at least one GPU (a node without NVIDIA's driver: an init_failure "
                            "fault at 0 with no until)")
        for _, g in cur.items():
            g.mapping(("index",), ("uuid", "mig", "taints", "nvlink"))
            index = g.key("index").int(minimum=0)
            if index >= MAX_GPUS:
                raise g.key("index").error(f"at most {MAX_GPUS} GPUs per node; index must be < {MAX_GPUS}")
            if index in self.gpus:
                raise g.key("index").error(f"GPU index {index} is listed twice")
            gpu_uuid = self._uuid(g.key("uuid"), "GPU-", g.path, ("gpu", str(index)))
            mig = self._mig(g.key("mig"), index)
            taints = _taints(g.key("taints"))
            if taints and mig:
                raise g.key("taints").error("a MIG-enabled GPU is published as its MIG devices; "
                                            "taint those (mig[].taints)")
            bus_id = (self.hardware.pci_bus_ids.get(index) if self.hardware else None) or \
                f"00000000:{BUS_NUMBERS[index]:02X}:00.0"
            tx, rx = self._nvlink_traffic(g.key("nvlink"))
            self.gpus[index] = Gpu(index, gpu_uuid, bus_id, mig, taints, tx, rx)
        missing = sorted(set(range(len(self.gpus))) - set(self.gpus))
        if missing:
            raise cur.error(f"GPU indexes must be 0..{len(self.gpus) - 1} without gaps, as NVML numbers "
                            f"them; missing {', '.join(map(str, missing))}")
        self.gpus = dict(sorted(self.gpus.items()))

    def _nvlink_traffic(self, cur: Cursor) -> tuple[Curve | None, Curve | None]:
        """``nvlink: {tx: curve, rx: curve}`` in bytes per second, at most what the links carry."""
        if not cur.present:
            return None, None
        links = self._nvlink_spec(cur)
        cur.mapping((), ("tx", "rx"))
        capacity = links.links * links.speed_mbps * 1e6
        return tuple(_curve(cur.key(d), 0.0, capacity) if cur.key(d).present else None  # type: ignore[return-value]
                     for d in ("tx", "rx"))

    def _nvlink_spec(self, cur: Cursor) -> NvLinkSpec:
        if self.profile.nvlink is None:
            raise cur.error(f"the {self.profile.model} of this node has no NVLink as simulated (gpu_model "
                            "h200 is the recording, which answered NOT_SUPPORTED); use gpu_model h200-hgx "
                            "or gb200")
        return self.profile.nvlink

    def _link_param(self, cur: Cursor) -> int:
        links = self._nvlink_spec(cur).links
        link = cur.int(minimum=0)
        if link >= links:
            raise cur.error(f"a {self.profile.model} has NVLinks 0..{links - 1}; got {link}")
        return link

    def _nvlink_error_type(self, cur: Cursor) -> str:
        generation = self._nvlink_spec(cur).generation
        return _one_of(NVLINK_ERROR_TYPES[generation])(self, cur, None)

    def _mig(self, cur: Cursor, gpu: int) -> tuple[MigDevice, ...]:
        prof = self.profile
        used: dict[int, str] = {}
        out: list[MigDevice] = []
        for i, m in cur.items():
            m.mapping(("profile", "placement_start"), ("uuid", "taints", "published"))
            name = m.key("profile").str()
            mp = prof.mig_profile(name)
            if mp is None:
                raise m.key("profile").error(f"unknown MIG profile {name!r} for {prof.model} "
                                             f"(known: {', '.join(p.name for p in prof.mig_profiles)})")
            start = m.key("placement_start").int(minimum=0)
            if start not in mp.starts:
                raise m.key("placement_start").error(
                    f"{name} cannot start at slice {start} (valid starts: {', '.join(map(str, mp.starts))})")
            for s in range(start, start + mp.memory_slices):
                if s in used:
                    last = start + mp.memory_slices - 1
                    raise m.error(f"{name} at slices {start}-{last} overlaps {used[s]}")
            for s in range(start, start + mp.memory_slices):
                used[s] = f"{cur.path}[{i}] ({name} at {start})"
            if sum(d.profile == name for d in out) >= mp.max_instances:
                raise m.error(f"at most {mp.max_instances} x {name} fit on one {prof.model}")
            mig_uuid = self._uuid(m.key("uuid"), "MIG-", m.path, ("mig", str(gpu), str(start), name))
            share = mp.memory_slices / prof.mig_memory_slices
            out.append(MigDevice(name, mp.gi_profile_id, start, mp.memory_slices, mp.compute_slices,
                                 _gi_id(mp.memory_slices, start), 0, mig_uuid,
                                 int(prof.memory_total * share), int(prof.memory_reserved * share),
                                 _taints(m.key("taints")), m.key("published").bool(True)))
        if sum(d.compute_slices for d in out) > prof.mig_compute_slices:
            raise cur.error(f"the MIG devices need {sum(d.compute_slices for d in out)} compute slices; "
                            f"a {prof.model} has {prof.mig_compute_slices}")
        return tuple(sorted(out, key=lambda d: d.placement_start))

    def _uuid(self, cur: Cursor, prefix: str, owner: str, parts: tuple[str, ...]) -> str:
        if cur.present:
            value = cur.str(pattern=re.compile(re.escape(prefix) + r"[0-9A-Za-z-]{1,80}"),
                            what=f"UUID (expected {prefix}…)")
        else:
            value = prefix + derived_uuid(self.seed, *parts)
        if value in self.uuids:
            raise cur.error(f"UUID {value} is already used by {self.uuids[value]}")
        self.uuids[value] = owner
        return value

    # -- claims --------------------------------------------------------------------------------

    def _claim(self, c: Cursor) -> Claim:
        c.mapping(("namespace", "name"), ("uid", "request", "admin_access", "driver", "pool", "devices",
                                          "requests", "template", "device_status"))
        ns = c.key("namespace").name("namespace")
        name = c.key("name").name("claim name")
        if (ns, name) in self.claims:
            raise c.key("name").error(f"claim {ns}/{name} is defined twice")
        uid = c.key("uid").str() if c.key("uid").present else derived_uuid(self.seed, "claim", ns, name)
        driver = c.key("driver").str(default=NVIDIA_DRIVER, pattern=_K8S_NAME, what="driver name")
        pool = c.key("pool").name("pool name") if c.key("pool").present else self.node
        if driver == NVIDIA_DRIVER and pool != self.node:
            raise c.key("pool").error(f"NVIDIA's pool is the node name ({self.node!r}), not {pool!r}")
        seen: set[str] = set()
        if c.key("requests").present:
            for key in ("devices", "request"):
                if c.key(key).present:
                    raise c.key(key).error("give either 'requests' or 'devices' (with 'request'), not both")
            if not c.key("requests").list():
                raise c.key("requests").error("a claim needs at least one request")
            built: list[ClaimRequest] = []
            for _, r in c.key("requests").items():
                request = self._request(r, driver, pool, seen)
                if any(x.name == request.name for x in built):
                    raise r.key("name").error(f"request {request.name!r} is defined twice")
                built.append(request)
            requests = tuple(built)
        else:
            if not c.key("devices").present:
                raise c.key("devices").error("required (or 'requests')")
            request_name = (c.key("request").name("request name", _DNS_LABEL) if c.key("request").present
                            else "gpu")
            devices = self._claim_devices(c.key("devices"), driver, pool, seen)
            requests = (ClaimRequest(request_name, devices, self._device_class(driver, devices)),)
        devices = tuple(d for r in requests for d in r.devices)
        if len(devices) > MAX_CLAIM_DEVICES:
            raise c.error(f"claim {ns}/{name} has {len(devices)} devices: a real API server allocates at most "
                          f"{MAX_CLAIM_DEVICES} to one claim (status.allocation.devices.results); split it")
        admin = c.key("admin_access").bool(False)
        if admin and any(r.first_available for r in requests):
            raise c.key("admin_access").error("a prioritized list (first_available) cannot ask for admin "
                                              "access")
        template = c.key("template").name("ResourceClaimTemplate name") if c.key("template").present else ""
        status = tuple(self._device_status(d, devices) for _, d in c.key("device_status").items())
        claim = Claim(ns, name, uid, requests[0].name, admin, driver, pool, devices,
                      requests if c.key("requests").present else (), template, status)
        self.claims[(ns, name)] = claim
        return claim

    def _claim_devices(self, cur: Cursor, driver: str, pool: str, seen: set[str]) -> tuple[str, ...]:
        devices: list[str] = []
        if not cur.list():
            raise cur.error("a claim needs at least one device")
        for _, d in cur.items():
            device = d.str()
            if driver == NVIDIA_DRIVER:
                self._nvidia_device(d, device)
            else:
                self._slice_device(d, driver, pool, device)
            if device in seen:
                raise d.error(f"device {device!r} is listed twice")
            seen.add(device)
            devices.append(device)
        return tuple(devices)

    def _request(self, r: Cursor, driver: str, pool: str, seen: set[str]) -> ClaimRequest:
        r.mapping(("name", "devices"), ("device_class", "all", "first_available", "allocated"))
        name = r.key("name").name("request name", _DNS_LABEL)
        devices = self._claim_devices(r.key("devices"), driver, pool, seen)
        every = r.key("all").bool(False)
        if not r.key("first_available").present:
            if r.key("allocated").present:
                raise r.key("allocated").error("only a prioritized list (first_available) has an allocated "
                                               "subrequest")
            device_class = (r.key("device_class").name("DeviceClass name") if r.key("device_class").present
                            else self._device_class(driver, devices))
            return ClaimRequest(name, devices, device_class, every)
        for key in ("device_class", "all"):
            if r.key(key).present:
                raise r.key(key).error("a prioritized list sets this per subrequest (first_available[])")
        subs: list[SubRequest] = []
        if not r.key("first_available").list():
            raise r.key("first_available").error("a prioritized list needs at least one subrequest")
        if len(r.key("first_available").list()) > 8:
            raise r.key("first_available").error("at most 8 subrequests")
        if not r.key("allocated").present:
            raise r.key("allocated").error("required with first_available: the subrequest the scheduler "
                                           "chose")
        allocated = r.key("allocated").str()
        for _, sub in r.key("first_available").items():
            sub.mapping(("name",), ("device_class", "count"))
            sub_name = sub.key("name").name("subrequest name", _DNS_LABEL)
            if any(x.name == sub_name for x in subs):
                raise sub.key("name").error(f"subrequest {sub_name!r} is defined twice")
            count_default = len(devices) if sub_name == allocated else 1
            subs.append(SubRequest(
                sub_name,
                sub.key("device_class").name("DeviceClass name") if sub.key("device_class").present
                else self._device_class(driver, devices),
                sub.key("count").int(default=count_default, minimum=1)))
        if allocated not in {x.name for x in subs}:
            raise r.key("allocated").error(f"{allocated!r} is not one of the subrequests "
                                           f"({', '.join(x.name for x in subs)})")
        return ClaimRequest(name, devices, "", False, tuple(subs), allocated)

    def _device_class(self, driver: str, devices: tuple[str, ...]) -> str:
        # NVIDIA's chart installs one DeviceClass per device type; other drivers usually
        # name theirs after the driver.
        if driver != NVIDIA_DRIVER:
            return driver
        parsed = [parse_nvidia_device_name(d) for d in devices]
        return NVIDIA_MIG_CLASS if any(p is not None and p.is_mig for p in parsed) else NVIDIA_GPU_CLASS

    def _device_status(self, cur: Cursor, devices: tuple[str, ...]) -> DeviceStatus:
        cur.mapping(("device", "conditions"))
        device = cur.key("device").str()
        if device not in devices:
            raise cur.key("device").error(f"{device!r} is not a device of this claim "
                                          f"({', '.join(devices)})")
        conditions: list[TimedCondition] = []
        for _, c in cur.key("conditions").items():
            c.mapping(("type", "status"), ("reason", "message", "at"))
            ctype = c.key("type").str(pattern=_CONDITION_TYPE, what="condition type")
            if any(x.condition.type == ctype for x in conditions):
                raise c.key("type").error(f"condition {ctype!r} is listed twice")
            status = c.key("status").value
            if isinstance(status, bool):  # YAML reads an unquoted True as a boolean
                status = "True" if status else "False"
            if status not in CONDITION_STATUS:
                raise c.key("status").error(f"{status!r} is not one of {', '.join(CONDITION_STATUS)}")
            conditions.append(TimedCondition(
                model.DeviceCondition(ctype, status, c.key("reason").str(default=ctype, pattern=_REASON,
                                                                         what="reason (CamelCase)")),
                "" if c.key("message").value == "" else c.key("message").str(default=""),
                c.key("at").number(default=0.0, minimum=0)))
        if len(conditions) > 8:
            raise cur.key("conditions").error("at most 8 conditions per device")
        return DeviceStatus(device, tuple(conditions))

    # -- other drivers' slices -----------------------------------------------------------------

    def _slices(self, cur: Cursor) -> tuple[DriverSlice, ...]:
        out: list[DriverSlice] = []
        for _, sl in cur.items():
            sl.mapping(("driver", "devices"), ("pool",))
            driver = sl.key("driver").str(pattern=_K8S_NAME, what="driver name")
            if driver == NVIDIA_DRIVER:
                raise sl.key("driver").error("the NVIDIA slice is derived from gpus; list other drivers here")
            pool = sl.key("pool").name("pool name") if sl.key("pool").present else self.node
            if any((x.driver, x.pool) == (driver, pool) for x in out):
                raise sl.key("pool").error(f"pool {pool!r} of {driver} is listed twice")
            devices: list[SliceDevice] = []
            if not sl.key("devices").list():
                raise sl.key("devices").error("a slice needs at least one device")
            if len(sl.key("devices").list()) > 128:
                raise sl.key("devices").error("at most 128 devices per ResourceSlice")
            for _, d in sl.key("devices").items():
                d.mapping(("name",), ("attributes", "capacity", "taints"))
                name = d.key("name").name("device name", _DNS_LABEL)
                if any(x.name == name for x in devices):
                    raise d.key("name").error(f"device {name!r} is listed twice")
                devices.append(SliceDevice(name, _attributes(d.key("attributes")),
                                           _capacities(d.key("capacity")), _taints(d.key("taints"))))
            out.append(DriverSlice(driver, pool, tuple(devices)))
        self.slices = {(x.driver, x.pool): x for x in out}
        return tuple(out)

    def _slice_device(self, cur: Cursor, driver: str, pool: str, device: str) -> None:
        # Without a slice of that driver the devices are taken as written (the kubelet view
        # needs no slice); with one, they must be in it.
        declared = [x for x in self.slices.values() if x.driver == driver]
        if not declared:
            return
        sl = self.slices.get((driver, pool))
        if sl is None:
            raise cur.error(f"{driver} has no pool {pool!r} in slices (pools: "
                            f"{', '.join(x.pool for x in declared)})")
        if not any(d.name == device for d in sl.devices):
            raise cur.error(f"{device!r} is not a device of {driver} pool {pool!r} "
                            f"({', '.join(d.name for d in sl.devices)})")

    def _nvidia_device(self, cur: Cursor, name: str) -> str:
        """The NVML UUID of an NVIDIA DRA device name on this node."""
        parsed = parse_nvidia_device_name(name)
        if parsed is None:
            raise cur.error(f"{name!r} is not an NVIDIA DRA device name (gpu-<minor>, "
                            "gpu-<minor>-mig-<giProfileId>-<start>-<size> or "
                            "gpu-<minor>-mig-<profile>-<giProfileId>-<start>)")
        gpu = self.gpus.get(parsed.minor)
        if gpu is None:
            raise cur.error(f"{name!r}: the node has no GPU with minor {parsed.minor}")
        if not parsed.is_mig and gpu.mig_enabled:
            raise cur.error(f"{name!r}: GPU {gpu.index} is split into MIG devices and cannot be used whole "
                            f"(its devices: {', '.join(self._mig_names(gpu))})")
        found = self.resolver.resolve(NVIDIA_DRIVER, self.node, name)
        if found is None:
            have = ", ".join(self._mig_names(gpu)) or "none"
            raise cur.error(f"{name!r}: no such MIG device on GPU {gpu.index} (its MIG devices: {have})")
        return found

    def _mig_names(self, gpu: Gpu) -> list[str]:
        return [nvidia_device_name(d) for d in self.devices if d.parent_uuid == gpu.uuid]

    def _check_exclusive(self, cur: Cursor, claims: tuple[Claim, ...]) -> None:
        # The scheduler never gives one device to two ordinary claims; admin access is exempt.
        owner: dict[tuple[str, str], Claim] = {}
        for i, claim in enumerate(claims):
            if claim.admin_access:
                continue
            for j, device in enumerate(claim.devices):
                other = owner.setdefault((claim.driver, device), claim)
                if other is not claim:
                    where = Cursor(self.label, f"{cur.path}[{i}].devices[{j}]", device)
                    raise where.error(f"device {device!r} is already allocated to claim "
                                      f"{other.namespace}/{other.name}; only admin_access claims may share "
                                      "a device")

    # -- pods ----------------------------------------------------------------------------------

    def _pods(self, cur: Cursor) -> tuple[Pod, ...]:
        pods: list[Pod] = []
        seen: set[tuple[str, str]] = set()
        uids: set[str] = set()
        for _, p in cur.items():
            p.mapping(("namespace", "name", "containers"), ("uid", "start", "end", "labels"))
            ns = p.key("namespace").name("namespace")
            name = p.key("name").name("pod name")
            if (ns, name) in seen:
                raise p.key("name").error(f"pod {ns}/{name} is defined twice")
            seen.add((ns, name))
            uid = p.key("uid").str() if p.key("uid").present else derived_uuid(self.seed, "pod", ns, name)
            if uid in uids:
                raise p.key("uid").error(f"pod UID {uid} is used twice")
            uids.add(uid)
            start = p.key("start").number(default=0.0, minimum=0)
            end = p.key("end").number(minimum=0) if p.key("end").present else None
            if end is not None and end <= start:
                raise p.key("end").error(f"the pod must end after it starts (start {start:g}, end {end:g})")
            if not p.key("containers").list():
                raise p.key("containers").error("a pod needs at least one container")
            containers: list[Container] = []
            for _, c in p.key("containers").items():
                container = self._container(c, ns, name)
                if any(x.name == container.name for x in containers):
                    raise c.key("name").error(
                        f"container {container.name!r} is defined twice in pod {ns}/{name}")
                containers.append(container)
            pods.append(Pod(ns, name, uid, start, end, tuple(containers), self._labels(p.key("labels"))))
        self._check_memory(pods)
        return tuple(pods)

    def _labels(self, cur: Cursor) -> tuple[tuple[str, str], ...]:
        """A pod's ``labels: {team: ml}``: keys and values as the API server would admit them."""
        if not cur.present:
            return ()
        if not isinstance(cur.value, dict):
            raise cur.error(f"expected a mapping of label keys to values, got {_kind(cur.value)}")
        labels = []
        for key, value in cur.value.items():
            if not isinstance(key, str) or not model.is_label_key(key):
                raise cur.error(f"{str(key)[:80]!r} is not a Kubernetes label key")
            if not isinstance(value, str) or not model.is_label_value(value):
                raise cur.key(key).error("expected a label value: up to 63 letters, digits, '-', '_' and '.', "
                                         f"alphanumeric at both ends, got {_kind(value)}")
            labels.append((key, value))
        return tuple(sorted(labels))

    def _check_templates(self, cur: Cursor, claims: tuple[Claim, ...], pods: tuple[Pod, ...]) -> None:
        # A claim generated from a template belongs to exactly one pod; and a pod's claims must
        # have distinct pod-level names, since containers refer to them by those names.
        for i, claim in enumerate(claims):
            users = [p for p in pods if p.namespace == claim.namespace
                     and any(claim.name in c.claims for c in p.containers)]
            if claim.template and len(users) != 1:
                raise Cursor(self.label, f"{cur.path}[{i}].template", claim.template).error(
                    f"a claim generated from a template belongs to exactly one pod; "
                    f"{len(users)} pods use {claim.namespace}/{claim.name}")
        by_key = {(c.namespace, c.name): c for c in claims}
        for pod in pods:
            names: dict[str, str] = {}
            for used in sorted({n for c in pod.containers for n in c.claims}):
                pod_name = by_key[(pod.namespace, used)].pod_claim_name
                if names.setdefault(pod_name, used) != used:
                    raise cur.error(f"pod {pod.namespace}/{pod.name} uses claims {names[pod_name]!r} and "
                                    f"{used!r} under the same pod-level name {pod_name!r}")

    def _container(self, c: Cursor, ns: str, pod: str) -> Container:
        c.mapping(("name",), ("container_id", "claims", "plugin_devices", "processes", "device_health"))
        name = c.key("name").name("container name", _DNS_LABEL)
        owner = f"{ns}/{pod}/{name}"
        container_id = (c.key("container_id").str() if c.key("container_id").present
                        else "containerd://" + digest(self.seed, "container", ns, pod, name, size=32).hex())
        claims: list[str] = []
        requests: list[tuple[str, str]] = []
        for _, ref in c.key("claims").items():
            claim, request = self._claim_ref(ref, ns)
            if claim in claims:
                raise ref.error(f"claim {claim!r} is referenced twice")
            claims.append(claim)
            if request:
                requests.append((claim, request))
        plugin = tuple(self._plugin_devices(d) for _, d in c.key("plugin_devices").items())
        processes = tuple(self._process(p, owner, i) for i, p in c.key("processes").items())
        health = self._device_health(c.key("device_health"), ns, claims, dict(requests))
        return Container(name, container_id, tuple(claims), plugin, processes, tuple(requests), health)

    def _claim_ref(self, ref: Cursor, ns: str) -> tuple[str, str]:
        """A container's claim reference: ``name`` or ``{claim: name, request: r}``."""
        request = ""
        if isinstance(ref.value, dict):
            ref.mapping(("claim",), ("request",))
            claim_cur = ref.key("claim")
            claim = claim_cur.str()
        else:
            claim_cur = ref
            claim = ref.str()
        found = self.claims.get((ns, claim))
        if found is None:
            raise claim_cur.error(f"claim {claim!r} not defined in namespace {ns!r}")
        if isinstance(ref.value, dict) and ref.key("request").present:
            request = ref.key("request").str()
            names = [r.name for r in found.all_requests()]
            if request not in names:
                raise ref.key("request").error(f"claim {claim!r} has no request {request!r} "
                                               f"(its requests: {', '.join(names)})")
        return claim, request

    def _device_health(self, cur: Cursor, ns: str, claims: list[str],
                       requests: dict[str, str]) -> tuple[tuple[str, str], ...]:
        if not cur.present:
            return ()
        if not isinstance(cur.value, dict) or not cur.value:
            raise cur.error(f"expected a mapping of device name to health "
                            f"({', '.join(DEVICE_HEALTH)}), got {_kind(cur.value)}")
        names = {d.device for claim in claims
                 for d in claim_use(self.claims[(ns, claim)], requests.get(claim, "")).devices}
        out: list[tuple[str, str]] = []
        for device, health in cur.value.items():
            where = cur.key(str(device))
            if device not in names:
                raise where.error(f"{device!r} is not a device of this container's claims "
                                  f"({', '.join(sorted(names)) or 'none'})")
            if health not in DEVICE_HEALTH:
                raise where.error(f"{health!r} is not one of {', '.join(DEVICE_HEALTH)}")
            out.append((str(device), str(health)))
        return tuple(out)

    def _plugin_devices(self, cur: Cursor) -> PluginDevice:
        cur.mapping(("resource", "ids"))
        resource = cur.key("resource").str()
        mig = _MIG_RESOURCE.fullmatch(resource)
        if resource != _GPU_RESOURCE and not (mig and self.profile.mig_profile(mig["profile"])):
            raise cur.key("resource").error(
                f"{resource!r} is not nvidia.com/gpu or nvidia.com/mig-<profile> (profiles of the "
                f"{self.profile.model}: {', '.join(p.name for p in self.profile.mig_profiles)})")
        ids: list[str] = []
        if not cur.key("ids").list():
            raise cur.key("ids").error("needs at least one device id")
        for _, d in cur.key("ids").items():
            value = d.value
            if isinstance(value, int) and not isinstance(value, bool):
                value = str(value)  # YAML reads `ids: [0]` as an integer
            device_id = Cursor(d.label, d.path, value).str()
            if not self._plugin_id_known(device_id, mig["profile"] if mig else None):
                kind = f"{mig['profile']} MIG device UUID" if mig else "whole-GPU UUID or index"
                raise d.error(f"{device_id!r} is not a {kind} on this node")
            ids.append(device_id)
        return PluginDevice(resource, tuple(ids))

    def _plugin_id_known(self, device_id: str, mig_profile: str | None) -> bool:
        if mig_profile is not None:
            return any(d.uuid == device_id and d.profile == mig_profile for d in self.devices)
        return any(not g.mig_enabled and device_id in (g.uuid, str(g.index)) for g in self.gpus.values())

    def _process(self, p: Cursor, owner: str, i: int) -> Process:
        p.mapping(("device", "memory"), ("pid", "sm"))
        target = self._process_device(p.key("device"))
        memory = _quantity(p.key("memory"))
        sm = _curve(p.key("sm"), lo=0.0, hi=1.0) if p.key("sm").present else Curve(0.0)
        key = f"{owner}/{i}"
        self.process_paths[key] = p.path
        if p.key("pid").present:
            pid = p.key("pid").int(minimum=1)
            if self.pids.get(pid, owner) != owner:
                raise p.key("pid").error(f"PID {pid} already belongs to container {self.pids[pid]}")
        else:
            pid = self._derived_pid(key)
        self.pids[pid] = owner
        return Process(str(p.key("device").value), target, pid, memory, sm, key)

    def _derived_pid(self, key: str) -> int:
        n = int.from_bytes(digest(self.seed, "pid", key, size=8), "big")
        pid = _PID_MIN + n % _PID_SPAN
        while pid in self.pids:
            pid = _PID_MIN + (pid - _PID_MIN + 1) % _PID_SPAN
        return pid

    def _process_device(self, cur: Cursor) -> str:
        value = cur.value
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            gpu = self.gpus.get(value)
            if gpu is None:
                raise cur.error(f"the node has no GPU with index {value}")
            if gpu.mig_enabled:
                raise cur.error(f"GPU {value} is split into MIG devices; name one of them "
                                f"({', '.join(self._mig_names(gpu))})")
            return gpu.uuid
        return self._nvidia_device(cur, cur.str())

    def _check_memory(self, pods: list[Pod]) -> None:
        # Usage only grows when a pod starts, so checking at every start time is exhaustive.
        whole = self.profile.memory_total - self.profile.memory_reserved
        capacity = {g.uuid: whole for g in self.gpus.values()}
        capacity.update({m.uuid: m.memory_total - m.memory_reserved
                         for g in self.gpus.values() for m in g.mig})
        for t in sorted({p.start for p in pods}):
            used: dict[str, int] = {}
            for pod in pods:
                for proc in (q for c in pod.containers for q in c.processes if pod.alive_at(t)):
                    used[proc.uuid] = used.get(proc.uuid, 0) + proc.memory_bytes
                    if used[proc.uuid] > capacity[proc.uuid]:
                        name = next(nvidia_device_name(d) for d in self.devices if d.uuid == proc.uuid)
                        path = self.process_paths[proc.key] + ".memory"
                        raise Cursor(self.label, path, proc.memory_bytes).error(
                            f"at t={t:g} s the processes on {name} need {used[proc.uuid]} bytes of memory; "
                            f"it has {capacity[proc.uuid]}")

    # -- faults --------------------------------------------------------------------------------

    def _fault(self, f: Cursor) -> Fault:
        if not isinstance(f.value, dict):
            raise f.error(f"expected a mapping with keys kind, at, ..., got {_kind(f.value)}")
        if not f.key("kind").present:
            raise f.key("kind").error(f"required (one of {', '.join(FAULT_KINDS)})")
        kind = f.key("kind").str()
        if kind not in FAULT_KINDS:
            raise f.key("kind").error(f"unknown fault kind {kind!r} (known: {', '.join(FAULT_KINDS)})")
        spec = _FAULT_PARAMS[kind]
        f.mapping(("kind", "at") + spec.required, ("until",) + spec.optional)
        at = f.key("at").number(minimum=0)
        until = f.key("until").number(minimum=0) if f.key("until").present else None
        if until is not None and kind == "xid":
            raise f.key("until").error("an xid fault is one event at 'at'; it has no 'until'")
        if until is not None and until <= at:
            raise f.key("until").error(f"must be after 'at' ({until:g} <= {at:g})")
        if until is None and kind == "driver_rollout":
            raise f.key("until").error("required: a rollout ends when the old plugin instance's slices go")
        gpu = None
        if f.key("gpu").present:
            gpu = f.key("gpu").int(minimum=0)
            if gpu not in self.gpus:
                raise f.key("gpu").error(f"the node has no GPU with index {gpu}")
        params = {name: parse(self, f.key(name), gpu) for name, parse in spec.params.items()
                  if f.key(name).present}
        params.update({k: v for k, v in spec.defaults.items() if k not in params})
        if kind == "nvlink_errors" and "type" not in params:
            params["type"] = NVLINK_ERROR_TYPES[self._nvlink_spec(f).generation][0]
        if kind.startswith("fabric_") and self.profile.fabric is None:
            raise f.key("kind").error(f"the {self.profile.model} of this node answers no fabric info as "
                                      "simulated; use gpu_model h200-hgx or gb200")
        return Fault(kind, at, until, gpu, MappingProxyType(params))

    def _mig_device_param(self, cur: Cursor, gpu: int | None) -> str:
        name = cur.str()
        mig_uuid = self._nvidia_device(cur, name)
        parent = next(d.parent_uuid for d in self.devices if d.uuid == mig_uuid)
        if not parent or gpu is None or parent != self.gpus[gpu].uuid:
            raise cur.error(f"{name!r} is not a MIG device of GPU {gpu}")
        return name


def _without_nvidia_driver(faults: Cursor) -> bool:
    """Whether NVML fails to initialise for the whole run: then the node may have no GPU at all."""
    return any(isinstance(f, dict) and f.get("kind") == "init_failure" and f.get("at") == 0
               and f.get("until") is None for f in (faults.value if isinstance(faults.value, list) else ()))


def _one_of(choices: tuple[str, ...]) -> Callable[[_Builder, Cursor, int | None], str]:
    def parse(_: _Builder, cur: Cursor, __: int | None) -> str:
        value = cur.str()
        if value not in choices:
            raise cur.error(f"{value!r} is not one of {', '.join(choices)}")
        return value
    return parse


@dataclass(frozen=True, slots=True)
class _FaultParams:
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    params: Mapping[str, Callable[[_Builder, Cursor, int | None], Any]] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)


_FAULT_PARAMS: Final[Mapping[str, _FaultParams]] = {
    "gpu_lost": _FaultParams(required=("gpu",)),
    "family_unsupported": _FaultParams(("family",), ("gpu",), {"family": _one_of(NVML_FAMILIES)}),
    "init_failure": _FaultParams((), ("error",), {"error": _one_of(INIT_ERRORS)},
                                 {"error": "driver_not_loaded"}),
    "nvml_hang": _FaultParams((), ("gpu",)),
    "xid": _FaultParams(("gpu", "xid"), ("mig_device",),
                        {"xid": lambda b, c, g: c.int(minimum=0), "mig_device": _Builder._mig_device_param}),
    "driver_rollout": _FaultParams((), ("driver",), {"driver": lambda b, c, g: c.name("driver name")},
                                   {"driver": NVIDIA_DRIVER}),
    "nvlink_link_down": _FaultParams(("gpu", "link"), (), {"link": lambda b, c, g: b._link_param(c)}),
    "nvlink_errors": _FaultParams(("gpu", "link", "rate"), ("type",), {
        "link": lambda b, c, g: b._link_param(c), "rate": lambda b, c, g: c.number(minimum=0),
        "type": lambda b, c, g: b._nvlink_error_type(c)}),
    "fabric_unhealthy": _FaultParams((), ("gpu",)),
    "fabric_in_progress": _FaultParams((), ("gpu",)),
    "prepare_failed": _FaultParams(("pod",), (), {"pod": lambda b, c, g: c.str(what="pod as namespace/name")}),
    "kubelet_socket_gone": _FaultParams(),
    "kubelet_resource_exhausted": _FaultParams(),
    "kubelet_slow": _FaultParams(("delay",), (), {"delay": lambda b, c, g: c.number(minimum=0)}),
    "kubelet_malformed": _FaultParams(),
    "apiserver_gone": _FaultParams(),
    "apiserver_error": _FaultParams(),
    "apiserver_slow": _FaultParams(("delay",), (), {"delay": lambda b, c, g: c.number(minimum=0)}),
    "apiserver_watch_drop": _FaultParams(),
    "apiserver_gone_410": _FaultParams(),
}


def _taints(cur: Cursor) -> tuple[model.DeviceTaint, ...]:
    out: list[model.DeviceTaint] = []
    for _, t in cur.items():
        t.mapping(("key", "effect"), ("value",))
        key = t.key("key").str(pattern=_QUALIFIED_NAME, what="taint key")
        effect = t.key("effect").str()
        if effect not in TAINT_EFFECTS:
            raise t.key("effect").error(f"{effect!r} is not one of {', '.join(TAINT_EFFECTS)}")
        value = t.key("value").value
        if value is not None and not isinstance(value, str | int | bool):
            raise t.key("value").error(f"expected a string, got {_kind(value)}")
        value = "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        if len(value) > 63:
            raise t.key("value").error("at most 63 characters")
        out.append(model.DeviceTaint(key, value, effect))
    if len(out) > 16:
        raise cur.error("at most 16 taints per device")
    return tuple(out)


def _attributes(cur: Cursor) -> Mapping[str, Mapping[str, Any]]:
    """Scenario attributes (``model: x``, ``index: 3``, ``driverVersion: {version: 1.0.0}``) as API values."""
    if not cur.present:
        return MappingProxyType({})
    if not isinstance(cur.value, dict):
        raise cur.error(f"expected a mapping of attribute name to value, got {_kind(cur.value)}")
    out: dict[str, Mapping[str, Any]] = {}
    for name, value in cur.value.items():
        where = cur.key(str(name))
        if not isinstance(name, str) or not _QUALIFIED_NAME.fullmatch(name):
            raise where.error(f"{name!r} is not a valid attribute name")
        if isinstance(value, bool):
            out[name] = MappingProxyType({"bool": value})
        elif isinstance(value, int):
            out[name] = MappingProxyType({"int": value})
        elif isinstance(value, str) and len(value) <= 64:
            out[name] = MappingProxyType({"string": value})
        elif isinstance(value, dict) and list(value) == ["version"] and isinstance(value["version"], str):
            out[name] = MappingProxyType({"version": value["version"]})
        else:
            raise where.error(f"expected a string (at most 64 characters), an integer, true/false or "
                              f"{{version: x.y.z}}, got {_kind(value)}")
    return MappingProxyType(out)


def _capacities(cur: Cursor) -> Mapping[str, str]:
    if not cur.present:
        return MappingProxyType({})
    if not isinstance(cur.value, dict):
        raise cur.error(f"expected a mapping of capacity name to quantity, got {_kind(cur.value)}")
    out: dict[str, str] = {}
    for name, value in cur.value.items():
        where = cur.key(str(name))
        if not isinstance(name, str) or not _QUALIFIED_NAME.fullmatch(name):
            raise where.error(f"{name!r} is not a valid capacity name")
        _quantity(where)  # validates
        out[name] = str(value)
    return MappingProxyType(out)


def _quantity(cur: Cursor) -> int:
    value = cur.value
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise cur.error(f"must be >= 0 bytes, got {value}")
        return value
    if isinstance(value, str) and (m := _QUANTITY.fullmatch(value.strip())):
        return int(float(m[1]) * _UNITS[m[2]])
    raise cur.error(f"expected bytes as an integer or a quantity like \"20Gi\", got {_kind(value)}")


def _curve(cur: Cursor, lo: float, hi: float) -> Curve:
    if not isinstance(cur.value, dict):
        base = cur.number()
        if not lo <= base <= hi:
            raise cur.error(f"must be between {lo:g} and {hi:g}, got {base:g}")
        return Curve(base)
    cur.mapping(("base",), ("amplitude", "period", "phase", "noise"))
    base = cur.key("base").number()
    if not lo <= base <= hi:
        raise cur.key("base").error(f"must be between {lo:g} and {hi:g}, got {base:g}")
    period = cur.key("period").number(default=300.0)
    if period <= 0:
        raise cur.key("period").error(f"must be > 0 seconds, got {period:g}")
    return Curve(base, cur.key("amplitude").number(default=0.0, minimum=0), period,
                 cur.key("phase").number(default=0.0), cur.key("noise").number(default=0.0, minimum=0))
