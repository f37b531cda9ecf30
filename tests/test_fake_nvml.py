"""The fake NVML: pynvml's surface, realistic values, faults, events and call counting."""

from __future__ import annotations

import copy
import importlib.util
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest
from nvml_replay import FIXTURES

import dra_exporter_sim as sim
from dra_exporter_sim import load_scenario
from dra_exporter_sim.clock import FIXED_EPOCH, SimClock
from dra_exporter_sim.fake_nvml import FakeNvml
from dra_exporter_sim.scenario import Scenario
from dra_exporter_sim.scenario_builder import parse_scenario

GIB = 1 << 30


@pytest.fixture(scope="module")
def demo() -> Scenario:
    return load_scenario("demo")


@pytest.fixture
def clock() -> SimClock:
    return SimClock(10.0, frozen=True)


@pytest.fixture
def nvml(demo: Scenario, clock: SimClock) -> Iterator[FakeNvml]:
    fake = FakeNvml(demo, clock)
    fake.nvmlInit()
    yield fake
    fake.nvmlShutdown()


def code(fn: Any, *args: Any) -> int | None:
    """The NVML error code ``fn(*args)`` raises, None if it succeeds."""
    try:
        fn(*args)
    except pynvml.NVMLError as e:
        return int(e.value)
    return None


def handles(nvml: FakeNvml) -> list[Any]:
    return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]


def mig_handles(nvml: FakeNvml, gpu: Any) -> list[Any]:
    out = []
    for i in range(nvml.nvmlDeviceGetMaxMigDeviceCount(gpu)):
        try:
            out.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, i))
        except pynvml.NVMLError as e:
            assert e.value == pynvml.NVML_ERROR_NOT_FOUND
    return out


# --- identity and enumeration ------------------------------------------------------------------


def test_system_identity_matches_the_recorded_h200(nvml: FakeNvml) -> None:
    assert nvml.nvmlSystemGetDriverVersion() == "580.159.04"
    assert nvml.nvmlSystemGetNVMLVersion() == "13.580.159.04"
    gpu = handles(nvml)[7]
    assert nvml.nvmlDeviceGetName(gpu) == "NVIDIA H200"
    mem = nvml.nvmlDeviceGetMemoryInfo(gpu, version=nvml.nvmlMemory_v2)
    assert isinstance(mem, pynvml.c_nvmlMemory_v2_t)
    assert (mem.total, mem.reserved) == (150754820096, 644939776)
    assert nvml.nvmlDeviceGetEnforcedPowerLimit(gpu) == 700000
    assert 70_000 <= nvml.nvmlDeviceGetPowerUsage(gpu) <= 80_000  # idle


def test_enumerates_eight_gpus_with_distinct_identities(nvml: FakeNvml, demo: Scenario) -> None:
    gpus = handles(nvml)
    assert len(gpus) == 8
    uuids = [nvml.nvmlDeviceGetUUID(h) for h in gpus]
    assert uuids == [g.uuid for g in demo.gpus]
    assert [nvml.nvmlDeviceGetIndex(h) for h in gpus] == list(range(8))
    assert [nvml.nvmlDeviceGetMinorNumber(h) for h in gpus] == list(range(8))
    bus_ids = [nvml.nvmlDeviceGetPciInfo_v3(h).busId for h in gpus]
    assert len(set(bus_ids)) == 8
    assert all(b.startswith("00000000:") and b.endswith(":00.0") and len(b) == 16 for b in bus_ids)
    assert [nvml.nvmlDeviceGetMigMode(h) for h in gpus] == [[0, 0]] * 4 + [[1, 1]] * 2 + [[0, 0]] * 2
    assert code(nvml.nvmlDeviceGetHandleByIndex, 8) == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_mig_devices_have_the_scenario_profiles_and_placements(nvml: FakeNvml) -> None:
    gpus = handles(nvml)
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(gpus[0]) == 0
    layout = {}
    for index in (4, 5):
        parent = gpus[index]
        assert nvml.nvmlDeviceGetMaxMigDeviceCount(parent) == 7
        rows = []
        for mig in mig_handles(nvml, parent):
            assert nvml.nvmlDeviceGetUUID(mig).startswith("MIG-")
            assert nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig) == parent
            gi_id = nvml.nvmlDeviceGetGpuInstanceId(mig)
            assert nvml.nvmlDeviceGetComputeInstanceId(mig) == 0
            info = nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceGetGpuInstanceById(parent, gi_id))
            name = nvml.nvmlDeviceGetName(mig)
            rows.append((name.removeprefix("NVIDIA H200 MIG "), info.profileId, info.placement.start,
                         info.placement.size))
            assert name.startswith("NVIDIA H200 MIG ")
        layout[index] = rows
    assert layout[4] == [("3g.71gb", 9, 0, 4), ("3g.71gb", 9, 4, 4)]
    assert layout[5] == [("1g.18gb", 19, s, 1) for s in range(7)]
    assert code(nvml.nvmlDeviceGetMigDeviceHandleByIndex, gpus[4], 2) == pynvml.NVML_ERROR_NOT_FOUND
    assert code(nvml.nvmlDeviceGetGpuInstanceId, gpus[4]) == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_mig_memory_is_proportional_to_slices(nvml: FakeNvml) -> None:
    gpus = handles(nvml)
    big = nvml.nvmlDeviceGetMemoryInfo(mig_handles(nvml, gpus[4])[0], version=nvml.nvmlMemory_v2)
    small = nvml.nvmlDeviceGetMemoryInfo(mig_handles(nvml, gpus[5])[0], version=nvml.nvmlMemory_v2)
    assert big.total == 4 * small.total
    assert small.total == 150754820096 // 8


