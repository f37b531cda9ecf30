"""The NVML source: each ``collect()`` reads every GPU and MIG device into an ``DeviceSnapshot``.

Contract (DESIGN §1, §6):
- ``nvml`` is the pynvml module or a fake with the same call surface. Functions, constants
  and the error class are all read from that object; nothing is imported to be called.
- NVML is initialised on the first ``collect()``. A failed init raises ``SourceError`` and is
  not tried again before an exponential backoff (measured on ``monotonic``) has passed.
- Static identity (UUID, index, minor, model, PCI bus id, MIG mode, driver version) is read
  once per GPU. MIG devices are re-enumerated every cycle: dynamic MIG creates and destroys
  them at any time.
- An NVML error on one device marks only that device down this cycle (``up=False``, no
  readings, ``error`` set); it is read again next cycle and recovers by itself. NOT_SUPPORTED
  is remembered per (device, family) and never asked again. All field-value families come
  from one ``nvmlDeviceGetFieldValues`` call per device per cycle (``nvml_fields``: the request
  built once per device, the answers read from the array's bytes). The one-number getters (power,
  clocks, temperature, ...) are called through pynvml's loaded library without its wrappers
  (``nvml_calls``). A family whose raw answer is the device's last one gives its last readings.
- Processes are read from whole GPUs outside MIG mode and from MIG devices, never from a
  MIG-enabled parent (which would count every process twice).
- XIDs are counted on a background thread (``nvml_events``); GPM comes from ``nvml_gpm``; NVLink
  per link from ``nvml_nvlink`` (its entries ride in the one field-value call) and the fabric from
  ``nvml_fabric``, for whole GPUs only.
- Nothing is logged per cycle; only state changes are (init failing or succeeding, a device
  going down or coming back, devices appearing or disappearing).
"""

from __future__ import annotations

import ctypes
import logging
import math
import random as _random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final, NoReturn

from .. import catalog as cat
from ..backoff import Backoff
from ..model import DeviceSample, DeviceSnapshot, GpuDevice, Labels, ProcessSample, Reading
from . import Source, SourceError
from .nvml_calls import Getters
from .nvml_events import EventWatcher, XidCounter, XidTally
from .nvml_fabric import FabricReader, FabricState
from .nvml_fields import Answers, FieldBatch, FieldValues
from .nvml_gpm import GpmReader, gpm_supported
from .nvml_nvlink import LinkReader, LinkState, unwrap32

#: Who makes every device NVML reports (the snapshot's ``vendor``: OTLP's ``hw.vendor``).
VENDOR: Final = "NVIDIA"
_CLOCKS: Final = (
    ("NVML_CLOCK_SM", "sm"),
    ("NVML_CLOCK_MEM", "memory"),
    ("NVML_CLOCK_GRAPHICS", "graphics"),
    ("NVML_CLOCK_VIDEO", "video"),
)

#: Clock event (throttle) reason bits: NVML's name suffix and the exported label value.
_REASONS: Final = (
    ("GpuIdle", "gpu_idle"),
    ("ApplicationsClocksSetting", "applications_clocks_setting"),
    ("SwPowerCap", "sw_power_cap"),
    ("HwSlowdown", "hw_slowdown"),
    ("SyncBoost", "sync_boost"),
    ("SwThermalSlowdown", "sw_thermal_slowdown"),
    ("HwThermalSlowdown", "hw_thermal_slowdown"),
    ("HwPowerBrakeSlowdown", "hw_power_brake_slowdown"),
    ("DisplayClockSetting", "display_clock_setting"),
)


@dataclass(frozen=True, slots=True)
class _FieldSpec:
    """What one NVML field value becomes: a reading of ``family`` with these own labels."""

    family: cat.MetricSpec
    labels: Labels = ()
    """The family's own labels (``catalog.MetricSpec.extra``: checked against the family)."""
    scale: float = 1.0

    @property
    def counter(self) -> bool:
        """A counter: when NVML reports it as a 32-bit value it wraps, and is unwrapped here."""
        return self.family.kind == "counter"


#: The field-value families, by NVML constant name; all fetched in one call per device.
_FIELDS: Final = (
    ("NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", _FieldSpec(cat.GPU_ENERGY, scale=1e-3)),  # mJ
    ("NVML_FI_DEV_MEMORY_TEMP", _FieldSpec(cat.GPU_MEMORY_TEMPERATURE)),
    ("NVML_FI_DEV_PCIE_COUNT_TX_BYTES", _FieldSpec(cat.GPU_PCIE_BYTES, cat.GPU_PCIE_BYTES.extra(direction="tx"))),
    ("NVML_FI_DEV_PCIE_COUNT_RX_BYTES", _FieldSpec(cat.GPU_PCIE_BYTES, cat.GPU_PCIE_BYTES.extra(direction="rx"))),
    ("NVML_FI_DEV_PCIE_REPLAY_COUNTER", _FieldSpec(cat.GPU_PCIE_REPLAYS)),
    ("NVML_FI_DEV_ECC_SBE_VOL_TOTAL", _FieldSpec(cat.GPU_ECC_ERRORS, cat.GPU_ECC_ERRORS.extra(type="corrected"))),
    ("NVML_FI_DEV_ECC_DBE_VOL_TOTAL", _FieldSpec(cat.GPU_ECC_ERRORS, cat.GPU_ECC_ERRORS.extra(type="uncorrected"))),
    ("NVML_FI_DEV_REMAPPED_COR",
     _FieldSpec(cat.GPU_REMAPPED_ROWS, cat.GPU_REMAPPED_ROWS.extra(type="correctable"))),
    ("NVML_FI_DEV_REMAPPED_UNC",
     _FieldSpec(cat.GPU_REMAPPED_ROWS, cat.GPU_REMAPPED_ROWS.extra(type="uncorrectable"))),
    ("NVML_FI_DEV_REMAPPED_PENDING", _FieldSpec(cat.GPU_ROW_REMAP_PENDING)),
    ("NVML_FI_DEV_REMAPPED_FAILURE", _FieldSpec(cat.GPU_ROW_REMAP_FAILURE)),
)

