"""NVLink per link and the NVLink fabric: the NVML source against the fake NVML's GPU profiles.

What users rely on: every link of an NVLink GPU (HGX H200: NVLink4 to NVSwitches; GB200: NVLink5,
multi-node clique) with its state, speed, data counters in bytes and the error counters its
generation has; ``dra_gpu_nvlink_bytes_total`` the sum of the links; the fabric's clique as GPU
Feature Discovery writes it (``""`` on HGX boards, which is no error), its state, registration and
health; nothing at all, and no error, where NVML says NOT_SUPPORTED (the recorded H200); all of it
from one field-value call per GPU per cycle.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from dra_exporter import catalog as cat
from dra_exporter import naming
from dra_exporter.join import JoinInput, join
from dra_exporter.model import DeviceSample, DeviceSnapshot, Reading
from dra_exporter.sources.nvml import NvmlSource
from dra_exporter.sources.nvml_nvlink import bulk_readings
from dra_exporter_sim.clock import SimClock
from dra_exporter_sim.fake_nvml import FakeNvml
from dra_exporter_sim.scenario import Scenario, ScenarioError
from dra_exporter_sim.scenario_builder import parse_scenario

LINKS = 18
GB200_CLUSTER = "5e1f7c3a-9b2d-4c8e-a6f0-3d2b1c0a9e87"


def scenario(gpu_model: str, *, gpus: list[dict[str, Any]] | None = None,
             faults: list[dict[str, Any]] | None = None) -> Scenario:
    return parse_scenario({"node": "node-a", "gpu_model": gpu_model, "gpus": gpus or [{"index": 0}],
                           "faults": faults or []}, "test.yaml")


class Node:
    """A fake NVML on a frozen clock and the NVML source reading it."""

    def __init__(self, sc: Scenario, fake_type: type[FakeNvml] = FakeNvml) -> None:
        self.clock = SimClock(100.0, frozen=True)
        self.nvml = fake_type(sc, self.clock)
        self.source = NvmlSource(self.nvml, monotonic=self.clock.now, events=False)

    def collect(self, after: float = 0.0) -> DeviceSnapshot:
        if after:
            self.clock.advance(after)
        return self.source.collect()

    def gpu(self, after: float = 0.0, index: int = 0) -> DeviceSample:
        return self.collect(after).devices[index]


@pytest.fixture
def nodes() -> Iterator[list[Node]]:
    made: list[Node] = []
    yield made
    for node in made:
        node.source.close()


def make(nodes: list[Node], sc: Scenario, fake_type: type[FakeNvml] = FakeNvml) -> Node:
    node = Node(sc, fake_type)
    nodes.append(node)
    return node


def values(sample: DeviceSample, metric: str, **labels: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Readings of ``metric`` whose labels include ``labels``, by their labels."""
    return {r.labels: r.value for r in sample.readings
            if r.metric == metric and set(labels.items()) <= set(r.labels)}


def one(sample: DeviceSample, metric: str, **labels: str) -> float:
    found = [r.value for r in sample.readings if r.metric == metric and r.labels == tuple(labels.items())]
    assert len(found) == 1, f"{metric}{labels}: {len(found)} readings"
    return found[0]


def families(sample: DeviceSample) -> set[str]:
    return {r.metric for r in sample.readings}


def raw_field(node: Node, gpu: int, field_id: int, link: int) -> int:
    (value,) = node.nvml.nvmlDeviceGetFieldValues(node.nvml.nvmlDeviceGetHandleByIndex(gpu), [(field_id, link)])
    assert value.nvmlReturn == pynvml.NVML_SUCCESS
    return int(value.value.ullVal)


NVLINK_FAMILIES = {cat.GPU_NVLINK_LINK_UP.name, cat.GPU_NVLINK_LINK_INFO.name, cat.GPU_NVLINK_LINK_SPEED.name,
                   cat.GPU_NVLINK_LINK_BYTES.name, cat.GPU_NVLINK_LINK_ERRORS.name, cat.GPU_NVLINK_LINK_RECOVERIES.name}
FABRIC_FAMILIES = {cat.GPU_FABRIC_INFO.name, cat.GPU_FABRIC_STATE.name, cat.GPU_FABRIC_REGISTERED.name,
                   cat.GPU_FABRIC_HEALTH.name, cat.GPU_FABRIC_HEALTH_PROBLEM.name}
HOPPER_TYPES = {"crc_flit", "crc_data", "replay", "recovery", "ecc_data"}
BLACKWELL_TYPES = {"malformed_packet", "buffer_overrun", "rcv", "rcv_remote", "rcv_general",
                   "local_link_integrity", "xmit_discards", "effective", "symbol"}