# --- values follow the processes ---------------------------------------------------------------


def _procs(nvml: FakeNvml, h: Any) -> dict[int, int]:
    return {p.pid: p.usedGpuMemory for p in nvml.nvmlDeviceGetComputeRunningProcesses(h)}


def test_device_memory_and_utilization_agree_with_processes(nvml: FakeNvml, demo: Scenario) -> None:
    overhead = demo.profile.context_overhead
    whole = [handles(nvml)[i] for i in (0, 3, 6, 7)]
    for h in whole + mig_handles(nvml, handles(nvml)[5]):
        procs = _procs(nvml, h)
        mem = nvml.nvmlDeviceGetMemoryInfo(h, version=nvml.nvmlMemory_v2)
        assert mem.used == (sum(procs.values()) + overhead if procs else 0)
        assert mem.free == mem.total - mem.reserved - mem.used
        samples = nvml.nvmlDeviceGetProcessUtilization(h, 0) if procs else []
        assert {s.pid for s in samples} == set(procs)
        if h in whole:
            util = nvml.nvmlDeviceGetUtilizationRates(h).gpu
            assert abs(util - sum(s.smUtil for s in samples)) <= max(1, len(samples))
            assert (util > 0) == bool(procs)


def test_shared_gpu_reports_both_notebooks(nvml: FakeNvml, demo: Scenario) -> None:
    pids = {p.name: p.containers[0].processes[0].pid for p in demo.pods if p.namespace == "research"}
    gpu6 = handles(nvml)[6]
    procs = _procs(nvml, gpu6)
    assert procs == {pids["notebook-alice"]: 30 * GIB, pids["notebook-bob"]: 12 * GIB}
    procs_util = {s.pid: s.smUtil for s in nvml.nvmlDeviceGetProcessUtilization(gpu6, 0)}
    assert procs_util[pids["notebook-alice"]] > procs_util[pids["notebook-bob"]]


def test_whole_gpu_processes_carry_no_instance_ids_and_mig_ones_do(nvml: FakeNvml) -> None:
    (p,) = nvml.nvmlDeviceGetComputeRunningProcesses(handles(nvml)[0])
    assert (p.gpuInstanceId, p.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)
    mig = mig_handles(nvml, handles(nvml)[4])[0]
    (q,) = nvml.nvmlDeviceGetComputeRunningProcesses(mig)
    assert q.gpuInstanceId == nvml.nvmlDeviceGetGpuInstanceId(mig)
    assert nvml.nvmlDeviceGetGraphicsRunningProcesses(handles(nvml)[0]) == []


