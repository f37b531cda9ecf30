"""The NVML source against NVML answers recorded on a real H200 (``nvml_replay``).

What users rely on: every family in base units, one field-value call per device per cycle,
NOT_SUPPORTED asked once, init retried with backoff, one bad GPU never hiding the others,
GPM from two samples, XIDs counted (on the right MIG device), and a prompt ``close()``.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pynvml
import pytest
from nvml_replay import EVENTS_ALL, IDLE, NO_INSTANCE, MigSpec, ReplayNvml

from dra_exporter import catalog as cat
from dra_exporter.model import DeviceSample, DeviceSnapshot
from dra_exporter.sources import SourceError
from dra_exporter.sources.nvml import NvmlSource
from dra_exporter.sources.nvml_events import handle_key

Make = Callable[..., NvmlSource]
WALL = 1_750_000_000.0
FIELD_IDS = {pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, pynvml.NVML_FI_DEV_MEMORY_TEMP,
             pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
             pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER, pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
             pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL, pynvml.NVML_FI_DEV_REMAPPED_COR,
             pynvml.NVML_FI_DEV_REMAPPED_UNC, pynvml.NVML_FI_DEV_REMAPPED_PENDING,
             pynvml.NVML_FI_DEV_REMAPPED_FAILURE}
GPM_RATIOS = (cat.GPU_SM_ACTIVE.name, cat.GPU_SM_OCCUPANCY.name, cat.GPU_TENSOR_ACTIVE.name, cat.GPU_DRAM_ACTIVE.name,
              cat.GPU_FP64_ACTIVE.name, cat.GPU_FP32_ACTIVE.name, cat.GPU_FP16_ACTIVE.name)
REASONS = ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost",
           "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "display_clock_setting")


class FakeClock:
    def __init__(self, start: float = 100.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_source(clock: FakeClock) -> Iterator[Make]:
    sources: list[NvmlSource] = []

    def make(nvml: ReplayNvml, **kwargs: object) -> NvmlSource:
        options: dict[str, object] = {"monotonic": clock, "wall_clock": lambda: WALL, "events": False}
        options.update(kwargs)
        source = NvmlSource(nvml, **options)  # type: ignore[arg-type]
        sources.append(source)
        return source

    yield make
    for source in sources:
        source.close()


def device(snapshot: DeviceSnapshot, uuid: str) -> DeviceSample:
    matches = [d for d in snapshot.devices if d.device.uuid == uuid]
    assert len(matches) == 1, f"{uuid} appears {len(matches)} times"
    return matches[0]


def value(sample: DeviceSample, metric: str, **labels: str) -> float | None:
    wanted = tuple(labels.items())
    found = [r.value for r in sample.readings if r.metric == metric and r.labels == wanted]
    assert len(found) <= 1, f"{metric}{labels} read twice"
    return found[0] if found else None


def metrics(sample: DeviceSample) -> set[str]:
    return {r.metric for r in sample.readings}


def collect_until(source: NvmlSource, done: Callable[[DeviceSnapshot], bool]) -> DeviceSnapshot:
    """Collect until ``done`` holds; events arrive on another thread. Fails after ~10 s."""
    for _ in range(2000):
        snapshot = source.collect()
        if done(snapshot):
            return snapshot
        time.sleep(0.005)
    pytest.fail("the condition never held")


def mig_gpu(nvml: ReplayNvml, gpu: int = 0) -> list[MigSpec]:
    """Three MIG devices, in slot order that is not placement order."""
    base = nvml.gpus[gpu].uuid.replace("GPU-", "MIG-")
    specs = [
        MigSpec(f"{base[:-2]}a3", "3g.71gb", gi_id=2, ci_id=0, gi_profile_id=9, placement_start=4,
                placement_size=4, memory_total=71 * 2**30, memory_used=2**30, processes=((4242, 2**30),)),
        MigSpec(f"{base[:-2]}a1", "1g.18gb", gi_id=7, ci_id=0, gi_profile_id=19, placement_start=0,
                placement_size=1, processes=((4243, 5 * 2**20),)),
        MigSpec(f"{base[:-2]}a2", "2g.35gb", gi_id=3, ci_id=0, gi_profile_id=14, placement_start=2,
                placement_size=2),
    ]
    nvml.enable_mig(gpu, specs)
    return specs


# --- parsing the recorded answers ----------------------------------------------------------


def test_every_family_parses_the_recorded_h200_to_base_units(make_source: Make) -> None:
    nvml = ReplayNvml()
    source = make_source(nvml)
    source.collect()
    snapshot = source.collect()

    assert (snapshot.driver_version, snapshot.library_version) == ("580.159.04", "13.580.159.04")
    gpu = device(snapshot, "GPU-5f1c2a7e-3b9d-4c1a-9e2f-7a6b8c0d1e22")
    assert gpu.up and gpu.error == ""
    identity = gpu.device
    assert (identity.index, identity.minor, identity.model, identity.pci_bus_id) == (
        0, 0, "NVIDIA H200", "00000000:00:06.0")
    assert (identity.driver_version, identity.mig_mode, identity.parent_uuid, identity.profile) == (
        "580.159.04", "disabled", "", "")

    # memory_v2: "used" excludes the 615 MiB the driver reserves (v1 would say 21839609856)
    assert value(gpu, cat.GPU_MEMORY_USED.name) == 21194670080
    assert value(gpu, cat.GPU_MEMORY_FREE.name) == 128915210240
    assert value(gpu, cat.GPU_MEMORY_TOTAL.name) == 150754820096
    assert value(gpu, cat.GPU_MEMORY_RESERVED.name) == 644939776
    assert value(gpu, cat.GPU_UTILIZATION.name) == pytest.approx(0.98)
    assert value(gpu, cat.GPU_MEMORY_UTILIZATION.name) == pytest.approx(0.24)
    assert value(gpu, cat.GPU_ENCODER_UTILIZATION.name) == 0.0
    assert value(gpu, cat.GPU_DECODER_UTILIZATION.name) == 0.0
    assert value(gpu, cat.GPU_POWER.name) == pytest.approx(690.788)
    assert value(gpu, cat.GPU_POWER_LIMIT.name) == pytest.approx(700.0)
    assert value(gpu, cat.GPU_TEMPERATURE.name) == 55.0
    assert value(gpu, cat.GPU_CLOCK.name, clock="sm") == 1455e6
    assert value(gpu, cat.GPU_CLOCK.name, clock="memory") == 3201e6
    assert value(gpu, cat.GPU_CLOCK.name, clock="graphics") == 1455e6
    assert value(gpu, cat.GPU_CLOCK.name, clock="video") == 1485e6
    # bitmask 4: sw_power_cap only, and every known reason is present as 0/1
    assert {reason: value(gpu, cat.GPU_CLOCK_EVENT.name, reason=reason) for reason in REASONS} == {
        reason: (1.0 if reason == "sw_power_cap" else 0.0) for reason in REASONS}
    # from the field values: energy in J (mJ / 1000), not from nvmlDeviceGetTotalEnergyConsumption
    assert value(gpu, cat.GPU_ENERGY.name) == pytest.approx(35663.512)
    assert value(gpu, cat.GPU_MEMORY_TEMPERATURE.name) == 48.0
    assert value(gpu, cat.GPU_PCIE_BYTES.name, direction="tx") == 3476727064
    assert value(gpu, cat.GPU_PCIE_BYTES.name, direction="rx") == 1794018880
    assert value(gpu, cat.GPU_PCIE_REPLAYS.name) == 0.0
    assert value(gpu, cat.GPU_ECC_ERRORS.name, type="corrected") == 0.0
    assert value(gpu, cat.GPU_ECC_ERRORS.name, type="uncorrected") == 0.0
    assert value(gpu, cat.GPU_REMAPPED_ROWS.name, type="correctable") == 0.0
    assert value(gpu, cat.GPU_REMAPPED_ROWS.name, type="uncorrectable") == 0.0
    assert value(gpu, cat.GPU_ROW_REMAP_PENDING.name) == 0.0
    assert value(gpu, cat.GPU_ROW_REMAP_FAILURE.name) == 0.0
    assert nvml.calls["nvmlDeviceGetTotalEnergyConsumption"] == 0
    # every reading names a catalogued metric with its catalogued labels
    for reading in gpu.readings:
        spec = cat.spec(reading.metric)
        assert tuple(k for k, _ in reading.labels) == spec.labels[len(cat.DEVICE_LABELS):]


def test_field_values_map_to_their_families(make_source: Make) -> None:
    nvml = ReplayNvml()
    ull = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    for field_id, number in ((pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, 7),
                             (pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL, 2),
                             (pynvml.NVML_FI_DEV_REMAPPED_COR, 3), (pynvml.NVML_FI_DEV_REMAPPED_UNC, 1),
                             (pynvml.NVML_FI_DEV_REMAPPED_PENDING, 1),
                             (pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER, 5)):
        nvml.field_overrides[(0, field_id)] = (pynvml.NVML_SUCCESS, ull, number)
    gpu = make_source(nvml).collect().devices[0]
    assert value(gpu, cat.GPU_ECC_ERRORS.name, type="corrected") == 7  # SBE
    assert value(gpu, cat.GPU_ECC_ERRORS.name, type="uncorrected") == 2  # DBE
    assert value(gpu, cat.GPU_REMAPPED_ROWS.name, type="correctable") == 3
    assert value(gpu, cat.GPU_REMAPPED_ROWS.name, type="uncorrectable") == 1
    assert value(gpu, cat.GPU_ROW_REMAP_PENDING.name) == 1
    assert value(gpu, cat.GPU_PCIE_REPLAYS.name) == 5


class _Changing(ReplayNvml):
    """Power and clock event reasons as set between cycles."""

    power_mw = 100_000
    reasons = 0

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        super().nvmlDeviceGetPowerUsage(handle)
        return self.power_mw

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        super().nvmlDeviceGetCurrentClocksEventReasons(handle)
        return self.reasons


def test_every_family_follows_nvml_from_cycle_to_cycle(make_source: Make) -> None:
    # A family, or a field, whose answer is last cycle's reuses last cycle's readings: each change,
    # and each change back, must still show on the cycle it happens.
    nvml = _Changing()
    source = make_source(nvml)
    ull, energy = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION
    idle = int(pynvml.nvmlClocksEventReasonGpuIdle)
    seen = []
    for power_mw, reasons, energy_mj in ((100_000, 0, 5_000), (100_000, 0, 5_000), (250_500, idle, 5_000),
                                         (250_500, idle, 9_000), (100_000, 0, 9_000)):
        nvml.power_mw, nvml.reasons = power_mw, reasons
        nvml.field_overrides[(0, energy)] = (pynvml.NVML_SUCCESS, ull, energy_mj)
        gpu = source.collect().devices[0]
        seen.append((value(gpu, cat.GPU_POWER.name), value(gpu, cat.GPU_CLOCK_EVENT.name, reason="gpu_idle"),
                     value(gpu, cat.GPU_ENERGY.name)))
    assert seen == [(100.0, 0.0, 5.0), (100.0, 0.0, 5.0), (250.5, 1.0, 5.0), (250.5, 1.0, 9.0), (100.0, 0.0, 9.0)]


def test_idle_recording_reports_gpu_idle_and_no_processes(make_source: Make) -> None:
    nvml = ReplayNvml(IDLE)
    snapshot = make_source(nvml).collect()
    gpu = snapshot.devices[0]
    assert value(gpu, cat.GPU_UTILIZATION.name) == 0.0
    assert value(gpu, cat.GPU_MEMORY_USED.name) == 0.0
    assert {reason: value(gpu, cat.GPU_CLOCK_EVENT.name, reason=reason) for reason in REASONS} == {
        reason: (1.0 if reason == "gpu_idle" else 0.0) for reason in REASONS}
    assert value(gpu, cat.GPU_POWER.name) == pytest.approx(77.88)
    assert snapshot.processes == ()


def test_32_bit_pcie_counter_keeps_growing_across_a_wrap(make_source: Make) -> None:
    nvml = ReplayNvml()
    source = make_source(nvml)
    uint = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    tx = pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES
    nvml.field_overrides[(0, tx)] = (pynvml.NVML_SUCCESS, uint, 2**32 - 100)
    assert value(source.collect().devices[0], cat.GPU_PCIE_BYTES.name, direction="tx") == 2**32 - 100
    nvml.field_overrides[(0, tx)] = (pynvml.NVML_SUCCESS, uint, 500)
    assert value(source.collect().devices[0], cat.GPU_PCIE_BYTES.name, direction="tx") == 2**32 + 500
    nvml.field_overrides[(0, tx)] = (pynvml.NVML_SUCCESS, uint, 900)
    assert value(source.collect().devices[0], cat.GPU_PCIE_BYTES.name, direction="tx") == 2**32 + 900


# --- processes -------------------------------------------------------------------------------


def test_processes_carry_memory_and_mean_sm_share_of_new_samples(make_source: Make) -> None:
    nvml = ReplayNvml()
    uuid = nvml.gpus[0].uuid
    source = make_source(nvml)

    first = source.collect().processes
    assert [(p.uuid, p.pid, p.used_memory_bytes) for p in first] == [(uuid, 595, 21185429504)]
    assert first[0].sm_utilization_ratio == pytest.approx(0.94)

    # nothing newer than the timestamp already seen: NVML says NOT_FOUND, the process stays
    second = source.collect().processes
    assert [(p.pid, p.sm_utilization_ratio) for p in second] == [(595, None)]
    assert nvml.process_util_since[-1] == (uuid, 1795998962071976)

    stamp = 1795998962071976
    nvml.gpus[0].process_samples += [{"pid": 595, "timeStamp": stamp + 1, "smUtil": 50, "memUtil": 0},
                                     {"pid": 595, "timeStamp": stamp + 2, "smUtil": 70, "memUtil": 0}]
    third = source.collect().processes
    assert third[0].sm_utilization_ratio == pytest.approx(0.60)


def test_a_process_in_both_compute_and_graphics_lists_counts_once(make_source: Make) -> None:
    nvml = ReplayNvml()
    nvml.gpus[0].graphics_processes = ((595, 21185429504), (700, 2**20))
    processes = make_source(nvml).collect().processes
    assert [(p.pid, p.used_memory_bytes) for p in processes] == [(595, 21185429504), (700, 2**20)]


# --- call economy and capability probing -------------------------------------------------


def test_field_values_come_from_one_call_per_device_per_cycle(make_source: Make) -> None:
    nvml = ReplayNvml(gpus=2)
    source = make_source(nvml)
    for _ in range(3):
        source.collect()
    assert nvml.calls["nvmlDeviceGetFieldValues"] == 6
    for gpu in nvml.gpus:
        assert nvml.device_calls[("nvmlDeviceGetFieldValues", gpu.uuid)] == 3
    # No NVLink field is ever asked: this recording has no link (found by state calls, see test_nvlink.py).
    assert all(set(ids) == FIELD_IDS for _, ids in nvml.field_requests)


def test_not_supported_families_are_asked_once_per_device(make_source: Make) -> None:
    nvml = ReplayNvml(gpus=2)
    nvml.unsupported = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetClockInfo"}
    source = make_source(nvml)
    for _ in range(3):
        snapshot = source.collect()
    assert nvml.calls["nvmlDeviceGetPowerUsage"] == 2
    assert nvml.calls["nvmlDeviceGetClockInfo"] == 2 * 4  # each clock domain probed once per GPU
    assert nvml.calls["nvmlDeviceGetUtilizationRates"] == 6
    for gpu in snapshot.devices:
        assert gpu.up
        assert not metrics(gpu) & {cat.GPU_POWER.name, cat.GPU_CLOCK.name}
        assert value(gpu, cat.GPU_POWER_LIMIT.name) == pytest.approx(700.0)


def test_a_not_supported_field_is_dropped_from_the_batch(make_source: Make) -> None:
    nvml = ReplayNvml()
    temp, tx = pynvml.NVML_FI_DEV_MEMORY_TEMP, pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES
    nvml.field_overrides[(0, temp)] = (pynvml.NVML_ERROR_NOT_SUPPORTED, 0, 0)
    nvml.field_overrides[(0, tx)] = (pynvml.NVML_ERROR_UNKNOWN, 0, 0)  # a passing failure
    source = make_source(nvml)
    for _ in range(3):
        gpu = source.collect().devices[0]
    first, *later = [set(ids) for _, ids in nvml.field_requests]
    assert first == FIELD_IDS
    assert all(ids == FIELD_IDS - {temp} for ids in later)  # the transient error is asked again
    assert value(gpu, cat.GPU_MEMORY_TEMPERATURE.name) is None
    assert value(gpu, cat.GPU_PCIE_BYTES.name, direction="tx") is None
    assert value(gpu, cat.GPU_ENERGY.name) == pytest.approx(35663.512)


def test_an_error_outside_nvml_costs_that_family_only(make_source: Make, caplog: pytest.LogCaptureFixture) -> None:
    # pynvml raises more than NVMLError: NVMLLibraryMismatchError (drivers before R510), a ctypes
    # error from a struct it cannot fill. One such call must not take the GPU, let alone the node.
    nvml = ReplayNvml(gpus=2)
    calls = []

    def broken(handle: object) -> int:
        calls.append(handle)
        raise pynvml.NVMLLibraryMismatchError("Unversioned function called and the pyNVML version does not match")

    nvml.nvmlDeviceGetPowerUsage = broken  # type: ignore[method-assign]
    source = make_source(nvml)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            snapshot = source.collect()
    assert len(calls) == 2  # once per GPU: it would fail the same way every cycle
    for gpu in snapshot.devices:
        assert gpu.up
        assert value(gpu, cat.GPU_POWER.name) is None
        assert value(gpu, cat.GPU_POWER_LIMIT.name) == pytest.approx(700.0)
    assert len([r for r in caplog.records if "NVMLLibraryMismatchError" in r.getMessage()]) == 1


def test_processes_fall_back_to_v2_where_pynvml_refuses_v3(make_source: Make) -> None:
    # Drivers before R510 have only the v2 process calls; pynvml's unversioned ones are v3 and raise.
    nvml = ReplayNvml()
    v3 = nvml.nvmlDeviceGetComputeRunningProcesses
    graphics_v3 = nvml.nvmlDeviceGetGraphicsRunningProcesses

    def refuse(handle: object) -> list[object]:
        raise pynvml.NVMLLibraryMismatchError("Unversioned function called")

    nvml.nvmlDeviceGetComputeRunningProcesses = refuse  # type: ignore[method-assign]
    nvml.nvmlDeviceGetGraphicsRunningProcesses = refuse  # type: ignore[method-assign]
    nvml.nvmlDeviceGetComputeRunningProcesses_v2 = v3  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetGraphicsRunningProcesses_v2 = graphics_v3  # type: ignore[attr-defined]
    source = make_source(nvml)
    for _ in range(2):
        snapshot = source.collect()
    assert snapshot.devices[0].up
    assert snapshot.processes and {p.pid for p in snapshot.processes} == {
        p["pid"] for p in nvml.recording["devices"][0]["getters"]["nvmlDeviceGetComputeRunningProcesses"]["ok"]}


# --- init --------------------------------------------------------------------------------------


def test_init_failure_backs_off_then_recovers(make_source: Make, clock: FakeClock) -> None:
    nvml = ReplayNvml()
    nvml.init_failures = 3
    # random 0.5 is the middle of the jitter range (factor 1): the exact doubling sequence.
    source = make_source(nvml, init_backoff=(1.0, 3.0), random=lambda: 0.5)

    with pytest.raises(SourceError, match=r"^nvml: init failed: Driver Not Loaded.*; retrying in 1s$"):
        source.collect()
    assert source.init_attempts == 1
    clock.now += 0.5
    # While backing off, the attempt's own words: a countdown would change the message, and so the
    # log line, every cycle.
    with pytest.raises(SourceError, match=r"retrying in 1s$"):
        source.collect()
    assert source.init_attempts == 1  # still backing off: nvmlInit not called

    clock.now += 0.5
    with pytest.raises(SourceError, match=r"retrying in 2s$"):
        source.collect()
    clock.now += 1.9
    with pytest.raises(SourceError):
        source.collect()
    assert source.init_attempts == 2
    clock.now += 0.1
    with pytest.raises(SourceError, match=r"retrying in 3s$"):  # capped at init_backoff[1]
        source.collect()
    assert nvml.calls["nvmlInit"] == source.init_attempts == 3

    clock.now += 3.0
    snapshot = source.collect()
    assert source.init_attempts == 4
    assert [d.up for d in snapshot.devices] == [True]
    source.collect()
    assert nvml.calls["nvmlInit"] == 4  # a working NVML is not initialised again


def test_init_retries_are_jittered(make_source: Make, clock: FakeClock) -> None:
    # The nodes of a driver rollout fail together; ±20 % keeps them from retrying in step.
    nvml = ReplayNvml()
    nvml.init_failures = 2
    source = make_source(nvml, init_backoff=(1.0, 60.0), random=lambda: 0.0)
    with pytest.raises(SourceError, match=r"retrying in 0\.8s$"):
        source.collect()
    clock.now += 0.8
    with pytest.raises(SourceError, match=r"retrying in 1\.6s$"):
        source.collect()
    assert source.init_attempts == 2


def test_init_failure_tells_the_operator_what_to_check(make_source: Make) -> None:
    nvml = ReplayNvml()
    nvml.init_failures = 1
    nvml.init_error = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    with pytest.raises(SourceError, match="libnvidia-ml.so.1"):
        make_source(nvml).collect()


def test_invalid_backoff_is_refused() -> None:
    with pytest.raises(ValueError, match="init_backoff"):
        NvmlSource(ReplayNvml(), init_backoff=(0.0, 1.0))


# --- per-device errors ---------------------------------------------------------------------------


def test_a_lost_gpu_is_down_alone_and_recovers(make_source: Make,
                                               caplog: pytest.LogCaptureFixture) -> None:
    nvml = ReplayNvml(gpus=2)
    good, bad = (g.uuid for g in nvml.gpus)
    source = make_source(nvml)
    source.collect()

    nvml.fail(bad)
    with caplog.at_level(logging.INFO, logger="dra_exporter.sources.nvml"):
        for _ in range(2):
            snapshot = source.collect()
    lost = device(snapshot, bad)
    assert not lost.up and lost.readings == ()
    assert "GPU is lost" in lost.error
    healthy = device(snapshot, good)
    assert healthy.up and value(healthy, cat.GPU_POWER.name) == pytest.approx(690.788)
    assert {p.uuid for p in snapshot.processes} == {good}
    assert sum("is down" in r.getMessage() for r in caplog.records) == 1  # state changes only

    nvml.heal(bad)
    with caplog.at_level(logging.INFO, logger="dra_exporter.sources.nvml"):
        snapshot = source.collect()
    assert all(d.up for d in snapshot.devices)
    assert value(device(snapshot, bad), cat.GPU_POWER.name) == pytest.approx(690.788)
    assert any("back up" in r.getMessage() for r in caplog.records)


def test_a_gpu_unreadable_at_start_appears_when_it_answers(make_source: Make) -> None:
    nvml = ReplayNvml(gpus=2)
    late = nvml.gpus[1].uuid
    nvml.fail(late)
    source = make_source(nvml)
    assert [d.device.index for d in source.collect().devices] == [0]
    nvml.heal(late)
    snapshot = source.collect()
    assert [(d.device.index, d.up) for d in snapshot.devices] == [(0, True), (1, True)]


def test_no_gpu_answering_is_an_error_not_an_empty_node(make_source: Make) -> None:
    nvml = ReplayNvml(gpus=2)
    for gpu in nvml.gpus:
        nvml.fail(gpu.uuid)
    source = make_source(nvml)
    with pytest.raises(SourceError, match=r"none of the 2 GPU\(s\) answers \(GPU 0: GPU is lost\)"):
        source.collect()
    nvml.heal(nvml.gpus[0].uuid)
    assert [d.device.index for d in source.collect().devices] == [0]


# --- GPM -------------------------------------------------------------------------------------------


def test_gpm_ratios_come_from_this_and_the_previous_sample(make_source: Make) -> None:
    nvml = ReplayNvml()
    source = make_source(nvml)
    first = source.collect().devices[0]
    assert not metrics(first) & {*GPM_RATIOS, cat.GPU_NVLINK_BYTES.name}  # one sample is no interval

    for _ in range(2):  # the fake refuses samples of other devices or out of time order
        gpu = source.collect().devices[0]
        assert value(gpu, cat.GPU_SM_ACTIVE.name) == pytest.approx(0.9494517)
        assert value(gpu, cat.GPU_SM_OCCUPANCY.name) == pytest.approx(0.1403113)
        assert value(gpu, cat.GPU_TENSOR_ACTIVE.name) == pytest.approx(0.9217768)
        assert value(gpu, cat.GPU_DRAM_ACTIVE.name) == pytest.approx(0.1732157)
        fp = (cat.GPU_FP64_ACTIVE.name, cat.GPU_FP32_ACTIVE.name, cat.GPU_FP16_ACTIVE.name)
        assert [value(gpu, m) for m in fp] == [0, 0, 0]  # a bf16 matmul: tensor pipes only
    assert nvml.calls["nvmlGpmSampleAlloc"] == 2  # buffers are reused, not allocated per cycle
    assert nvml.calls["nvmlGpmMetricsGet"] == 2


def test_nvlink_bytes_integrate_gpm_rates_over_time(make_source: Make,
                                                    clock: FakeClock) -> None:
    nvml = ReplayNvml()
    # nvml.h: the GPM NVLink rates are "in MiB/sec"; the family counts bytes.
    nvml.gpm_overrides = {pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: 1000.0,
                          pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: 200.0}
    source = make_source(nvml)
    source.collect()
    clock.now += 1.0
    gpu = source.collect().devices[0]
    assert value(gpu, cat.GPU_NVLINK_BYTES.name, direction="rx") == pytest.approx(1000 * 2**20)
    assert value(gpu, cat.GPU_NVLINK_BYTES.name, direction="tx") == pytest.approx(200 * 2**20)
    clock.now += 2.5
    gpu = source.collect().devices[0]
    assert value(gpu, cat.GPU_NVLINK_BYTES.name, direction="rx") == pytest.approx(3500 * 2**20)
    assert value(gpu, cat.GPU_NVLINK_BYTES.name, direction="tx") == pytest.approx(700 * 2**20)


def test_gpm_ratios_follow_nvml_every_cycle_and_a_refused_metric_is_asked_no_more(make_source: Make) -> None:
    # The request is built once per order of the two sample buffers (they alternate) and rebuilt
    # without a metric NVML refuses; an answer repeated gives the same reading, a new one a new reading.
    nvml = ReplayNvml()
    sm, occupancy = pynvml.NVML_GPM_METRIC_SM_UTIL, pynvml.NVML_GPM_METRIC_SM_OCCUPANCY
    del nvml._gpm_metrics[occupancy]  # this driver does not record it: NOT_SUPPORTED
    source = make_source(nvml)
    source.collect()
    seen = []
    for percent in (10.0, 20.0, 20.0, 35.0, 35.0, 50.0):
        nvml.gpm_overrides = {sm: percent}
        gpu = source.collect().devices[0]
        seen.append(value(gpu, cat.GPU_SM_ACTIVE.name))
        assert cat.GPU_SM_OCCUPANCY.name not in metrics(gpu)
        assert value(gpu, cat.GPU_TENSOR_ACTIVE.name) == pytest.approx(0.9217768)
    assert seen == pytest.approx([0.1, 0.2, 0.2, 0.35, 0.35, 0.5])
    asked = [ids for _who, ids in nvml.gpm_requests]
    assert occupancy in asked[0] and all(occupancy not in ids for ids in asked[1:])
    assert len(set(asked[1:])) == 1 and sm in asked[-1]


def test_a_gpu_without_gpm_is_probed_once_and_never_sampled(make_source: Make) -> None:
    nvml = ReplayNvml()
    nvml.gpus[0].gpm_supported = False
    source = make_source(nvml)
    for _ in range(3):
        gpu = source.collect().devices[0]
    assert nvml.calls["nvmlGpmQueryDeviceSupport"] == 1
    assert nvml.calls["nvmlGpmSampleGet"] == nvml.calls["nvmlGpmSampleAlloc"] == 0
    assert not metrics(gpu) & set(GPM_RATIOS)


# --- MIG -------------------------------------------------------------------------------------------


def test_mig_devices_are_listed_with_identity_in_placement_order(make_source: Make) -> None:
    nvml = ReplayNvml(gpus=2)
    specs = mig_gpu(nvml, gpu=1)
    parent = nvml.gpus[1]
    snapshot = make_source(nvml).collect()

    order = [(d.device.index, d.device.uuid) for d in snapshot.devices]
    assert order == [(0, nvml.gpus[0].uuid), (1, parent.uuid), (1, specs[1].uuid), (1, specs[2].uuid),
                     (1, specs[0].uuid)]
    assert device(snapshot, parent.uuid).device.mig_mode == "enabled"
    mig = device(snapshot, specs[0].uuid)
    assert mig.up
    d = mig.device
    assert (d.parent_uuid, d.index, d.minor, d.pci_bus_id, d.mig_mode, d.model) == (
        parent.uuid, 1, 1, "00000000:01:06.0", "", "NVIDIA H200")
    assert (d.profile, d.gi_id, d.ci_id, d.gi_profile_id, d.placement_start, d.placement_size) == (
        "3g.71gb", 2, 0, 9, 4, 4)
    assert value(mig, cat.GPU_MEMORY_TOTAL.name) == 71 * 2**30
    assert value(mig, cat.GPU_MEMORY_USED.name) == 2**30
    assert not metrics(mig) & {cat.GPU_UTILIZATION.name, cat.GPU_POWER.name, cat.GPU_CLOCK.name, cat.GPU_ENERGY.name}


@pytest.mark.parametrize("slices", [7, 4], ids=["h200", "a30"])
def test_a_mig_enabled_gpu_says_how_many_compute_slices_it_splits_into(make_source: Make, slices: int) -> None:
    """The denominator of a MIG device's share: 7 on an H200, 4 on an A30 (its 1g.6gb is a quarter);
    the largest GPU-instance profile's slice count, read once, not a constant."""
    nvml = ReplayNvml(gpus=2)
    mig_gpu(nvml, gpu=1)
    nvml.gpus[1].compute_slices = slices
    source = make_source(nvml)
    source.collect()
    snapshot = source.collect()
    assert value(device(snapshot, nvml.gpus[1].uuid), cat.GPU_MIG_COMPUTE_SLICES.name) == slices
    assert cat.GPU_MIG_COMPUTE_SLICES.name not in metrics(device(snapshot, nvml.gpus[0].uuid)), "MIG off"
    assert nvml.calls["nvmlDeviceGetGpuInstanceProfileInfo"] <= 4, "read when the GPU is found, not each cycle"


