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


# --- self health ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SourceHealth:
    """How one source fared, as the agent saw it."""

    source: str
    up: bool
    duration_seconds: float = 0.0
    errors_total: int = 0
    last_success_timestamp: float = 0.0


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
