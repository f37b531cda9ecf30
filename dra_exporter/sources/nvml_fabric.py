"""The NVLink fabric of a whole GPU, for the NVML source: registration, clique and health.

Contract (one ``FabricState`` per whole GPU; one call per GPU per cycle, which costs microseconds):

- ``nvmlDeviceGetGpuFabricInfoV`` with a ``c_nvmlGpuFabricInfo_v3_t`` (the version with the health
  summary). A driver that knows only v2 (ARGUMENT_VERSION_MISMATCH) is asked with v2 (health mask,
  no summary); one without the V function (FUNCTION_NOT_FOUND, or a binding without it) with
  ``nvmlDeviceGetGpuFabricInfo`` and the v1 struct (no health at all). The choice is made once.
- NOT_SUPPORTED (pre-Hopper, PCIe boards, a single GPU) propagates to the caller, which asks no
  more: no fabric family appears, and that is no error.
- ``clique`` is ``<clusterUUID>.<cliqueId>`` as GPU Feature Discovery and the NVIDIA DRA driver
  write it (the 16 bytes as a lowercase hyphenated UUID, the id in decimal), and ``""`` unless the
  GPU is fabric-attached as go-nvlib decides it: state COMPLETED, status SUCCESS, a cluster UUID
  that is not all zeros. HGX boards answer COMPLETED with an all-zero UUID: NVLink inside the
  node, no multi-node clique, not an error.
- A failed registration (COMPLETED with an error status, e.g. ``insufficient_resources``) is
  logged when it starts and when it ends, never per cycle.
- The struct is made once per GPU and reset from its first bytes before each call; an answer whose
  bytes are last cycle's gives last cycle's readings again (a fabric changes state rarely, and building
  its ~17 readings through pynvml's struct attributes cost several times the call).
"""

from __future__ import annotations

import ctypes
import logging
import uuid as uuidlib
from dataclasses import dataclass
from typing import Any, Final

from .. import catalog as cat
from ..model import Reading

#: ``dra_gpu_fabric_state`` values, by NVML constant suffix.
_STATES: Final = ("NOT_SUPPORTED", "NOT_STARTED", "IN_PROGRESS", "COMPLETED")
_SUMMARIES: Final = ("NOT_SUPPORTED", "HEALTHY", "UNHEALTHY", "LIMITED_CAPACITY")
#: Health-mask fields: (NVML name, the value or values that mean a problem, read as "not").
#: ``incorrect_configuration`` is a problem for anything but NONE; ``partition_assigned`` when FALSE.
_PROBLEMS: Final = (
    ("DEGRADED_BW", "TRUE", False),
    ("ROUTE_RECOVERY", "TRUE", False),
    ("ROUTE_UNHEALTHY", "TRUE", False),
    ("ACCESS_TIMEOUT_RECOVERY", "TRUE", False),
    ("INCORRECT_CONFIGURATION", "NONE", True),
    ("PARTITION_ASSIGNED", "FALSE", False),
    ("GFM_STATE", "DISCONNECTED", False),
)


@dataclass(slots=True)
class FabricState:
    """What the source remembers about one GPU's fabric between cycles (mutable on purpose)."""

    api: str = ""
    """``v3``, ``v2`` or ``v1`` once chosen."""
    failed_status: str = ""
    """The error status last logged, ``""`` while registration is fine."""
    info: Any = None
    """The struct of ``api``'s version NVML answers into, and its bytes before any answer."""
    blank: bytes = b""
    answer: bytes = b""
    readings: tuple[Reading, ...] = ()
    """The last answer's bytes and the readings made of them."""


