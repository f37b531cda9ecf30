"""The attribution rules of DESIGN §3, on hand-built snapshots (no sockets, no threads)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dra_exporter import catalog as cat
from dra_exporter.join import JoinInput, join
from dra_exporter.model import (
    AllocationResult,
    ClaimDevice,
    ClaimDeviceStatus,
    ClaimInfo,
    ClaimUse,
    ClusterSnapshot,
    ConsumerRef,
    ContainerAllocation,
    ContainerClaim,
    ContainerInfo,
    CounterConsumption,
    CounterSet,
    DeviceCondition,
    DeviceHealth,
    DeviceSample,
    DeviceSnapshot,
    DeviceTaint,
    DeviceTaintRule,
    DeviceToleration,
    Frame,
    GpuDevice,
    NetworkDeviceData,
    PluginDevices,
    PodAllocation,
    PodInfo,
    PodResourcesSnapshot,
    ProcessOwner,
    ProcessOwnersSnapshot,
    ProcessSample,
    Reading,
    ResourceSliceInfo,
    SliceDevice,
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
    readings = (Reading(cat.GPU_MEMORY_USED.name, used), Reading(cat.GPU_CLOCK.name, 1.4e9, (("clock", "sm"),)))
    return DeviceSample(dev, up, readings if up else ())


def claim(ns: str, name: str, *devices: str, uid: str = "") -> ClaimUse:
    return ClaimUse(ns, name, tuple(
        ClaimDevice(DRV, NODE, d, (f"k8s.gpu.nvidia.com/claim={uid}-{d}",) if uid else ()) for d in devices))


def pod(ns: str, name: str, *containers: ContainerAllocation) -> PodAllocation:
    return PodAllocation(ns, name, containers)


def ctr(name: str, *claims: ClaimUse, plugin: tuple[PluginDevices, ...] = ()) -> ContainerAllocation:
    return ContainerAllocation(name, claims, plugin)


def run(devices: list[DeviceSample], pods: list[PodAllocation], **kw: object) -> Frame:
    return join(JoinInput((DeviceSnapshot(tuple(devices)),), PodResourcesSnapshot(tuple(pods)), **kw))  # type: ignore[arg-type]


def series(frame: Frame, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    fam = frame.family(name)
    return {s.labels: s.value for s in fam.samples} if fam else {}


def attribution(frame: Frame, uuid: str, name: str = cat.GPU_MEMORY_USED.name) -> dict[str, str]:
    found = [dict(lbl) for lbl in series(frame, name) if dict(lbl)["uuid"] == uuid]
    assert len(found) == 1, f"expected exactly one {name} series for {uuid}, got {found}"
    return {k: found[0][k] for k in cat.ATTRIBUTION_LABELS}


EMPTY = dict.fromkeys(cat.ATTRIBUTION_LABELS, "")


def att(**values: str) -> dict[str, str]:
    """Attribution labels: the given values, every other label empty."""
    return {**EMPTY, **values}


def test_unallocated_device_reports_with_empty_attribution() -> None:
    frame = run([sample(gpu(0), 5.0)], [])
    assert attribution(frame, "GPU-0") == EMPTY
    assert list(series(frame, cat.GPU_MEMORY_USED.name).values()) == [5.0]


def test_single_pod_claim_carries_claim_pod_container() -> None:
    frame = run([sample(gpu(0)), sample(gpu(1))],
                [pod("ml", "train-0", ctr("trainer", claim("ml", "gpus", "gpu-0", "gpu-1")))])
    want = att(namespace="ml", pod="train-0", container="trainer", claim="gpus")
    assert attribution(frame, "GPU-0") == want
    assert attribution(frame, "GPU-1") == want


def test_two_containers_of_one_pod_leave_container_empty() -> None:
    c = claim("ml", "gpus", "gpu-0")
    frame = run([sample(gpu(0))], [pod("ml", "p", ctr("a", c), ctr("b", c))])
    assert attribution(frame, "GPU-0") == att(namespace="ml", pod="p", claim="gpus")


def test_shared_claim_keeps_one_series_and_lists_every_consumer() -> None:
    c = claim("research", "shared", "gpu-0")
    frame = run([sample(gpu(0), 42.0)],
                [pod("research", "alice", ctr("nb", c)), pod("research", "bob", ctr("nb", c))])
    values = series(frame, cat.GPU_MEMORY_USED.name)
    assert list(values.values()) == [42.0], "device value must not be copied per pod"
    assert attribution(frame, "GPU-0") == att(namespace="research", claim="shared")
    consumers = {(d["pod"], d["container"]) for d in map(dict, series(frame, cat.CLAIM_CONSUMER_INFO.name))}
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
    info = {dict(lbl)["uuid"]: dict(lbl) for lbl in series(frame, cat.GPU_INFO.name)}
    assert info[a.uuid]["profile"] == "3g.71gb" and info[a.uuid]["parent_uuid"] == "GPU-4"
    assert info[b.uuid]["gpu_instance_id"] == "2" and info[b.uuid]["compute_instance_id"] == "0"


def test_device_plugin_gpus_by_uuid_index_and_replica() -> None:
    frame = run([sample(gpu(0)), sample(gpu(1)), sample(gpu(2))], [
        pod("legacy", "by-uuid", ctr("c", plugin=(PluginDevices("nvidia.com/gpu", ("GPU-0",)),))),
        pod("legacy", "by-index", ctr("c", plugin=(PluginDevices("nvidia.com/gpu", ("1",)),))),
        pod("legacy", "replica", ctr("c", plugin=(PluginDevices("nvidia.com/gpu", ("GPU-2::3",)),))),
        pod("legacy", "other", ctr("c", plugin=(PluginDevices("example.com/fpga", ("GPU-2",)),))),
    ])
    assert attribution(frame, "GPU-0") == att(namespace="legacy", pod="by-uuid", container="c")
    assert attribution(frame, "GPU-1")["pod"] == "by-index"
    assert attribution(frame, "GPU-2")["pod"] == "replica"


def test_monitoring_claims_of_the_exporter_pod_are_not_consumers() -> None:
    frame = run([sample(gpu(0))], [
        pod("ml", "train", ctr("t", claim("ml", "gpus", "gpu-0"))),
        pod("monitoring", "dra-exporter-x", ctr("exporter", claim("monitoring", "all", "gpu-0"))),
    ], self_pod=("monitoring", "dra-exporter-x"))
    assert attribution(frame, "GPU-0")["pod"] == "train"
    alloc = {(d["claim"], d["admin_access"]) for d in map(dict, series(frame, cat.CLAIM_ALLOCATION_INFO.name))}
    assert alloc == {("gpus", "false"), ("all", "true")}
    assert {dict(lbl)["pod"] for lbl in series(frame, cat.CLAIM_CONSUMER_INFO.name)} == {"train"}


def test_unknown_driver_keeps_its_triplet_without_uuid() -> None:
    other = ClaimUse("ns", "fpga", (ClaimDevice("fpga.example.com", "pool-1", "fpga-0"),))
    frame = run([sample(gpu(0))], [pod("ns", "p", ctr("c", other))])
    (alloc,) = map(dict, series(frame, cat.CLAIM_ALLOCATION_INFO.name))
    assert (alloc["driver"], alloc["pool"], alloc["device"], alloc["uuid"]) == (
        "fpga.example.com", "pool-1", "fpga-0", "")
    assert attribution(frame, "GPU-0") == EMPTY


def test_claim_uid_comes_from_the_cdi_name_of_that_device() -> None:
    uid = "0b9f7c1e-2d3a-4f5b-8c6d-7e8f9a0b1c2d"
    devs = claim("ml", "gpus", "gpu-0", "gpu-1", uid=uid).devices
    # The kubelet quirk: the second device also carries the first device's CDI name.
    both_cdi = devs[0].cdi_devices + devs[1].cdi_devices
    quirky = ClaimUse("ml", "gpus", (devs[0], ClaimDevice(DRV, NODE, "gpu-1", both_cdi)))
    frame = run([sample(gpu(0)), sample(gpu(1))], [pod("ml", "p", ctr("c", quirky))])
    uids = {d["device"]: d["claim_uid"] for d in map(dict, series(frame, cat.CLAIM_ALLOCATION_INFO.name))}
    assert uids == {"gpu-0": uid, "gpu-1": uid}


def test_pod_that_ended_leaves_the_next_frame() -> None:
    p = pod("ml", "short", ctr("c", claim("ml", "gpus", "gpu-0")))
    assert attribution(run([sample(gpu(0))], [p]), "GPU-0")["pod"] == "short"
    later = run([sample(gpu(0))], [])
    assert attribution(later, "GPU-0") == EMPTY
    assert not series(later, cat.CLAIM_CONSUMER_INFO.name) and not series(later, cat.CLAIM_ALLOCATION_INFO.name)


def test_failed_device_reports_down_and_others_keep_their_values() -> None:
    frame = run([sample(gpu(0), 7.0), sample(gpu(1), up=False)], [])
    up = {dict(lbl)["uuid"]: v for lbl, v in series(frame, cat.GPU_UP.name).items()}
    assert up == {"GPU-0": 1.0, "GPU-1": 0.0}
    assert [dict(lbl)["uuid"] for lbl in series(frame, cat.GPU_MEMORY_USED.name)] == ["GPU-0"]
    assert {dict(lbl)["uuid"] for lbl in series(frame, cat.GPU_INFO.name)} == {"GPU-0", "GPU-1"}


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
    up = {dict(lbl)["source"]: v for lbl, v in series(frame, cat.SOURCE_UP.name).items()}
    errors = {dict(lbl)["source"]: v for lbl, v in series(frame, cat.COLLECT_ERRORS.name).items()}
    assert up == {"nvml": 1.0, "podresources": 0.0}
    assert errors == {"nvml": 0.0, "podresources": 3.0}


# --- the cluster view (API server) -----------------------------------------------------------------

EXAMPLE = "gpu.example.com"


def slice_dev(name: str, **attrs: str) -> SliceDevice:
    return SliceDevice(name, tuple(sorted(attrs.items())))


def nv_slice(*devices: SliceDevice, generation: int = 1) -> ResourceSliceInfo:
    return ResourceSliceInfo(f"{NODE}-gpu", DRV, NODE, generation, 1, NODE, devices)


def result(request: str, device: str, *, driver: str = DRV, admin: bool = False) -> AllocationResult:
    return AllocationResult(request, driver, NODE, device, admin)


def claim_info(ns: str, name: str, *results: AllocationResult, uid: str = "",
               reserved: tuple[ConsumerRef, ...] = (), devices: tuple[ClaimDeviceStatus, ...] = ()) -> ClaimInfo:
    return ClaimInfo(ns, name, uid or f"uid-{name}", results, reserved, devices)


def pod_info(ns: str, name: str, *containers: ContainerInfo, phase: str = "Running") -> PodInfo:
    claims = tuple(sorted({c.claim for ctr in containers for c in ctr.claims if c.claim}))
    return PodInfo(ns, name, f"uid-{name}", phase, claims, containers)


def ctr_info(name: str, *claims: tuple[str, str], health: tuple[DeviceHealth, ...] = ()) -> ContainerInfo:
    """``claims``: (claim object name, request) pairs; the reference name is the claim's."""
    return ContainerInfo(name, f"containerd://{name}", tuple(ContainerClaim(c, c, r) for c, r in claims), health)


