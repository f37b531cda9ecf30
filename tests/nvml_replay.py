"""A fake ``nvml`` that replays the NVML answers recorded on a real H200.

It implements the NVML call surface of ``dra_exporter.sources.nvml`` from
``tests/fixtures/nvml/h200-*.json``: the recorded values, and the recorded NVML error for
calls that failed there. Tests grow it into what they need: clones of the recorded GPU
under other UUIDs, a small MIG layer, injected errors, an XID event queue, call counts.
Constants, ctypes structs and ``NVMLError`` come from pynvml, as in the simulator's fake;
a function the surface does not list raises ``AttributeError``, so a source that strays
from the surface fails here first.
"""

from __future__ import annotations

import ctypes
import inspect
import json
import queue
import threading
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "nvml"
UNDER_LOAD = "h200-under-load.json"
IDLE = "h200-idle.json"

NO_INSTANCE = 0xFFFFFFFF
EVENTS_ALL = (pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeSingleBitEccError
              | pynvml.nvmlEventTypeDoubleBitEccError)
MIG_SLOTS = 7

_CLOCK_NAMES = {pynvml.NVML_CLOCK_GRAPHICS: "NVML_CLOCK_GRAPHICS", pynvml.NVML_CLOCK_SM: "NVML_CLOCK_SM",
                pynvml.NVML_CLOCK_MEM: "NVML_CLOCK_MEM", pynvml.NVML_CLOCK_VIDEO: "NVML_CLOCK_VIDEO"}
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")  # by NVML_VALUE_TYPE_*

#: What real NVML answers NOT_SUPPORTED for on a MIG device handle.
_WHOLE_GPU_ONLY = frozenset({
    "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetEncoderUtilization", "nvmlDeviceGetDecoderUtilization",
    "nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetTemperature",
    "nvmlDeviceGetClockInfo", "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetIndex",
    "nvmlDeviceGetMinorNumber", "nvmlDeviceGetPciInfo_v3", "nvmlGpmQueryDeviceSupport",
    "nvmlDeviceGetSupportedEventTypes",
})


@cache
def load_recording(name: str = UNDER_LOAD) -> dict[str, Any]:
    path = FIXTURES / name
    if not path.is_file():
        raise FileNotFoundError(f"NVML recording {path} is missing from the repository")
    return json.loads(path.read_text())


@dataclass(frozen=True)
class Handle:
    """A device handle: a whole GPU (``mig is None``) or the MIG device in slot ``mig``."""

    gpu: int
    mig: int | None = None


@dataclass(frozen=True)
class GpuInstanceHandle:
    gpu: int
    gi_id: int


@dataclass(frozen=True)
class MigSpec:
    """One MIG device (a compute instance of a GPU instance) of a MIG-enabled GPU."""

    uuid: str
    profile: str = "1g.18gb"
    gi_id: int = 1
    ci_id: int = 0
    gi_profile_id: int = 19
    placement_start: int = 0
    placement_size: int = 1
    memory_total: int = 17_716_740_096
    memory_used: int = 0
    processes: tuple[tuple[int, int], ...] = ()
    """(pid, used bytes) of the processes running on it."""


@dataclass
class FakeGpu:
    uuid: str
    index: int
    bus_id: str
    pid_offset: int = 0
    migs: list[MigSpec | None] | None = None
    """MIG slots when MIG mode is enabled; None when disabled."""
    compute_slices: int = 7
    """Slices of the largest GPU-instance profile (an H200's 7g; an A30 has 4)."""
    gpm_supported: bool = True
    event_types: int = EVENTS_ALL
    graphics_processes: tuple[tuple[int, int], ...] = ()
    process_samples: list[dict[str, int]] = field(default_factory=list)


@dataclass
class _EventSet:
    events: queue.Queue[Any] = field(default_factory=queue.Queue)
    registered: dict[int, int] = field(default_factory=dict)
    freed: bool = False