def test_processes_come_from_mig_devices_never_from_their_parent(make_source: Make) -> None:
    nvml = ReplayNvml()
    specs = mig_gpu(nvml)
    processes = make_source(nvml).collect().processes
    assert sorted((p.uuid, p.pid, p.used_memory_bytes) for p in processes) == sorted([
        (specs[0].uuid, 4242, 2**30), (specs[1].uuid, 4243, 5 * 2**20)])


def test_mig_devices_ask_whole_gpu_families_once(make_source: Make) -> None:
    nvml = ReplayNvml()
    specs = mig_gpu(nvml)
    source = make_source(nvml)
    for _ in range(3):
        source.collect()
    uuid = specs[0].uuid
    for function, expected in (("nvmlDeviceGetUtilizationRates", 1), ("nvmlDeviceGetPowerUsage", 1),
                               ("nvmlDeviceGetTemperature", 1), ("nvmlDeviceGetClockInfo", 4),
                               ("nvmlDeviceGetFieldValues", 1), ("nvmlDeviceGetMemoryInfo", 3),
                               ("nvmlDeviceGetComputeRunningProcesses", 3),
                               ("nvmlDeviceGetGpuInstanceId", 1)):  # identity read once per MIG device
        assert nvml.device_calls[(function, uuid)] == expected, function