# --- HGX H200: NVLink4, fabric without a multi-node clique ------------------------------------------


def test_hgx_h200_reports_18_nvlink4_links_to_switches(nodes: list[Node]) -> None:
    node = make(nodes, scenario("h200-hgx"))
    node.collect()
    gpu = node.gpu(after=10)
    assert gpu.up and not gpu.error
    assert values(gpu, cat.GPU_NVLINK_LINK_UP.name) == {(("link", str(n)),): 1.0 for n in range(LINKS)}
    assert set(values(gpu, cat.GPU_NVLINK_LINK_INFO.name)) == {
        (("link", str(n)), ("version", "4.0"), ("remote_type", "switch")) for n in range(LINKS)}
    assert set(values(gpu, cat.GPU_NVLINK_LINK_SPEED.name).values()) == {26562e6}  # MBps -> bytes/s
    assert len(values(gpu, cat.GPU_NVLINK_LINK_BYTES.name)) == 2 * LINKS
    # Up to Hopper: CRC/replay/recovery on every link; data CRC and ECC only have fields for links 0-11.
    types = {dict(k)["type"] for k in values(gpu, cat.GPU_NVLINK_LINK_ERRORS.name, link="3")}
    assert types == HOPPER_TYPES
    assert {dict(k)["type"] for k in values(gpu, cat.GPU_NVLINK_LINK_ERRORS.name, link="15")} == {
        "crc_flit", "replay", "recovery"}
    assert cat.GPU_NVLINK_LINK_RECOVERIES.name not in families(gpu)


def test_hgx_fabric_is_completed_without_a_clique_and_that_is_no_error(nodes: list[Node],
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    node = make(nodes, scenario("h200-hgx"))
    with caplog.at_level(logging.WARNING):
        gpu = node.gpu()
    assert one(gpu, cat.GPU_FABRIC_INFO.name, clique="", cluster_uuid="", clique_id="0") == 1.0
    assert values(gpu, cat.GPU_FABRIC_STATE.name) == {
        (("state", "not_supported"),): 0.0, (("state", "not_started"),): 0.0,
        (("state", "in_progress"),): 0.0, (("state", "completed"),): 1.0}
    assert one(gpu, cat.GPU_FABRIC_REGISTERED.name) == 1.0
    assert one(gpu, cat.GPU_FABRIC_HEALTH.name, summary="not_supported") == 1.0
    assert cat.GPU_FABRIC_HEALTH_PROBLEM.name not in families(gpu)  # the mask reports no field
    assert not caplog.records


# --- GB200: NVLink5, multi-node clique --------------------------------------------------------------


def test_gb200_reports_nvlink5_links_and_blackwell_counters(nodes: list[Node]) -> None:
    node = make(nodes, scenario("gb200"))
    node.collect()
    gpu = node.gpu(after=10)
    assert set(values(gpu, cat.GPU_NVLINK_LINK_INFO.name)) == {
        (("link", str(n)), ("version", "5.0"), ("remote_type", "switch")) for n in range(LINKS)}
    assert set(values(gpu, cat.GPU_NVLINK_LINK_SPEED.name).values()) == {53125e6}
    assert {dict(k)["type"] for k in values(gpu, cat.GPU_NVLINK_LINK_ERRORS.name, link="17")} == BLACKWELL_TYPES
    assert set(values(gpu, cat.GPU_NVLINK_LINK_RECOVERIES.name, link="0")) == {
        (("link", "0"), ("result", "successful")), (("link", "0"), ("result", "failed"))}


def test_gb200_fabric_names_its_clique_as_feature_discovery_does(nodes: list[Node]) -> None:
    gpu = make(nodes, scenario("gb200")).gpu()
    assert one(gpu, cat.GPU_FABRIC_INFO.name, clique=f"{GB200_CLUSTER}.32766", cluster_uuid=GB200_CLUSTER,
               clique_id="32766") == 1.0
    assert one(gpu, cat.GPU_FABRIC_REGISTERED.name) == 1.0
    assert one(gpu, cat.GPU_FABRIC_HEALTH.name, summary="healthy") == 1.0
    assert values(gpu, cat.GPU_FABRIC_HEALTH_PROBLEM.name) == {(("field", f),): 0.0 for f in (
        "degraded_bw", "route_recovery", "route_unhealthy", "access_timeout_recovery", "incorrect_configuration",
        "partition_assigned", "gfm_state")}


def test_mig_devices_own_no_links_their_gpu_does(nodes: list[Node]) -> None:
    sc = scenario("gb200", gpus=[{"index": 0, "mig": [{"profile": "3g.93gb", "placement_start": 0}]}])
    node = make(nodes, sc)
    node.collect()
    parent, mig = node.collect(after=10).devices
    assert mig.device.is_mig and not (families(mig) & (NVLINK_FAMILIES | FABRIC_FAMILIES))
    assert NVLINK_FAMILIES <= families(parent) and cat.GPU_FABRIC_INFO.name in families(parent)


# --- the recorded H200: NVLink NOT_SUPPORTED --------------------------------------------------------


def test_recorded_h200_has_no_link_or_fabric_families_and_no_error(nodes: list[Node]) -> None:
    node = make(nodes, scenario("h200", gpus=[{"index": 0}, {"index": 1}]))
    for after in (0, 5, 5):
        snapshot = node.collect(after)
    for gpu in snapshot.devices:
        assert gpu.up and not gpu.error
        assert not families(gpu) & (NVLINK_FAMILIES | FABRIC_FAMILIES)
    calls = node.nvml.calls
    assert calls["nvmlDeviceGetFieldValues"] == 3 * 2  # one per GPU per cycle
    assert calls["nvmlDeviceGetGpuFabricInfoV"] == 2  # NOT_SUPPORTED: asked once per GPU
    # Every link index refused its state on the first cycle: never asked again.
    assert calls["nvmlDeviceGetNvLinkState"] == 2 * pynvml.NVML_NVLINK_MAX_LINKS


# --- which links: every index NVML answers a state for -----------------------------------------------


class _NoLink3(FakeNvml):
    """A GPU whose link 3 is absent (NVML refuses its state), links above it present."""

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        if link == 3:
            self.calls["nvmlDeviceGetNvLinkState"] += 1
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return super().nvmlDeviceGetNvLinkState(handle, link)


def test_links_are_the_indices_nvml_answers_for_not_0_to_the_count(nodes: list[Node]) -> None:
    node = make(nodes, scenario("gb200"), _NoLink3)
    gpu = node.gpu()
    assert set(values(gpu, cat.GPU_NVLINK_LINK_UP.name)) == {(("link", str(n)),) for n in range(LINKS) if n != 3}
    assert not values(gpu, cat.GPU_NVLINK_LINK_BYTES.name, link="3")
    # Found once, on the first cycle: every index up to the binding's maximum, never again.
    asked = node.nvml.calls["nvmlDeviceGetNvLinkState"]
    assert asked == pynvml.NVML_NVLINK_MAX_LINKS
    node.gpu(after=5)
    assert node.nvml.calls["nvmlDeviceGetNvLinkState"] == asked


# --- one batched call, NOT_SUPPORTED dropped once ---------------------------------------------------


class _RecordingFake(FakeNvml):
    requests: list[list[Any]]

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: Any) -> Any:
        self.__dict__.setdefault("requests", []).append(list(field_ids))
        return super().nvmlDeviceGetFieldValues(handle, field_ids)