def cluster(*, slices: tuple[ResourceSliceInfo, ...] = (), claims: tuple[ClaimInfo, ...] = (),
            pods: tuple[PodInfo, ...] = ()) -> ClusterSnapshot:
    return ClusterSnapshot(NODE, "v1", slices, claims, pods)


def test_slice_uuid_attribute_resolves_any_driver() -> None:
    use = ClaimUse("ns", "c", (ClaimDevice(EXAMPLE, NODE, "gpu-0"),))
    pods = [pod("ns", "p", ctr("main", use))]
    assert attribution(run([sample(gpu(0))], pods), "GPU-0") == EMPTY, "no slice, no way to know"
    sl = ResourceSliceInfo("s", EXAMPLE, NODE, 1, 1, NODE, (slice_dev("gpu-0", uuid="GPU-0"),))
    frame = run([sample(gpu(0))], pods, cluster=cluster(slices=(sl,)))
    assert attribution(frame, "GPU-0") == att(namespace="ns", pod="p", container="main", claim="c")
    (alloc,) = map(dict, series(frame, cat.CLAIM_ALLOCATION_INFO.name))
    assert alloc["uuid"] == "GPU-0"


def test_slice_attribute_goes_before_nvidia_name_parsing() -> None:
    # The name says minor 0, the driver's slice says this device is GPU-1: the slice is right
    # (name parsing is only the fallback for devices no slice names by UUID).
    frame = run([sample(gpu(0)), sample(gpu(1))], [pod("ml", "p", ctr("c", claim("ml", "g", "gpu-0")))],
                cluster=cluster(slices=(nv_slice(slice_dev("gpu-0", uuid="GPU-1")),)))
    assert attribution(frame, "GPU-1")["pod"] == "p"
    assert attribution(frame, "GPU-0") == EMPTY