def test_busy_gpu_draws_more_power_runs_hotter_and_is_power_capped(nvml: FakeNvml) -> None:
    busy, shared, idle = (handles(nvml)[i] for i in (0, 6, 7))
    power = [nvml.nvmlDeviceGetPowerUsage(h) for h in (busy, shared, idle)]
    temp = [nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU) for h in (busy, shared, idle)]
    assert power[0] > power[1] > power[2] and temp[0] > temp[1] >= temp[2]
    assert power[0] <= 700_000 * 0.95
    assert nvml.nvmlDeviceGetUtilizationRates(idle).gpu == 0
    assert nvml.nvmlDeviceGetClockInfo(idle, nvml.NVML_CLOCK_SM) == 885
    assert nvml.nvmlDeviceGetCurrentClocksEventReasons(idle) == nvml.nvmlClocksEventReasonGpuIdle
    assert nvml.nvmlDeviceGetClockInfo(busy, nvml.NVML_CLOCK_SM) < 1980
    assert nvml.nvmlDeviceGetCurrentClocksEventReasons(busy) == nvml.nvmlClocksEventReasonSwPowerCap
    assert nvml.nvmlDeviceGetClockInfo(busy, nvml.NVML_CLOCK_MEM) == 3201


def test_processes_follow_pod_lifetimes(nvml: FakeNvml, demo: Scenario, clock: SimClock) -> None:
    job = next(p for p in demo.pods if p.name == "tokenize-job-7")
    pid = job.containers[0].processes[0].pid
    slot = mig_handles(nvml, handles(nvml)[5])[3]
    clock.set(899.5)
    assert pid in _procs(nvml, slot)
    assert nvml.nvmlDeviceGetMemoryInfo(slot, version=nvml.nvmlMemory_v2).used > 4 * GIB
    clock.set(900)
    assert _procs(nvml, slot) == {}
    assert nvml.nvmlDeviceGetMemoryInfo(slot, version=nvml.nvmlMemory_v2).used == 0
    assert code(nvml.nvmlDeviceGetProcessUtilization, slot, 0) == pynvml.NVML_ERROR_NOT_FOUND


def test_process_utilization_only_returns_newer_samples(nvml: FakeNvml, clock: SimClock) -> None:
    gpu = handles(nvml)[0]
    (sample,) = nvml.nvmlDeviceGetProcessUtilization(gpu, 0)
    assert code(nvml.nvmlDeviceGetProcessUtilization, gpu, sample.timeStamp) == pynvml.NVML_ERROR_NOT_FOUND
    clock.advance(1)
    (later,) = nvml.nvmlDeviceGetProcessUtilization(gpu, sample.timeStamp)
    assert later.timeStamp > sample.timeStamp


def _field(nvml: FakeNvml, h: Any, field_id: int) -> int:
    (v,) = nvml.nvmlDeviceGetFieldValues(h, [field_id])
    assert v.nvmlReturn == pynvml.NVML_SUCCESS
    return v.value.ullVal if v.valueType == nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG else v.value.uiVal


def test_energy_grows_with_time_and_faster_when_busy(nvml: FakeNvml, clock: SimClock) -> None:
    energy = nvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION
    busy, idle = handles(nvml)[0], handles(nvml)[7]
    before = _field(nvml, busy, energy), _field(nvml, idle, energy)
    clock.advance(100)
    grown = _field(nvml, busy, energy) - before[0], _field(nvml, idle, energy) - before[1]
    assert grown[1] == pytest.approx(77.88 * 100 * 1000, rel=0.01)  # mJ at the recorded idle power
    assert grown[0] > 7 * grown[1]  # ~630 W against ~78 W


def test_pcie_counters_are_32_bit_and_grow_with_utilization(nvml: FakeNvml, clock: SimClock) -> None:
    # The recorded H200 reports these fields as unsigned int: they wrap at 2**32 bytes.
    tx = nvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES
    (value,) = nvml.nvmlDeviceGetFieldValues(handles(nvml)[0], [tx])
    assert value.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    busy, idle = handles(nvml)[0], handles(nvml)[7]
    before = _field(nvml, busy, tx), _field(nvml, idle, tx)
    clock.advance(1)
    grown = [(_field(nvml, busy, tx) - before[0]) % 2**32, (_field(nvml, idle, tx) - before[1]) % 2**32]
    assert 0 < grown[1] < grown[0]


