"""The kubeapi source (the node agent's view of the API server) against the real kube-apiserver:
what it asks and when, counted by the server itself (its audit log, for the chart's node-agent
ServiceAccount), and what it reads of objects the real server validated — claims fetched only
for local pods and again after the refresh period or when a new pod uses them, claims the
controller-manager makes and deletes with their pods, slices that name no node.

The simulated API server keeps what a real one will not do on demand (tests/test_kubeapi.py:
dropped watches, injected 410s, outages, 403s, unserved versions).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from kubenode import RESOURCE, GpuNode, Identity, chart_identities, claim, request
from kubetestbed import ControlPlane
from simnode import eventually

from dra_exporter.sources import kubeapi
from dra_exporter.sources.kubeapi import REFRESH_SPREAD, KubeApiSource, Timeouts

pytestmark = pytest.mark.testbed_kube

FAST = Timeouts(request=5.0, backoff=(0.05, 0.2))
#: A watch is logged when it starts and when it ends: counted once, when it starts.
_COUNTED_STAGE = {"watch": "ResponseStarted"}


@dataclass
class Node:
    gpus: GpuNode
    ns: str
    reader: Identity

    def requests(self) -> Counter[tuple[str, str]]:
        """(verb, resource) of every request the reader's token made, as the server logged them."""
        return Counter((e["verb"], e["objectRef"]["resource"]) for e in self.gpus.kube.audit_events(self.reader.user)
                       if e.get("objectRef") and e["stage"] == _COUNTED_STAGE.get(e["verb"], "ResponseComplete"))


