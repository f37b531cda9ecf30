"""The node agent against the real control plane: the simulator's NVML and kubelet, the real
kube-apiserver, kube-scheduler and kube-controller-manager v1.36 (``tests/kubetestbed.py``).

Every claim here is allocated by the real scheduler (whole GPUs, MIG partitions that consume
shared counters, a prioritized list, admin access, ``nvidia.com/gpu: 1`` served by DRA) or made
from a ResourceClaimTemplate by the real controller-manager; the agent reads the slices in each
version the server serves (the server converts), the pods with their ``resourceClaimStatuses``
and ``extendedResourceClaimStatus``, slice taints and a DeviceTaintRule (v1beta2: 1.36 serves
none in v1), and keeps reading across an apiserver restart and an etcd compaction. The series'
claim, pod and namespace attribution must be what the server says.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from deploy_tools import render_chart
from kubenode import (
    GPU_CLASS,
    MIG_CLASS,
    RESOURCE,
    GpuNode,
    allocated,
    allocated_devices,
    claim,
    device_class,
    request,
)
from kubetestbed import ControlPlane
from simnode import device_labels, eventually, labels_of, simulated, source_up

from dra_exporter import catalog as cat
from dra_exporter.sources import kubeapi

pytestmark = pytest.mark.testbed_kube

EXTENDED_CLASS = "gpu-extended.nvidia.com"
EXTENDED = "nvidia.com/gpu"
NOW = "2026-01-01T00:00:00Z"
#: gpu-0..5 for the workloads (gpu-3 in MIG mode, two partitions), gpu-6 idle and tainted, gpu-7
#: for the watch tests, gpu-8 through another driver.
GPUS = [{"index": i} for i in range(6)] + [
    {"index": 6, "taints": [{"key": "example.com/maintenance", "value": "fan", "effect": "NoSchedule"}]},
    {"index": 7}, {"index": 8}]
#: gpu-8 is also another driver's device: its slice names it only by the uuid attribute.
EXAMPLE_DRIVER = "gpu.example.com"
GPUS[3] = {"index": 3, "mig": [{"profile": "3g.71gb", "placement_start": 0},
                               {"profile": "1g.18gb", "placement_start": 4}]}


@dataclass
class Cluster:
    """What the real server holds for one simulated node, once allocated."""

    node: GpuNode
    ml: str
    ops: str
    claims: dict[str, dict[str, Any]]
    """Pod name → the real objects of its claims ({claim name: object})."""
    pods: dict[str, dict[str, Any]]
    scenario: Path
    rule: str

    def pod_uid(self, pod: str) -> str:
        return str(self.pods[pod]["metadata"]["uid"])


def _ensure_extended_class(kube: ControlPlane) -> None:
    status, message = kube.try_create(device_class(EXTENDED_CLASS, "gpu", extendedResourceName=EXTENDED))
    assert status in (201, 409), message


@pytest.fixture(scope="module")
def cluster(kube: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    """One node, its pods scheduled one after the other so each one's devices are known."""
    _ensure_extended_class(kube)
    node = GpuNode.register(kube, GPUS, seed=5, prefix="agent")
    ml, ops = kube.namespace("ml"), kube.namespace("ops", admin_access=True)
    pods: dict[str, dict[str, Any]] = {}

    def schedule(ns: str, name: str, **kw: Any) -> None:
        kube.pod(ns, name, node_name=node.name, **kw)
        kube.wait_scheduled(ns, name)
        pods[name] = kube.run_pod(ns, name)

    # Each pod is pinned to its devices by CEL, so the simulated kubelet's report can be written
    # before the scheduler's choice is known ... and is anyway written after it (GpuNode.scenario).
    kube.create(claim(ml, "slice", request("mig", MIG_CLASS, cel=node.parent_cel("gpu-3", "3g.71gb"))))
    schedule(ml, "infer-0", claims={"mig": "slice"})
    kube.create(claim(ml, "pair", request("first", cel=node.uuid_cel("gpu-2")),
                      request("second", MIG_CLASS, cel=node.parent_cel("gpu-3", "1g.18gb"))))
    schedule(ml, "pair-0", claims={"pair": "pair"}, containers={"a": ("pair/first",), "b": ("pair/second",)})
    # A prioritized list: no H100 here, so the scheduler takes the second choice.
    kube.create(claim(ml, "train", {"name": "main", "firstAvailable": [
        {"name": "h100x2", "deviceClassName": GPU_CLASS, "allocationMode": "ExactCount", "count": 2,
         "selectors": [{"cel": {"expression": f"device.attributes['{GPU_CLASS}'].productName == 'NVIDIA H100'"}}]},
        {"name": "h200x2", "deviceClassName": GPU_CLASS, "allocationMode": "ExactCount", "count": 2,
         "selectors": [{"cel": {"expression": f"{node.uuid_cel('gpu-0')} || {node.uuid_cel('gpu-1')}"}}]}]}))
    schedule(ml, "train-0", claims={"gpus": "train"}, containers={"trainer": ("gpus",)})
    # What the driver and the kubelet write: a device condition on the claim (status.devices), the
    # devices' health in the pod's container status (one as a triplet, one as a CDI name).
    train = allocated(kube, ml, "train")
    kube.patch_status(train, {"devices": [{"driver": GPU_CLASS, "pool": node.name, "device": "gpu-1", "conditions": [
        {"type": "Ready", "status": "True", "reason": "Prepared", "message": "", "lastTransitionTime": NOW}]}]})
    trainer = pods["train-0"]["status"]["containerStatuses"]
    trainer[0]["allocatedResourcesStatus"] = [{"name": "claim:gpus", "resources": [
        {"resourceID": f"{GPU_CLASS}/{node.name}/gpu-0", "health": "Healthy"},
        {"resourceID": f"k8s.gpu.nvidia.com/claim={train['metadata']['uid']}-gpu-1", "health": "Unhealthy",
         "message": "XID 79: GPU has fallen off the bus"}]}]
    pods["train-0"] = kube.patch_status(pods["train-0"], {"containerStatuses": trainer})
    # A claim the controller-manager makes from a template, and one the scheduler makes for nvidia.com/gpu.
    kube.create({"apiVersion": RESOURCE, "kind": "ResourceClaimTemplate", "metadata": {"name": "one-gpu",
                 "namespace": ml}, "spec": {"spec": {"devices": {"requests": [
                     request("gpu", cel=node.uuid_cel("gpu-4"))]}}}})
    schedule(ml, "job-0", templates={"gpu": "one-gpu"}, containers={"job": ("gpu",)})
    schedule(ml, "ext-0", containers={"cuda": ()}, extended={EXTENDED: "1"})
    # Another driver's device that is gpu-8: only its slice's uuid attribute says so.
    status, message = kube.try_create({"apiVersion": RESOURCE, "kind": "DeviceClass",
                                       "metadata": {"name": EXAMPLE_DRIVER}, "spec": {"selectors": [
                                           {"cel": {"expression": f"device.driver == '{EXAMPLE_DRIVER}'"}}]}})
    assert status in (201, 409), message
    accel = [{"name": "accel-0", "attributes": {"uuid": node.uuids["gpu-8"], "model": "Example"}}]
    kube.create({"apiVersion": RESOURCE, "kind": "ResourceSlice", "metadata": {"name": f"{node.name}-example"},
                 "spec": {"driver": EXAMPLE_DRIVER, "nodeName": node.name,
                          "pool": {"name": node.name, "generation": 1, "resourceSliceCount": 1},
                          "devices": [{"name": d["name"], "attributes": {k: {"string": v} for k, v in
                                                                         d["attributes"].items()}} for d in accel]}})
    kube.create(claim(ml, "alt", request("gpu", EXAMPLE_DRIVER)))
    schedule(ml, "alt-0", claims={"gpu": "alt"}, containers={"c": ("gpu",)})
    # Admin access to every GPU of the node but gpu-7, in use or not (the tainted one tolerated): monitoring.
    kube.create(claim(ops, "watch-all", request(
        "all", allocationMode="All", adminAccess=True, cel=f"!({node.uuid_cel('gpu-7')})",
        tolerations=[{"key": "example.com/maintenance", "operator": "Exists", "effect": "NoSchedule"}])))
    schedule(ops, "dcgm-0", claims={"all": "watch-all"}, containers={"dcgm": ("all",)})

    claims: dict[str, dict[str, Any]] = {}
    for name, pod in pods.items():
        pod = pods[name] = kube.get(f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{name}")
        ns = pod["metadata"]["namespace"]
        names = {s["resourceClaimName"] for s in pod["status"].get("resourceClaimStatuses", ())}
        names |= {c["resourceClaimName"] for c in pod["spec"].get("resourceClaims", ()) if c.get("resourceClaimName")}
        if ext := pod["status"].get("extendedResourceClaimStatus"):
            names.add(ext["resourceClaimName"])
        claims[name] = {n: allocated(kube, ns, n) for n in names}

    # The DeviceTaintRule last: this build's scheduler must never see one (tests/kubetestbed.py).
    rule = kube.unique("drain")
    kube.create({"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule", "metadata": {"name": rule},
                 "spec": {"deviceSelector": {"driver": GPU_CLASS, "pool": node.name, "device": "gpu-6"},
                          "taint": {"key": "example.com/drain", "value": "now", "effect": "NoSchedule"}}})
    every = [c for cs in claims.values() for c in cs.values()]
    path = node.scenario(tmp_path_factory.mktemp("agent") / "node.yaml", every, list(pods.values()),
                         slices=[{"driver": EXAMPLE_DRIVER, "devices": accel}])
    return Cluster(node, ml, ops, claims, pods, path, rule)


@contextmanager
def agent(cluster: Cluster, kube: ControlPlane, version: str = "v1") -> Iterator[Any]:
    """The node agent in-process on the scenario, its API server the real one, reading ``version``
    (an exporter that knows only that one: the server converts)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kubeapi, "SUPPORTED_VERSIONS", (version,))
        with simulated(str(cluster.scenario), kubeconfig=str(kube.kubeconfig)) as rt:
            yield rt


def attribution(labels: dict[str, str]) -> tuple[str, ...]:
    return tuple(labels[k] for k in cat.ATTRIBUTION_LABELS)


def pick(frame: Any, name: str, *keys: str) -> set[tuple[str, ...]]:
    return {tuple(lbl[k] for k in keys) for lbl in labels_of(frame, name)}


def kubeapi_source(rt: Any) -> kubeapi.KubeApiSource:
    (source,) = [r.source for r in rt.agent.side if isinstance(r.source, kubeapi.KubeApiSource)]
    return source


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
def test_attribution_is_what_the_real_scheduler_and_controller_manager_made(
        cluster: Cluster, kube: ControlPlane, version: str) -> None:
    with agent(cluster, kube, version) as rt:
        frame = rt.agent.cycle(collect_side=True)
        assert kubeapi_source(rt).api_version == version
    assert source_up(frame, "kubeapi") == 1.0
    node, ml, uid = cluster.node, cluster.ml, cluster.pod_uid
    by_uuid = device_labels(frame)
    mig = {d: u for d, u in node.uuids.items() if "-mig-" in d}
    (slice_mig,) = [u for d, u in mig.items() if "3g71gb" in d]
    (pair_mig,) = [u for d, u in mig.items() if "1g18gb" in d]
    (job_claim,) = cluster.claims["job-0"]
    (ext_claim,) = cluster.claims["ext-0"]
    ext_request = cluster.pods["ext-0"]["status"]["extendedResourceClaimStatus"]["requestMappings"][0]["requestName"]
    expected = {
        node.uuids["gpu-0"]: (ml, "train-0", uid("train-0"), "trainer", "train", "main/h200x2"),
        node.uuids["gpu-1"]: (ml, "train-0", uid("train-0"), "trainer", "train", "main/h200x2"),
        node.uuids["gpu-2"]: (ml, "pair-0", uid("pair-0"), "a", "pair", "first"),
        pair_mig: (ml, "pair-0", uid("pair-0"), "b", "pair", "second"),
        slice_mig: (ml, "infer-0", uid("infer-0"), "main", "slice", "mig"),
        # The controller-manager's claim, named in the pod's status.resourceClaimStatuses.
        node.uuids["gpu-4"]: (ml, "job-0", uid("job-0"), "job", job_claim, "gpu"),
        # nvidia.com/gpu: 1, served by the claim the scheduler made (status.extendedResourceClaimStatus).
        node.uuids["gpu-5"]: (ml, "ext-0", uid("ext-0"), "cuda", ext_claim, ext_request),
        node.uuids["gpu-3"]: ("",) * 6,  # in MIG mode
        node.uuids["gpu-6"]: ("",) * 6,  # tainted, only the monitoring claim has it
        node.uuids["gpu-7"]: ("",) * 6,
        # Found only through the other driver's slice: its uuid attribute.
        node.uuids["gpu-8"]: (ml, "alt-0", uid("alt-0"), "c", "alt", "gpu"),
    }
    assert {u: attribution(by_uuid[u]) for u in expected} == expected
    assert job_claim.startswith("job-0-gpu-") and ext_claim.startswith("ext-0-extended-resources-")

    # The admin-access claim is monitoring: allocations, no consumer.
    consumers = pick(frame, cat.CLAIM_CONSUMER_INFO.name, "namespace", "pod")
    assert (cluster.ops, "dcgm-0") not in consumers and (ml, "train-0") in consumers
    allocations = pick(frame, cat.CLAIM_ALLOCATION_INFO.name, "namespace", "claim", "request", "uuid", "admin_access")
    watched = {node.uuids[f"gpu-{i}"] for i in (0, 1, 2, 4, 5, 6, 8)}
    assert {(cluster.ops, "watch-all", "all", u, "true") for u in watched} <= allocations
    assert (ml, "train", "main/h200x2", node.uuids["gpu-0"], "false") in allocations
    claim_uids = dict(pick(frame, cat.CLAIM_ALLOCATION_INFO.name, "claim", "claim_uid"))
    assert claim_uids["train"] == cluster.claims["train-0"]["train"]["metadata"]["uid"]

    assert pick(frame, cat.CLAIM_DEVICE_CONDITION.name, "claim", "device", "type", "status") == {
        ("train", "gpu-1", "Ready", "True")}
    # The container names the claim, not a request: so does the status ("claim:gpus"; the server
    # refuses "claim:gpus/main" for it); the health series names the request as every family does, the
    # allocation result's (issue 34). The extended resource's device has no status at all: Unknown.
    assert pick(frame, cat.DEVICE_HEALTH.name, "pod", "container", "claim", "request", "device", "health") == {
        ("train-0", "trainer", "train", "main/h200x2", "gpu-0", "Healthy"),
        ("train-0", "trainer", "train", "main/h200x2", "gpu-1", "Unhealthy"),
        ("ext-0", "cuda", ext_claim, ext_request, "gpu-5", "Unknown")}

    # A slice's own taint, and a DeviceTaintRule (read in v1beta2: 1.36 serves none in v1).
    assert pick(frame, cat.DEVICE_TAINT.name, "device", "key", "value", "effect") == {
        ("gpu-6", "example.com/maintenance", "fan", "NoSchedule"), ("gpu-6", "example.com/drain", "now", "NoSchedule")}
    info = {lbl["device"]: lbl for lbl in labels_of(frame, cat.DEVICE_INFO.name)}
    assert (info["gpu-3-mig-3g71gb-9-0"]["type"], info["gpu-3-mig-3g71gb-9-0"]["parent_uuid"]) == (
        "mig", node.uuids["gpu-3"])
    assert {lbl["node"] for lbl in info.values()} == {node.name}
    assert (info["accel-0"]["driver"], info["accel-0"]["uuid"]) == (EXAMPLE_DRIVER, node.uuids["gpu-8"])


def test_the_taint_rules_are_read_in_v1beta2_which_is_what_1_36_serves(cluster: Cluster, kube: ControlPlane) -> None:
    status, _ = kube.request("GET", f"/apis/resource.k8s.io/v1/devicetaintrules/{cluster.rule}")
    assert status == 404, "the simulator served DeviceTaintRules in v1; 1.36 does not"
    with agent(cluster, kube) as rt:
        rt.agent.cycle(collect_side=True)
        assert kubeapi_source(rt).taint_rule_version == "v1beta2"


def test_mig_partitions_consume_the_shared_counters_the_scheduler_counts(
        kube: ControlPlane, tmp_path: Path) -> None:
    """A partitionable GPU (KEP-4815, dynamic MIG): once a MIG partition holds part of gpu-1's
    counters, the real scheduler refuses gpu-1 whole, even to an admin-access claim (the simulator
    let admin access share any device). The agent reports the counters and their consumer."""
    node = GpuNode.register(kube, [{"index": 0}, {"index": 1}], seed=9, dynamic_mig=True, prefix="dyn")
    ns, ops = kube.namespace("dyn"), kube.namespace("dyn-ops", admin_access=True)
    kube.create(claim(ns, "part", request("mig", MIG_CLASS, cel=node.parent_cel("gpu-1", "3g.71gb"))))
    kube.pod(ns, "part-0", claims={"mig": "part"}, node_name=node.name)
    kube.wait_scheduled(ns, "part-0")
    part = allocated(kube, ns, "part")
    kube.create(claim(ns, "whole", request("gpu", cel=node.uuid_cel("gpu-1"))))
    kube.pod(ns, "whole-0", claims={"gpu": "whole"}, node_name=node.name)
    kube.create(claim(ops, "watch", request("gpu", cel=node.uuid_cel("gpu-1"), adminAccess=True)))
    kube.pod(ops, "watch-0", claims={"gpu": "watch"}, node_name=node.name)
    for pod_ns, pod in ((ns, "whole-0"), (ops, "watch-0")):
        assert "cannot allocate all claims" in kube.unschedulable_message(pod_ns, pod)

    (device,) = allocated_devices(part)
    pod = kube.run_pod(ns, "part-0")
    path = node.scenario(tmp_path / "dyn.yaml", [part], [pod])
    with simulated(str(path), kubeconfig=str(kube.kubeconfig)) as rt:
        frame = rt.agent.cycle(collect_side=True)
    assert pick(frame, cat.DEVICE_SHARED_CAPACITY.name, "counter_set") == {("gpu-0-counter-set",),
                                                                          ("gpu-1-counter-set",)}
    assert pick(frame, cat.DEVICE_SHARED_CONSUMPTION.name, "device", "counter_set") == {(device, "gpu-1-counter-set")}
    info = {lbl["device"]: lbl for lbl in labels_of(frame, cat.DEVICE_INFO.name)}
    mig = info[device]["uuid"]
    assert mig.startswith("MIG-") and info[device]["parent_uuid"] == node.uuids["gpu-1"], "found through NVML"
    assert attribution(device_labels(frame)[mig]) == (ns, "part-0", pod["metadata"]["uid"], "main", "part", "mig")


def test_the_charts_admin_access_claim_gets_every_gpu_of_its_node_tainted_ones_too(
        cluster: Cluster, kube: ControlPlane) -> None:
    """deviceAccess.mode=adminAccessClaim: the chart's ResourceClaimTemplate and its DaemonSet's
    claim references, on a node whose GPUs are in use and one of which is tainted. The real
    scheduler allocates "All" only when every matching device can be: an exporter that did not
    tolerate device taints stayed Pending (NoSchedule) or was evicted (NoExecute) exactly when a
    GPU needed watching."""
    ns = kube.namespace("dra-exporter", admin_access=True)
    docs = render_chart({"deviceAccess": {"mode": "adminAccessClaim"}}, namespace=ns)
    (template,) = [d for d in docs if d["kind"] == "ResourceClaimTemplate"]
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    kube.create(template)
    spec = daemonset["spec"]["template"]["spec"]
    kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "exporter", "namespace": ns}, "spec": {
        "nodeSelector": {"kubernetes.io/hostname": cluster.node.name}, "resourceClaims": spec["resourceClaims"],
        "containers": [{"name": c["name"], "image": c["image"], "resources": {"claims": c["resources"]["claims"]}}
                       for c in spec["containers"]]}})
    pod = kube.wait_scheduled(ns, "exporter", timeout=30)
    (generated,) = kube.get(f"/api/v1/namespaces/{ns}/pods/exporter")["status"]["resourceClaimStatuses"]
    results = allocated(kube, ns, generated["resourceClaimName"])["status"]["allocation"]["devices"]["results"]
    whole = {f"gpu-{i}" for i in range(9) if i != 3}  # gpu-3 is in MIG mode: its MIG devices are another class
    assert {r["device"] for r in results} == whole and all(r["adminAccess"] for r in results)
    assert pod["spec"]["nodeName"] == cluster.node.name



# --- what the real server does that the simulator did not ------------------------------------------------

def _watch(kube: ControlPlane, path: str, query: str, timeout: float = 30) -> list[tuple[str, Any]]:
    """The events of one watch, as (type, resourceVersion or the ERROR's code)."""
    import json
    import urllib.request

    req = urllib.request.Request(f"{kube.server}{path}?watch=1&{query}")
    with urllib.request.urlopen(req, context=kube._ssl(), timeout=timeout) as resp:
        assert resp.status == 200
        events = [json.loads(line) for line in resp.read().splitlines() if line.strip()]
    return [(e["type"], e["object"].get("code") if e["type"] == "ERROR" else e["object"]["metadata"].get(
        "resourceVersion")) for e in events]


def test_device_health_names_the_claim_as_the_container_references_it(cluster: Cluster, kube: ControlPlane) -> None:
    """``allocatedResourcesStatus[].name`` must be ``claim:<pod claim>`` or ``claim:<pod claim>/<request>``
    exactly as the container's ``resources.claims`` entry says; the simulator wrote any."""
    pod = kube.get(f"/api/v1/namespaces/{cluster.ml}/pods/train-0")
    statuses = pod["status"]["containerStatuses"]
    statuses[0]["allocatedResourcesStatus"][0]["name"] = "claim:gpus/main"
    status, body = kube.request("PATCH", f"/api/v1/namespaces/{cluster.ml}/pods/train-0/status",
                                {"status": {"containerStatuses": statuses}},
                                content_type="application/merge-patch+json")
    assert status == 422 and "must match one of the container's resource claims" in body["message"]


def test_bookmarks_come_only_when_the_resource_version_moved(kube: ControlPlane) -> None:
    """A quiet watch that allows bookmarks ends at its timeout without one (the simulator sent
    one before every timeout); once another namespace's object of the kind changes, the server
    sends the new resourceVersion as bookmarks before the timeout."""
    import threading

    quiet, busy = kube.unique("quiet"), kube.unique("busy")
    for ns in (quiet, busy):
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        # The controller-manager publishes its CA into every new namespace: after that, nothing moves.
        kube.wait_for(lambda ns=ns: kube.request("GET", f"/api/v1/namespaces/{ns}/configmaps/kube-root-ca.crt")[0]
                      == 200, f"kube-root-ca.crt in {ns}")
    path = f"/api/v1/namespaces/{quiet}/configmaps"
    rv = kube.get(path)["metadata"]["resourceVersion"]
    assert _watch(kube, path, f"resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=3") == []
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "moved", "namespace": busy}}
    later = threading.Timer(0.5, kube.create, (config_map,))
    later.start()
    try:
        events = _watch(kube, path, f"resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=6")
    finally:
        later.join()
    moved = kube.get(f"/api/v1/namespaces/{busy}/configmaps/moved")["metadata"]["resourceVersion"]
    assert events and set(events) == {("BOOKMARK", moved)}, events