def test_link_entries_ride_in_one_call_and_refused_ones_are_dropped_once(nodes: list[Node]) -> None:
    node = make(nodes, scenario("gb200"), _RecordingFake)
    for after in (0, 5, 5, 5):
        node.collect(after)
    assert node.nvml.calls["nvmlDeviceGetFieldValues"] == 4
    first, second, third, fourth = node.nvml.requests  # type: ignore[attr-defined]
    hopper_only = (pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, 4)
    assert hopper_only in first  # asked once: Blackwell answers NOT_SUPPORTED
    assert hopper_only not in second and second == third == fourth
    assert (pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS, 17) in fourth
    assert (pynvml.NVML_FI_DEV_NVLINK_GET_STATE, 17) in fourth


# --- counters ---------------------------------------------------------------------------------------


def test_link_bytes_are_nvml_kib_times_1024_and_the_gpu_total_is_their_sum(nodes: list[Node]) -> None:
    node = make(nodes, scenario("h200-hgx", gpus=[{"index": 0, "nvlink": {"tx": 9e9, "rx": 3e9}}]))
    node.collect()
    gpu = node.gpu(after=30)
    for link in (0, 7, 17):
        kib = raw_field(node, 0, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link)
        assert one(gpu, cat.GPU_NVLINK_LINK_BYTES.name, link=str(link), direction="tx") == kib * 1024
    for direction in ("tx", "rx"):
        links = values(gpu, cat.GPU_NVLINK_LINK_BYTES.name, direction=direction)
        assert one(gpu, cat.GPU_NVLINK_BYTES.name, direction=direction) == pytest.approx(sum(links.values()))


