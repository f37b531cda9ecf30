"""The cluster mode's capacity arithmetic, from real slice shapes (NVIDIA partitionable GPUs as the
driver's DynamicMIG publishes them: one counter set per GPU with memory slices and multiprocessors;
the dra-example-driver's slices, plain and partitioned) through the one normaliser."""

from __future__ import annotations

from typing import Any

import pytest

from dra_exporter import catalog as cat
from dra_exporter.cluster.capacity import Capacity
from dra_exporter.model import ClusterState, Frame
from dra_exporter.sources.kubeapi_normalize import (
    claim_from_dict,
    device_class_from_dict,
    slice_from_dict,
    taint_rule_from_dict,
)

NVIDIA = "gpu.nvidia.com"
EXAMPLE = "gpu.example.com"
GIB = 2**30

#: (profile, GI profile id, compute slices (x SMs per slice), memory slices, placement starts) per GPU model,
#: from NVIDIA's MIG user guide (supported profiles and placements).
A100_40GB = dict(sms=14, memory_gib=40, profiles=[
    ("1g.5gb", 19, 1, 1, range(7)), ("2g.10gb", 14, 2, 2, (0, 2, 4)), ("3g.20gb", 9, 3, 4, (0, 4)),
    ("4g.20gb", 5, 4, 4, (0,)), ("7g.40gb", 0, 7, 8, (0,))])
H100_80GB = dict(sms=16, memory_gib=80, profiles=[
    ("1g.10gb", 19, 1, 1, range(7)), ("1g.20gb", 15, 1, 2, (0, 2, 4, 6)), ("2g.20gb", 14, 2, 2, (0, 2, 4)),
    ("3g.40gb", 9, 3, 4, (0, 4)), ("4g.40gb", 5, 4, 4, (0,)), ("7g.80gb", 0, 7, 8, (0,))])
H200_141GB = dict(sms=16, memory_gib=141, profiles=[
    ("1g.18gb", 19, 1, 1, range(7)), ("1g.35gb", 15, 1, 2, (0, 2, 4, 6)), ("2g.35gb", 14, 2, 2, (0, 2, 4)),
    ("3g.71gb", 9, 3, 4, (0, 4)), ("4g.71gb", 5, 4, 4, (0,)), ("7g.141gb", 0, 7, 8, (0,))])


def _q(value: Any) -> dict[str, Any]:
    return {"value": str(value)}


def _counters(sms: int, memory: int, slices: range) -> dict[str, Any]:
    counters = {"multiprocessors": _q(sms), "memory": _q(memory)}
    counters.update({f"memory-slice-{i}": _q(1) for i in slices})
    return counters


def nvidia_partitionable(node: str, gpu: dict[str, Any], product: str, minor: int = 0) -> list[dict[str, Any]]:
    """A 1.35+ pool of one partitionable GPU: a counters-only slice and a device slice (v1)."""
    total_sms, memory = gpu["sms"] * 7, gpu["memory_gib"] * GIB
    counter_set = f"gpu-{minor}-counter-set"
    common = {"productName": {"string": product}, "driverVersion": {"version": "580.82.7"}}
    devices = [{"name": f"gpu-{minor}", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": f"GPU-{node}"},
                                                        **common},
                "capacity": {"memory": _q(memory)},
                "consumesCounters": [{"counterSet": counter_set, "counters": _counters(total_sms, memory, range(8))}]}]
    for profile, gi, compute, mem_slices, starts in gpu["profiles"]:
        for start in starts:
            mem = memory * mem_slices // 8
            devices.append({
                "name": f"gpu-{minor}-mig-{profile.replace('.', '')}-{gi}-{start}",
                "attributes": {"type": {"string": "mig"}, "profile": {"string": profile}, **common},
                "capacity": {"memory": _q(mem), "multiprocessors": _q(gpu["sms"] * compute)},
                "consumesCounters": [{"counterSet": counter_set, "counters": _counters(
                    gpu["sms"] * compute, mem, range(start, start + mem_slices))}]})
    pool = {"name": node, "generation": 1, "resourceSliceCount": 2}
    return [
        {"metadata": {"name": f"{node}-counters"}, "spec": {
            "driver": NVIDIA, "nodeName": node, "pool": pool,
            "sharedCounters": [{"name": counter_set, "counters": _counters(total_sms, memory, range(8))}]}},
        {"metadata": {"name": f"{node}-devices"}, "spec": {"driver": NVIDIA, "nodeName": node, "pool": pool,
                                                           "devices": devices}},
    ]


