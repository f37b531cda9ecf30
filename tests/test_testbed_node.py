"""The node agent on a real node: a real kubelet v1.36 (DRA manager, claim checkpoint, pod-resources
server) with NVIDIA's real gpu-kubelet-plugin on the mock NVML (8 × H100), joined to the real control
plane (``tests/nodetestbed.py``). The driver publishes its slices, the scheduler allocates, the kubelet
prepares: every label the exporter gives must be what the real objects say.

What each GPU's series must say (``expected_devices``): the claim that holds it, its namespace and the
allocation result's request; the pod when exactly one pod holds it (a pod in the claim's
``reservedFor``, whether or not a container of it references the claim); the container when exactly
one container uses it (a container reference names the claim and the result's request or its parent).
Labels are polled: right within 5 s of a pod's start, gone within 5 s of its deletion; the measured
times are printed at the end of the run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from nodetestbed import TIMINGS, Exporter, NodeBed

pytestmark = pytest.mark.testbed_node

#: How long the labels may lag behind the real objects (the issue's bound).
LAG = 5.0
ATTRIBUTION = ("claim", "namespace", "request", "pod", "container")

GPU_CLAIM = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {name}}}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {{deviceClassName: gpu.nvidia.com}}
"""

# The shapes of the bed's objects/ (a claim from a template, one claim shared by two pods and by two
# containers of one pod, a prioritized list with per-request container references, an extended
# resource backed by DRA, a pod-level claim no container references) and one more: two claims in one pod.
SHAPES = GPU_CLAIM.format(name="claim-a") + """
---
apiVersion: v1
kind: Pod
metadata: {name: gpu-direct}
spec:
  automountServiceAccountToken: false
  resourceClaims: [{name: gpu, resourceClaimName: claim-a}]
  containers:
  - {name: main, image: cuda:12, command: [sleep, infinity], resources: {claims: [{name: gpu}]}}
  - {name: sidecar, image: busybox:1.36, command: [sleep, infinity]}
---
apiVersion: v1
kind: Pod
metadata: {name: gpu-share}
spec:
  automountServiceAccountToken: false
  resourceClaims: [{name: g, resourceClaimName: claim-a}]
  containers:
  - {name: a, image: cuda:12, command: [sleep, infinity], resources: {claims: [{name: g}]}}
  - {name: b, image: cuda:12, command: [sleep, infinity], resources: {claims: [{name: g}]}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: two-gpus}
spec:
  spec:
    devices:
      requests:
      - name: gpus
        exactly: {deviceClassName: gpu.nvidia.com, allocationMode: ExactCount, count: 2}
---
apiVersion: v1
kind: Pod
metadata: {name: gpu-tmpl}
spec:
  automountServiceAccountToken: false
  resourceClaims: [{name: gpus, resourceClaimTemplateName: two-gpus}]
  containers:
  - {name: trainer, image: cuda:12, command: [sleep, infinity], resources: {claims: [{name: gpus}]}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: claim-prio}
spec:
  devices:
    requests:
    - name: acc
      firstAvailable:
      - name: b200
        deviceClassName: gpu.nvidia.com
        selectors: [{cel: {expression: "device.attributes['gpu.nvidia.com'].architecture == 'Blackwell'"}}]
      - name: h100
        deviceClassName: gpu.nvidia.com
        selectors: [{cel: {expression: "device.attributes['gpu.nvidia.com'].architecture == 'Hopper'"}}]
    - name: extra
      exactly: {deviceClassName: gpu.nvidia.com}
---
apiVersion: v1
kind: Pod
metadata: {name: gpu-prio}
spec:
  automountServiceAccountToken: false
  resourceClaims: [{name: p, resourceClaimName: claim-prio}]
  containers:
  - {name: only-acc, image: cuda:12, command: [sleep, infinity], resources: {claims: [{name: p, request: acc}]}}
  - {name: only-extra, image: cuda:12, command: [sleep, infinity], resources: {claims: [{name: p, request: extra}]}}
---
apiVersion: v1
kind: Pod
metadata: {name: gpu-extres}
spec:
  automountServiceAccountToken: false
  containers:
  - {name: legacy, image: cuda:12, command: [sleep, infinity], resources: {limits: {nvidia.com/gpu: "1"}}}
"""