def test_traffic_curves_spread_over_the_links_and_counters_only_grow(nodes: list[Node]) -> None:
    node = make(nodes, scenario("gb200", gpus=[{"index": 0, "nvlink": {"tx": 18e9, "rx": 36e9}}]))
    node.collect()
    before = node.gpu(after=1)
    after = node.gpu(after=10)
    for direction, rate in (("tx", 18e9), ("rx", 36e9)):
        grown = [after_v - values(before, cat.GPU_NVLINK_LINK_BYTES.name, direction=direction)[k]
                 for k, after_v in values(after, cat.GPU_NVLINK_LINK_BYTES.name, direction=direction).items()]
        assert len(grown) == LINKS
        assert all(g == pytest.approx(rate / LINKS * 10, abs=2048) for g in grown)  # KiB granularity


def test_gpm_nvlink_rates_are_the_links_traffic_in_mib_per_second() -> None:
    # nvml.h: NVML_GPM_METRIC_NVLINK_TOTAL_{RX,TX}_PER_SEC are MiB/s. The simulator must say what a real
    # GPU says, or the source's unit would be tested against the fake's mistake.
    clock = SimClock(100.0, frozen=True)
    fake = FakeNvml(scenario("gb200", gpus=[{"index": 0, "nvlink": {"tx": 18e9, "rx": 36e9}}]), clock)
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    first, second = fake.nvmlGpmSampleAlloc(), fake.nvmlGpmSampleAlloc()
    fake.nvmlGpmSampleGet(handle, first)
    clock.advance(10)
    fake.nvmlGpmSampleGet(handle, second)
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version, request.numMetrics = pynvml.NVML_GPM_METRICS_GET_VERSION, 2
    request.sample1, request.sample2 = first, second
    request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC
    request.metrics[1].metricId = pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC
    answer = fake.nvmlGpmMetricsGet(request)
    assert [answer.metrics[i].nvmlReturn for i in range(2)] == [pynvml.NVML_SUCCESS] * 2
    assert answer.metrics[0].value == pytest.approx(18e9 / 2**20)
    assert answer.metrics[1].value == pytest.approx(36e9 / 2**20)


class _GpmAsked(FakeNvml):
    asked: list[set[int]]

    def nvmlGpmMetricsGet(self, metrics_get: Any) -> Any:
        self.__dict__.setdefault("asked", []).append(
            {metrics_get.metrics[i].metricId for i in range(metrics_get.numMetrics)})
        return super().nvmlGpmMetricsGet(metrics_get)


def test_with_link_counters_gpm_is_not_asked_for_nvlink_rates(nodes: list[Node]) -> None:
    # The links' data counters count since the driver loaded and their sum is the GPU's traffic;
    # GPM's rates would only be integrated to be thrown away.
    node = make(nodes, scenario("gb200", gpus=[{"index": 0, "nvlink": {"tx": 18e9}}]), _GpmAsked)
    for after in (0, 5, 5, 5):
        gpu = node.gpu(after)
    rates = {pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC}
    asked: list[set[int]] = node.nvml.asked  # type: ignore[attr-defined]
    assert asked and all(ids and not ids & rates for ids in asked)
    links = values(gpu, cat.GPU_NVLINK_LINK_BYTES.name, direction="tx")
    assert one(gpu, cat.GPU_NVLINK_BYTES.name, direction="tx") == pytest.approx(sum(links.values()))
    assert cat.GPU_SM_ACTIVE.name in families(gpu)


def test_bulk_readings_are_the_constructors_readings() -> None:
    # bulk_readings sets Reading's slots itself: it is right only while __init__ does nothing else.
    labels = [(("link", str(n)), ("direction", "tx")) for n in range(3)]
    numbers = [1.0, 2048.0, 3e12]
    made = bulk_readings(cat.GPU_NVLINK_LINK_BYTES.name, numbers, labels)
    expected = [Reading(cat.GPU_NVLINK_LINK_BYTES.name, v, own) for v, own in zip(numbers, labels, strict=True)]
    assert made == expected and [hash(r) for r in made] == [hash(r) for r in expected]
    assert [type(r) for r in made] == [Reading] * 3 and bulk_readings("m", [], []) == []
    assert not hasattr(Reading, "__post_init__")
    assert Reading.__slots__ == tuple(f.name for f in dataclasses.fields(Reading))
    with pytest.raises(dataclasses.FrozenInstanceError):
        made[0].value = 0.0  # type: ignore[misc]


class _Wrapping32(FakeNvml):
    """Reports the throughput counters as 32-bit values, as an NVML that wraps them would."""

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: Any) -> Any:
        values = super().nvmlDeviceGetFieldValues(handle, field_ids)
        for v in values:
            if v.fieldId == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX and v.nvmlReturn == pynvml.NVML_SUCCESS:
                v.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                v.value.uiVal = v.value.ullVal % (1 << 32)
        return values