def claim(name: str, *results: tuple[str, str, str], namespace: str = "ml", reserved: bool = True,
          admin: bool = False, requests: list[dict[str, Any]] | None = None,
          created: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    status: dict[str, Any] = {}
    if results:
        status["allocation"] = {"devices": {"results": [
            {"request": "gpu", "driver": d, "pool": p, "device": dev, **({"adminAccess": True} if admin else {})}
            for d, p, dev in results]}}
    if reserved and results:
        status["reservedFor"] = [{"resource": "pods", "name": f"{name}-pod", "uid": f"uid-{name}"}]
    return {"metadata": {"namespace": namespace, "name": name, "uid": f"c-{name}", "creationTimestamp": created},
            "spec": {"devices": {"requests": requests or [
                {"name": "gpu", "exactly": {"deviceClassName": "mig.nvidia.com"}}]}},
            "status": status}


def state(slices: list[dict[str, Any]], claims: list[dict[str, Any]] = (),  # type: ignore[assignment]
          classes: list[dict[str, Any]] = (), rules: list[dict[str, Any]] = ()) -> ClusterState:  # type: ignore[assignment]
    return ClusterState("v1", tuple(slice_from_dict(s, "v1") for s in slices),
                        tuple(claim_from_dict(c, "v1") for c in claims),
                        tuple(device_class_from_dict(c) for c in classes),
                        tuple(taint_rule_from_dict(r) for r in rules))


def values(frame: Frame, family: str, *keys: str) -> dict[tuple[str, ...], float]:
    fam = frame.family(family)
    if fam is None:
        return {}
    return {tuple(dict(s.labels)[k] for k in keys): s.value for s in fam.samples}


def fits(frame: Frame) -> dict[str, float]:
    return {p: v for (p,), v in values(frame, cat.CLUSTER_PARTITIONS_FIT.name, "profile").items()}


NOW = 1767225600.0 + 600  # 2026-01-01T00:10:00Z


# --- MIG placements that still fit: the scheduler's counter arithmetic ------------------------------------


@pytest.mark.parametrize(("gpu", "product", "allocated", "expected"), [
    # Nothing allocated: every placement fits, the whole GPU too.
    (A100_40GB, "NVIDIA A100-SXM4-40GB", [],
     {"gpu": 1, "1g.5gb": 7, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1}),
    # A 3g.20gb at 0 takes memory slices 0-3 and 42 of 98 SMs: the right half is left.
    (A100_40GB, "NVIDIA A100-SXM4-40GB", ["gpu-0-mig-3g20gb-9-0"],
     {"gpu": 0, "1g.5gb": 3, "2g.10gb": 1, "3g.20gb": 1, "4g.20gb": 0, "7g.40gb": 0}),
    # A 4g.40gb at 0 and a 1g.10gb at 4: slices 5-7 and 52 SMs left; the allocated 1g itself does not fit.
    (H100_80GB, "NVIDIA H100 80GB HBM3", ["gpu-0-mig-4g40gb-5-0", "gpu-0-mig-1g10gb-19-4"],
     {"gpu": 0, "1g.10gb": 2, "1g.20gb": 1, "2g.20gb": 0, "3g.40gb": 0, "4g.40gb": 0, "7g.80gb": 0}),
    # Two 1g.35gb (two memory slices each) at 0 and 2: the SMs would allow five more 1g, memory slices three.
    (H200_141GB, "NVIDIA H200", ["gpu-0-mig-1g35gb-15-0", "gpu-0-mig-1g35gb-15-2"],
     {"gpu": 0, "1g.18gb": 3, "1g.35gb": 2, "2g.35gb": 1, "3g.71gb": 1, "4g.71gb": 0, "7g.141gb": 0}),
    # The whole GPU allocated: nothing else fits.
    (H200_141GB, "NVIDIA H200", ["gpu-0"],
     {"gpu": 0, "1g.18gb": 0, "1g.35gb": 0, "2g.35gb": 0, "3g.71gb": 0, "4g.71gb": 0, "7g.141gb": 0}),
])
def test_partitions_that_still_fit_per_gpu_and_profile(gpu: dict[str, Any], product: str, allocated: list[str],
                                                       expected: dict[str, float]) -> None:
    claims = [claim(f"c{i}", (NVIDIA, "node-a", d)) for i, d in enumerate(allocated)]
    frame = Capacity().frame(state(nvidia_partitionable("node-a", gpu, product), claims), NOW)
    assert fits(frame) == expected
    devices = values(frame, cat.CLUSTER_DEVICES.name, "profile", "state")
    assert sum(v for (_, st), v in devices.items() if st == "allocated") == len(allocated)
    # Every device is counted once, in one state.
    assert sum(devices.values()) == 1 + sum(len(p[4]) for p in gpu["profiles"])
    assert {dict(s.labels)["model"] for s in frame.family(cat.CLUSTER_DEVICES.name).samples} == {product}


def test_admin_access_results_take_no_device_and_no_counters() -> None:
    claims = [claim("monitor", (NVIDIA, "node-a", "gpu-0"), admin=True)]
    frame = Capacity().frame(state(nvidia_partitionable("node-a", H100_80GB, "H100"), claims), NOW)
    assert fits(frame)["gpu"] == 1 and fits(frame)["1g.10gb"] == 7


def test_missing_counter_slice_makes_the_pool_incomplete_and_its_devices_unavailable() -> None:
    device_slice_only = nvidia_partitionable("node-a", A100_40GB, "A100")[1:]
    frame = Capacity().frame(state(device_slice_only), NOW)
    assert set(fits(frame).values()) == {0.0}
    # The scheduler does not allocate from an incomplete pool: none of its devices is free.
    assert {st for (st,) in values(frame, cat.CLUSTER_DEVICES.name, "state")} == {"unavailable"}
    assert values(frame, cat.CLUSTER_POOL_COMPLETE.name, "pool") == {("node-a",): 0.0}
    assert values(frame, cat.CLUSTER_POOL_SLICES.name, "generation") == {("current",): 1.0, ("older",): 0.0}
    assert values(frame, cat.CLUSTER_POOL_SLICES_EXPECTED.name, "pool") == {("node-a",): 2.0}


# --- the dra-example-driver ------------------------------------------------------------------------------------


def example_slice(node: str, gpus: int = 8, generation: int = 1, count: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": f"{node}-{EXAMPLE}-{generation}"}, "spec": {
        "driver": EXAMPLE, "nodeName": node, "pool": {"name": node, "generation": generation,
                                                      "resourceSliceCount": count},
        "devices": [{"name": f"gpu-{i}", "attributes": {
            "index": {"int": i}, "uuid": {"string": f"gpu-{node}-{i}"}, "model": {"string": "LATEST-GPU-MODEL"},
            "driverVersion": {"version": "1.0.0"}},
            "capacity": {"memory": {"value": "80Gi"}, "compute": {"value": "100"}}} for i in range(gpus)]}}


