"""The exporter's allocator against the real kube-scheduler (v1.36, the test bed): on layouts shaped as
drivers publish them, how many claims for one device of a class the exporter says the scheduler could
place one after another (``placeable_claims`` on the node) equals how many the scheduler then places,
one pod after another; and for each MIG profile of a GPU, ``dra_cluster_partitions_fit``.

Each comparison gets a fresh node and its own objects (placing claims of one class uses up devices of
another). The exporter reads what the API server holds, through its one normaliser, before the first
pod. DeviceTaintRules are not compared: the test bed's scheduler runs without that gate (kubetestbed).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from dra_layouts import (
    EXAMPLE,
    H100,
    H200,
    JSON,
    NVIDIA,
    claim_obj,
    device_class,
    example_gpus,
    partitionable_gpus,
    request,
    shared_gpu,
    slice_obj,
)
from kubetestbed import ControlPlane

from dra_exporter import catalog as cat
from dra_exporter.cluster.allocator import Allocator
from dra_exporter.cluster.capacity import Capacity
from dra_exporter.model import ClusterState
from dra_exporter.sources.kubeapi_normalize import claim_from_dict, device_class_from_dict, slice_from_dict

pytestmark = [pytest.mark.testbed_kube, pytest.mark.slow]  # some hundred pods scheduled one by one

Layout = Callable[[str], list[JSON]]
"""Objects on a node (its name in): slices, and claims with their allocation already written."""


def view(kube: ControlPlane) -> ClusterState:
    """What the exporter's cluster source would read: every slice, claim and class of the cluster."""
    def items(path: str) -> list[dict[str, Any]]:
        return list(kube.get(f"/apis/resource.k8s.io/v1/{path}")["items"])
    return ClusterState("v1", tuple(slice_from_dict(o, "v1") for o in items("resourceslices")),
                        tuple(claim_from_dict(o, "v1") for o in items("resourceclaims")),
                        tuple(device_class_from_dict(o) for o in items("deviceclasses")))


def create_layout(kube: ControlPlane, layout: Layout, classes: dict[str, JSON]) -> tuple[str, str]:
    """A fresh Ready node with the layout's objects (claims allocated through their status) and the
    classes; (namespace, node)."""
    ns, node = kube.namespace("alloc"), kube.ready_node()
    for c in classes.values():
        kube.create(c)
    for obj in layout(node):
        if obj["kind"] != "ResourceClaim":
            kube.create(obj)
            continue
        status = obj.pop("status", {})
        created = kube.create({**obj, "metadata": {**obj["metadata"], "namespace": ns}}, ns)
        if status:
            kube.patch_status(created, status)
    return ns, node


def placed(kube: ControlPlane, ns: str, name: str) -> bool:
    """Whether the scheduler binds the pod (True) or reports it unschedulable for its claims (False)."""
    path = f"/api/v1/namespaces/{ns}/pods/{name}"

    def outcome() -> str | None:
        pod = kube.get(path)
        if pod["spec"].get("nodeName"):
            return "bound"
        for cond in pod.get("status", {}).get("conditions", []):
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                return str(cond.get("message", "unschedulable"))
        return None

    result = kube.wait_for(outcome, f"pod {ns}/{name} bound or unschedulable", 60)
    if result == "bound":
        return True
    time.sleep(2)  # a first attempt can race the claim's informer: give the retry a moment
    if kube.get(path)["spec"].get("nodeName"):
        return True
    kube.delete(path)  # it would be retried for ever
    return False


def scheduler_places(kube: ControlPlane, ns: str, node: str, device_class_name: str, limit: int = 24) -> int:
    """Claims for one device of the class the scheduler places on ``node``, one pod after another."""
    for i in range(limit + 1):
        name = kube.unique("one")
        kube.create(claim_obj(name, [request(device_class_name=device_class_name)], namespace=ns), ns)
        kube.pod(ns, name, claims={"gpu": name}, node_name=node)
        if not placed(kube, ns, name):
            return i
    return limit + 1


def unique_class(kube: ControlPlane, prefix: str, *expressions: str) -> JSON:
    return device_class(kube.unique(prefix), *expressions)


def allocated(name: str, driver: str, pool: str, device: str, **extra: Any) -> JSON:
    claim = claim_obj(name, [request(device_class_name="any")])
    claim["status"] = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": driver, "pool": pool, "device": device, **extra}]}}}
    return claim


def _profile(profile: str) -> str:
    return f"'profile' in device.attributes['{NVIDIA}'] && device.attributes['{NVIDIA}'].profile == '{profile}'"


# (layout, class expressions) per comparison: every kind the issue names.
def _example_with_incomplete(node: str) -> list[JSON]:
    return [example_gpus(node, 8, pool=f"{node}-full"), example_gpus(node, 4, pool=f"{node}-partial", count=2),
            allocated(f"held-{node}", EXAMPLE, f"{node}-full", "gpu-0")]