@pytest.fixture(scope="module")
def node(kube: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """Three GPUs; ``train-0`` runs on gpu-0 with the claim ``train``; a claim of another node's pod."""
    with chart_identities(kube, tmp_path_factory.mktemp("kubeapi")) as identities:
        gpus = GpuNode.register(kube, [{"index": i} for i in range(3)], seed=3, prefix="kubeapi")
        ns = kube.namespace("kubeapi")
        kube.create(claim(ns, "train", request("gpu", cel=gpus.uuid_cel("gpu-0"))))
        kube.pod(ns, "train-0", claims={"gpu": "train"}, node_name=gpus.name)
        kube.wait_scheduled(ns, "train-0")
        kube.create(claim(ns, "unused", request("gpu")))  # no pod here uses it
        yield Node(gpus, ns, identities["node"])


@contextmanager
def source(node: Node, **kw: Any) -> Iterator[KubeApiSource]:
    kw.setdefault("timeouts", FAST)
    src = KubeApiSource(node.gpus.name, kubeconfig=str(node.reader.kubeconfig), **kw)
    try:
        yield src
    finally:
        src.close()


def new_requests(node: Node, before: Counter[tuple[str, str]]) -> Counter[tuple[str, str]]:
    return node.requests() - before


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
def test_first_collect_lists_slices_and_pods_and_gets_only_the_claims_local_pods_use(
        node: Node, version: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kubeapi, "SUPPORTED_VERSIONS", (version,))
    before = node.requests()
    with source(node) as src:
        snap = src.collect()
        assert (snap.node, snap.api_version) == (node.gpus.name, version)
        uuids = {d.name: d.attribute("uuid") for s in snap.slices for d in s.devices}
        assert uuids == {f"gpu-{i}": node.gpus.uuids[f"gpu-{i}"] for i in range(3)}, "converted by the server"
        assert {p.name for p in snap.pods} == {"train-0"}
        assert [(c.name, [r.device for r in c.results]) for c in snap.claims] == [("train", ["gpu-0"])]
        eventually(lambda: new_requests(node, before)[("watch", "pods")] == 1)
        asked = new_requests(node, before)
    # This node's slices (spec.nodeName=<node>) and those that name no node (spec.nodeName=).
    assert (asked[("list", "resourceslices")], asked[("list", "pods")]) == (2, 1)
    assert asked[("get", "resourceclaims")] == 1
    assert asked[("list", "resourceclaims")] == asked[("watch", "resourceclaims")] == 0


def test_a_quiet_cluster_costs_no_requests_and_returns_the_same_snapshot(node: Node) -> None:
    start = node.requests()
    with source(node) as src:
        first = src.collect()

        def watching() -> bool:  # every list has its watch, as the server logged them
            asked = new_requests(node, start)
            return all(asked[("watch", resource)] >= n for (verb, resource), n in asked.items() if verb == "list")

        eventually(watching)
        before = node.requests()
        assert all(src.collect() is first for _ in range(20))
        assert new_requests(node, before) == Counter()


def test_claims_follow_their_pods_through_the_controller_manager(node: Node, kube: ControlPlane) -> None:
    """A pod's claim from a template: made by the controller-manager, named in the pod's status,
    fetched once; deleted with the pod, forgotten without a request. All by the watch."""
    ns = node.ns
    kube.create({"apiVersion": RESOURCE, "kind": "ResourceClaimTemplate",
                 "metadata": {"name": "short-gpu", "namespace": ns},
                 "spec": {"spec": {"devices": {"requests": [request("gpu", cel=node.gpus.uuid_cel("gpu-1"))]}}}})
    with source(node) as src:
        src.collect()
        before = node.requests()
        kube.pod(ns, "short-0", templates={"gpu": "short-gpu"}, node_name=node.gpus.name)
        kube.wait_scheduled(ns, "short-0")

        def generated() -> str:
            snap = src.collect()
            names = {c.name for c in snap.claims if c.name.startswith("short-0-gpu-") and c.results}
            return next(iter(names), "")

        eventually(lambda: bool(generated()), timeout=30)
        name = generated()
        kube.delete(f"/api/v1/namespaces/{ns}/pods/short-0")
        eventually(lambda: {c.name for c in src.collect().claims} == {"train"}, timeout=30)
        asked = new_requests(node, before)
    assert asked[("list", "pods")] == 0, "watch events, no re-list"
    assert asked[("get", "resourceclaims")] >= 1 and all(c.name != name for c in src.collect().claims)


def test_claims_are_fetched_again_after_the_refresh_period(node: Node) -> None:
    now = [0.0]
    with source(node, claim_refresh=300.0, monotonic=lambda: now[0]) as src:
        src.collect()
        before = node.requests()
        now[0] = 299.0
        src.collect()
        assert new_requests(node, before)[("get", "resourceclaims")] == 0, "never sooner than the refresh period"
        now[0] = 300.0 * (1 + REFRESH_SPREAD)
        src.collect()
        assert new_requests(node, before)[("get", "resourceclaims")] == 1, "due by the end of the spread"


def test_a_new_pod_of_a_claim_in_use_fetches_it_again(node: Node, kube: ControlPlane) -> None:
    # Its reservedFor has changed (the real scheduler adds the pod): waiting for the refresh would show it late.
    with source(node, monotonic=lambda: 0.0) as src:
        src.collect()
        before = node.requests()
        kube.pod(node.ns, "train-1", claims={"gpu": "train"}, node_name=node.gpus.name)
        kube.wait_scheduled(node.ns, "train-1")

        def both_reserve() -> bool:
            train = src.collect().claim(node.ns, "train")
            return train is not None and len(train.reserved_for) == 2

        eventually(both_reserve, timeout=30)
        assert new_requests(node, before)[("get", "resourceclaims")] == 1
    kube.delete(f"/api/v1/namespaces/{node.ns}/pods/train-1")


def test_claims_named_by_the_kubelet_are_fetched_before_the_pod_watch_has_them(node: Node) -> None:
    hints = [(node.ns, "unused"), (node.ns, "nope")]
    with source(node, claim_hints=lambda: hints) as src:
        before = node.requests()
        claims = {c.name for c in src.collect().claims}
        assert claims == {"train", "unused"}, "a claim that does not exist is None, not an error"
        src.collect()
        assert new_requests(node, before)[("get", "resourceclaims")] == 3, "a missing claim is not asked every cycle"


def test_slices_that_name_no_node_are_read_and_kept_when_they_cover_this_node(node: Node, kube: ControlPlane) -> None:
    """allNodes, a nodeSelector on this node's label, one on another's, and per-device nodes — as
    the real server validates them (the simulator never did)."""
    name = node.gpus.name
    kube.request("PATCH", f"/api/v1/nodes/{name}", {"metadata": {"labels": {"rack": "r1"}}},
                 content_type="application/merge-patch+json")

    def nic(suffix: str, **spec: Any) -> dict[str, Any]:
        pool = f"{name}-{suffix}"
        return {"apiVersion": RESOURCE, "kind": "ResourceSlice", "metadata": {"name": pool},
                "spec": {"driver": "nic.example.com", "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                         **spec}}

    def rack(value: str) -> dict[str, Any]:
        return {"nodeSelectorTerms": [{"matchExpressions": [{"key": "rack", "operator": "In", "values": [value]}]}]}

    slices = [nic("fabric", allNodes=True, devices=[{"name": "fabric-0"}]),
              nic("r1", nodeSelector=rack("r1"), devices=[{"name": "tor-0"}]),
              nic("r2", nodeSelector=rack("r2"), devices=[{"name": "tor-1"}]),
              nic("per-device", perDeviceNodeSelection=True, devices=[
                  {"name": "here", "nodeName": name}, {"name": "elsewhere", "nodeName": "another-node"}])]
    for sl in slices:
        kube.create(sl)
    try:
        before = node.requests()
        with source(node) as src:
            snap = src.collect()
        devices = {(s.pool.removeprefix(f"{name}-"), d.name) for s in snap.slices for d in s.devices
                   if s.driver == "nic.example.com"}
        assert devices == {("fabric", "fabric-0"), ("r1", "tor-0"), ("per-device", "here")}
        assert new_requests(node, before)[("get", "nodes")] == 1, "the node's labels, for the nodeSelector slices"
    finally:
        for sl in slices:
            kube.delete(f"/apis/{RESOURCE}/resourceslices/{sl['metadata']['name']}")


def test_allowlisted_pod_labels_are_kept_and_follow_a_relabel_by_the_watch(node: Node, kube: ControlPlane) -> None:
    path = f"/api/v1/namespaces/{node.ns}/pods/train-0"

    def relabel(labels: dict[str, str | None]) -> None:
        status, body = kube.request("PATCH", path, {"metadata": {"labels": labels}},
                                    content_type="application/merge-patch+json")
        assert status == 200, body

    def labels_of(src: KubeApiSource) -> tuple[tuple[str, str], ...]:
        (pod,) = [p for p in src.collect().pods if p.name == "train-0"]
        return pod.labels

    relabel({"team": "platform", "cost-center": "cc-7", "app.kubernetes.io/name": "trainer"})
    try:
        with source(node, pod_labels=("team", "app.kubernetes.io/name")) as src:
            assert labels_of(src) == (("app.kubernetes.io/name", "trainer"), ("team", "platform")), \
                "only the allowlisted labels"
            relabel({"team": "research"})
            eventually(lambda: labels_of(src) == (("app.kubernetes.io/name", "trainer"), ("team", "research")))
        with source(node) as src:
            assert labels_of(src) == (), "none without an allowlist"
    finally:
        relabel({"team": None, "cost-center": None, "app.kubernetes.io/name": None})