def test_request_names_subrequests_and_pod_uid_join_the_device_labels() -> None:
    frame = run([sample(gpu(0)), sample(gpu(1))],
                [pod("ml", "train-0", ctr("trainer", claim("ml", "gpus", "gpu-0", "gpu-1")))],
                cluster=cluster(claims=(claim_info("ml", "gpus", result("gpus/h200", "gpu-0"),
                                                   result("gpus/h200", "gpu-1"), uid="claim-uid"),),
                                pods=(pod_info("ml", "train-0", ctr_info("trainer", ("gpus", "gpus"))),)))
    want = att(namespace="ml", pod="train-0", pod_uid="uid-train-0", container="trainer", claim="gpus",
               request="gpus/h200")
    assert attribution(frame, "GPU-0") == attribution(frame, "GPU-1") == want
    allocs = {(a["device"], a["request"], a["claim_uid"])
              for a in map(dict, series(frame, cat.CLAIM_ALLOCATION_INFO.name))}
    assert allocs == {("gpu-0", "gpus/h200", "claim-uid"), ("gpu-1", "gpus/h200", "claim-uid")}
    (consumer,) = map(dict, series(frame, cat.CLAIM_CONSUMER_INFO.name))
    assert consumer["pod_uid"] == "uid-train-0"


def test_each_container_gets_only_the_devices_of_the_request_it_names() -> None:
    # The kubelet lists every device of the claim for both containers; the pod spec says who uses what.
    c = claim("ml", "pair", "gpu-0", "gpu-1")
    pods = [pod("ml", "p", ctr("a", c), ctr("b", c))]
    devices = [sample(gpu(0)), sample(gpu(1))]
    assert attribution(run(devices, pods), "GPU-0")["container"] == "", "node-local: both containers"
    view = cluster(claims=(claim_info("ml", "pair", result("first", "gpu-0"), result("second", "gpu-1")),),
                   pods=(pod_info("ml", "p", ctr_info("a", ("pair", "first")), ctr_info("b", ("pair", "second"))),))
    frame = run(devices, pods, cluster=view)
    assert (attribution(frame, "GPU-0")["container"], attribution(frame, "GPU-0")["request"]) == ("a", "first")
    assert (attribution(frame, "GPU-1")["container"], attribution(frame, "GPU-1")["request"]) == ("b", "second")
    # Both containers still use the claim.
    assert {d["container"] for d in map(dict, series(frame, cat.CLAIM_CONSUMER_INFO.name))} == {"a", "b"}


def test_a_container_naming_the_main_request_uses_the_chosen_subrequest() -> None:
    view = cluster(claims=(claim_info("ml", "g", result("main/fallback", "gpu-0")),),
                   pods=(pod_info("ml", "p", ctr_info("c", ("g", "main"))),))
    frame = run([sample(gpu(0))], [pod("ml", "p", ctr("c", claim("ml", "g", "gpu-0")))], cluster=view)
    assert attribution(frame, "GPU-0")["request"] == "main/fallback"
    assert attribution(frame, "GPU-0")["container"] == "c"