#: What an operator should check when ``nvmlInit`` fails with these errors.
_INIT_HINTS: Final = {
    "NVML_ERROR_DRIVER_NOT_LOADED": "is the NVIDIA driver loaded, and are /dev/nvidia* visible "
                                    "to this container?",
    "NVML_ERROR_LIBRARY_NOT_FOUND": "libnvidia-ml.so.1 is not on the library path; run under the NVIDIA "
                                    "container runtime or mount the driver libraries",
    "NVML_ERROR_NO_PERMISSION": "no permission to open /dev/nvidia*",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "the NVML library and the loaded kernel driver differ in version",
}


class _DeviceFault(Exception):
    """An NVML error (other than NOT_SUPPORTED) while reading one device: the device is down."""

    def __init__(self, family: str, err: Exception) -> None:
        code = getattr(err, "value", "?")
        super().__init__(f"{err} (NVML error {code} reading {family})")


@dataclass(slots=True)
class _DeviceState:
    """What the source remembers about one device between cycles (mutable on purpose)."""

    field_ids: list[int]
    batch: FieldBatch | None = None
    """``field_ids`` and the links' entries as one request; None: to be built (again)."""
    unsupported: set[str] = field(default_factory=set)
    wraps: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Field id -> (last raw 32-bit value, offset added for wraps so far)."""
    family_answers: dict[str, tuple[Any, list[Reading]]] = field(default_factory=dict)
    """Family -> NVML's last raw answer and the readings made of it."""
    last_answers: Answers | None = None
    """The batch's answers last cycle; None after the batch changed."""
    board_readings: list[Reading | None] = field(default_factory=list)
    """Per board field (``field_ids``, in order): the reading made of its last answer (None: absent)."""
    last_process_ts: int = 0
    gpm: GpmReader | None = None
    gpm_without_nvlink: bool = False
    """GPM's NVLink rates are not asked: ``links`` has per-link data counters."""
    links: LinkState | None = None
    """Whole GPUs only, like ``fabric``."""
    fabric: FabricState | None = None
    down: bool = False


@dataclass(slots=True)
class _Mig:
    handle: Any
    device: GpuDevice
    state: _DeviceState


@dataclass(slots=True)
class _Gpu:
    handle: Any
    device: GpuDevice
    state: _DeviceState
    max_mig: int = 0
    compute_slices: int | None = None
    """Compute slices of a MIG-enabled GPU; None where NVML does not say (or MIG is off)."""
    gpm_supported: bool | None = None
    """None until probed (once, on the GPU's first good cycle)."""
    migs: dict[str, _Mig] = field(default_factory=dict)

    @property
    def mig_enabled(self) -> bool:
        return self.device.mig_mode == "enabled"


