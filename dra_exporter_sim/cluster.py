"""Simulated clusters for ``dra-exporter cluster --simulate``: every node's DRA objects, served by
the simulated API server (``SimulatedApiServer`` over a ``Scenario`` holding raw objects).

* ``builtin_cluster()``: a few GPU nodes of different shapes — the demo's 8 x H200 node (static MIG,
  its claims and pods), an 8 x H200 node with NVIDIA's DynamicMIG (partitionable devices over shared
  counters, as the driver publishes them), a 4 x A100 node (one device tainted by its driver, one by a
  DeviceTaintRule), a dra-example-driver node, an example-driver pool whose second slice is not
  published (incomplete) and an example-driver GPU that claims share (consumable capacity); NVIDIA's
  and the example driver's DeviceClasses plus one no device matches, and claims: allocated, held by
  no pod, pending (a pod waits: for that class, a class that does not exist, and for MIG) and unused
  (no pod waits: never referenced, or its pod succeeded).
* ``load_cluster_dump(path)``: a whole cluster dump (``kubectl get resourceslices,resourceclaims,
  deviceclasses,devicetaintrules,pods -A -o yaml``, any driver, any served version), every node of it.

Timestamps are on the simulator's fixed epoch (``clock.FIXED_EPOCH + t``), so pending ages are
reproducible: pods have waited for the pending claims since 20, 25 and 40 minutes before simulated
time 0.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any, Final

from dra_exporter.dra_versions import GROUP
from dra_exporter.resolve import NVIDIA_DRIVER
from dra_exporter.sources.kubeapi_normalize import TAINT_RULE_VERSIONS

from . import admission, k8s_objects
from .dump import kubernetes_objects
from .duplicates import refuse_duplicates
from .k8s_objects import JSON, timestamp
from .loader import load_scenario
from .scenario import API_VERSIONS, Scenario, ScenarioError, derived_uuid
from .scenario_builder import builtin_scenarios, read_documents

BUILTIN: Final = "cluster"
#: The built-in cluster is a 1.36 one (``k8s_objects.KUBERNETES_VERSIONS``): DeviceTaintRules in v1beta2.
TAINT_RULE_VERSION: Final = "v1beta2"
EXAMPLE_DRIVER: Final = "gpu.example.com"
#: Kinds a cluster dump may hold that the cluster mode reads; others (Nodes, templates…) are skipped.
KINDS: Final = ("ResourceSlice", "ResourceClaim", "DeviceClass", "DeviceTaintRule", "Pod", "Namespace", "Node")
_CORE_KINDS: Final = ("Pod", "Namespace", "Node")


def cluster_scenario(objects: tuple[Mapping[str, Any], ...], name: str) -> Scenario:
    """A scenario that is nothing but the cluster's objects (the API server serves them as they are)."""
    return Scenario(name=name, node_name="", seed=0, gpu_model="h200", gpus=(), raw_objects=objects)


def load_cluster(source: str | None) -> Scenario:
    """``None`` or ``"cluster"``: the built-in cluster; else a dump file. Raises ``ScenarioError``."""
    if source in (None, "", BUILTIN):
        return cluster_scenario(builtin_cluster(), BUILTIN)
    if not os.path.exists(source):
        # Not read_documents' "not a built-in scenario (built-ins: demo, ...)": those are the node
        # agent's scenarios, which the cluster mode cannot run.
        what = ("is a node scenario (serve, snapshot and demo --simulate run it)" if source in builtin_scenarios()
                else "is no such file")
        raise ScenarioError(f"cluster --simulate {source!r} {what}: give a cluster dump (kubectl get "
                            f"resourceslices,resourceclaims,deviceclasses,pods,nodes -A -o yaml), or no value for the "
                            f"built-in cluster")
    return cluster_scenario(load_cluster_dump(source), str(source))


# --- the built-in cluster ---------------------------------------------------------------------------


def _class(name: str, expression: str, extended: str = "") -> JSON:
    spec: JSON = {"selectors": [{"cel": {"expression": expression}}]}
    if extended:
        spec["extendedResourceName"] = extended
    return {"apiVersion": f"{GROUP}/v1", "kind": "DeviceClass", "metadata": {"name": name, "uid": f"class-{name}",
                                                                             "creationTimestamp": timestamp(-86400)},
            "spec": spec}


def _nvidia_class(kind: str) -> str:
    return f"device.driver == '{NVIDIA_DRIVER}' && device.attributes['{NVIDIA_DRIVER}'].type == '{kind}'"


