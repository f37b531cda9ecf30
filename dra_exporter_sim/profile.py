"""GPU profiles: what a real GPU answered, recorded, for the fake NVML to answer alike.

``profiles/<model>.json`` is generated from the NVML recordings in the shared fixtures by
``profiles/make_profile.py``: values idle and under load, which calls and fields answer and
which raise NOT_SUPPORTED, per-call latencies, and the MIG profiles the model offers.
Scenarios use it to validate MIG layouts; the fake NVML to answer.

A node replayed from a cluster dump is whatever GPU its ResourceSlice names: ``identified``
keeps the recorded values (power, clocks, fields: the only recording there is) and takes the
identity from the slice (model, memory, driver version, architecture with GPM by it, compute
capability, CUDA driver version, the model's
MIG profiles from ``_MIG_MEMORY_NAMES`` or from the slice's own MIG devices).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final


@dataclass(frozen=True, slots=True)
class Range:
    """A quantity recorded idle and under load; ``at(x)`` interpolates (x=0 idle, x=1 load)."""

    idle: float
    load: float

    def at(self, x: float) -> float:
        return self.idle + (self.load - self.idle) * x


@dataclass(frozen=True, slots=True)
class ClockSpec:
    name: str
    """``graphics``, ``sm``, ``mem`` or ``video``."""
    idle: int
    load: int
    max: int


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One ``NVML_FI_DEV_*`` field as the recorded GPU answered it."""

    id: int
    name: str
    ret: int
    value_type: int
    idle: float
    load: float


@dataclass(frozen=True, slots=True)
class GpmSpec:
    """One GPM metric as the recorded GPU answered it (percent or MiB/s)."""

    id: int
    name: str
    ret: int
    idle: float
    load: float


@dataclass(frozen=True, slots=True)
class MigProfile:
    name: str
    gi_profile_id: int
    memory_slices: int
    """The placement size."""
    compute_slices: int
    starts: tuple[int, ...]
    max_instances: int


@dataclass(frozen=True, slots=True)
class NvLinkSpec:
    """A model's NVLink ports, as the fake NVML answers them (``profiles/<model>.json`` ``nvlink``)."""

    links: int
    version: int
    """``NVML_NVLINK_VERSION_*`` (6: NVLink 4.0, 7: NVLink 5.0)."""
    generation: str
    """``nvlink4`` (CRC/replay/recovery counters up to Hopper) or ``nvlink5`` (Blackwell ``COUNT_*``)."""
    speed_mbps: int
    """Per link and direction, as ``NVML_FI_DEV_NVLINK_GET_SPEED`` reports it (MBps)."""
    remote_type: int
    """``NVML_NVLINK_DEVICE_TYPE_*`` of every link's far end (2: an NVSwitch)."""
    tx_start_bytes: int
    rx_start_bytes: int
    bytes_per_s_at_full_load: float
    """Traffic per direction at 100 % utilisation, for GPUs the scenario gives no ``nvlink`` curves."""


@dataclass(frozen=True, slots=True)
class FabricSpec:
    """What ``nvmlDeviceGetGpuFabricInfoV`` answers (``profiles/<model>.json`` ``fabric``)."""

    state: int
    """``NVML_GPU_FABRIC_STATE_*``."""
    status: int
    """An ``nvmlReturn_t``: 0 when registration succeeded."""
    cluster_uuid: str
    """All zeros on HGX boards (NVLink within the node, no multi-node clique)."""
    clique_id: int
    health_summary: int
    """``NVML_GPU_FABRIC_HEALTH_SUMMARY_*``."""
    health: tuple[tuple[str, int], ...]
    """Health-mask field (``degraded_bw``, ``gfm_state``…) -> its NVML value; absent fields are 0
    (NOT_SUPPORTED)."""