def test_energy_is_a_pure_monotone_function_of_time(demo: Scenario) -> None:
    def energy_at(fake: FakeNvml, clock: SimClock, t: float) -> int:
        clock.set(t)
        (v,) = fake.nvmlDeviceGetFieldValues(fake.nvmlDeviceGetHandleByIndex(6),
                                             [fake.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION])
        return v.value.ullVal

    c1, c2 = SimClock(frozen=True), SimClock(frozen=True)
    f1, f2 = FakeNvml(demo, c1), FakeNvml(demo, c2)
    f1.nvmlInit()
    f2.nvmlInit()
    times = [0.0, 0.4, 1.0, 1.7, 2.5, 30.2, 599.5, 600.0, 1234.5]
    forward = [energy_at(f1, c1, t) for t in times]
    backward = [energy_at(f2, c2, t) for t in reversed(times)][::-1]
    assert forward == backward
    assert forward == sorted(forward) and len(set(forward)) == len(forward)


# --- MIG and families real NVML does not support -----------------------------------------------


@pytest.mark.parametrize("call", [
    lambda n, h: n.nvmlDeviceGetUtilizationRates(h),
    lambda n, h: n.nvmlDeviceGetEncoderUtilization(h),
    lambda n, h: n.nvmlDeviceGetPowerUsage(h),
    lambda n, h: n.nvmlDeviceGetEnforcedPowerLimit(h),
    lambda n, h: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
    lambda n, h: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
    lambda n, h: n.nvmlDeviceGetCurrentClocksEventReasons(h),
], ids=["utilization", "encoder", "power", "power-limit", "temperature", "clocks", "clock-events"])
def test_mig_devices_do_not_support_whole_gpu_families(nvml: FakeNvml, call: Any) -> None:
    mig = mig_handles(nvml, handles(nvml)[5])[0]
    assert code(call, nvml, mig) == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_mig_parent_still_reports_power_but_not_utilization(nvml: FakeNvml) -> None:
    parent, idle = handles(nvml)[4], handles(nvml)[7]
    assert nvml.nvmlDeviceGetPowerUsage(parent) > nvml.nvmlDeviceGetPowerUsage(idle)
    assert nvml.nvmlDeviceGetTemperature(parent, nvml.NVML_TEMPERATURE_GPU) > 0
    assert code(nvml.nvmlDeviceGetUtilizationRates, parent) == pynvml.NVML_ERROR_NOT_SUPPORTED
    mig = mig_handles(nvml, parent)[0]
    assert nvml.nvmlDeviceGetMemoryInfo(mig, version=nvml.nvmlMemory_v2).used > 60 * GIB
    # fields answer per field on MIG devices: the call works, each field is unsupported
    (value,) = nvml.nvmlDeviceGetFieldValues(mig, [nvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION])
    assert value.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


# --- field values and GPM through the real ctypes structs ---------------------------------------


def test_field_values_are_real_structs_with_recorded_support(nvml: FakeNvml, demo: Scenario) -> None:
    unsupported = next(f.id for f in demo.profile.fields if f.ret == pynvml.NVML_ERROR_NOT_SUPPORTED)
    ids = [nvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, nvml.NVML_FI_DEV_MEMORY_TEMP,
           nvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL, nvml.NVML_FI_DEV_REMAPPED_PENDING, unsupported]
    values = nvml.nvmlDeviceGetFieldValues(handles(nvml)[0], ids)
    assert all(isinstance(v, pynvml.c_nvmlFieldValue_t) for v in values)
    assert [v.fieldId for v in values] == ids
    energy, mem_temp, dbe, pending, unsup = values
    assert energy.nvmlReturn == pynvml.NVML_SUCCESS
    assert energy.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG and energy.value.ullVal > 30_000_000
    assert mem_temp.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT and 39 <= mem_temp.value.uiVal <= 48
    assert (dbe.nvmlReturn, dbe.value.ullVal, pending.nvmlReturn) == (0, 0, 0)
    assert unsup.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


def _gpm(nvml: FakeNvml, clock: SimClock, sample_get: Any, metric_ids: list[int]) -> dict[int, tuple[int, float]]:
    s1, s2 = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
    sample_get(s1)
    clock.advance(5)
    sample_get(s2)
    mg = pynvml.c_nvmlGpmMetricsGet_t()
    mg.version = nvml.NVML_GPM_METRICS_GET_VERSION
    mg.numMetrics = len(metric_ids)
    mg.sample1, mg.sample2 = s1, s2
    for i, metric in enumerate(metric_ids):
        mg.metrics[i].metricId = metric
    out = nvml.nvmlGpmMetricsGet(mg)
    nvml.nvmlGpmSampleFree(s1)
    nvml.nvmlGpmSampleFree(s2)
    return {out.metrics[i].metricId: (out.metrics[i].nvmlReturn, out.metrics[i].value)
            for i in range(len(metric_ids))}


