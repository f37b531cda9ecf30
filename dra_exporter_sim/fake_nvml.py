"""A fake NVML with pynvml's call surface, driven by a scenario and a simulated clock.

``FakeNvml(scenario, clock)`` answers the NVML calls the NVML source makes (see
the contract in ``sources/nvml.py``) with pynvml's signatures, return shapes,
units and error class (``pynvml.NVMLError``), so the source cannot tell it from
the real module. pynvml's ``NVML_*``/``nvml*`` constants, error classes and ctypes
structs are attributes of it too. Values come from the GPU profile recorded on a
real H200 and from the scenario's processes at the clock's current time:

- a device's utilisation is what its processes do (their ``sm`` curves, summed and
  clamped; per-process shares are scaled to agree with the device), its used
  memory is their memory plus a small context overhead;
- power is idle + (0.95 x limit - idle) x utilisation; temperature and clocks
  follow power; energy and PCIe byte counters integrate utilisation over
  simulated time, so they only grow and are a pure function of time;
- MIG devices answer identity, memory, processes and GPM (through the parent) and
  raise NOT_SUPPORTED for utilisation rates, power, clocks and temperature;
- faults: ``gpu_lost`` (every call on that GPU raises GPU_IS_LOST, and an XID 79
  event is delivered), ``family_unsupported``, ``init_failure``, ``xid`` events and
  ``nvml_hang`` (calls block while the fault lasts, as a wedged driver's do; on one GPU
  or all of them).

``fake.calls`` counts every NVML call by name; ``latency_s`` makes each call
sleep (a number for all, or per-function seconds such as
``scenario.profile.recorded_latency_s()``) for benchmarks.
"""

from __future__ import annotations

import ctypes
import functools
import math
import threading
import time
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import pynvml

from .clock import SimClock
from .fake_nvml_nvlink import NVLINK_FIELD_IDS, NvLinkModel
from .profile import GpuProfile
from .scenario import Gpu, MigDevice, Pod, Process, Scenario, unit_hash

# NVML's "not applicable" instance id, as real NVML reports for processes on whole GPUs.
_NO_INSTANCE: Final = 0xFFFFFFFF
_MIB: Final = 1 << 20
# Per-process utilisation is sampled this often (seconds), as a timestamped buffer.
_PROC_SAMPLE_PERIOD: Final = 1 / 6
# Above this share of the power limit the clocks leave max boost (power capping).
_POWER_CAP_ONSET: Final = 0.8
_XID_GPU_FALLEN_OFF_BUS: Final = 79
_INIT_ERRORS: Final = {"driver_not_loaded": pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
                       "library_not_found": pynvml.NVML_ERROR_LIBRARY_NOT_FOUND}
_CLOCK_NAMES: Final = {pynvml.NVML_CLOCK_GRAPHICS: "graphics", pynvml.NVML_CLOCK_SM: "sm",
                       pynvml.NVML_CLOCK_MEM: "mem", pynvml.NVML_CLOCK_VIDEO: "video"}
_VALUE_MEMBERS: Final = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
#: NVML's GPU-instance profile indices (not the profile ids MIG devices report) by slice count.
_PROFILE_SLICES: Final = {pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE: 1, pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE: 2,
                          pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE: 3, pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE: 4,
                          pynvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE: 6, pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE: 7,
                          pynvml.NVML_GPU_INSTANCE_PROFILE_8_SLICE: 8}
_PCIE_GPM: Final = {pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: "tx",
                    pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: "rx"}
#: NVLink traffic over all links, in MiB/s as nvml.h defines them (answered where the profile has NVLink).
_NVLINK_GPM: Final = {pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: "tx",
                      pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: "rx"}