def test_a_32_bit_link_counter_keeps_growing_across_a_wrap(nodes: list[Node]) -> None:
    # 4 TiB/s over 18 links: each link's KiB counter passes 2^32 KiB (4 TiB) within a few cycles.
    node = make(nodes, scenario("gb200", gpus=[{"index": 0, "nvlink": {"tx": 900e9}}]), _Wrapping32)
    node.collect()
    seen = [one(node.gpu(after=60), cat.GPU_NVLINK_LINK_BYTES.name, link="0", direction="tx") for _ in range(30)]
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    assert seen[-1] - seen[0] == pytest.approx(900e9 / LINKS * 60 * 29, rel=1e-6)


class _UnsignedLong(FakeNvml):
    """Reports the throughput counters as C ``unsigned long`` values, one of the types NVML may answer in."""

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: Any) -> Any:
        values = super().nvmlDeviceGetFieldValues(handle, field_ids)
        for v in values:
            if v.fieldId == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX and v.nvmlReturn == pynvml.NVML_SUCCESS:
                v.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG
                v.value.ulVal = v.value.ullVal
        return values


def test_an_unsigned_long_value_is_read_in_all_its_bytes(nodes: list[Node]) -> None:
    # C's unsigned long is 8 bytes on 64-bit Linux; read as 4 (struct's standard "=L"), a link's
    # counter would drop back to 0 every 4 Ti KiB.
    node = make(nodes, scenario("gb200", gpus=[{"index": 0, "nvlink": {"tx": 900e9}}]), _UnsignedLong)
    gpu = node.gpu(after=200)
    kib = raw_field(node, 0, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0)
    assert kib > 1 << 32
    assert one(gpu, cat.GPU_NVLINK_LINK_BYTES.name, link="0", direction="tx") == kib * 1024


class _OneLinkAnswersBadly(FakeNvml):
    """Link 5's TX counter answers ``answer`` (an error code, or ``"ulong"``: its value as another type) while set."""

    answer: int | str | None = None

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: Any) -> Any:
        values = super().nvmlDeviceGetFieldValues(handle, field_ids)
        for v in values:
            if (v.fieldId, v.scopeId) == (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 5) and self.answer is not None:
                if self.answer == "ulong":
                    v.valueType, v.value.ulVal = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG, v.value.ullVal
                else:
                    v.nvmlReturn = self.answer
        return values


def test_an_error_on_one_link_counter_costs_that_reading_only(nodes: list[Node]) -> None:
    # The 18 links' TX counters are read as one group; one link answering an error (or a value of
    # another type) must not cost the other 17 links, the device, or that link once it answers again.
    node = make(nodes, scenario("gb200", gpus=[{"index": 0, "nvlink": {"tx": 18e9}}]), _OneLinkAnswersBadly)
    nvml: _OneLinkAnswersBadly = node.nvml  # type: ignore[assignment]
    node.collect()
    seen: list[dict[tuple[tuple[str, str], ...], float]] = []
    for answer in (None, pynvml.NVML_ERROR_UNKNOWN, "ulong", None):
        nvml.answer = answer
        gpu = node.gpu(after=10)
        assert gpu.up
        seen.append(values(gpu, cat.GPU_NVLINK_LINK_BYTES.name, direction="tx"))
    link5 = (("link", "5"), ("direction", "tx"))
    assert [link5 in links for links in seen] == [True, False, True, True]
    for before, after in zip(seen, seen[1:], strict=False):
        assert len(after) >= LINKS - 1
        for key, value in after.items():
            if key != link5:
                assert value - before[key] == pytest.approx(18e9 / LINKS * 10, abs=2048), key
    assert seen[2][link5] - seen[0][link5] == pytest.approx(18e9 / LINKS * 20, abs=2048)
    assert seen[3][link5] - seen[0][link5] == pytest.approx(18e9 / LINKS * 30, abs=2048)


# --- faults: a link going down, errors, the fabric --------------------------------------------------