def test_gpm_metrics_follow_utilization(nvml: FakeNvml, clock: SimClock) -> None:
    ids = [nvml.NVML_GPM_METRIC_SM_UTIL, nvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, nvml.NVML_GPM_METRIC_SM_OCCUPANCY,
           nvml.NVML_GPM_METRIC_DRAM_BW_UTIL, nvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC]
    gpu0, gpu7 = handles(nvml)[0], handles(nvml)[7]
    assert nvml.nvmlGpmQueryDeviceSupport(gpu0).isSupportedDevice == 1
    busy = _gpm(nvml, clock, lambda s: nvml.nvmlGpmSampleGet(gpu0, s), ids)
    idle = _gpm(nvml, clock, lambda s: nvml.nvmlGpmSampleGet(gpu7, s), ids)
    assert all(ret == pynvml.NVML_SUCCESS for ret, _ in busy.values())
    sm, tensor = busy[nvml.NVML_GPM_METRIC_SM_UTIL][1], busy[nvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL][1]
    assert 80 <= sm <= 100 and 0 < tensor < sm
    assert idle[nvml.NVML_GPM_METRIC_SM_UTIL][1] == 0


def test_gpm_per_mig_instance(nvml: FakeNvml, clock: SimClock) -> None:
    parent = handles(nvml)[5]
    migs = mig_handles(nvml, parent)
    sm = nvml.NVML_GPM_METRIC_SM_UTIL
    values = []
    for mig in (migs[0], migs[2], migs[6]):  # embed-0 (busy), embed-2 (light), unallocated
        gi = nvml.nvmlDeviceGetGpuInstanceId(mig)
        values.append(_gpm(nvml, clock, lambda s, gi=gi: nvml.nvmlGpmMigSampleGet(parent, gi, s), [sm])[sm][1])
    assert values[0] > values[1] > values[2] == 0
    assert code(nvml.nvmlGpmSampleGet, migs[0], nvml.nvmlGpmSampleAlloc()) == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert code(nvml.nvmlGpmMigSampleGet, parent, 99, nvml.nvmlGpmSampleAlloc()) == pynvml.NVML_ERROR_NOT_FOUND


# --- faults ----------------------------------------------------------------------------------------

SMALL: dict[str, Any] = {
    "node": "n1",
    "gpus": [{"index": 0}, {"index": 1, "mig": [{"profile": "7g.141gb", "placement_start": 0}]}],
    "claims": [{"namespace": "a", "name": "c", "devices": ["gpu-0"]}],
    "pods": [{"namespace": "a", "name": "p", "containers": [
        {"name": "c", "claims": ["c"], "processes": [{"device": "gpu-0", "memory": "1Gi", "sm": 0.5}]}]}],
}


def fake_with(faults: list[dict[str, Any]], t: float = 0.0) -> tuple[FakeNvml, SimClock]:
    doc = copy.deepcopy(SMALL)
    doc["faults"] = faults
    clock = SimClock(t, frozen=True)
    return FakeNvml(parse_scenario(doc), clock), clock


def test_gpu_lost_fails_every_call_on_that_gpu_from_its_time() -> None:
    fake, clock = fake_with([{"kind": "gpu_lost", "gpu": 1, "at": 50}])
    fake.nvmlInit()
    gpu1 = fake.nvmlDeviceGetHandleByIndex(1)
    mig = fake.nvmlDeviceGetMigDeviceHandleByIndex(gpu1, 0)
    assert fake.nvmlDeviceGetPowerUsage(gpu1) > 0
    clock.set(50)
    lost = pynvml.NVML_ERROR_GPU_IS_LOST
    for call in (fake.nvmlDeviceGetPowerUsage, fake.nvmlDeviceGetUUID, fake.nvmlDeviceGetMemoryInfo,
                 fake.nvmlDeviceGetComputeRunningProcesses):
        assert code(call, gpu1) == lost
        assert code(call, mig) == lost
    assert code(fake.nvmlDeviceGetHandleByIndex, 1) == lost
    gpu0 = fake.nvmlDeviceGetHandleByIndex(0)
    assert fake.nvmlDeviceGetPowerUsage(gpu0) > 0
    assert fake.nvmlDeviceGetCount() == 2


