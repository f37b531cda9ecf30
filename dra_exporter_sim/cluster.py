"""Simulated clusters for ``dra-exporter cluster --simulate``: every node's DRA objects, served by
the simulated API server (``SimulatedApiServer`` over a ``Scenario`` holding raw objects).

* ``builtin_cluster()``: a few GPU nodes of different shapes — the demo's 8 x H200 node (static MIG,
  its claims and pods), an 8 x H200 node with NVIDIA's DynamicMIG (partitionable devices over shared
  counters, as the driver publishes them), a 4 x A100 node (one device tainted by its driver, one by a
  DeviceTaintRule), a dra-example-driver node and an example-driver pool whose second slice is not
  published (incomplete); NVIDIA's and the example driver's DeviceClasses plus one no device matches,
  and claims: allocated, held by no pod, and pending (for that class, and for MIG).
* ``load_cluster_dump(path)``: a whole cluster dump (``kubectl get resourceslices,resourceclaims,
  deviceclasses,devicetaintrules,pods -A -o yaml``, any driver, any served version), every node of it.

Timestamps are on the simulator's fixed epoch (``clock.FIXED_EPOCH + t``), so pending ages are
reproducible: the pending claims were created 10, 20 and 45 minutes before simulated time 0.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any, Final

from dra_exporter.resolve import NVIDIA_DRIVER
from dra_exporter.sources.kubeapi_normalize import TAINT_RULE_VERSIONS

from . import k8s_objects
from .k8s_objects import GROUP, JSON, timestamp
from .loader import load_scenario
from .scenario import API_VERSIONS, Scenario, ScenarioError
from .scenario_builder import builtin_scenarios, not_an_object, read_documents

BUILTIN: Final = "cluster"
EXAMPLE_DRIVER: Final = "gpu.example.com"
#: Kinds a cluster dump may hold that the cluster mode reads; others (Nodes, templates…) are skipped.
KINDS: Final = ("ResourceSlice", "ResourceClaim", "DeviceClass", "DeviceTaintRule", "Pod")


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
                            f"resourceslices,resourceclaims,deviceclasses,pods -A -o yaml), or no value for the "
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
           created: float, reserved_by: str = "", first_available: tuple[str, ...] = ()) -> JSON:
    request: JSON = {"name": "gpu"}
    if first_available:
        request["firstAvailable"] = [{"name": c.split(".")[0], "deviceClassName": c} for c in first_available]
    else:
        request["exactly"] = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": 1}
    status: JSON = {}
    if results:
        status["allocation"] = {"devices": {"results": [
            {"request": "gpu", "driver": d, "pool": p, "device": dev} for d, p, dev in results]}}
    if reserved_by:
        status["reservedFor"] = [{"resource": "pods", "name": reserved_by,
                                  "uid": k8s_objects.derived_uuid(1, "pod", namespace, reserved_by)}]
    return {"apiVersion": f"{GROUP}/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": namespace, "name": name, "uid": k8s_objects.derived_uuid(1, "claim", name),
                         "creationTimestamp": timestamp(created)},
            "spec": {"devices": {"requests": [request]}}, "status": status}


def _plain_slice(node: str, driver: str, devices: list[JSON], *, count: int = 1, index: int = 0,
                 pool: str = "") -> JSON:
    pool = pool or node
    return {"apiVersion": f"{GROUP}/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver}-{index}", "uid": k8s_objects.derived_uuid(1, "slice", node, driver,
                                                                                            str(index)),
                         "creationTimestamp": timestamp(-86400)},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": pool, "generation": 1, "resourceSliceCount": count}, "devices": devices}}


def _a100(node: str, i: int) -> JSON:
    device: JSON = {"name": f"gpu-{i}", "attributes": {
        "type": {"string": "gpu"}, "uuid": {"string": k8s_objects.derived_uuid(1, "gpu", node, str(i)).upper()},
        "productName": {"string": "NVIDIA A100-SXM4-80GB"}, "brand": {"string": "Nvidia"},
        "architecture": {"string": "Ampere"}, "cudaComputeCapability": {"version": "8.0.0"},
        "driverVersion": {"version": "580.82.7"}}, "capacity": {"memory": {"value": "80Gi"}}}
    if i == 3:
        device["taints"] = [{"key": "gpu.nvidia.com/ecc-errors", "value": "uncorrectable", "effect": "NoSchedule"}]
    return device


def _example(node: str, i: int) -> JSON:
    return {"name": f"gpu-{i}", "attributes": {
        "index": {"int": i}, "uuid": {"string": f"gpu-{k8s_objects.derived_uuid(1, 'example', node, str(i))}"},
        "model": {"string": "LATEST-GPU-MODEL"}, "driverVersion": {"version": "1.0.0"}},
        "capacity": {"memory": {"value": "80Gi"}, "compute": {"value": "100"}}}


def builtin_cluster() -> tuple[JSON, ...]:
    """The built-in cluster's objects (see the module docstring)."""
    demo = load_scenario("demo")
    static = k8s_objects.cluster_objects(demo, 60.0)
    dynamic = dataclasses.replace(demo, node_name="sim-node-2", dynamic_mig=True, claims=(), pods=(),
                                  gpus=tuple(dataclasses.replace(g, mig=(), taints=()) for g in demo.gpus))
    dynamic_slices = k8s_objects.nvidia_slices(dynamic)
    a100, example, partial = "sim-a100-1", "sim-example-1", "sim-example-2"
    slices = [*static.resourceslices, *dynamic_slices,
              _plain_slice(a100, NVIDIA_DRIVER, [_a100(a100, i) for i in range(4)]),
              _plain_slice(example, EXAMPLE_DRIVER, [_example(example, i) for i in range(8)]),
              # Two slices announced, one published: the pool stays incomplete.
              _plain_slice(partial, EXAMPLE_DRIVER, [_example(partial, i) for i in range(4)], count=2)]
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
        # Pending: a class no device matches, and a prioritized list of MIG profiles.
        _claim("research", "tpu-job", "tpu.example.com", [], created=-2700),
        _claim("research", "tpu-job-2", "tpu.example.com", [], created=-600),
        _claim("inference", "mig-either", "", [], created=-1200, first_available=("mig.nvidia.com", "gpu.nvidia.com")),
    ]
    rules = [{"apiVersion": f"{GROUP}/v1", "kind": "DeviceTaintRule",
              "metadata": {"name": "drain-a100-2", "uid": "rule-drain-a100-2", "creationTimestamp": timestamp(-600)},
              "spec": {"deviceSelector": {"driver": NVIDIA_DRIVER, "pool": a100, "device": "gpu-2"},
                       "taint": {"key": "example.com/maintenance", "value": "planned", "effect": "NoExecute"}}}]
    return (*slices, *claims, *DEVICE_CLASSES, *rules, *static.pods)