POD_LEVEL = GPU_CLAIM.format(name="claim-unused") + """
---
apiVersion: v1
kind: Pod
metadata: {name: gpu-podlevel}
spec:
  automountServiceAccountToken: false
  resourceClaims: [{name: g, resourceClaimName: claim-unused}]
  containers:
  - {name: c, image: cuda:12, command: [sleep, infinity]}
"""

TWO_CLAIMS = GPU_CLAIM.format(name="claim-x") + "---" + GPU_CLAIM.format(name="claim-y") + """
---
apiVersion: v1
kind: Pod
metadata: {name: gpu-two-claims}
spec:
  automountServiceAccountToken: false
  resourceClaims: [{name: x, resourceClaimName: claim-x}, {name: y, resourceClaimName: claim-y}]
  containers:
  - {name: uses-x, image: cuda:12, command: [sleep, infinity], resources: {claims: [{name: x}]}}
  - {name: uses-both, image: cuda:12, command: [sleep, infinity], resources: {claims: [{name: x}, {name: y}]}}
"""


# --- what the real objects say ----------------------------------------------------------------------

def _pod_claim_names(pod: dict[str, Any]) -> dict[str, str]:
    names = {pc["name"]: pc.get("resourceClaimName", "") for pc in pod["spec"].get("resourceClaims", [])}
    for st in pod.get("status", {}).get("resourceClaimStatuses", []) or []:
        names[st["name"]] = st.get("resourceClaimName", "")
    return names


def _users(pod: dict[str, Any], claim: str, request: str) -> set[str]:
    """The containers of ``pod`` that use the allocation result ``request`` of ``claim``."""
    names = _pod_claim_names(pod)
    ext = pod.get("status", {}).get("extendedResourceClaimStatus") or {}
    out = set()
    for ctr in pod["spec"]["containers"]:
        for ref in ctr.get("resources", {}).get("claims", []) or []:
            wanted = ref.get("request", "")
            if names.get(ref["name"]) == claim and (not wanted or request == wanted
                                                     or request.startswith(wanted + "/")):
                out.add(ctr["name"])
        if ext.get("resourceClaimName") == claim and any(
                m["containerName"] == ctr["name"] and m["requestName"] == request
                for m in ext.get("requestMappings", [])):
            out.add(ctr["name"])
    return out


def _only(values: set[str]) -> str:
    return next(iter(values)) if len(values) == 1 else ""


def expected_devices(bed: NodeBed, namespace: str) -> dict[str, dict[str, str]]:
    """GPU uuid → the attribution labels the real objects give it (claims of ``namespace``)."""
    return expected_from_objects(bed.slices(), list(bed.claims(namespace).values()),
                                 bed.items(f"/api/v1/namespaces/{namespace}/pods"))