class FabricReader:
    """Reads the fabric families of whole GPUs; one instance per source, state per GPU."""

    def __init__(self, nvml: Any, logger: logging.Logger) -> None:
        self._nvml = nvml
        self._log = logger
        self._state_values = _values(nvml, "NVML_GPU_FABRIC_STATE_", _STATES)
        self._summary_values = _values(nvml, "NVML_GPU_FABRIC_HEALTH_SUMMARY_", _SUMMARIES)
        self._completed = getattr(nvml, "NVML_GPU_FABRIC_STATE_COMPLETED", 3)
        prefix = "NVML_GPU_FABRIC_HEALTH_MASK_"
        # Fields an older binding lacks (PARTITION_ASSIGNED, GFM_STATE before pynvml 13.615) are skipped.
        self._problems = tuple(
            (name.lower(), int(getattr(nvml, f"{prefix}SHIFT_{name}")), int(getattr(nvml, f"{prefix}WIDTH_{name}")),
             int(getattr(nvml, f"{prefix}{name}_{bad}")), negated)
            for name, bad, negated in _PROBLEMS if hasattr(nvml, f"{prefix}SHIFT_{name}"))
        # A binding with neither function (older than the fabric API) has no fabric to read.
        self._available = hasattr(nvml, "nvmlDeviceGetGpuFabricInfoV") or hasattr(nvml, "nvmlDeviceGetGpuFabricInfo")
        self._errors = {int(getattr(nvml, n)): n.removeprefix("NVML_ERROR_").lower()
                        for n in dir(nvml) if n.startswith("NVML_ERROR_") and isinstance(getattr(nvml, n), int)}

    def read(self, handle: Any, state: FabricState, uuid: str) -> list[Reading]:
        if not self._available:
            return []
        info = self._fabric_info(handle, state)
        answer = bytes(memoryview(info).cast("B"))
        if answer != state.answer:
            state.readings = tuple(self._readings(info, state, uuid))
            state.answer = answer
        return list(state.readings)

    def _readings(self, info: Any, state: FabricState, uuid: str) -> list[Reading]:
        raw_uuid = bytes(info.clusterUuid)
        fabric_state, status = int(info.state), int(info.status)
        completed = fabric_state == self._completed
        registered = completed and status == int(self._nvml.NVML_SUCCESS)
        cluster = str(uuidlib.UUID(bytes=raw_uuid)) if completed and any(raw_uuid) else ""
        clique_id = str(int(info.cliqueId)) if completed else ""
        self._log_status(state, uuid, status if completed else int(self._nvml.NVML_SUCCESS))
        out = [
            Reading(cat.GPU_FABRIC_INFO.name, 1.0, cat.GPU_FABRIC_INFO.extra(
                clique=f"{cluster}.{clique_id}" if registered and cluster else "", cluster_uuid=cluster,
                clique_id=clique_id)),
            *(Reading(cat.GPU_FABRIC_STATE.name, float(fabric_state == value), (("state", name),))
              for value, name in self._state_values),
            Reading(cat.GPU_FABRIC_REGISTERED.name, float(registered)),
        ]
        if state.api == "v3":
            summary = int(info.healthSummary)
            out += [Reading(cat.GPU_FABRIC_HEALTH.name, float(summary == value), (("summary", name),))
                    for value, name in self._summary_values]
        if state.api in ("v2", "v3"):
            mask = int(info.healthMask)
            for name, shift, width, bad, negated in self._problems:
                field_value = (mask >> shift) & width
                if field_value == 0:  # NOT_SUPPORTED: this GPU does not report the field
                    continue
                problem = field_value != bad if negated else field_value == bad
                out.append(Reading(cat.GPU_FABRIC_HEALTH_PROBLEM.name, float(problem), (("field", name),)))
        return out

    def _fabric_info(self, handle: Any, state: FabricState) -> Any:
        nvml = self._nvml
        if not state.api:
            state.api = "v3" if hasattr(nvml, "nvmlDeviceGetGpuFabricInfoV") else "v1"
        while True:
            if state.info is None:
                state.info = _struct(nvml, "c_nvmlGpuFabricInfo_t" if state.api == "v1"
                                     else f"c_nvmlGpuFabricInfo_{state.api}_t")()
                state.blank = bytes(memoryview(state.info).cast("B"))  # the version a V struct starts with
                state.answer = b""
            info = state.info
            ctypes.memmove(ctypes.addressof(info), state.blank, len(state.blank))
            try:
                if state.api == "v1":
                    nvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
                else:
                    nvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
                return info
            except nvml.NVMLError as err:
                if state.api != "v1" and err.value == nvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    state.api = "v1"  # a driver before the V function
                elif state.api == "v3" and err.value == nvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
                    state.api = "v2"  # a driver whose V function knows only v2
                else:
                    raise
                state.info = None

    def _log_status(self, state: FabricState, uuid: str, status: int) -> None:
        word = "" if status == int(self._nvml.NVML_SUCCESS) else self._errors.get(status, str(status))
        if word == state.failed_status:
            return
        if word:
            self._log.warning("nvml: GPU %s fabric registration failed: %s", uuid, word)
        else:
            self._log.info("nvml: GPU %s fabric registration succeeded", uuid)
        state.failed_status = word


def _values(nvml: Any, prefix: str, suffixes: tuple[str, ...]) -> tuple[tuple[int, str], ...]:
    return tuple((int(getattr(nvml, prefix + s)), s.lower()) for s in suffixes if hasattr(nvml, prefix + s))


def _struct(nvml: Any, name: str) -> type[ctypes.Structure]:
    """A ctypes struct: from the given object, else pynvml's (only the type, never a call)."""
    struct = getattr(nvml, name, None)
    if struct is None:
        import pynvml  # the struct layout is NVML's ABI; the fake re-uses it too

        struct = getattr(pynvml, name)
    if not (isinstance(struct, type) and issubclass(struct, ctypes.Structure)):
        raise TypeError(f"{name} is not a ctypes struct")
    return struct
