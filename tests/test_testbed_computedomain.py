"""NVIDIA's ComputeDomains in the real API server: the CRDs (tests/fixtures/crds, written from
the driver's API) installed into kube-apiserver v1.36, and the kubeapi source discovering, listing
and watching ComputeDomains and ComputeDomainCliques there — including CRDs installed after the
exporter started, which it must find without a restart.

A node joins a domain the way the driver's objects say (computedomain-nvlink facts, §1.4): a
claim of the ``compute-domain.nvidia.com`` channel device, allocated by the real scheduler, whose
opaque ``ComputeDomainChannelConfig`` names the domain's UID.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kubenode import (
    CD_DISCOVERY,
    RESOURCE,
    allocated,
    install_compute_domain_crds,
    remove_compute_domain_crds,
)
from kubetestbed import ControlPlane
from simnode import eventually

from dra_exporter.sources import kubeapi
from dra_exporter.sources.kubeapi import KubeApiSource, Timeouts

pytestmark = pytest.mark.testbed_kube

FAST = Timeouts(request=5.0, backoff=(0.05, 0.2))
CD_DRIVER = "compute-domain.nvidia.com"
CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"
CD_API = "resource.nvidia.com/v1beta1"
CLIQUE = "7b968a6d-c8aa-45e1-9e07-e1e51be99c31.1"
DOMAIN_LABEL = "resource.nvidia.com/computeDomain"


def domain(namespace: str, name: str) -> dict[str, Any]:
    return {"apiVersion": CD_API, "kind": "ComputeDomain", "metadata": {"name": name, "namespace": namespace},
            "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": f"{name}-channel"}}}}


def member(node: str, status: str = "Ready", index: int = 0) -> dict[str, Any]:
    return {"name": node, "ipAddress": "10.0.0.1", "cliqueID": CLIQUE, "index": index, "status": status}


def clique(namespace: str, uid: str, *daemons: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": CD_API, "kind": "ComputeDomainClique",
            "metadata": {"name": f"{uid}.{CLIQUE}", "namespace": namespace,
                         "labels": {DOMAIN_LABEL: uid, f"{DOMAIN_LABEL}.cliqueID": CLIQUE}},
            "daemons": [{"nodeName": d["name"], **{k: v for k, v in d.items() if k != "name"}} for d in daemons]}


def channel_node(kube: ControlPlane) -> str:
    """A node whose compute-domain kubelet plugin published its channel-0 and daemon-0 (the two
    devices the driver puts in the slice), and the driver's channel DeviceClass."""
    status, message = kube.try_create({
        "apiVersion": RESOURCE, "kind": "DeviceClass", "metadata": {"name": CHANNEL_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{CD_DRIVER}' && "
                                                      f"device.attributes['{CD_DRIVER}'].type == 'channel' && "
                                                      f"device.attributes['{CD_DRIVER}'].id == 0"}}]}})
    assert status in (201, 409), message
    node = kube.ready_node(kube.unique("imex"))
    kube.create({"apiVersion": RESOURCE, "kind": "ResourceSlice", "metadata": {"name": f"{node}-cd"},
                 "spec": {"driver": CD_DRIVER, "nodeName": node,
                          "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                          "devices": [{"name": f"{kind}-0", "attributes": {"type": {"string": kind}, "id": {"int": 0}}}
                                      for kind in ("channel", "daemon")]}})
    return node


def join(kube: ControlPlane, node: str, namespace: str, uid: str) -> None:
    """A workload pod on ``node`` whose channel claim names the domain ``uid``, allocated by the scheduler."""
    name = kube.unique("channel")
    kube.create({"apiVersion": RESOURCE, "kind": "ResourceClaim", "metadata": {"name": name, "namespace": namespace},
                 "spec": {"devices": {
                     "requests": [{"name": "channel", "exactly": {"deviceClassName": CHANNEL_CLASS}}],
                     "config": [{"requests": ["channel"], "opaque": {"driver": CD_DRIVER, "parameters": {
                         "apiVersion": CD_API, "kind": "ComputeDomainChannelConfig", "domainID": uid,
                         "allocationMode": "Single"}}}]}}})
    kube.pod(namespace, f"{name}-pod", claims={"channel": name}, node_name=node)
    kube.wait_scheduled(namespace, f"{name}-pod")
    allocated(kube, namespace, name)


@contextmanager
def source(kube: ControlPlane, node: str, now: list[float]) -> Iterator[KubeApiSource]:
    src = KubeApiSource(node, kubeconfig=str(kube.kubeconfig), timeouts=FAST, monotonic=lambda: now[0])
    try:
        yield src
    finally:
        src.close()


