"""NVLink ports and the NVLink fabric of the fake NVML, as pure functions of simulated time.

``FakeNvml`` (``fake_nvml``) delegates here for GPUs whose profile has an ``nvlink`` and a
``fabric`` section (``h200-hgx``, ``gb200``); the recorded ``h200`` has neither and answers
NOT_SUPPORTED as it did. What it models:

- every link of a GPU is up, except during an ``nvlink_link_down`` fault on it (state
  INACTIVE, no traffic). Each link-down counts one link recovery: on NVLink4 (Hopper) the
  ``recovery`` error counter, on NVLink5 (Blackwell) one failed recovery event at ``at`` and
  one successful event at ``until``;
- traffic: the GPU's ``nvlink`` curves (bytes per second, each direction), else the profile's
  rate at full load times the GPU's utilisation, spread evenly over the links that are up;
  the byte counters are its integral per link, reported in KiB as NVML does;
- ``nvlink_errors`` faults add ``rate`` errors per second to one counter of one link;
- the fabric answers the profile's registration and health; ``fabric_unhealthy`` turns the
  health summary to UNHEALTHY with ROUTE_UNHEALTHY set, ``fabric_in_progress`` makes the state
  IN_PROGRESS (Fabric Manager still registering the GPU, as after a reboot).

Which field ids answer per generation is written out here from pynvml's constant names, on
purpose apart from the NVML source's own table: the tests compare two encodings of nvml.h.
"""

from __future__ import annotations

import functools
import re
import uuid as uuidlib
from collections.abc import Callable, Mapping
from typing import Any, Final

import pynvml

from .profile import FabricSpec, NvLinkSpec
from .scenario import Fault, Gpu, Scenario

_KIB: Final = 1024
_TYPES: Final = {  # (field id, link-scoped) -> error type; per-index legacy fields carry the link in the id
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: "replay",
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY: "recovery",
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC: "crc_flit",
}
_NVLINK5_COUNTERS: Final = {
    pynvml.NVML_FI_DEV_NVLINK_COUNT_MALFORMED_PACKET_ERRORS: "malformed_packet",
    pynvml.NVML_FI_DEV_NVLINK_COUNT_BUFFER_OVERRUN_ERRORS: "buffer_overrun",
    pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_ERRORS: "rcv",
    pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_REMOTE_ERRORS: "rcv_remote",
    pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_GENERAL_ERRORS: "rcv_general",
    pynvml.NVML_FI_DEV_NVLINK_COUNT_LOCAL_LINK_INTEGRITY_ERRORS: "local_link_integrity",
    pynvml.NVML_FI_DEV_NVLINK_COUNT_XMIT_DISCARDS: "xmit_discards",
    pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS: "effective",
    pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS: "symbol",
}
_RECOVERY_EVENTS: Final = {
    pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS: "successful",
    pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS: "failed",
    pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS: "all",
}
_THROUGHPUT: Final = {
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: "tx", pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: "rx",
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX: "tx", pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX: "rx",
}
#: Protocol overhead the RAW throughput counters add to the DATA ones (an assumption: ~6 %).
_RAW_OVERHEAD: Final = 1.06
_LEGACY = re.compile(r"NVML_FI_DEV_NVLINK_(CRC_FLIT|CRC_DATA|REPLAY|RECOVERY|ECC_DATA)_ERROR_COUNT_L(\d+)")


def _legacy_fields() -> dict[int, tuple[str, int]]:
    """Per-index NVLink error fields (``..._CRC_FLIT_ERROR_COUNT_L3``) -> (type, link), from pynvml's names."""
    out = {}
    for name in dir(pynvml):
        if m := _LEGACY.fullmatch(name):
            out[int(getattr(pynvml, name))] = (m[1].lower(), int(m[2]))
    return out


_LEGACY_FIELDS: Final = _legacy_fields()
#: Every NVLink field id this model answers (or refuses, for the other generation).
NVLINK_FIELD_IDS: Final = frozenset(
    {pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT, pynvml.NVML_FI_DEV_NVLINK_GET_SPEED, pynvml.NVML_FI_DEV_NVLINK_GET_STATE,
     pynvml.NVML_FI_DEV_NVLINK_GET_VERSION} | set(_TYPES) | set(_NVLINK5_COUNTERS) | set(_RECOVERY_EVENTS)
    | set(_THROUGHPUT) | set(_LEGACY_FIELDS))