def test_admin_access_from_the_api_server_is_authoritative() -> None:
    pods = [pod("ml", "train", ctr("t", claim("ml", "gpus", "gpu-0"))),
            pod("ops", "dcgm", ctr("d", claim("ops", "watch", "gpu-0"))),
            pod("monitoring", "dra-exporter-x", ctr("e", claim("monitoring", "mine", "gpu-1")))]
    view = cluster(claims=(claim_info("ml", "gpus", result("gpu", "gpu-0")),
                           claim_info("ops", "watch", result("gpu", "gpu-0", admin=True)),
                           claim_info("monitoring", "mine", result("gpu", "gpu-1"))))
    frame = run([sample(gpu(0)), sample(gpu(1))], pods, self_pod=("monitoring", "dra-exporter-x"), cluster=view)
    # Another pod's admin-access claim is monitoring although it is not the exporter's pod ...
    assert attribution(frame, "GPU-0")["pod"] == "train"
    # ... and the exporter pod's claim without admin access is an ordinary one.
    assert attribution(frame, "GPU-1")["pod"] == "dra-exporter-x"
    admin = {(d["claim"], d["admin_access"]) for d in map(dict, series(frame, cat.CLAIM_ALLOCATION_INFO.name))}
    assert admin == {("gpus", "false"), ("watch", "true"), ("mine", "false")}
    assert {d["pod"] for d in map(dict, series(frame, cat.CLAIM_CONSUMER_INFO.name))} == {"train", "dra-exporter-x"}


def test_own_pod_rule_stays_for_claims_the_api_server_does_not_know() -> None:
    pods = [pod("ml", "train", ctr("t", claim("ml", "gpus", "gpu-0"))),
            pod("monitoring", "exp", ctr("e", claim("monitoring", "all", "gpu-0")))]
    frame = run([sample(gpu(0))], pods, self_pod=("monitoring", "exp"), cluster=cluster())
    assert attribution(frame, "GPU-0")["pod"] == "train"


def test_shared_claim_keeps_request_but_not_pod_uid() -> None:
    c = claim("research", "shared", "gpu-0")
    view = cluster(claims=(claim_info("research", "shared", result("gpu", "gpu-0")),),
                   pods=(pod_info("research", "alice", ctr_info("nb", ("shared", ""))),
                         pod_info("research", "bob", ctr_info("nb", ("shared", "")))))
    frame = run([sample(gpu(0))], [pod("research", "alice", ctr("nb", c)), pod("research", "bob", ctr("nb", c))],
                cluster=view)
    assert attribution(frame, "GPU-0") == att(namespace="research", claim="shared", request="gpu")
    uids = {d["pod_uid"] for d in map(dict, series(frame, cat.CLAIM_CONSUMER_INFO.name))}
    assert uids == {"uid-alice", "uid-bob"}


def test_pod_uid_from_reserved_for_when_the_pod_watch_lags() -> None:
    view = cluster(claims=(claim_info("ml", "g", result("gpu", "gpu-0"),
                                      reserved=(ConsumerRef("pods", "p", "uid-from-claim"),)),))
    frame = run([sample(gpu(0))], [pod("ml", "p", ctr("c", claim("ml", "g", "gpu-0")))], cluster=view)
    assert attribution(frame, "GPU-0")["pod_uid"] == "uid-from-claim"


def test_different_claims_share_no_request_label() -> None:
    view = cluster(claims=(claim_info("a", "x", result("gpu", "gpu-0")), claim_info("b", "y", result("gpu", "gpu-0"))))
    frame = run([sample(gpu(0))], [pod("a", "p", ctr("c", claim("a", "x", "gpu-0"))),
                                   pod("b", "q", ctr("c", claim("b", "y", "gpu-0")))], cluster=view)
    assert attribution(frame, "GPU-0") == EMPTY


def test_every_slice_device_is_described_allocated_or_not() -> None:
    parent = gpu(4, "enabled")
    static = mig(4, 9, 0, 4, "3g.71gb", 1)
    sl = nv_slice(
        slice_dev("gpu-0", uuid="GPU-0", type="gpu", productName="NVIDIA H200"),
        slice_dev("gpu-4-mig-3g71gb-9-0", uuid=static.uuid, type="mig", profile="3g.71gb", parentUUID="GPU-4",
                  productName="NVIDIA H200"),
        # A dynamic MIG device has no uuid in its slice; NVML finds it by parent, profile and placement.
        slice_dev("gpu-4-mig-3g71gb-9-4", type="mig", profile="3g.71gb", parentUUID="GPU-4"))
    dynamic = mig(4, 9, 4, 4, "3g.71gb", 2)
    other = ResourceSliceInfo("nic", "nic.example.com", "pool/a", 3, 1, "", (slice_dev("eth-0", model="X1"),))
    frame = run([sample(gpu(0)), sample(parent), sample(static), sample(dynamic)], [],
                cluster=cluster(slices=(sl, other)))
    info = {d["device"]: d for d in map(dict, series(frame, cat.DEVICE_INFO.name))}
    assert set(info) == {"gpu-0", "gpu-4-mig-3g71gb-9-0", "gpu-4-mig-3g71gb-9-4", "eth-0"}
    assert info["gpu-0"] == {"node": NODE, "driver": DRV, "pool": NODE, "device": "gpu-0", "uuid": "GPU-0",
                             "type": "gpu", "profile": "", "parent_uuid": "", "model": "NVIDIA H200"}
    assert (info["gpu-4-mig-3g71gb-9-0"]["uuid"], info["gpu-4-mig-3g71gb-9-0"]["profile"]) == (static.uuid, "3g.71gb")
    assert info["gpu-4-mig-3g71gb-9-4"]["uuid"] == dynamic.uuid
    assert (info["eth-0"]["node"], info["eth-0"]["uuid"], info["eth-0"]["model"]) == (NODE, "", "X1")