@dataclass(frozen=True, slots=True)
class GpuProfile:
    """A GPU model's answers, from ``profiles/<model>.json``."""

    model: str
    driver_version: str
    nvml_version: str
    pci_device_id: int
    pci_subsystem_id: int
    memory_total: int
    memory_reserved: int
    context_overhead: int
    power_limit_mw: int
    power_mw: Range
    load_gpu_util: float
    """Utilisation (0-1) at which the ``load`` points were recorded."""
    memory_util: Range
    process_mem_util_per_sm_util: float
    energy_start_mj: int
    gpu_temperature: Range
    memory_temperature: Range
    clocks: tuple[ClockSpec, ...]
    idle_clock_event_reasons: int
    load_clock_event_reasons: int
    encoder: tuple[int, int]
    decoder: tuple[int, int]
    pcie_tx_start: int
    pcie_rx_start: int
    pcie_tx_idle_rate: float
    pcie_rx_idle_rate: float
    pcie_extra_rate_at_full_load: float
    gpm_supported: bool
    supported_event_types: int
    mig_memory_slices: int
    mig_compute_slices: int
    mig_max_devices: int
    mig_profiles: tuple[MigProfile, ...]
    fields: tuple[FieldSpec, ...]
    gpm_metrics: tuple[GpmSpec, ...]
    latency_us: tuple[tuple[str, float], ...]
    """Recorded median latency per NVML function, for realistic benchmarks."""
    architecture: str
    """``nvmlDeviceGetArchitecture`` as NVIDIA's driver names it (``Hopper``); "" when unknown (a dump
    whose slices do not say)."""
    cuda_compute_capability: str
    """``nvmlDeviceGetCudaComputeCapability`` as ``<major>.<minor>`` (``9.0``); "" when unknown."""
    cuda_driver_version: str
    """``nvmlSystemGetCudaDriverVersion`` as ``<major>.<minor>`` (13000 → ``13.0``, NVIDIA's driver's
    formatting); "" when unknown."""
    nvlink: NvLinkSpec | None = None
    """None: NVML answers NOT_SUPPORTED for NVLink (the recorded H200)."""
    fabric: FabricSpec | None = None
    """None: NVML answers NOT_SUPPORTED for the fabric calls."""

    def mig_profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.mig_profiles if p.name == name), None)

    def clock(self, name: str) -> ClockSpec:
        return next(c for c in self.clocks if c.name == name)

    def recorded_latency_s(self) -> dict[str, float]:
        """Per-function latency to pass as ``FakeNvml(latency_s=...)``."""
        return {name: us / 1e6 for name, us in self.latency_us}


#: GPU models a scenario may name, each with a ``profiles/<model>.json``: ``h200`` is the recording
#: (NVLink NOT_SUPPORTED, as that GPU answered); ``h200-hgx`` the same GPU on an HGX board (18 NVLink4
#: links to NVSwitches, fabric registered without a multi-node clique); ``gb200`` is synthetic, from
#: public figures (its file says so), on top of the H200's recorded behaviour.
GPU_MODELS: Final = ("h200", "h200-hgx", "gb200")


def _read_raw(gpu_model: str) -> dict[str, Any]:
    """A profile file; a ``variant_of`` file is its base's content with its own keys merged over."""
    raw: dict[str, Any] = json.loads(
        resources.files(__package__).joinpath("profiles", f"{gpu_model}.json").read_text())
    base = raw.pop("variant_of", None)
    return _merged(_read_raw(base), raw) if base else raw


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
            else value
    return out


