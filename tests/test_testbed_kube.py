"""The test bed itself: the real control plane starts, accepts a Node the scheduler uses, and the real
scheduler allocates a DRA claim on it. If these fail, every ``testbed_kube`` test's failure is about the
harness, not the exporter."""

from __future__ import annotations

from typing import Any

import pytest
from kubetestbed import ControlPlane, ControlPlaneError

pytestmark = pytest.mark.testbed_kube


def _slice(node: str, devices: int, driver: str = "gpu.example.com") -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver}"},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}", "attributes": {"index": {"int": i}}} for i in range(devices)]}}


def _class(name: str, driver: str = "gpu.example.com") -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{driver}'"}}]}}


def _claim(namespace: str, name: str, device_class: str, count: int = 1) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}}]}}}


def test_the_scheduler_allocates_a_claim_on_a_node_made_ready_by_hand(kube: ControlPlane) -> None:
    ns = kube.namespace("smoke")
    node = kube.ready_node()
    device_class = kube.unique("smoke-class")
    kube.create(_slice(node, 2))
    kube.create(_class(device_class))
    kube.create(_claim(ns, "two", device_class, count=2))
    kube.pod(ns, "worker", claims={"gpus": "two"}, node_name=node)
    pod = kube.wait_scheduled(ns, "worker")
    assert pod["spec"]["nodeName"] == node
    claim = kube.get(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/two")
    results = claim["status"]["allocation"]["devices"]["results"]
    assert sorted(r["device"] for r in results) == ["gpu-0", "gpu-1"]
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [pod["metadata"]["uid"]]

    # A third device does not exist: the scheduler says so and binds nothing.
    kube.create(_claim(ns, "one-more", device_class))
    kube.pod(ns, "waiting", claims={"gpu": "one-more"}, node_name=node)
    assert "cannot allocate all claims" in kube.unschedulable_message(ns, "waiting")


def test_the_server_refuses_what_it_refuses_with_its_message(kube: ControlPlane) -> None:
    ns = kube.namespace("refuse")
    admin_claim = _claim(ns, "admin", "any")
    admin_claim["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] = True
    status, message = kube.try_create(admin_claim)
    assert status == 422 and "admin-access" in message
    with pytest.raises(ControlPlaneError, match="422"):
        kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "no-image", "namespace": ns},
                     "spec": {"containers": [{"name": "c"}]}})