def health_mask(fields: Mapping[str, int]) -> int:
    """``healthMask`` from field values, with nvml.h's shifts (``NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_*``)."""
    mask = 0
    for name, value in fields.items():
        mask |= int(value) << int(getattr(pynvml, f"NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_{name.upper()}"))
    return mask


class NvLinkModel:
    """Links, counters and fabric of every GPU of one simulated node."""

    def __init__(self, scenario: Scenario, links: NvLinkSpec, fabric: FabricSpec | None,
                 utilization: Callable[[Gpu, float], float], offsets: Mapping[int, float],
                 integral: Callable[[Callable[[float], float]], Callable[[float], float]]) -> None:
        self._scenario = scenario
        self.spec = links
        self._fabric = fabric
        self._utilization = utilization
        self._offsets = offsets
        self._down: dict[tuple[int, int], tuple[Fault, ...]] = {}
        self._errors: dict[tuple[int, int, str], tuple[Fault, ...]] = {}
        for f in scenario.faults:
            if f.kind == "nvlink_link_down" and f.gpu is not None:
                key = (f.gpu, f.params["link"])
                self._down[key] = self._down.get(key, ()) + (f,)
            elif f.kind == "nvlink_errors" and f.gpu is not None:
                ekey = (f.gpu, f.params["link"], f.params["type"])
                self._errors[ekey] = self._errors.get(ekey, ()) + (f,)
        self._integral = integral
        """Makes the integral from 0 to t of a rate (``fake_nvml._Integral``: O(1) per forward call)."""
        self._integrals: dict[tuple[int, str, int | None], Callable[[float], float]] = {}

    # -- links -------------------------------------------------------------------------------

    def link_up(self, gpu: int, link: int, t: float) -> bool:
        return not any(f.active_at(t) for f in self._down.get((gpu, link), ()))

    def _links_up(self, gpu: int, t: float) -> int:
        return sum(self.link_up(gpu, link, t) for link in range(self.spec.links))

    def _rate(self, gpu: Gpu, direction: str, t: float) -> float:
        """Bytes per second the GPU moves in ``direction`` over all its links."""
        curve = gpu.nvlink_tx if direction == "tx" else gpu.nvlink_rx
        if curve is not None:
            rate = curve.value(t, self._scenario.seed, f"nvlink/{gpu.index}/{direction}")
        else:
            rate = self.spec.bytes_per_s_at_full_load * self._utilization(gpu, t)
        return min(max(0.0, rate), self.spec.links * self.spec.speed_mbps * 1e6)

    def _share(self, gpu: Gpu, direction: str, link: int | None, t: float) -> float:
        """One link's part of the traffic: an even share of the links up (``link=None``: a link never down)."""
        if link is not None and not self.link_up(gpu.index, link, t):
            return 0.0
        up = self._links_up(gpu.index, t) if any(g == gpu.index for g, _ in self._down) else self.spec.links
        return self._rate(gpu, direction, t) / up if up else 0.0

    def link_bytes(self, gpu: Gpu, link: int, direction: str, t: float) -> float:
        # Links that are never down share one integral: a 16-GPU node then keeps 32, not 576.
        key = (gpu.index, direction, link if (gpu.index, link) in self._down else None)
        integral = self._integrals.get(key)
        if integral is None:
            integral = self._integrals[key] = self._integral(functools.partial(self._share, gpu, direction, key[2]))
        start = self.spec.tx_start_bytes if direction == "tx" else self.spec.rx_start_bytes
        return start * self._offsets[gpu.index] + integral(t)

    def errors(self, gpu: int, link: int, kind: str, t: float) -> int:
        count = sum(f.params["rate"] * max(0.0, min(t, f.until if f.until is not None else t) - f.at)
                    for f in self._errors.get((gpu, link, kind), ()))
        if kind == "recovery":  # NVLink4: a link that went down went through one recovery
            count += sum(f.at <= t for f in self._down.get((gpu, link), ()))
        return int(count)

    def recovery_events(self, gpu: int, link: int, result: str, t: float) -> int:
        downs = self._down.get((gpu, link), ())
        failed = sum(f.at <= t for f in downs)
        successful = sum(f.until is not None and f.until <= t for f in downs)
        return {"failed": failed, "successful": successful, "all": failed + successful}[result]

    # -- field values ------------------------------------------------------------------------

    def field(self, gpu: Gpu, field_id: int, scope: int, t: float) -> tuple[int, int, float]:
        """(nvmlReturn, valueType, value) of one NVLink field of a whole GPU."""
        spec = self.spec
        ok, uint, ull = pynvml.NVML_SUCCESS, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, \
            pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        unsupported = (pynvml.NVML_ERROR_NOT_SUPPORTED, 0, 0.0)
        if field_id == pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT:
            return ok, uint, spec.links
        if field_id in _LEGACY_FIELDS:
            kind, link = _LEGACY_FIELDS[field_id]
            if spec.generation != "nvlink4" or link >= spec.links:
                return unsupported
            return ok, ull, self.errors(gpu.index, link, kind, t)
        if not 0 <= scope < spec.links:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT, 0, 0.0
        up = self.link_up(gpu.index, scope, t)
        if field_id == pynvml.NVML_FI_DEV_NVLINK_GET_STATE:
            return ok, uint, pynvml.NVML_NVLINK_STATE_ACTIVE if up else pynvml.NVML_NVLINK_STATE_INACTIVE
        if field_id == pynvml.NVML_FI_DEV_NVLINK_GET_SPEED:
            return ok, uint, spec.speed_mbps if up else 0
        if field_id == pynvml.NVML_FI_DEV_NVLINK_GET_VERSION:
            return ok, uint, spec.version
        if field_id in _THROUGHPUT:
            raw = _RAW_OVERHEAD if field_id in (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX,
                                                pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX) else 1.0
            return ok, ull, int(self.link_bytes(gpu, scope, _THROUGHPUT[field_id], t) * raw) // _KIB
        if field_id in _TYPES:
            if spec.generation != "nvlink4":
                return unsupported  # nvml.h: "unsupported for Blackwell+"
            return ok, ull, self.errors(gpu.index, scope, _TYPES[field_id], t)
        if spec.generation != "nvlink5":
            return unsupported
        if field_id in _NVLINK5_COUNTERS:
            return ok, ull, self.errors(gpu.index, scope, _NVLINK5_COUNTERS[field_id], t)
        return ok, ull, self.recovery_events(gpu.index, scope, _RECOVERY_EVENTS[field_id], t)

    # -- the fabric --------------------------------------------------------------------------

    def fill_fabric(self, info: Any, gpu: int, t: float, with_health: bool) -> None:
        """Fill a ``c_nvmlGpuFabricInfo*_t`` as NVML does for this GPU at ``t``."""
        fabric = self._fabric
        if fabric is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        in_progress = self._active(t, "fabric_in_progress", gpu)
        unhealthy = self._active(t, "fabric_unhealthy", gpu)
        info.state = pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS if in_progress else fabric.state
        info.status = pynvml.NVML_ERROR_NOT_READY if in_progress else fabric.status
        raw = b"\0" * 16 if in_progress else uuidlib.UUID(fabric.cluster_uuid).bytes
        for i, byte in enumerate(raw):
            info.clusterUuid[i] = byte
        info.cliqueId = 0 if in_progress else fabric.clique_id
        if not with_health:
            return
        fields = dict(fabric.health)
        summary = fabric.health_summary
        if unhealthy:
            fields["route_unhealthy"] = pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE
            summary = pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY
        info.healthMask = health_mask(fields)
        if hasattr(info, "healthSummary"):
            info.healthSummary = summary

    def _active(self, t: float, kind: str, gpu: int) -> bool:
        return any(f.gpu in (None, gpu) for f in self._scenario.active_faults(t, kind))