def test_taints_conditions_health_and_counters() -> None:
    dev = SliceDevice("gpu-0", (("uuid", "GPU-0"),), consumes_counters=(
        CounterConsumption("gpu-0-counter-set", (("memory", 1.5e11), ("multiprocessors", 132.0))),),
        taints=(DeviceTaint("gpu.nvidia.com/xid", "79", "NoExecute"),))
    # A placement nobody holds: listed in the slice, but it takes nothing from the counters.
    free = SliceDevice("gpu-0-mig-1g18gb-19-0", consumes_counters=(
        CounterConsumption("gpu-0-counter-set", (("memory", 1.8e10), ("multiprocessors", 16.0))),))
    sl = ResourceSliceInfo("s", DRV, NODE, 1, 2, NODE, (dev, free),
                           (CounterSet("gpu-0-counter-set", (("memory", 1.5e11), ("multiprocessors", 132.0))),))
    cond = ClaimDeviceStatus(DRV, NODE, "gpu-0", conditions=(DeviceCondition("Ready", "True"),))
    health = DeviceHealth("g", "gpu", DRV, NODE, "gpu-0", "Unhealthy")
    view = cluster(slices=(sl,), claims=(claim_info("ml", "g", result("gpu", "gpu-0"), devices=(cond,)),),
                   pods=(pod_info("ml", "p", ctr_info("c", ("g", "gpu"), health=(health,))),
                         pod_info("ml", "done", ctr_info("c", ("g", "gpu"), health=(health,)), phase="Succeeded")))
    frame = run([sample(gpu(0))], [pod("ml", "p", ctr("c", claim("ml", "g", "gpu-0")))], cluster=view)
    assert list(map(dict, series(frame, cat.DEVICE_TAINT.name))) == [
        {"driver": DRV, "pool": NODE, "device": "gpu-0", "key": "gpu.nvidia.com/xid", "value": "79",
         "effect": "NoExecute", "rule": ""}]
    assert list(map(dict, series(frame, cat.CLAIM_DEVICE_CONDITION.name))) == [
        {"namespace": "ml", "claim": "g", "driver": DRV, "pool": NODE, "device": "gpu-0", "type": "Ready",
         "status": "True"}]
    assert list(map(dict, series(frame, cat.DEVICE_HEALTH.name))) == [
        {"namespace": "ml", "pod": "p", "container": "c", "claim": "g", "request": "gpu", "driver": DRV,
         "pool": NODE, "device": "gpu-0", "health": "Unhealthy"}], "a finished pod's health is history"
    capacity = {dict(lbl)["counter"]: v for lbl, v in series(frame, cat.DEVICE_SHARED_CAPACITY.name).items()}
    consumption = {(dict(lbl)["device"], dict(lbl)["counter"]): v
                   for lbl, v in series(frame, cat.DEVICE_SHARED_CONSUMPTION.name).items()}
    assert capacity == {"memory": 1.5e11, "multiprocessors": 132.0}
    assert consumption == {("gpu-0", "memory"): 1.5e11, ("gpu-0", "multiprocessors"): 132.0}


def cdi_health(claim_name: str, cdi_id: str, health: str = "Unhealthy") -> DeviceHealth:
    return DeviceHealth(claim_name, "", "", "", "", health, cdi_id=cdi_id)


def health_devices(frame: Frame) -> set[tuple[str, str, str, str, str]]:
    return {(h["claim"], h["driver"], h["pool"], h["device"], h["health"])
            for h in map(dict, series(frame, cat.DEVICE_HEALTH.name))}


def test_health_named_by_cdi_id_resolves_through_the_claim_uid_and_its_results() -> None:
    # NVIDIA's CDI name embeds the claim UID: k8s.gpu.nvidia.com/claim=<claimUID>-<device>.
    cid = "k8s.gpu.nvidia.com/claim=uid-g-gpu-1"
    view = cluster(claims=(claim_info("ml", "g", result("gpu", "gpu-0"), result("gpu", "gpu-1")),),
                   pods=(pod_info("ml", "p", ctr_info("c", ("g", ""), health=(cdi_health("g", cid),))),))
    frame = run([sample(gpu(0)), sample(gpu(1))], [], cluster=view)
    assert health_devices(frame) == {("g", DRV, NODE, "gpu-1", "Unhealthy")}


def test_health_named_by_cdi_id_resolves_through_the_kubelets_cdi_names() -> None:
    # A driver whose CDI names do not embed the claim UID: the kubelet's pod-resources answer
    # lists them per device, and a device's list may carry the IDs of the driver's earlier
    # devices too (a kubelet quirk), so an ID belongs to the first device that lists it.
    use = ClaimUse("ml", "g", (ClaimDevice(DRV, NODE, "gpu-0", ("vendor.com/gpu=a",)),
                               ClaimDevice(DRV, NODE, "gpu-1", ("vendor.com/gpu=a", "vendor.com/gpu=b"))))
    view = cluster(pods=(pod_info("ml", "p", ctr_info("c", ("g", ""), health=(
        cdi_health("g", "vendor.com/gpu=b"), cdi_health("g", "vendor.com/gpu=a", "Healthy")))),))
    frame = run([sample(gpu(0)), sample(gpu(1))], [pod("ml", "p", ctr("c", use))], cluster=view)
    assert health_devices(frame) == {("g", DRV, NODE, "gpu-1", "Unhealthy"), ("g", DRV, NODE, "gpu-0", "Healthy")}


def test_health_of_a_device_nobody_can_name_is_kept_without_its_device() -> None:
    view = cluster(pods=(pod_info("ml", "p", ctr_info("c", ("g", ""), health=(
        cdi_health("g", "vendor.com/gpu=unknown"),))),))
    frame = run([sample(gpu(0))], [], cluster=view)
    assert health_devices(frame) == {("g", "", "", "", "Unhealthy")}, "an Unhealthy device never vanishes"