def _invalid_and_valid(node: str) -> list[JSON]:
    return [example_gpus(node, 2, pool=f"{node}-dup", count=2), example_gpus(node, 2, pool=f"{node}-dup", count=2,
                                                                              first=1),
            example_gpus(node, 2, pool=f"{node}-ok")]


def _older_generation(node: str) -> list[JSON]:
    return [example_gpus(node, 8, generation=1), example_gpus(node, 2, generation=2)]


def _tainted(node: str) -> list[JSON]:
    sl = example_gpus(node, 4)
    sl["spec"]["devices"][0]["taints"] = [{"key": "ecc", "value": "bad", "effect": "NoSchedule"}]
    sl["spec"]["devices"][1]["taints"] = [{"key": "note", "effect": "None"}]
    sl["spec"]["devices"][2]["taints"] = [{"key": "drain", "effect": "NoExecute"}]
    return [sl]


def _shared(node: str) -> list[JSON]:
    policy = {"default": "30Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}
    return [slice_obj(f"{node}-shared", EXAMPLE, node, [shared_gpu(node, policy=policy)], node=node)]


def _h100(node: str) -> list[JSON]:
    return partitionable_gpus(node, H100)


def _h100_used(node: str) -> list[JSON]:
    return [*partitionable_gpus(node, H100), allocated(f"a-{node}", NVIDIA, node, "gpu-0-mig-3g40gb-9-0"),
            allocated(f"b-{node}", NVIDIA, node, "gpu-0-mig-1g10gb-19-4")]


def _h200(node: str) -> list[JSON]:
    return partitionable_gpus(node, H200)


MIG = f"device.driver == '{NVIDIA}' && device.attributes['{NVIDIA}'].type == 'mig'"
ANY_EXAMPLE = (f"device.driver == '{EXAMPLE}'",)
#: (what, layout, class expressions, the count issue 26 reports for the scheduler or derives by hand).
COMPARISONS: list[tuple[str, Layout, tuple[str, ...], int]] = [
    ("example GPUs, one allocated, and an incomplete pool", _example_with_incomplete, ANY_EXAMPLE, 7),
    ("an invalid pool (a device name twice) and a valid one", _invalid_and_valid, ANY_EXAMPLE, 2),
    ("an older generation still published", _older_generation, ANY_EXAMPLE, 2),
    ("taints: NoSchedule, None, NoExecute", _tainted, ANY_EXAMPLE, 2),
    ("a shared-capacity device, 30Gi a share of 80Gi", _shared, ANY_EXAMPLE, 2),
    ("H100, every MIG placement", _h100, (MIG,), 7),
    ("H100, the +me profile (one OFA engine)", _h100, (_profile("1g.10gb+me"),), 1),
    ("H100, the whole GPU or its 7g", _h100, (f"device.driver == '{NVIDIA}' && (device.attributes['{NVIDIA}'].type "
                                              f"== 'gpu' || ({_profile('7g.80gb')}))",), 1),
    ("H100, a selector that fails on the whole GPU", _h100, (
        f"device.driver == '{NVIDIA}' && device.attributes['{NVIDIA}'].profile == '1g.10gb'",), 0),
    ("H100 with a 3g and a 1g allocated, MIG", _h100_used, (MIG,), 2),
    ("H200, a large-gpu class", _h200, (f"device.driver == '{NVIDIA}' && "
                                        f"device.capacity['{NVIDIA}'].memory.compareTo(quantity('60Gi')) >= 0",), 1),
]


@pytest.mark.parametrize(("what", "layout", "expressions", "expected"), COMPARISONS, ids=[c[0] for c in COMPARISONS])
def test_placeable_claims_equal_what_the_scheduler_places(kube: ControlPlane, what: str, layout: Layout,
                                                          expressions: tuple[str, ...], expected: int) -> None:
    cls = unique_class(kube, "cls", *expressions)
    ns, node = create_layout(kube, layout, {"cls": cls})
    exporter = Allocator(view(kube)).placeable_claims(cls["metadata"]["name"], [node])
    assert (scheduler_places(kube, ns, node, cls["metadata"]["name"]), exporter) == (expected, expected), what


@pytest.mark.parametrize("layout", [_h100, _h100_used], ids=["empty H100", "H100 with a 3g and a 1g allocated"])
@pytest.mark.parametrize("profile", [p.name for p in H100.profiles])
def test_partitions_fit_equal_what_the_scheduler_places_per_profile(kube: ControlPlane, layout: Layout,
                                                                    profile: str) -> None:
    cls = unique_class(kube, "profile", f"device.driver == '{NVIDIA}' && {_profile(profile)}")
    ns, node = create_layout(kube, layout, {"cls": cls})
    fam = Capacity().frame(view(kube), 0.0).family(cat.CLUSTER_PARTITIONS_FIT.name)
    assert fam is not None
    (fit,) = [s.value for s in fam.samples if dict(s.labels)["pool"] == node and dict(s.labels)["profile"] == profile]
    assert scheduler_places(kube, ns, node, cls["metadata"]["name"]) == fit
