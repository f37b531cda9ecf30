"""Claim states against the real control plane: the cluster mode (its ``ClusterSource`` on the admin
kubeconfig, then the capacity core) reads pods from the real API server, and its states follow what the
real scheduler and resourceclaim controller do: a claim whose pod ended is deallocated and is ``unused``,
never pending; a claim is pending only while a pod waits for it, by name or through a template."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kubetestbed import ControlPlane
from simnode import eventually

from dra_exporter import catalog as cat
from dra_exporter.cluster.capacity import Capacity
from dra_exporter.cluster.explain import explain, render_text, unread_warnings
from dra_exporter.model import ClusterState, Frame
from dra_exporter.sources import PartialSnapshot, SourceError
from dra_exporter.sources.kubeapi import Timeouts
from dra_exporter.sources.kubeapi_cluster import RBAC_HINT, ClusterSource
from dra_exporter.sources.kubeapi_normalize import timestamp

FAST = Timeouts(request=10.0, backoff=(0.1, 0.5))
RESOURCE = "/apis/resource.k8s.io/v1"


def driver_with_devices(kube: ControlPlane, devices: int) -> tuple[str, str, str]:
    """A node with ``devices`` devices of a driver of its own and a DeviceClass for exactly them (slices
    and classes are cluster-wide: other tests' classes must not match them); (node, driver, class)."""
    node = kube.ready_node()
    driver = f"{kube.unique('drv')}.example.com"
    kube.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-gpus"},
                 "spec": {"driver": driver, "nodeName": node,
                          "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                          "devices": [{"name": f"gpu-{i}"} for i in range(devices)]}})
    device_class = kube.unique("gpus")
    kube.create(device_class_object(device_class, driver))
    return node, driver, device_class


def device_class_object(name: str, driver: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{driver}'"}}]}}


def claim_object(namespace: str, name: str, device_class: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}}}


@contextmanager
def cluster_mode(kube: ControlPlane, kubeconfig: str | None = None) -> Iterator[Callable[[], Frame]]:
    """The cluster mode's frames of the real cluster, one per call."""
    source = ClusterSource(kubeconfig=kubeconfig or str(kube.kubeconfig), timeouts=FAST)
    capacity = Capacity()
    try:
        yield lambda: capacity.frame(source.collect(), time.time())
    finally:
        source.close()


def claims_in(frame: Frame, namespace: str) -> dict[str, float]:
    """State → claims of ``namespace`` (states with none left out)."""
    return {dict(s.labels)["state"]: s.value for s in frame.family(cat.CLUSTER_CLAIMS.name).samples
            if dict(s.labels)["namespace"] == namespace and s.value}


def series(frame: Frame, spec: cat.MetricSpec, namespace: str) -> dict[str, float]:
    """Claim → its series' value (one series per claim) in ``namespace``."""
    fam = frame.family(spec.name)
    return {} if fam is None else {dict(s.labels)["claim"]: s.value for s in fam.samples
                                   if dict(s.labels)["namespace"] == namespace}


def test_a_claim_whose_pod_ended_is_deallocated_and_unused_not_pending(kube: ControlPlane) -> None:
    ns = kube.namespace("ended")
    node, _, device_class = driver_with_devices(kube, 1)
    kube.create(claim_object(ns, "job", device_class))
    kube.pod(ns, "job-0", claims={"gpu": "job"}, node_name=node)
    kube.wait_scheduled(ns, "job-0")
    with cluster_mode(kube) as frame:
        eventually(lambda: claims_in(frame(), ns) == {"reserved": 1.0}, timeout=30)
        kube.patch_status(kube.get(f"/api/v1/namespaces/{ns}/pods/job-0"), {"phase": "Succeeded"})
        # The real controller takes the ended pod out of reservedFor and deallocates the claim.
        kube.wait_for(lambda: "allocation" not in kube.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims/job")
                      .get("status", {}), "the claim deallocated")
        eventually(lambda: claims_in(frame(), ns) == {"unused": 1.0}, timeout=30)
        assert "job" not in series(frame(), cat.CLUSTER_CLAIM_PENDING, ns), "nobody waits: no pending age"


def test_the_cluster_mode_reads_pods_and_reports_each_state(kube: ControlPlane) -> None:
    ns = kube.namespace("states")
    node, _, device_class = driver_with_devices(kube, 1)
    nothing = kube.unique("nothing")  # a class whose driver publishes no device
    kube.create(device_class_object(nothing, f"{nothing}.example.com"))
    kube.create(claim_object(ns, "running", device_class))
    kube.pod(ns, "runner", claims={"gpu": "running"}, node_name=node)
    kube.wait_scheduled(ns, "runner")
    kube.create(claim_object(ns, "waiting", nothing))
    kube.create(claim_object(ns, "nobody", nothing))
    kube.create(claim_object(ns, "typo", f"{nothing}-typo"))
    either = claim_object(ns, "either", nothing)
    either["spec"]["devices"]["requests"] = [{"name": "gpu", "firstAvailable": [
        {"name": "a", "deviceClassName": nothing}, {"name": "b", "deviceClassName": f"{nothing}-gone"}]}]
    kube.create(either)
    kube.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                 "metadata": {"name": "per-pod", "namespace": ns},
                 "spec": {"spec": {"devices": {"requests": [{"name": "gpu",
                                                             "exactly": {"deviceClassName": nothing}}]}}}})
    waiter = kube.pod(ns, "waiter", claims={"gpu": "waiting"})
    kube.pod(ns, "typist", claims={"gpu": "typo"})
    kube.pod(ns, "chooser", claims={"gpu": "either"})
    kube.pod(ns, "templated", templates={"gpu": "per-pod"})
    # The resourceclaim controller makes the template's claim and names it in the pod's status.
    generated = kube.wait_for(lambda: next((s.get("resourceClaimName") for s in kube.get(
        f"/api/v1/namespaces/{ns}/pods/templated").get("status", {}).get("resourceClaimStatuses", [])), None),
        "the template's claim")
    missing = kube.unschedulable_message(ns, "typist")
    assert f"request gpu: device class {nothing}-typo does not exist" in missing
    # A missing class of any subrequest fails the whole claim, though the first one's class exists.
    assert f"request gpu/b: device class {nothing}-gone does not exist" in kube.unschedulable_message(ns, "chooser")
    with cluster_mode(kube) as frame:
        eventually(lambda: claims_in(frame(), ns) == {"reserved": 1.0, "pending": 4.0, "unused": 1.0}, timeout=30)
        current = frame()
        ages = series(current, cat.CLUSTER_CLAIM_PENDING, ns)
        assert set(ages) == {"waiting", "typo", "either", generated}
        # Aged from the pod's creation: the claim existed before it.
        waited = current.timestamp - timestamp(waiter["metadata"]["creationTimestamp"])
        assert waited - 1.0 <= float(ages["waiting"]) <= waited + 1.0  # the server's times are whole seconds

        def reasons() -> dict[str, tuple[str, str]]:
            return {dict(s.labels)["claim"]: (dict(s.labels)["request"], dict(s.labels)["reason"])
                    for s in frame().family(cat.CLUSTER_CLAIM_PENDING_REASON.name).samples
                    if dict(s.labels)["namespace"] == ns}

        # The cluster mode asks a few claim shapes per frame (explain.MAX_SHAPES_PER_FRAME): with other
        # modules' pending claims in the cluster, this namespace's reasons may come some frames later.
        eventually(lambda: len(reasons()) == 4, timeout=60)
        # As the scheduler says (its messages above); the others ask for a class no device matches.
        assert reasons() == {"typo": ("gpu", "class_missing"), "either": ("gpu/b", "class_missing"),
                             "waiting": ("gpu", "no_matching_device"), generated: ("gpu", "no_matching_device")}