def _fail(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


# --- handles -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _DeviceHandle:
    """Opaque device handle: a whole GPU, or the ``mig``-th MIG device of one."""

    gpu: int
    mig: int | None = None


@dataclass(frozen=True, slots=True)
class _GpuInstanceHandle:
    gpu: int
    gi_id: int


class _EventSet:
    """Registrations of one ``nvmlEventSetCreate`` set and what it already delivered."""

    def __init__(self) -> None:
        self.masks: dict[int, int] = {}
        self.registered_at: dict[int, float] = {}
        self.delivered: set[int] = set()
        self.freed = False


@dataclass(frozen=True, slots=True)
class EventData:
    """What ``nvmlEventSetWait_v2`` returns (pynvml's ``c_nvmlEventData_t`` fields)."""

    device: _DeviceHandle
    eventType: int  # noqa: N815 - pynvml's field names
    eventData: int  # noqa: N815
    gpuInstanceId: int  # noqa: N815
    computeInstanceId: int  # noqa: N815


@dataclass(frozen=True, slots=True)
class _Xid:
    at: float
    gpu: int
    xid: int
    gi_id: int
    ci_id: int


@dataclass(frozen=True, slots=True)
class _GpmSnapshot:
    gpu: int
    gi_id: int | None
    t: float
    activity_integral: float


@dataclass(frozen=True, slots=True)
class _Target:
    """A resolved handle: the GPU, the MIG device (or None) and the time of the call."""

    gpu: Gpu
    mig: MigDevice | None
    t: float


@dataclass(frozen=True, slots=True)
class _ProcLoad:
    pid: int
    memory: int
    share: float
    """Share of the device's SMs (0-1); shares on one device sum to at most 1."""
    gi_id: int
    ci_id: int


# --- the workload model ------------------------------------------------------------------------


class _Integral:
    """The integral of ``f`` from 0 to t, summed per simulated second.

    ``f`` is taken as constant over each second (its midpoint value), so the result
    is continuous, never decreases for ``f >= 0`` and depends on ``t`` alone,
    whatever order calls come in. Running sums are kept for the last call and
    every ``_BLOCK`` seconds, so steady forward calls cost O(1).
    """

    _BLOCK: Final = 600

    def __init__(self, f: Callable[[float], float]) -> None:
        self._f = f
        self._checkpoints = array("d", [0.0])
        self._last = (0, 0.0)
        self._lock = threading.Lock()

    def __call__(self, t: float) -> float:
        k = int(t)
        with self._lock:
            acc = self._sum_to(k)
        return acc + (t - k) * self._f(k + 0.5)

    def _sum_to(self, k: int) -> float:
        block = min(k // self._BLOCK, len(self._checkpoints) - 1)
        i, acc = block * self._BLOCK, self._checkpoints[block]
        last_k, last_acc = self._last
        if i <= last_k <= k:
            i, acc = last_k, last_acc
        while i < k:
            acc += self._f(i + 0.5)
            i += 1
            if i % self._BLOCK == 0 and i // self._BLOCK == len(self._checkpoints):
                self._checkpoints.append(acc)
        self._last = (k, acc)
        return acc


class _Workload:
    """Who runs on which device and how hard, as a pure function of simulated time."""

    def __init__(self, scenario: Scenario) -> None:
        self._seed = scenario.seed
        by_device: dict[str, list[tuple[Pod, Process]]] = {}
        for pod in scenario.pods:
            for container in pod.containers:
                for proc in container.processes:
                    by_device.setdefault(proc.uuid, []).append((pod, proc))
        self._by_device = {uuid: tuple(v) for uuid, v in by_device.items()}
        self._instance = {m.uuid: (m.gi_id, m.ci_id) for g in scenario.gpus for m in g.mig}

    def processes(self, uuid: str, t: float) -> tuple[_ProcLoad, ...]:
        """Processes on one device at ``t``, one per PID, SM shares summing to at most 1."""
        loads: dict[int, list[float]] = {}
        for pod, proc in self._by_device.get(uuid, ()):
            if pod.alive_at(t):
                level = min(1.0, max(0.0, proc.sm.value(t, self._seed, proc.key)))
                mem_sm = loads.setdefault(proc.pid, [0.0, 0.0])
                mem_sm[0] += proc.memory_bytes
                mem_sm[1] += level
        total = sum(sm for _, sm in loads.values())
        scale = 1.0 / total if total > 1.0 else 1.0
        gi, ci = self._instance.get(uuid, (_NO_INSTANCE, _NO_INSTANCE))
        return tuple(_ProcLoad(pid, int(mem), sm * scale, gi, ci) for pid, (mem, sm) in sorted(loads.items()))

    def utilization(self, uuid: str, t: float) -> float:
        return min(1.0, sum(p.share for p in self.processes(uuid, t)))


# --- the fake ------------------------------------------------------------------------------------

_F = TypeVar("_F", bound=Callable[..., Any])


def _nvml(family: str | None = None, *, handle: bool = True, mig: bool = True) -> Callable[[_F], _F]:
    """Wrap one NVML function: count it, honour latency and init, resolve its handle.

    With ``handle``, the first argument is a device handle; the wrapped method gets
    a ``_Target`` instead, after the checks real NVML would fail: unknown handle,
    GPU lost, a family MIG devices do not support (``mig=False``), or a
    ``family_unsupported`` fault.
    """

    def wrap(fn: _F) -> _F:
        name = fn.__name__

        @functools.wraps(fn)
        def call(self: FakeNvml, *args: Any, **kwargs: Any) -> Any:
            self._enter(name)
            if not handle:
                return fn(self, *args, **kwargs)
            target = self._target(args[0] if args else None, family, mig)
            return fn(self, target, *args[1:], **kwargs)

        return call  # type: ignore[return-value]

    return wrap


class FakeNvml:
    """pynvml's call surface over a simulated node; see the module docstring."""

    NVMLError = pynvml.NVMLError

    def __init__(self, scenario: Scenario, clock: SimClock, *,
                 latency_s: float | Mapping[str, float] = 0.0) -> None:
        self.scenario = scenario
        self.clock = clock
        self.calls: Counter[str] = Counter()
        self._latency = latency_s
        self._profile: GpuProfile = scenario.profile
        self._gpus = scenario.gpus
        self._work = _Workload(scenario)
        self._lock = threading.Lock()
        self._init_count = 0
        self._gpm_samples: dict[int, tuple[Any, _GpmSnapshot | None]] = {}
        self._activity = {g.index: _Integral(functools.partial(self._gpu_activity, g)) for g in self._gpus}
        self._mig_activity = {m.uuid: _Integral(functools.partial(self._work.utilization, m.uuid))
                              for g in self._gpus for m in g.mig}
        self._xids = self._xid_events()
        self._field_specs = {f.id: f for f in self._profile.fields}
        self._gpm_specs = {m.id: m for m in self._profile.gpm_metrics}
        # Counters start where the recorded GPU's were, scaled per GPU so no two read alike.
        self._offsets = {g.index: 1 + 0.25 * unit_hash(scenario.seed, "counters", str(g.index))
                         for g in self._gpus}
        nvlink = self._profile.nvlink
        self._links = None if nvlink is None else NvLinkModel(
            scenario, nvlink, self._profile.fabric, self._gpu_activity, self._offsets, _Integral)

    def __repr__(self) -> str:
        return f"FakeNvml(scenario={self.scenario.name!r}, gpus={len(self._gpus)}, t={self.clock.now():.3f})"

    # -- plumbing ------------------------------------------------------------------------------

    def _enter(self, name: str) -> None:
        with self._lock:
            self.calls[name] += 1
            initialized = self._init_count > 0
        latency = self._latency.get(name, 0.0) if isinstance(self._latency, Mapping) else self._latency
        if latency > 0:
            time.sleep(latency)
        self._hang(None)
        if not initialized and name != "nvmlInit":
            raise _fail(pynvml.NVML_ERROR_UNINITIALIZED)

    def _hang(self, gpu: int | None) -> None:
        """Block while an ``nvml_hang`` fault for ``gpu`` (None: the whole driver) is active.

        Sleeps on the clock until the fault's ``until`` (forever without one), re-checking
        whenever the clock is moved, so a test on a frozen clock ends the hang by setting it.
        """
        while True:
            hangs = [f for f in self.scenario.active_faults(self.clock.now(), "nvml_hang") if f.gpu == gpu]
            if not hangs:
                return
            self.clock.wait_until(max(math.inf if f.until is None else f.until for f in hangs), 1.0)

    def _target(self, handle: Any, family: str | None, mig_ok: bool) -> _Target:
        if not isinstance(handle, _DeviceHandle) or not 0 <= handle.gpu < len(self._gpus):
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._gpus[handle.gpu]
        if handle.mig is not None and not 0 <= handle.mig < len(gpu.mig):
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._hang(gpu.index)  # before reading the time: a call that returns late answers as of then
        t = self.clock.now()
        self._check_gpu(gpu.index, t, family)
        mig = gpu.mig[handle.mig] if handle.mig is not None else None
        if mig is not None and not mig_ok:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return _Target(gpu, mig, t)

    def _check_gpu(self, gpu: int, t: float, family: str | None) -> None:
        if any(f.gpu == gpu for f in self.scenario.active_faults(t, "gpu_lost")):
            raise _fail(pynvml.NVML_ERROR_GPU_IS_LOST)
        if family is not None and self._family_off(gpu, t, family):
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _family_off(self, gpu: int, t: float, family: str) -> bool:
        return any(f.params["family"] == family and f.gpu in (None, gpu)
                   for f in self.scenario.active_faults(t, "family_unsupported"))

    # -- the workload, per device --------------------------------------------------------------

    def _uuid(self, target: _Target) -> str:
        return target.mig.uuid if target.mig else target.gpu.uuid

    def _gpu_activity(self, gpu: Gpu, t: float) -> float:
        """How busy the physical GPU is (0-1): its own processes, or its MIG devices by compute share."""
        if not gpu.mig:
            return self._work.utilization(gpu.uuid, t)
        slices = self._profile.mig_compute_slices
        return sum(self._work.utilization(m.uuid, t) * m.compute_slices for m in gpu.mig) / slices

    def _power_mw(self, gpu: Gpu, t: float) -> float:
        return self._power_for(self._gpu_activity(gpu, t))

    def _power_for(self, activity: float) -> float:
        idle = self._profile.power_mw.idle
        return idle + (self._profile.power_limit_mw * 0.95 - idle) * activity

    def _power_fraction(self, gpu: Gpu, t: float) -> float:
        """Where the GPU's power sits between the recorded idle (0) and loaded (1) points."""
        rec = self._profile.power_mw
        return max(0.0, (self._power_mw(gpu, t) - rec.idle) / (rec.load - rec.idle))

    def _processes(self, target: _Target) -> tuple[_ProcLoad, ...]:
        if target.mig is None and target.gpu.mig:
            # A MIG-enabled parent reports the processes of all its instances (needs privileges on real NVML).
            return tuple(p for m in target.gpu.mig for p in self._work.processes(m.uuid, target.t))
        return self._work.processes(self._uuid(target), target.t)

    def _used_memory(self, target: _Target) -> int:
        procs = self._processes(target)
        if not procs:
            return 0
        instances = len({p.gi_id for p in procs}) if target.mig is None and target.gpu.mig else 1
        return sum(p.memory for p in procs) + self._profile.context_overhead * instances

    def _counter(self, gpu: Gpu, start: float, idle_rate: float, busy_rate: float, t: float) -> float:
        """A counter that grows by ``idle_rate`` per second plus ``busy_rate`` x utilisation."""
        return start * self._offsets[gpu.index] + idle_rate * t + busy_rate * self._activity[gpu.index](t)

    def _energy_mj(self, gpu: Gpu, t: float) -> float:
        idle = self._profile.power_mw.idle
        busy = self._profile.power_limit_mw * 0.95 - idle
        # mW x s = mJ
        return self._counter(gpu, self._profile.energy_start_mj, idle, busy, t)

    def _pcie_bytes(self, gpu: Gpu, t: float, direction: str) -> float:
        p = self._profile
        if direction == "tx":
            return self._counter(gpu, p.pcie_tx_start, p.pcie_tx_idle_rate, p.pcie_extra_rate_at_full_load, t)
        return self._counter(gpu, p.pcie_rx_start, p.pcie_rx_idle_rate, p.pcie_extra_rate_at_full_load, t)

    # -- lifecycle and system -----------------------------------------------------------------

    @_nvml(handle=False)
    def nvmlInit(self) -> None:
        failing = self.scenario.active_faults(self.clock.now(), "init_failure")
        if failing:
            raise _fail(_INIT_ERRORS[failing[0].params["error"]])
        with self._lock:
            self._init_count += 1

    @_nvml(handle=False)
    def nvmlShutdown(self) -> None:
        with self._lock:
            self._init_count -= 1

    @_nvml(handle=False)
    def nvmlSystemGetDriverVersion(self) -> str:
        return self._profile.driver_version

    @_nvml(handle=False)
    def nvmlSystemGetNVMLVersion(self) -> str:
        return self._profile.nvml_version

    # -- enumeration ---------------------------------------------------------------------------

    @_nvml(handle=False)
    def nvmlDeviceGetCount(self) -> int:
        return len(self._gpus)

    @_nvml(handle=False)
    def nvmlDeviceGetHandleByIndex(self, index: int) -> _DeviceHandle:
        if not isinstance(index, int) or not 0 <= index < len(self._gpus):
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._hang(index)
        self._check_gpu(index, self.clock.now(), None)
        return _DeviceHandle(index)

    @_nvml()
    def nvmlDeviceGetUUID(self, target: _Target) -> str:
        return self._uuid(target)

    @_nvml()
    def nvmlDeviceGetName(self, target: _Target) -> str:
        if target.mig:
            return f"{self._profile.model} MIG {target.mig.profile}"
        return self._profile.model

    @_nvml()
    def nvmlDeviceGetIndex(self, target: _Target) -> int:
        return target.gpu.index

    @_nvml()
    def nvmlDeviceGetMinorNumber(self, target: _Target) -> int:
        return target.gpu.minor

    @_nvml()
    def nvmlDeviceGetPciInfo_v3(self, target: _Target) -> pynvml.nvmlPciInfo_t:
        bus_id = target.gpu.pci_bus_id
        info = pynvml.nvmlPciInfo_t()
        info.busId = bus_id
        info.busIdLegacy = bus_id[4:]
        info.domain, info.bus, info.device = 0, int(bus_id[9:11], 16), 0
        info.pciDeviceId, info.pciSubSystemId = self._profile.pci_device_id, self._profile.pci_subsystem_id
        return info

    @_nvml(mig=False)
    def nvmlDeviceGetMigMode(self, target: _Target) -> list[int]:
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if target.gpu.mig else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    @_nvml()
    def nvmlDeviceGetMaxMigDeviceCount(self, target: _Target) -> int:
        if target.mig:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._profile.mig_max_devices if target.gpu.mig else 0

    @_nvml()
    def nvmlDeviceGetGpuInstanceProfileInfo(self, target: _Target, profile: int) -> Any:
        """A GPU-instance profile by NVML's index (``NVML_GPU_INSTANCE_PROFILE_<n>_SLICE``): the
        profile's slice count where the model has a profile of that many slices."""
        if target.mig or not target.gpu.mig:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        wanted = _PROFILE_SLICES.get(profile)
        match = next((p for p in self._profile.mig_profiles if p.compute_slices == wanted and "+" not in p.name),
                     None)
        if match is None:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = pynvml.c_nvmlGpuInstanceProfileInfo_t()
        info.id, info.sliceCount = match.gi_profile_id, match.compute_slices
        info.instanceCount = match.max_instances
        return info

    @_nvml()
    def nvmlDeviceGetMigDeviceHandleByIndex(self, target: _Target, index: int) -> _DeviceHandle:
        if target.mig or not target.gpu.mig or not 0 <= index < self._profile.mig_max_devices:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(target.gpu.mig):
            raise _fail(pynvml.NVML_ERROR_NOT_FOUND)
        return _DeviceHandle(target.gpu.index, index)

    @_nvml()
    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, target: _Target) -> _DeviceHandle:
        if target.mig is None:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _DeviceHandle(target.gpu.index)

    @_nvml()
    def nvmlDeviceGetGpuInstanceId(self, target: _Target) -> int:
        if target.mig is None:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return target.mig.gi_id

    @_nvml()
    def nvmlDeviceGetComputeInstanceId(self, target: _Target) -> int:
        if target.mig is None:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return target.mig.ci_id

    @_nvml()
    def nvmlDeviceGetGpuInstanceById(self, target: _Target, gi_id: int) -> _GpuInstanceHandle:
        if target.mig or not target.gpu.mig:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not any(m.gi_id == gi_id for m in target.gpu.mig):
            raise _fail(pynvml.NVML_ERROR_NOT_FOUND)
        return _GpuInstanceHandle(target.gpu.index, gi_id)

    @_nvml(handle=False)
    def nvmlGpuInstanceGetInfo(self, gi: _GpuInstanceHandle) -> pynvml.c_nvmlGpuInstanceInfo_t:
        if not isinstance(gi, _GpuInstanceHandle) or not 0 <= gi.gpu < len(self._gpus):
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._hang(gi.gpu)
        self._check_gpu(gi.gpu, self.clock.now(), None)
        mig = next(m for m in self._gpus[gi.gpu].mig if m.gi_id == gi.gi_id)
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.id, info.profileId = mig.gi_id, mig.gi_profile_id
        info.placement.start, info.placement.size = mig.placement_start, mig.placement_size
        return info

    # -- values ---------------------------------------------------------------------------------

    @_nvml("memory")
    def nvmlDeviceGetMemoryInfo(self, target: _Target, version: int | None = None) -> Any:
        if target.mig:
            total, reserved = target.mig.memory_total, target.mig.memory_reserved
        else:
            total, reserved = self._profile.memory_total, self._profile.memory_reserved
        used = self._used_memory(target)
        free = total - reserved - used
        if not version:
            # v1 counts the reserved memory as used, as real NVML does.
            mem = pynvml.c_nvmlMemory_t()
            mem.total, mem.free, mem.used = total, free, used + reserved
            return mem
        if version != pynvml.nvmlMemory_v2:
            raise _fail(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        mem2 = pynvml.c_nvmlMemory_v2_t()
        mem2.version, mem2.total, mem2.reserved, mem2.free, mem2.used = version, total, reserved, free, used
        return mem2

    @_nvml("utilization", mig=False)
    def nvmlDeviceGetUtilizationRates(self, target: _Target) -> pynvml.c_nvmlUtilization_t:
        if target.gpu.mig:
            # Utilisation rates are per instance in MIG mode; real NVML has none for the parent.
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        util = self._work.utilization(target.gpu.uuid, target.t)
        rates = pynvml.c_nvmlUtilization_t()
        rates.gpu = round(util * 100)
        rates.memory = round(self._profile.memory_util.at(util / self._profile.load_gpu_util))
        return rates

    @_nvml("utilization", mig=False)
    def nvmlDeviceGetEncoderUtilization(self, target: _Target) -> list[int]:
        return list(self._profile.encoder)

    @_nvml("utilization", mig=False)
    def nvmlDeviceGetDecoderUtilization(self, target: _Target) -> list[int]:
        return list(self._profile.decoder)

    @_nvml("power", mig=False)
    def nvmlDeviceGetPowerUsage(self, target: _Target) -> int:
        return round(self._power_mw(target.gpu, target.t))

    @_nvml("power", mig=False)
    def nvmlDeviceGetEnforcedPowerLimit(self, target: _Target) -> int:
        return self._profile.power_limit_mw

    @_nvml("temperature", mig=False)
    def nvmlDeviceGetTemperature(self, target: _Target, sensor: int) -> int:
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return round(self._profile.gpu_temperature.at(self._power_fraction(target.gpu, target.t)))

    @_nvml("clocks", mig=False)
    def nvmlDeviceGetClockInfo(self, target: _Target, clock_type: int) -> int:
        if clock_type not in _CLOCK_NAMES:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        spec = self._profile.clock(_CLOCK_NAMES[clock_type])
        activity = self._gpu_activity(target.gpu, target.t)
        if activity <= 0:
            return spec.idle
        return round(spec.max - (spec.max - spec.load) * self._cap_depth(activity))

    def _cap_depth(self, activity: float) -> float:
        """0 below the power-capping onset, 1 at the recorded loaded power, linear between."""
        limit, loaded = self._profile.power_limit_mw, self._profile.power_mw.load
        onset = limit * _POWER_CAP_ONSET
        return min(1.0, max(0.0, (self._power_for(activity) - onset) / (loaded - onset)))

    @_nvml("clock_events", mig=False)
    def nvmlDeviceGetCurrentClocksEventReasons(self, target: _Target) -> int:
        activity = self._gpu_activity(target.gpu, target.t)
        if activity <= 0:
            return self._profile.idle_clock_event_reasons
        return self._profile.load_clock_event_reasons if self._cap_depth(activity) > 0 else 0

    @_nvml("fields")
    def nvmlDeviceGetFieldValues(self, target: _Target, field_ids: Sequence[Any]) -> Any:
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        stamp = int(self.clock.epoch * 1e6 + target.t * 1e6)
        for value, requested in zip(values, field_ids, strict=True):
            field_id, scope = requested if isinstance(requested, tuple) else (requested, 0)
            value.fieldId, value.scopeId, value.timestamp = field_id, scope, stamp
            spec = self._field_specs.get(field_id)
            if self._links is not None and field_id in NVLINK_FIELD_IDS:
                self._nvlink_field(value, target, field_id, scope)
            elif spec is None:
                value.nvmlReturn = pynvml.NVML_ERROR_INVALID_ARGUMENT
            elif target.mig is not None or spec.ret != pynvml.NVML_SUCCESS:
                value.nvmlReturn = spec.ret or pynvml.NVML_ERROR_NOT_SUPPORTED
            else:
                value.valueType, value.nvmlReturn = spec.value_type, pynvml.NVML_SUCCESS
                number = self._field_value(target, spec.id, spec.idle)
                member = _VALUE_MEMBERS[spec.value_type]
                setattr(value.value, member, number if member == "dVal" else int(number))
        return values

    def _field_value(self, target: _Target, field_id: int, recorded: float) -> float:
        gpu, t = target.gpu, target.t
        if field_id in (pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, pynvml.NVML_FI_DEV_ENERGY):
            return self._energy_mj(gpu, t)
        if field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP:
            return round(self._profile.memory_temperature.at(self._power_fraction(gpu, t)))
        if field_id in (pynvml.NVML_FI_DEV_POWER_INSTANT, pynvml.NVML_FI_DEV_POWER_AVERAGE):
            return self._power_mw(gpu, t)
        if field_id == pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES:
            return self._pcie_bytes(gpu, t, "tx")
        if field_id == pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES:
            return self._pcie_bytes(gpu, t, "rx")
        # Everything else (ECC and PCIe error counts, limits, remapped rows) as recorded.
        return recorded

    # -- NVLink and the fabric (the model is fake_nvml_nvlink's) --------------------------------

    def _nvlink_field(self, value: Any, target: _Target, field_id: int, scope: int) -> None:
        assert self._links is not None
        if target.mig is not None:  # MIG devices own no links
            value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            return
        ret, value_type, number = self._links.field(target.gpu, field_id, scope, target.t)
        value.nvmlReturn, value.valueType = ret, value_type
        if ret == pynvml.NVML_SUCCESS:
            setattr(value.value, _VALUE_MEMBERS[value_type], int(number))

    def _link(self, link: int) -> Any:
        if self._links is None:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not isinstance(link, int) or not 0 <= link < self._links.spec.links:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._links

    @_nvml("nvlink", mig=False)
    def nvmlDeviceGetNvLinkState(self, target: _Target, link: int) -> int:
        up = self._link(link).link_up(target.gpu.index, link, target.t)
        return pynvml.NVML_FEATURE_ENABLED if up else pynvml.NVML_FEATURE_DISABLED

    @_nvml("nvlink", mig=False)
    def nvmlDeviceGetNvLinkVersion(self, target: _Target, link: int) -> int:
        return int(self._link(link).spec.version)

    @_nvml("nvlink", mig=False)
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, target: _Target, link: int) -> int:
        return int(self._link(link).spec.remote_type)

    @_nvml("fabric", mig=False)
    def nvmlDeviceGetGpuFabricInfoV(self, target: _Target, info: Any) -> int:
        info = getattr(info, "_obj", info)  # pynvml's callers pass ctypes.byref(struct)
        if int(getattr(info, "version", 0)) not in (pynvml.nvmlGpuFabricInfo_v2, pynvml.nvmlGpuFabricInfo_v3):
            raise _fail(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return self._fabric_info(target, info, with_health=True)

    @_nvml("fabric", mig=False)
    def nvmlDeviceGetGpuFabricInfo(self, target: _Target, info: Any) -> int:
        return self._fabric_info(target, getattr(info, "_obj", info), with_health=False)

    def _fabric_info(self, target: _Target, info: Any, *, with_health: bool) -> int:
        if self._links is None:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self._links.fill_fabric(info, target.gpu.index, target.t, with_health)
        return pynvml.NVML_SUCCESS

    # -- processes ------------------------------------------------------------------------------

    @_nvml("processes")
    def nvmlDeviceGetComputeRunningProcesses(self, target: _Target) -> list[pynvml.nvmlFriendlyObject]:
        return [pynvml.nvmlFriendlyObject({"pid": p.pid, "usedGpuMemory": p.memory, "gpuInstanceId": p.gi_id,
                                           "computeInstanceId": p.ci_id}) for p in self._processes(target)]

    @_nvml("processes")
    def nvmlDeviceGetGraphicsRunningProcesses(self, target: _Target) -> list[pynvml.nvmlFriendlyObject]:
        return []

    @_nvml("processes")
    def nvmlDeviceGetProcessUtilization(self, target: _Target, last_seen_us: int) -> list[Any]:
        if target.mig is None and target.gpu.mig:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        procs = self._processes(target)
        newest = math.floor(target.t / _PROC_SAMPLE_PERIOD) * _PROC_SAMPLE_PERIOD
        stamp = int((self.clock.epoch + newest) * 1e6)
        if not procs or stamp <= last_seen_us:
            raise _fail(pynvml.NVML_ERROR_NOT_FOUND)
        out = []
        for p in procs:
            sample = pynvml.c_nvmlProcessUtilizationSample_t()
            sample.pid, sample.timeStamp = p.pid, stamp
            sample.smUtil = round(p.share * 100)
            sample.memUtil = round(p.share * 100 * self._profile.process_mem_util_per_sm_util)
            out.append(sample)
        return out

    # -- GPM ------------------------------------------------------------------------------------

    @_nvml()
    def nvmlGpmQueryDeviceSupport(self, target: _Target) -> pynvml.c_nvmlGpmSupport_t:
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        on = self._profile.gpm_supported and not self._family_off(target.gpu.index, target.t, "gpm")
        support.isSupportedDevice = int(on)
        return support

    @_nvml(handle=False)
    def nvmlGpmSampleAlloc(self) -> Any:
        buffer = ctypes.create_string_buffer(8)
        sample = ctypes.cast(buffer, pynvml.c_nvmlGpmSample_t)
        with self._lock:
            self._gpm_samples[ctypes.addressof(buffer)] = (buffer, None)
        return sample

    @_nvml(handle=False)
    def nvmlGpmSampleFree(self, sample: Any) -> None:
        with self._lock:
            if self._gpm_samples.pop(_address(sample), None) is None:
                raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    @_nvml("gpm", mig=False)
    def nvmlGpmSampleGet(self, target: _Target, sample: Any) -> Any:
        self._gpm_check()
        self._gpm_store(sample, _GpmSnapshot(target.gpu.index, None, target.t,
                                             self._activity[target.gpu.index](target.t)))
        return sample

    @_nvml("gpm", mig=False)
    def nvmlGpmMigSampleGet(self, target: _Target, gi_id: int, sample: Any) -> Any:
        self._gpm_check()
        mig = next((m for m in target.gpu.mig if m.gi_id == gi_id), None)
        if mig is None:
            raise _fail(pynvml.NVML_ERROR_NOT_FOUND if target.gpu.mig else pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._gpm_store(sample, _GpmSnapshot(target.gpu.index, gi_id, target.t,
                                             self._mig_activity[mig.uuid](target.t)))
        return sample

    def _gpm_check(self) -> None:
        if not self._profile.gpm_supported:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _gpm_store(self, sample: Any, snap: _GpmSnapshot) -> None:
        with self._lock:
            key = _address(sample)
            if key not in self._gpm_samples:
                raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            self._gpm_samples[key] = (self._gpm_samples[key][0], snap)

    @_nvml(handle=False)
    def nvmlGpmMetricsGet(self, metrics_get: pynvml.c_nvmlGpmMetricsGet_t) -> pynvml.c_nvmlGpmMetricsGet_t:
        if metrics_get.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise _fail(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if not 0 <= metrics_get.numMetrics <= pynvml.NVML_GPM_METRIC_MAX:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        with self._lock:
            first = self._gpm_samples.get(_address(metrics_get.sample1), (None, None))[1]
            second = self._gpm_samples.get(_address(metrics_get.sample2), (None, None))[1]
        if first is None or second is None or (first.gpu, first.gi_id) != (second.gpu, second.gi_id):
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        activity = self._gpm_activity(first, second)
        for i in range(metrics_get.numMetrics):
            metric = metrics_get.metrics[i]
            if metric.metricId in _NVLINK_GPM and self._links is not None:
                metric.nvmlReturn = pynvml.NVML_SUCCESS
                metric.value = self._gpm_nvlink(first, second, _NVLINK_GPM[metric.metricId])
                continue
            spec = self._gpm_specs.get(metric.metricId)
            if spec is None or spec.ret != pynvml.NVML_SUCCESS:
                metric.nvmlReturn = spec.ret if spec else pynvml.NVML_ERROR_INVALID_ARGUMENT
                metric.value = 0.0
                continue
            metric.nvmlReturn = pynvml.NVML_SUCCESS
            metric.value = self._gpm_value(spec.id, spec.idle, spec.load, activity)
        return metrics_get

    def _gpm_activity(self, first: _GpmSnapshot, second: _GpmSnapshot) -> float:
        """Mean utilisation between two samples; the instantaneous one if no time passed."""
        if second.t > first.t:
            return (second.activity_integral - first.activity_integral) / (second.t - first.t)
        gpu = self._gpus[second.gpu]
        if second.gi_id is None:
            return self._gpu_activity(gpu, second.t)
        mig = next(m for m in gpu.mig if m.gi_id == second.gi_id)
        return self._work.utilization(mig.uuid, second.t)

    def _gpm_nvlink(self, first: _GpmSnapshot, second: _GpmSnapshot, direction: str) -> float:
        """MiB/s over the links between two samples: the link counters' growth; a GPU instance gets the part
        of it its share of the GPU's work moved."""
        assert self._links is not None
        if second.t <= first.t:
            return 0.0
        gpu = self._gpus[second.gpu]
        moved = sum(self._links.link_bytes(gpu, link, direction, second.t)
                    - self._links.link_bytes(gpu, link, direction, first.t) for link in range(self._links.spec.links))
        if second.gi_id is not None:
            mig = next(m for m in gpu.mig if m.gi_id == second.gi_id)
            whole = self._activity[gpu.index](second.t) - self._activity[gpu.index](first.t)
            own = (second.activity_integral - first.activity_integral) * mig.compute_slices \
                / self._profile.mig_compute_slices
            moved *= own / whole if whole > 0 else 0.0
        return max(0.0, moved) / (second.t - first.t) / _MIB

    def _gpm_value(self, metric_id: int, idle: float, load: float, activity: float) -> float:
        if metric_id in _PCIE_GPM:
            p = self._profile
            idle_rate = p.pcie_tx_idle_rate if _PCIE_GPM[metric_id] == "tx" else p.pcie_rx_idle_rate
            return (idle_rate + p.pcie_extra_rate_at_full_load * activity) / _MIB
        return max(0.0, idle + (load - idle) * activity / self._profile.load_gpu_util)

    # -- events ---------------------------------------------------------------------------------

    def _xid_events(self) -> tuple[_Xid, ...]:
        events = []
        for fault in self.scenario.faults:
            if fault.kind == "gpu_lost" and fault.gpu is not None:
                events.append(_Xid(fault.at, fault.gpu, _XID_GPU_FALLEN_OFF_BUS, _NO_INSTANCE, _NO_INSTANCE))
            elif fault.kind == "xid" and fault.gpu is not None:
                gi = ci = _NO_INSTANCE
                if "mig_device" in fault.params:
                    found = self.scenario.find_mig(self.scenario.nvml_uuid(fault.params["mig_device"]) or "")
                    assert found is not None, "validated when the scenario was loaded"
                    gi, ci = found[1].gi_id, found[1].ci_id
                events.append(_Xid(fault.at, fault.gpu, fault.params["xid"], gi, ci))
        return tuple(sorted(events, key=lambda e: (e.at, e.gpu)))

    @_nvml(handle=False)
    def nvmlEventSetCreate(self) -> _EventSet:
        return _EventSet()

    @_nvml("events", mig=False)
    def nvmlDeviceGetSupportedEventTypes(self, target: _Target) -> int:
        return self._profile.supported_event_types

    @_nvml("events", mig=False)
    def nvmlDeviceRegisterEvents(self, target: _Target, mask: int, event_set: _EventSet) -> None:
        if not isinstance(event_set, _EventSet) or event_set.freed:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if mask & ~self._profile.supported_event_types:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            index = target.gpu.index
            event_set.masks[index] = event_set.masks.get(index, 0) | mask
            event_set.registered_at.setdefault(index, target.t)

    @_nvml(handle=False)
    def nvmlEventSetWait_v2(self, event_set: _EventSet, timeout_ms: int) -> EventData:
        if not isinstance(event_set, _EventSet) or event_set.freed:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        deadline = time.monotonic() + max(0, timeout_ms) / 1000
        while True:
            taken = self._take_event(event_set)
            if isinstance(taken, EventData):
                return taken
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _fail(pynvml.NVML_ERROR_TIMEOUT)
            # Sleep until the next event is due, the clock is moved, or the timeout ends.
            self.clock.wait_until(math.inf if taken is None else taken, remaining)

    def _take_event(self, event_set: _EventSet) -> EventData | float | None:
        """Deliver the earliest due event; else say when the next one is due (None: never)."""
        now = self.clock.now()
        with self._lock:
            for i, event in enumerate(self._xids):  # sorted by time
                registered = event_set.registered_at.get(event.gpu)
                if (i in event_set.delivered or registered is None or event.at < registered
                        or not event_set.masks[event.gpu] & pynvml.nvmlEventTypeXidCriticalError):
                    continue
                if event.at > now:
                    return event.at
                event_set.delivered.add(i)
                return EventData(_DeviceHandle(event.gpu), pynvml.nvmlEventTypeXidCriticalError, event.xid,
                                 event.gi_id, event.ci_id)
        return None

    @_nvml(handle=False)
    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        if not isinstance(event_set, _EventSet) or event_set.freed:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        event_set.freed = True


def _address(sample: Any) -> int:
    return ctypes.cast(sample, ctypes.c_void_p).value or 0


def _reexport(names: Iterable[str]) -> None:
    """Make pynvml's constants, error classes and structs attributes of FakeNvml."""
    for name in names:
        value = getattr(pynvml, name)
        if hasattr(FakeNvml, name):
            continue
        is_constant = isinstance(value, int) and name.startswith(("NVML_", "nvml"))
        is_type = isinstance(value, type) and name.startswith(
            ("NVMLError", "c_nvml", "nvmlPciInfo", "nvmlFriendly"))
        if is_constant or is_type:
            setattr(FakeNvml, name, value)


_reexport(dir(pynvml))