def test_family_unsupported_for_a_window() -> None:
    fake, clock = fake_with([{"kind": "family_unsupported", "family": "power", "at": 10, "until": 20},
                             {"kind": "family_unsupported", "family": "processes", "gpu": 0, "at": 10}])
    fake.nvmlInit()
    gpu0, gpu1 = fake.nvmlDeviceGetHandleByIndex(0), fake.nvmlDeviceGetHandleByIndex(1)
    clock.set(10)
    unsupported = pynvml.NVML_ERROR_NOT_SUPPORTED
    assert code(fake.nvmlDeviceGetPowerUsage, gpu0) == code(fake.nvmlDeviceGetPowerUsage, gpu1) == unsupported
    assert code(fake.nvmlDeviceGetComputeRunningProcesses, gpu0) == unsupported
    assert code(fake.nvmlDeviceGetComputeRunningProcesses, gpu1) is None
    assert fake.nvmlDeviceGetTemperature(gpu0, fake.NVML_TEMPERATURE_GPU) > 0
    clock.set(20)
    assert code(fake.nvmlDeviceGetPowerUsage, gpu0) is None
    assert code(fake.nvmlDeviceGetComputeRunningProcesses, gpu0) == unsupported


def test_gpm_family_off_reports_no_gpm_support() -> None:
    fake, _ = fake_with([{"kind": "family_unsupported", "family": "gpm", "at": 0}])
    fake.nvmlInit()
    gpu0 = fake.nvmlDeviceGetHandleByIndex(0)
    assert fake.nvmlGpmQueryDeviceSupport(gpu0).isSupportedDevice == 0
    assert code(fake.nvmlGpmSampleGet, gpu0, fake.nvmlGpmSampleAlloc()) == pynvml.NVML_ERROR_NOT_SUPPORTED


@pytest.mark.parametrize(("error", "expected"), [
    (None, pynvml.NVML_ERROR_DRIVER_NOT_LOADED),
    ("library_not_found", pynvml.NVML_ERROR_LIBRARY_NOT_FOUND),
])
def test_init_failure_until_its_end(error: str | None, expected: int) -> None:
    fault: dict[str, Any] = {"kind": "init_failure", "at": 0, "until": 20}
    if error:
        fault["error"] = error
    fake, clock = fake_with([fault], t=5)
    assert code(fake.nvmlInit) == expected
    assert code(fake.nvmlDeviceGetCount) == pynvml.NVML_ERROR_UNINITIALIZED
    clock.set(20)
    fake.nvmlInit()
    assert fake.nvmlDeviceGetCount() == 2
    fake.nvmlShutdown()
    assert code(fake.nvmlDeviceGetCount) == pynvml.NVML_ERROR_UNINITIALIZED


def _events(fake: FakeNvml, gpus: list[int]) -> Any:
    event_set = fake.nvmlEventSetCreate()
    mask = fake.nvmlEventTypeXidCriticalError | fake.nvmlEventTypeDoubleBitEccError
    for i in gpus:
        h = fake.nvmlDeviceGetHandleByIndex(i)
        assert fake.nvmlDeviceGetSupportedEventTypes(h) & mask == mask
        fake.nvmlDeviceRegisterEvents(h, mask, event_set)
    return event_set