def example_partitioned(node: str) -> list[dict[str, Any]]:
    """The example driver's partition mode: gpu-0-full and four partitions over gpu-0-counters."""
    counters = {"memory": _q("80Gi"), "compute": _q(100)}
    pool = {"name": node, "generation": 1, "resourceSliceCount": 2}
    devices = [{"name": "gpu-0-full", "attributes": {"full": {"bool": True}, "model": {"string": "LATEST-GPU-MODEL"}},
                "consumesCounters": [{"counterSet": "gpu-0-counters", "counters": counters}]}]
    devices += [{"name": f"gpu-0-partition-{j}", "attributes": {
        "partition": {"int": j}, "partitionable": {"bool": True}, "model": {"string": "LATEST-GPU-MODEL"}},
        "consumesCounters": [{"counterSet": "gpu-0-counters",
                              "counters": {"memory": _q("20Gi"), "compute": _q(25)}}]} for j in range(4)]
    return [{"metadata": {"name": f"{node}-counters"}, "spec": {
                "driver": EXAMPLE, "nodeName": node, "pool": pool,
                "sharedCounters": [{"name": "gpu-0-counters", "counters": counters}]}},
            {"metadata": {"name": f"{node}-devices"}, "spec": {"driver": EXAMPLE, "nodeName": node, "pool": pool,
                                                               "devices": devices}}]