class ReplayNvml:
    """Replays one recorded GPU, cloned ``gpus`` times (index i gets a UUID ending in i)."""

    NVMLError = pynvml.NVMLError

    def __init__(self, recording: str = UNDER_LOAD, *, gpus: int = 1) -> None:
        self.recording = load_recording(recording)
        self._dev = self.recording["devices"][0]
        self._getters = self._dev["getters"]
        self._fields = {f["fieldId"]: f for f in self._dev["fields"] if "fieldId" in f}
        self._gpm_metrics = {m["id"]: m for m in self._dev["gpm"].get("metrics", [])}
        base_uuid = self._getters["nvmlDeviceGetUUID"]["ok"]
        base_bus = self._getters["nvmlDeviceGetPciInfo_v3"]["ok"]["busId"]
        recorded_util = self._getters["process_utilization"]
        self.gpus = [
            FakeGpu(uuid=base_uuid if i == 0 else f"{base_uuid[:-4]}{i:04x}",
                    index=i, bus_id=base_bus if i == 0 else f"00000000:{i:02X}:06.0", pid_offset=1000 * i,
                    process_samples=[dict(s, pid=s["pid"] + 1000 * i) for s in recorded_util.get("ok", [])])
            for i in range(gpus)]
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.device_calls: Counter[tuple[str, str]] = Counter()
        self.field_requests: list[tuple[str, tuple[int, ...]]] = []
        self.process_util_since: list[tuple[str, int]] = []
        self.gpm_requests: list[tuple[str, tuple[int, ...]]] = []
        self.initialised = False
        self.init_failures = 0
        self.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
        self.unsupported: set[str] = set()
        self.failing: dict[str, int] = {}
        self.field_overrides: dict[tuple[int, int], tuple[int, int, float]] = {}
        self.gpm_overrides: dict[int, float] = {}
        self.event_sets: list[_EventSet] = []
        self._samples: dict[int, tuple[Any, tuple[int, int | None, int] | None]] = {}
        self._sample_seq = 0

    # -- test controls -----------------------------------------------------------------

    def enable_mig(self, gpu: int, migs: list[MigSpec]) -> None:
        """Put a GPU in MIG mode with these MIG devices (slot order as given)."""
        slots: list[MigSpec | None] = [*migs, *([None] * (MIG_SLOTS - len(migs)))]
        self.gpus[gpu].migs = slots

    def fail(self, uuid: str, code: int = pynvml.NVML_ERROR_GPU_IS_LOST) -> None:
        """Every call on this device (and, for a GPU, on its MIG devices) raises ``code``."""
        self.failing[uuid] = code

    def heal(self, uuid: str) -> None:
        self.failing.pop(uuid, None)

    def push_event(self, gpu: int, xid: int, *, gpu_instance: int = NO_INSTANCE,
                   compute_instance: int = NO_INSTANCE,
                   event_type: int = pynvml.nvmlEventTypeXidCriticalError) -> int:
        """Deliver an event to every event set that registered it on this GPU; returns how many."""
        delivered = 0
        for event_set in self.event_sets:
            if not event_set.freed and event_set.registered.get(gpu, 0) & event_type:
                # A new handle object each time, as pynvml hands out a new pointer per event.
                event_set.events.put(SimpleNamespace(
                    device=Handle(gpu), eventType=event_type, eventData=xid,
                    gpuInstanceId=gpu_instance, computeInstanceId=compute_instance))
                delivered += 1
        return delivered

    def uuid_of(self, handle: Handle) -> str:
        gpu = self.gpus[handle.gpu]
        return gpu.uuid if handle.mig is None else self._mig(handle).uuid

    # -- plumbing ----------------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        value = getattr(pynvml, name, None)
        if value is None or inspect.isfunction(value) or inspect.isbuiltin(value):
            raise AttributeError(f"{name} is not part of the NVML call surface the replay implements")
        return value  # constants, ctypes structs, NVMLError subclasses

    def _enter(self, function: str, handle: Handle | GpuInstanceHandle | None = None) -> None:
        with self._lock:
            self.calls[function] += 1
            if isinstance(handle, Handle):
                self.device_calls[(function, self.uuid_of(handle))] += 1
        if not self.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if handle is not None:
            self._raise_if_failing(handle)
        if function in self.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if isinstance(handle, Handle) and handle.mig is not None and function in _WHOLE_GPU_ONLY:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _raise_if_failing(self, handle: Handle | GpuInstanceHandle) -> None:
        gpu = self.gpus[handle.gpu]
        own = self.uuid_of(handle) if isinstance(handle, Handle) else gpu.uuid
        for uuid in (gpu.uuid, own):
            if uuid in self.failing:
                raise pynvml.NVMLError(self.failing[uuid])

    def _recorded(self, getter: str) -> Any:
        entry = self._getters[getter]
        if "ok" not in entry:
            raise pynvml.NVMLError(entry["code"])
        return entry["ok"]

    def _mig(self, handle: Handle) -> MigSpec:
        slots = self.gpus[handle.gpu].migs
        assert slots is not None and handle.mig is not None
        spec = slots[handle.mig]
        if spec is None:  # the MIG device was destroyed after the handle was taken
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return spec

    @staticmethod
    def _obj(value: Any) -> Any:
        if isinstance(value, dict):
            return SimpleNamespace(**{k: ReplayNvml._obj(v) for k, v in value.items()})
        return value

    # -- lifecycle and system ----------------------------------------------------------

    def nvmlInit(self) -> None:
        with self._lock:
            self.calls["nvmlInit"] += 1
        if self.init_failures > 0:
            self.init_failures -= 1
            raise pynvml.NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.recording["meta"]["driver"]["ok"]

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._enter("nvmlSystemGetNVMLVersion")
        return self.recording["meta"]["nvml_version"]["ok"]

    # -- enumeration -------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        handle = Handle(index)
        self._raise_if_failing(handle)  # a lost GPU fails here too
        return handle

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:
        self._enter("nvmlDeviceGetUUID", handle)
        return self.uuid_of(handle)

    def nvmlDeviceGetName(self, handle: Handle) -> str:
        self._enter("nvmlDeviceGetName", handle)
        name = self._recorded("nvmlDeviceGetName")
        return name if handle.mig is None else f"{name} MIG {self._mig(handle).profile}"

    def nvmlDeviceGetIndex(self, handle: Handle) -> int:
        self._enter("nvmlDeviceGetIndex", handle)
        return self.gpus[handle.gpu].index

    def nvmlDeviceGetMinorNumber(self, handle: Handle) -> int:
        self._enter("nvmlDeviceGetMinorNumber", handle)
        return self.gpus[handle.gpu].index

    def nvmlDeviceGetPciInfo_v3(self, handle: Handle) -> Any:
        self._enter("nvmlDeviceGetPciInfo_v3", handle)
        info = dict(self._recorded("nvmlDeviceGetPciInfo_v3"), busId=self.gpus[handle.gpu].bus_id)
        return self._obj(info)

    def nvmlDeviceGetMigMode(self, handle: Handle) -> list[int]:
        self._enter("nvmlDeviceGetMigMode", handle)
        if self.gpus[handle.gpu].migs is not None:
            return [pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE]
        return list(self._recorded("nvmlDeviceGetMigMode"))

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Handle) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount", handle)
        if self.gpus[handle.gpu].migs is not None:
            return MIG_SLOTS
        return self._recorded("nvmlDeviceGetMaxMigDeviceCount")

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Handle, index: int) -> Handle:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        slots = self.gpus[handle.gpu].migs
        if slots is None or handle.mig is not None or not 0 <= index < len(slots):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if slots[index] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return Handle(handle.gpu, index)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Handle) -> Handle:
        self._enter("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle)
        return Handle(handle.gpu)

    def nvmlDeviceGetGpuInstanceId(self, handle: Handle) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId", handle)
        if handle.mig is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._mig(handle).gi_id

    def nvmlDeviceGetComputeInstanceId(self, handle: Handle) -> int:
        self._enter("nvmlDeviceGetComputeInstanceId", handle)
        if handle.mig is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._mig(handle).ci_id

    def nvmlDeviceGetGpuInstanceById(self, handle: Handle, gi_id: int) -> GpuInstanceHandle:
        self._enter("nvmlDeviceGetGpuInstanceById", handle)
        slots = self.gpus[handle.gpu].migs or []
        if handle.mig is not None or not any(s is not None and s.gi_id == gi_id for s in slots):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return GpuInstanceHandle(handle.gpu, gi_id)

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Handle, profile: int) -> Any:
        """The profile of ``n`` slices for each ``n`` up to the GPU's slice count (4 and 7 only where
        they are its count: the largest profile), as real NVML answers a MIG-enabled GPU."""
        self._enter("nvmlDeviceGetGpuInstanceProfileInfo", handle)
        gpu = self.gpus[handle.gpu]
        slices = {pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE: 1, pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE: 2,
                  pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE: 3, pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE: 4,
                  pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE: 7}.get(profile)
        if handle.mig is not None or gpu.migs is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if slices is None or slices > gpu.compute_slices or (slices == 3 and gpu.compute_slices == 4):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._obj({"id": profile, "sliceCount": slices})

    def nvmlGpuInstanceGetInfo(self, gi: GpuInstanceHandle) -> Any:
        self._enter("nvmlGpuInstanceGetInfo", gi)
        spec = next(s for s in self.gpus[gi.gpu].migs or [] if s is not None and s.gi_id == gi.gi_id)
        return self._obj({"device": Handle(gi.gpu), "id": gi.gi_id, "profileId": spec.gi_profile_id,
                          "placement": {"start": spec.placement_start, "size": spec.placement_size}})

    # -- values ------------------------------------------------------------------------

    def nvmlDeviceGetMemoryInfo(self, handle: Handle, version: int | None = None) -> Any:
        self._enter("nvmlDeviceGetMemoryInfo", handle)
        if handle.mig is not None:
            spec = self._mig(handle)
            return self._obj({"total": spec.memory_total, "reserved": 0, "used": spec.memory_used,
                              "free": spec.memory_total - spec.memory_used})
        return self._obj(self._recorded("memory_v2" if version else "nvmlDeviceGetMemoryInfo"))

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates", handle)
        return self._obj(self._recorded("nvmlDeviceGetUtilizationRates"))

    def nvmlDeviceGetEncoderUtilization(self, handle: Handle) -> list[int]:
        self._enter("nvmlDeviceGetEncoderUtilization", handle)
        return list(self._recorded("nvmlDeviceGetEncoderUtilization"))

    def nvmlDeviceGetDecoderUtilization(self, handle: Handle) -> list[int]:
        self._enter("nvmlDeviceGetDecoderUtilization", handle)
        return list(self._recorded("nvmlDeviceGetDecoderUtilization"))

    def nvmlDeviceGetPowerUsage(self, handle: Handle) -> int:
        self._enter("nvmlDeviceGetPowerUsage", handle)
        return self._recorded("nvmlDeviceGetPowerUsage")

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Handle) -> int:
        self._enter("nvmlDeviceGetEnforcedPowerLimit", handle)
        return self._recorded("nvmlDeviceGetEnforcedPowerLimit")

    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature", handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._recorded("nvmlDeviceGetTemperature")

    def nvmlDeviceGetClockInfo(self, handle: Handle, clock: int) -> int:
        self._enter("nvmlDeviceGetClockInfo", handle)
        entry = self._dev["clocks"][_CLOCK_NAMES[clock]]["cur"]
        if "ok" not in entry:
            raise pynvml.NVMLError(entry["code"])
        return entry["ok"]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Handle) -> int:
        self._enter("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return self._recorded("nvmlDeviceGetCurrentClocksEventReasons")

    def nvmlDeviceGetFieldValues(self, handle: Handle, field_ids: list[int]) -> Any:
        self._enter("nvmlDeviceGetFieldValues", handle)
        with self._lock:
            self.field_requests.append((self.uuid_of(handle), tuple(field_ids)))
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for value, field_id in zip(values, field_ids, strict=True):
            value.fieldId = field_id
            recorded = self._fields.get(field_id)
            ret, value_type, number = (pynvml.NVML_ERROR_NOT_SUPPORTED, 0, 0) if recorded is None else (
                recorded["ret"], recorded["valueType"], recorded["value"])
            if handle.mig is not None:  # MIG devices have no board-level counters
                ret = pynvml.NVML_ERROR_NOT_SUPPORTED
            ret, value_type, number = self.field_overrides.get((handle.gpu, field_id),
                                                               (ret, value_type, number))
            value.nvmlReturn = ret
            value.valueType = value_type
            setattr(value.value, _VALUE_MEMBERS[value_type], number)
        return values

    # -- processes ---------------------------------------------------------------------

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses", handle)
        gpu = self.gpus[handle.gpu]
        if handle.mig is not None:
            spec = self._mig(handle)
            return [self._process(pid, used, spec.gi_id, spec.ci_id) for pid, used in spec.processes]
        if gpu.migs is not None:  # a MIG-enabled parent lists every MIG device's processes
            return [self._process(pid, used, s.gi_id, s.ci_id)
                    for s in gpu.migs if s is not None for pid, used in s.processes]
        return [self._process(p["pid"] + gpu.pid_offset, p["usedGpuMemory"], p["gpuInstanceId"],
                              p["computeInstanceId"])
                for p in self._recorded("nvmlDeviceGetComputeRunningProcesses")]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Handle) -> list[Any]:
        self._enter("nvmlDeviceGetGraphicsRunningProcesses", handle)
        if handle.mig is not None:
            return []
        recorded = [self._process(p["pid"], p["usedGpuMemory"], p["gpuInstanceId"], p["computeInstanceId"])
                    for p in self._recorded("nvmlDeviceGetGraphicsRunningProcesses")]
        return recorded + [self._process(pid, used, NO_INSTANCE, NO_INSTANCE)
                           for pid, used in self.gpus[handle.gpu].graphics_processes]

    @staticmethod
    def _process(pid: int, used: int | None, gi: int, ci: int) -> Any:
        return SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=gi, computeInstanceId=ci)

    def nvmlDeviceGetProcessUtilization(self, handle: Handle, last_seen_us: int) -> list[Any]:
        self._enter("nvmlDeviceGetProcessUtilization", handle)
        with self._lock:
            self.process_util_since.append((self.uuid_of(handle), last_seen_us))
        newer = [SimpleNamespace(**s) for s in self.gpus[handle.gpu].process_samples
                 if s["timeStamp"] > last_seen_us]
        if not newer:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return newer

    # -- GPM ---------------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, handle: Handle) -> Any:
        self._enter("nvmlGpmQueryDeviceSupport", handle)
        support = self._dev["gpm"]["support"]
        if "ok" not in support:
            raise pynvml.NVMLError(support["code"])
        supported = support["ok"]["isSupportedDevice"] and self.gpus[handle.gpu].gpm_supported
        return SimpleNamespace(version=support["ok"]["version"], isSupportedDevice=int(bool(supported)))

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        struct = pynvml.struct_c_nvmlGpmSample_t()
        sample = pynvml.c_nvmlGpmSample_t(struct)
        with self._lock:
            self._samples[ctypes.addressof(struct)] = (struct, None)  # keeps the buffer alive
        return sample

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        with self._lock:
            self._samples.pop(self._address(sample), None)

    def nvmlGpmSampleGet(self, handle: Handle, sample: Any) -> Any:
        self._enter("nvmlGpmSampleGet", handle)
        if handle.mig is not None or not self.gpus[handle.gpu].gpm_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self._fill(sample, handle.gpu, None)
        return sample

    def nvmlGpmMigSampleGet(self, handle: Handle, gpu_instance_id: int, sample: Any) -> Any:
        self._enter("nvmlGpmMigSampleGet", handle)
        slots = self.gpus[handle.gpu].migs
        if handle.mig is not None or slots is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not any(s is not None and s.gi_id == gpu_instance_id for s in slots):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        self._fill(sample, handle.gpu, gpu_instance_id)
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        first, second = self._filled(request.sample1), self._filled(request.sample2)
        if first[:2] != second[:2] or first[2] >= second[2]:
            # Two samples of different devices, or not in time order: NVML refuses too.
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        ids = tuple(request.metrics[i].metricId for i in range(request.numMetrics))
        gpu, gi, _ = second
        with self._lock:
            who = self.gpus[gpu].uuid if gi is None else f"{self.gpus[gpu].uuid}/gi{gi}"
            self.gpm_requests.append((who, ids))
        for i, metric_id in enumerate(ids):
            recorded = self._gpm_metrics.get(metric_id)
            answer = request.metrics[i]
            if metric_id in self.gpm_overrides:
                answer.nvmlReturn, answer.value = pynvml.NVML_SUCCESS, self.gpm_overrides[metric_id]
            elif recorded is None:
                answer.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            else:
                answer.nvmlReturn, answer.value = recorded["ret"], recorded["value"]
        return request

    @staticmethod
    def _address(sample: Any) -> int:
        try:
            return ctypes.addressof(sample.contents)
        except (ValueError, AttributeError):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT) from None

    def _fill(self, sample: Any, gpu: int, gi: int | None) -> None:
        address = self._address(sample)
        with self._lock:
            if address not in self._samples:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            self._sample_seq += 1
            self._samples[address] = (self._samples[address][0], (gpu, gi, self._sample_seq))

    def _filled(self, sample: Any) -> tuple[int, int | None, int]:
        entry = self._samples.get(self._address(sample))
        if entry is None or entry[1] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return entry[1]

    # -- events ------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> _EventSet:
        self._enter("nvmlEventSetCreate")
        event_set = _EventSet()
        self.event_sets.append(event_set)
        return event_set

    def nvmlDeviceGetSupportedEventTypes(self, handle: Handle) -> int:
        self._enter("nvmlDeviceGetSupportedEventTypes", handle)
        return self.gpus[handle.gpu].event_types

    def nvmlDeviceRegisterEvents(self, handle: Handle, mask: int, event_set: _EventSet) -> None:
        self._enter("nvmlDeviceRegisterEvents", handle)
        if handle.mig is not None or mask & ~self.gpus[handle.gpu].event_types:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        event_set.registered[handle.gpu] = event_set.registered.get(handle.gpu, 0) | mask

    def nvmlEventSetWait_v2(self, event_set: _EventSet, timeout_ms: int) -> Any:
        self._enter("nvmlEventSetWait_v2")
        if event_set.freed:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        try:
            return event_set.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT) from None

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        self._enter("nvmlEventSetFree")
        event_set.freed = True