def test_gpm_per_mig_instance_uses_the_parent_handle(make_source: Make) -> None:
    nvml = ReplayNvml()
    specs = mig_gpu(nvml)
    source = make_source(nvml)
    source.collect()
    snapshot = source.collect()
    mig = device(snapshot, specs[1].uuid)
    assert value(mig, cat.GPU_SM_ACTIVE.name) == pytest.approx(0.9494517)
    assert {who for who, _ in nvml.gpm_requests} >= {f"{nvml.gpus[0].uuid}/gi{s.gi_id}" for s in specs}


def test_dynamic_mig_devices_come_and_go_between_cycles(make_source: Make) -> None:
    nvml = ReplayNvml()
    specs = mig_gpu(nvml)
    source = make_source(nvml)
    source.collect()
    source.collect()
    slots = nvml.gpus[0].migs
    assert slots is not None
    slots[0] = None  # the 3g.71gb instance is destroyed ...
    new = MigSpec(specs[0].uuid[:-2] + "b1", "1g.18gb", gi_id=9, gi_profile_id=19, placement_start=1)
    slots[3] = new  # ... and a 1g.18gb is created
    snapshot = source.collect()
    uuids = [d.device.uuid for d in snapshot.devices]
    assert specs[0].uuid not in uuids
    assert uuids[1:] == [specs[1].uuid, new.uuid, specs[2].uuid]
    assert nvml.calls["nvmlGpmSampleFree"] == 2  # the destroyed device's GPM buffers are released