DEVICE_CLASSES: Final = (
    _class("gpu.nvidia.com", _nvidia_class("gpu"), "nvidia.com/gpu"),
    _class("mig.nvidia.com", _nvidia_class("mig")),
    _class("gpu.example.com", f"device.driver == '{EXAMPLE_DRIVER}'"),
    _class("large-gpu.nvidia.com", f"device.driver == '{NVIDIA_DRIVER}' && "
                                   f"device.capacity['{NVIDIA_DRIVER}'].memory.compareTo(quantity('100Gi')) >= 0"),
    _class("tpu.example.com", "device.driver == 'tpu.example.com'"),
)


def _claim(namespace: str, name: str, device_class: str, results: list[tuple[str, str, str]], *,
           created: float, reserved_by: str = "", first_available: tuple[str, ...] = (),
           share: tuple[str, ...] = ()) -> JSON:
    request: JSON = {"name": "gpu"}
    if first_available:
        request["firstAvailable"] = [{"name": c.split(".")[0], "deviceClassName": c, "allocationMode": "ExactCount",
                                      "count": 1} for c in first_available]
    else:
        request["exactly"] = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": 1}
    status: JSON = {}
    if results:
        status["allocation"] = {"devices": {"results": [
            {"request": "gpu", "driver": d, "pool": p, "device": dev} for d, p, dev in results]}}
        for result, memory in zip(status["allocation"]["devices"]["results"], share, strict=False):
            result.update(shareID=derived_uuid(1, "share", name), consumedCapacity={"memory": memory})
    if reserved_by:
        status["reservedFor"] = [{"resource": "pods", "name": reserved_by,
                                  "uid": derived_uuid(1, "pod", namespace, reserved_by)}]
    return {"apiVersion": f"{GROUP}/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": namespace, "name": name, "uid": derived_uuid(1, "claim", name),
                         "creationTimestamp": timestamp(created)},
            "spec": {"devices": {"requests": [request]}}, "status": status}