def test_example_driver_whole_gpus_by_state() -> None:
    claims = [claim("a", (EXAMPLE, "kind-worker", "gpu-0")), claim("b", (EXAMPLE, "kind-worker", "gpu-5"))]
    frame = Capacity().frame(state([example_slice("kind-worker")], claims), NOW)
    assert values(frame, cat.CLUSTER_DEVICES.name, "driver", "node", "model", "state") == {
        (EXAMPLE, "kind-worker", "LATEST-GPU-MODEL", "allocated"): 2.0,
        (EXAMPLE, "kind-worker", "LATEST-GPU-MODEL", "free"): 6.0}
    assert frame.family(cat.CLUSTER_PARTITIONS_FIT.name) is None  # no shared counters: no partitions


def test_example_driver_partitions_fit_by_what_they_consume() -> None:
    claims = [claim("a", (EXAMPLE, "kind-worker", "gpu-0-partition-1"))]
    frame = Capacity().frame(state(example_partitioned("kind-worker"), claims), NOW)
    assert fits(frame) == {"compute=100,memory=80Gi": 0.0, "compute=25,memory=20Gi": 3.0}


# --- taints, generations ---------------------------------------------------------------------------------------


def test_taints_from_the_slice_and_from_rules_keep_devices_from_new_claims() -> None:
    sl = example_slice("n1", gpus=4)
    sl["spec"]["devices"][0]["taints"] = [{"key": "maintenance", "effect": "NoSchedule"}]
    sl["spec"]["devices"][1]["taints"] = [{"key": "just-a-note", "effect": "None"}]
    rules = [{"metadata": {"name": "drain-gpu-2"}, "spec": {
        "deviceSelector": {"driver": EXAMPLE, "pool": "n1", "device": "gpu-2"},
        "taint": {"key": "broken", "value": "xid-79", "effect": "NoExecute"}}}]
    frame = Capacity().frame(state([sl], rules=rules), NOW)
    assert values(frame, cat.CLUSTER_DEVICES.name, "state") == {("tainted",): 2.0, ("free",): 2.0}
    assert values(frame, cat.CLUSTER_TAINT_RULE_DEVICES.name, "rule", "device", "effect") == {
        ("drain-gpu-2", "gpu-2", "NoExecute"): 1.0}


def test_older_generation_left_over_makes_the_pool_incomplete_and_is_not_counted() -> None:
    frame = Capacity().frame(state([example_slice("n1", 8, generation=1), example_slice("n1", 4, generation=2)]),
                             NOW)
    assert values(frame, cat.CLUSTER_DEVICES.name, "state") == {("free",): 4.0}
    assert values(frame, cat.CLUSTER_POOL_SLICES.name, "generation") == {("current",): 1.0, ("older",): 1.0}
    assert values(frame, cat.CLUSTER_POOL_COMPLETE.name, "pool") == {("n1",): 0.0}
    complete = Capacity().frame(state([example_slice("n1", 4, generation=2)]), NOW)
    assert values(complete, cat.CLUSTER_POOL_COMPLETE.name, "pool") == {("n1",): 1.0}
    assert values(complete, cat.CLUSTER_POOL_INFO.name, "node", "placement") == {("n1", "node"): 1.0}


# --- claims (their states: tests/test_cluster_claims.py) ------------------------------------------------------


def test_v1beta1_claim_requests_are_read_too() -> None:
    obj = claim("old", requests=[{"name": "gpu", "deviceClassName": "gpu.example.com", "count": 2}])
    info = claim_from_dict(obj, "v1beta1")
    assert [(r.name, r.device_class, r.count) for r in info.requests] == [("gpu", "gpu.example.com", 2)]


# --- DeviceClass capacity: CEL selectors --------------------------------------------------------------------------