# --- XID events -------------------------------------------------------------------------------------


def test_xid_events_are_counted_per_device_and_code(make_source: Make) -> None:
    nvml = ReplayNvml(gpus=2)
    source = make_source(nvml, events=True, event_poll_ms=10)
    source.collect()
    quiet, noisy = (g.uuid for g in nvml.gpus)
    nvml.push_event(1, 13, event_type=pynvml.nvmlEventTypeDoubleBitEccError)  # ECC events are no XIDs
    for xid in (79, 13, 79):
        assert nvml.push_event(1, xid) == 1

    snapshot = collect_until(source, lambda s: value(device(s, noisy), cat.GPU_XID_ERRORS.name, xid="79") == 2)
    gpu = device(snapshot, noisy)
    assert value(gpu, cat.GPU_XID_ERRORS.name, xid="13") == 1
    assert value(gpu, cat.GPU_LAST_XID.name) == WALL
    assert not metrics(device(snapshot, quiet)) & {cat.GPU_XID_ERRORS.name, cat.GPU_LAST_XID.name}

    # the counters outlive the device going down (XID 79: fallen off the bus) and coming back
    nvml.fail(noisy)
    down = device(source.collect(), noisy)
    assert not down.up and value(down, cat.GPU_XID_ERRORS.name, xid="79") == 2
    nvml.heal(noisy)
    assert value(device(source.collect(), noisy), cat.GPU_XID_ERRORS.name, xid="79") == 2