def test_a_link_going_down_reads_0_stops_counting_and_counts_a_recovery(nodes: list[Node]) -> None:
    faults = [{"kind": "nvlink_link_down", "gpu": 0, "link": 5, "at": 110, "until": 130}]
    node = make(nodes, scenario("gb200", gpus=[{"index": 0, "nvlink": {"tx": 17e9}}], faults=faults))
    node.collect()
    healthy = node.gpu(after=5)  # t=105
    down = node.gpu(after=10)  # t=115
    later = node.gpu(after=10)  # t=125
    back = node.gpu(after=10)  # t=135
    assert one(down, cat.GPU_NVLINK_LINK_UP.name, link="5") == 0.0
    assert one(down, cat.GPU_NVLINK_LINK_UP.name, link="4") == 1.0
    assert one(down, cat.GPU_NVLINK_LINK_SPEED.name, link="5") == 0.0
    tx = [one(s, cat.GPU_NVLINK_LINK_BYTES.name, link="5", direction="tx") for s in (down, later)]
    assert tx[0] == tx[1]  # no traffic on a down link
    other = [one(s, cat.GPU_NVLINK_LINK_BYTES.name, link="4", direction="tx") for s in (down, later)]
    assert other[1] - other[0] == pytest.approx(17e9 / 17 * 10, abs=2048)  # the other 17 carry it all
    assert one(later, cat.GPU_NVLINK_LINK_RECOVERIES.name, link="5", result="failed") == 1.0
    assert one(back, cat.GPU_NVLINK_LINK_UP.name, link="5") == 1.0
    assert one(back, cat.GPU_NVLINK_LINK_RECOVERIES.name, link="5", result="successful") == 1.0
    assert one(back, cat.GPU_NVLINK_LINK_BYTES.name, link="5", direction="tx") > tx[1]
    # The down link's counters stayed in the batch: still there after it came back.
    errors = cat.GPU_NVLINK_LINK_ERRORS.name
    assert values(back, errors, link="5") == values(healthy, errors, link="5")


def test_a_down_link_on_hopper_counts_in_the_recovery_error_counter(nodes: list[Node]) -> None:
    faults = [{"kind": "nvlink_link_down", "gpu": 0, "link": 2, "at": 110, "until": 130}]
    node = make(nodes, scenario("h200-hgx", faults=faults))
    node.collect()
    assert one(node.gpu(after=5), cat.GPU_NVLINK_LINK_ERRORS.name, link="2", type="recovery") == 0.0
    assert one(node.gpu(after=10), cat.GPU_NVLINK_LINK_ERRORS.name, link="2", type="recovery") == 1.0


@pytest.mark.parametrize(("gpu_model", "kind"), [("h200-hgx", "crc_flit"), ("h200-hgx", "crc_data"),
                                                 ("gb200", "symbol"), ("gb200", "effective")])
def test_error_counters_count_per_generation(nodes: list[Node], gpu_model: str, kind: str) -> None:
    faults = [{"kind": "nvlink_errors", "gpu": 0, "link": 3, "rate": 2.5, "at": 100, "type": kind}]
    node = make(nodes, scenario(gpu_model, faults=faults))
    node.collect()
    gpu = node.gpu(after=20)
    assert one(gpu, cat.GPU_NVLINK_LINK_ERRORS.name, link="3", type=kind) == 50.0
    others = {k: v for k, v in values(gpu, cat.GPU_NVLINK_LINK_ERRORS.name).items()
              if k != (("link", "3"), ("type", kind))}
    assert others and set(others.values()) == {0.0}


def test_unhealthy_fabric_sets_the_summary_and_route_unhealthy(nodes: list[Node]) -> None:
    node = make(nodes, scenario("gb200", faults=[{"kind": "fabric_unhealthy", "gpu": 0, "at": 110}]))
    assert one(node.gpu(), cat.GPU_FABRIC_HEALTH.name, summary="healthy") == 1.0
    gpu = node.gpu(after=20)
    assert one(gpu, cat.GPU_FABRIC_HEALTH.name, summary="unhealthy") == 1.0
    assert one(gpu, cat.GPU_FABRIC_HEALTH.name, summary="healthy") == 0.0
    assert one(gpu, cat.GPU_FABRIC_HEALTH_PROBLEM.name, field="route_unhealthy") == 1.0
    assert one(gpu, cat.GPU_FABRIC_HEALTH_PROBLEM.name, field="degraded_bw") == 0.0
    assert one(gpu, cat.GPU_FABRIC_REGISTERED.name) == 1.0  # still registered: unhealthy is not unregistered


def test_a_fabric_that_turns_unhealthy_and_heals_reads_so_each_cycle(nodes: list[Node]) -> None:
    # An unchanged answer gives last cycle's readings again: each change, and the change back, must show.
    faults = [{"kind": "fabric_unhealthy", "gpu": 0, "at": 110, "until": 130}]
    node = make(nodes, scenario("gb200", faults=faults))
    seen = [one(node.gpu(after), cat.GPU_FABRIC_HEALTH.name, summary="unhealthy") for after in (0, 5, 10, 5, 10, 5, 5)]
    assert seen == [0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0]  # t=100, 105, 115, 120, 130, 135, 140