def device_class(name: str, *expressions: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": e}} for e in expressions]}}


NVIDIA_CLASSES = [
    device_class("gpu.nvidia.com", f"device.driver == '{NVIDIA}' && device.attributes['{NVIDIA}'].type == 'gpu'"),
    device_class("mig.nvidia.com", f"device.driver == '{NVIDIA}' && device.attributes['{NVIDIA}'].type == 'mig'"),
    device_class("mig-3g-or-bigger", f"device.attributes['{NVIDIA}'].type == 'mig'",
                 f"device.capacity['{NVIDIA}'].multiprocessors.compareTo(quantity('48')) >= 0"),
    device_class("new-driver", f"device.attributes['{NVIDIA}'].driverVersion.isGreaterThan(semver('575.0.0'))"),
    device_class("nothing-matches", "device.driver == 'tpu.example.com'"),
]


def test_device_classes_count_matching_devices_by_state() -> None:
    claims = [claim("a", (NVIDIA, "node-a", "gpu-0-mig-3g20gb-9-0"))]
    frame = Capacity().frame(state(nvidia_partitionable("node-a", A100_40GB, "A100"), claims, NVIDIA_CLASSES), NOW)
    got = values(frame, cat.CLUSTER_CLASS_DEVICES.name, "device_class", "state")
    assert {k: v for k, v in got.items() if v} == {
        # The whole GPU: blocked by the 3g partition.
        ("gpu.nvidia.com", "blocked"): 1.0,
        # 14 placements: one allocated, what fits free (3 + 1 + 1), the other 8 blocked.
        ("mig.nvidia.com", "allocated"): 1.0, ("mig.nvidia.com", "free"): 5.0, ("mig.nvidia.com", "blocked"): 8.0,
        # 3g (42 SMs) is under 48; 4g (56) and 7g (98) are not.
        ("mig-3g-or-bigger", "blocked"): 2.0,
        ("new-driver", "allocated"): 1.0, ("new-driver", "free"): 5.0, ("new-driver", "blocked"): 9.0,
    }
    assert values(frame, cat.CLUSTER_CLASS_EVALUABLE.name, "device_class") == {
        (c["metadata"]["name"],): 1.0 for c in NVIDIA_CLASSES}


def test_a_class_the_library_cannot_evaluate_is_reported_not_a_crash() -> None:
    classes = [device_class("broken-syntax", "device.driver ==="),
               device_class("unknown-function", "device.attributes['gpu.example.com'].model.frobnicate()"),
               device_class("ok", f"device.driver == '{EXAMPLE}'")]
    frame = Capacity().frame(state([example_slice("n1", 2)], classes=classes), NOW)
    assert values(frame, cat.CLUSTER_CLASS_EVALUABLE.name, "device_class") == {
        ("broken-syntax",): 0.0, ("unknown-function",): 0.0, ("ok",): 1.0}
    assert values(frame, cat.CLUSTER_CLASS_DEVICES.name, "device_class", "state")[("ok", "free")] == 2.0
    assert not {c for (c, _) in values(frame, cat.CLUSTER_CLASS_DEVICES.name, "device_class", "state")} - {"ok"}


def test_a_device_without_the_attribute_a_class_reads_fails_that_class_for_the_device() -> None:
    classes = [device_class("needs-profile", f"device.attributes['{EXAMPLE}'].profile == '1g'")]
    frame = Capacity().frame(state([example_slice("n1", 3)], classes=classes), NOW)
    assert values(frame, cat.CLUSTER_CLASS_ERRORS.name, "device_class") == {("needs-profile",): 3.0}
    assert values(frame, cat.CLUSTER_CLASS_DEVICES.name, "device_class", "state")[("needs-profile", "free")] == 0.0


def test_typed_attributes_compare_as_cel_values() -> None:
    classes = [device_class("low-index", f"device.attributes['{EXAMPLE}'].index < 2"),
               device_class("big-memory", f"device.capacity['{EXAMPLE}'].memory.isGreaterThan(quantity('64Gi'))"),
               device_class("v1", f"device.attributes['{EXAMPLE}'].driverVersion.major() == 1")]
    frame = Capacity().frame(state([example_slice("n1", 4)], classes=classes), NOW)
    got = values(frame, cat.CLUSTER_CLASS_DEVICES.name, "device_class", "state")
    assert (got[("low-index", "free")], got[("big-memory", "free")], got[("v1", "free")]) == (2.0, 4.0, 4.0)


def test_the_same_state_gives_the_same_frame_and_changes_are_seen() -> None:
    capacity = Capacity()
    slices = [example_slice("n1", 4)]
    classes = [device_class("all", f"device.driver == '{EXAMPLE}'")]
    first = capacity.frame(state(slices, classes=classes), NOW)
    assert capacity.frame(state(slices, classes=classes), NOW) == first
    later = capacity.frame(state(slices, [claim("a", (EXAMPLE, "n1", "gpu-3"))], classes), NOW)
    assert values(later, cat.CLUSTER_CLASS_DEVICES.name, "device_class", "state")[("all", "allocated")] == 1.0