def test_device_taint_rules_apply_to_the_devices_they_select_with_the_rules_name() -> None:
    xid = DeviceTaint("gpu.nvidia.com/xid", "79", "NoExecute")
    sl = nv_slice(slice_dev("gpu-0"), SliceDevice("gpu-1", taints=(xid,)))
    nic = ResourceSliceInfo("n", "nic.example.com", "rack-1", 1, 1, NODE, (slice_dev("eth-0"),))
    maintenance = DeviceTaint("example.com/maintenance", "fan", "NoSchedule")
    rules = (
        DeviceTaintRule("all-nvidia", maintenance, driver=DRV),
        DeviceTaintRule("one-gpu", DeviceTaint("example.com/drain", "", "NoExecute"), DRV, NODE, "gpu-1"),
        DeviceTaintRule("other-node", maintenance, DRV, "node-b"),
        # A 1.33-1.34 rule with a CEL selector: cannot be evaluated here, so it is not applied.
        DeviceTaintRule("cel", maintenance, unsupported_selector=True),
    )
    frame = run([sample(gpu(0)), sample(gpu(1))], [], cluster=ClusterSnapshot(
        NODE, "v1", (nv_slice(*sl.devices), nic), taint_rules=rules))
    taints = {(t["device"], t["key"], t["effect"], t["rule"]) for t in map(dict, series(frame, cat.DEVICE_TAINT.name))}
    assert taints == {
        ("gpu-0", "example.com/maintenance", "NoSchedule", "all-nvidia"),
        ("gpu-1", "example.com/maintenance", "NoSchedule", "all-nvidia"),
        ("gpu-1", "example.com/drain", "NoExecute", "one-gpu"),
        ("gpu-1", "gpu.nvidia.com/xid", "NoExecute", ""),
    }


def test_tolerations_consumed_capacity_and_network_data_of_allocations() -> None:
    shared = AllocationResult("gpu", DRV, NODE, "gpu-0", share_id="share-a",
                              tolerations=(DeviceToleration("gpu.nvidia.com/xid", "Exists", "", "NoExecute"),),
                              consumed_capacity=(("memory", 2.0 ** 34),))
    net = ClaimDeviceStatus("nic.example.com", "rack-1", "eth-0", network=NetworkDeviceData(
        "net1", "00:11:22:33:44:55", ("10.0.0.5/24", "fd00::5/64")))
    view = cluster(claims=(claim_info("ml", "g", shared, AllocationResult("nic", "nic.example.com", "rack-1", "eth-0"),
                                      devices=(net,)),))
    frame = run([sample(gpu(0))], [], cluster=view)
    assert list(map(dict, series(frame, cat.CLAIM_DEVICE_TOLERATION.name))) == [
        {"namespace": "ml", "claim": "g", "request": "gpu", "driver": DRV, "pool": NODE, "device": "gpu-0",
         "key": "gpu.nvidia.com/xid", "operator": "Exists", "value": "", "effect": "NoExecute"}]
    assert {dict(lbl)["share_id"]: (dict(lbl)["capacity"], v)
            for lbl, v in series(frame, cat.CLAIM_CONSUMED_CAPACITY.name).items()} == {"share-a": ("memory", 2.0 ** 34)}
    (info,) = map(dict, series(frame, cat.CLAIM_DEVICE_NETWORK.name))
    assert (info["device"], info["interface"], info["hardware_address"], info["ips"]) == (
        "eth-0", "net1", "00:11:22:33:44:55", "10.0.0.5/24,fd00::5/64")


def test_a_uuid_in_the_claims_device_status_data_names_a_device_no_slice_names() -> None:
    # Dynamic MIG: the slice names an abstract placement; the MIG device (and its UUID) exists
    # only once prepared, and the driver may publish it in status.devices[].data.
    created = mig(0, 19, 6, 1, "1g.18gb", 9)
    name = "gpu-0-mig-1g18gb-19-2"  # a placement NVML does not have: name parsing cannot find it
    view = cluster(slices=(nv_slice(slice_dev(name, parentUUID="GPU-0")),),
                   claims=(claim_info("ml", "g", result("gpu", name),
                                      devices=(ClaimDeviceStatus(DRV, NODE, name, uuid=created.uuid),)),))
    frame = run([sample(gpu(0, "enabled")), sample(created)], [pod("ml", "p", ctr("c", claim("ml", "g", name)))],
                cluster=view)
    assert attribution(frame, created.uuid) == att(namespace="ml", pod="p", container="c", claim="g", request="gpu")


def test_a_claim_reserved_for_a_podgroup_is_attributed_to_the_groups_pods_here() -> None:
    # KEP-5729: reservedFor names the PodGroup, not its pods; the kubelet says which pods hold it.
    group = ConsumerRef("podgroups", "trainers", "group-uid", "scheduling.k8s.io")
    c = claim("ml", "g", "gpu-0")
    view = cluster(claims=(claim_info("ml", "g", result("gpu", "gpu-0"), reserved=(group,)),),
                   pods=(pod_info("ml", "w-0", ctr_info("c", ("g", ""))),
                         pod_info("ml", "w-1", ctr_info("c", ("g", "")))))
    frame = run([sample(gpu(0))], [pod("ml", "w-0", ctr("c", c)), pod("ml", "w-1", ctr("c", c))], cluster=view)
    assert attribution(frame, "GPU-0") == att(namespace="ml", claim="g", request="gpu")
    consumers = {(x["pod"], x["pod_uid"]) for x in map(dict, series(frame, cat.CLAIM_CONSUMER_INFO.name))}
    assert consumers == {("w-0", "uid-w-0"), ("w-1", "uid-w-1")}, "the group's pods, never the group"


