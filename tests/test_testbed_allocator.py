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
from testbed_batch import view

from dra_exporter import catalog as cat
from dra_exporter.cluster.allocator import Allocator
from dra_exporter.cluster.capacity import Capacity
from dra_exporter.sources.kubeapi_normalize import claim_from_dict

pytestmark = [pytest.mark.testbed_kube, pytest.mark.slow]  # some hundred pods scheduled one by one

Layout = Callable[[str], list[JSON]]
"""Objects on a node (its name in): slices, and claims with their allocation already written."""


def create_layout(kube: ControlPlane, layout: Layout, classes: dict[str, JSON], *,
                  admin_access: bool = False) -> tuple[str, str]:
    """A fresh Ready node with the layout's objects (claims allocated through their status) and the
    classes; (namespace, node)."""
    ns, node = kube.namespace("alloc", admin_access=admin_access), kube.ready_node()
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


# --- one claim: placeable or not, as the scheduler decides -------------------------------------------------

Requests = Callable[[dict[str, str]], tuple[list[JSON], list[JSON]]]
"""Class key → class name in; the claim's requests and constraints out."""


def _numa(node: str) -> list[JSON]:
    sl = example_gpus(node, 4)
    for i, d in enumerate(sl["spec"]["devices"]):
        d["attributes"]["numa"] = {"int": i // 2 + (1 if i == 0 else 0)}  # 1, 0, 1, 1
    return [sl]


def _numa_two_requests(node: str) -> list[JSON]:
    sl = example_gpus(node, 3)
    for d in sl["spec"]["devices"]:
        d["attributes"]["numa"] = {"int": 0}
    sl["spec"]["devices"][2]["attributes"]["numa"] = {"int": 1}
    return [sl, allocated(f"held-{node}", EXAMPLE, node, "gpu-2")]


def _example_one_taken(node: str) -> list[JSON]:
    return [example_gpus(node, 3), allocated(f"held-{node}", EXAMPLE, node, "gpu-1")]


def _all_tainted(node: str) -> list[JSON]:
    sl = example_gpus(node, 2)
    for d in sl["spec"]["devices"]:
        d["taints"] = [{"key": "maintenance", "value": "planned", "effect": "NoSchedule"}]
    return [sl]


def _with_incomplete(node: str) -> list[JSON]:
    return [example_gpus(node, 2, pool=f"{node}-ok"), example_gpus(node, 2, pool=f"{node}-partial", count=2)]


def _shared_one_share(node: str) -> list[JSON]:
    share = {"shareID": "3f6c1c3e-5b1a-4d7e-9a51-2b8f0e1d4c21", "consumedCapacity": {"memory": "30Gi"}}
    return [*_shared(node), allocated(f"share-{node}", EXAMPLE, node, "gpu-0", **share)]


def _mig_all_taken(node: str) -> list[JSON]:
    return [*partitionable_gpus(node, H100), allocated(f"whole-{node}", NVIDIA, node, "gpu-0")]


def _one(cls: str, **more: Any) -> Requests:
    return lambda names: ([request(device_class_name=names[cls], **more)], [])


def _exactly(cls: str, count: int, constraint: JSON | None = None) -> Requests:
    return lambda names: ([request(device_class_name=names[cls], count=count)], [constraint] if constraint else [])


def _first_available(*classes: str) -> Requests:
    return lambda names: ([{"name": "gpu", "firstAvailable": [
        {"name": f"sub{i}", "deviceClassName": names[c], "allocationMode": "ExactCount", "count": 1}
        for i, c in enumerate(classes)]}], [])


CLASSES = {"example": ANY_EXAMPLE, "mig": (MIG,),
           "gpu": (f"device.driver == '{NVIDIA}' && device.attributes['{NVIDIA}'].type == 'gpu'",),
           "one-g": (f"device.driver == '{NVIDIA}' && device.attributes['{NVIDIA}'].profile == '1g.10gb'",),
           "one-g-guarded": (f"device.driver == '{NVIDIA}' && {_profile('1g.10gb')}",)}
CLAIMS: list[tuple[str, Layout, Requests | None, bool]] = [
    ("two of three, one taken", _example_one_taken, _exactly("example", 2), True),
    ("three of three, one taken", _example_one_taken, _exactly("example", 3), False),
    ("matchAttribute over four, three asked (backtracking)", _numa,
     _exactly("example", 3, {"matchAttribute": f"{EXAMPLE}/numa"}), True),
    # The scheduler compares a request's device with the one before it only: 1, 0, 1 passes.
    ("distinctAttribute, three asked, two values", _numa,
     _exactly("example", 3, {"distinctAttribute": f"{EXAMPLE}/numa"}), True),
    ("distinctAttribute, two asked, two values", _numa,
     _exactly("example", 2, {"distinctAttribute": f"{EXAMPLE}/numa"}), True),
    ("distinctAttribute over two requests, one value left", _numa_two_requests, None, False),
    ("tainted devices, tolerated", _all_tainted,
     _one("example", tolerations=[{"key": "maintenance", "operator": "Equal", "value": "planned",
                                   "effect": "NoSchedule"}]), True),
    ("tainted devices, not tolerated", _all_tainted, _one("example"), False),
    ("All over complete pools", _example_one_taken, _one("example", allocationMode="All"), False),
    ("All with an incomplete pool on the node", _with_incomplete, _one("example", allocationMode="All"), False),
    ("All over free devices", lambda n: [example_gpus(n, 3)], _one("example", allocationMode="All"), True),
    ("a request selector some devices meet", lambda n: [example_gpus(n, 4)],
     _one("example", selectors=[{"cel": {"expression": f"device.attributes['{EXAMPLE}'].index >= 2"}}]), True),
    ("a request selector no device meets", lambda n: [example_gpus(n, 4)],
     _one("example", selectors=[{"cel": {"expression": f"device.attributes['{EXAMPLE}'].index >= 9"}}]), False),
    ("a 50Gi share next to a 30Gi one on 80Gi", _shared_one_share,
     _one("example", capacity={"requests": {"memory": "50Gi"}}), True),
    ("a 60Gi share next to a 30Gi one on 80Gi", _shared_one_share,
     _one("example", capacity={"requests": {"memory": "60Gi"}}), False),
    ("first available: the MIG class when the whole GPU is taken, else the GPU", _mig_all_taken,
     _first_available("gpu", "mig"), False),
    ("first available: the GPU, else MIG", _h100, _first_available("gpu", "mig"), True),
    ("a selector that fails on the whole GPU", _h100, _one("one-g"), False),
    ("the same selector, guarded", _h100, _one("one-g-guarded"), True),
]


@pytest.mark.parametrize(("what", "layout", "requests", "expected"), CLAIMS, ids=[c[0] for c in CLAIMS])
def test_a_claim_is_placeable_exactly_when_the_scheduler_allocates_it(
        kube: ControlPlane, what: str, layout: Layout, requests: Requests | None, expected: bool) -> None:
    classes = {key: unique_class(kube, key, *expressions) for key, expressions in CLASSES.items()}
    ns, node = create_layout(kube, layout, classes)
    names = {k: c["metadata"]["name"] for k, c in classes.items()}
    if requests is None:  # two requests of one device each, all their devices different
        reqs = [request("a", names["example"]), request("b", names["example"])]
        constraints = [{"distinctAttribute": f"{EXAMPLE}/numa"}]
    else:
        reqs, constraints = requests(names)
    name = kube.unique("claim")
    obj = claim_obj(name, reqs, namespace=ns, constraints=constraints)
    kube.create(obj, ns)
    outcome = Allocator(view(kube)).allocate(claim_from_dict(obj, "v1"), node)
    kube.pod(ns, name, claims={"gpu": name}, node_name=node)
    assert (placed(kube, ns, name), outcome.placeable) == (expected, expected), (what, outcome)


def test_admin_access_gets_a_device_another_claim_holds(kube: ControlPlane) -> None:
    classes = {"example": unique_class(kube, "example", *ANY_EXAMPLE)}
    ns, node = create_layout(kube, lambda n: [example_gpus(n, 1), allocated(f"held-{n}", EXAMPLE, n, "gpu-0")],
                             classes, admin_access=True)
    state = view(kube)
    for name, admin, expected in (("monitor", True, True), ("second", False, False)):
        more: dict[str, Any] = {"adminAccess": True} if admin else {}
        obj = claim_obj(name, [request(device_class_name=classes["example"]["metadata"]["name"], **more)],
                        namespace=ns)
        kube.create(obj, ns)
        outcome = Allocator(state).allocate(claim_from_dict(obj, "v1"), node)
        kube.pod(ns, name, claims={"gpu": name}, node_name=node)
        assert (placed(kube, ns, name), outcome.placeable) == (expected, expected), name
