"""Cluster layouts as the API server serves them (resource.k8s.io/v1 JSON), for the allocator's tests
and for the agreement tests against the real kube-scheduler: the same dicts are read by the exporter's
normaliser and created on the test bed's API server.

NVIDIA's partitionable GPUs are shaped as its driver publishes them (DynamicMIG): one counter set per
GPU holding, per capacity of its MIG placements, the largest any placement has (multiprocessors,
memory, copy/decoder/encoder/JPEG/OFA engines) and one counter per memory slice; the whole GPU
consumes all of it, a placement its capacities and its memory slices. Profiles and placements from
NVIDIA's MIG user guide.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dra_exporter.model import ClusterState
from dra_exporter.sources.kubeapi_normalize import (
    claim_from_dict,
    cluster_node_from_dict,
    cluster_pod_from_dict,
    device_class_from_dict,
    slice_from_dict,
    taint_rule_from_dict,
)

NVIDIA = "gpu.nvidia.com"
EXAMPLE = "gpu.example.com"
GROUP = "resource.k8s.io/v1"
JSON = dict[str, Any]


@dataclass(frozen=True)
class Profile:
    name: str
    gi: int
    compute: int
    memory_slices: int
    starts: tuple[int, ...]
    media: bool = False
    """``+me`` and 7g: the GPU's one OFA engine (and its JPEG engines)."""


@dataclass(frozen=True)
class GpuModel:
    product: str
    memory_gib: int
    sms_per_slice: int
    profiles: tuple[Profile, ...]


H100 = GpuModel("NVIDIA H100 80GB HBM3", 80, 16, (
    Profile("1g.10gb", 19, 1, 1, tuple(range(7))), Profile("1g.10gb+me", 20, 1, 1, tuple(range(7)), True),
    Profile("1g.20gb", 15, 1, 2, (0, 2, 4, 6)), Profile("2g.20gb", 14, 2, 2, (0, 2, 4)),
    Profile("3g.40gb", 9, 3, 4, (0, 4)), Profile("4g.40gb", 5, 4, 4, (0,)),
    Profile("7g.80gb", 0, 7, 8, (0,), True)))
H200 = GpuModel("NVIDIA H200", 141, 16, (
    Profile("1g.18gb", 19, 1, 1, tuple(range(7))), Profile("1g.18gb+me", 20, 1, 1, tuple(range(7)), True),
    Profile("1g.35gb", 15, 1, 2, (0, 2, 4, 6)), Profile("2g.35gb", 14, 2, 2, (0, 2, 4)),
    Profile("3g.71gb", 9, 3, 4, (0, 4)), Profile("4g.71gb", 5, 4, 4, (0,)),
    Profile("7g.141gb", 0, 7, 8, (0,), True)))


def q(value: Any) -> JSON:
    return {"value": str(value)}


def _capacities(model: GpuModel, p: Profile) -> dict[str, int]:
    return {"multiprocessors": model.sms_per_slice * p.compute + (20 if p.compute == 7 else 0),
            "memory": model.memory_gib * 2**30 * p.memory_slices // 8,
            "copy-engines": p.compute + (1 if p.compute == 7 else 0), "decoders": p.compute,
            "encoders": 0, "jpeg-engines": p.compute if p.media else 0, "ofa-engines": 1 if p.media else 0}


def gpu_counters(model: GpuModel) -> JSON:
    largest: dict[str, int] = {}
    for p in model.profiles:
        for name, value in _capacities(model, p).items():
            largest[name] = max(largest.get(name, 0), value)
    counters = {name: q(v) for name, v in largest.items()}
    counters.update({f"memory-slice-{i}": q(1) for i in range(8)})
    return counters