def test_api_server_attributes_pods_the_kubelet_reports_without_claims() -> None:
    # A kubelet before 1.34 without the dynamic-resources gate lists the pod but no claims.
    view = cluster(claims=(claim_info("ml", "g", result("gpu", "gpu-0")),),
                   pods=(pod_info("ml", "p", ctr_info("c", ("g", "gpu"))),
                         pod_info("ml", "gone", ctr_info("c", ("g", "gpu")))))
    frame = run([sample(gpu(0))], [pod("ml", "p", ctr("c"))], cluster=view)
    assert attribution(frame, "GPU-0") == att(namespace="ml", pod="p", pod_uid="uid-p", container="c", claim="g",
                                              request="gpu"), "a pod the kubelet does not list holds nothing here"


def test_api_server_attributes_running_pods_while_the_kubelet_never_answered() -> None:
    view = cluster(claims=(claim_info("ml", "g", result("gpu", "gpu-0")),
                           claim_info("ml", "h", result("gpu", "gpu-1"))),
                   pods=(pod_info("ml", "p", ctr_info("c", ("g", ""))),
                         pod_info("ml", "waiting", ctr_info("c", ("h", "")), phase="Pending")))
    frame = join(JoinInput((DeviceSnapshot((sample(gpu(0)), sample(gpu(1)))),), None, cluster=view))
    assert attribution(frame, "GPU-0")["pod"] == "p"
    assert attribution(frame, "GPU-1") == EMPTY, "a pending pod runs nothing yet"
    # The kubelet answering (and listing nobody) wins over the API server.
    assert attribution(run([sample(gpu(0))], [], cluster=view), "GPU-0") == EMPTY


def test_cluster_frame_labels_follow_the_catalogue() -> None:
    view = cluster(slices=(nv_slice(slice_dev("gpu-0", uuid="GPU-0", type="gpu")),),
                   claims=(claim_info("ml", "g", result("gpu", "gpu-0")),),
                   pods=(pod_info("ml", "p", ctr_info("c", ("g", ""))),))
    frame = run([sample(gpu(0))], [pod("ml", "p", ctr("c", claim("ml", "g", "gpu-0")))], cluster=view)
    for fam in frame.families:
        for s in fam.samples:
            assert tuple(k for k, _ in s.labels) == cat.spec(fam.name).labels, fam.name


# --- per-container shares (processes + cgroups) ---------------------------------------------------


def procs_frame(processes: tuple[ProcessSample, ...], owners: tuple[ProcessOwner, ...], *,
                unresolved: tuple[int, ...] = (), with_cluster: bool = True) -> Frame:
    """GPU 0 shared by pods alice and bob through one claim; a MIG device held by carol."""
    shared = claim("team", "shared", "gpu-0")
    mig_dev = mig(1, 9, 0, 4, "3g.71gb", 1)
    pods = [pod("team", "alice", ctr("nb", shared)), pod("team", "bob", ctr("nb", shared)),
            pod("team", "carol", ctr("srv", claim("team", "mig", "gpu-1-mig-3g71gb-9-0")))]
    infos = (pod_info("team", "alice", ctr_info("nb", ("shared", ""))),
             pod_info("team", "bob", ctr_info("nb", ("shared", ""))),
             pod_info("team", "carol", ctr_info("srv", ("mig", ""))))
    nvml = DeviceSnapshot((sample(gpu(0)), sample(gpu(1, "enabled")), sample(mig_dev)), processes)
    return join(JoinInput((nvml,), PodResourcesSnapshot(tuple(pods)),
                          cluster=cluster(pods=infos) if with_cluster else None,
                          owners=ProcessOwnersSnapshot(owners, unresolved)))


def container_series(frame: Frame, name: str = cat.CONTAINER_GPU_MEMORY_USED.name) -> dict[tuple[str, str], dict]:
    return {(d["pod"], d["uuid"]): {**d, "value": v} for d, v in
            ((dict(lbl), v) for lbl, v in series(frame, name).items())}


SHARED_PROCS = (
    ProcessSample("GPU-0", 100, 30 * 2**30, 0.40),
    ProcessSample("GPU-0", 101, 2 * 2**30, 0.05),   # alice's second process: summed with the first
    ProcessSample("GPU-0", 200, 12 * 2**30, 0.15),
    ProcessSample("MIG-1-0", 300, 5 * 2**30, None),  # MIG: no per-process utilisation from NVML
)
SHARED_OWNERS = (ProcessOwner(100, "uid-alice", "nb"), ProcessOwner(101, "uid-alice", "nb"),
                 ProcessOwner(200, "uid-bob", "nb"), ProcessOwner(300, "uid-carol", "srv"))


def test_shared_gpu_gets_one_series_per_container_with_its_own_share() -> None:
    frame = procs_frame(SHARED_PROCS, SHARED_OWNERS)
    memory = container_series(frame)
    alice, bob = memory[("alice", "GPU-0")], memory[("bob", "GPU-0")]
    assert (alice["value"], bob["value"]) == (32 * 2**30, 12 * 2**30)
    assert (alice["namespace"], alice["container"], alice["claim"], alice["pod_uid"]) == (
        "team", "nb", "shared", "uid-alice")
    sm = container_series(frame, cat.CONTAINER_GPU_SM_UTILIZATION.name)
    assert sm[("alice", "GPU-0")]["value"] == pytest.approx(0.45)
    assert sm[("bob", "GPU-0")]["value"] == pytest.approx(0.15)
    # No double counting: the container shares add up to what the processes use on the device.
    assert sum(v["value"] for k, v in memory.items() if k[1] == "GPU-0") == sum(
        p.used_memory_bytes for p in SHARED_PROCS if p.uuid == "GPU-0")