def _waiting_pod(namespace: str, name: str, claim: str, *, created: float, phase: str = "Pending") -> JSON:
    """A pod that references ``claim`` by name; ``Pending`` and unbound, as the scheduler leaves a pod
    whose claim it cannot allocate."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": k8s_objects.object_metadata(1, "Pod", name, namespace, t=created),
            "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]},
            "status": {"phase": phase}}


def _plain_slice(node: str, driver: str, devices: list[JSON], *, count: int = 1, index: int = 0,
                 pool: str = "") -> JSON:
    pool = pool or node
    return {"apiVersion": f"{GROUP}/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver}-{index}", "uid": derived_uuid(1, "slice", node, driver,
                                                                                            str(index)),
                         "creationTimestamp": timestamp(-86400)},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": pool, "generation": 1, "resourceSliceCount": count}, "devices": devices}}


def _a100(node: str, i: int) -> JSON:
    device: JSON = {"name": f"gpu-{i}", "attributes": {
        "type": {"string": "gpu"}, "uuid": {"string": derived_uuid(1, "gpu", node, str(i)).upper()},
        "productName": {"string": "NVIDIA A100-SXM4-80GB"}, "brand": {"string": "Nvidia"},
        "architecture": {"string": "Ampere"}, "cudaComputeCapability": {"version": "8.0.0"},
        # Driver 580.82.07 is CUDA 13.0; the bus ids are those of a DGX A100's first four GPUs.
        "driverVersion": {"version": "580.82.7"}, "cudaDriverVersion": {"version": "13.0.0"},
        "resource.kubernetes.io/pciBusID": {"string": f"0000:{(0x07, 0x0f, 0x47, 0x4e)[i]:02x}:00.0"}},
        "capacity": {"memory": {"value": "80Gi"}}}
    if i == 3:
        device["taints"] = [{"key": "gpu.nvidia.com/ecc-errors", "value": "uncorrectable", "effect": "NoSchedule",
                             "timeAdded": timestamp(-3600)}]
    return device


def _example(node: str, i: int) -> JSON:
    return {"name": f"gpu-{i}", "attributes": {
        "index": {"int": i}, "uuid": {"string": f"gpu-{derived_uuid(1, 'example', node, str(i))}"},
        "model": {"string": "LATEST-GPU-MODEL"}, "driverVersion": {"version": "1.0.0"}},
        "capacity": {"memory": {"value": "80Gi"}, "compute": {"value": "100"}}}


def _shared(node: str) -> JSON:
    """An example-driver GPU that claims share (consumable capacity): 80Gi, 30Gi a share by default."""
    return {"name": "gpu-0", "allowMultipleAllocations": True, "attributes": {
        "model": {"string": "LATEST-GPU-MODEL"},
        "uuid": {"string": f"gpu-{derived_uuid(1, 'shared', node)}"}},
        "capacity": {"memory": {"value": "80Gi", "requestPolicy": {
            "default": "30Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}}}}


def builtin_cluster() -> tuple[JSON, ...]:
    """The built-in cluster's objects (see the module docstring)."""
    demo = load_scenario("demo")
    static = k8s_objects.cluster_objects(demo, 60.0)
    dynamic = dataclasses.replace(demo, node_name="sim-node-2", dynamic_mig=True, claims=(), pods=(),
                                  gpus=tuple(dataclasses.replace(g, mig=(), taints=()) for g in demo.gpus))
    dynamic_slices = k8s_objects.nvidia_slices(dynamic)
    a100, example, partial, shared = "sim-a100-1", "sim-example-1", "sim-example-2", "sim-shared-1"
    slices = [*static.resourceslices, *dynamic_slices,
              _plain_slice(a100, NVIDIA_DRIVER, [_a100(a100, i) for i in range(4)]),
              _plain_slice(example, EXAMPLE_DRIVER, [_example(example, i) for i in range(8)]),
              # Two slices announced, one published: the pool stays incomplete.
              _plain_slice(partial, EXAMPLE_DRIVER, [_example(partial, i) for i in range(4)], count=2),
              _plain_slice(shared, EXAMPLE_DRIVER, [_shared(shared)])]
    claims = [
        *static.resourceclaims,
        # DynamicMIG: a 3g.71gb at 0 and a 1g.18gb at 4 on GPU 0, the whole GPU 1.
        _claim("inference", "llm-3g", "mig.nvidia.com", [(NVIDIA_DRIVER, "sim-node-2", "gpu-0-mig-3g71gb-9-0")],
               created=-3600, reserved_by="llm-3g-0"),
        _claim("inference", "embed-1g", "mig.nvidia.com", [(NVIDIA_DRIVER, "sim-node-2", "gpu-0-mig-1g18gb-19-4")],
               created=-3600, reserved_by="embed-1g-0"),
        _claim("training", "h200-whole", "gpu.nvidia.com", [(NVIDIA_DRIVER, "sim-node-2", "gpu-1")],
               created=-7200, reserved_by="trainer-0"),
        _claim("training", "a100-0", "gpu.nvidia.com", [(NVIDIA_DRIVER, a100, "gpu-0")], created=-7200,
               reserved_by="a100-trainer-0"),
        # Allocated, but the pod that held it is gone: devices held, unused.
        _claim("research", "forgotten", "gpu.nvidia.com", [(NVIDIA_DRIVER, a100, "gpu-1")], created=-86400),
        _claim("demo", "example-0", "gpu.example.com", [(EXAMPLE_DRIVER, example, "gpu-0")], created=-1800,
               reserved_by="example-pod"),
        # One 30Gi share of the shared GPU: two more fit, not three.
        _claim("demo", "share-0", "gpu.example.com", [(EXAMPLE_DRIVER, shared, "gpu-0")], created=-1800,
               reserved_by="share-pod", share=("30Gi",)),
        # Pending (a pod waits): a class no device matches, a class that does not exist (a typo), and a
        # prioritized list of MIG profiles.
        _claim("research", "tpu-job", "tpu.example.com", [], created=-2700),
        _claim("training", "typo-job", "gpu.nvidia.con", [], created=-1500),
        _claim("inference", "mig-either", "", [], created=-1200, first_available=("mig.nvidia.com", "gpu.nvidia.com")),
        # Unused (no pod waits): never referenced, and one whose pod has succeeded.
        _claim("research", "tpu-job-2", "tpu.example.com", [], created=-600),
        _claim("research", "nightly-eval", "gpu.nvidia.com", [], created=-5400),
    ]
    waiting = [
        # The claim was made 5 minutes before the pod that waits for it.
        _waiting_pod("research", "tpu-trainer", "tpu-job", created=-2400),
        _waiting_pod("training", "typo-job-0", "typo-job", created=-1500),
        _waiting_pod("inference", "mig-either-0", "mig-either", created=-1200),
        _waiting_pod("research", "nightly-eval-0", "nightly-eval", created=-5400, phase="Succeeded"),
    ]
    # The pods the claims are reserved for: a reservation for a pod that does not exist is removed by the
    # resourceclaim controller of a real cluster.
    running = [_pod("inference", "llm-3g-0", "sim-node-2", "llm-3g"),
               _pod("inference", "embed-1g-0", "sim-node-2", "embed-1g"),
               _pod("training", "trainer-0", "sim-node-2", "h200-whole"),
               _pod("training", "a100-trainer-0", a100, "a100-0"), _pod("demo", "example-pod", example, "example-0"),
               _pod("demo", "share-pod", shared, "share-0")]
    # DeviceTaintRules in the version this cluster's release serves them (1.36: v1beta2, not yet v1).
    rules = [{"apiVersion": f"{GROUP}/{TAINT_RULE_VERSION}", "kind": "DeviceTaintRule",
              "metadata": {"name": "drain-a100-2", "uid": "rule-drain-a100-2", "creationTimestamp": timestamp(-600)},
              "spec": {"deviceSelector": {"driver": NVIDIA_DRIVER, "pool": a100, "device": "gpu-2"},
                       "taint": {"key": "example.com/maintenance", "value": "planned", "effect": "NoExecute",
                                 "timeAdded": timestamp(-600)}}}]
    # sim-node-2's slices name their Node by the demo's seed, as sim-node-1's do.
    nodes = [*static.nodes, k8s_objects.node_object(demo.seed, "sim-node-2"),
             *(k8s_objects.node_object(1, n) for n in (a100, example, partial, shared))]
    pods = (*static.pods, *running, *waiting)
    namespaces = k8s_objects.namespace_objects(1, (*claims, *pods))
    return (*namespaces, *nodes, *slices, *claims, *DEVICE_CLASSES, *rules, *pods)