def slice_obj(name: str, driver: str, pool: str, devices: list[JSON] | None = None, *, node: str = "",
              count: int = 1, generation: int = 1, counters: list[JSON] | None = None, **placement: Any) -> JSON:
    spec: JSON = {"driver": driver, "pool": {"name": pool, "generation": generation, "resourceSliceCount": count}}
    if counters is not None:
        spec["sharedCounters"] = counters
    else:
        spec["devices"] = devices or []
    if node:
        spec["nodeName"] = node
    spec.update(placement)
    if not (node or placement or counters is not None):
        spec["allNodes"] = True
    return {"apiVersion": GROUP, "kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec}


def partitionable_gpus(node: str, model: GpuModel, gpus: int = 1) -> list[JSON]:
    """A 1.35+ pool of partitionable GPUs: a counters-only slice and a device slice per GPU; in each,
    the whole GPU first, then every placement of every profile."""
    pool_count = 1 + gpus
    sets = [{"name": f"gpu-{g}-counter-set", "counters": gpu_counters(model)} for g in range(gpus)]
    out = [slice_obj(f"{node}-counters", NVIDIA, node, node=node, count=pool_count, counters=sets)]
    for g in range(gpus):
        common: JSON = {"productName": {"string": model.product}, "driverVersion": {"version": "580.82.7"}}
        counter_set = f"gpu-{g}-counter-set"
        devices: list[JSON] = [{"name": f"gpu-{g}", "attributes": {"type": {"string": "gpu"}, **common},
                    "capacity": {"memory": q(f"{model.memory_gib}Gi")},
                    "consumesCounters": [{"counterSet": counter_set, "counters": gpu_counters(model)}]}]
        for p in model.profiles:
            for start in p.starts:
                counters = {k: q(v) for k, v in _capacities(model, p).items()}
                counters.update({f"memory-slice-{i}": q(1) for i in range(start, start + p.memory_slices)})
                devices.append({
                    "name": f"gpu-{g}-mig-{p.name.replace('.', '').replace('+', '-')}-{p.gi}-{start}",
                    "attributes": {"type": {"string": "mig"}, "profile": {"string": p.name}, **common},
                    "capacity": {"memory": q(_capacities(model, p)["memory"]),
                                 "multiprocessors": q(_capacities(model, p)["multiprocessors"])},
                    "consumesCounters": [{"counterSet": counter_set, "counters": counters}]})
        out.append(slice_obj(f"{node}-gpu-{g}", NVIDIA, node, devices, node=node, count=pool_count))
    return out


def example_gpus(node: str, gpus: int, *, pool: str = "", count: int = 1, generation: int = 1,
                 first: int = 0) -> JSON:
    """The dra-example-driver's whole GPUs on a node."""
    devices = [{"name": f"gpu-{i}", "attributes": {"index": {"int": i}, "model": {"string": "LATEST-GPU-MODEL"},
                                                   "uuid": {"string": f"gpu-{node}-{i}"}},
                "capacity": {"memory": q("80Gi")}} for i in range(first, first + gpus)]
    pool = pool or node
    return slice_obj(f"{pool}-{EXAMPLE}-{generation}-{first}", EXAMPLE, pool, devices, node=node, count=count,
                     generation=generation)


def shared_gpu(node: str, name: str = "gpu-0", memory: str = "80Gi", policy: JSON | None = None) -> JSON:
    """A device claims share (consumable capacity)."""
    capacity: JSON = {"value": memory}
    if policy is not None:
        capacity["requestPolicy"] = policy
    return {"name": name, "allowMultipleAllocations": True,
            "attributes": {"model": {"string": "LATEST-GPU-MODEL"}}, "capacity": {"memory": capacity}}


def device_class(name: str, *expressions: str) -> JSON:
    return {"apiVersion": GROUP, "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": e}} for e in expressions]}}


NVIDIA_GPU = device_class("gpu.nvidia.com", f"device.driver == '{NVIDIA}' && "
                                            f"device.attributes['{NVIDIA}'].type == 'gpu'")