def test_xid_event_is_delivered_once_when_due() -> None:
    fake, clock = fake_with([{"kind": "xid", "gpu": 0, "xid": 13, "at": 30},
                             {"kind": "xid", "gpu": 1, "xid": 31, "at": 40, "mig_device": "gpu-1-mig-7g141gb-0-0"}])
    fake.nvmlInit()
    event_set = _events(fake, [0, 1])
    assert code(fake.nvmlEventSetWait_v2, event_set, 0) == pynvml.NVML_ERROR_TIMEOUT
    clock.set(35)
    event = fake.nvmlEventSetWait_v2(event_set, 1000)
    assert event.device == fake.nvmlDeviceGetHandleByIndex(0)
    assert (event.eventType, event.eventData) == (fake.nvmlEventTypeXidCriticalError, 13)
    assert (event.gpuInstanceId, event.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)
    assert code(fake.nvmlEventSetWait_v2, event_set, 10) == pynvml.NVML_ERROR_TIMEOUT
    clock.set(40)
    mig_event = fake.nvmlEventSetWait_v2(event_set, 1000)
    assert (mig_event.eventData, mig_event.gpuInstanceId, mig_event.computeInstanceId) == (31, 0, 0)
    fake.nvmlEventSetFree(event_set)
    assert code(fake.nvmlEventSetWait_v2, event_set, 0) == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_waiting_thread_wakes_when_the_clock_reaches_the_event() -> None:
    fake, clock = fake_with([{"kind": "xid", "gpu": 0, "xid": 48, "at": 30}], t=10)
    fake.nvmlInit()
    event_set = _events(fake, [0])
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(fake.nvmlEventSetWait_v2(event_set, 60_000)))
    waiter.start()
    clock.advance(25)
    waiter.join(timeout=30)
    assert not waiter.is_alive() and got[0].eventData == 48


def test_wait_sleeps_instead_of_spinning(monkeypatch: pytest.MonkeyPatch) -> None:
    fake, clock = fake_with([])
    fake.nvmlInit()
    event_set = _events(fake, [0])
    waits: list[float] = []
    real_wait = clock.wait_until
    monkeypatch.setattr(clock, "wait_until", lambda t, timeout: waits.append(timeout) or real_wait(t, timeout))
    assert code(fake.nvmlEventSetWait_v2, event_set, 100) == pynvml.NVML_ERROR_TIMEOUT
    assert 1 <= len(waits) <= 3


def test_gpu_lost_also_raises_xid_79_and_events_before_registration_are_not_replayed() -> None:
    fake, clock = fake_with([{"kind": "xid", "gpu": 0, "xid": 13, "at": 1},
                             {"kind": "gpu_lost", "gpu": 0, "at": 20}], t=5)
    fake.nvmlInit()
    event_set = _events(fake, [0])
    clock.set(25)
    assert fake.nvmlEventSetWait_v2(event_set, 1000).eventData == 79
    assert code(fake.nvmlEventSetWait_v2, event_set, 0) == pynvml.NVML_ERROR_TIMEOUT


# --- bookkeeping -----------------------------------------------------------------------------------


def test_every_call_is_counted_including_failures(demo: Scenario) -> None:
    fake = FakeNvml(demo, SimClock(frozen=True))
    assert sum(fake.calls.values()) == 0
    assert code(fake.nvmlDeviceGetCount) == pynvml.NVML_ERROR_UNINITIALIZED
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    fake.nvmlDeviceGetPowerUsage(h)
    fake.nvmlDeviceGetPowerUsage(h)
    _ = fake.NVML_CLOCK_SM, fake.nvmlMemory_v2  # constants are not calls
    assert fake.calls == {"nvmlDeviceGetCount": 1, "nvmlInit": 1, "nvmlDeviceGetHandleByIndex": 1,
                          "nvmlDeviceGetPowerUsage": 2}


def test_latency_is_applied_per_function(demo: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("dra_exporter_sim.fake_nvml.time.sleep", slept.append)
    fake = FakeNvml(demo, SimClock(frozen=True), latency_s={"nvmlDeviceGetPowerUsage": 0.002})
    fake.nvmlInit()
    fake.nvmlDeviceGetPowerUsage(fake.nvmlDeviceGetHandleByIndex(0))
    assert slept == [0.002]
    recorded = demo.profile.recorded_latency_s()
    assert recorded["nvmlDeviceGetTotalEnergyConsumption"] > recorded["nvmlDeviceGetPowerUsage"]


def test_pynvml_constants_and_types_are_reexported(nvml: FakeNvml) -> None:
    assert nvml.NVML_ERROR_NOT_SUPPORTED == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert nvml.NVMLError is pynvml.NVMLError
    assert nvml.nvmlClocksThrottleReasonSwPowerCap == pynvml.nvmlClocksThrottleReasonSwPowerCap
    assert nvml.c_nvmlGpmMetricsGet_t is pynvml.c_nvmlGpmMetricsGet_t
    with pytest.raises(AttributeError):
        nvml.nvmlDeviceGetFanSpeed  # noqa: B018 - not part of the surface, must not reach real NVML


def test_same_scenario_and_time_give_identical_answers(demo: Scenario) -> None:
    def snapshot() -> list[Any]:
        fake = FakeNvml(demo, SimClock(123.4, frozen=True))
        fake.nvmlInit()
        out = []
        for h in handles(fake):
            out.append(fake.nvmlDeviceGetPowerUsage(h))
            out.append(fake.nvmlDeviceGetMemoryInfo(h, version=fake.nvmlMemory_v2).used)
            out.extend(v.value.ullVal for v in fake.nvmlDeviceGetFieldValues(
                h, [fake.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, fake.NVML_FI_DEV_PCIE_COUNT_TX_BYTES]))
        return out

    assert snapshot() == snapshot()


def test_profile_is_regenerated_from_the_recordings() -> None:
    profiles = Path(sim.__file__).parent / "profiles"
    spec = importlib.util.spec_from_file_location("make_profile", profiles / "make_profile.py")
    assert spec is not None and spec.loader is not None
    make_profile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_profile)
    assert make_profile.build_profile(FIXTURES) == json.loads((profiles / "h200.json").read_text())


