"""The attribution rules of DESIGN §3, on hand-built snapshots (no sockets, no threads)."""

from __future__ import annotations

from dra_exporter import catalog as cat
from dra_exporter.join import JoinInput, join
from dra_exporter.model import (
    ClaimDevice,
    ClaimUse,
    ContainerAllocation,
    DeviceSample,
    Frame,
    GpuDevice,
    NvmlSnapshot,
    PluginDevices,
    PodAllocation,
    PodResourcesSnapshot,
    Reading,
    SourceHealth,
)

NODE = "node-a"
DRV = "gpu.nvidia.com"


def gpu(i: int, mig_mode: str = "disabled") -> GpuDevice:
    return GpuDevice(f"GPU-{i}", i, i, "NVIDIA H200", f"00000000:{i:02x}:00.0", "580.159.04", mig_mode)


def mig(parent: int, gi_profile: int, start: int, size: int, profile: str, gi: int) -> GpuDevice:
    return GpuDevice(f"MIG-{parent}-{start}", parent, parent, "NVIDIA H200", f"00000000:{parent:02x}:00.0",
                     "580.159.04", "", f"GPU-{parent}", profile, gi, 0, gi_profile, start, size)


def sample(dev: GpuDevice, used: float = 1.0, up: bool = True) -> DeviceSample:
    readings = (Reading(cat.GPU_MEMORY_USED, used), Reading(cat.GPU_CLOCK, 1.4e9, (("clock", "sm"),)))
    return DeviceSample(dev, up, readings if up else ())


def claim(ns: str, name: str, *devices: str, uid: str = "") -> ClaimUse:
    return ClaimUse(ns, name, tuple(
        ClaimDevice(DRV, NODE, d, (f"k8s.gpu.nvidia.com/claim={uid}-{d}",) if uid else ()) for d in devices))


def pod(ns: str, name: str, *containers: ContainerAllocation) -> PodAllocation:
    return PodAllocation(ns, name, containers)


def ctr(name: str, *claims: ClaimUse, plugin: tuple[PluginDevices, ...] = ()) -> ContainerAllocation:
    return ContainerAllocation(name, claims, plugin)


def run(devices: list[DeviceSample], pods: list[PodAllocation], **kw: object) -> Frame:
    return join(JoinInput(NvmlSnapshot(tuple(devices)), PodResourcesSnapshot(tuple(pods)), **kw))  # type: ignore[arg-type]