def cluster_role(rules: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
            "rules": rules}


@pytest.mark.parametrize("without", ["", "pods", "nodes"])
def test_the_charts_cluster_role_is_what_the_cluster_mode_needs(kube: ControlPlane, tmp_path: Any,
                                                                 without: str) -> None:
    from deploy_tools import render_chart

    (role,) = [d for d in render_chart({"cluster": {"enabled": True}}) if d["kind"] == "ClusterRole"
               and d["metadata"]["labels"].get("app.kubernetes.io/component") == "cluster"]
    rules = [r for r in role["rules"] if r["resources"] != [without]]
    ns = kube.namespace("rbac")
    name = kube.unique("cluster-mode")
    kube.create(cluster_role(rules, name))
    kube.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader", "namespace": ns}})
    kube.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                 "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}]})
    kubeconfig = str(kube.token_kubeconfig(tmp_path / "reader.kubeconfig", kube.service_account_token(ns, "reader")))
    source = ClusterSource(kubeconfig=kubeconfig, timeouts=FAST)

    def refusal() -> str:
        try:
            source.collect()
        except SourceError as exc:
            return str(exc)
        return ""

    try:
        if not without:
            eventually(lambda: not refusal(), timeout=30)  # RBAC takes a moment to reach the authorizer
            assert source.collect().nodes is not None
        elif without == "nodes":
            # Without Nodes the cluster mode runs on, node filters unknown (one warning): not a failure.
            eventually(lambda: not refusal(), timeout=30)
            assert source.collect().nodes is None
        else:
            # Until the binding is in force, the first refusal is the DRA kinds'.
            eventually(lambda: "pods" in refusal(), timeout=30)
            assert refusal() == f"kubeapi: forbidden (403) to list pods: {RBAC_HINT}"
            # A pod waits for a claim the reader cannot see it wait for: no verdict, "unknown".
            _, _, device_class = driver_with_devices(kube, 0)
            kube.create(claim_object(ns, "waited-for", device_class), ns)
            kube.pod(ns, "waiter", claims={"gpu": "waited-for"})

            def partial() -> ClusterState:
                try:
                    source.collect()
                except PartialSnapshot as exc:
                    state = exc.snapshot
                    assert isinstance(state, ClusterState)
                    return state
                raise AssertionError("pods were read")

            eventually(lambda: any(c.name == "waited-for" for c in partial().claims), timeout=30)
            state = partial()
            assert [kind for kind, _ in state.unread] == ["pods"] and not state.read("pods")
            frame = Capacity().frame(state, time.time())
            claims = {dict(s.labels)["state"]: s.value for s in frame.family(cat.CLUSTER_CLAIMS.name).samples
                      if dict(s.labels)["namespace"] == ns}
            assert claims == {"pending": 0, "unused": 0, "allocated": 0, "reserved": 0, "unknown": 1}
            objects = {dict(s.labels)["kind"] for s in frame.family(cat.CLUSTER_OBJECTS.name).samples}
            assert "Pod" not in objects and "ResourceClaim" in objects  # unknown, not 0
            (outcome,) = explain(state, [(ns, "waited-for")])
            assert outcome.pod_waits is None and "no pod waits" not in render_text([outcome])
            (warning,) = unread_warnings(state)
            assert warning.startswith("could not read pods (forbidden (403) to list pods") and "unknown" in warning
            # What the operator runs says it on stderr, and gives no verdict.
            cli = [sys.executable, "-m", "dra_exporter.cli"]
            once = subprocess.run([*cli, "cluster", "--once", "--kubeconfig", kubeconfig], capture_output=True,
                                  text=True, timeout=120, check=False)
            assert once.returncode == 0 and "forbidden (403) to list pods" in once.stderr, once.stderr
            assert f'dra_cluster_claims{{namespace="{ns}",state="unknown"}} 1' in once.stdout
            why = subprocess.run([*cli, "explain", f"{ns}/waited-for", "--kubeconfig", kubeconfig],
                                 capture_output=True, text=True, timeout=120, check=False)
            assert why.returncode == 0 and "could not read pods" in why.stderr, why.stderr
            assert "no pod waits" not in why.stdout
    finally:
        source.close()