#: Lists one restart may cost a reflector: the one after the 410, plus retries of lists the
#: restarted server refused while its caches filled.
WARM_UP_LISTS = 3


def _lists(src: kubeapi.KubeApiSource) -> dict[str, int]:
    return {k: v for k, v in src.requests.items() if k.startswith("list ")}


@pytest.mark.slow
def test_watches_follow_the_cluster_across_an_apiserver_restart_and_an_etcd_compaction(
        cluster: Cluster, kube: ControlPlane) -> None:
    """What changes while the apiserver restarts reaches the agent; each restart costs each
    watch a list or two, never a storm, and after a compaction the list is certain.

    Unlike the simulator, a restarted apiserver expires every older resourceVersion even without
    a compaction (its watch cache starts at etcd's current revision): a watch from one is answered
    200 with one ERROR event of code 410, not HTTP 410."""
    node, ml = cluster.node, cluster.ml
    rule = kube.unique("drain-late")

    def taints(rt: Any) -> set[tuple[str, ...]]:
        return pick(rt.agent.cycle(collect_side=True), cat.DEVICE_TAINT.name, "device", "key")

    with agent(cluster, kube) as rt:
        src = kubeapi_source(rt)
        rt.agent.cycle(collect_side=True)
        before = _lists(src)
        pods = f"/api/v1/namespaces/{ml}/pods"
        rv = kube.get(pods)["metadata"]["resourceVersion"]
        # Any write makes rv older than etcd's revision (and so than the restarted server's cache).
        kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "before-restart", "namespace": ml}})
        kube.restart_apiserver()
        assert _watch(kube, pods, f"resourceVersion={rv}&timeoutSeconds=5") == [("ERROR", 410)]
        kube.create(claim(ml, "late", request("gpu", cel=node.uuid_cel("gpu-7"))))
        kube.pod(ml, "late-0", claims={"gpu": "late"}, node_name=node.name)
        kube.wait_scheduled(ml, "late-0")

        def late_claim() -> bool:
            snap = src.collect()
            late = snap.claim(ml, "late")
            return "late-0" in {p.name for p in snap.pods} and late is not None and \
                [r.device for r in late.results] == ["gpu-7"]

        eventually(late_claim, timeout=60)
        kube.create({"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule", "metadata": {"name": rule},
                     "spec": {"deviceSelector": {"driver": GPU_CLASS, "pool": node.name, "device": "gpu-7"},
                              "taint": {"key": "example.com/late", "effect": "NoSchedule"}}})
        eventually(lambda: ("gpu-7", "example.com/late") in taints(rt), timeout=60)
        after_restart = _lists(src)
        # One list each after the 410, and perhaps a retry of one the warming-up server refused: no storm.
        assert all(after_restart[k] - before[k] <= WARM_UP_LISTS for k in before), (before, after_restart)

        kube.compact_etcd()
        kube.restart_apiserver()
        kube.delete(f"/api/v1/namespaces/{ml}/pods/late-0")
        kube.delete(f"/apis/resource.k8s.io/v1beta2/devicetaintrules/{rule}")
        eventually(lambda: "late-0" not in {p.name for p in src.collect().pods}, timeout=60)
        assert src.collect().claim(ml, "late") is None, "no local pod uses it: forgotten"
        eventually(lambda: ("gpu-7", "example.com/late") not in taints(rt), timeout=60)
        after_compaction = _lists(src)
        assert 1 <= after_compaction["list pods"] - after_restart["list pods"] <= WARM_UP_LISTS, (
            after_restart, after_compaction)
        assert source_up(rt.agent.cycle(collect_side=True), "kubeapi") == 1.0
    # The controller-manager's watches took the same blow: wait until it serves new namespaces
    # again, so the tests after this one find the control plane as they expect it.
    kube.namespace("recovered")