def test_an_xid_with_a_gpu_instance_counts_on_that_mig_device(make_source: Make) -> None:
    nvml = ReplayNvml()
    specs = mig_gpu(nvml)
    source = make_source(nvml, events=True, event_poll_ms=10)
    source.collect()  # learns the MIG layout the event thread attributes by
    nvml.push_event(0, 43, gpu_instance=3, compute_instance=0)
    nvml.push_event(0, 31, gpu_instance=7, compute_instance=NO_INSTANCE)
    nvml.push_event(0, 48)

    def arrived(snapshot: DeviceSnapshot) -> bool:
        return value(device(snapshot, nvml.gpus[0].uuid), cat.GPU_XID_ERRORS.name, xid="48") == 1

    snapshot = collect_until(source, arrived)
    assert value(device(snapshot, specs[2].uuid), cat.GPU_XID_ERRORS.name, xid="43") == 1  # gi 3
    assert value(device(snapshot, specs[1].uuid), cat.GPU_XID_ERRORS.name, xid="31") == 1  # gi 7
    parent = device(snapshot, nvml.gpus[0].uuid)
    assert value(parent, cat.GPU_XID_ERRORS.name, xid="43") is None
    assert value(device(snapshot, specs[0].uuid), cat.GPU_XID_ERRORS.name, xid="43") is None