def test_fabric_in_progress_has_no_clique_and_is_not_registered(nodes: list[Node],
                                                                caplog: pytest.LogCaptureFixture) -> None:
    node = make(nodes, scenario("gb200", faults=[{"kind": "fabric_in_progress", "at": 0, "until": 120}]))
    with caplog.at_level(logging.WARNING):
        gpu = node.gpu()
    assert one(gpu, cat.GPU_FABRIC_STATE.name, state="in_progress") == 1.0
    assert one(gpu, cat.GPU_FABRIC_STATE.name, state="completed") == 0.0
    assert one(gpu, cat.GPU_FABRIC_REGISTERED.name) == 0.0
    assert one(gpu, cat.GPU_FABRIC_INFO.name, clique="", cluster_uuid="", clique_id="") == 1.0
    assert gpu.up and not caplog.records  # registering is no failure
    done = node.gpu(after=30)
    assert one(done, cat.GPU_FABRIC_INFO.name, clique=f"{GB200_CLUSTER}.32766", cluster_uuid=GB200_CLUSTER,
               clique_id="32766") == 1.0


class _FailedRegistration(FakeNvml):
    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info: Any) -> int:
        super().nvmlDeviceGetGpuFabricInfoV(handle, info)
        info._obj.status = pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
        return pynvml.NVML_SUCCESS


def test_a_failed_registration_is_logged_once_with_its_status(nodes: list[Node],
                                                              caplog: pytest.LogCaptureFixture) -> None:
    node = make(nodes, scenario("gb200"), _FailedRegistration)
    with caplog.at_level(logging.WARNING):
        for after in (0, 5, 5):
            gpu = node.gpu(after)
    assert one(gpu, cat.GPU_FABRIC_REGISTERED.name) == 0.0
    assert one(gpu, cat.GPU_FABRIC_INFO.name, clique="", cluster_uuid=GB200_CLUSTER, clique_id="32766") == 1.0
    assert [r.getMessage() for r in caplog.records] == [
        f"nvml: GPU {gpu.device.uuid} fabric registration failed: insufficient_resources"]


class _NoFabricV(FakeNvml):
    """A driver before ``nvmlDeviceGetGpuFabricInfoV``: the symbol is missing."""

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info: Any) -> int:
        self.calls["nvmlDeviceGetGpuFabricInfoV"] += 1
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


def test_without_the_v_function_the_v1_call_gives_state_and_clique(nodes: list[Node]) -> None:
    node = make(nodes, scenario("gb200"), _NoFabricV)
    for after in (0, 5, 5):
        gpu = node.gpu(after)
    assert one(gpu, cat.GPU_FABRIC_INFO.name, clique=f"{GB200_CLUSTER}.32766", cluster_uuid=GB200_CLUSTER,
               clique_id="32766") == 1.0
    assert one(gpu, cat.GPU_FABRIC_STATE.name, state="completed") == 1.0
    assert one(gpu, cat.GPU_FABRIC_REGISTERED.name) == 1.0
    # v1 has no health
    assert not families(gpu) & {cat.GPU_FABRIC_HEALTH.name, cat.GPU_FABRIC_HEALTH_PROBLEM.name}
    assert node.nvml.calls["nvmlDeviceGetGpuFabricInfoV"] == 1
    assert node.nvml.calls["nvmlDeviceGetGpuFabricInfo"] == 3


def test_a_v2_only_driver_gives_the_health_mask_without_the_summary(nodes: list[Node]) -> None:
    class V2Only(FakeNvml):
        def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info: Any) -> int:
            if info._obj.version != pynvml.nvmlGpuFabricInfo_v2:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
            return super().nvmlDeviceGetGpuFabricInfoV(handle, info)

    gpu = make(nodes, scenario("gb200"), V2Only).gpu()
    assert cat.GPU_FABRIC_HEALTH.name not in families(gpu)
    assert one(gpu, cat.GPU_FABRIC_HEALTH_PROBLEM.name, field="gfm_state") == 0.0


def test_the_fake_fills_the_structs_callers_pass_by_reference() -> None:
    clock = SimClock(0.0, frozen=True)
    fake = FakeNvml(scenario("gb200"), clock)
    fake.nvmlInit()
    info = pynvml.c_nvmlGpuFabricInfo_v3_t()
    fake.nvmlDeviceGetGpuFabricInfoV(fake.nvmlDeviceGetHandleByIndex(0), ctypes.byref(info))
    assert bytes(info.clusterUuid).hex() == GB200_CLUSTER.replace("-", "")
    assert (info.state, info.status, info.cliqueId) == (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, 0, 32766)


# --- labels through the join ------------------------------------------------------------------------