# --- cluster dumps ------------------------------------------------------------------------------------


def load_cluster_dump(path: str | os.PathLike[str]) -> tuple[JSON, ...]:
    """Every DRA object (and pod) of a cluster dump; raises ``ScenarioError`` naming the object."""
    label, docs = read_documents(path)
    out: list[JSON] = []
    for d, doc in enumerate(docs):
        if doc is None:
            continue
        where = f"{label}: document {d + 1}" if len(docs) > 1 else label
        if not isinstance(doc, Mapping):
            raise ScenarioError(f"{where}: expected a Kubernetes object or a kind: List, got {type(doc).__name__}")
        if "kind" not in doc and "apiVersion" not in doc:
            raise ScenarioError(f"{where}: not a Kubernetes object or List (a node scenario? cluster --simulate "
                                "takes a cluster dump)")
        items = doc.get("items") if str(doc.get("kind", "")).endswith("List") else [doc]
        if not isinstance(items, list):
            raise ScenarioError(f"{where}: items: expected a list of objects")
        for i, item in enumerate(items):
            problem = not_an_object(item)
            if problem is not None:
                raise ScenarioError(f"{where}: items[{i}]: {problem}")
            kind = item["kind"]
            if kind not in KINDS:
                continue
            meta = item.get("metadata")
            if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str) or not meta["name"]:
                raise ScenarioError(f"{where}: items[{i}] ({kind}): metadata.name: required")
            group, _, version = item["apiVersion"].rpartition("/")
            versions = TAINT_RULE_VERSIONS if kind == "DeviceTaintRule" else API_VERSIONS
            if kind != "Pod" and (group != GROUP or version not in versions):
                raise ScenarioError(f"{where}: {kind}/{meta['name']}: apiVersion {item['apiVersion']!r} is not "
                                    f"supported (supported: {', '.join(f'{GROUP}/{v}' for v in versions)})")
            out.append(dict(item))
    if not any(o["kind"] == "ResourceSlice" for o in out):
        raise ScenarioError(f"{label}: the dump has no ResourceSlice (expected `kubectl get resourceslices,"
                            "resourceclaims,deviceclasses,pods -A -o yaml`)")
    return tuple(out)