@functools.cache
def load_profile(gpu_model: str) -> GpuProfile:
    """The profile of ``gpu_model`` (one of ``GPU_MODELS``)."""
    if gpu_model not in GPU_MODELS:
        # Scenarios check the model first and say so with the field; this is a programming error.
        raise ValueError(f"unknown gpu_model {gpu_model!r} (known: {', '.join(GPU_MODELS)})")
    raw = _read_raw(gpu_model)
    mig = raw["mig"]
    return GpuProfile(
        model=raw["model"], driver_version=raw["driver_version"], nvml_version=raw["nvml_version"],
        pci_device_id=raw["pci"]["device_id"], pci_subsystem_id=raw["pci"]["subsystem_id"],
        memory_total=raw["memory"]["total_bytes"], memory_reserved=raw["memory"]["reserved_bytes"],
        context_overhead=raw["memory"]["context_overhead_bytes"],
        power_limit_mw=raw["power_limit_mw"],
        power_mw=Range(raw["idle"]["power_mw"], raw["load"]["power_mw"]),
        load_gpu_util=raw["load"]["gpu_util"] / 100,
        memory_util=Range(raw["idle"]["memory_util"], raw["load"]["memory_util"]),
        process_mem_util_per_sm_util=raw["process_mem_util_per_sm_util"],
        energy_start_mj=raw["energy_start_mj"],
        gpu_temperature=Range(**raw["temperature"]["gpu"]),
        memory_temperature=Range(**raw["temperature"]["memory"]),
        clocks=tuple(ClockSpec(name, **c) for name, c in raw["clocks"].items()),
        idle_clock_event_reasons=raw["clock_event_reasons"]["idle"],
        load_clock_event_reasons=raw["clock_event_reasons"]["load"],
        encoder=tuple(raw["encoder"]), decoder=tuple(raw["decoder"]),
        pcie_tx_start=raw["pcie"]["tx_bytes_start"], pcie_rx_start=raw["pcie"]["rx_bytes_start"],
        pcie_tx_idle_rate=raw["pcie"]["tx_idle_bytes_per_s"],
        pcie_rx_idle_rate=raw["pcie"]["rx_idle_bytes_per_s"],
        pcie_extra_rate_at_full_load=raw["pcie"]["extra_bytes_per_s_at_full_load"],
        gpm_supported=raw["gpm_supported"], supported_event_types=raw["supported_event_types"],
        mig_memory_slices=mig["memory_slices"], mig_compute_slices=mig["compute_slices"],
        mig_max_devices=mig["max_devices"],
        mig_profiles=tuple(MigProfile(p["name"], p["gi_profile_id"], p["memory_slices"], p["compute_slices"],
                                      tuple(p["starts"]), p["max_instances"]) for p in mig["profiles"]),
        fields=tuple(FieldSpec(f["id"], f["name"], f["ret"], f["value_type"], f["idle"], f["load"])
                     for f in raw["fields"]),
        gpm_metrics=tuple(GpmSpec(m["id"], m["name"], m["ret"], m["idle"], m["load"]) for m in raw["gpm"]),
        latency_us=tuple(raw["latency_us"].items()),
        architecture=NVML_ARCHITECTURES[raw["architecture"]],
        cuda_compute_capability="{}.{}".format(*raw["cuda_compute_capability"]),
        cuda_driver_version=cuda_version(raw["cuda_driver_version"]),
        nvlink=NvLinkSpec(**raw["nvlink"]) if "nvlink" in raw else None,
        fabric=FabricSpec(**{**raw["fabric"], "health": tuple(raw["fabric"].get("health", {}).items())})
        if "fabric" in raw else None,
    )


#: ``nvmlDeviceArchitecture_t`` values by the name NVIDIA's driver publishes as ``architecture``
#: (go-nvlib's ``GetArchitectureAsString``).
NVML_ARCHITECTURES: Final = {2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere",
                             8: "Ada Lovelace", 9: "Hopper", 10: "Blackwell"}


def cuda_version(nvml_value: int) -> str:
    """``nvmlSystemGetCudaDriverVersion``'s ``1000 * major + 10 * minor`` as ``<major>.<minor>``."""
    return f"{nvml_value // 1000}.{nvml_value % 1000 // 10}"


#: Architectures (as NVIDIA's driver publishes ``architecture``) whose GPUs have GPM (GPU
#: performance monitoring, NVML 12+): Hopper and later. Ampere (A100) and older have none.
GPM_ARCHITECTURES: Final = frozenset({"hopper", "blackwell"})

