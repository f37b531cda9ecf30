"""Device resolution: which NVML device a DRA (driver, pool, device) triplet names.

Pure functions over NVML identities. Resolvers form a chain: the first one that
knows the answer wins. ``SliceResolver`` reads the ``uuid`` attribute that drivers
publish in their ResourceSlices (any driver that publishes one; needs the API
server) and goes first; ``ClaimStatusResolver`` reads the ``uuid`` a driver publishes
in a claim's ``status.devices[].data`` once it has prepared the device (dynamic MIG);
the node-local ``NvidiaNameResolver`` parses NVIDIA's
device names and is the fallback (and the only way to find dynamically created
MIG devices, which no slice names by UUID).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from .model import ClaimInfo, GpuDevice, ResourceSliceInfo

NVIDIA_DRIVER: Final = "gpu.nvidia.com"
#: The device attribute that carries the NVML UUID (NVIDIA; any driver may publish one).
UUID_ATTRIBUTE: Final = "uuid"

_FULL_GPU = re.compile(r"gpu-(?P<minor>\d+)")
# 25.3-25.8: gpu-<minor>-mig-<giProfileId>-<placementStart>-<placementSize>
_MIG_LEGACY = re.compile(r"gpu-(?P<minor>\d+)-mig-(?P<gi_profile>\d+)-(?P<start>\d+)-(?P<size>\d+)")
# 25.12+: gpu-<minor>-mig-<profile without dots>-<giProfileId>-<placementStart>
_MIG_CANONICAL = re.compile(
    r"gpu-(?P<minor>\d+)-mig-(?P<profile>[a-z0-9]+(?:-[a-z0-9]+)*?)-(?P<gi_profile>\d+)-(?P<start>\d+)")


@dataclass(frozen=True, slots=True)
class NvidiaDeviceName:
    """A parsed NVIDIA DRA device name."""

    minor: int
    gi_profile_id: int | None = None
    placement_start: int | None = None
    placement_size: int | None = None
    profile: str = ""
    """Profile as written in the name, dots removed (``1g18gb``); ``""`` when absent."""

    @property
    def is_mig(self) -> bool:
        return self.gi_profile_id is not None


def parse_nvidia_device_name(name: str) -> NvidiaDeviceName | None:
    """Parse ``gpu-<minor>`` and both MIG name formats; None for anything else."""
    if m := _FULL_GPU.fullmatch(name):
        return NvidiaDeviceName(minor=int(m["minor"]))
    if m := _MIG_LEGACY.fullmatch(name):
        return NvidiaDeviceName(int(m["minor"]), int(m["gi_profile"]), int(m["start"]), int(m["size"]))
    if m := _MIG_CANONICAL.fullmatch(name):
        return NvidiaDeviceName(int(m["minor"]), int(m["gi_profile"]), int(m["start"]), profile=m["profile"])
    return None


def canonical_profile(profile: str) -> str:
    """``1g.18gb`` → ``1g18gb``; NVIDIA drops the dots to make an RFC 1123 name."""
    return profile.replace(".", "").replace("+", "-").lower()


def nvidia_device_name(device: GpuDevice, parent_minor: int | None = None, legacy: bool = False) -> str:
    """The name NVIDIA's DRA driver gives ``device`` (inverse of ``parse_nvidia_device_name``)."""
    minor = device.minor if parent_minor is None else parent_minor
    if not device.is_mig:
        return f"gpu-{minor}"
    if legacy:
        return f"gpu-{minor}-mig-{device.gi_profile_id}-{device.placement_start}-{device.placement_size}"
    return f"gpu-{minor}-mig-{canonical_profile(device.profile)}-{device.gi_profile_id}-{device.placement_start}"


class Resolver(Protocol):
    """Maps a DRA device to the NVML UUID it is, or None when it does not know."""

    def resolve(self, driver: str, pool: str, device: str) -> str | None: ...


class NvidiaNameResolver:
    """Resolves ``gpu.nvidia.com`` device names against the node's NVML devices.

    Works without the API server, and is the only way to find dynamically created
    MIG devices, which no ResourceSlice names by UUID.
    """

    def __init__(self, devices: Iterable[GpuDevice]) -> None:
        devices = tuple(devices)
        self._gpu_by_minor = {d.minor: d for d in devices if not d.is_mig}
        self._mig_by_key: dict[tuple[int, int, int], GpuDevice] = {}
        for d in devices:
            if d.is_mig and d.gi_profile_id is not None and d.placement_start is not None:
                self._mig_by_key[(d.minor, d.gi_profile_id, d.placement_start)] = d

    def resolve(self, driver: str, pool: str, device: str) -> str | None:
        if driver != NVIDIA_DRIVER:
            return None
        parsed = parse_nvidia_device_name(device)
        if parsed is None:
            return None
        if not parsed.is_mig:
            gpu = self._gpu_by_minor.get(parsed.minor)
            return gpu.uuid if gpu else None
        assert parsed.gi_profile_id is not None and parsed.placement_start is not None
        mig = self._mig_by_key.get((parsed.minor, parsed.gi_profile_id, parsed.placement_start))
        if mig is None:
            return None
        if parsed.placement_size is not None and mig.placement_size not in (None, parsed.placement_size):
            return None
        if parsed.profile and canonical_profile(mig.profile) != parsed.profile:
            return None
        return mig.uuid


class SliceResolver:
    """Resolves a device through the ``uuid`` attribute of its ResourceSlice entry.

    Expects current slices only (the highest generation of each pool): an older generation
    may still name a device that has since been recreated with another UUID.
    """

    def __init__(self, slices: Iterable[ResourceSliceInfo]) -> None:
        self._uuids = {(s.driver, s.pool, d.name): uuid
                       for s in slices for d in s.devices if (uuid := d.attribute(UUID_ATTRIBUTE))}

    def resolve(self, driver: str, pool: str, device: str) -> str | None:
        return self._uuids.get((driver, pool, device))

    def uuids(self) -> frozenset[str]:
        """Every UUID the slices name."""
        return frozenset(self._uuids.values())


class ClaimStatusResolver:
    """Resolves a device through the identity its driver published in the claim's
    ``status.devices[].data`` (``uuid``): the concrete UUID of a MIG device created for the
    claim, which no ResourceSlice names (NVIDIA's proposal, dra-driver-nvidia-gpu#1456)."""

    def __init__(self, claims: Iterable[ClaimInfo]) -> None:
        self._uuids = {(d.driver, d.pool, d.device): d.uuid for c in claims for d in c.devices if d.uuid}

    def resolve(self, driver: str, pool: str, device: str) -> str | None:
        return self._uuids.get((driver, pool, device))


class ChainResolver:
    """Asks each resolver in turn; the first answer wins."""

    def __init__(self, resolvers: Sequence[Resolver]) -> None:
        self._resolvers = tuple(resolvers)

    def resolve(self, driver: str, pool: str, device: str) -> str | None:
        for resolver in self._resolvers:
            if (uuid := resolver.resolve(driver, pool, device)) is not None:
                return uuid
        return None