def series(frame: Frame, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    fam = frame.family(name)
    return {s.labels: s.value for s in fam.samples} if fam else {}


def attribution(frame: Frame, uuid: str, name: str = cat.GPU_MEMORY_USED) -> dict[str, str]:
    found = [dict(lbl) for lbl in series(frame, name) if dict(lbl)["uuid"] == uuid]
    assert len(found) == 1, f"expected exactly one {name} series for {uuid}, got {found}"
    return {k: found[0][k] for k in cat.ATTRIBUTION_LABELS}


EMPTY = {"namespace": "", "pod": "", "container": "", "claim": ""}


def test_unallocated_device_reports_with_empty_attribution() -> None:
    frame = run([sample(gpu(0), 5.0)], [])
    assert attribution(frame, "GPU-0") == EMPTY
    assert list(series(frame, cat.GPU_MEMORY_USED).values()) == [5.0]


def test_single_pod_claim_carries_claim_pod_container() -> None:
    frame = run([sample(gpu(0)), sample(gpu(1))],
                [pod("ml", "train-0", ctr("trainer", claim("ml", "gpus", "gpu-0", "gpu-1")))])
    want = {"namespace": "ml", "pod": "train-0", "container": "trainer", "claim": "gpus"}
    assert attribution(frame, "GPU-0") == want
    assert attribution(frame, "GPU-1") == want


def test_two_containers_of_one_pod_leave_container_empty() -> None:
    c = claim("ml", "gpus", "gpu-0")
    frame = run([sample(gpu(0))], [pod("ml", "p", ctr("a", c), ctr("b", c))])
    assert attribution(frame, "GPU-0") == {"namespace": "ml", "pod": "p", "container": "", "claim": "gpus"}


def test_shared_claim_keeps_one_series_and_lists_every_consumer() -> None:
    c = claim("research", "shared", "gpu-0")
    frame = run([sample(gpu(0), 42.0)],
                [pod("research", "alice", ctr("nb", c)), pod("research", "bob", ctr("nb", c))])
    values = series(frame, cat.GPU_MEMORY_USED)
    assert list(values.values()) == [42.0], "device value must not be copied per pod"
    assert attribution(frame, "GPU-0") == {"namespace": "research", "pod": "", "container": "", "claim": "shared"}
    consumers = {(d["pod"], d["container"]) for d in map(dict, series(frame, cat.CLAIM_CONSUMER_INFO))}
    assert consumers == {("alice", "nb"), ("bob", "nb")}


def test_mig_devices_resolve_in_both_name_formats_and_parent_stays_unattributed() -> None:
    parent = gpu(4, "enabled")
    a = mig(4, 9, 0, 4, "3g.71gb", 1)
    b = mig(4, 9, 4, 4, "3g.71gb", 2)
    frame = run([sample(parent), sample(a), sample(b)], [
        pod("inf", "new-fmt", ctr("c", claim("inf", "c1", "gpu-4-mig-3g71gb-9-0"))),
        pod("inf", "old-fmt", ctr("c", claim("inf", "c2", "gpu-4-mig-9-4-4"))),
    ])
    assert attribution(frame, a.uuid)["pod"] == "new-fmt"
    assert attribution(frame, b.uuid)["pod"] == "old-fmt"
    assert attribution(frame, parent.uuid) == EMPTY
    info = {dict(lbl)["uuid"]: dict(lbl) for lbl in series(frame, cat.GPU_INFO)}
    assert info[a.uuid]["profile"] == "3g.71gb" and info[a.uuid]["parent_uuid"] == "GPU-4"
    assert info[b.uuid]["gpu_instance_id"] == "2" and info[b.uuid]["compute_instance_id"] == "0"


def test_device_plugin_gpus_by_uuid_index_and_replica() -> None:
    frame = run([sample(gpu(0)), sample(gpu(1)), sample(gpu(2))], [
        pod("legacy", "by-uuid", ctr("c", plugin=(PluginDevices("nvidia.com/gpu", ("GPU-0",)),))),
        pod("legacy", "by-index", ctr("c", plugin=(PluginDevices("nvidia.com/gpu", ("1",)),))),
        pod("legacy", "replica", ctr("c", plugin=(PluginDevices("nvidia.com/gpu", ("GPU-2::3",)),))),
        pod("legacy", "other", ctr("c", plugin=(PluginDevices("example.com/fpga", ("GPU-2",)),))),
    ])
    assert attribution(frame, "GPU-0") == {"namespace": "legacy", "pod": "by-uuid", "container": "c", "claim": ""}
    assert attribution(frame, "GPU-1")["pod"] == "by-index"
    assert attribution(frame, "GPU-2")["pod"] == "replica"


def test_monitoring_claims_of_the_exporter_pod_are_not_consumers() -> None:
    frame = run([sample(gpu(0))], [
        pod("ml", "train", ctr("t", claim("ml", "gpus", "gpu-0"))),
        pod("monitoring", "dra-exporter-x", ctr("exporter", claim("monitoring", "all", "gpu-0"))),
    ], self_pod=("monitoring", "dra-exporter-x"))
    assert attribution(frame, "GPU-0")["pod"] == "train"
    alloc = {(d["claim"], d["admin_access"]) for d in map(dict, series(frame, cat.CLAIM_ALLOCATION_INFO))}
    assert alloc == {("gpus", "false"), ("all", "true")}
    assert {dict(lbl)["pod"] for lbl in series(frame, cat.CLAIM_CONSUMER_INFO)} == {"train"}


def test_unknown_driver_keeps_its_triplet_without_uuid() -> None:
    other = ClaimUse("ns", "fpga", (ClaimDevice("fpga.example.com", "pool-1", "fpga-0"),))
    frame = run([sample(gpu(0))], [pod("ns", "p", ctr("c", other))])
    (alloc,) = map(dict, series(frame, cat.CLAIM_ALLOCATION_INFO))
    assert (alloc["driver"], alloc["pool"], alloc["device"], alloc["uuid"]) == (
        "fpga.example.com", "pool-1", "fpga-0", "")
    assert attribution(frame, "GPU-0") == EMPTY


def test_claim_uid_comes_from_the_cdi_name_of_that_device() -> None:
    uid = "0b9f7c1e-2d3a-4f5b-8c6d-7e8f9a0b1c2d"
    devs = claim("ml", "gpus", "gpu-0", "gpu-1", uid=uid).devices
    # The kubelet quirk: the second device also carries the first device's CDI name.
    quirky = ClaimUse("ml", "gpus", (devs[0], ClaimDevice(DRV, NODE, "gpu-1", devs[0].cdi_devices + devs[1].cdi_devices)))
    frame = run([sample(gpu(0)), sample(gpu(1))], [pod("ml", "p", ctr("c", quirky))])
    uids = {d["device"]: d["claim_uid"] for d in map(dict, series(frame, cat.CLAIM_ALLOCATION_INFO))}
    assert uids == {"gpu-0": uid, "gpu-1": uid}


def test_pod_that_ended_leaves_the_next_frame() -> None:
    p = pod("ml", "short", ctr("c", claim("ml", "gpus", "gpu-0")))
    assert attribution(run([sample(gpu(0))], [p]), "GPU-0")["pod"] == "short"
    later = run([sample(gpu(0))], [])
    assert attribution(later, "GPU-0") == EMPTY
    assert not series(later, cat.CLAIM_CONSUMER_INFO) and not series(later, cat.CLAIM_ALLOCATION_INFO)


def test_failed_device_reports_down_and_others_keep_their_values() -> None:
    frame = run([sample(gpu(0), 7.0), sample(gpu(1), up=False)], [])
    up = {dict(lbl)["uuid"]: v for lbl, v in series(frame, cat.GPU_UP).items()}
    assert up == {"GPU-0": 1.0, "GPU-1": 0.0}
    assert [dict(lbl)["uuid"] for lbl in series(frame, cat.GPU_MEMORY_USED)] == ["GPU-0"]
    assert {dict(lbl)["uuid"] for lbl in series(frame, cat.GPU_INFO)} == {"GPU-0", "GPU-1"}


def test_labels_follow_the_catalogue_order_and_output_is_sorted() -> None:
    frame = run([sample(gpu(1)), sample(gpu(0))], [], health=(SourceHealth("nvml", True, 0.01, 0, 5.0),))
    for fam in frame.families:
        spec = cat.spec(fam.name)
        for s in fam.samples:
            assert tuple(k for k, _ in s.labels) == spec.labels, fam.name
        assert list(fam.samples) == sorted(fam.samples, key=lambda s: s.labels)
    order = [spec.name for spec in cat.CATALOG]
    names = [f.name for f in frame.families]
    assert names == sorted(names, key=order.index)


def test_self_metrics_reflect_source_health() -> None:
    frame = run([], [], health=(SourceHealth("nvml", True, 0.02, 0, 100.0),
                                SourceHealth("podresources", False, 2.0, 3, 90.0)))
    up = {dict(lbl)["source"]: v for lbl, v in series(frame, cat.SOURCE_UP).items()}
    errors = {dict(lbl)["source"]: v for lbl, v in series(frame, cat.COLLECT_ERRORS).items()}
    assert up == {"nvml": 1.0, "podresources": 0.0}
    assert errors == {"nvml": 0.0, "podresources": 3.0}