def test_link_identity_carries_no_attribution_and_counters_carry_it(nodes: list[Node]) -> None:
    node = make(nodes, scenario("gb200"))
    node.collect()
    frame = join(JoinInput(devices=(node.collect(after=5),)))
    for name in (cat.GPU_NVLINK_LINK_INFO.name, cat.GPU_NVLINK_LINK_SPEED.name, cat.GPU_FABRIC_INFO.name,
                 cat.GPU_FABRIC_STATE.name, cat.GPU_NVLINK_LINK_UP.name, cat.GPU_NVLINK_LINK_BYTES.name,
                 cat.GPU_NVLINK_LINK_ERRORS.name):
        family = frame.family(name)
        assert family is not None, name
        assert all(tuple(k for k, _ in s.labels) == cat.spec(name).labels for s in family.samples), name


# --- the scenario format ----------------------------------------------------------------------------


@pytest.mark.parametrize(("doc", "message"), [
    ({"gpu_model": "h200", "gpus": [{"index": 0, "nvlink": {"tx": 1e9}}]}, "has no NVLink"),
    ({"gpu_model": "gb200", "gpus": [{"index": 0, "nvlink": {"tx": 1e15}}]}, "must be between 0 and"),
    ({"gpu_model": "gb200", "gpus": [{"index": 0, "nvlink": {"up": 1}}]}, "up"),
    ({"gpu_model": "gb200", "gpus": [{"index": 0}],
      "faults": [{"kind": "nvlink_link_down", "gpu": 0, "link": 18, "at": 0}]}, "NVLinks 0..17"),
    ({"gpu_model": "h200-hgx", "gpus": [{"index": 0}],
      "faults": [{"kind": "nvlink_errors", "gpu": 0, "link": 1, "rate": 1, "at": 0, "type": "symbol"}]},
     "'symbol' is not one of crc_flit"),
    ({"gpu_model": "h200", "gpus": [{"index": 0}], "faults": [{"kind": "fabric_unhealthy", "at": 0}]},
     "no fabric info"),
])
def test_bad_nvlink_scenarios_are_refused_with_the_field(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse_scenario({"node": "n", **doc}, "bad.yaml")


# --- --naming dcgm ----------------------------------------------------------------------------------


def dcgm(node: Node, after: float) -> dict[str, dict[str, float]]:
    """DCGM family -> UUID -> value, under ``--naming dcgm``; and the native families kept."""
    frame = naming.apply(join(JoinInput(devices=(node.collect(after=after),))), "dcgm", hostname="node-a")
    out: dict[str, dict[str, float]] = {f.name: {} for f in frame.families}
    for family in frame.families:
        for s in family.samples:
            labels = dict(s.labels)
            out[family.name][labels.get("UUID") or labels.get("uuid", "")] = s.value
    return out


def test_dcgm_nvlink_error_totals_sum_the_links_and_keep_the_native_detail(nodes: list[Node]) -> None:
    faults = [{"kind": "nvlink_errors", "gpu": 0, "link": link, "rate": 1, "at": 100, "type": kind}
              for link, kind in ((1, "crc_flit"), (2, "crc_flit"), (3, "replay"), (4, "crc_data"))]
    node = make(nodes, scenario("h200-hgx", faults=faults))
    node.collect()
    got = dcgm(node, after=10)
    uuid = node.nvml.scenario.gpus[0].uuid
    assert got["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"][uuid] == 20.0
    assert got["DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"][uuid] == 10.0
    assert got["DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"][uuid] == 10.0
    assert got["DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"][uuid] == 0.0
    # Hopper has no recovery events; an HGX board reports no health-mask field.
    kept = ((NVLINK_FAMILIES - {cat.GPU_NVLINK_LINK_RECOVERIES.name})
            | (FABRIC_FAMILIES - {cat.GPU_FABRIC_HEALTH_PROBLEM.name}))
    assert kept <= set(got)


@pytest.mark.parametrize(("faults", "fake", "status", "clique", "summary"), [
    ([], FakeNvml, 3.0, 32766.0, 1.0),
    ([{"kind": "fabric_in_progress", "at": 0}], FakeNvml, 2.0, None, 1.0),
    ([{"kind": "fabric_unhealthy", "at": 0}], FakeNvml, 3.0, 32766.0, 2.0),
    ([], _FailedRegistration, 4.0, 32766.0, 1.0),
])
def test_dcgm_fabric_fields_are_dcgms_numbers(nodes: list[Node], faults: list[dict[str, Any]],
                                              fake: type[FakeNvml], status: float, clique: float | None,
                                              summary: float) -> None:
    node = make(nodes, scenario("gb200", faults=faults), fake)
    got = dcgm(node, after=0)
    uuid = node.nvml.scenario.gpus[0].uuid
    assert got["DCGM_FI_DEV_FABRIC_MANAGER_STATUS"] == {uuid: status}
    assert got.get("DCGM_FI_DEV_FABRIC_CLIQUE_ID", {}).get(uuid) == clique
    assert got["DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY"] == {uuid: summary}
