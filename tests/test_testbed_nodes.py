"""The scheduler's node filters against the real kube-scheduler (v1.36, the test bed), read as the cluster
mode reads the cluster (its ``ClusterSource`` on the admin kubeconfig: Nodes, pods, DRA objects):

* a slice that selects nodes by label serves only the nodes with that label — the scheduler allocates
  from it on a labelled node and not on another, and so does the exporter's allocator once Nodes are read;
* a pod that can only go to a node without GPUs (its node selector; its required affinity naming the
  other node; the GPU node's taint; the GPU node cordoned) is refused for the reason ``cluster/nodes.py``
  gives, in the scheduler's own words; and its claim is not placeable in ``explain`` (the allocator tries
  a pod's claims only on the nodes its filters admit).

Slices, classes and Nodes are cluster-wide: each case has its own driver, class and nodes, and the class
selects only its driver's devices."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubetestbed import ControlPlane

from dra_exporter.cluster import nodes as nf
from dra_exporter.cluster.allocator import Allocator
from dra_exporter.cluster.explain import explain
from dra_exporter.model import ClusterState
from dra_exporter.sources.kubeapi import Timeouts
from dra_exporter.sources.kubeapi_cluster import ClusterSource

pytestmark = pytest.mark.testbed_kube

#: How a pod is kept off the only GPU node.
CASES = ("node selector", "node name", "taint", "cordoned")

RESOURCE = "resource.k8s.io/v1"
FAST = Timeouts(request=10.0, backoff=(0.1, 0.5))


def read(kube: ControlPlane) -> ClusterState:
    """The cluster as the cluster mode reads it."""
    source = ClusterSource(kubeconfig=str(kube.kubeconfig), timeouts=FAST)
    try:
        state = source.collect()
    finally:
        source.close()
    assert state.nodes is not None, "the admin may read Nodes"
    return state


def slice_and_class(kube: ControlPlane, devices: int, **placement: Any) -> tuple[str, str]:
    """A pool of ``devices`` devices of a driver of its own, placed by ``placement``, and a class for
    exactly them; (driver, class)."""
    driver = f"{kube.unique('drv')}.example.com"
    kube.create({"apiVersion": RESOURCE, "kind": "ResourceSlice", "metadata": {"name": kube.unique("slice")},
                 "spec": {"driver": driver, "pool": {"name": "pool", "generation": 1, "resourceSliceCount": 1},
                          "devices": [{"name": f"gpu-{i}"} for i in range(devices)], **placement}})
    device_class = kube.unique("gpus")
    kube.create({"apiVersion": RESOURCE, "kind": "DeviceClass", "metadata": {"name": device_class},
                 "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{driver}'"}}]}})
    return driver, device_class


def claim(kube: ControlPlane, ns: str, device_class: str) -> str:
    """A claim for one device of the class; its name."""
    name = kube.unique("claim")
    kube.create({"apiVersion": RESOURCE, "kind": "ResourceClaim", "metadata": {"name": name, "namespace": ns},
                 "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}}},
                ns)
    return name


def pod(kube: ControlPlane, ns: str, claim_name: str, **pod_spec: Any) -> None:
    """A pod named as its claim that waits for it, with ``pod_spec`` (its node selector …)."""
    kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": claim_name, "namespace": ns},
                 "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                          "resources": {"claims": [{"name": "gpu"}]}}],
                          "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
                          "terminationGracePeriodSeconds": 0, **pod_spec}}, ns)


def bound(kube: ControlPlane, ns: str, name: str) -> bool:
    path = f"/api/v1/namespaces/{ns}/pods/{name}"

    def outcome() -> str | None:
        pod = kube.get(path)
        if pod["spec"].get("nodeName"):
            return "bound"
        if any(c.get("type") == "PodScheduled" and c.get("status") == "False"
               for c in pod.get("status", {}).get("conditions", [])):
            return "unschedulable"
        return None

    if kube.wait_for(outcome, f"pod {ns}/{name} bound or unschedulable", 60) == "bound":
        return True
    time.sleep(2)  # a first attempt can race the claim's informer: give the retry a moment
    return bool(kube.get(path)["spec"].get("nodeName"))


def test_a_slice_selected_by_node_label_serves_only_labelled_nodes_as_the_scheduler_allocates(
        kube: ControlPlane) -> None:
    rack = kube.unique("rack")
    in_rack, elsewhere = kube.ready_node(labels={"rack": rack}), kube.ready_node()
    _, device_class = slice_and_class(kube, 2, nodeSelector={"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "rack", "operator": "In", "values": [rack]}]}]})
    ns = kube.namespace("nodes")
    pinned = {node: claim(kube, ns, device_class) for node in (elsewhere, in_rack)}
    state = read(kube)  # before any pod: the scheduler has allocated nothing yet
    allocator = Allocator(state)
    claims = {c.name: c for c in state.claims if c.namespace == ns}
    exporter = {node: allocator.allocate(claims[name], node).placeable for node, name in pinned.items()}
    for node, name in pinned.items():
        pod(kube, ns, name, nodeSelector={"kubernetes.io/hostname": node})
    scheduler = {node: bound(kube, ns, name) for node, name in pinned.items()}
    assert scheduler == {in_rack: True, elsewhere: False}
    assert exporter == scheduler


@pytest.fixture(scope="module")
def only_a_node_without_gpus(kube: ControlPlane) -> Iterator[dict[str, tuple[str, str, str, dict[str, Any]]]]:
    """Per case, a GPU node and a node without GPUs, a claim whose pod the case keeps off the GPU node,
    and the scheduler's message for it: case → (namespace, claim, GPU node, the pod's spec)."""
    cases: dict[str, tuple[str, str, str, dict[str, Any]]] = {}
    ns = kube.namespace("nodes")
    for case in CASES:
        label = kube.unique("no-gpus")
        gpu_node, other = kube.ready_node(), kube.ready_node(labels={"pool": label})
        if case == "taint":
            kube.request("PATCH", f"/api/v1/nodes/{gpu_node}", {"spec": {"taints": [
                {"key": "example.com/reserved", "value": label, "effect": "NoSchedule"}]}},
                content_type="application/merge-patch+json")
        if case == "cordoned":
            kube.request("PATCH", f"/api/v1/nodes/{gpu_node}", {"spec": {"unschedulable": True}},
                         content_type="application/merge-patch+json")
        _, device_class = slice_and_class(kube, 2, nodeName=gpu_node)
        spec: dict[str, Any] = {"nodeSelector": {"pool": label}} if case == "node selector" else {}
        if case == "node name":  # as a DaemonSet's pod: the scheduler's PreFilter leaves the others out
            spec = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                        "values": [other]}]}]}}}}
        name = claim(kube, ns, device_class)
        pod(kube, ns, name, **spec)
        cases[case] = (ns, name, gpu_node, spec)
    yield cases


@pytest.mark.parametrize("case", CASES)
def test_the_node_filters_refuse_the_gpu_node_in_the_schedulers_words(
        kube: ControlPlane, only_a_node_without_gpus: dict[str, tuple[str, str, str, dict[str, Any]]],
        case: str) -> None:
    ns, claim, gpu_node, _ = only_a_node_without_gpus[case]
    message = kube.unschedulable_message(ns, claim)
    state = read(kube)
    (pod,) = [p for p in state.pods if (p.namespace, p.name) == (ns, claim)]
    (node,) = [n for n in state.nodes or () if n.name == gpu_node]
    refusal = nf.refusal(pod.node_filters, node)
    assert refusal is not None and refusal.plugin == {
        "node selector": nf.NODE_AFFINITY, "node name": nf.NODE_AFFINITY, "taint": nf.TAINT_TOLERATION,
        "cordoned": nf.NODE_UNSCHEDULABLE}[case]
    assert refusal.message in message, (refusal, message)
    admission = nf.NodeFilters(state.nodes or ()).admission(pod.node_filters)
    assert gpu_node not in admission.nodes


@pytest.mark.parametrize("case", CASES)
def test_a_claim_whose_pod_can_only_go_to_a_node_without_gpus_is_not_placeable(
        kube: ControlPlane, only_a_node_without_gpus: dict[str, tuple[str, str, str, dict[str, Any]]],
        case: str) -> None:
    ns, claim, _, _ = only_a_node_without_gpus[case]
    assert kube.unschedulable_message(ns, claim), "the scheduler does not place it"
    (outcome,) = explain(read(kube), [(ns, claim)])
    assert outcome.pod_waits is True
    assert not outcome.placeable, f"placeable on {outcome.node}"