def test_event_handles_from_pynvml_match_registered_handles_by_address() -> None:
    # pynvml returns a new pointer object for each event's device; it must map to the same GPU
    # without asking NVML, which may no longer answer for a GPU that just reported XID 79.
    target = pynvml.struct_c_nvmlDevice_t()
    registered = pynvml.c_nvmlDevice_t(target)
    from_event = ctypes.cast(ctypes.addressof(target), pynvml.c_nvmlDevice_t)
    other = pynvml.c_nvmlDevice_t(pynvml.struct_c_nvmlDevice_t())
    assert registered is not from_event
    assert handle_key(registered) == handle_key(from_event) != handle_key(other)


def test_close_stops_the_event_thread_and_shuts_nvml_down(make_source: Make) -> None:
    nvml = ReplayNvml()
    source = make_source(nvml, events=True, event_poll_ms=50)
    source.collect()
    threads = [t for t in threading.enumerate() if t.name == "nvml-events"]
    assert len(threads) == 1 and threads[0].is_alive() and threads[0].daemon

    source.close()
    assert not threads[0].is_alive()
    assert [s.freed for s in nvml.event_sets] == [True]
    assert nvml.calls["nvmlShutdown"] == 1 and not nvml.initialised
    source.close()
    assert nvml.calls["nvmlShutdown"] == 1
    with pytest.raises(SourceError, match="closed"):
        source.collect()


def test_no_event_thread_when_no_gpu_supports_events(make_source: Make) -> None:
    nvml = ReplayNvml()
    nvml.gpus[0].event_types = 0
    make_source(nvml, events=True, event_poll_ms=10).collect()
    assert not [t for t in threading.enumerate() if t.name == "nvml-events"]
    assert nvml.calls["nvmlDeviceRegisterEvents"] == 0
    assert [s.freed for s in nvml.event_sets] == [True]


def test_events_register_xid_and_ecc_only(make_source: Make) -> None:
    nvml = ReplayNvml()
    nvml.gpus[0].event_types = EVENTS_ALL | pynvml.nvmlEventTypePState
    make_source(nvml, events=True, event_poll_ms=10).collect()
    assert nvml.event_sets[0].registered == {0: EVENTS_ALL}