def test_oversubscribed_device_scales_process_shares_to_the_device() -> None:
    doc = copy.deepcopy(SMALL)
    doc["pods"][0]["containers"][0]["processes"] = [
        {"device": "gpu-0", "memory": "1Gi", "sm": 0.8, "pid": 100},
        {"device": "gpu-0", "memory": "2Gi", "sm": 0.8, "pid": 200},
    ]
    fake = FakeNvml(parse_scenario(doc), SimClock(frozen=True))
    fake.nvmlInit()
    gpu0 = fake.nvmlDeviceGetHandleByIndex(0)
    assert fake.nvmlDeviceGetUtilizationRates(gpu0).gpu == 100
    assert {s.pid: s.smUtil for s in fake.nvmlDeviceGetProcessUtilization(gpu0, 0)} == {100: 50, 200: 50}


# --- the simulated clock ------------------------------------------------------------------------


def test_frozen_clock_moves_only_when_told() -> None:
    clock = SimClock(5, frozen=True)
    assert clock.now() == 5 and clock.wall() == FIXED_EPOCH + 5
    assert clock.advance(2.5) == 7.5
    clock.set(1)
    assert clock.now() == 1
    with pytest.raises(ValueError, match="only moves forward"):
        clock.advance(-1)
    with pytest.raises(ValueError, match=">= 0"):
        clock.set(-3)


def test_running_clock_follows_monotonic_time(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr("dra_exporter_sim.clock.time.monotonic", lambda: now[0])
    clock = SimClock(10)
    now[0] += 2.5
    assert clock.now() == 12.5
    clock.advance(10)
    now[0] += 1
    assert clock.now() == 23.5


def test_running_clock_reads_the_hosts_wall_clock_and_keeps_its_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    # A demo run in 2030 must not export 2027 timestamps: Prometheus computes time() - timestamp.
    wall, mono = [1_900_000_000.0], [1000.0]
    monkeypatch.setattr("dra_exporter_sim.clock.time.time", lambda: wall[0])
    monkeypatch.setattr("dra_exporter_sim.clock.time.monotonic", lambda: mono[0])
    clock = SimClock(60)
    assert clock.wall() == 1_900_000_000.0
    wall[0] += 30.0
    mono[0] += 30.0
    assert clock.wall() == wall[0]
    wall[0] -= 3600.0  # the host's clock is stepped back (NTP): the simulated node does not jump
    mono[0] += 1.0
    assert clock.wall() == 1_900_000_031.0
    clock.advance(100)  # simulated time run ahead moves the node's wall clock with it
    assert clock.wall() == 1_900_000_131.0


def test_frozen_clocks_keep_the_fixed_epoch_whenever_they_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("dra_exporter_sim.clock.time.time", lambda: 2_000_000_000.0)
    assert SimClock(60, frozen=True).wall() == FIXED_EPOCH + 60


def test_wait_until_wakes_when_another_thread_moves_the_clock() -> None:
    clock = SimClock(frozen=True)
    assert clock.wait_until(0, 0) is True
    assert clock.wait_until(1, 0.01) is False
    results: list[bool] = []
    waiter = threading.Thread(target=lambda: results.append(clock.wait_until(50, 60)))
    waiter.start()
    clock.set(50)
    waiter.join(timeout=30)
    assert results == [True]