def test_the_crds_default_validate_and_keep_the_spec_immutable(kube: ControlPlane) -> None:
    """What the real server does with the driver's schema: defaults filled in (the simulator wrote
    them itself), an unknown enum refused, a spec change refused with the driver's message."""
    install_compute_domain_crds(kube)
    ns = kube.namespace("cd-schema")
    made = kube.create(domain(ns, "train"))
    assert made["spec"]["channel"]["allocationMode"] == "Single" and made["spec"]["numNodes"] == 0
    updated = kube.patch_status(made, {"nodes": [{"name": "n", "ipAddress": "10.0.0.9", "cliqueID": ""}]})
    assert updated["status"]["status"] == "NotReady" and updated["status"]["nodes"][0]["status"] == "NotReady"
    bad = domain(ns, "bad")
    bad["spec"]["channel"]["allocationMode"] = "Some"
    status, message = kube.try_create(bad)
    assert status == 422 and "allocationMode" in message
    status, body = kube.request("PATCH", f"/apis/{CD_API}/namespaces/{ns}/computedomains/train",
                                {"spec": {"numNodes": 2}}, content_type="application/merge-patch+json")
    assert status == 422 and "A computeDomain.spec is immutable" in body["message"]


def test_domains_and_cliques_are_listed_once_then_watched(kube: ControlPlane) -> None:
    install_compute_domain_crds(kube)
    node, ns, driver_ns = channel_node(kube), kube.namespace("cd-work"), kube.namespace("cd-driver")
    dom = kube.create(domain(ns, "train"))
    uid = dom["metadata"]["uid"]
    kube.patch_status(dom, {"status": "Ready", "nodes": [member(node)]})
    kube.create(clique(driver_ns, uid, member(node)))
    kube.create(domain(ns, "elsewhere"))  # no claim here names it
    join(kube, node, ns, uid)
    now = [0.0]
    with source(kube, node, now) as src:
        snap = src.collect()
        assert src.compute_domain_resources == {"computedomains", "computedomaincliques"}
        assert [(d.name, d.uid, d.status) for d in snap.compute_domains] == [("train", uid, "Ready")]
        assert [(c.domain_uid, c.clique, [d.name for d in c.daemons]) for c in snap.compute_domain_cliques] == [
            (uid, CLIQUE, [node])]
        kube.patch_status(kube.get(f"/apis/{CD_API}/namespaces/{ns}/computedomains/train"),
                          {"status": "NotReady", "nodes": [member(node, "NotReady")]})
        eventually(lambda: src.collect().compute_domains[0].status == "NotReady", timeout=30)
        assert src.collect().compute_domains[0].nodes[0].status == "NotReady"
        kube.request("PATCH", f"/apis/{CD_API}/namespaces/{driver_ns}/computedomaincliques/{uid}.{CLIQUE}",
                     {"daemons": [{"nodeName": node, "ipAddress": "10.0.0.1", "cliqueID": CLIQUE, "index": 0,
                                   "status": "NotReady"}]}, content_type="application/merge-patch+json")
        eventually(lambda: src.collect().compute_domain_cliques[0].daemons[0].status == "NotReady", timeout=30)
        assert (src.requests["list computedomains"], src.requests["list computedomaincliques"]) == (1, 1), \
            "changes came by the watches"


def test_crds_installed_after_the_exporter_started_are_found_without_a_restart(kube: ControlPlane) -> None:
    remove_compute_domain_crds(kube)
    node, ns = channel_node(kube), kube.namespace("cd-late")
    now = [0.0]
    with source(kube, node, now) as src:
        assert src.collect().compute_domains == ()
        assert src.compute_domain_resources == frozenset()
        discoveries = src.requests["discover"]
        src.collect()
        assert src.requests["discover"] == discoveries, "not asked again at once"

        install_compute_domain_crds(kube)
        dom = kube.create(domain(ns, "late"))
        kube.patch_status(dom, {"status": "Ready", "nodes": [member(node)]})
        join(kube, node, ns, dom["metadata"]["uid"])
        now[0] = kubeapi.REDISCOVER_S
        eventually(lambda: [d.name for d in src.collect().compute_domains] == ["late"], timeout=30)
        assert src.compute_domain_resources == {"computedomains", "computedomaincliques"}
        assert src.requests["discover"] == discoveries + 1
    status, _ = kube.request("GET", CD_DISCOVERY)
    assert status == 200