#: MIG memory names by placement size (memory slices) of the models whose profiles are known,
#: keyed by (architecture, nominal memory in GiB); NVIDIA's MIG user guide. These models share the
#: recorded H200's layout (8 memory slices, 7 compute slices, the same GPU-instance profile ids and
#: placements); only the memory in the profile names differs.
_MIG_MEMORY_NAMES: Final = {
    ("ampere", 40): {1: "5gb", 2: "10gb", 4: "20gb", 8: "40gb"},    # A100 40GB
    ("ampere", 80): {1: "10gb", 2: "20gb", 4: "40gb", 8: "80gb"},   # A100 80GB
    ("hopper", 80): {1: "10gb", 2: "20gb", 4: "40gb", 8: "80gb"},   # H100 80GB
    ("hopper", 141): {1: "18gb", 2: "35gb", 4: "71gb", 8: "141gb"},  # H200 141GB (the recording)
}
#: How far (share of the nominal size) a slice's memory capacity may be from a known model's:
#: an H100 80GB reports 79.6 GiB, an H200 140.4 GiB.
_MEMORY_TOLERANCE: Final = 0.05
_MIG_NAME = re.compile(r"(?P<compute>[1-9])g\.(?P<memory>[0-9]+gb)(?P<extra>\+.*)?")


def known_mig_profiles(base: GpuProfile, architecture: str, memory_total: int) -> tuple[MigProfile, ...] | None:
    """The MIG profiles of a known model (``_MIG_MEMORY_NAMES``); None for any other GPU."""
    gib = memory_total / (1 << 30)
    names = next((n for (arch, nominal), n in _MIG_MEMORY_NAMES.items()
                  if arch == architecture.lower() and abs(gib - nominal) <= nominal * _MEMORY_TOLERANCE), None)
    if names is None:
        return None
    out = []
    for p in base.mig_profiles:
        parsed = _MIG_NAME.fullmatch(p.name)
        assert parsed is not None, f"recorded MIG profile {p.name!r}"
        name = f"{parsed['compute']}g.{names[p.memory_slices]}{parsed['extra'] or ''}"
        out.append(dataclasses.replace(p, name=name))
    return tuple(out)


def mig_profile_from_slice(name: str, gi_profile_id: int, memory_slices: int, starts: Iterable[int]) -> MigProfile:
    """A MIG profile of an unknown model, as its slice's MIG devices show it: only the placements seen."""
    parsed = _MIG_NAME.fullmatch(name)
    compute = int(parsed["compute"]) if parsed else 1
    placements = tuple(sorted(set(starts)))
    return MigProfile(name, gi_profile_id, memory_slices, compute, placements, max_instances=len(placements))


def identified(base: GpuProfile, *, model: str, architecture: str, memory_total: int, driver_version: str,
               cuda_driver_version: str, cuda_compute_capability: str,
               mig_profiles: tuple[MigProfile, ...]) -> GpuProfile:
    """``base``'s recorded answers under the identity a ResourceSlice gives (see the module docstring).

    ``cuda_driver_version`` and ``cuda_compute_capability`` are ``<major>.<minor>`` or "" (the slice does
    not say; nor does the profile then: the recording's would be another GPU's). Reserved memory and the
    context overhead scale with the memory; the NVML version is ``<CUDA major>.<driver version>``, as NVML
    writes it.
    """
    scale = memory_total / base.memory_total if memory_total else 1.0
    cuda_major = cuda_driver_version.partition(".")[0]
    nvml_major = cuda_major if cuda_major.isdigit() else base.nvml_version.partition(".")[0]
    driver = driver_version or base.driver_version
    return dataclasses.replace(
        base, model=model or base.model, driver_version=driver, nvml_version=f"{nvml_major}.{driver}",
        architecture=architecture, cuda_compute_capability=cuda_compute_capability,
        cuda_driver_version=cuda_driver_version,
        memory_total=memory_total or base.memory_total, memory_reserved=round(base.memory_reserved * scale),
        gpm_supported=base.gpm_supported and architecture.lower() in GPM_ARCHITECTURES,
        gpm_metrics=base.gpm_metrics if architecture.lower() in GPM_ARCHITECTURES else (),
        mig_profiles=mig_profiles)