class _DeviceReader:
    """Reads the metric families of one device handle; remembers NOT_SUPPORTED in its state."""

    def __init__(self, nvml: Any, logger: logging.Logger) -> None:
        self._nvml = nvml
        self._log = logger
        self._broken: set[str] = set()
        """Families already logged as failing outside NVML (logged once per source, not per device)."""
        # pynvml's unversioned process calls are v3 (R510+); against an older library they raise
        # NVMLLibraryMismatchError instead of calling it. Those drivers have the v2 calls.
        self._mismatch: tuple[type[BaseException], ...] = tuple(
            c for c in (getattr(nvml, "NVMLLibraryMismatchError", None),) if isinstance(c, type))
        self._process_calls = {function: function for function in (
            "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses")}
        self._unsupported_codes = frozenset(
            int(code) for code in (getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", None),
                                   getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", None)) if code is not None)
        self._not_found = int(nvml.NVML_ERROR_NOT_FOUND)
        self._success = int(nvml.NVML_SUCCESS)
        self._memory_v2 = getattr(nvml, "nvmlMemory_v2", None)
        self._temperature_gpu = nvml.NVML_TEMPERATURE_GPU
        self._uint = getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_INT", None)
        self._fields = {int(getattr(nvml, const)): spec for const, spec in _FIELDS if hasattr(nvml, const)}
        self.field_ids: tuple[int, ...] = tuple(self._fields)
        self._reasons = tuple(
            (int(bit), cat.GPU_CLOCK_EVENT.extra(reason=label)) for suffix, label in _REASONS
            if (bit := getattr(nvml, f"nvmlClocksEventReason{suffix}",
                               getattr(nvml, f"nvmlClocksThrottleReason{suffix}", None))) is not None)
        # Each family: (name, the binding's function, fetch(handle, state) -> NVML's raw answer, build(raw)
        # -> its readings). An answer equal to the device's last one gives the same readings again.
        direct = Getters(nvml)
        plan: list[tuple[str, str, Callable[[Any, _DeviceState], Any], Callable[[Any], list[Reading]]]] = [
            ("memory", "nvmlDeviceGetMemoryInfo", self._memory, self._memory_readings),
            ("utilization", "nvmlDeviceGetUtilizationRates",
             # nvmlUtilization_t: {unsigned int gpu; unsigned int memory;}
             direct.make("nvmlDeviceGetUtilizationRates", outs=(ctypes.c_uint * 2,), read=tuple)
             or self._utilization, self._utilization_readings),
            *((family, function, direct.make(function, outs=(ctypes.c_uint, ctypes.c_uint))
               or partial(self._codec, function), partial(_ratio, spec.name))
              for family, function, spec in (
                  ("encoder", "nvmlDeviceGetEncoderUtilization", cat.GPU_ENCODER_UTILIZATION),
                  ("decoder", "nvmlDeviceGetDecoderUtilization", cat.GPU_DECODER_UTILIZATION))),
            *((family, function, direct.make(function) or partial(self._plain, function), partial(_watts, spec.name))
              for family, function, spec in (("power", "nvmlDeviceGetPowerUsage", cat.GPU_POWER),
                                             ("power_limit", "nvmlDeviceGetEnforcedPowerLimit", cat.GPU_POWER_LIMIT))),
            ("temperature", "nvmlDeviceGetTemperature",
             direct.make("nvmlDeviceGetTemperature", int(self._temperature_gpu)) or self._temperature,
             _temperature_readings),
        ]
        plan += [(f"clock_{label}", "nvmlDeviceGetClockInfo",
                  direct.make("nvmlDeviceGetClockInfo", clock) or partial(self._clock, clock),
                  partial(_clock_readings, cat.GPU_CLOCK.extra(clock=label)))
                 for const, label in _CLOCKS if hasattr(nvml, const) for clock in (int(getattr(nvml, const)),)]
        plan += [("clock_events", "nvmlDeviceGetCurrentClocksEventReasons",
                  direct.make("nvmlDeviceGetCurrentClocksEventReasons", outs=(ctypes.c_ulonglong,))
                  or self._clock_events, self._clock_event_readings)]
        # A binding too old for a family loses that family, loudly once, not every cycle.
        self._plan = tuple((family, fetch, build) for family, function, fetch, build in plan if hasattr(nvml, function))
        self._has_fields = hasattr(nvml, "nvmlDeviceGetFieldValues")
        self._field_values_reader = FieldValues(nvml)
        self._links = LinkReader(nvml, self._field_values_reader, self._uint)
        self._fabric = FabricReader(nvml, logger)
        for family, function in [(family, function) for family, function, _, _ in plan] + [
                ("fields", "nvmlDeviceGetFieldValues")]:
            if not hasattr(nvml, function):
                logger.warning("nvml: this NVML binding has no %s; %s is not collected", function, family)

    # -- one cycle of one device ---------------------------------------------------------

    def read(self, handle: Any, state: _DeviceState, uuid: str, now: float) -> list[Reading]:
        """Every supported family of one device; raises ``_DeviceFault`` on an NVML error."""
        readings: list[Reading] = []
        unsupported, last_answers, error = state.unsupported, state.family_answers, self._nvml.NVMLError
        for family, fetch, build in self._plan:
            if family in unsupported:
                continue
            try:
                raw = fetch(handle, state)
            except error as err:
                self._refused(state, family, err)
                continue
            except Exception as exc:  # noqa: BLE001 - see _guarded
                self._lost(state, family, exc)
                continue
            last = last_answers.get(family)
            if last is None or last[0] != raw:
                last = last_answers[family] = (raw, build(raw))
            readings += last[1]
        if self._has_fields and "fields" not in unsupported:
            # Appended in place (some 360 readings on a GB200): what fails costs this family's only.
            mark = len(readings)
            try:
                self._field_values(handle, state, readings)
            except error as err:
                del readings[mark:]
                self._refused(state, "fields", err)
            except Exception as exc:  # noqa: BLE001 - see _guarded
                del readings[mark:]
                self._lost(state, "fields", exc)
        if state.fabric is not None:
            readings += self._guarded(state, "fabric", self._fabric.read, handle, state.fabric, uuid)
        if state.gpm is not None:
            if state.links is not None and state.links.has_bytes and not state.gpm_without_nvlink:
                # The per-link counters' sum counts since the driver loaded: it replaces GPM's integral.
                state.gpm.drop_nvlink()
                state.gpm_without_nvlink = True
            readings += self._guarded(state, "gpm", state.gpm.read, now)
        return readings

    def processes(self, handle: Any, state: _DeviceState, uuid: str) -> list[ProcessSample]:
        """Compute and graphics processes of one device, deduplicated by pid, with their SM share."""
        memory: dict[int, float | None] = {}
        for family, function in (("compute_processes", "nvmlDeviceGetComputeRunningProcesses"),
                                 ("graphics_processes", "nvmlDeviceGetGraphicsRunningProcesses")):
            for proc in self._guarded(state, family, self._running_processes, function, handle):
                pid = int(proc.pid)
                if memory.get(pid) is None:  # a pid in both lists: keep the first known size
                    used = proc.usedGpuMemory
                    memory[pid] = None if used is None else float(used)
        if not memory:
            return []  # process utilisation costs ~2 ms per device: skip it when nobody runs
        sm = self._process_sm(handle, state)
        return [ProcessSample(uuid, pid, memory[pid], sm.get(pid)) for pid in sorted(memory)]

    def _guarded(self, state: _DeviceState, family: str, call: Callable[..., Any], *args: Any) -> Any:
        if family in state.unsupported:
            return []
        try:
            return call(*args)
        except self._nvml.NVMLError as err:
            self._refused(state, family, err)
            return []
        except Exception as exc:  # noqa: BLE001 - whatever one call raises costs that family only
            self._lost(state, family, exc)
            return []

    def _refused(self, state: _DeviceState, family: str, err: Any) -> None:
        """NOT_SUPPORTED: the family is never asked again on this device; any other NVML error: the device is down."""
        if err.value in self._unsupported_codes:
            state.unsupported.add(family)
            return
        raise _DeviceFault(family, err) from err

    def _lost(self, state: _DeviceState, family: str, exc: Exception) -> None:
        """A call that failed outside NVML (the binding could not make it against this library): it would
        fail the same way every cycle, so the family is dropped for this device, said once per source."""
        state.unsupported.add(family)
        if family not in self._broken:
            self._broken.add(family)
            self._log.warning("nvml: %s failed in the NVML binding (%s: %s); %s is not collected",
                              family, type(exc).__name__, exc, family)

    def _running_processes(self, function: str, handle: Any) -> Any:
        """``function`` (v3 in pynvml), or its ``_v2`` from the first time pynvml refuses v3 for this library."""
        name = self._process_calls[function]
        try:
            return getattr(self._nvml, name)(handle)
        except self._mismatch:
            fallback = f"{function}_v2"
            if name == fallback or not hasattr(self._nvml, fallback):
                raise
            self._process_calls[function] = fallback
            self._log.info("nvml: this NVML library predates %s v3 (R510); using v2", function)
            return getattr(self._nvml, fallback)(handle)

    def _process_sm(self, handle: Any, state: _DeviceState) -> dict[int, float]:
        """Mean SM utilisation per pid over the samples newer than the last ones seen."""
        family = "process_utilization"
        if family in state.unsupported:
            return {}
        since = state.last_process_ts
        try:
            samples = self._nvml.nvmlDeviceGetProcessUtilization(handle, since)
        except self._nvml.NVMLError as err:
            if err.value == self._not_found:
                return {}  # no sample newer than ``since``: not an error
            if err.value in self._unsupported_codes:
                state.unsupported.add(family)
                return {}
            raise _DeviceFault(family, err) from err
        except Exception as exc:  # noqa: BLE001 - see _guarded
            self._lost(state, family, exc)
            return {}
        sums: dict[int, list[float]] = {}
        newest = since
        for sample in samples:
            stamp = int(sample.timeStamp)
            if stamp <= since:
                continue
            newest = max(newest, stamp)
            acc = sums.setdefault(int(sample.pid), [0.0, 0.0])
            acc[0] += float(sample.smUtil)
            acc[1] += 1.0
        state.last_process_ts = newest
        return {pid: total / count / 100.0 for pid, (total, count) in sums.items()}

    # -- family readers: one NVML call each, converted to base units --------------------

    def _memory(self, handle: Any, state: _DeviceState) -> tuple[int, int, int, int | None]:
        nvml = self._nvml
        info = None
        if self._memory_v2 is not None and "memory_v2" not in state.unsupported:
            try:
                info = nvml.nvmlDeviceGetMemoryInfo(handle, version=self._memory_v2)
            except nvml.NVMLError as err:
                if err.value not in self._unsupported_codes:
                    raise
                state.unsupported.add("memory_v2")  # drivers before R510: fall back to v1
        if info is None:
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
        return info.used, info.free, info.total, getattr(info, "reserved", None)

    @staticmethod
    def _memory_readings(raw: tuple[int, int, int, int | None]) -> list[Reading]:
        used, free, total, reserved = raw
        out = [Reading(cat.GPU_MEMORY_USED.name, float(used)), Reading(cat.GPU_MEMORY_FREE.name, float(free)),
               Reading(cat.GPU_MEMORY_TOTAL.name, float(total))]
        if reserved is not None:
            out.append(Reading(cat.GPU_MEMORY_RESERVED.name, float(reserved)))
        return out

    def _utilization(self, handle: Any, _state: _DeviceState) -> tuple[int, int]:
        rates = self._nvml.nvmlDeviceGetUtilizationRates(handle)
        return rates.gpu, rates.memory

    @staticmethod
    def _utilization_readings(raw: tuple[int, int]) -> list[Reading]:
        gpu, memory = raw
        return [Reading(cat.GPU_UTILIZATION.name, gpu / 100.0),
                Reading(cat.GPU_MEMORY_UTILIZATION.name, memory / 100.0)]

    def _codec(self, function: str, handle: Any, _state: _DeviceState) -> Any:
        percent, _period_us = getattr(self._nvml, function)(handle)
        return percent

    def _plain(self, function: str, handle: Any, _state: _DeviceState) -> Any:
        return getattr(self._nvml, function)(handle)

    def _temperature(self, handle: Any, _state: _DeviceState) -> Any:
        return self._nvml.nvmlDeviceGetTemperature(handle, self._temperature_gpu)

    def _clock(self, clock: int, handle: Any, _state: _DeviceState) -> Any:
        return self._nvml.nvmlDeviceGetClockInfo(handle, clock)

    def _clock_events(self, handle: Any, _state: _DeviceState) -> int:
        return int(self._nvml.nvmlDeviceGetCurrentClocksEventReasons(handle))

    def _clock_event_readings(self, bits: int) -> list[Reading]:
        return [Reading(cat.GPU_CLOCK_EVENT.name, 1.0 if bits & bit else 0.0, labels) for bit, labels in self._reasons]

    def _field_values(self, handle: Any, state: _DeviceState, out: list[Reading]) -> None:
        links = state.links
        if links is not None and links.links is None:
            self._links.discover(handle, links)
        if state.batch is None or (links is not None and links.changed):
            link_requests = self._links.requests(links) if links is not None else []
            state.batch = self._field_values_reader.batch([(fid, 0) for fid in state.field_ids] + link_requests)
            state.last_answers = None  # a new batch: every answer is new
        answers = self._field_values_reader.read(handle, state.batch)
        last, state.last_answers = state.last_answers, answers
        board = len(state.field_ids)
        self._board_fields(state, answers, last, out)
        if links is not None and links.entries:
            self._links.readings(handle, links, answers, last, board, out)

    def _board_fields(self, state: _DeviceState, answers: Answers, last: Answers | None,
                      out: list[Reading]) -> None:
        """The board-level fields (the batch's first entries); an answer equal to last cycle's gives
        last cycle's reading again."""
        count = len(state.field_ids)
        if len(state.board_readings) != count:
            state.board_readings, last = [None] * count, None
        made = state.board_readings
        dropped: set[int] = set()
        reader = self._field_values_reader
        for i in () if answers.same(last, 0, count) else range(count):
            if answers.same(last, i, i + 1):
                continue
            field_id = state.field_ids[i]
            made[i] = None
            value_type, ret = answers.head(i)
            if ret != self._success:
                if ret in self._unsupported_codes:
                    dropped.add(field_id)
                continue  # any other per-field error: absent this cycle, asked again next cycle
            spec = self._fields.get(field_id)
            raw = reader.number(answers, i)
            if spec is None or raw is None:
                continue
            if spec.counter and value_type == self._uint:
                # The PCIe byte counters are 32-bit (see the H200 recording) and wrap after 4 GiB;
                # exported raw they would look like counter resets.
                raw = unwrap32(state.wraps, field_id, int(raw))
            made[i] = Reading(spec.family.name, float(raw) * spec.scale, spec.labels)
        out += filter(None, made)
        if dropped:
            state.field_ids = [fid for fid in state.field_ids if fid not in dropped]
            state.batch = None
            state.board_readings = []  # re-indexed with the new batch


def _ratio(metric: str, percent: int) -> list[Reading]:
    return [Reading(metric, percent / 100.0)]


def _watts(metric: str, milliwatts: int) -> list[Reading]:
    return [Reading(metric, milliwatts / 1000.0)]


def _temperature_readings(celsius: int) -> list[Reading]:
    return [Reading(cat.GPU_TEMPERATURE.name, float(celsius))]


def _clock_readings(labels: Labels, mhz: int) -> list[Reading]:
    return [Reading(cat.GPU_CLOCK.name, mhz * 1e6, labels)]


def _text(value: Any) -> str:
    """pynvml returns str in recent versions and bytes in old ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


#: The GPU-instance profiles that span a whole GPU of some model (A30: 4 slices; A100 to GB200: 7).
_WHOLE_GPU_PROFILES: Final = ("NVML_GPU_INSTANCE_PROFILE_4_SLICE", "NVML_GPU_INSTANCE_PROFILE_6_SLICE",
                              "NVML_GPU_INSTANCE_PROFILE_7_SLICE", "NVML_GPU_INSTANCE_PROFILE_8_SLICE")


def _mig_profile(name: str) -> str:
    """``NVIDIA H200 MIG 1g.18gb`` -> ``1g.18gb``; ``""`` when the name has no MIG part."""
    _, sep, profile = name.rpartition(" MIG ")
    return profile.strip() if sep else ""


def _seconds(value: float) -> str:
    """Human seconds for messages, rounded up so "retrying in" never says 0: ``1``, ``0.5``, ``60``."""
    if value >= 10:
        return str(math.ceil(value))
    return f"{math.ceil(value * 10) / 10:.1f}".removesuffix(".0")


def _xid_readings(uuid: str, xids: dict[str, XidTally]) -> tuple[Reading, ...]:
    tally = xids.get(uuid)
    if tally is None:
        return ()
    counts = tuple(Reading(cat.GPU_XID_ERRORS.name, float(count), cat.GPU_XID_ERRORS.extra(xid=str(code)))
                   for code, count in tally.counts)
    return counts + (Reading(cat.GPU_LAST_XID.name, tally.last_timestamp),)


def _mig_order(mig: _Mig) -> tuple[int, int, int, str]:
    d = mig.device
    start = d.placement_start if d.placement_start is not None else 1 << 30
    return (start, d.gi_id or 0, d.ci_id or 0, d.uuid)


class NvmlSource(Source[DeviceSnapshot]):
    """Reads NVML once per ``collect()``; see the module docstring for the contract."""

    name = "nvml"

    def __init__(self, nvml: Any, *, wall_clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 init_backoff: tuple[float, float] = (1.0, 60.0), events: bool = True,
                 event_poll_ms: int = 500, logger: logging.Logger | None = None,
                 random: Callable[[], float] = _random.random) -> None:
        try:
            self._backoff = Backoff(*init_backoff, monotonic=monotonic, random=random)
        except ValueError as exc:
            raise ValueError(f"init_backoff: {exc}") from None
        if event_poll_ms <= 0:
            raise ValueError("event_poll_ms must be a positive number of milliseconds, "
                             f"got {event_poll_ms!r}")
        self._nvml = nvml
        self._wall_clock = wall_clock
        self._monotonic = monotonic
        self._events = events
        self._event_poll_ms = event_poll_ms
        self._log = logger or logging.getLogger(__name__)
        self._reader = _DeviceReader(nvml, self._log)
        self._xids = XidCounter()
        self._watcher: EventWatcher | None = None
        self._gpus: list[_Gpu] = []
        self._missing: dict[int, str] = {}
        self._ready = False
        self._closed = False
        self._attempts = 0
        self._init_error = ""
        self._driver = ""
        self._nvml_version = ""
        self._migs_changed = False

    @property
    def init_attempts(self) -> int:
        """How many times ``nvmlInit`` has been called."""
        return self._attempts

    # -- public ------------------------------------------------------------------------

    def collect(self) -> DeviceSnapshot:
        """Read every device once; raises ``SourceError`` only when NVML itself is unusable."""
        self._ensure_ready()
        if self._missing:
            self._retry_missing()
            if not self._gpus:
                # Not an empty node: every GPU fails. Saying so beats publishing nothing.
                index, reason = min(self._missing.items())
                raise SourceError(f"nvml: none of the {len(self._missing)} GPU(s) answers "
                                  f"(GPU {index}: {reason}); retrying every cycle")
        now = self._monotonic()
        xids = self._xids.tallies()
        devices: list[DeviceSample] = []
        processes: list[ProcessSample] = []
        for gpu in self._gpus:
            self._collect_gpu(gpu, now, xids, devices, processes)
        if self._migs_changed and self._watcher is not None:
            self._watcher.mig_index = {
                gpu.device.uuid: {(m.device.gi_id or 0, m.device.ci_id or 0): m.device.uuid
                                  for m in gpu.migs.values()}
                for gpu in self._gpus if gpu.migs}
        self._migs_changed = False
        return DeviceSnapshot(tuple(devices), tuple(processes), self._driver, self._nvml_version, VENDOR)

    def close(self) -> None:
        """Stop the event thread, free GPM buffers and shut NVML down. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
        if not self._ready:
            return
        self._ready = False
        for gpu in self._gpus:
            for state in [gpu.state, *(m.state for m in gpu.migs.values())]:
                if state.gpm is not None:
                    state.gpm.free()
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as err:
            self._log.debug("nvml: shutdown failed: %s", err)

    # -- init with backoff ---------------------------------------------------------------

    def _ensure_ready(self) -> None:
        if self._closed:
            raise SourceError("nvml: the source is closed")
        if self._ready:
            return
        if self._backoff.remaining():
            # The failed attempt's words, not a countdown: a message that changes every cycle is
            # logged every cycle (the runner logs changes), and this one changes once per attempt.
            raise SourceError(self._init_error)
        nvml = self._nvml
        self._attempts += 1
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as err:
            self._init_failed(err)
        try:
            self._start_session()
        except nvml.NVMLError as err:
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError:
                pass
            self._init_failed(err)
        if self._backoff.failures:
            self._log.info("nvml: initialised after %d failed attempts", self._backoff.failures)
        self._log.info("nvml: %d GPU(s), driver %s, NVML %s", len(self._gpus) + len(self._missing),
                       self._driver, self._nvml_version)
        self._ready = True
        self._backoff.succeeded()

    def _init_failed(self, err: Exception) -> NoReturn:
        delay = self._backoff.failed()
        reason = str(err)
        for const, hint in _INIT_HINTS.items():
            if getattr(err, "value", None) == getattr(self._nvml, const, object()):
                reason = f"{reason} ({hint})"
        message = f"nvml: init failed: {reason}; retrying in {_seconds(delay)}s"
        self._init_error = message
        if self._backoff.failures == 1:
            self._log.warning("%s", message)  # later failures repeat it: the agent reports them
        raise SourceError(message) from None

    def _start_session(self) -> None:
        nvml = self._nvml
        self._driver = _text(nvml.nvmlSystemGetDriverVersion())
        self._nvml_version = _text(nvml.nvmlSystemGetNVMLVersion())
        self._gpus, self._missing = [], {}
        for index in range(int(nvml.nvmlDeviceGetCount())):
            self._add_gpu(index)
        if self._events:
            self._start_events()

    # -- enumeration ---------------------------------------------------------------------

    def _add_gpu(self, index: int) -> bool:
        """Read a GPU's static identity; a GPU that fails is retried on later cycles."""
        nvml = self._nvml
        try:
            gpu = self._identify_gpu(index)
        except nvml.NVMLError as err:
            if index not in self._missing:
                self._log.warning("nvml: GPU %d cannot be identified: %s; retrying every cycle", index, err)
            self._missing[index] = str(err)
            return False
        if self._missing.pop(index, None) is not None:
            self._log.info("nvml: GPU %d (%s) is identified now", index, gpu.device.uuid)
        self._gpus.append(gpu)
        self._gpus.sort(key=lambda g: g.device.index)
        return True

    def _identify_gpu(self, index: int) -> _Gpu:
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        mig_mode = self._mig_mode(handle)
        device = GpuDevice(
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            index=int(nvml.nvmlDeviceGetIndex(handle)),
            minor=int(nvml.nvmlDeviceGetMinorNumber(handle)),
            model=_text(nvml.nvmlDeviceGetName(handle)),
            pci_bus_id=_text(nvml.nvmlDeviceGetPciInfo_v3(handle).busId),
            driver_version=self._driver,
            mig_mode=mig_mode,
        )
        max_mig = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)) if mig_mode == "enabled" else 0
        slices = self._compute_slices(handle) if mig_mode == "enabled" else None
        state = _DeviceState(list(self._reader.field_ids), links=LinkState(), fabric=FabricState())
        return _Gpu(handle, device, state, max_mig=max_mig, compute_slices=slices)

    def _compute_slices(self, handle: Any) -> int | None:
        """The slice count of the GPU's largest GPU-instance profile: 7 on A100 and H100 to GB200, 4
        on A30. A MIG device's share of its GPU is its slices over this, never over a constant."""
        nvml = self._nvml
        counts = []
        for name in _WHOLE_GPU_PROFILES:
            profile = getattr(nvml, name, None)
            if profile is None:
                continue  # an older pynvml
            try:
                counts.append(int(nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile).sliceCount))
            except nvml.NVMLError as err:
                if err.value in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT,
                                 nvml.NVML_ERROR_NO_PERMISSION, nvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                    continue  # not a profile of this GPU, or a driver that cannot say
                raise
        return max(counts, default=0) or None

    def _mig_mode(self, handle: Any) -> str:
        nvml = self._nvml
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        except nvml.NVMLError as err:
            if err.value == nvml.NVML_ERROR_NOT_SUPPORTED:
                return "disabled"  # a GPU without MIG
            raise
        return "enabled" if current == nvml.NVML_DEVICE_MIG_ENABLE else "disabled"

    def _retry_missing(self) -> None:
        for index in sorted(self._missing):
            if self._add_gpu(index) and self._watcher is not None:
                gpu = next(g for g in self._gpus if g.device.index == index)
                self._watcher.register(gpu.handle, gpu.device.uuid)

    def _refresh_migs(self, gpu: _Gpu) -> None:
        """Re-list the MIG devices of a MIG-enabled GPU; identity is read once per new UUID."""
        nvml = self._nvml
        found: dict[str, _Mig] = {}
        try:
            for slot in range(gpu.max_mig):
                try:
                    handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, slot)
                except nvml.NVMLError as err:
                    if err.value == nvml.NVML_ERROR_NOT_FOUND:
                        continue  # an empty slot
                    raise
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                mig = gpu.migs.get(uuid)
                if mig is None:
                    mig = self._identify_mig(gpu, handle, uuid)
                mig.handle = handle
                found[uuid] = mig
        except nvml.NVMLError as err:
            raise _DeviceFault("MIG devices", err) from err
        for uuid in gpu.migs.keys() - found.keys():
            gone = gpu.migs[uuid]
            if gone.state.gpm is not None:
                gone.state.gpm.free()
            self._log.info("nvml: MIG device %s (%s) on GPU %d is gone",
                           uuid, gone.device.profile, gpu.device.index)
            self._migs_changed = True
        gpu.migs = found

    def _identify_mig(self, gpu: _Gpu, handle: Any, uuid: str) -> _Mig:
        nvml = self._nvml
        gi_id = int(nvml.nvmlDeviceGetGpuInstanceId(handle))
        ci_id = int(nvml.nvmlDeviceGetComputeInstanceId(handle))
        profile = _mig_profile(_text(nvml.nvmlDeviceGetName(handle)))
        gi_profile_id = start = size = None
        try:
            info = nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceGetGpuInstanceById(gpu.handle, gi_id))
            gi_profile_id = int(info.profileId)
            start, size = int(info.placement.start), int(info.placement.size)
        except nvml.NVMLError as err:
            if err.value not in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_NO_PERMISSION):
                raise
            # Without placement, dynamic MIG devices cannot be matched to DRA names; say so once.
            self._log.warning("nvml: placement of MIG device %s is unknown: %s", uuid, err)
        parent = gpu.device
        device = GpuDevice(
            uuid=uuid, index=parent.index, minor=parent.minor, model=parent.model,
            pci_bus_id=parent.pci_bus_id, driver_version=parent.driver_version, mig_mode="",
            parent_uuid=parent.uuid, profile=profile, gi_id=gi_id, ci_id=ci_id,
            gi_profile_id=gi_profile_id, placement_start=start, placement_size=size)
        state = _DeviceState(list(self._reader.field_ids))
        if gpu.gpm_supported:
            state.gpm = GpmReader(nvml, gpu.handle, gi_id)
        self._log.info("nvml: MIG device %s (%s) on GPU %d appeared", uuid, profile, parent.index)
        self._migs_changed = True
        return _Mig(handle, device, state)

    # -- one cycle -----------------------------------------------------------------------

    def _collect_gpu(self, gpu: _Gpu, now: float, xids: dict[str, XidTally],
                     devices: list[DeviceSample], processes: list[ProcessSample]) -> None:
        reader = self._reader
        try:
            self._probe_gpm(gpu)
            readings = reader.read(gpu.handle, gpu.state, gpu.device.uuid, now)
            if gpu.compute_slices is not None:
                readings.append(Reading(cat.GPU_MIG_COMPUTE_SLICES.name, float(gpu.compute_slices)))
            procs = [] if gpu.mig_enabled else reader.processes(gpu.handle, gpu.state, gpu.device.uuid)
            if gpu.mig_enabled:
                self._refresh_migs(gpu)
        except _DeviceFault as fault:
            devices.append(self._down(gpu.device, gpu.state, fault, xids))
            devices.extend(self._down(mig.device, mig.state, fault, xids)
                           for mig in sorted(gpu.migs.values(), key=_mig_order))
            return
        devices.append(self._up(gpu.device, gpu.state, readings, xids))
        processes += procs
        for mig in sorted(gpu.migs.values(), key=_mig_order):
            try:
                readings = reader.read(mig.handle, mig.state, mig.device.uuid, now)
                procs = reader.processes(mig.handle, mig.state, mig.device.uuid)
            except _DeviceFault as fault:
                devices.append(self._down(mig.device, mig.state, fault, xids))
                continue
            devices.append(self._up(mig.device, mig.state, readings, xids))
            processes += procs

    def _probe_gpm(self, gpu: _Gpu) -> None:
        if gpu.gpm_supported is not None:
            return
        try:
            gpu.gpm_supported = gpm_supported(self._nvml, gpu.handle)
        except self._nvml.NVMLError as err:
            raise _DeviceFault("GPM support", err) from err
        except Exception as exc:  # noqa: BLE001 - see _DeviceReader._guarded
            gpu.gpm_supported = False
            self._log.warning("nvml: GPU %s: GPM support cannot be asked (%s: %s); no GPM families",
                              gpu.device.uuid, type(exc).__name__, exc)
        if gpu.gpm_supported:
            gpu.state.gpm = GpmReader(self._nvml, gpu.handle)

    def _up(self, device: GpuDevice, state: _DeviceState, readings: list[Reading],
            xids: dict[str, XidTally]) -> DeviceSample:
        if state.down:
            state.down = False
            self._log.info("nvml: device %s is back up", device.uuid)
        return DeviceSample(device, True, (*readings, *_xid_readings(device.uuid, xids)))

    def _down(self, device: GpuDevice, state: _DeviceState, fault: _DeviceFault,
              xids: dict[str, XidTally]) -> DeviceSample:
        if not state.down:
            state.down = True
            self._log.warning("nvml: device %s is down: %s", device.uuid, fault)
        if state.gpm is not None:
            state.gpm.reset()
        # XID counts are not read from the device, and the XID that took it down (79, "fallen
        # off the bus") is the one an alert needs: keep them on a down device.
        return DeviceSample(device, False, _xid_readings(device.uuid, xids), str(fault))

    def _start_events(self) -> None:
        watcher = EventWatcher(self._nvml, self._xids, poll_ms=self._event_poll_ms,
                               wall_clock=self._wall_clock, logger=self._log)
        try:
            started = watcher.start((gpu.handle, gpu.device.uuid) for gpu in self._gpus)
        except self._nvml.NVMLError as err:
            self._log.warning("nvml: XID events are unavailable: %s", err)
            return
        if started:
            self._watcher = watcher
            self._migs_changed = True
        else:
            self._log.info("nvml: no GPU reports XID events; XID counters stay absent")
