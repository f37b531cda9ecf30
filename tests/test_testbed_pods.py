"""Pods, not claims (issue 36), against the real kube-scheduler (v1.36, the test bed): for each case the
scheduler's decision for a pod (bound, unschedulable, or an error of its filter that stops the pod's
attempt) equals the exporter's (``Allocator.allocate_pod`` over what the API server holds before the
pods exist). Every case gets its own driver name, so that no other test's devices match its class; the
pods of all cases are created at once and waited for together (one wait for the batch)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from dra_layouts import (
    H100,
    JSON,
    NVIDIA,
    claim_obj,
    device_class,
    example_gpus,
    partitionable_gpus,
    request,
    slice_obj,
)
from kubetestbed import ControlPlane
from test_testbed_allocator import create_layout, scheduler_places
from testbed_batch import view

from dra_exporter.cluster.allocator import Allocator
from dra_exporter.cluster.explain import first_blocking
from dra_exporter.model import ClusterState
from dra_exporter.sources.kubeapi_normalize import pod_node_filters

pytestmark = [pytest.mark.testbed_kube, pytest.mark.slow]


def _gpus(kube: ControlPlane, driver: str, node: str, count: int, pool: str = "", **device: Any) -> JSON:
    sl = example_gpus(node, count, pool=pool or node)
    sl["metadata"]["name"] = kube.unique("slice")
    sl["spec"]["driver"] = driver
    for d in sl["spec"]["devices"]:
        d.update(device)
    return sl


def _scheduler_says(kube: ControlPlane, ns: str, pod: str) -> str:
    """bound, unschedulable (no node fits) or error (the filter erred: the attempt stops)."""
    path = f"/api/v1/namespaces/{ns}/pods/{pod}"

    def decided() -> str | None:
        obj = kube.get(path)
        if obj["spec"].get("nodeName"):
            return "bound"
        for cond in obj.get("status", {}).get("conditions", []):
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                return "error" if cond.get("reason") == "SchedulerError" else "unschedulable"
        return None

    return str(kube.wait_for(decided, f"pod {ns}/{pod} decided", 60))


def _exporter_says(kube: ControlPlane, state: ClusterState, ns: str, claims: list[str], node_name: str
                   ) -> tuple[str, list[str], set[str]]:
    by_name = {c.name: c for c in state.claims if c.namespace == ns}
    filters = pod_node_filters({"nodeSelector": {"kubernetes.io/hostname": node_name}} if node_name else {})
    outcomes = Allocator(state).allocate_pod([by_name[n] for n in claims], filters=filters)
    verdict = "bound" if all(o.placeable for o in outcomes) else (
        "error" if any(o.attempt_fails for o in outcomes) else "unschedulable")
    reasons = {why[1] for o in outcomes if (why := first_blocking(o)) is not None}
    return verdict, ["/".join(d[1:]) for o in outcomes for d in o.devices], reasons


def test_pods_are_placed_as_the_scheduler_places_them(kube: ControlPlane) -> None:
    ns = kube.namespace("pods", admin_access=True)
    cases: dict[str, tuple[list[str], str, str]] = {}  # pod → (its claims, what the scheduler does, its node)
    reasons: dict[str, str] = {}  # pod → the pending reason the exporter must give

    def case(what: str, expected: str, driver_objects: list[JSON], claims: list[JSON], node_name: str = "",
             reason: str = "") -> None:
        for obj in driver_objects:
            kube.create(obj)
        for c in claims:
            status = c.pop("status", None)
            created = kube.create({**c, "metadata": {**c["metadata"], "namespace": ns}}, ns)
            if status:
                kube.patch_status(created, status)
        pod = kube.unique("pod")
        cases[pod] = ([c["metadata"]["name"] for c in claims], expected + ": " + what, node_name)
        if reason:
            reasons[pod] = reason

    # 1. two claims, 2 + 1 GPUs, one node with 2 GPUs: each fits alone, the pod does not.
    d1 = kube.unique("d1") + ".example.com"
    cls1 = device_class(kube.unique("c1"), f"device.driver == '{d1}'")
    n1 = kube.ready_node()
    case("claims of one pod together", "unschedulable", [cls1, _gpus(kube, d1, n1, 2)],
         [claim_obj(kube.unique("two"), [request(device_class_name=cls1["metadata"]["name"], count=2)]),
          claim_obj(kube.unique("one"), [request(device_class_name=cls1["metadata"]["name"])])])
    # 2. admin access, then a normal request, one GPU: the admin pick is in use within the claim.
    d2 = kube.unique("d2") + ".example.com"
    cls2 = device_class(kube.unique("c2"), f"device.driver == '{d2}'")
    case("an admin pick in use within its claim", "unschedulable", [cls2, _gpus(kube, d2, kube.ready_node(), 1)],
         [claim_obj(kube.unique("admin"), [request("admin", cls2["metadata"]["name"], adminAccess=True),
                                           request("normal", cls2["metadata"]["name"])])])
    # 3. a CEL run-time error on one node's device, a fit on another: the attempt stops.
    d3 = kube.unique("d3") + ".example.com"
    cls3 = device_class(kube.unique("c3"), f"device.driver == '{d3}' && "
                                           f"device.attributes['{d3}'].model == 'LATEST-GPU-MODEL'")
    broken = _gpus(kube, d3, kube.ready_node(), 1)
    del broken["spec"]["devices"][0]["attributes"]["model"]
    case("a CEL error on another node", "error", [cls3, broken, _gpus(kube, d3, kube.ready_node(), 1)],
         [claim_obj(kube.unique("cel"), [request(device_class_name=cls3["metadata"]["name"])])])
    # 4. the same pod shape with room: 3 GPUs on one node, 1 on another: bound, on the node of 3.
    d4 = kube.unique("d4") + ".example.com"
    cls4 = device_class(kube.unique("c4"), f"device.driver == '{d4}'")
    case("claims of one pod with room", "bound",
         [cls4, _gpus(kube, d4, kube.ready_node(), 1), _gpus(kube, d4, kube.ready_node(), 3)],
         [claim_obj(kube.unique("two"), [request(device_class_name=cls4["metadata"]["name"], count=2)]),
          claim_obj(kube.unique("one"), [request(device_class_name=cls4["metadata"]["name"])])])
    # 5. a pool whose device carries bindingConditions sorts last: the plain pool's device is taken.
    d5 = kube.unique("d5") + ".example.com"
    cls5 = device_class(kube.unique("c5"), f"device.driver == '{d5}'")
    n5 = kube.ready_node()
    case("binding conditions sort last", "bound",
         [cls5, _gpus(kube, d5, n5, 1, pool="a-bound", bindingConditions=["attached"],
                      bindingFailureConditions=["failed"]), _gpus(kube, d5, n5, 1, pool="b-plain")],
         [claim_obj(kube.unique("bc"), [request(device_class_name=cls5["metadata"]["name"])])])

    # 6. the pod's node selector names a node without devices: each claim fits elsewhere, the pod nowhere.
    d6 = kube.unique("d6") + ".example.com"
    cls6 = device_class(kube.unique("c6"), f"device.driver == '{d6}'")
    case("a node selector to a node without devices", "unschedulable", [cls6, _gpus(kube, d6, kube.ready_node(), 1)],
         [claim_obj(kube.unique("sel"), [request(device_class_name=cls6["metadata"]["name"])])],
         node_name=kube.ready_node())
    # 7. the only node with the devices has a NoSchedule taint the pod does not tolerate.
    d7 = kube.unique("d7") + ".example.com"
    cls7 = device_class(kube.unique("c7"), f"device.driver == '{d7}'")
    n7 = kube.ready_node()
    kube.request("PATCH", f"/api/v1/nodes/{n7}", {"spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}]}},
                 content_type="application/merge-patch+json")
    case("a tainted node", "unschedulable", [cls7, _gpus(kube, d7, n7, 1)],
         [claim_obj(kube.unique("taint"), [request(device_class_name=cls7["metadata"]["name"])])])

    # 8. 5 GPUs asked, two nodes of 4 free GPUs: 8 free in the cluster, never 5 on one node.
    d8 = kube.unique("d8") + ".example.com"
    cls8 = device_class(kube.unique("c8"), f"device.driver == '{d8}'")
    case("more than one node has", "unschedulable",
         [cls8, _gpus(kube, d8, kube.ready_node(), 4), _gpus(kube, d8, kube.ready_node(), 4)],
         [claim_obj(kube.unique("five"), [request(device_class_name=cls8["metadata"]["name"], count=5)])],
         reason="too_few_devices")

    # 9. one claim already allocated on a node whose only GPU it holds, one pending: the pod must go
    # there (the allocation's node selector), though the pending claim alone fits on another node.
    d9 = kube.unique("d9") + ".example.com"
    cls9 = device_class(kube.unique("c9"), f"device.driver == '{d9}'")
    n9 = kube.ready_node()
    held = claim_obj(kube.unique("held"), [request(device_class_name=cls9["metadata"]["name"])])
    held["status"] = {"allocation": {
        "devices": {"results": [{"request": "gpu", "driver": d9, "pool": n9, "device": "gpu-0"}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [n9]}]}]}}}
    case("an allocated claim of the pod on a full node", "unschedulable",
         [cls9, _gpus(kube, d9, n9, 1), _gpus(kube, d9, kube.ready_node(), 1)],
         [held, claim_obj(kube.unique("new"), [request(device_class_name=cls9["metadata"]["name"])])])

    # 10. 33 devices in one claim on a node of 40: more than a claim may get is an error, not a misfit.
    d10 = kube.unique("d10") + ".example.com"
    cls10 = device_class(kube.unique("c10"), f"device.driver == '{d10}'")
    case("33 devices asked", "error", [cls10, _gpus(kube, d10, kube.ready_node(), 40)],
         [claim_obj(kube.unique("many"), [request(device_class_name=cls10["metadata"]["name"], count=33)])])
    # 11. All over a class one node's pool of which is incomplete, another node complete: an error.
    d11 = kube.unique("d11") + ".example.com"
    cls11 = device_class(kube.unique("c11"), f"device.driver == '{d11}'")
    case("All over an incomplete pool elsewhere", "error",
         [cls11, _gpus(kube, d11, kube.ready_node(), 1), {**(part := _gpus(kube, d11, kube.ready_node(), 1)),
                                                           "spec": {**part["spec"], "pool": {
                                                               **part["spec"]["pool"], "resourceSliceCount": 2}}}],
         [claim_obj(kube.unique("all"), [request(device_class_name=cls11["metadata"]["name"],
                                                 allocationMode="All")])])

    # 12. All on a node of free devices, the pod pinned there, while another driver publishes only the
    # counter set of a two-slice pool on another node: the scheduler gathers a slice of shared counters
    # for every node, so the incomplete pool stops All here too.
    d12 = kube.unique("d12") + ".example.com"
    cls12 = device_class(kube.unique("c12"), f"device.driver == '{d12}'")
    n12, elsewhere = kube.ready_node(), kube.ready_node()
    counters = slice_obj(kube.unique("counters"), kube.unique("d12c") + ".example.com", elsewhere, node=elsewhere,
                         count=2, counters=[{"name": "cs", "counters": {"memory": {"value": "8Gi"}}}])
    case("All beside an incomplete counter-set pool of another node", "error",
         [cls12, _gpus(kube, d12, n12, 2), counters],
         [claim_obj(kube.unique("all"), [request(device_class_name=cls12["metadata"]["name"],
                                                 allocationMode="All")])], node_name=n12)

    state = view(kube)
    assert any(d.binding_conditions for sl in state.slices if sl.driver == d5 for d in sl.devices), (
        "the API server keeps bindingConditions (DRADeviceBindingConditions on): case 5 tests something")
    exporter = {pod: _exporter_says(kube, state, ns, claims, node) for pod, (claims, _, node) in cases.items()}
    for pod, (claims, _, node) in cases.items():  # the exporter has answered: now the scheduler
        kube.pod(ns, pod, claims={c: c for c in claims}, node_name=node or None)
    try:
        _compare(kube, ns, cases, reasons, exporter)
    finally:  # pods left pending would be retried for ever, and counted by other tests' cluster mode
        for pod in cases:
            kube.delete(f"/api/v1/namespaces/{ns}/pods/{pod}")


def _compare(kube: ControlPlane, ns: str, cases: dict[str, tuple[list[str], str, str]], reasons: dict[str, str],
             exporter: dict[str, tuple[str, list[str], set[str]]]) -> None:
    got = {pod: _scheduler_says(kube, ns, pod) for pod in cases}
    for pod, (claims, expected, _) in cases.items():
        assert (got[pod], exporter[pod][0]) == (expected.split(":")[0],) * 2, expected
        if pod in reasons:
            assert exporter[pod][2] == {reasons[pod]}, expected
        if got[pod] == "bound":  # the same devices, as the scheduler wrote them
            written = [f"{r['pool']}/{r['device']}" for c in claims for r in
                       kube.get(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{c}")["status"]
                       ["allocation"]["devices"]["results"]]
            assert sorted(written) == sorted(exporter[pod][1]), expected


def _tainted(device: str) -> Any:
    def layout(node: str) -> list[JSON]:
        objects = partitionable_gpus(node, H100)
        for d in objects[1]["spec"]["devices"]:
            if d["name"] == device:
                d["taints"] = [{"key": "broken", "effect": "NoSchedule"}]
        return objects
    return layout


MIG_ONLY = f"device.driver == '{NVIDIA}' && device.attributes['{NVIDIA}'].type == 'mig'"
ANY_NVIDIA = f"device.driver == '{NVIDIA}'"
#: (what, layout, class) for the counters of a device the search rejects after its counters fit.
REJECTED_COUNTERS = [
    ("H100, the first 1g.10gb partition tainted, any MIG", _tainted("gpu-0-mig-1g10gb-19-0"), MIG_ONLY),
    ("H100, the whole GPU tainted, any device", _tainted("gpu-0"), ANY_NVIDIA),
]


def test_counters_of_a_tainted_device_as_the_schedulers_version_keeps_them(kube: ControlPlane) -> None:
    """v1.36.2 keeps a rejected device's counters for the rest of the attempt: 6 MIG claims, not 7, with
    a tainted 1g.10gb partition; none at all with the whole GPU tainted (the newer model says 7 and 7)."""
    version = str(kube.get("/version")["gitVersion"])
    for what, layout, expression in REJECTED_COUNTERS:
        cls = device_class(kube.unique("cls"), expression)
        ns, node = create_layout(kube, layout, {"cls": cls})
        state = replace(view(kube), server_version=version)
        exporter = Allocator(state).placeable_claims(cls["metadata"]["name"], [node])
        got = scheduler_places(kube, ns, node, cls["metadata"]["name"])
        assert got == exporter, what