def _pod(namespace: str, name: str, node: str, claim: str) -> JSON:
    """A running pod on ``node`` whose one container uses ``claim``."""
    started = timestamp(-3600)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": namespace, "name": name, "creationTimestamp": started,
                         "uid": derived_uuid(1, "pod", namespace, name)},
            "spec": {"nodeName": node, "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                     "containers": [{"name": "main", "image": "sim.local/main:latest",
                                     "resources": {"claims": [{"name": "gpu"}]}}]},
            "status": {"phase": "Running", "startTime": started,
                       "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": started}]}}


# --- cluster dumps ------------------------------------------------------------------------------------


def load_cluster_dump(path: str | os.PathLike[str]) -> tuple[JSON, ...]:
    """Every DRA object (and pod) of a cluster dump; raises ``ScenarioError`` naming the object."""
    label, docs = read_documents(path)
    out: list[JSON] = []
    checked: list[Mapping[str, Any]] = []
    for d, doc in enumerate(docs):
        if isinstance(doc, Mapping) and "kind" not in doc and "apiVersion" not in doc:
            where = f"{label}: document {d + 1}" if len(docs) > 1 else label
            raise ScenarioError(f"{where}: not a Kubernetes object or List (a node scenario? cluster --simulate "
                                "takes a cluster dump)")
    for item, where in kubernetes_objects(docs, label):
        kind = item["kind"]
        if kind not in KINDS:
            continue
        meta = item.get("metadata")
        if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str) or not meta["name"]:
            raise ScenarioError(f"{where} ({kind}): metadata.name: required")
        group, _, version = item["apiVersion"].rpartition("/")
        versions = TAINT_RULE_VERSIONS if kind == "DeviceTaintRule" else API_VERSIONS
        if kind not in _CORE_KINDS and (group != GROUP or version not in versions):
            raise ScenarioError(f"{where}: {kind}/{meta['name']}: apiVersion "
                                f"{item['apiVersion']!r} is not supported "
                                f"(supported: {', '.join(f'{GROUP}/{v}' for v in versions)})")
        out.append(admission.defaulted(item))
        checked.append(item)
    refuse_duplicates(out, label)
    if not any(o["kind"] == "ResourceSlice" for o in out):
        raise ScenarioError(f"{label}: the dump has no ResourceSlice (expected `kubectl get resourceslices,"
                            "resourceclaims,deviceclasses,pods,nodes -A -o yaml`)")
    admission.check(checked, label)
    return tuple(out)