def test_mig_device_share_is_attributed_and_missing_utilisation_is_not_invented() -> None:
    frame = procs_frame(SHARED_PROCS, SHARED_OWNERS)
    carol = container_series(frame)[("carol", "MIG-1-0")]
    assert (carol["container"], carol["claim"], carol["value"]) == ("srv", "mig", 5 * 2**30)
    assert ("carol", "MIG-1-0") not in container_series(frame, cat.CONTAINER_GPU_SM_UTILIZATION.name)


def test_a_container_whose_processes_ended_has_no_series() -> None:
    frame = procs_frame(SHARED_PROCS[2:], SHARED_OWNERS[2:])
    assert {k[0] for k in container_series(frame)} == {"bob", "carol"}


def test_unresolvable_processes_are_counted_not_dropped_silently() -> None:
    frame = procs_frame(SHARED_PROCS, SHARED_OWNERS[:2], unresolved=(200,))
    assert ("bob", "GPU-0") not in container_series(frame)
    # 200 (no cgroup) and 300 (asked for, but no owner came back) are both unattributed.
    assert series(frame, cat.UNATTRIBUTED_PROCESSES.name) == {(): 2.0}


def test_without_the_api_server_containers_are_known_by_pod_uid_only() -> None:
    frame = procs_frame(SHARED_PROCS, SHARED_OWNERS, with_cluster=False)
    alice = [(dict(lbl), v) for lbl, v in series(frame, cat.CONTAINER_GPU_MEMORY_USED.name).items()
             if dict(lbl)["pod_uid"] == "uid-alice"]
    assert [(d["pod"], d["container"], d["claim"], v) for d, v in alice] == [("", "", "", 32 * 2**30)]


def test_every_readable_device_counts_its_processes_whether_or_not_their_pods_are_known() -> None:
    # The idle alert's signal for MIG devices of GPUs without GPM: no owners are needed.
    mig_dev = mig(1, 19, 0, 1, "1g.18gb", 9)
    processes = (ProcessSample(mig_dev.uuid, 101), ProcessSample(mig_dev.uuid, 102), ProcessSample("GPU-0", 7))
    nvml = DeviceSnapshot((sample(gpu(0)), sample(gpu(1, "enabled")), sample(mig_dev), sample(gpu(2), up=False)),
                        processes)
    counts = {dict(lbl)["uuid"]: v for lbl, v in series(join(JoinInput((nvml,), None)), cat.GPU_PROCESSES.name).items()}
    assert counts == {"GPU-0": 1, "GPU-1": 0, mig_dev.uuid: 2}  # a device NVML cannot read has none


# --- allowlisted pod labels on consumer info (--pod-labels) --------------------------------------


def test_allowlisted_pod_labels_join_consumer_info_and_a_pod_without_one_gets_empty() -> None:
    labelled = replace(pod_info("ml", "train", ctr_info("main", ("g", ""))),
                       labels=(("app.kubernetes.io/name", "llama"), ("team", "platform")))
    bare = pod_info("ml", "probe", ctr_info("main", ("h", "")))
    view = cluster(claims=(claim_info("ml", "g", result("gpu", "gpu-0")),
                           claim_info("ml", "h", result("gpu", "gpu-1"))), pods=(labelled, bare))
    kubelet = [pod("ml", "train", ctr("main", claim("ml", "g", "gpu-0"))),
               pod("ml", "probe", ctr("main", claim("ml", "h", "gpu-1"))),
               pod("ml", "unseen", ctr("main", claim("ml", "u", "gpu-2")))]  # not (yet) in the API server's view
    allow = cat.PodLabels(("team", "app.kubernetes.io/name", "cost-center"))
    frame = run([sample(gpu(0)), sample(gpu(1)), sample(gpu(2))], kubelet, cluster=view, pod_labels=allow)
    got = {dict(lbl)["pod"]: lbl for lbl in series(frame, cat.CLAIM_CONSUMER_INFO.name)}
    # The family's own labels first, in its order, then the pod labels by their Prometheus names.
    extra = ("label_app_kubernetes_io_name", "label_cost_center", "label_team")
    for lbl in got.values():
        assert tuple(k for k, _ in lbl) == cat.CLAIM_CONSUMER_INFO.labels + extra
    assert dict(got["train"])["label_team"] == "platform"
    assert dict(got["train"])["label_app_kubernetes_io_name"] == "llama"
    assert dict(got["train"])["label_cost_center"] == "", "a label the pod lacks is empty, not left out"
    assert {dict(got[p])["label_team"] for p in ("probe", "unseen")} == {""}
    assert frame.pod_label_attributes == (("label_app_kubernetes_io_name", "k8s.pod.label.app.kubernetes.io/name"),
                                          ("label_cost_center", "k8s.pod.label.cost-center"),
                                          ("label_team", "k8s.pod.label.team"))
    # Only consumer info carries them: every other family keeps the catalogue's label set.
    for fam in frame.families:
        if fam.name != cat.CLAIM_CONSUMER_INFO.name:
            assert all(tuple(k for k, _ in s.labels) == cat.spec(fam.name).labels for s in fam.samples), fam.name


def test_without_an_allowlist_consumer_info_has_its_declared_labels_alone() -> None:
    labelled = replace(pod_info("ml", "train", ctr_info("main", ("g", ""))), labels=(("team", "platform"),))
    frame = run([sample(gpu(0))], [pod("ml", "train", ctr("main", claim("ml", "g", "gpu-0")))],
                cluster=cluster(claims=(claim_info("ml", "g", result("gpu", "gpu-0")),), pods=(labelled,)))
    (consumer,) = series(frame, cat.CLAIM_CONSUMER_INFO.name)
    assert tuple(k for k, _ in consumer) == cat.CLAIM_CONSUMER_INFO.labels
    assert frame.pod_label_attributes == ()