def expected_from_objects(slices: list[dict[str, Any]], claims: list[dict[str, Any]],
                          pod_list: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """GPU uuid → attribution labels, from the objects as the API server returns them."""
    uuids = {(s["spec"]["driver"], s["spec"]["pool"]["name"], d["name"]): d["attributes"]["uuid"]["string"]
             for s in slices for d in s["spec"].get("devices", []) if "uuid" in d.get("attributes", {})}
    pods = {p["metadata"]["uid"]: p for p in pod_list}
    out = {}
    for claim in claims:
        name, namespace = claim["metadata"]["name"], claim["metadata"]["namespace"]
        alloc = (claim.get("status") or {}).get("allocation")
        for r in alloc["devices"]["results"] if alloc else ():
            holders, users = set(), set()
            for ref in claim["status"].get("reservedFor", []):
                if (pod := pods.get(ref["uid"])) is None:
                    continue
                holders.add(pod["metadata"]["name"])
                users |= {(pod["metadata"]["name"], c) for c in _users(pod, name, r["request"])}
            one_pod = len(holders) == 1
            out[uuids[(r["driver"], r["pool"], r["device"])]] = {
                "claim": name, "namespace": namespace, "request": r["request"],
                "pod": _only(holders), "container": _only({c for _, c in users}) if one_pod else ""}
    return out


def expected_health(bed: NodeBed, namespace: str) -> set[tuple[str, ...]]:
    """(pod, container, claim, request, device) for every device a container uses: one health row each."""
    pods = {p["metadata"]["uid"]: p for p in bed.items(f"/api/v1/namespaces/{namespace}/pods")}
    out = set()
    for name, claim in bed.claims(namespace).items():
        alloc = (claim.get("status") or {}).get("allocation")
        for r in alloc["devices"]["results"] if alloc else ():
            for ref in claim["status"].get("reservedFor", []):
                if pod := pods.get(ref["uid"]):
                    out |= {(pod["metadata"]["name"], c, name, r["request"], r["device"])
                            for c in _users(pod, name, r["request"])}
    return out


# --- what the exporter says ---------------------------------------------------------------------------

def exported_devices(exporter: Exporter, namespace: str) -> dict[str, dict[str, str]]:
    """GPU uuid → dra_gpu_up's attribution labels, for the GPUs held in ``namespace``."""
    return {labels["uuid"]: {k: labels[k] for k in ATTRIBUTION}
            for _, labels, _ in exporter.series("dra_gpu_up") if labels["namespace"] == namespace}


def exported_health(exporter: Exporter, namespace: str) -> dict[tuple[str, ...], str]:
    return {(lab["pod"], lab["container"], lab["claim"], lab["request"], lab["device"]): lab["health"]
            for _, lab, _ in exporter.series("dra_device_health") if lab["namespace"] == namespace}


def labels_right(bed: NodeBed, exporter: Exporter, namespace: str) -> bool:
    expected = expected_devices(bed, namespace)
    return bool(expected) and exported_devices(exporter, namespace) == expected


def wait_labels(bed: NodeBed, exporter: Exporter, namespace: str, what: str) -> float:
    """Seconds until dra_gpu_up says what the objects say (at most LAG); fails with the difference."""
    started = time.monotonic()
    try:
        bed.wait_for(lambda: labels_right(bed, exporter, namespace), what, timeout=LAG, step=0.05)
    except Exception:
        pytest.fail(f"{what}: the exporter's labels are not the real objects' after {LAG} s:\n"
                    f"  real:     {expected_devices(bed, namespace)}\n"
                    f"  exporter: {exported_devices(exporter, namespace)}")
    return time.monotonic() - started


# --- fixtures ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def exporter(node_bed: NodeBed) -> Iterator[Exporter]:
    with node_bed.exporter() as running:
        yield running


class Workload:
    """Objects of one test in a namespace of their own; ``run`` applies them and waits for the pods."""

    def __init__(self, bed: NodeBed, namespace: str) -> None:
        self.bed, self.namespace, self.texts = bed, namespace, []

    def run(self, text: str, *, wait: bool = True) -> None:
        """Apply, and wait until every pod of ``text`` runs."""
        self.texts.append(text)
        self.bed.apply(text, self.namespace)
        for pod in self.pods(text) if wait else ():
            self.bed.wait_running(self.namespace, pod, timeout=90)

    @staticmethod
    def pods(text: str) -> list[str]:
        return [d["metadata"]["name"] for d in yaml.safe_load_all(text) if d and d["kind"] == "Pod"]

    def delete_pods(self, text: str) -> float:
        """Delete the pods of ``text`` and wait until the server has none of them; returns that time."""
        self.bed.delete([d for d in yaml.safe_load_all(text) if d and d["kind"] == "Pod"], self.namespace)
        return time.monotonic()

    def clean(self) -> None:
        for text in reversed(self.texts):
            self.bed.delete(text, self.namespace, timeout=90)
        # Every GPU free again before the next test: the claims' deallocation is the controller's.
        self.bed.wait_for(lambda: not any((c.get("status") or {}).get("allocation")
                                          for c in self.bed.claims(self.namespace).values()),
                          f"the claims of {self.namespace} deallocated", timeout=60)


@pytest.fixture
def workload(node_bed: NodeBed) -> Iterator[Workload]:
    load = Workload(node_bed, node_bed.namespace("w"))
    try:
        yield load
    finally:
        load.clean()


# --- every shape ------------------------------------------------------------------------------------------

def test_every_shape_is_labelled_as_the_real_objects_say_within_5_s_and_gone_5_s_after(
        node_bed: NodeBed, exporter: Exporter, workload: Workload) -> None:
    workload.run(SHAPES)
    TIMINGS.append(("labels right after the last pod runs (7 GPUs, 6 pods)",
                    wait_labels(node_bed, exporter, workload.namespace, "every shape")))
    real = expected_devices(node_bed, workload.namespace)
    # The shapes as they are: a shared claim names no pod; two containers of one pod, no container.
    by_claim = {v["claim"]: v for v in real.values()}
    assert by_claim["claim-a"]["pod"] == "" and by_claim["claim-a"]["container"] == ""
    assert {v["request"] for v in real.values() if v["claim"] == "claim-prio"} == {"acc/h100", "extra"}
    assert any(v["claim"].startswith("gpu-extres-extended-resources-") and v["container"] == "legacy"
               for v in real.values())
    assert sum(v["claim"].startswith("gpu-tmpl-gpus-") and v["container"] == "trainer" for v in real.values()) == 2

    # dra_claim_allocation_info: each result of each claim, with the claim's uid and the device's uuid.
    uuids = node_bed.uuid_of()
    allocations = {(c["metadata"]["name"], c["metadata"]["uid"], r["request"], r["device"],
                    uuids[(r["driver"], r["pool"], r["device"])])
                   for c in node_bed.claims(workload.namespace).values()
                   for r in c["status"]["allocation"]["devices"]["results"]}
    assert {(lab["claim"], lab["claim_uid"], lab["request"], lab["device"], lab["uuid"])
            for _, lab, _ in exporter.series("dra_claim_allocation_info")
            if lab["namespace"] == workload.namespace} == allocations

    # dra_claim_consumer_info: every container that references a claim (or a request of it).
    pods = node_bed.items(f"/api/v1/namespaces/{workload.namespace}/pods")
    consumers = {(name, p["metadata"]["name"], p["metadata"]["uid"], c)
                 for name, claim in node_bed.claims(workload.namespace).items()
                 for p in pods for r in claim["status"]["allocation"]["devices"]["results"]
                 for c in _users(p, name, r["request"])}
    assert {(lab["claim"], lab["pod"], lab["pod_uid"], lab["container"])
            for _, lab, _ in exporter.series("dra_claim_consumer_info")
            if lab["namespace"] == workload.namespace} == consumers

    deleted = workload.delete_pods(SHAPES)
    node_bed.wait_for(lambda: not any(lab["pod"] for _, lab, _ in exporter.series()
                                      if lab.get("namespace") == workload.namespace),
                      "no series names a deleted pod", timeout=LAG, step=0.05)
    TIMINGS.append(("pod labels gone after the pods are deleted", time.monotonic() - deleted))
    node_bed.wait_for(lambda: not any(lab["claim"].startswith("gpu-tmpl-gpus-")
                                      for _, lab, _ in exporter.series("dra_gpu_up")),
                      "the template's claim gone with its pod", timeout=LAG + 5, step=0.05)


def test_two_claims_in_one_pod(node_bed: NodeBed, exporter: Exporter, workload: Workload) -> None:
    workload.run(TWO_CLAIMS)
    wait_labels(node_bed, exporter, workload.namespace, "two claims in one pod")
    by_claim = {v["claim"]: v for v in exported_devices(exporter, workload.namespace).values()}
    assert by_claim["claim-x"]["pod"] == "gpu-two-claims" and by_claim["claim-x"]["container"] == ""
    assert by_claim["claim-y"]["container"] == "uses-both"


# --- the findings -----------------------------------------------------------------------------

def test_a_pod_level_claim_names_its_claim_request_and_pod(
        node_bed: NodeBed, exporter: Exporter, workload: Workload) -> None:
    """Issue 34, 1: a claim reserved for a pod and prepared, that no container references."""
    workload.run(POD_LEVEL)
    wait_labels(node_bed, exporter, workload.namespace, "a pod-level claim")
    [labels] = exported_devices(exporter, workload.namespace).values()
    assert labels == {"claim": "claim-unused", "namespace": workload.namespace, "request": "gpu",
                      "pod": "gpu-podlevel", "container": ""}
    # No container uses it: nobody consumes it.
    assert not [lab for _, lab, _ in exporter.series("dra_claim_consumer_info")
                if lab["namespace"] == workload.namespace and lab["container"]]


def test_one_request_name_per_device_in_every_family(
        node_bed: NodeBed, exporter: Exporter, workload: Workload) -> None:
    """Issue 34, 2: dra_device_health said request="" for whole-claim references and "acc" where the
    allocation (and dra_gpu_up) says "acc/h100"; every family now takes it from the allocation."""
    workload.run(SHAPES)
    wait_labels(node_bed, exporter, workload.namespace, "every shape")
    want = expected_health(node_bed, workload.namespace)
    node_bed.wait_for(lambda: set(exported_health(exporter, workload.namespace)) >= want,
                      "a health row per device a container uses", timeout=LAG + 10, step=0.1)
    health = exported_health(exporter, workload.namespace)
    assert set(health) == want
    by_device = {lab["device"]: lab["request"] for _, lab, _ in exporter.series("dra_claim_allocation_info")
                 if lab["namespace"] == workload.namespace}
    assert {(device, request) for _, _, _, request, device in health} <= set(by_device.items())


def test_an_extended_resource_backed_by_dra_has_health_unknown(
        node_bed: NodeBed, exporter: Exporter, workload: Workload) -> None:
    """Issue 34, 4: the kubelet reports no allocatedResourcesStatus for ``nvidia.com/gpu: 1`` served by a
    DeviceClass; the device had no health row at all."""
    extres = SHAPES.split("---")[-1]
    workload.run(extres)
    wait_labels(node_bed, exporter, workload.namespace, "an extended resource")
    pod = node_bed.pod(workload.namespace, "gpu-extres")
    assert not any(s.get("allocatedResourcesStatus") for s in pod["status"].get("containerStatuses", []))
    node_bed.wait_for(lambda: exported_health(exporter, workload.namespace), "a health row", timeout=LAG)
    [(key, health)] = exported_health(exporter, workload.namespace).items()
    claim = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    assert key[:4] == ("gpu-extres", "legacy", claim, "container-0-request-0") and health == "Unknown"


@pytest.mark.slow
def test_a_claim_allocated_here_but_not_prepared_is_visible(
        node_bed: NodeBed, exporter: Exporter, workload: Workload) -> None:
    """Issue 34, 3: NodePrepareResources fails (the plugin is down): pod-resources lists the claim with no
    devices and the pod sits in ContainerCreating; the exporter said nothing. Now a family names it, and
    it leaves once the plugin is back and the kubelet has prepared the claim."""
    pod_and_claim = GPU_CLAIM.format(name="claim-late") + """
---
apiVersion: v1
kind: Pod
metadata: {name: gpu-late}
spec:
  automountServiceAccountToken: false
  resourceClaims: [{name: g, resourceClaimName: claim-late}]
  containers:
  - {name: c, image: cuda:12, command: [sleep, infinity], resources: {claims: [{name: g}]}}
"""
    ns = workload.namespace
    with node_bed.stopped("gpu-kubelet-plugin"):
        workload.run(pod_and_claim, wait=False)

        def unprepared_listed() -> bool:
            pods = node_bed.podresources()["List"].get("podResources", [])
            return any(p["name"] == "gpu-late" and p["namespace"] == ns and any(
                d.get("claimName") == "claim-late" and not d.get("claimResources")
                for c in p.get("containers", []) for d in c.get("dynamicResources", [])) for p in pods)

        node_bed.wait_for(unprepared_listed, "the kubelet listing claim-late with no devices", timeout=90)
        assert node_bed.pod(ns, "gpu-late")["status"].get("phase") == "Pending"
        node_bed.wait_for(lambda: [lab for _, lab, _ in exporter.series("dra_claim_not_prepared")
                                   if (lab["namespace"], lab["claim"], lab["pod"]) == (ns, "claim-late", "gpu-late")],
                          "dra_claim_not_prepared for claim-late", timeout=LAG)
    node_bed.wait_running(ns, "gpu-late", timeout=120)
    ran = time.monotonic()
    node_bed.wait_for(lambda: not [lab for _, lab, _ in exporter.series("dra_claim_not_prepared")
                                   if lab["namespace"] == ns], "dra_claim_not_prepared gone", timeout=LAG)
    TIMINGS.append(("dra_claim_not_prepared gone after the pod runs", time.monotonic() - ran))
    wait_labels(node_bed, exporter, ns, "the claim once prepared")


# --- restarts: no flap, no stale label ---------------------------------------------------------------------

class Watcher:
    """Polls the exporter in a thread; every scrape whose attribution for ``namespace`` is none of the
    ``allowed`` states is a flap, kept with its time."""

    def __init__(self, exporter: Exporter, namespace: str, allowed: list[dict[str, dict[str, str]]]) -> None:
        self.exporter, self.namespace, self.allowed = exporter, namespace, allowed
        self.flaps: list[tuple[float, dict[str, dict[str, str]]]] = []
        self.scrapes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                seen = exported_devices(self.exporter, self.namespace)
            except OSError:
                seen = {"<scrape failed>": {}}
            self.scrapes += 1
            if seen not in self.allowed:
                self.flaps.append((time.monotonic(), seen))
            self._stop.wait(0.1)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _podresources_back(bed: NodeBed, exporter: Exporter, since_inode: int) -> bool:
    """The kubelet's socket is a new one and the exporter reads it again."""
    try:
        inode = bed.pod_resources_socket.stat().st_ino
    except FileNotFoundError:
        return False
    up = [v for n, lab, v in exporter.series("dra_exporter_source_up") if lab.get("source") == "podresources"]
    return inode != since_inode and up == [1.0]


@pytest.mark.slow
def test_no_flap_and_no_stale_label_across_kubelet_plugin_and_exporter_restarts(
        node_bed: NodeBed, exporter: Exporter, workload: Workload) -> None:
    workload.run(SHAPES)
    workload.run(POD_LEVEL)
    wait_labels(node_bed, exporter, workload.namespace, "every shape and a pod-level claim")
    before = expected_devices(node_bed, workload.namespace)
    devices = node_bed.slice_devices()

    # 1. The kubelet goes away, a pod is deleted meanwhile (its claim from a template goes with it),
    #    the kubelet comes back with a new socket: the deleted pod's labels leave, nothing else moves.
    inode = node_bed.pod_resources_socket.stat().st_ino
    with Watcher(exporter, workload.namespace, [before]) as watch:
        with node_bed.stopped("kubelet"):
            workload.delete_pods(SHAPES.split("---")[4])  # gpu-tmpl
            after = {u: v for u, v in before.items() if v["pod"] != "gpu-tmpl"}
            watch.allowed.append(after)
        restarted = time.monotonic()
        node_bed.wait_for(lambda: _podresources_back(node_bed, exporter, inode), "the exporter on the new socket",
                          timeout=60)
        TIMINGS.append(("podresources read again after the kubelet restarts (new socket)",
                        time.monotonic() - restarted))
        node_bed.wait_for(lambda: exported_devices(exporter, workload.namespace) == after,
                          "the deleted pod's labels gone after the kubelet is back", timeout=LAG)
        TIMINGS.append(("labels right (a pod deleted while the kubelet was down) after the kubelet restarts",
                        time.monotonic() - restarted))
        watch.allowed.remove(before)  # from now on: never the deleted pod again
        # The driver's slices may vanish for 30 s and more after a kubelet restart, while the pods run
        # on: watched until they are back, or 45 s (the plugin restart below brings them back anyway).
        vanished = False

        def slices_back_or_long() -> bool:
            nonlocal vanished
            count = node_bed.slice_devices()
            vanished |= count < devices
            return (vanished and count == devices) or time.monotonic() - restarted > 45

        node_bed.wait_for(slices_back_or_long, "the slices back or 45 s", timeout=60, step=0.5)
        if vanished and node_bed.slice_devices() == devices:
            TIMINGS.append(("the driver's slices back after the kubelet restarts", time.monotonic() - restarted))
    assert watch.scrapes > 50 and not watch.flaps, watch.flaps[:3]
    assert expected_devices(node_bed, workload.namespace) == after

    # 2. The plugin restarts: it re-registers and republishes; the labels never move.
    with Watcher(exporter, workload.namespace, [after]) as watch:
        node_bed.restart("gpu-kubelet-plugin")
        restarted = time.monotonic()
        node_bed.wait_for(lambda: node_bed.slice_devices() == devices, "the plugin's slices", timeout=60)
        TIMINGS.append(("the driver's slices present after a plugin restart", time.monotonic() - restarted))
        # Watched for a while: the kubelet re-registers the plugin meanwhile.
        node_bed.wait_for(lambda: watch.scrapes >= 10 and time.monotonic() - restarted > 5, "10 scrapes and 5 s",
                          timeout=60)
    assert not watch.flaps, watch.flaps[:3]

    # 3. The exporter restarts: right soon after its first ready answer (the API server's view of the
    #    pods and claims comes with its first list).
    exporter.restart()
    TIMINGS.append(("labels right after the exporter restarts (from /readyz 200)",
                    wait_labels(node_bed, exporter, workload.namespace, "after an exporter restart")))
