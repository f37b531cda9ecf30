"""The catalogue is the one definition of each family: frames, sources and sinks follow it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from simnode import SCENARIOS, simulated
from test_orphans import orphan_frame

from dra_exporter import catalog as cat
from dra_exporter.join import JoinInput, join
from dra_exporter.model import (
    AllocationResult,
    ClaimDeviceStatus,
    ClaimInfo,
    ClaimUse,
    ClusterSnapshot,
    ContainerAllocation,
    ContainerClaim,
    ContainerInfo,
    CounterConsumption,
    CounterSet,
    DeviceHealth,
    DeviceSample,
    DeviceSnapshot,
    DeviceToleration,
    Frame,
    GpuDevice,
    NetworkDeviceData,
    PodAllocation,
    PodInfo,
    PodResourcesSnapshot,
    Reading,
    ResourceSliceInfo,
    SliceDevice,
)
from dra_exporter.sinks import otlp_mapping
from dra_exporter.sources import nvml

DRIVER = "gpu.nvidia.com"


def scenario_frames(scenario: str, **settings: object) -> Iterator[Frame]:
    """Frames of the whole exporter on a simulated node, a few simulated minutes apart."""
    with simulated(scenario, sim_time=60.0, **settings) as rt:
        for step in (0.0, 1.0, 60.0, 300.0):
            rt.sim.clock.advance(step)
            yield rt.agent.cycle(collect_side=True)


def cluster_frame() -> Frame:
    """What the scenarios do not have: tolerations, consumable capacity, network data, device
    health and shared counters, as the API server reports them."""
    gpu = SliceDevice("gpu-0", attributes=(("uuid", "GPU-0"),),
                      consumes_counters=(CounterConsumption("gpu-0-counters", (("memory", 1.0),)),))
    slices = (ResourceSliceInfo("s", DRIVER, "node", node_name="node", devices=(gpu,),
                                shared_counters=(CounterSet("gpu-0-counters", (("memory", 8.0),)),)),)
    allocated = AllocationResult("gpu", DRIVER, "node", "gpu-0", share_id="a",
                                 tolerations=(DeviceToleration("k", "Exists"),),
                                 consumed_capacity=(("memory", 1.0),))
    status = ClaimDeviceStatus(DRIVER, "node", "gpu-0", network=NetworkDeviceData("eth1", "aa:bb", ("10.0.0.1/24",)))
    claims = (ClaimInfo("ml", "c", "uid-c", (allocated,), devices=(status,)),)
    health = DeviceHealth("c", "gpu", DRIVER, "node", "gpu-0", "Unhealthy")
    pods = (PodInfo("ml", "p", "uid-p", "Running", ("c",),
                    (ContainerInfo("ctr", "containerd://1", (ContainerClaim("c", "c"),), (health,)),)),)
    device = GpuDevice("GPU-0", 0, 0, "NVIDIA H200", "00000000:01:00.0")
    nvml_snapshot = DeviceSnapshot((DeviceSample(device, True, (Reading(cat.GPU_POWER.name, 100.0),)),))
    # A claim the kubelet lists with no devices: not prepared (dra_claim_not_prepared).
    unprepared = PodResourcesSnapshot((PodAllocation("ml", "q", (ContainerAllocation("c", (ClaimUse("ml", "l"),)),)),))
    return join(JoinInput(devices=(nvml_snapshot,), pods=unprepared,
                          cluster=ClusterSnapshot("node", "v1", slices, claims, pods)))


def cluster_mode_frame() -> Frame:
    """``dra-exporter cluster`` on its built-in simulated cluster (the dra_cluster_* families)."""
    from dra_exporter import runtime
    from dra_exporter.cluster.runtime import CLUSTER
    from dra_exporter.config import ClusterSettings

    return runtime.snapshot(ClusterSettings(simulate="cluster"), CLUSTER)


@pytest.fixture(scope="module")
def frames() -> list[Frame]:
    found = [cluster_frame(), cluster_mode_frame(), orphan_frame()]
    for scenario in ("demo", "scale", str(SCENARIOS / "faults.yaml")):
        found += scenario_frames(scenario)
    # NVLink per link, the fabric and ComputeDomains: the GB200 node with the degraded link.
    found += scenario_frames("gb200-domain", node_name="gb200-node-1")
    return found


def test_every_familys_labels_in_the_frames_are_its_definition_in_order(frames: list[Frame]) -> None:
    seen = set()
    for frame in frames:
        for family in frame.families:
            spec = cat.spec(family.name)
            seen.add(spec.name)
            for sample in family.samples:
                assert tuple(k for k, _ in sample.labels) == spec.labels, (family.name, sample.labels)
    # Every family is checked: a new one needs a frame here that has it.
    assert seen == {s.name for s in cat.CATALOG}, sorted({s.name for s in cat.CATALOG} - seen)


def test_series_takes_labels_by_name_in_the_familys_order() -> None:
    labels = cat.CLAIM_CONSUMER_INFO.series(container="c", pod="p", claim="cl", namespace="ns", pod_uid="u")
    assert labels == (("namespace", "ns"), ("claim", "cl"), ("pod", "p"), ("pod_uid", "u"), ("container", "c"))
    assert cat.DEVICE_TAINT.series(driver="d", pool="p", device="x", key="k", value="v", effect="e", rule="") \
        == (("driver", "d"), ("pool", "p"), ("device", "x"), ("key", "k"), ("value", "v"), ("effect", "e"),
            ("rule", ""))


def test_series_refuses_a_missing_or_an_unknown_label() -> None:
    with pytest.raises(cat.LabelError, match=r"dra_exporter_source_up: missing label\(s\) \['source'\]"):
        cat.SOURCE_UP.series()
    with pytest.raises(cat.LabelError, match=r"unknown label\(s\) \['node'\]"):
        cat.SOURCE_UP.series(source="nvml", node="n")
    with pytest.raises(cat.LabelError, match=r"missing label\(s\) \['source'\], unknown label\(s\) \['src'\]"):
        cat.SOURCE_UP.series(src="nvml")


@pytest.mark.parametrize("key, name", [("team", "label_team"), ("cost-center", "label_cost_center"),
                                       ("app.kubernetes.io/name", "label_app_kubernetes_io_name"),
                                       ("Team_1", "label_Team_1")])
def test_a_pod_label_is_named_as_kube_state_metrics_names_it(key: str, name: str) -> None:
    assert cat.pod_label_name(key) == name


def test_pod_labels_follow_a_familys_own_and_only_where_it_declares_them() -> None:
    allow = cat.PodLabels(("team", "cost-center"))
    assert allow.names == ("label_cost_center", "label_team")
    own = cat.CLAIM_CONSUMER_INFO.series(namespace="ns", claim="c", pod="p", pod_uid="u", container="x")
    pairs = allow.pairs({"team": "ml", "other": "dropped"})
    assert cat.CLAIM_CONSUMER_INFO.with_pod_labels(own, pairs) == own + (("label_cost_center", ""),
                                                                          ("label_team", "ml"))
    assert cat.CLAIM_CONSUMER_INFO.with_pod_labels(own, ()) == own
    with pytest.raises(cat.LabelError, match="carries no pod labels"):
        cat.SOURCE_UP.with_pod_labels(cat.SOURCE_UP.series(source="nvml"), pairs)
    for bad in ("team", "label_a.b", "label_"):
        with pytest.raises(cat.LabelError, match="not a pod label"):
            cat.CLAIM_CONSUMER_INFO.with_pod_labels(own, ((bad, "x"),))
    assert [s.name for s in cat.CATALOG if s.pod_labels] == [cat.CLAIM_CONSUMER_INFO.name]


def test_two_pod_labels_of_one_prometheus_name_are_refused() -> None:
    with pytest.raises(ValueError, match="'a.b' and 'a_b' are both the Prometheus label 'label_a_b'"):
        cat.PodLabels(("a.b", "a_b"))


def test_a_device_familys_own_labels_are_checked() -> None:
    device = cat.device_labels(uuid="GPU-0", gpu="0", profile="", parent_uuid="", namespace="", pod="",
                               pod_uid="", container="", claim="", request="")
    assert cat.GPU_CLOCK.device_series(device, cat.GPU_CLOCK.extra(clock="sm")) == device + (("clock", "sm"),)
    assert cat.GPU_UP.device_series(device, ()) == device
    with pytest.raises(cat.LabelError):
        cat.GPU_CLOCK.device_series(device, ())  # clock is missing
    with pytest.raises(cat.LabelError):
        cat.GPU_UP.device_series(device, (("clock", "sm"),))  # dra_gpu_up has no clock
    with pytest.raises(cat.LabelError):
        cat.GPU_CLOCK.extra(direction="tx")
    with pytest.raises(cat.LabelError, match="not a device family"):
        cat.SOURCE_UP.extra(source="nvml")


def test_the_join_refuses_a_reading_whose_labels_its_family_does_not_declare() -> None:
    device = GpuDevice("GPU-0", 0, 0, "NVIDIA H200", "00000000:01:00.0")
    for labels in ((), (("direction", "tx"),), (("clock", "sm"), ("direction", "tx"))):
        snapshot = DeviceSnapshot((DeviceSample(device, True, (Reading(cat.GPU_CLOCK.name, 1.4e9, labels),)),))
        with pytest.raises(cat.LabelError, match="dra_gpu_clock_hertz"):
            join(JoinInput(devices=(snapshot,)))


def test_nvml_fields_name_catalogue_families_and_their_labels() -> None:
    for const, field in nvml._FIELDS:
        assert field.family in cat.CATALOG, const
        assert tuple(k for k, _ in field.labels) == field.family.extra_labels, const


def test_units_are_the_name_suffix() -> None:
    for spec in cat.CATALOG:
        if spec.unit:
            assert spec.name.removesuffix("_total").endswith("_" + spec.unit), spec.name


def test_families_sharing_an_otlp_name_are_told_apart_by_constant_attributes() -> None:
    for instrument in otlp_mapping.instruments():
        constants = [spec.otlp.constant for spec in instrument.families if spec.otlp]
        assert len(set(constants)) == len(constants), instrument.name


@pytest.mark.parametrize("naming", list(cat.DCGM_NAMINGS))
def test_every_dcgm_form_converts_a_native_family_it_is_declared_on(naming: str) -> None:
    for source, form in cat.DCGM_NAMINGS[naming].forms:
        assert form in (source.dcgm if naming == "dcgm" or source.dcgm_410 is None else source.dcgm_410)
        for label, _ in form.select:
            assert label in source.labels, form.name
        assert not form.sum_over or form.sum_over in source.labels, form.name