NVIDIA_MIG = device_class("mig.nvidia.com", f"device.driver == '{NVIDIA}' && "
                                            f"device.attributes['{NVIDIA}'].type == 'mig'")
EXAMPLE_GPU = device_class("gpu.example.com", f"device.driver == '{EXAMPLE}'")


def request(name: str = "gpu", device_class_name: str = "gpu.example.com", count: int = 1, **more: Any) -> JSON:
    exactly: JSON = {"deviceClassName": device_class_name, "allocationMode": "ExactCount", "count": count, **more}
    if exactly["allocationMode"] == "All":
        del exactly["count"]  # the API refuses a count with All
    return {"name": name, "exactly": exactly}


def claim_obj(name: str, requests: list[JSON] | None = None, *, namespace: str = "ml",
              results: list[tuple[str, str, str]] = (), constraints: list[JSON] | None = None,  # type: ignore[assignment]
              consumed: dict[str, str] | None = None, admin: bool = False) -> JSON:
    spec: JSON = {"devices": {"requests": requests or [request()]}}
    if constraints:
        spec["devices"]["constraints"] = constraints
    status: JSON = {}
    if results:
        entries = []
        for i, (driver, pool, device) in enumerate(results):
            entry: JSON = {"request": "gpu", "driver": driver, "pool": pool, "device": device}
            if consumed is not None:
                entry.update(shareID=f"00000000-0000-0000-0000-{i:012d}", consumedCapacity=consumed)
            if admin:
                entry["adminAccess"] = True
            entries.append(entry)
        status = {"allocation": {"devices": {"results": entries}}}
    return {"apiVersion": GROUP, "kind": "ResourceClaim",
            "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{namespace}-{name}"},
            "spec": spec, "status": status}


def taint_rule(name: str, driver: str, pool: str, device: str, key: str, effect: str, value: str = "") -> JSON:
    return {"apiVersion": GROUP, "kind": "DeviceTaintRule", "metadata": {"name": name},
            "spec": {"deviceSelector": {"driver": driver, "pool": pool, "device": device},
                     "taint": {"key": key, "value": value, "effect": effect}}}


def cluster_state(*objects: JSON | list[JSON]) -> ClusterState:
    """The exporter's view of these objects, through its one normaliser."""
    flat: list[JSON] = []
    for o in objects:
        flat.extend(o if isinstance(o, list) else [o])
    by_kind: dict[str, list[JSON]] = {}
    for o in flat:
        by_kind.setdefault(o["kind"], []).append(o)
    return ClusterState(
        "v1",
        tuple(slice_from_dict(o, "v1") for o in by_kind.get("ResourceSlice", [])),
        tuple(claim_from_dict(o, "v1") for o in by_kind.get("ResourceClaim", [])),
        tuple(device_class_from_dict(o) for o in by_kind.get("DeviceClass", [])),
        tuple(taint_rule_from_dict(o) for o in by_kind.get("DeviceTaintRule", [])),
        tuple(cluster_pod_from_dict(o) for o in by_kind.get("Pod", [])),
        # Nodes only when some are given: without them, as a cluster mode that cannot read Nodes.
        nodes=tuple(cluster_node_from_dict(o) for o in by_kind["Node"]) if "Node" in by_kind else None)


def node_obj(name: str, labels: dict[str, str] | None = None, *, taints: list[JSON] | None = None,
             unschedulable: bool = False) -> JSON:
    spec: JSON = {"taints": taints} if taints else {}
    if unschedulable:
        spec["unschedulable"] = True
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}}, "spec": spec}


def pod_obj(name: str, claims: list[str], *, namespace: str = "ml", **spec: Any) -> JSON:
    """A pending pod that references ``claims`` by name, with more of its spec (nodeSelector, affinity …)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [{"name": "main", "image": "pause"}],
                     "resourceClaims": [{"name": c, "resourceClaimName": c} for c in claims], **spec},
            "status": {"phase": "Pending"}}
